"""Named fault points, armed through ``KRISHIV_FAULTS`` so tests can crash real processes at exact steps.

``KRISHIV_FAULTS`` is a comma-separated list of ``point[@batch][:action]``: ``point`` is a name passed to
:func:`fault_point`, ``@batch`` limits it to one batch id, and ``action`` is one of

- ``kill`` (the default): SIGKILL this process;
- ``raise``: raise :class:`InjectedFault`;
- ``timeout``: wait :data:`TIMEOUT_DELAY_S`, then raise ``TimeoutError`` (a call that gave up);
- ``pause``: write ``<point>@<batch>.reached`` into ``$KRISHIV_FAULTS_SYNC`` and wait there until the
  harness writes ``<point>@<batch>.go``, so it can act at exactly this step (pause the broker, commit
  from another process) before letting this one go on.

An armed item fires once per batch id in a process, so a retry of the same step goes through. With
``KRISHIV_FAULTS_LOG`` set, each firing is appended to that file (one JSON line, synced before the action)
so a harness can prove the point was reached. The variables are read when a point is reached, never at
import. With nothing armed a fault point costs one dictionary lookup.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

FAULTS_ENV = "KRISHIV_FAULTS"
FAULTS_LOG_ENV = "KRISHIV_FAULTS_LOG"
FAULTS_SYNC_ENV = "KRISHIV_FAULTS_SYNC"
ACTIONS = ("kill", "raise", "timeout", "pause")
TIMEOUT_DELAY_S = 1.0
PAUSE_LIMIT_S = 300.0

_fired: set[tuple[str, int | None]] = set()


class InjectedFault(RuntimeError):
    """Raised by a fault point armed with the ``raise`` action."""


def _log(name: str, batch_id: int | None, action: str) -> None:
    path = os.environ.get(FAULTS_LOG_ENV)
    if not path:
        return
    line = json.dumps({"point": name, "batch": batch_id, "action": action, "pid": os.getpid(), "at": time.time()})
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def _pause(name: str, batch_id: int | None) -> None:
    folder = os.environ.get(FAULTS_SYNC_ENV)
    if not folder:
        raise ValueError(f"{FAULTS_ENV}: the pause action at {name} needs {FAULTS_SYNC_ENV}")
    stem = Path(folder) / f"{name}@{batch_id}"
    stem.with_suffix(stem.suffix + ".reached").write_text(str(os.getpid()))
    go = stem.with_suffix(stem.suffix + ".go")
    deadline = time.monotonic() + PAUSE_LIMIT_S
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.02)


def fault_point(name: str, batch_id: int | None = None) -> None:
    armed = os.environ.get(FAULTS_ENV)
    if not armed:
        return
    for item in armed.split(","):
        target, _, action = item.strip().partition(":")
        point, _, only_batch = target.partition("@")
        if point != name or (only_batch and batch_id is not None and int(only_batch) != batch_id):
            continue
        action = action or "kill"
        if action not in ACTIONS:
            raise ValueError(f"{FAULTS_ENV}: unknown action {action!r} in {item!r}; expected one of {ACTIONS}")
        if (item, batch_id) in _fired:
            continue
        _fired.add((item, batch_id))
        _log(name, batch_id, action)
        if action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif action == "raise":
            raise InjectedFault(f"fault injected at {name} (batch {batch_id})")
        elif action == "timeout":
            time.sleep(TIMEOUT_DELAY_S)
            raise TimeoutError(f"injected timeout at {name} (batch {batch_id})")
        else:
            _pause(name, batch_id)
