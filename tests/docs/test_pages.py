"""Every page of the docs holds together: its links reach a page and a heading that exist, every command it shows
parses with the CLI's own parser (options included), every `make` target and `python -m` module it names exists,
every TOML block is TOML, and each pipeline example of the spec reference loads as a spec. The quickstart itself
runs end to end in ``test_quickstart.py``."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re
import shlex
import tomllib
from pathlib import Path

import pytest

from krishiv.cli import build_parser
from krishiv_core.spec import load_spec
from tests.docs.pages import DOCS, REPO, anchors, blocks, blocks_under, links, pages, prose

PAGES = pages()
_IDS = [str(p.relative_to(REPO)) for p in PAGES]


def _commands(page: Path) -> list[tuple[str, str]]:
    """(where, command line) of every command in the page's shell blocks, continuation lines joined, comments and
    heredoc bodies left out, each ``&&``/``|``/``;`` part on its own."""
    found = []
    for block in blocks(page):
        if block.language not in ("bash", "sh"):
            continue
        text = re.sub(r"<<'?(\w+)'?\n.*?\n\1\n", "\n", block.text, flags=re.DOTALL)  # heredoc bodies
        for line in text.replace("\\\n", " ").splitlines():
            line = line.split(" #")[0].strip()
            for part in _split_outside_quotes(line):
                part = part.strip().rstrip("&").strip()
                if part and not part.startswith("#"):
                    found.append((block.where, part))
    return found


def _split_outside_quotes(line: str) -> list[str]:
    """``a && b | c 'x|y'`` -> ``["a ", " b ", " c 'x|y'"]``: a shell line cut at ``&&``, ``||``, ``;`` and ``|``
    outside quotes."""
    parts, current, quote, i = [], "", "", 0
    while i < len(line):
        char = line[i]
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif line.startswith(("&&", "||"), i) or char in ";|":
            parts.append(current)
            current, i = "", i + (2 if line.startswith(("&&", "||"), i) else 1)
            continue
        current += char
        i += 1
    return [*parts, current]


def _without_redirections(words: list[str]) -> list[str]:
    """``a > f 2>&1`` -> ``a``."""
    kept, skip = [], False
    for word in words:
        if skip:
            skip = False
        elif re.fullmatch(r"\d?[<>]{1,2}", word):
            skip = True
        elif not re.fullmatch(r"\d?>&\d", word):
            kept.append(word)
    return kept


@pytest.mark.parametrize("page", PAGES, ids=_IDS)
def test_every_link_reaches_a_page_and_a_heading(page: Path) -> None:
    broken = []
    for line, target in links(page):
        if re.match(r"^[a-z]+://|^mailto:", target):
            continue
        path, _, anchor = target.partition("#")
        goal = (page.parent / path).resolve() if path else page
        if not goal.exists():
            broken.append(f"{line}: {target} (no such file)")
        elif anchor and goal.suffix == ".md" and anchor not in anchors(goal):
            broken.append(f"{line}: {target} (no such heading in {goal.name})")
    assert broken == []


@pytest.mark.parametrize("page", PAGES, ids=_IDS)
def test_every_command_shown_parses(page: Path) -> None:
    """``krishiv …`` by the CLI's parser (an unknown command or option fails); ``make T`` a Makefile target;
    ``python -m M`` an importable module."""
    makefile = (REPO / "Makefile").read_text()
    wrong = []
    for where, command in _commands(page):
        words = _without_redirections(shlex.split(command))
        words = [w for w in words if not re.fullmatch(r"\w+=\S*", w)] or words  # VAR=value prefixes
        program = Path(words[0]).name
        if program == "krishiv":
            with contextlib.redirect_stderr(io.StringIO()) as err, contextlib.redirect_stdout(io.StringIO()):
                try:
                    build_parser().parse_args(words[1:])
                except SystemExit as exc:
                    if exc.code:
                        wrong.append(f"{where}: {command}: {err.getvalue().strip().splitlines()[-1]}")
        elif program == "make":
            missing = [t for t in words[1:] if not re.search(rf"^{re.escape(t)}:", makefile, flags=re.MULTILINE)]
            if missing:
                wrong.append(f"{where}: {command}: no Makefile target {missing}")
        elif program.startswith("python") and "-m" in words:
            module = words[words.index("-m") + 1]
            if importlib.util.find_spec(module) is None:
                wrong.append(f"{where}: {command}: no module {module}")
    assert wrong == []


@pytest.mark.parametrize("page", PAGES, ids=_IDS)
def test_every_command_named_in_the_text_exists(page: Path) -> None:
    parser = build_parser()
    commands = next(a for a in parser._subparsers._group_actions if a.choices).choices  # type: ignore[union-attr]
    named = set(re.findall(r"`krishiv ([a-z][a-z-]+)", prose(page)))
    assert named - set(commands) == set()


@pytest.mark.parametrize("page", PAGES, ids=_IDS)
def test_every_toml_block_is_toml(page: Path) -> None:
    wrong = []
    for block in blocks(page):
        if block.language == "toml":
            try:
                tomllib.loads(block.text)
            except tomllib.TOMLDecodeError as exc:
                wrong.append(f"{block.where}: {exc}")
    assert wrong == []


def test_each_pipeline_example_of_the_spec_reference_loads(tmp_path: Path) -> None:
    """Each kind's example, with the fields of "Every pipeline" where it says "as above", is a spec Krishiv
    accepts: a key renamed in the code and not on the page fails here."""
    page = DOCS / "spec.md"
    every = next(b for b in blocks_under(page, "Every pipeline") if b.language == "toml").text
    fields = every[every.index("[pipelines.fields]") :]
    examples = [
        b
        for heading in re.findall(r"^## (`kind = .+)$", prose(page), flags=re.MULTILINE)
        for b in blocks_under(page, heading)
        if b.language == "toml" and "[[pipelines]]" in b.text
    ]
    assert len(examples) >= 4, "the spec reference's pipeline examples are not where this test reads them"
    for block in examples:
        own = fields + ('deleted = { type = "boolean", required = false }\n' if "delete_field" in block.text else "")
        text = re.sub(r"^# \[pipelines\.fields\] as above.*$", lambda _, own=own: own, block.text, flags=re.MULTILINE)
        spec_file = tmp_path / f"{block.line}.toml"
        spec_file.write_text(text)
        try:
            load_spec(spec_file)
        except Exception as exc:  # the failure names the block
            raise AssertionError(f"{block.where}: {exc}") from exc


def test_every_variable_krishiv_reads_is_in_the_spec_reference() -> None:
    """Each ``KRISHIV_*`` name written in the runtime packages is listed in docs/spec.md's tables of variables."""
    runtime = ("krishiv_core", "spark_jobs", "outbox", "krishiv", "krishiv_assets")
    read = {
        name
        for package in runtime
        for path in (REPO / package).rglob("*.py")
        for name in re.findall(r"[\"'](KRISHIV_[A-Z0-9_]*[A-Z0-9])[\"']", path.read_text())
    }
    listed = set(re.findall(r"`(KRISHIV_[A-Z0-9_]+)`", (DOCS / "spec.md").read_text()))
    assert read - listed == set()
