"""Metrics where operators look: a real pipeline's metrics scraped from the Prometheus endpoint over HTTP and
received over OTLP/HTTP by a real receiver, checked against the ledger, the broker's offsets and what was produced."""

from __future__ import annotations

import logging
import socket
import time
import urllib.request
from collections import Counter

import pytest
from prometheus_client.parser import text_string_to_metric_families

from krishiv.broker import free_port
from krishiv.metrics import Metrics, start_metrics
from krishiv.metrics.prometheus import MetricsEndpointError
from krishiv.metrics.settings import METRICS_HOST_ENV, METRICS_PORT_ENV, METRICS_REFRESH_ENV, metrics_settings
from krishiv.operations import commit_pipelines, open_ledger, run_pipelines
from krishiv.produce import OrderEvent, demo_orders, ensure_topic, produce
from krishiv.query_supervisor import RunClients
from krishiv_core.catalog import qualified
from krishiv_core.errors import ConfigError
from krishiv_core.spec import KrishivSpec

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _scrape(metrics: Metrics) -> tuple[str, Samples]:
    """Read the ledger and the broker now (not at the next refresh), then scrape the endpoint over HTTP."""
    metrics.refresh()
    assert metrics.address is not None
    url = f"http://127.0.0.1:{metrics.address[1]}/metrics"
    with urllib.request.urlopen(url, timeout=30) as response:
        text = response.read().decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return text, samples


def _produce(spec: KrishivSpec, records: int, *, late: int, malformed: int) -> list[OrderEvent]:
    """Orders one second apart ending now, so windows close within the run and freshness is minutes."""
    pipeline = spec.pipeline()
    partitions = ensure_topic(spec.kafka.bootstrap_servers, pipeline.topic, spec.kafka.partitions)
    start_ms = int(time.time() * 1000) - records * 1000
    events = demo_orders(
        records, partitions=partitions, late=late, malformed=malformed, start_ms=start_ms, spacing_ms=1000
    )
    produce(spec.kafka.bootstrap_servers, pipeline.topic, events)
    return events


