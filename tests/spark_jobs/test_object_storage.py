"""The warehouse and the staged files on S3 (a local endpoint), end to end through the real broker and Spark.

One spec, three kinds from one topic: windowed (rows staged by the driver), raw events and an upsert (files
written by the Spark tasks, whose FileIO is rebuilt there from the table's properties). The endpoint checks
every request's signature, so a client that missed the endpoint or the keys fails rather than writing to a
local folder or to AWS. The secret key is in the environment only; the spec names the variable.

After staging, one batch's task-written files are deleted from the bucket and every checkpoint is rewound: the
replay records nothing new and writes only those files again. The relay's commit then leaves each table equal
to its oracle; everything Iceberg and the stager wrote is in the bucket; ``clean_staging`` removes an
unreferenced staged object and nothing else.
"""

from __future__ import annotations

import os
import re
from decimal import Decimal
from pathlib import Path

import pytest
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField

from chaos.kinds_oracle import expected_events, expected_upsert
from chaos.oracle import read_topic
from chaos.workspace import ORDER_FIELDS, SPEC_TEMPLATE
from krishiv.operations import open_ledger, run_pipelines
from krishiv.produce import demo_orders, ensure_topic, produce
from krishiv.staging_files import clean_staging
from krishiv_core.catalog import ensure_pipeline_tables, load_catalog, qualified
from krishiv_core.entries import COMMITTED
from krishiv_core.errors import KrishivError
from krishiv_core.spec import KrishivSpec, load_spec
from krishiv_core.staging_paths import STAGING_DIR
from spark_jobs.checkpoint import Checkpoint
from spark_jobs.kafka_source import latest_offsets
from spark_jobs.staging import staging_root
from spark_jobs.task_writer import WriteTarget
from tests.services.s3 import S3Endpoint
from tests.spark_jobs.pipeline_helpers import assert_exactly_once

MORE_KINDS = """
[[pipelines]]
name = "orders_raw"
kind = "events"
topic = "{topic}"
kafka_metadata = true
partition_by = ["day(event_time)"]
max_records_per_batch = {max_records}
{fields}
[[pipelines]]
name = "latest_order"
kind = "upsert"
topic = "{topic}"
key = ["customer_id"]
version_field = "event_time"
partition_by = ["bucket(4, customer_id)"]
max_records_per_batch = {max_records}
{fields}
"""

RECORDS = 600
MAX_RECORDS = 300  # two batches per pipeline


def _spec(tmp_path: Path, bootstrap: str, topic: str, s3: S3Endpoint) -> KrishivSpec:
    values = {
        "bootstrap": bootstrap,
        "partitions": 3,
        "catalog_uri": "sqlite:///catalog.db",
        "warehouse": f"s3://{s3.bucket}/warehouse",
        "topic": topic,
        "max_records": MAX_RECORDS,
        "fields": ORDER_FIELDS,
    }
    path = tmp_path / "krishiv.toml"
    path.write_text(SPEC_TEMPLATE.format(**values) + MORE_KINDS.format(**values) + s3.iceberg_properties())
    assert os.environ[s3.secret_env] not in path.read_text()
    return load_spec(path, env={s3.secret_env: os.environ[s3.secret_env]})


def _produce(spec: KrishivSpec) -> None:
    topic = spec.pipelines[0].topic
    partitions = ensure_topic(spec.kafka.bootstrap_servers, topic, spec.kafka.partitions)
    produce(
        spec.kafka.bootstrap_servers,
        topic,
        demo_orders(RECORDS, seed=11, partitions=partitions, late=5, malformed=9),
    )


