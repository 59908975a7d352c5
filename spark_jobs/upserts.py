"""The ``upsert`` kind: the latest row per key, replaced or deleted by each batch (``MERGE INTO`` semantics).

Spark picks each key's winner among the batch's valid events (one shuffle by key): the highest
``version_field``, then the highest Kafka offset; without a version field, the highest offset (Kafka keeps a key
in one partition, so that is the key's order). A tombstone (a null value: its key comes from the Kafka key) has
no version, so with a version field it wins its batch; the spec's ``delete_field`` deletes with a version. The
tasks write the winners as data files and the deleted keys as delete-key files (key columns only), and phase 2
merges them in one commit (``outbox.merge``), where a table row of a higher version survives.
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from krishiv_core.entries import DATA, DELETE_KEYS
from krishiv_core.spec import PipelineSpec
from spark_jobs.checkpoint import BatchOffsets
from spark_jobs.staging import BatchResult, Target
from spark_jobs.task_writer import WriteTarget, write_in_tasks
from spark_jobs.transform import DELETE

_CONTENT = "__content"


def latest_per_key(valid: DataFrame, pipeline: PipelineSpec) -> DataFrame:
    """One row per key of ``valid``: the winner of its key in this batch."""
    order = [F.col("offset").desc(), F.col("partition").desc()]
    if pipeline.version_field:
        order.insert(0, F.col(pipeline.version_field).desc_nulls_first())
    ranked = valid.withColumn("__rank", F.row_number().over(Window.partitionBy(*pipeline.key).orderBy(*order)))
    return ranked.where(F.col("__rank") == 1).drop("__rank")


class UpsertShape:
    stateful = False

    def __init__(self, pipeline: PipelineSpec, target: Target) -> None:
        self.pipeline = pipeline
        self.target = target

    def compute(self, valid: DataFrame, offsets: BatchOffsets, folder: Callable[[Target], str]) -> BatchResult:
        records = valid.count()
        where = folder(self.target)
        schema = self.target.schema
        key_schema = schema.select(*self.pipeline.key)
        writes = [
            WriteTarget.of(DATA, self.target.table, where, schema=schema),
            WriteTarget.of(DELETE_KEYS, self.target.table, where, content=DELETE_KEYS, schema=key_schema),
        ]
        winners = latest_per_key(valid, self.pipeline)
        content = F.when(F.col(DELETE), F.lit(DELETE_KEYS)).otherwise(F.lit(DATA))
        files = write_in_tasks(winners.withColumn(_CONTENT, content), writes, _CONTENT)
        return BatchResult(records, files={self.target.output.name: files[DATA] + files[DELETE_KEYS]})