def test_a_running_pipeline_s_metrics_reach_prometheus_and_otlp(
    make_spec, spark, postgres_uri, otlp_receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    password = "hunter2-metrics-secret"
    spec = make_spec(catalog_uri=postgres_uri.replace("postgres@", f"postgres:{password}@", 1), max_records=150)
    pipeline = spec.pipeline()
    events = _produce(spec, 300, late=6, malformed=5)
    high_watermarks = Counter(str(e.partition) for e in events)  # no transactions: one offset per record
    newest_event_s = max(e.event_time_ms for e in events if e.kind == "valid") / 1000
    table, rejects_table = qualified(spec, pipeline.table), qualified(spec, pipeline.rejects_table)

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp_receiver.endpoint)
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "500")
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    monkeypatch.delenv(METRICS_HOST_ENV, raising=False)
    monkeypatch.setenv(METRICS_REFRESH_ENV, "0.5")  # the periodic export sees the ledger change soon
    otlp_receiver.clear()
    ledger = open_ledger(spec)
    P = (("pipeline", pipeline.name),)
    T, R = (*P, ("table", table)), (*P, ("table", rejects_table))

    def part(p: str) -> tuple[tuple[str, str], ...]:
        return (("partition", p), *P, ("topic", pipeline.topic))

    during: list[tuple[int, Samples]] = []  # (records the batch read, the scrape right after it was recorded)
    texts: list[str] = []
    with start_metrics(spec, ledger, pipelines=[pipeline], port=0) as metrics:
        assert metrics.address is not None and metrics.address[0] == "127.0.0.1"  # loopback unless told

        def scraping(_name: str):
            def report(batch) -> None:
                text, samples = _scrape(metrics)
                texts.append(text)
                during.append((batch.records_read, samples))

            return report

        run_pipelines(
            spec,
            [pipeline],
            once=True,
            clients=RunClients(ledger=ledger, spark=spark),
            reporter=metrics.chain(scraping),
        )
        text, staged = _scrape(metrics)
        texts.append(text)
        summary = ledger.table_summary(table, pipeline=pipeline.name, topic=pipeline.topic)
        batches = summary.pending
        assert batches >= 2 and summary.late_events > 0 and summary.rejects == 5

        # While the query ran: after batch 0 was recorded, one batch counted, one entry pending, and the lag is what
        # batch 0 left unread.
        first_read, first = during[0]
        assert first[("krishiv_batches_staged_total", P)] == 1
        assert first[("krishiv_entries_pending", T)] == 1
        assert sum(first[("krishiv_consumer_lag", part(p))] for p in high_watermarks) == 300 - first_read

        # Staged, not committed: the counters equal the ledger's sums; everything read, nothing committed.
        assert staged[("krishiv_batches_staged_total", P)] == batches
        assert staged[("krishiv_records_read_total", P)] == summary.records_read == 300
        assert staged[("krishiv_rejects_total", P)] == 5
        assert staged[("krishiv_late_events_total", P)] == summary.late_events
        assert staged[("krishiv_entries_pending", T)] == batches
        assert staged[("krishiv_entries_pending", R)] == batches
        for p, hw in high_watermarks.items():
            assert staged[("krishiv_consumer_lag", part(p))] == hw - summary.staged_offsets[p] == 0
            assert staged[("krishiv_commit_lag", part(p))] == hw
        assert ("krishiv_freshness_seconds", T) not in staged

        # The periodic OTLP export carries the same values while the process runs.
        otlp_receiver.wait_for(
            lambda pts: (
                pts.get(("krishiv_entries_pending", T)) == batches and pts.get(("krishiv_batches_staged", P)) == batches
            ),
            timeout_s=30,
        )

        reports = commit_pipelines(spec, [pipeline], ledger=ledger)
        metrics.record_commits(reports)
        latencies = sum(len(r.commit_latencies_ms) for r in reports)
        snapshots = sum(len(r.committed) for r in reports if r.table == table)
        text, done = _scrape(metrics)
        texts.append(text)
        scraped_at = time.time()

    assert latencies > 0 and snapshots > 0
    assert done[("krishiv_entries_pending", T)] == 0
    assert done[("krishiv_entries_committed", T)] == ledger.table_summary(table).committed == batches
    assert done[("krishiv_batches_committed_total", T)] == snapshots
    assert sum(v for (name, _), v in done.items() if name == "krishiv_commit_latency_seconds_count") == latencies
    for p in high_watermarks:
        assert done[("krishiv_commit_lag", part(p))] == 0
    # The newest committed event: the last batch moved the watermark to its newest event time less the delay.
    assert abs(done[("krishiv_freshness_seconds", T)] - (scraped_at - newest_event_s)) < 5
    assert ("krishiv_freshness_seconds", R) not in done  # a rejects table has no event time

    # The final export on exit shows the ledger as the process left it.
    points = otlp_receiver.latest_points()
    assert points[("krishiv_entries_pending", T)] == 0
    assert points[("krishiv_entries_committed", T)] == batches
    assert points[("krishiv_batches_staged", P)] == batches
    assert points[("krishiv_rejects", P)] == 5
    assert points[("krishiv_late_events", P)] == summary.late_events
    assert points[("krishiv_commit_latency_seconds", T)] == snapshots
    assert all(points[("krishiv_consumer_lag", part(p))] == 0 for p in high_watermarks)
    assert 0 < points[("krishiv_freshness_seconds", T)] < 3600
    assert otlp_receiver.service_names() == {"krishiv"}

    # No secret anywhere: not in a label, a value or the resource.
    assert all(password not in t for t in texts)
    assert all(password.encode() not in r.SerializeToString() for r in otlp_receiver.requests)


