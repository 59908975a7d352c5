"""The process entry of ``krishiv`` (the console script ``krishiv.cli:main``, and ``python -m krishiv.cli``):
stdout that survives a closed pipe, the logging, the spec read, the command dispatched to its module under
``krishiv.commands``, and its errors said in one line with the exit code."""

from __future__ import annotations

import io
import logging
import sys
from collections.abc import Sequence
from typing import Any

from krishiv.commands.common import fail
from krishiv.commands.first_hour import cmd_broker, cmd_init, cmd_produce, cmd_topic
from krishiv.commands.inspection import cmd_check, cmd_cut, cmd_lineage, cmd_status, cmd_verify
from krishiv.commands.maintenance import (
    cmd_clean_staging,
    cmd_compact,
    cmd_expire_snapshots,
    cmd_ledger_compact,
    cmd_ledger_copy,
    cmd_maintain,
    cmd_remove_orphans,
)
from krishiv.commands.parser import build_parser
from krishiv.commands.pipeline import cmd_commit, cmd_demo, cmd_run, state_removed
from krishiv.commands.recovery import cmd_restage, cmd_skip_offsets
from krishiv.inputs import command_spec
from krishiv_core.errors import KrishivError
from krishiv_core.spec import KrishivSpec

__all__ = ["COMMANDS", "build_parser", "main"]

COMMANDS = {
    "produce": cmd_produce,
    "run": cmd_run,
    "commit": cmd_commit,
    "status": cmd_status,
    "check": cmd_check,
    "topic": cmd_topic,
    "ledger-compact": cmd_ledger_compact,
    "ledger-copy": cmd_ledger_copy,
    "skip-offsets": cmd_skip_offsets,
    "restage": cmd_restage,
    "clean-staging": cmd_clean_staging,
    "expire-snapshots": cmd_expire_snapshots,
    "remove-orphans": cmd_remove_orphans,
    "compact": cmd_compact,
    "maintain": cmd_maintain,
    "lineage": cmd_lineage,
    "cut": cmd_cut,
    "verify": cmd_verify,
    "demo": cmd_demo,
}


class _PipeSafe(io.TextIOBase):
    """stdout that stops writing, silently, once its reader has gone (``krishiv verify | head -1``): the command
    goes on to its end and exits with its own status, as the output it still had would have said."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.gone = False

    def write(self, text: str) -> int:
        if not self.gone:
            try:
                self.stream.write(text)
            except BrokenPipeError:
                self.gone = True
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            try:
                self.stream.flush()
            except BrokenPipeError:
                self.gone = True

    def isatty(self) -> bool:
        return self.stream.isatty()

    def fileno(self) -> int:
        return self.stream.fileno()


def main(argv: Sequence[str] | None = None) -> int:
    if not isinstance(sys.stdout, _PipeSafe):
        sys.stdout = _PipeSafe(sys.stdout)
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    logging.getLogger("py4j").setLevel(logging.WARNING)
    # A batch that fails in Krishiv's foreachBatch is reported in one line from the query's exception; py4j's own
    # ERROR for the callback repeats it as a Python traceback (and -v shows everything).
    logging.getLogger("py4j.clientserver").setLevel(logging.INFO if args.verbose else logging.CRITICAL)
    for handler in logging.getLogger().handlers:
        handler.addFilter(_not_an_interrupted_py4j_call)
    spec: KrishivSpec | None = None
    try:
        if args.command == "broker":
            return cmd_broker(args)
        if args.command == "init":
            return cmd_init(args)
        spec = command_spec(args)
        return COMMANDS[args.command](args, spec)
    except KrishivError as exc:
        fail(args.command, str(exc) + state_removed(args.command, spec))  # [brackets] in it are text
        return 2
    except OSError as exc:  # a path the user gave that the machine refused: named, without a traceback
        where = f" {exc.filename}" if exc.filename else ""
        first = _krishiv_cause(exc)
        said = str(first) if first is not None else f"{exc.strerror or exc}:{where}"
        fail(args.command, said + state_removed(args.command, spec))
        return 2
    except KeyboardInterrupt:
        fail(args.command, "interrupted (Ctrl-C)")
        return 130
    except Exception as exc:
        removed = state_removed(args.command, spec)
        if removed:  # whatever broke first, the cause is the folder that went away: one line, the first error
            first = _krishiv_cause(exc)
            fail(args.command, (str(first) if first is not None else f"{type(exc).__name__}: {exc}") + removed)
            return 2
        if type(exc).__name__ not in ("NoSuchTableError", "NoSuchNamespaceError"):  # pyiceberg, deeper down
            raise
        fail(args.command, f"{exc}; `krishiv run` creates the spec's tables and `krishiv commit` fills them")
        return 2


def _krishiv_cause(exc: BaseException) -> KrishivError | None:
    """The first Krishiv error ``exc`` was raised while handling (a failure while cleaning up hides the cause)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    found = None
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, KrishivError):
            found = current
        current = current.__context__ or current.__cause__
    return found


def _not_an_interrupted_py4j_call(record: logging.LogRecord) -> bool:
    """False for the tracebacks py4j logs (on the root logger) when Ctrl-C lands while Spark starts, before Krishiv's
    own handler is in place: PySpark's handler then calls into the JVM from inside the call in flight. The command
    says ``interrupted`` in one line instead."""
    if "py4j" not in record.pathname:
        return True
    exc = record.exc_info[1] if record.exc_info else None
    while exc is not None:
        if isinstance(exc, KeyboardInterrupt) or "reentrant call" in str(exc):
            return False
        exc = exc.__cause__ or exc.__context__
    return "KeyboardInterrupt" not in record.getMessage()


if __name__ == "__main__":
    sys.exit(main())
