"""Helpers for the end-to-end tests: run the real pipeline and compare the tables with the oracle."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from chaos.checks import compare_with_oracle
from chaos.oracle import Expected
from krishiv.operations import commit_pipelines, open_ledger
from krishiv.produce import demo_orders, ensure_topic, produce
from krishiv_core.catalog import qualified
from krishiv_core.entries import COMMITTED
from krishiv_core.spec import KrishivSpec
from spark_jobs.errors import TopicMissing
from spark_jobs.kafka_source import latest_offsets

ROOT = Path(__file__).resolve().parents[2]


def produce_orders(
    spec: KrishivSpec, records: int, *, late: int = 0, malformed: int = 0, seed: int = 7, start_ms: int | None = None
) -> None:
    pipeline = spec.pipeline()
    partitions = ensure_topic(spec.kafka.bootstrap_servers, pipeline.topic, spec.kafka.partitions)
    extra = {"start_ms": start_ms} if start_ms is not None else {}
    produce(
        spec.kafka.bootstrap_servers,
        pipeline.topic,
        demo_orders(records, seed=seed, partitions=partitions, late=late, malformed=malformed, **extra),
    )


def krishiv_cli(
    spec_file: Path, *args: str, faults: str | None = None, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run the real ``krishiv`` command in its own process (so it can be killed); the environment is this one's
    without ``KRISHIV_*``, plus ``env``."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("KRISHIV_")}, **(env or {})}
    if faults:
        env["KRISHIV_FAULTS"] = faults
    return subprocess.run(
        [sys.executable, "-m", "krishiv.cli", "--spec", str(spec_file), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def verified_status(spec_file: Path) -> dict:
    """``krishiv verify`` (which must pass), then the first pipeline of ``krishiv status --json``."""
    verify = krishiv_cli(spec_file, "verify")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    status = krishiv_cli(spec_file, "status", "--json")
    assert status.returncode == 0, status.stdout + status.stderr
    return json.loads(status.stdout)["pipelines"][0]


def start_krishiv(spec_file: Path, *args: str, output: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start the real ``krishiv`` command in its own process, its stdout and stderr going to ``output``; the
    environment is this one's without ``KRISHIV_*``, plus ``env``."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("KRISHIV_")}
    with open(output, "w") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "krishiv.cli", "--spec", str(spec_file), *args],
            cwd=ROOT,
            env={**clean, **(env or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )


def all_committed(spec: KrishivSpec) -> bool:
    """Every table of the spec's first pipeline has committed its topic up to the latest offsets, nothing pending."""
    pipeline = spec.pipeline()
    tables = [qualified(spec, t) for t in pipeline.all_tables]
    ledger = open_ledger(spec)
    if not Path(ledger.path).exists():
        return False
    latest = latest_offsets(spec.kafka.bootstrap_servers, pipeline.topic)
    return all(ledger.end_offsets(t, pipeline.topic, status=COMMITTED) == latest for t in tables) and not (
        ledger.pending_batches(tables)
    )


def wait_for(condition: Callable[[], object], what: str, output: Path, timeout_s: float) -> None:
    """Wait until ``condition()`` holds, else fail with ``what`` and the end of the process's ``output``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {timeout_s:.0f}s; the process said:\n{output.read_text()[-3000:]}")
        time.sleep(0.2)


def assert_exactly_once(spec: KrishivSpec) -> Expected:
    """Commit what is pending; then the tables equal the oracle, lineage is linear, the ledger agrees."""
    commit_pipelines(spec, list(spec.pipelines))
    check = compare_with_oracle(spec)
    assert not check.violations, check.violations
    return check.expected


def decoded_frame(spark, rows: list[tuple], pipeline):
    """Kafka records ``(key, value, topic, partition, offset, timestamp)`` as the source hands them to Spark: each
    partition's records decoded into the pipeline's fields as the source's tasks decode them."""
    import pyarrow as pa

    from spark_jobs.kafka_source import ARROW_SCHEMA
    from spark_jobs.record_decoder import Decoding, RecordDecoder

    raw = pa.Table.from_pylist([dict(zip(ARROW_SCHEMA.names, r, strict=True)) for r in rows], schema=ARROW_SCHEMA)
    decoding = Decoding.of(pipeline)
    return spark.createDataFrame(RecordDecoder(decoding).from_kafka(raw), decoding.spark_schema())


def all_topics_committed(spec: KrishivSpec) -> bool:
    """Whether every record of every topic of the spec's first pipeline is committed (its rejects table, which
    every batch commits to, has reached each topic's end; a topic not there yet has none) and nothing is pending."""
    pipeline = spec.pipeline()
    ledger = open_ledger(spec)
    if not Path(ledger.path).exists():
        return False
    rejects = qualified(spec, pipeline.rejects_table)

    def latest(topic: str) -> dict[str, int]:
        try:
            return latest_offsets(spec.kafka.bootstrap_servers, topic)
        except TopicMissing:
            return {}

    return all(
        ledger.end_offsets(rejects, topic, status=COMMITTED) == latest(topic) for topic in pipeline.topics
    ) and not ledger.pending_batches([qualified(spec, t) for t in pipeline.all_tables])