def _small_spec() -> KrishivSpec:
    """A spec whose broker address refuses connections at once (nothing listens on port 1)."""
    from krishiv_core.spec import parse_spec

    pipeline = {
        "name": "p",
        "topic": "t",
        "event_time_field": "ts",
        "fields": {"ts": "timestamp_ms"},
        "aggregations": [{"name": "n", "function": "count"}],
    }
    return parse_spec({"kafka": {"bootstrap_servers": "127.0.0.1:1"}, "pipelines": [pipeline]}, env={})


def test_a_collector_that_does_not_answer_is_one_line_and_does_not_hold_the_exit(
    tmp_path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from krishiv.metrics.otlp import EXPORTER_LOGGER
    from outbox.ledger import Ledger

    endpoint = f"http://127.0.0.1:{free_port()}"  # closed again: nothing listens there
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "200")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "2")
    caplog.set_level(logging.INFO)
    metrics = start_metrics(_small_spec(), Ledger(tmp_path / "ledger.duckdb"))
    deadline = time.monotonic() + 30
    while not metrics.otlp_failing:
        assert time.monotonic() < deadline, "no export failed in 30 s"
        time.sleep(0.05)
    started = time.monotonic()
    metrics.close()
    assert time.monotonic() - started < 2  # the final export to a collector known to be down is not waited for
    lines = [r.getMessage() for r in caplog.records if r.name.startswith(("krishiv.metrics", "opentelemetry"))]
    assert [line for line in lines if "OTLP" in line] == [
        f"metrics: the OTLP endpoint {endpoint}/v1/metrics did not take the metrics (unreachable, or it refused "
        "them); retrying at each export interval"
    ]
    assert not [r for r in caplog.records if r.name == EXPORTER_LOGGER]


