"""The shape of an upsert pipeline over several topics: each topic's rows staged into its table by the upsert rule.

The batch's rows come from :mod:`spark_jobs.topics_source` (each topic's fields in a struct of its own). With a
transaction topic the gate (:mod:`spark_jobs.transaction_gate`) first sets aside the change events whose source
transaction is not whole yet, with the rows that waited after the previous batch joining this one. Then each
member (a topic and its table) is staged as the single-topic upsert pipeline it is
(:class:`spark_jobs.upserts.UpsertShape`, its deletes remembered in a folder of its own), and the rejects of
every topic go to the pipeline's one rejects table. A member with no rows in the batch costs no Spark job; its
remembered deletes are carried to the batch as they were.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from krishiv_core.runbook import runbook
from krishiv_core.spec import PipelineSpec
from krishiv_core.spec_topics import MEMBERS_DIR
from spark_jobs.checkpoint import BatchOffsets
from spark_jobs.delete_memory import DeleteMemoryStore
from spark_jobs.record_decoder import REASON
from spark_jobs.staging import QUERY_REJECT_COLUMNS, BatchResult, Target
from spark_jobs.topics_source import HEAD_COLUMNS, TopicsLayout
from spark_jobs.transaction_gate import GATE_COLUMNS, HeldRowsStore, Release, describe_open, plan_release
from spark_jobs.transform import build_output
from spark_jobs.upserts import UpsertShape

log = logging.getLogger(__name__)


class TopicsShape:
    def __init__(
        self, pipeline: PipelineSpec, layout: TopicsLayout, targets: Sequence[Target], checkpoint: Path
    ) -> None:
        self.pipeline = pipeline
        self.layout = layout
        by_table = {t.output.name: t for t in targets}
        self.members = [
            UpsertShape(
                m, by_table[m.table], DeleteMemoryStore(checkpoint / MEMBERS_DIR / m.table, new_when_missing=True)
            )
            for m in pipeline.members
        ]
        # kept whenever the checkpoint has it: rows waiting when transaction_topic is removed are staged next batch
        self.held = HeldRowsStore(checkpoint)
        # what waits, and each member's remembered deletes, are carried through every batch, a replay's too
        self.stateful = True

    def compute(self, batch: DataFrame, offsets: BatchOffsets, folder: Callable[[Target], str]) -> BatchResult:
        rows = self._with_held(batch, offsets.batch_id)
        rows.persist()
        try:
            # what the driver decides by: one Spark job, Kafka read once (the rows are cached)
            gate = rows.select(*GATE_COLUMNS).toArrow().to_pylist()
            release = self._gate(rows, gate, offsets.batch_id)
            released = rows.where(~release.waiting()) if release.holds else rows
            staged = [r for r in gate if not release.waits(r)]
            counts = Counter(r["topic"] for r in staged if r[REASON] is None and r["topic"] in self.layout.topics)
            result = BatchResult(sum(counts.values()))
            if any(r[REASON] is not None for r in staged):
                columns = [F.col("timestamp" if c == "kafka_timestamp" else c).alias(c) for c in QUERY_REJECT_COLUMNS]
                result.rejects = released.where(F.col(REASON).isNotNull()).select(*columns).toArrow()
            for i, member in enumerate(self.members):  # a member without rows costs no Spark job
                topic = self.layout.topics[i]
                if not counts[topic]:
                    self._carry(member, offsets.batch_id)
                    continue
                own = released.where((F.col("topic") == topic) & F.col(REASON).isNull()).select(
                    *[name for name, _ in HEAD_COLUMNS], f"{self.layout.member_column(i)}.*"
                )
                valid = build_output(own, member.pipeline)
                result.files.update(member.compute_valid(valid, offsets, folder, counts[topic]).files)
            if self.pipeline.transaction_topic:  # the change events left waiting after this batch, in the checkpoint
                marks = self.pipeline.transaction_topic
                result.metrics["held_events"] = sum(1 for r in gate if r["topic"] != marks and release.waits(r))
        finally:
            rows.unpersist()
        return result

    def _with_held(self, batch: DataFrame, batch_id: int) -> DataFrame:
        """The batch's rows, with those that waited after the batch before it."""
        held = self.held.load_before(batch_id)
        if held is None:
            return batch
        rows = conform(held, self.layout.arrow_schema())
        return batch.sparkSession.createDataFrame(rows, schema=batch.schema).unionByName(batch)

    def _gate(self, rows: DataFrame, gate: list[dict], batch_id: int) -> Release:
        """What waits after this batch, decided and kept in the checkpoint before anything is staged."""
        nothing = self.layout.arrow_schema().empty_table()
        if self.pipeline.transaction_topic is None:  # nothing waits; what waited before (if anything) goes now
            if self.held.folder.exists():
                self.held.save(batch_id, nothing)
            return Release()
        timeout = timedelta(milliseconds=self.pipeline.transaction_timeout_ms)
        release = plan_release(
            gate, self.layout.topics, str(self.pipeline.transaction_topic), timeout, self.layout.topic_pattern
        )
        self.held.save(batch_id, rows.where(release.waiting()).toArrow() if release.holds else nothing)
        if release.open:
            log.info("batch %s: waiting for source transactions %s", batch_id, describe_open(release.open))
        if release.given_up:
            log.warning(
                "batch %s: source transactions %s waited longer than transaction_timeout (%ss of Kafka time) and are "
                "staged as they are: an event of theirs was not read (a record that is not a change event, in %s?) "
                "or their END mark was not written %s",
                batch_id,
                describe_open(release.given_up),
                self.pipeline.transaction_timeout_ms // 1000,
                self.pipeline.rejects_table,
                runbook("A source transaction that waits"),
            )
        return release

    @staticmethod
    def _carry(member: UpsertShape, batch_id: int) -> None:
        """A member without rows in the batch keeps its remembered deletes as they were."""
        memory = member.memory
        if memory is None:
            return
        before = memory.load_before(batch_id)
        memory.save(batch_id, before if before is not None else pa.table({}))


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table``'s rows in ``schema``, by name at every depth of a struct: rows kept before the spec changed (a
    topic added, a field added, a type widened) in the layout of the query that reads them now. A column or field
    ``schema`` lacks is not kept (a removed field: its table keeps the column, which the staged rows leave null)."""

    def column(values: pa.Array | pa.ChunkedArray | None, t: pa.DataType, n: int) -> pa.Array:
        if values is None:
            return pa.nulls(n, t)
        values = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
        if pa.types.is_struct(t) and pa.types.is_struct(values.type):
            names = {values.type.field(i).name for i in range(values.type.num_fields)}
            parts = [column(values.field(f.name) if f.name in names else None, f.type, n) for f in t]
            return pa.StructArray.from_arrays(parts, fields=list(t), mask=values.is_null())
        return values.cast(t)

    n = table.num_rows
    return pa.Table.from_arrays(
        [column(table.column(f.name) if f.name in table.column_names else None, f.type, n) for f in schema],
        schema=schema,
    )
