"""The ``events`` kind: every valid event one row of its table, written by the Spark tasks.

Each row carries the table it goes to (``spark_jobs.transform.TARGET``: the pipeline's table, or its route's, or
the default table for a value without a route); :func:`spark_jobs.task_writer.write_in_tasks` writes each
task's rows per table and partition, and only the files' names and counts come back to the driver. The rejects
are one more target of the same tasks (with the batch id the rejects table holds), so a batch is one Spark job.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_jobs.checkpoint import BatchOffsets
from spark_jobs.staging import BatchResult, Target
from spark_jobs.task_writer import WriteTarget, write_in_tasks
from spark_jobs.transform import TARGET


class EventsShape:
    stateful = False

    def __init__(self, targets: Sequence[Target], rejects: Target) -> None:
        self.targets = list(targets)
        self.rejects = rejects

    def compute(self, batch: DataFrame, offsets: BatchOffsets, folder: Callable[[Target], str]) -> BatchResult:
        writes = [WriteTarget.of(t.output.name, t.table, folder(t), schema=t.schema) for t in self.targets]
        rejects = self.rejects.output.name
        writes.append(WriteTarget.of(rejects, self.rejects.table, folder(self.rejects), schema=self.rejects.schema))
        rows = batch.withColumn(
            TARGET, F.when(F.col("reason").isNotNull(), F.lit(rejects)).otherwise(F.col(TARGET))
        ).withColumn("batch_id", F.lit(offsets.batch_id).cast("long"))
        files = write_in_tasks(rows, writes, TARGET)
        valid = sum(f.records for name, found in files.items() if name != rejects for f in found)
        return BatchResult(valid, files=files)