def test_the_endpoint_says_when_its_port_is_taken(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    from outbox.ledger import Ledger

    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", METRICS_HOST_ENV):
        monkeypatch.delenv(name, raising=False)
    spec = _small_spec()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(MetricsEndpointError) as error:
            start_metrics(spec, Ledger(tmp_path / "ledger.duckdb"), port=port)
    assert str(error.value).splitlines() == [
        f"metrics endpoint 127.0.0.1:{port} cannot listen: the port is in use; choose another with --metrics-port "
        "or KRISHIV_METRICS_PORT (KRISHIV_METRICS_HOST for the address)"
    ]


def test_settings_come_from_the_environment() -> None:
    assert metrics_settings(env={}).enabled is False
    s = metrics_settings(env={METRICS_PORT_ENV: "9464", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert (s.port, s.host, s.otlp) == (9464, "127.0.0.1", True)
    assert metrics_settings(8000, env={METRICS_PORT_ENV: "9464", METRICS_HOST_ENV: "0.0.0.0"}).port == 8000
    disabled = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"}
    assert metrics_settings(env=disabled).otlp is False
    with pytest.raises(ConfigError, match=r"^KRISHIV_METRICS_PORT: expected a port number \(0-65535\), got 'abc'$"):
        metrics_settings(env={METRICS_PORT_ENV: "abc"})
    with pytest.raises(ConfigError, match=r"^KRISHIV_METRICS_REFRESH_S: expected a number of seconds"):
        metrics_settings(env={METRICS_REFRESH_ENV: "soon"})


EVENTS_PIPELINE = """
[[pipelines]]
name = "orders_raw"
kind = "events"
topic = "{topic}"
table = "orders_raw"
event_time_field = "event_time"
"""


def test_an_events_table_s_freshness_comes_from_its_newest_committed_files(
    tmp_path, broker, topic, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Freshness of a table whose rows are events: the newest event time in the staged files of its newest committed
    batch with rows (their Parquet footers, read through the FileIO); a pending batch does not count."""
    from datetime import UTC, datetime, timedelta

    import pyarrow as pa
    from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC

    from chaos.workspace import ORDER_FIELDS, SETTINGS_TEMPLATE
    from krishiv_core.entries import OutboxEntry, new_snapshot_id
    from krishiv_core.parquet_files import load_io, write_staged_files
    from krishiv_core.spec import load_spec
    from krishiv_core.tables import output_tables

    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", METRICS_HOST_ENV):
        monkeypatch.delenv(name, raising=False)
    settings = SETTINGS_TEMPLATE.format(
        bootstrap=broker.bootstrap, partitions=2, catalog_uri="sqlite:///catalog.db", warehouse="warehouse"
    )
    (tmp_path / "krishiv.toml").write_text(settings + EVENTS_PIPELINE.format(topic=topic) + ORDER_FIELDS)
    spec = load_spec(tmp_path / "krishiv.toml", env={})
    pipeline = spec.pipeline()
    ensure_topic(broker.bootstrap, topic, 2)
    rows_table = output_tables(pipeline)[0]
    io = load_io({}, spec.warehouse_uri())
    now = datetime.now(UTC).replace(microsecond=0)

    def staged(batch: int, newest: datetime) -> tuple:
        rows = pa.table(
            {
                "order_id": [f"o-{batch}-1", f"o-{batch}-2"],
                "customer_id": ["c-001", "c-002"],
                "amount": pa.array([1, 2], pa.decimal128(12, 2)),
                "event_time": pa.array([newest - timedelta(minutes=5), newest], pa.timestamp("us", tz="UTC")),
            }
        )
        folder = f"{spec.warehouse_uri()}/_krishiv_staging/orders_raw/batch={batch}"
        return write_staged_files(io, rows_table.schema, UNPARTITIONED_PARTITION_SPEC, rows, folder)

    table, rejects = qualified(spec, "orders_raw"), qualified(spec, pipeline.rejects_table)
    ledger = open_ledger(spec)

    def record(batch: int, newest: datetime) -> list[OutboxEntry]:
        offsets = {topic: {"0": [2 * batch, 2 * batch + 2], "1": [0, 0]}}
        entries = [
            OutboxEntry("q1", pipeline.name, table, batch, offsets, staged(batch, newest), new_snapshot_id()),
            OutboxEntry("q1", pipeline.name, rejects, batch, offsets, (), new_snapshot_id()),
        ]
        ledger.record_batch(entries)
        return entries

    for e in record(0, now - timedelta(minutes=3)):
        ledger.mark_committed(e, e.intended_snapshot_id if e.files else None)
    record(1, now - timedelta(seconds=10))  # pending: not in the table yet

    with start_metrics(spec, ledger, port=0) as metrics:
        _, samples = _scrape(metrics)
        scraped = datetime.now(UTC)
    labels = (("pipeline", pipeline.name), ("table", table))
    assert abs(samples[("krishiv_freshness_seconds", labels)] - (scraped - now).total_seconds() - 180) < 5
    assert samples[("krishiv_entries_pending", labels)] == 1
    assert ("krishiv_freshness_seconds", (("pipeline", pipeline.name), ("table", rejects))) not in samples


def test_the_cli_exports_a_commit_s_metrics_and_refuses_a_taken_port(
    spec_file, otlp_receiver, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``krishiv commit`` through the CLI: its final OTLP export arrives, and ``--metrics-port`` on a taken port is
    one line and exit 2 before anything is committed."""
    from krishiv.cli import main
    from krishiv_core.spec import load_spec
    from outbox.ledger import Ledger

    spec = load_spec(spec_file)
    Ledger(spec.resolve(spec.storage.ledger_path)).migrate()  # an empty ledger: nothing pending
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp_receiver.endpoint)
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    otlp_receiver.clear()
    assert main(["--spec", str(spec_file), "commit"]) == 0
    table = (("pipeline", spec.pipeline().name), ("table", qualified(spec, spec.pipeline().table)))
    points = otlp_receiver.wait_for(lambda pts: ("krishiv_entries_pending", table) in pts, timeout_s=15)
    assert points[("krishiv_entries_pending", table)] == 0

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        capsys.readouterr()
        assert main(["--spec", str(spec_file), "commit", "--metrics-port", str(port)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1
    assert err.startswith(f"krishiv commit: metrics endpoint 127.0.0.1:{port} cannot listen: the port is in use")
