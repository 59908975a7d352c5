"""The repository's scripts that are Python: ``scripts/default_signals.py``, through which ``make dagster`` starts
``dagster dev`` (a ``dagster dev`` started as a background job of a script ignored SIGINT, and so SIGTERM too)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
#: What a Python process says of its SIGINT and SIGTERM handling.
REPORT = (
    "import signal; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler, "
    "signal.getsignal(signal.SIGTERM) == signal.SIG_DFL)"
)


def _ignoring_sigint() -> None:
    """What a non-interactive shell does to its background jobs."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def test_a_command_started_with_sigint_ignored_gets_both_signals_back() -> None:
    def report(*command: str) -> str:
        done = subprocess.run(
            [*command, sys.executable, "-c", REPORT],
            capture_output=True,
            text=True,
            timeout=60,
            preexec_fn=_ignoring_sigint,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert report("env") == "False True"  # as the shell starts it: Ctrl-C (and, in Dagster, SIGTERM) does nothing
    assert report(sys.executable, str(SCRIPTS / "default_signals.py")) == "True True"


def test_make_dagster_starts_dagster_dev_through_it() -> None:
    script = (SCRIPTS / "dagster-dev.sh").read_text()
    assert 'scripts/default_signals.py" "$repo/.venv/bin/dagster" dev' in script
