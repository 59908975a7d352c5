"""What the command modules share: the consoles they print on, a line, a table, a failure, a count with its noun,
and the pipelines a command acts on."""

from __future__ import annotations

from rich.console import Console, RenderableType
from rich.markup import escape

from krishiv_core.spec import KrishivSpec, PipelineSpec

console = Console(highlight=False, soft_wrap=True)  # a line per message, whatever the width
err_console = Console(stderr=True, highlight=False, soft_wrap=True)

#: How wide ``--wide`` lets a table be: whole ids are never folded to fit the terminal.
WIDE_COLUMNS = 1_000


def chosen_pipelines(spec: KrishivSpec, name: str | None) -> list[PipelineSpec]:
    """The pipeline ``--pipeline`` names, else every pipeline of the spec."""
    return [spec.pipeline(name)] if name else list(spec.pipelines)


def say(line: str) -> None:
    console.print(escape(line))


def show(table: RenderableType, wide: bool) -> None:
    """A table: fitted to the terminal (80 columns, or ``$COLUMNS``), or as wide as it is with ``--wide``."""
    (Console(highlight=False, width=WIDE_COLUMNS) if wide else console).print(table)


def counted(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 'es' if noun.endswith(('ch', 'sh', 's', 'x')) else 's'}"


def fail(command: str, message: str) -> None:
    err_console.print(f"[red]krishiv {command}: {escape(message)}[/]")
