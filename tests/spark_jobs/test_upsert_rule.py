"""The upsert rule (docs/spec.md ``kind = "upsert"``, PROTOCOL.md invariant 13): any cut of a stream into batches gives
the same table, the one :func:`chaos.kinds_oracle.fold_upserts` folds from the events one at a time.

The property test generates random streams over a few keys, each key in one partition (its Kafka key): rows with
versions drawn from a few values and nulls (so ties and nulls are common), ``delete_field`` events and tombstones.
Each stream is cut three ways (one batch; one event per batch; random cuts, independent per partition) and each
cut is staged by the real phase 1 (``build_output`` over static DataFrames of Kafka-shaped rows, the stager with
the upsert shape and its delete memory in a real checkpoint folder, the DuckDB ledger; the random cut's last batch
replayed by a new stager) and committed by the real phase 2 (the relay's merge) into its own table, on a SQLite
and a PostgreSQL catalog.
``KRISHIV_PROPERTY_EXAMPLES=<n>`` runs ``n`` streams per catalog instead of one (each about 20 s).

The end-to-end test sends the issue's examples through the broker and the streaming query, as one batch and as
batches of four records, and compares both tables with the oracle.
"""

from __future__ import annotations

import json
import os
import random
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from confluent_kafka import Producer

from chaos.kinds_oracle import UpsertEvent, fold_upserts
from chaos.workspace import SETTINGS_TEMPLATE
from krishiv.operations import commit_pipelines, open_ledger, run_pipelines
from krishiv.produce import ensure_topic
from krishiv_core.catalog import ensure_pipeline_tables, load_catalog, qualified
from krishiv_core.entries import PENDING
from krishiv_core.spec import KrishivSpec, PipelineSpec, load_spec
from krishiv_core.tables import output_tables
from spark_jobs.checkpoint import Checkpoint
from spark_jobs.delete_memory import DeleteMemoryStore
from spark_jobs.job import shape_of
from spark_jobs.staging import BatchStager, Target
from spark_jobs.transform import build_output
from tests.spark_jobs.pipeline_helpers import decoded_frame

PARTITIONS = 2
PIPELINE = """
[[pipelines]]
name = "{name}"
kind = "upsert"
topic = "{topic}"
key = ["id"]
version_field = "v"
delete_field = "deleted"
max_records_per_batch = {max_records}

[pipelines.fields]
id = "long"
v = {{ type = "long", required = false }}
name = {{ type = "string", required = false }}
deleted = {{ type = "boolean", required = false }}
"""


@dataclass(frozen=True)
class Event:
    key: int
    kind: str  # "row", "delete" or "tombstone"
    version: int | None = None
    name: str = ""

    @property
    def partition(self) -> int:
        return self.key % PARTITIONS  # a key's events in one partition, as Kafka puts a Kafka key

    def value(self) -> bytes | None:
        if self.kind == "tombstone":
            return None
        doc: dict[str, object] = {"id": self.key, "v": self.version}
        doc.update({"deleted": True} if self.kind == "delete" else {"name": self.name, "deleted": False})
        return json.dumps(doc).encode()

    def folded(self) -> UpsertEvent:
        row = (self.version, self.name) if self.kind == "row" else None
        return UpsertEvent(self.key, self.version, row, tombstone=self.kind == "tombstone")


def _spec(tmp_path: Path, catalog_uri: str, bootstrap: str, topic: str, pipelines: dict[str, int]) -> KrishivSpec:
    path = tmp_path / "krishiv.toml"
    text = SETTINGS_TEMPLATE.format(
        bootstrap=bootstrap, partitions=PARTITIONS, catalog_uri=catalog_uri, warehouse="warehouse"
    )
    for name, max_records in pipelines.items():
        text += PIPELINE.format(name=name, topic=topic, max_records=max_records)
    path.write_text(text)
    return load_spec(path, env={})


def _oracle(events: list[Event]) -> dict[int, tuple[int | None, str]]:
    """Each partition's events in offset order (the keys of one partition never meet another's)."""
    by_position = sorted(
        ((offset, e.partition, e) for offset, e in _offsets(events)), key=lambda item: (item[0], item[1])
    )
    return fold_upserts(e.folded() for _o, _p, e in by_position)  # type: ignore[return-value]


