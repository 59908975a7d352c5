"""The one format of the pointer every refusal ends with: ``(see docs/operations.md: Recovery runbook > <section>)``.

Each section is a ``### <section>`` heading under ``## Recovery runbook`` in docs/operations.md, saying what
happened and the way out with the exact commands. Call :func:`runbook` with the section's name written out as a
string literal: ``tests/test_runbook.py`` reads every call from the source and checks that each names a section
of the runbook, and that each section is named by some refusal. Every layer may import this module (it imports
nothing).
"""

from __future__ import annotations

import re

#: Where the sections are.
RUNBOOK = "docs/operations.md: Recovery runbook"

_POINTER = re.compile(r" ?\(see " + re.escape(RUNBOOK) + r" > [^()]+\)$")


def runbook(section: str) -> str:
    """``(see docs/operations.md: Recovery runbook > section)``: the pointer a refusal ends with."""
    return f"(see {RUNBOOK} > {section})"


def before_pointer(message: str, more: str) -> str:
    """``message`` with ``more`` added before the pointer it ends with, so the pointer stays last (``more`` is
    appended if the message has no pointer): a refusal wrapped in another line keeps its way out at the end."""
    found = _POINTER.search(message)
    if found is None:
        return message + more
    return message[: found.start()] + more + " " + found.group(0).lstrip()
