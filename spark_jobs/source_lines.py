"""The one way the Kafka source's code says something to the operator while it runs: one line on stderr.

The source runs in Spark's Python workers (planning in the driver's source process, reading in the tasks), whose
stderr is the ``krishiv run`` process's, so a line printed here reaches the operator as the run's own. Both the
source and the registry decoder it uses speak through :func:`say`, prefixed alike.
"""

from __future__ import annotations

import sys

PREFIX = "krishiv-kafka: "


def say(line: str) -> None:
    """``line`` on stderr, prefixed with the source's name, flushed at once."""
    print(f"{PREFIX}{line}", file=sys.stderr, flush=True)
