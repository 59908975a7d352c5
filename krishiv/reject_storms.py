"""The lines that make a reject storm loud: ``krishiv run``'s per batch, ``status``'s and ``check``'s per pipeline.

When a batch or a pipeline's recent batches are alarming is :mod:`krishiv_core.reject_rate`'s rule; each line here
says how many records were rejected, why (a batch: the most common reason), and where to look: the pipeline's
rejects table, which holds every rejected record's value and reason, and the runbook section on what to do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from krishiv_core.reject_rate import REJECT_RATE_ENV, RejectRate, percent
from krishiv_core.runbook import runbook

if TYPE_CHECKING:
    from spark_jobs.staging import StagedBatch  # not imported to run: it imports Spark

#: The runbook section every line points to.
_WAY_OUT = runbook("A pipeline that rejects most records")


def _look(rejects_table: str) -> str:
    return f"each rejected record and its reason is in {rejects_table} {_WAY_OUT}"


def batch_warning(batch: StagedBatch, rejects_table: str) -> str | None:
    """``batch 0: 8,000 of 8,000 records rejected (100%), 8,000 of them for: <reason>; …``, for a batch whose rejects
    the stager found alarming (it then names their most common reason); else None."""
    common = batch.common_reason
    if common is None:
        return None
    rate = RejectRate(batch.records_read, batch.rejects).describe()
    return f"batch {batch.batch_id}: {rate}, {common.rejects:,} of them for: {common.reason}; {_look(rejects_table)}"


def recent_rejects(rate: RejectRate, warn_above: float) -> str:
    """What a pipeline's recent batches rejected: ``8,000 of 8,000 records rejected (100%) in its last 3 batches (it
    warns above 50%, KRISHIV_REJECT_RATE_WARN)``."""
    batches = "batch" if rate.batches == 1 else f"{rate.batches} batches"
    return f"{rate.describe()} in its last {batches} (it warns above {percent(warn_above)}, {REJECT_RATE_ENV})"


def pipeline_warning(rate: RejectRate, warn_above: float, rejects_table: str) -> str | None:
    """The line ``status`` warns with and ``check`` fails with when the pipeline's recent batches are alarming."""
    if not rate.alarming(warn_above):
        return None
    return f"{recent_rejects(rate, warn_above)}: the spec does not read what the topic holds; " + _look(rejects_table)
