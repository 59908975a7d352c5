"""The ``upsert`` kind: the latest row per key by the upsert rule (docs/spec.md) (PROTOCOL.md invariant 13).

The rule: a key's events are folded in Kafka order; an event (a row, or a ``delete_field`` event) applies when
its version is at least the key's remembered one (a null version is lower than every version; ties go to the
later event), a tombstone removes the row and forgets the version. So a key's state is the greatest
(version, position) among its events since its last tombstone, and any cut of the stream into batches gives the
same table. Phase 1 (here) and phase 2 (``outbox.merge``) split that fold:

Per key of the batch (one shuffle by key), with ``t`` its last tombstone in the batch (if any) and ``w`` the
greatest (version, offset, partition) of its other events after ``t``:

* a tombstone and no ``w``: a delete key (``delete-keys``: deletes whatever the table's version);
* a tombstone and ``w`` a row: a delete key and ``w`` as a data row (the merge adds a tombstoned key's row);
* a tombstone and ``w`` a delete: a delete key;
* no tombstone, ``w`` a row: a data row, which the merge drops if the table's row has a higher version;
* no tombstone, ``w`` a delete: a versioned delete key (``versioned-delete-keys``: key and version), which the
  merge applies unless the table's row has a higher version;
* no tombstone and ``w``'s version below the version the key remembers of a delete (``spark_jobs.delete_memory``:
  the table has no row left to compare with): nothing.

A key's position is its (offset, partition): a key's events are in one partition when it is the Kafka key, so
that is Kafka order. Without a version field all versions tie, so the latest event wins and nothing is
remembered. The tasks write the data rows, the delete keys and the versioned delete keys as files of their
content; phase 2 merges them in one commit.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import pyarrow as pa
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType

from krishiv_core.entries import DATA, DELETE_KEYS, VERSIONED_DELETE_KEYS
from krishiv_core.spec import PipelineSpec
from spark_jobs.checkpoint import BatchOffsets
from spark_jobs.delete_memory import DeleteMemoryStore
from spark_jobs.staging import BatchResult, Target, rejects_apart
from spark_jobs.task_writer import WriteTarget, write_in_tasks
from spark_jobs.transform import DELETE, TOMBSTONE

_CONTENT = "__content"
_POSITION = "__position"
_LAST_TOMBSTONE = "__last_tombstone"
_CANDIDATE = "__candidate"
_RANK = "__rank"
_REMEMBERED = "__remembered"
_BLOCKED = "__blocked"


def latest_per_key(valid: DataFrame, pipeline: PipelineSpec) -> DataFrame:
    """One row per key of ``valid``: its ``w`` (or its last tombstone when no event follows it), with
    ``__last_tombstone`` (the position of the key's last tombstone, null if none) and ``__candidate`` (the row is
    ``w``: an event after that tombstone, not a tombstone)."""
    by_key = Window.partitionBy(*pipeline.key)
    position = F.struct(F.col("offset"), F.col("partition"))
    with_tombstone = valid.withColumn(_POSITION, position).withColumn(
        _LAST_TOMBSTONE, F.max(F.when(F.col(TOMBSTONE), F.col(_POSITION))).over(by_key)
    )
    candidate = ~F.col(TOMBSTONE) & (F.col(_LAST_TOMBSTONE).isNull() | (F.col(_POSITION) > F.col(_LAST_TOMBSTONE)))
    order = [F.col(_CANDIDATE).desc(), F.col("offset").desc(), F.col("partition").desc()]
    if pipeline.version_field:
        order.insert(1, F.col(pipeline.version_field).desc_nulls_last())  # a null version is the lowest
    ranked = with_tombstone.withColumn(_CANDIDATE, candidate).withColumn(
        _RANK, F.row_number().over(by_key.orderBy(*order))
    )
    return ranked.where(F.col(_RANK) == 1).drop(_RANK, _POSITION)


def _blocked(pipeline: PipelineSpec, remembered: bool) -> Column:
    """Where the key's ``w`` is below the version the key remembers of a delete (and no tombstone came between)."""
    if not remembered or not pipeline.version_field:
        return F.lit(False)
    version = F.col(pipeline.version_field)
    return (
        F.col(_LAST_TOMBSTONE).isNull()
        & F.col(_REMEMBERED).isNotNull()
        & F.col(_CANDIDATE)
        & (version.isNull() | (version < F.col(_REMEMBERED)))
    )


def contents(pipeline: PipelineSpec) -> Column:
    """What a key's row of :func:`latest_per_key` stages: an array of contents (empty: nothing)."""
    tombstoned = F.col(_LAST_TOMBSTONE).isNotNull()
    row = F.col(_CANDIDATE) & ~F.col(DELETE)
    delete = F.col(_CANDIDATE) & F.col(DELETE)
    versioned = VERSIONED_DELETE_KEYS if pipeline.version_field else DELETE_KEYS
    return F.array_compact(
        F.array(
            F.when(tombstoned, F.lit(DELETE_KEYS)),
            F.when(row & ~F.col(_BLOCKED), F.lit(DATA)),
            F.when(delete & ~tombstoned & ~F.col(_BLOCKED), F.lit(versioned)),
        )
    )


