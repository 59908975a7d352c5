"""The ``events`` kind: every valid event one row of its table, written by the Spark tasks.

Each row carries the table it goes to (``spark_jobs.transform.TARGET``: the pipeline's table, or its route's, or
the default table for a value without a route); :func:`spark_jobs.task_writer.write_in_tasks` writes each
task's rows per table and partition, and only the files' names and counts come back to the driver.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pyspark.sql import DataFrame

from spark_jobs.checkpoint import BatchOffsets
from spark_jobs.staging import BatchResult, Target
from spark_jobs.task_writer import WriteTarget, write_in_tasks
from spark_jobs.transform import TARGET


class EventsShape:
    stateful = False

    def __init__(self, targets: Sequence[Target]) -> None:
        self.targets = list(targets)

    def compute(self, valid: DataFrame, offsets: BatchOffsets, folder: Callable[[Target], str]) -> BatchResult:
        writes = [WriteTarget.of(t.output.name, t.table, folder(t), schema=t.schema) for t in self.targets]
        files = write_in_tasks(valid, writes, TARGET)
        return BatchResult(sum(f.records for found in files.values() for f in found), files=files)
