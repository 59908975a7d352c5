"""The ``krishiv`` command's inspection subcommands on a real pipeline run, and its error reporting."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pytest

from benchmarks.__main__ import main as bench_main
from krishiv.cli import main
from krishiv.operations import run_pipelines
from krishiv_core.catalog import load_catalog, qualified
from krishiv_core.runbook import runbook
from krishiv_core.spec import load_spec
from spark_jobs.kafka_source import latest_offsets
from tests.spark_jobs.pipeline_helpers import produce_orders


def test_status_lineage_and_verify_catch_a_duplicate_window(make_spec, spec_file, broker, spark, capsys, monkeypatch):
    spec = make_spec(max_records=1_000)
    produce_orders(spec, 3_000, late=5, malformed=4)
    run_pipelines(spec, list(spec.pipelines), once=True)

    assert main(["--spec", str(spec_file), "status"]) == 0
    out = capsys.readouterr().out
    assert "pending" in out and "4 rejected" in out
    assert "commits: each batch goes into all of its tables at once" in out
    assert "late events by batch, kept in orders_per_minute_rejects (reason late: …): batch " in out

    assert main(["--spec", str(spec_file), "status", "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert (status["version"], status["command"], status["broker_error"]) == (1, "status", None)
    assert status["batch_commits"] == "atomic", "a SQLite catalog"
    [pipeline] = status["pipelines"]
    assert pipeline["events"]["rejected"] == 4 and pipeline["events"]["late"] == 5
    assert sum(b["late_events"] for b in pipeline["late_batches"]) == 5  # the batches are few: all recent
    assert sum(t["pending"] for t in pipeline["tables"]) > 0
    latest = latest_offsets(spec.kafka.bootstrap_servers, spec.pipeline().topic)
    assert {str(p["partition"]): p["latest"] for p in pipeline["partitions"]} == latest
    assert all(p["lag"] == p["latest"] for p in pipeline["partitions"]), "nothing committed yet"
    assert pipeline["warnings"] == []
    monkeypatch.setenv("KRISHIV_STATUS_PENDING_S", "0.001")  # every pending entry is old now
    assert main(["--spec", str(spec_file), "status"]) == 0
    warning = capsys.readouterr().err
    assert "warning: orders_per_minute: " in warning and "pending entries, the oldest staged" in warning
    monkeypatch.delenv("KRISHIV_STATUS_PENDING_S")

    assert main(["--spec", str(spec_file), "commit"]) == 0
    assert main(["--spec", str(spec_file), "lineage"]) == 0
    assert main(["--spec", str(spec_file), "verify"]) == 0
    assert "VIOLATIONS" not in capsys.readouterr().out
    assert main(["--spec", str(spec_file), "cut", "--json"]) == 0
    [cut] = json.loads(capsys.readouterr().out)["pipelines"]
    for t in cut["tables"]:  # every batch is committed: each table's cut is its current snapshot, if it has rows
        current = load_catalog(spec).load_table(t["table"]).current_snapshot()
        assert t["snapshot_id"] == (current.snapshot_id if current else None), t
    assert main(["--spec", str(spec_file), "cut", "--batch", str(cut["batch_id"] + 1)]) == 1
    assert "is not committed to every table yet" in capsys.readouterr().err
    assert main(["--spec", str(spec_file), "status", "-v", "--json"]) == 0  # -v after the command too
    status = json.loads(capsys.readouterr().out)
    assert all(p["lag"] == 0 for p in status["pipelines"][0]["partitions"])
    assert all(t["pending"] == 0 and t["last_commit_at"] for t in status["pipelines"][0]["tables"])
    assert main(["--spec", str(spec_file), "lineage", "--json"]) == 0
    lineage = json.loads(capsys.readouterr().out)
    snapshots = lineage["tables"][0]["snapshots"]
    assert [s["batch_id"] for s in snapshots] == sorted(s["batch_id"] for s in snapshots)
    assert [s["parent_id"] for s in snapshots[1:]] == [s["snapshot_id"] for s in snapshots[:-1]]

    # A second writer appends a window that is already there: verify must say which one and fail.
    table = load_catalog(spec).load_table(qualified(spec, spec.pipeline().table))
    first = table.scan().to_arrow().slice(0, 1)
    table.append(first.cast(pa.schema([f.with_nullable(f.nullable) for f in first.schema])))
    assert main(["--spec", str(spec_file), "verify"]) == 1
    out = capsys.readouterr().out
    assert "VIOLATIONS" in out and "appears more than once" in out
    assert str(first.column("window_start")[0].as_py().date()) in out
    assert main(["--spec", str(spec_file), "verify", "--json"]) == 1
    verdict = json.loads(capsys.readouterr().out)
    assert verdict["ok"] is False and verdict["tables"][0]["ok"] is False
    assert "appears more than once" in verdict["tables"][0]["violations"][0]
    assert verdict["tables"][1] == {**verdict["tables"][1], "ok": True, "violations": []}


def test_output_to_a_reader_that_has_gone_is_dropped_quietly() -> None:
    """``krishiv verify | head -1``: once the pipe's reader has gone, writes are dropped and the command goes on
    to its own exit status (no BrokenPipeError, no traceback)."""
    from krishiv.cli import _PipeSafe

    read, write = os.pipe()
    os.close(read)
    with os.fdopen(write, "w") as stream:
        safe = _PipeSafe(stream)
        assert safe.write("x" * 100_000) == 100_000
        safe.write("more")
        safe.flush()
        assert safe.gone


FAN_OUT_SPEC = """
[kafka]
bootstrap_servers = "{bootstrap}"
partitions = 2