def _check_task_written_kinds(spec: KrishivSpec) -> None:
    """The events and upsert tables against the per-kind oracle (as ``tests/spark_jobs/test_kinds.py``)."""
    _windowed, raw, upsert = spec.pipelines
    topic = raw.topic
    ends = {int(p): o for p, o in latest_offsets(spec.kafka.bootstrap_servers, topic, {}).items()}
    keys: dict = {}
    records = read_topic(spec.kafka.bootstrap_servers, topic, spec.kafka.partitions, ends, keys)
    catalog = load_catalog(spec)

    rows = catalog.load_table(qualified(spec, raw.table)).scan().to_arrow()
    seen = list(zip(rows.column("_kafka_partition").to_pylist(), rows.column("_kafka_offset").to_pylist(), strict=True))
    assert len(seen) == len(set(seen)), "an event was written twice"
    assert set(seen) == expected_events(records, raw).rows[raw.table]

    batches = open_ledger(spec).entries(table=qualified(spec, upsert.rejects_table))
    want = expected_upsert(records, keys, batches, topic)
    rows = catalog.load_table(qualified(spec, upsert.table)).scan().to_arrow().to_pylist()
    got = {
        r["customer_id"]: (r["order_id"], Decimal(r["amount"]), int(r["event_time"].timestamp() * 1000)) for r in rows
    }
    assert len(got) == len(rows), "a key is there twice"
    assert got == {k: (w.order_id, w.amount, w.event_time) for k, w in want.items()}


def _table_files(spec: KrishivSpec) -> set[str]:
    """Every file the catalog's tables refer to: metadata, manifest lists, manifests and data files."""
    catalog = load_catalog(spec)
    paths: set[str] = set()
    for pipeline in spec.pipelines:
        for name in pipeline.all_tables:
            table = catalog.load_table(qualified(spec, name))
            paths.add(table.metadata_location)
            for snapshot in table.snapshots():
                paths.add(snapshot.manifest_list)
                for manifest in snapshot.manifests(table.io):
                    paths.add(manifest.manifest_path)
                    paths.update(e.data_file.file_path for e in manifest.fetch_manifest_entry(table.io))
    return paths


