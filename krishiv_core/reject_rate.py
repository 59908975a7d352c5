"""When rejects are a storm rather than noise: the one rule of ``krishiv run``, ``status``, ``check`` and the Dagster
``rejects_rate`` check.

A reject is a record read that the pipeline could not read by its spec (docs/spec.md, "Field types"); the rate is
rejects over records read. A few rejects are a producer's slip; most of a batch rejected is a spec that does not
match the topic (a field declared ``string`` that arrives as a JSON object), and then the tables stay empty while
every run exits 0. So:

- a **batch** is alarming when every record it read was rejected, or more than the warning share of them
  (``KRISHIV_REJECT_RATE_WARN``, 0.5 unless set): ``krishiv run`` prints one warning line for it;
- a **pipeline** is alarming when the rejects of its recent batches (the last :data:`RECENT_BATCHES` it recorded,
  by the entries of its first table, which carry each batch's counts) are: ``status`` and ``verify`` warn, ``check``
  fails, ``status --json`` carries the rate. The Dagster check reads the same batches against its own, lower share.

A pipeline whose recent batches read nothing has no rate (0 of 0) and is never alarming.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from krishiv_core.env_settings import fraction_from_env

#: The share of records read that may be rejected before a batch or a pipeline is alarming (0 to 1).
REJECT_RATE_ENV = "KRISHIV_REJECT_RATE_WARN"
DEFAULT_REJECT_RATE_WARN = 0.5
#: How many of a pipeline's newest batches its recent rate is taken over.
RECENT_BATCHES = 10


def reject_rate_warn() -> float:
    """The warning share, from ``KRISHIV_REJECT_RATE_WARN``; one ``ConfigError`` naming it when it is not a share."""
    return fraction_from_env(REJECT_RATE_ENV, DEFAULT_REJECT_RATE_WARN)


@dataclass(frozen=True)
class RejectRate:
    """Records read and rejected over ``batches`` batches."""

    records_read: int
    rejects: int
    batches: int = 1

    @property
    def rate(self) -> float:
        return self.rejects / self.records_read if self.records_read else 0.0

    def alarming(self, warn_above: float) -> bool:
        """Every record read was rejected, or more than ``warn_above`` of them."""
        return self.rejects > 0 and (self.rejects >= self.records_read or self.rate > warn_above)

    def describe(self) -> str:
        """``8,000 of 8,000 records rejected (100%)``."""
        return f"{self.rejects:,} of {self.records_read:,} records rejected ({percent(self.rate)})"


@dataclass(frozen=True)
class CommonReason:
    """The reason most rejects of a batch gave, and how many gave it."""

    reason: str
    rejects: int


def most_common_reason(reasons: Iterable[str | None]) -> CommonReason | None:
    """The reason given most often (the first met among equals), None when there is none."""
    counts = Counter(r for r in reasons if r is not None)
    if not counts:
        return None
    reason, n = counts.most_common(1)[0]
    return CommonReason(reason, n)


def percent(share: float) -> str:
    """``100%``, ``62%``, ``0.4%``: whole percents, but a share under 1% keeps a digit (never a 0% that rejected)."""
    if share == 0 or share >= 0.01:
        return f"{share:.0%}"
    return f"{share:.1%}"