class UpsertShape:
    def __init__(self, pipeline: PipelineSpec, target: Target, memory: DeleteMemoryStore | None = None) -> None:
        self.pipeline = pipeline
        self.target = target
        # Deletes are remembered only with a version (without one every event applies) and delete events (a
        # delete field, or Debezium's op d; a tombstone forgets).
        self.memory = memory if pipeline.remembers_deletes else None
        # A replay must carry the remembered deletes through the batch, like the windowed kind's open windows.
        self.stateful = self.memory is not None

    def compute(self, batch: DataFrame, offsets: BatchOffsets, folder: Callable[[Target], str]) -> BatchResult:
        # The winners per key take a shuffle of the valid rows by key; the rejects are read apart.
        return rejects_apart(batch, lambda valid: self.compute_valid(valid, offsets, folder))

    def compute_valid(
        self, valid: DataFrame, offsets: BatchOffsets, folder: Callable[[Target], str], records: int | None = None
    ) -> BatchResult:
        """The batch's valid rows (no reason) staged by the upsert rule: ``compute`` less the rejects. ``records``:
        how many rows ``valid`` has, when the caller knows (else a Spark job counts them)."""
        records = valid.count() if records is None else records
        where = folder(self.target)
        schema = self.target.schema
        key = list(self.pipeline.key)
        writes = [
            WriteTarget.of(DATA, self.target.table, where, schema=schema),
            WriteTarget.of(DELETE_KEYS, self.target.table, where, content=DELETE_KEYS, schema=schema.select(*key)),
        ]
        if self.pipeline.version_field:
            versioned = schema.select(*key, self.pipeline.version_field)
            writes.append(
                WriteTarget.of(
                    VERSIONED_DELETE_KEYS, self.target.table, where, content=VERSIONED_DELETE_KEYS, schema=versioned
                )
            )
        winners = latest_per_key(valid, self.pipeline)
        before = self.memory.load_before(offsets.batch_id) if self.memory is not None else None
        remembered = before is not None and before.num_rows > 0
        if remembered:
            assert before is not None and self.pipeline.version_field
            memory = F.broadcast(self._memory_frame(valid, before))
            winners = winners.join(memory, _same_key(winners, memory, key), "left").drop(*_key_columns(key))
        winners = winners.withColumn(_BLOCKED, _blocked(self.pipeline, remembered))
        if self.memory is not None:
            winners = winners.persist()
        try:
            staged = winners.withColumn(_CONTENT, F.explode(contents(self.pipeline)))
            files = write_in_tasks(staged, writes, _CONTENT)
            if self.memory is not None:
                self.memory.save(offsets.batch_id, self._memory_after(valid, winners, before))
        finally:
            if self.memory is not None:
                winners.unpersist()
        return BatchResult(records, files={self.target.output.name: tuple(f for w in writes for f in files[w.name])})

    def _memory_frame(self, valid: DataFrame, memory: pa.Table) -> DataFrame:
        """The remembered deletes as a DataFrame of the key (``__key0``…, a key inside structs taken out of them) and
        ``__remembered``, in the batch's types. The memory's file names its columns by the key and version paths."""
        assert self.pipeline.version_field
        paths = [*self.pipeline.key, self.pipeline.version_field]
        types = valid.select(*[F.col(p) for p in paths]).schema.fields
        names = [*_key_columns(self.pipeline.key), _REMEMBERED]
        schema = StructType([StructField(n, t.dataType) for n, t in zip(names, types, strict=True)])
        return valid.sparkSession.createDataFrame(memory.rename_columns(names), schema=schema)

    def _memory_after(self, valid: DataFrame, winners: DataFrame, before: pa.Table | None) -> pa.Table:
        """The remembered deletes after the batch: a key the batch decided (a tombstone, or a ``w`` that applied)
        remembers its ``w``'s version if ``w`` is a delete with a version, nothing otherwise; the others keep theirs.
        Its columns are named by the key and version paths (``device.id``, ``meta.seq``)."""
        assert self.pipeline.version_field
        key = list(self.pipeline.key)
        version = self.pipeline.version_field
        names = _key_columns(key)
        keys = [F.col(k).alias(n) for k, n in zip(key, names, strict=True)]
        decided = winners.where(~F.col(_BLOCKED))
        new = decided.where(F.col(_CANDIDATE) & F.col(DELETE) & F.col(version).isNotNull())
        new = new.select(*keys, F.col(version).alias(_REMEMBERED))
        if before is not None and before.num_rows:
            kept = self._memory_frame(valid, before).join(decided.select(*keys), names, "left_anti")
            new = new.unionByName(kept)
        return new.toArrow().rename_columns([*key, version])


def _key_columns(key: Sequence[str]) -> list[str]:
    """Flat names of the key's values beside a batch's rows (a key path such as ``device.id`` is no column name)."""
    return [f"__key{i}" for i in range(len(key))]


def _same_key(rows: DataFrame, memory: DataFrame, key: Sequence[str]) -> Column:
    """``rows``' key (its paths) equals ``memory``'s key columns (:func:`_key_columns`)."""
    same = [rows[k] == memory[n] for k, n in zip(key, _key_columns(key), strict=True)]
    return functools.reduce(lambda a, b: a & b, same)