def test_warehouse_and_staged_files_on_s3_are_exactly_once(tmp_path, broker, spark, topic, s3):
    spec = _spec(tmp_path, broker.bootstrap, topic, s3)
    pipelines = list(spec.pipelines)
    _produce(spec)
    first = run_pipelines(spec, pipelines, once=True)
    assert all(len([b for b in r.stager.history if b.recorded]) >= 2 for r in first)

    ledger = open_ledger(spec)
    staged = {e.key: e for e in ledger.entries()}
    staging = f"s3://{s3.bucket}/warehouse/{spec.iceberg.namespace}/{STAGING_DIR}/"
    paths = {f.path for e in staged.values() for f in e.files}
    assert paths and all(p.startswith(staging) for p in paths)
    assert paths <= s3.objects().keys(), "every staged file is in the bucket"

    # One batch's task-written files go missing; every checkpoint is rewound two batches. The replay records
    # nothing new and writes the missing files again (same rows, same entry, same intended snapshot).
    raw = spec.pipelines[1]
    lost = max((e for e in staged.values() if e.table == qualified(spec, raw.table)), key=lambda e: e.batch_id)
    assert lost.files
    s3.client().delete_objects(
        Bucket=s3.bucket,
        Delete={"Objects": [{"Key": f.path.removeprefix(f"s3://{s3.bucket}/")} for f in lost.files]},
    )
    for p in pipelines:
        Checkpoint(spec.checkpoint_dir(p)).rewind(2)
    replay = run_pipelines(spec, pipelines, once=True)
    assert all(r.stager.history for r in replay) and not any(b.recorded for r in replay for b in r.stager.history)
    after = {e.key: e for e in ledger.entries()}
    assert after.keys() == staged.keys()
    assert all(after[k].intended_snapshot_id == e.intended_snapshot_id for k, e in staged.items())
    restaged = after[lost.key]
    assert {f.path for f in restaged.files}.isdisjoint(f.path for f in lost.files)
    assert sum(f.records for f in restaged.files) == sum(f.records for f in lost.files)

    # The relay's commit: each table equals its oracle, one snapshot per batch.
    expected = assert_exactly_once(spec)
    assert expected.rejects and sum(w["order_count"] for w in expected.windows.values()) > 0
    _check_task_written_kinds(spec)
    assert all(e.status == COMMITTED for e in ledger.entries())

    # Everything Iceberg and the stager wrote is in the bucket; nothing went to a local folder.
    objects = s3.objects()
    table_files = _table_files(spec)
    assert table_files <= objects.keys()
    for path in {f.path for e in ledger.entries() for f in e.data_files} - table_files:
        # a merge registers a staged file in place, or a copy beside it without the rows that lost to the table's
        stem = path.removesuffix(".parquet")
        assert any(t.startswith(f"{stem}-merge-") for t in table_files), path
    local = {p.relative_to(tmp_path).parts[0] for p in tmp_path.rglob("*") if p.is_file()}
    expected_local = ("krishiv.toml", "catalog.db", "ledger.duckdb", "checkpoints")  # with journals, if any
    assert not [name for name in local if not name.startswith(expected_local)], local

    # clean-staging lists the bucket through the table's FileIO and removes an unreferenced staged object only.
    orphan_key = f"warehouse/{spec.iceberg.namespace}/{STAGING_DIR}/{raw.table}/query=gone/batch=0/part-orphan.parquet"
    s3.client().put_object(Bucket=s3.bucket, Key=orphan_key, Body=b"left by a stager that died")
    orphan = f"s3://{s3.bucket}/{orphan_key}"
    dry = clean_staging(spec, raw, grace_s=0, dry_run=True, force=True)
    assert [c.removed for c in dry] == [[orphan], []] and orphan in s3.objects()
    cleaned = [c for p in pipelines for c in clean_staging(spec, p, grace_s=0, force=True)]
    assert [path for c in cleaned for path in c.removed] == [orphan]
    # (pyarrow's S3 filesystem leaves an empty "folder/" marker where it deleted a folder's last object)
    left = {k for k in s3.objects(f"warehouse/{spec.iceberg.namespace}/{STAGING_DIR}/") if not k.endswith("/")}
    referenced = {f.path for e in ledger.entries() for f in e.files} | {p for p in table_files if p.startswith(staging)}
    assert left == referenced


def test_task_targets_carry_the_endpoint_and_keys_but_never_show_them(tmp_path, s3):
    """What the Spark tasks rebuild their FileIO from: the spec's endpoint and the resolved key, out of any repr."""
    spec = _spec(tmp_path, "127.0.0.1:9", "orders", s3)
    raw = spec.pipelines[1]
    table = ensure_pipeline_tables(load_catalog(spec), spec, raw)[raw.table]
    assert table.location() == f"s3://{s3.bucket}/warehouse/{spec.iceberg.namespace}/{raw.table}"
    target = WriteTarget.of(raw.table, table, f"{staging_root(table)}/query=q/batch=0")
    secret = os.environ[s3.secret_env]
    assert target.io_properties["s3.endpoint"] == s3.endpoint
    assert target.io_properties["s3.secret-access-key"] == secret
    assert secret not in repr(target)


def test_a_table_at_the_root_of_a_bucket_has_nowhere_to_stage(tmp_path, s3):
    spec = _spec(tmp_path, "127.0.0.1:9", "orders", s3)
    s3.client().create_bucket(Bucket="krishiv-root-table")
    catalog = load_catalog(spec)
    catalog.create_namespace_if_not_exists("elsewhere")
    schema = Schema(NestedField(1, "id", LongType(), required=False))
    table = catalog.create_table(("elsewhere", "at_root"), schema, location="s3://krishiv-root-table")
    with pytest.raises(KrishivError, match=re.escape("elsewhere.at_root is at the root of s3://krishiv-root-table:")):
        staging_root(table)