def _offsets(events: list[Event]) -> list[tuple[int, Event]]:
    """Each event with its offset in its partition, in the order they were produced."""
    nxt = [0] * PARTITIONS
    out = []
    for e in events:
        out.append((nxt[e.partition], e))
        nxt[e.partition] += 1
    return out


def _table(spec: KrishivSpec, pipeline: PipelineSpec) -> dict[int, tuple[int | None, str]]:
    rows = load_catalog(spec).load_table(qualified(spec, pipeline.table)).scan().to_arrow().to_pylist()
    got = {r["id"]: (r["v"], r["name"]) for r in rows}
    assert len(got) == len(rows), f"{pipeline.table}: a key is there twice: {rows}"
    return got


# ------------------------------------------------------------------------------------------- the property


def _stream(rng: random.Random, events: int) -> list[Event]:
    out = []
    for seq in range(events):
        kind = rng.choices(["row", "delete", "tombstone"], weights=[6, 2, 2])[0]
        version = None if rng.random() < 0.2 else rng.randint(0, 3)
        out.append(Event(rng.randint(1, 3), kind, None if kind == "tombstone" else version, f"e{seq}"))
    return out


def _cuts(rng: random.Random, sizes: list[int], how: str, events: list[Event]) -> list[list[int]]:
    """Each batch's end offset per partition."""
    if how == "one batch":
        return [list(sizes)]
    if how == "one event per batch":
        ends, out = [0] * PARTITIONS, []
        for e in events:
            ends[e.partition] += 1
            out.append(list(ends))
        return out
    batches = rng.randint(2, 4)
    per_partition = [[*sorted(rng.choices(range(size + 1), k=batches - 1)), size] for size in sizes]
    return [[per_partition[p][b] for p in range(PARTITIONS)] for b in range(batches)]


def _stage_static(
    spark,
    spec: KrishivSpec,
    pipeline: PipelineSpec,
    events: list[Event],
    cuts: list[list[int]],
    replay_last: bool,
    memory_key: str = "id",
) -> list[str] | None:
    """Phase 1 of ``pipeline`` over ``events`` cut at ``cuts``: a checkpoint folder as Spark writes it (query id,
    pinned start, each batch's end offsets), each batch's Kafka rows as a DataFrame through ``build_output`` into
    the real stager. With ``replay_last``, the columns of the delete memory the replay kept (its key column
    ``memory_key``)."""
    catalog, ledger = load_catalog(spec), open_ledger(spec)
    tables = ensure_pipeline_tables(catalog, spec, pipeline)
    targets = [Target(qualified(spec, t.name), t, tables[t.name]) for t in output_tables(pipeline)]
    folder = spec.checkpoint_dir(pipeline)
    (folder / "offsets").mkdir(parents=True)
    (folder / "metadata").write_text(json.dumps({"id": str(uuid.uuid4())}))
    checkpoint = Checkpoint(folder)
    checkpoint.pin_starting_offsets({str(p): 0 for p in range(PARTITIONS)})
    stager = BatchStager(pipeline, ledger, checkpoint, targets, shape_of(pipeline, targets, checkpoint))
    records = [
        (str(e.key).encode(), e.value(), pipeline.topic, e.partition, offset, datetime(2026, 1, 1, tzinfo=UTC))
        for offset, e in _offsets(events)
    ]
    batches = []
    start = [0] * PARTITIONS
    for batch_id, ends in enumerate(cuts):
        (folder / "offsets" / str(batch_id)).write_text(
            "v1\n{}\n" + json.dumps({str(p): ends[p] for p in range(PARTITIONS)})
        )
        batches.append([r for r in records if start[r[3]] <= r[4] < ends[r[3]]])
        stager(build_output(decoded_frame(spark, batches[-1], pipeline), pipeline), batch_id)
        start = ends
    assert [b.batch_id for b in stager.history] == list(range(len(cuts)))
    if not replay_last:
        return None
    # a restarted stager replays the last batch: the same deletes remembered, nothing recorded
    memory = DeleteMemoryStore(folder).path(len(cuts) - 1)
    before = pq.read_table(memory)
    again = BatchStager(pipeline, ledger, checkpoint, targets, shape_of(pipeline, targets, checkpoint))
    again(build_output(decoded_frame(spark, batches[-1], pipeline), pipeline), len(cuts) - 1)
    assert [b.recorded for b in again.history] == [False]
    assert pq.read_table(memory).sort_by(memory_key).equals(before.sort_by(memory_key))
    return before.column_names


