"""The upsert rule with its key, version and delete flag inside structs (``device.id``, ``meta.v``, ``meta.deleted``;
docs/spec.md "Paths in keys"): any cut of a random stream into batches, staged by the real phase 1 (the delete
memory keyed by the path included, the last batch replayed) and merged by the real phase 2, gives the table that
:func:`chaos.kinds_oracle.fold_upserts` folds one event at a time, on a SQLite catalog. The streams and cuts are
``tests/spark_jobs/test_upsert_rule.py``'s; only the records' shape differs (a tombstone's Kafka key is the key's
value itself, a one-field key).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

import pytest

from chaos.workspace import SETTINGS_TEMPLATE
from krishiv.operations import commit_pipelines, open_ledger
from krishiv_core.catalog import load_catalog, qualified
from krishiv_core.entries import PENDING
from krishiv_core.spec import KrishivSpec, PipelineSpec, load_spec
from spark_jobs.record_decoder import Decoding, Reading, read_tombstone_key
from tests.spark_jobs.test_upsert_rule import PARTITIONS, WAYS, Event, _cuts, _oracle, _stage_static, _stream

PIPELINE = """
[[pipelines]]
name = "{name}"
kind = "upsert"
topic = "t"
key = ["device.id"]
version_field = "meta.v"
delete_field = "meta.deleted"
max_records_per_batch = 10

[pipelines.fields]
device = {{ type = "struct", fields = {{ id = "long", label = {{ type = "string", required = false }} }} }}
name = {{ type = "string", required = false }}

[pipelines.fields.meta]
type = "struct"
fields = {{ v = {{ type = "long", required = false }}, deleted = {{ type = "boolean", required = false }} }}
"""


@dataclass(frozen=True)
class NestedEvent(Event):
    def value(self) -> bytes | None:
        if self.kind == "tombstone":
            return None
        meta: dict[str, object] = {"v": self.version, "deleted": self.kind == "delete"}
        doc: dict[str, object] = {"device": {"id": self.key, "label": f"d{self.key}"}, "meta": meta}
        if self.kind == "row":
            doc["name"] = self.name
        return json.dumps(doc).encode()


def _spec(tmp_path: Path, names: list[str]) -> KrishivSpec:
    path = tmp_path / "krishiv.toml"
    text = SETTINGS_TEMPLATE.format(
        bootstrap="127.0.0.1:9", partitions=PARTITIONS, catalog_uri="sqlite:///catalog.db", warehouse="warehouse"
    )
    path.write_text(text + "".join(PIPELINE.format(name=n) for n in names))
    return load_spec(path, env={})


def _table(spec: KrishivSpec, pipeline: PipelineSpec) -> dict[int, tuple[int | None, str]]:
    rows = load_catalog(spec).load_table(qualified(spec, pipeline.table)).scan().to_arrow().to_pylist()
    got = {r["device"]["id"]: (r["meta"]["v"], r["name"]) for r in rows}
    assert len(got) == len(rows), f"{pipeline.table}: a key is there twice: {rows}"
    return got


# heavy: about 25 batches through Spark (5 minutes on two busy cores); make test-heavy runs it
@pytest.mark.heavy
def test_any_cut_of_a_stream_keyed_inside_structs_gives_the_table_of_the_rule(tmp_path, spark) -> None:
    rng = random.Random("nested-upsert-rule")
    events = [NestedEvent(**e.__dict__) for e in _stream(rng, 14)]
    assert {e.kind for e in events} == {"row", "delete", "tombstone"}
    names = [f"nested_{i}" for i in range(len(WAYS))]
    spec = _spec(tmp_path, names)
    sizes = [sum(1 for e in events if e.partition == p) for p in range(PARTITIONS)]
    for way, pipeline in zip(WAYS, spec.pipelines, strict=True):
        # every way replays its last batch (the delete memory keyed by the path)
        memory = _stage_static(spark, spec, pipeline, events, _cuts(rng, sizes, way, events), True, "device.id")
        assert memory == ["device.id", "meta.v"]
    commit_pipelines(spec, list(spec.pipelines))
    assert not open_ledger(spec).entries(status=PENDING)
    want = _oracle(events)
    shown = "\n".join(f"  {e}" for e in events)
    for way, pipeline in zip(WAYS, spec.pipelines, strict=True):
        assert _table(spec, pipeline) == want, f"{way}; the stream:\n{shown}"


KEYED = """
[[pipelines]]
name = "k"
kind = "upsert"
topic = "t"
key = {key}

[pipelines.fields]
site = "string"
device = {{ type = "struct", fields = {{ id = "long", label = {{ type = "string", required = false }} }} }}
"""


def _decoding(tmp_path: Path, key: list[str]) -> Decoding:
    path = tmp_path / f"{len(key)}.toml"
    path.write_text(KEYED.format(key=json.dumps(key)))
    return Decoding.of(load_spec(path, env={}).pipelines[0])


def test_a_tombstones_kafka_key_holds_a_key_inside_structs_at_its_path(tmp_path: Path) -> None:
    one = _decoding(tmp_path, ["device.id"])
    assert read_tombstone_key(b"7", one) == Reading(None, {"device": {"id": 7}})  # the key's value itself
    assert read_tombstone_key(b" -7 ", one).values == {"device": {"id": -7}}
    assert read_tombstone_key(b'"7"', one).reason == 'mistyped field: device.id (long, got a JSON string "7")'
    assert read_tombstone_key(b"7.5", one).reason.startswith("mistyped field: device.id (long, got a JSON number 7.5")
    assert read_tombstone_key(None, one).reason == "tombstone without a key: expected the Kafka key to hold device.id"

    two = _decoding(tmp_path, ["device.id", "site"])
    held = b'{"site": "north", "device": {"label": "x", "id": 7}, "other": 1}'
    assert read_tombstone_key(held, two) == Reading(None, {"device": {"id": 7}, "site": "north"})
    without = "tombstone without a key: expected the Kafka key to hold device.id, site"
    for key in (
        b'{"site": "north", "device": {}}',
        b'{"site": "north", "device": null}',
        b'{"site": "north"}',
        b'{"site": "north", "device": 7}',
        b'{"site": "north", "device.id": 7}',
        b"7",
        b"{",
    ):
        assert read_tombstone_key(key, two).reason == without, key
    assert read_tombstone_key(b'{"site": 5, "device": {"id": 2}}', two).reason.startswith("mistyped field: site (")
