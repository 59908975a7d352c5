"""Run a command with SIGINT and SIGTERM at their default dispositions: ``python default_signals.py CMD ARGS…``.

A POSIX shell starts a background job of a non-interactive shell (``scripts/dagster-dev.sh &`` from a script, a CI
step, ``nohup``) with SIGINT ignored, and an ignored signal stays ignored through ``exec``; no shell can undo it
(``trap - INT`` is refused for a signal ignored on entry). ``dagster dev`` then ignores SIGINT, and since Dagster
handles SIGTERM as SIGINT, SIGTERM as well: ``kill -TERM`` did nothing. Python can reset them before it execs.
"""

from __future__ import annotations

import os
import signal
import sys

if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python default_signals.py COMMAND [ARGS...]")
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, signal.SIG_DFL)
    os.execv(sys.argv[1], sys.argv[1:])
