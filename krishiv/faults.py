"""Named fault points, armed through ``KRISHIV_FAULTS`` so tests can crash real processes at exact steps.

``KRISHIV_FAULTS`` is a comma-separated list of ``point[@batch][:action]``: ``point`` is a name passed to
:func:`fault_point`, ``@batch`` limits it to one batch id, and ``action`` is ``kill`` (SIGKILL this process,
the default) or ``raise`` (raise :class:`InjectedFault`). The variable is read when a point is reached,
never at import. With nothing armed a fault point costs one dictionary lookup.
"""

from __future__ import annotations

import os
import signal

FAULTS_ENV = "KRISHIV_FAULTS"


class InjectedFault(RuntimeError):
    """Raised by a fault point armed with the ``raise`` action."""


def fault_point(name: str, batch_id: int | None = None) -> None:
    armed = os.environ.get(FAULTS_ENV)
    if not armed:
        return
    for item in armed.split(","):
        target, _, action = item.strip().partition(":")
        point, _, only_batch = target.partition("@")
        if point != name or (only_batch and batch_id is not None and int(only_batch) != batch_id):
            continue
        if action in ("", "kill"):
            os.kill(os.getpid(), signal.SIGKILL)
        if action == "raise":
            raise InjectedFault(f"fault injected at {name} (batch {batch_id})")
        raise ValueError(f"{FAULTS_ENV}: unknown action {action!r} in {item!r}; expected kill or raise")