WAYS = ("one batch", "one event per batch", "random cuts")


@pytest.mark.parametrize("catalog", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_any_cut_of_a_stream_gives_the_table_of_the_rule(catalog, tmp_path, spark, request) -> None:
    uri = request.getfixturevalue("postgres_uri") if catalog == "postgresql" else "sqlite:///catalog.db"
    examples = int(os.environ.get("KRISHIV_PROPERTY_EXAMPLES", "1"))
    rng = random.Random(f"upsert-rule-{catalog}")
    for example in range(examples):
        events = _stream(rng, rng.randint(6, 9))
        folder = tmp_path / f"example-{example}"
        folder.mkdir()
        names = [f"upsert_{example}_{i}" for i in range(len(WAYS))]  # one PostgreSQL database for all examples
        spec = _spec(folder, uri, "127.0.0.1:9", "t", dict.fromkeys(names, 10))
        sizes = [sum(1 for e in events if e.partition == p) for p in range(PARTITIONS)]
        for way, pipeline in zip(WAYS, spec.pipelines, strict=True):
            _stage_static(spark, spec, pipeline, events, _cuts(rng, sizes, way, events), way == "random cuts")
        commit_pipelines(spec, list(spec.pipelines))
        assert not open_ledger(spec).entries(status=PENDING)
        want = _oracle(events)
        shown = "\n".join(f"  {e}" for e in events)
        for way, pipeline in zip(WAYS, spec.pipelines, strict=True):
            assert _table(spec, pipeline) == want, f"{way}, example {example}; the stream:\n{shown}"


# ------------------------------------------------------------------------------------------- end to end

#: The issue's cases, key by key (the comment: what the rule leaves), produced in this order.
ISSUE_EXAMPLES = [
    Event(1, "row", 5, "a1"),
    Event(1, "delete", 3),  # a delete_field event of a lower version: the row of version 5 stays
    Event(2, "row", 5, "b1"),
    Event(2, "tombstone"),
    Event(2, "row", 2, "b2"),  # after a tombstone any version applies: b2
    Event(3, "row", 4, "c1"),
    Event(3, "row", None, "c2"),  # a null version is the lowest: c1 stays
    Event(4, "row", None, "d1"),
    Event(4, "row", None, "d2"),  # nulls tie, the later wins: d2
    Event(5, "delete", 7),
    Event(5, "row", 6, "e1"),  # the key remembers the delete's 7: no row
    Event(6, "row", 3, "f1"),
    Event(6, "delete", 3),
    Event(6, "row", 3, "f2"),  # ties go to the later event: deleted, then f2
    Event(7, "row", 2, "g1"),
    Event(7, "delete", 4),
    Event(7, "tombstone"),
    Event(7, "row", 1, "g2"),  # the tombstone forgets the delete's 4: g2
]


def _produce(spec: KrishivSpec, events: list[Event]) -> None:
    topic = spec.pipelines[0].topic
    ensure_topic(spec.kafka.bootstrap_servers, topic, PARTITIONS)
    producer = Producer({"bootstrap.servers": spec.kafka.bootstrap_servers, "enable.idempotence": False})
    for e in events:  # one record per produce request: Tansu's high watermark counts produce batches
        producer.produce(topic, key=str(e.key).encode(), value=e.value(), partition=e.partition)
        assert producer.flush(30) == 0


def test_the_issues_examples_through_the_broker_in_two_batchings(tmp_path, broker, spark, topic) -> None:
    spec = _spec(tmp_path, "sqlite:///catalog.db", broker.bootstrap, topic, {"whole": 1_000, "small": 4})
    _produce(spec, ISSUE_EXAMPLES)
    reports = run_pipelines(spec, list(spec.pipelines), once=True)
    batches = {r.stager.pipeline.name: len(r.stager.history) for r in reports}
    assert batches["whole"] == 1 and batches["small"] >= len(ISSUE_EXAMPLES) // 4, batches
    commit_pipelines(spec, list(spec.pipelines))
    want = _oracle(ISSUE_EXAMPLES)
    assert want == {1: (5, "a1"), 2: (2, "b2"), 3: (4, "c1"), 4: (None, "d2"), 6: (3, "f2"), 7: (1, "g2")}
    for pipeline in spec.pipelines:
        assert _table(spec, pipeline) == want, pipeline.name
