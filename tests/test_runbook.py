"""Every refusal's pointer names a section of the Recovery runbook (docs/operations.md), and every section is
named by a refusal.

The pointers are read from the source, as written: each ``runbook("<section>")`` call of the runtime packages
(``krishiv_core.runbook`` is the one place the pointer's format is written, so a pointer spelled out by hand
elsewhere fails here too). The sections are the ``### `` headings between docs/operations.md's
``## Recovery runbook`` and the next ``## `` heading.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from krishiv_core.runbook import RUNBOOK, before_pointer, runbook
from tests.docs.pages import DOCS, section

REPO = Path(__file__).resolve().parents[1]
RUNTIME = ("krishiv_core", "spark_jobs", "outbox", "krishiv", "krishiv_assets")
FORMAT_HOME = REPO / "krishiv_core" / "runbook.py"


def _sources() -> list[Path]:
    return [path for package in RUNTIME for path in sorted((REPO / package).rglob("*.py"))]


def _pointers() -> dict[str, list[str]]:
    """Section -> where a ``runbook("<section>")`` call names it (``path:line``)."""
    found: dict[str, list[str]] = {}
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "runbook":
                where = f"{path.relative_to(REPO)}:{node.lineno}"
                assert len(node.args) == 1 and isinstance(node.args[0], ast.Constant), (
                    f"{where}: runbook() takes the section's name as one string literal, so it can be read here"
                )
                found.setdefault(node.args[0].value, []).append(where)
    return found


def _sections() -> list[str]:
    return re.findall(r"^### (.+)$", section(DOCS / "operations.md", "Recovery runbook"), flags=re.MULTILINE)


def test_every_pointer_names_a_section_and_every_section_is_named():
    pointers, sections = _pointers(), _sections()
    assert len(sections) == len(set(sections)), f"a section heading is repeated: {sections}"
    unknown = {section: where for section, where in pointers.items() if section not in sections}
    assert unknown == {}, f"pointers to no section of the runbook (sections: {sections})"
    unnamed = [section for section in sections if section not in pointers]
    assert unnamed == [], "runbook sections no refusal points at"


def test_the_pointer_is_written_out_in_one_place():
    """A pointer typed by hand would escape the check above."""
    by_hand = [
        f"{path.relative_to(REPO)}:{number}"
        for path in _sources()
        if path != FORMAT_HOME
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if "Recovery runbook >" in line or f'"{RUNBOOK}' in line
    ]
    assert by_hand == []


def test_a_wrapped_refusal_keeps_its_pointer_last():
    pointer = runbook("A broker outage")
    assert before_pointer(f"the broker went away {pointer}", "; staged batches stay") == (
        f"the broker went away; staged batches stay {pointer}"
    )
    assert before_pointer("no pointer here", "; more") == "no pointer here; more"