[iceberg]
catalog_uri = "sqlite:///catalog.db"
warehouse = "warehouse"

[storage]
ledger_path = "ledger.duckdb"
checkpoint_location = "checkpoints"

[spark]
master = "local[2]"
shuffle_partitions = 2

[[pipelines]]
name = "orders_routed"
kind = "events"
topic = "{topic}"
route_by = "customer_id"
routes = {{ "c-001" = "orders_c001", "c-002" = "orders_c002" }}
unrouted = "orders_other"
kafka_metadata = ["partition", "offset"]
max_records_per_batch = 400

[pipelines.fields]
order_id = "string"
customer_id = "string"
amount = "decimal(12,2)"
event_time = "timestamp_ms"
"""


def test_status_lineage_and_verify_show_every_route_of_a_fan_out(tmp_path, broker, spark, topic, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")  # every table fits an 80-column terminal; --wide shows it all
    spec_file = tmp_path / "krishiv.toml"
    spec_file.write_text(FAN_OUT_SPEC.format(bootstrap=broker.bootstrap, topic=topic))
    spec = load_spec(spec_file, env={})
    produce_orders(spec, 1_000, malformed=7)
    run_pipelines(spec, list(spec.pipelines), once=True)
    names = ("orders_c001", "orders_c002", "orders_other", "orders_routed_rejects")  # in the spec's namespace
    tables = [qualified(spec, t) for t in names]

    assert main(["--spec", str(spec_file), "status"]) == 0
    out = capsys.readouterr().out
    assert f"orders_routed (events) reads {topic} into 4 tables" in out
    assert "events: 1000 read, 7 rejected, 0 late" in out  # the counts of the first route's entries
    for name in names:
        assert f"  {name}: 3 pending, 0 committed, 0 rows appended\n    no commit yet\n" in out
    assert max(len(line) for line in out.splitlines()) <= 80

    assert main(["--spec", str(spec_file), "commit"]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80
    for name in names:  # whole, not cut to "krishiv.orders_rout…"
        assert f"\n{name} " in out
    assert main(["--spec", str(spec_file), "status"]) == 0
    out = capsys.readouterr().out
    for name in names:
        assert f"  {name}: 0 pending, 3 committed, " in out
    assert f"  {names[3]}: 0 pending, 3 committed, 7 rows appended\n    last commit " in out
    assert max(len(line) for line in out.splitlines()) <= 80
    assert main(["--spec", str(spec_file), "status", "--wide"]) == 0
    newest = load_catalog(spec).load_table(tables[3]).current_snapshot().snapshot_id
    assert f"  {tables[3]}: 0 pending, 3 committed, " in capsys.readouterr().out.replace(f"{newest}", "")

    assert main(["--spec", str(spec_file), "lineage"]) == 0
    out = capsys.readouterr().out
    assert all(f"lineage of {name} (newest last)" in out for name in names)
    assert max(len(line) for line in out.splitlines()) <= 80
    assert f"{str(newest)[:7]}…" in out and str(newest) not in out
    assert out.count(" offsets, 2 parts") >= 4  # a batch's Kafka ranges, summed up
    assert main(["--spec", str(spec_file), "lineage", "--wide"]) == 0
    out = capsys.readouterr().out
    assert all(f"lineage of {table} (newest last)" in out for table in tables)
    assert str(newest) in out

    assert main(["--spec", str(spec_file), "verify"]) == 0
    out = capsys.readouterr().out
    assert all(f"{table}: ok (" in out for table in tables)
    assert out.count("  unique by _kafka_partition, _kafka_offset") == 3 and "  no per-row key" in out

    # What docs/quickstart.md shows for reading a table: pyiceberg's CLI and Python API, with the catalog named krishiv.
    from click.testing import CliRunner
    from pyiceberg.catalog import load_catalog as pyiceberg_catalog
    from pyiceberg.cli.console import run as pyiceberg_cli

    uri = f"sqlite:///{tmp_path / 'catalog.db'}"
    listed = CliRunner().invoke(pyiceberg_cli, ["--catalog", "krishiv", "--uri", uri, "list", "krishiv"])
    assert listed.exit_code == 0 and set(listed.output.split()) == set(tables)
    other = pyiceberg_catalog("krishiv", uri=uri).load_table("krishiv.orders_other")
    rows = other.scan().to_duckdb("orders_other").sql("SELECT count(*) FROM orders_other").fetchall()[0][0]
    assert rows == other.scan().to_arrow().num_rows > 0

    # An event of the default table copied into a route by a second writer: both tables name its offset.
    event = load_catalog(spec).load_table(tables[2]).scan().to_arrow().slice(0, 1)
    load_catalog(spec).load_table(tables[0]).append(event.cast(pa.schema(list(event.schema))))
    assert main(["--spec", str(spec_file), "verify"]) == 1
    out = capsys.readouterr().out
    at = f"Kafka partition {event['_kafka_partition'][0]} offset {event['_kafka_offset'][0]}"
    line = f"  - {at} is in more than one table: {tables[0]} (1 row), {tables[2]} (1 row)"
    assert out.count(line) == 2 and out.count("VIOLATIONS") == 2


def test_bad_config_is_reported_with_the_field(tmp_path: Path, capsys) -> None:
    spec = tmp_path / "krishiv.toml"
    spec.write_text(
        '[[pipelines]]\nname = "p"\ntopic = "t"\nevent_time_field = "t"\nwatermark_delay = "5 parsecs"\n'
        '[pipelines.fields]\nt = "timestamp_ms"\n[[pipelines.aggregations]]\nname = "n"\nfunction = "count"\n'
    )
    assert main(["--spec", str(spec), "status"]) == 2
    assert "pipelines[0].watermark_delay" in capsys.readouterr().err


@pytest.mark.usefixtures("one_line_errors")
@pytest.mark.parametrize(
    ("setting", "location", "said"),
    [
        ("KRISHIV_LEDGER_PATH", "postgresql://k:pw-s3cret@127.0.0.1/test?sslmod=require", "unknown parameter 'sslmod'"),
        ("KRISHIV_LEDGER_PATH", "postgresql://k:pw-s3cret@[oops/test", "does not parse"),
        ("KRISHIV_LEDGER_PATH", "postgresql://k:pw-s3cret@127.0.0.1:54x/test", "port '54x' is not a number"),
        (
            "KRISHIV_ICEBERG_CATALOG_URI",
            "postgresql://k:pw-s3cret@127.0.0.1/test?sslmod=1",
            "unknown parameter 'sslmod'",
        ),
        ("KRISHIV_ICEBERG_CATALOG_URI", "postgresql://k:pw-s3cret@[oops/test", "host '[oops' is not a host name"),
        ("KRISHIV_ICEBERG_CATALOG_URI", "postgresql://k:pw-s3cret@127.0.0.1:54x/test", "port '54x' is not a number"),
        ("--to", "postgresql://k:pw-s3cret@127.0.0.1:54x/test", "port '54x' is not a number"),
    ],
)
def test_a_location_that_cannot_be_right_is_one_line_with_no_retry(
    tmp_path: Path, capsys, monkeypatch, setting: str, location: str, said: str
) -> None:
    """The issue's typos, with the ledger or the catalog on PostgreSQL: one line naming the part that is wrong and
    the way out, exit 2; not a driver's traceback, nor a server that "did not answer" after the retry budget."""
    spec = _spec_file(tmp_path)
    monkeypatch.setenv("KRISHIV_LEDGER_LOCK_TIMEOUT_S", "2")  # were it retried, the line would say so soon
    if setting == "--to":
        from outbox.ledger import Ledger

        Ledger(load_spec(str(spec)).ledger_location()).migrate()  # a ledger to copy
        commands = [["ledger-copy", "--to", location]]
    else:
        monkeypatch.setenv(setting, location)
        commands = [["status"], ["commit"], ["run", "--once"]]
    for command in commands:
        assert main(["--spec", str(spec), *command]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1, err
        assert said in err and "did not answer" not in err and "pw-s3cret" not in err
        assert err.strip().endswith("Recovery runbook > A location that cannot be right)")


# ------------------------------------------------------------------ destructive commands and their folders

MINIMAL_SPEC = (
    '[[pipelines]]\nname = "p"\ntopic = "t"\nevent_time_field = "t"\n'
    '[pipelines.fields]\nt = "timestamp_ms"\n[[pipelines.aggregations]]\nname = "n"\nfunction = "count"\n'
)


@pytest.fixture
def one_line_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    """Wide enough that rich prints each error on the one line it is."""
    monkeypatch.setenv("COLUMNS", "1000")


def _spec_file(tmp_path: Path) -> Path:
    spec = tmp_path / "krishiv.toml"
    spec.write_text(MINIMAL_SPEC)
    return spec


def _user_folder(folder: Path) -> dict[str, str]:
    """A folder that holds someone's work (a ledger, a warehouse file), and what it holds."""
    (folder / "warehouse" / "orders").mkdir(parents=True)
    (folder / "ledger.duckdb").write_text("the real ledger")
    (folder / "warehouse" / "orders" / "part-0.parquet").write_text("data")
    return _contents(folder)


def _main(command: str, args: list[str]) -> int:
    """``krishiv demo …`` or ``python -m benchmarks …`` (the benchmark is not part of the ``krishiv`` command)."""
    return main([*args[:2], command, *args[2:]]) if command == "demo" else bench_main(args)


def _maker(command: str) -> str:
    return "krishiv demo" if command == "demo" else "make bench"


def _prefix(command: str) -> str:
    return "krishiv demo" if command == "demo" else "bench"


def _contents(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): p.read_text() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.usefixtures("one_line_errors")
@pytest.mark.parametrize(("command", "option"), [("demo", "--state"), ("bench", "--out")])
def test_a_folder_the_command_did_not_make_is_refused_and_kept(tmp_path, capsys, command, option):
    """``--state state`` (the real ledger and warehouse) is refused before any broker or Spark starts."""
    spec = _spec_file(tmp_path)
    state = tmp_path / "state"
    target = state if command == "demo" else state / "work"  # bench empties OUT/work
    target.mkdir(parents=True)
    before = _user_folder(target)

    assert _main(command, ["--spec", str(spec), option, str(state)]) == 2
    err = capsys.readouterr().err
    what = "the folder" if command == "demo" else f"its work folder {target}"
    assert err == (
        f"{_prefix(command)}: {option} {state}: {what} exists and was not made by {_maker(command)} "
        f"(no .krishiv-{command}-state in it); name a new or empty folder "
        "(see docs/operations.md: Recovery runbook > Files a command will not delete)\n"
    )
    assert _contents(target) == before


@pytest.mark.usefixtures("one_line_errors")
@pytest.mark.parametrize(("command", "option"), [("demo", "--state"), ("bench", "--out")])
def test_a_file_or_a_link_where_the_folder_should_be_is_refused(tmp_path, capsys, command, option):
    spec = _spec_file(tmp_path)
    afile = tmp_path / "notes.txt"
    afile.write_text("keep me")
    assert _main(command, ["--spec", str(spec), option, str(afile)]) == 2
    assert (
        "is a file, not a folder; name a new or empty folder " + runbook("Files a command will not delete") + "\n"
    ) in capsys.readouterr().err
    assert afile.read_text() == "keep me"

    real = tmp_path / "real"
    before = _user_folder(real if command == "demo" else real / "work")
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    assert _main(command, ["--spec", str(spec), option, str(link)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{_prefix(command)}: {option} {link}: ")
    # demo's folder is the link itself; bench's is LINK/work, a real folder reached through the link.
    expected = "the folder is a symbolic link" if command == "demo" else "was not made by make bench"
    assert expected in err
    assert _contents(real if command == "demo" else real / "work") == before


def test_only_a_marked_or_empty_folder_is_emptied(tmp_path):
    from krishiv.state_folder import DEMO_MARKER, FolderNotOurs, check_folder, reset_folder

    def reset(folder: Path) -> None:
        reset_folder(folder, DEMO_MARKER, command="krishiv demo", label=f"--state {folder}")

    new = tmp_path / "new" / "demo"
    reset(new)
    assert [p.name for p in new.iterdir()] == [DEMO_MARKER]

    # What an earlier demo left (including a link to a folder outside it) is emptied; the link's target is not.
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("outside")
    (new / "warehouse").mkdir()
    (new / "warehouse" / "f.parquet").write_text("x")
    (new / "ledger.duckdb").write_text("x")
    (new / "linked").symlink_to(outside, target_is_directory=True)
    reset(new)
    assert [p.name for p in new.iterdir()] == [DEMO_MARKER]
    assert (outside / "keep.txt").read_text() == "outside"

    empty = tmp_path / "empty"
    empty.mkdir()
    reset(empty)
    assert [p.name for p in empty.iterdir()] == [DEMO_MARKER]

    # A marker that is itself a link or a folder does not count.
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "data").write_text("x")
    (fake / DEMO_MARKER).symlink_to(new / DEMO_MARKER)
    with pytest.raises(FolderNotOurs, match="was not made by krishiv demo"):
        check_folder(fake, DEMO_MARKER, command="krishiv demo", label="--state fake")
    assert (fake / "data").exists()
