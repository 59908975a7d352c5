"""A freshness policy on every table asset: the asset turns yellow, then red, when its commits stop.

Each table asset carries a Dagster time-window :class:`~dagster.FreshnessPolicy`: WARN once its newest
materialization is older than the warn window, FAIL once older than the fail window. A table is materialized by
each commit: a commit run's step, or each commit made elsewhere (a lingering staging run, ``krishiv run``,
``krishiv commit``) that the outbox sensor reports, an empty batch included (the table is then up to date through
it, with nothing to add). So the policy goes red when nothing commits to the table any more: the committer and the
safety net are both down, the catalog refuses, or the topic has gone quiet (an idle topic makes no batches; a window
longer than the quietest normal spell of the topic keeps that from alarming).

Dagster evaluates the policy in its **freshness daemon**, which ``dagster dev`` (and ``dagster-daemon run``) starts
whenever the instance's ``freshness: enabled`` is not false (the default, and ``dagster.yaml`` leaves it so), every
30 s (``FRESHNESS_DAEMON_INTERVAL_SECONDS``); the UI shows the state it recorded. A table never materialized is
UNKNOWN (grey), not red: there is nothing to be late against yet.

Windows, until the spec holds them: ``KRISHIV_FRESHNESS_WARN_S`` (default 900) and ``KRISHIV_FRESHNESS_FAIL_S``
(default 3600), read when the code location loads; Dagster wants each at least 60 s and the warning shorter.
The defaults: a pipeline that is keeping up commits a batch every few seconds while events arrive, and every path
that commits is bounded well below 15 minutes (a lingering staging run starts within a minute of new records, the
safety net takes what stays pending 15-30 s, ``ledger_agreement`` already fails at 10 minutes of PENDING), so 15
minutes without a commit is worth a look (yellow) and an hour is an outage or a topic that stopped (red).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import dagster as dg

from krishiv_core.env_settings import seconds_from_env
from krishiv_core.errors import ConfigError

WARN_ENV = "KRISHIV_FRESHNESS_WARN_S"
FAIL_ENV = "KRISHIV_FRESHNESS_FAIL_S"
DEFAULT_WARN_S = 900.0
DEFAULT_FAIL_S = 3600.0
#: Dagster's lower bound on either window.
SHORTEST_S = 60.0


@dataclass(frozen=True)
class FreshnessWindows:
    """How long a table may go without a commit: ``warn_s`` before it warns, ``fail_s`` before it fails."""

    warn_s: float = DEFAULT_WARN_S
    fail_s: float = DEFAULT_FAIL_S

    def __post_init__(self) -> None:
        for variable, value in ((WARN_ENV, self.warn_s), (FAIL_ENV, self.fail_s)):
            if value < SHORTEST_S:
                raise ConfigError(variable, f"expected at least {SHORTEST_S:.0f}s (Dagster's minimum), got {value:g}")
        if self.warn_s >= self.fail_s:
            raise ConfigError(WARN_ENV, f"expected less than {FAIL_ENV} ({self.fail_s:g}s), got {self.warn_s:g}")

    def policy(self) -> dg.FreshnessPolicy:
        return dg.FreshnessPolicy.time_window(
            fail_window=timedelta(seconds=self.fail_s), warn_window=timedelta(seconds=self.warn_s)
        )

    def describe(self) -> str:
        return f"warns after {self.warn_s:g}s without a commit, fails after {self.fail_s:g}s"


def freshness_windows() -> FreshnessWindows:
    """The windows of ``KRISHIV_FRESHNESS_WARN_S`` and ``KRISHIV_FRESHNESS_FAIL_S``, else the defaults; a wrong value
    is one :class:`ConfigError` naming its variable."""
    return FreshnessWindows(seconds_from_env(WARN_ENV, DEFAULT_WARN_S), seconds_from_env(FAIL_ENV, DEFAULT_FAIL_S))
