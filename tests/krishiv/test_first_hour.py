"""A new user's first hour: every mistake is one line naming the input and what was expected, a non-zero exit where
it failed; help for every option; Ctrl-C and SIGTERM stop cleanly; the broker frees its port."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
from importlib.metadata import version
from pathlib import Path

import pytest

from krishiv.broker import PortTaken, default_port, ensure_port_free, free_port
from krishiv.cli import build_parser, main
from krishiv_core.spec import ENV_OVERRIDES, SPEC_FILE_ENV
from outbox.ledger import Ledger
from tests.spark_jobs.pipeline_helpers import produce_orders

REPO = Path(__file__).resolve().parents[2]
KRISHIV = [sys.executable, "-m", "krishiv.cli"]

SPEC = """
[kafka]
bootstrap_servers = "{bootstrap}"

[[pipelines]]
name = "orders"
topic = "orders"
event_time_field = "t"

[pipelines.fields]
t = "timestamp_ms"

[[pipelines.aggregations]]
name = "n"
function = "count"
"""


@pytest.fixture(autouse=True)
def narrow_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """An 80-column terminal; a message longer than that must still be one line."""
    monkeypatch.setenv("COLUMNS", "80")
    for var in (*ENV_OVERRIDES, SPEC_FILE_ENV):
        monkeypatch.delenv(var, raising=False)


def _spec(folder: Path, bootstrap: str = "127.0.0.1:1") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    spec = folder / "krishiv.toml"
    spec.write_text(SPEC.format(bootstrap=bootstrap))
    return spec


def _one_line(err: str) -> str:
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert "Traceback" not in err
    return err[:-1]


# ------------------------------------------------------------------------------------------ help and version


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_every_option_of_every_command_has_help_with_its_default(capsys) -> None:
    parser = build_parser()
    commands = _subcommands(parser)
    assert {"broker", "produce", "run", "commit", "status", "lineage", "verify", "demo"} <= commands.keys()
    for name, command in {"krishiv": parser, **commands}.items():
        for action in command._actions:
            if not action.option_strings or action.help == argparse.SUPPRESS:
                continue
            assert action.help, f"{name} {action.option_strings[0]} has no help"
        text = command.format_help()
        assert max(len(line) for line in text.splitlines()) <= 80, (name, text)
        for action in command._actions:
            if action.option_strings and action.default not in (None, False, argparse.SUPPRESS):
                options = text[text.index("options:") :]
                line = options[options.index(action.option_strings[-1]) :]
                assert "default" in line.split("\n  -")[0], f"{name} {action.option_strings[-1]} hides its default"
    broker_help = " ".join(commands["broker"].format_help().split())  # the column's width follows the options
    assert "--port PORT the port it listens on (default: the port of $KRISHIV_KAFKA_BOOTSTRAP, else 9092)" in (
        broker_help
    )
    assert "-v, --verbose log what the relay and stager do" in broker_help

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"krishiv {version('krishiv')}\n"

    epilog = parser.format_help()
    envs = (
        "KRISHIV_LEDGER_LOCK_TIMEOUT_S",
        "KRISHIV_STAGER_LEASE_TTL_S",
        "KRISHIV_REGISTRY_OUTAGE_S",
        "KRISHIV_STATUS_PENDING_S",
    )
    for var in (SPEC_FILE_ENV, *ENV_OVERRIDES, *envs):
        assert f"\n  {var} " in epilog, var
    for var in ("OTEL_EXPORTER_OTLP_ENDPOINT", "KRISHIV_METRICS_PORT", "KRISHIV_METRICS_HOST"):
        assert f"\n  {var} " in epilog, var


# ------------------------------------------------------------------------------------------ wrong inputs


def test_a_spec_path_that_is_a_folder_is_named(tmp_path: Path, capsys, monkeypatch) -> None:
    assert main(["--spec", str(tmp_path), "status"]) == 2
    assert _one_line(capsys.readouterr().err) == (
        f"krishiv status: spec: --spec {tmp_path} is a folder; expected a TOML spec file such as "
        f"{tmp_path / 'krishiv.toml'}"
    )
    monkeypatch.setenv(SPEC_FILE_ENV, str(tmp_path))
    assert main(["verify"]) == 2
    assert f"spec: ${SPEC_FILE_ENV} {tmp_path} is a folder" in _one_line(capsys.readouterr().err)


@pytest.mark.parametrize(
    "command", ["status", "verify", "lineage", "commit", "clean-staging", "restage", "ledger-compact"]
)
def test_before_a_first_run_each_reader_says_there_is_no_ledger(tmp_path: Path, capsys, command: str) -> None:
    spec = _spec(tmp_path / "fresh")
    assert main(["--spec", str(spec), command]) == 2
    ledger = tmp_path / "fresh" / "state" / "ledger.duckdb"
    assert _one_line(capsys.readouterr().err) == (
        f"krishiv {command}: no ledger at {ledger}: its folder {ledger.parent} does not exist; expected the ledger "
        "`krishiv run` writes (run it first, or check storage.ledger_path)"
    )
    assert not ledger.parent.exists()  # looking made nothing


def test_a_ledger_path_with_a_typo_is_not_an_empty_pipeline(tmp_path: Path, capsys, monkeypatch) -> None:
    spec = _spec(tmp_path)
    Ledger(tmp_path / "state" / "ledger.duckdb").migrate()  # the real one
    typo = tmp_path / "stat" / "ledger.duckdb"
    monkeypatch.setenv("KRISHIV_LEDGER_PATH", str(typo))
    for command in ("status", "commit", "verify", "lineage"):
        assert main(["--spec", str(spec), command]) == 2
        out, err = capsys.readouterr()
        assert "pending" not in out and "committed" not in out
        assert _one_line(err).startswith(f"krishiv {command}: no ledger at {typo}: its folder {typo.parent} ")
        assert "check $KRISHIV_LEDGER_PATH" in err

    monkeypatch.setenv("KRISHIV_LEDGER_PATH", str(tmp_path / "state" / "ledgr.duckdb"))
    assert main(["--spec", str(spec), "status"]) == 2
    assert "ledgr.duckdb: nothing has been staged there yet;" in _one_line(capsys.readouterr().err)


def test_verify_and_lineage_of_a_table_not_created_yet_name_it(tmp_path: Path, capsys) -> None:
    spec = _spec(tmp_path)
    Ledger(tmp_path / "state" / "ledger.duckdb").migrate()
    for command in ("verify", "lineage"):
        assert main(["--spec", str(spec), command]) == 2
        assert _one_line(capsys.readouterr().err) == (
            f"krishiv {command}: table krishiv.orders is not in the catalog "
            f"sqlite:///{tmp_path / 'state' / 'catalog.db'} yet; `krishiv run` creates it and `krishiv commit` fills it"
        )


def test_a_ledger_path_under_a_file_or_a_folder_nobody_may_write_is_named(tmp_path: Path, capsys, monkeypatch) -> None:
    spec = _spec(tmp_path)
    (tmp_path / "notes.txt").write_text("keep me")
    monkeypatch.setenv("KRISHIV_LEDGER_PATH", str(tmp_path / "notes.txt" / "ledger.duckdb"))
    assert main(["--spec", str(spec), "run", "--once"]) == 2  # refused before the broker is asked or Spark starts
    assert _one_line(capsys.readouterr().err) == (
        f"krishiv run: $KRISHIV_LEDGER_PATH {tmp_path / 'notes.txt' / 'ledger.duckdb'}: {tmp_path / 'notes.txt'} "
        "is a file, not a folder; expected a folder the ledger can be written in"
    )
    assert (tmp_path / "notes.txt").read_text() == "keep me"

    if os.geteuid() == 0:  # root may write any folder it can chmod; sysfs refuses new folders even to root
        blocked = Path("/sys/krishiv-ledger")
    else:
        (tmp_path / "locked").mkdir(mode=0o555)
        blocked = tmp_path / "locked" / "state"
    monkeypatch.setenv("KRISHIV_LEDGER_PATH", str(blocked / "ledger.duckdb"))
    assert main(["--spec", str(spec), "run", "--once"]) == 2
    err = _one_line(capsys.readouterr().err)
    assert err.startswith(f"krishiv run: $KRISHIV_LEDGER_PATH {blocked / 'ledger.duckdb'}: cannot make its folder")
    assert err.endswith("expected a folder this user can write")


def test_a_broker_that_is_down_is_one_line_for_status_and_produce(tmp_path: Path, capsys) -> None:
    spec = _spec(tmp_path, bootstrap=f"127.0.0.1:{free_port()}")
    Ledger(tmp_path / "state" / "ledger.duckdb").migrate()
    assert main(["--spec", str(spec), "status"]) == 1  # the ledger's side is still shown
    out, err = capsys.readouterr()
    assert "orders (windowed) reads orders into 2 tables" in out
    assert _one_line(err).startswith("krishiv status: Kafka broker at 127.0.0.1:")
    assert main(["--spec", str(spec), "produce", "--records", "5"]) == 2
    assert _one_line(capsys.readouterr().err).startswith("krishiv produce: Kafka broker at 127.0.0.1:")


def test_produce_refuses_counts_that_cannot_be(tmp_path: Path, capsys) -> None:
    spec = _spec(tmp_path)
    assert main(["--spec", str(spec), "produce", "--records", "5", "--late", "4", "--malformed", "2"]) == 2
    assert _one_line(capsys.readouterr().err) == "krishiv produce: --late, --malformed: 4 + 2 exceed --records 5"
    with pytest.raises(SystemExit):
        main(["--spec", str(spec), "produce", "--records", "-5"])
    assert "argument --records: expected a whole number of at least 0, got '-5'" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ the broker


def test_the_broker_listens_where_the_other_commands_look() -> None:
    """Without --port, the port of $KRISHIV_KAFKA_BOOTSTRAP (which every other command reads), else 9092; the
    quickstart's doc test starts it that way (tests/docs/test_quickstart.py)."""
    assert default_port({"KRISHIV_KAFKA_BOOTSTRAP": "127.0.0.1:19093"}) == 19093
    assert default_port({"KRISHIV_KAFKA_BOOTSTRAP": "localhost:19093"}) == 19093
    for unusable in ("a:1,b:2", "kafka.internal", "host:0", "host:port", ""):
        assert default_port({"KRISHIV_KAFKA_BOOTSTRAP": unusable}) == 9092, unusable
    assert default_port({}) == 9092


def test_the_broker_says_its_port_is_taken_and_frees_it_on_sigterm(capsys) -> None:
    port = free_port()
    broker = subprocess.Popen(
        [*KRISHIV, "broker", "--port", str(port)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        lines = _read_until(broker, "Tansu broker listening on", timeout_s=60)
        tansu_pid = int(lines[-1].split("(pid ")[1].split(")")[0])

        assert main(["broker", "--port", str(port)]) == 2  # a second broker on the same port
        assert _one_line(capsys.readouterr().err) == (
            f"krishiv broker: port {port} on 127.0.0.1 is already in use (Address already in use): another broker, "
            "or another program; stop it, or choose another port with --port"
        )

        broker.send_signal(signal.SIGTERM)
        out, _ = broker.communicate(timeout=30)
        assert broker.returncode == 0
        assert f"Tansu broker on 127.0.0.1:{port} stopped (SIGTERM); the port is free" in out
        assert "Traceback" not in out and "panicked" not in out
        with pytest.raises(ProcessLookupError):
            os.kill(tansu_pid, 0)  # Tansu is gone, not orphaned
        ensure_port_free("127.0.0.1", port)  # and its port is free
    finally:
        if broker.poll() is None:
            broker.kill()
            broker.wait()
    with pytest.raises(PortTaken), socket.create_server(("127.0.0.1", port)):  # the check itself sees a listener
        ensure_port_free("127.0.0.1", port)


def _read_until(process: subprocess.Popen, wanted: str, timeout_s: float) -> list[str]:
    """The process's lines up to the first holding ``wanted``; fails after ``timeout_s``."""
    lines: list[str] = []
    found = threading.Event()

    def read() -> None:
        for line in process.stdout:
            lines.append(line)
            if wanted in line:
                found.set()
                return

    threading.Thread(target=read, daemon=True).start()
    assert found.wait(timeout_s), f"no {wanted!r} within {timeout_s}s: {''.join(lines)}"
    return lines


# ------------------------------------------------------------------------------------------ stopping a run


def test_ctrl_c_stops_krishiv_run_between_batches_with_one_line(make_spec, spec_file, broker) -> None:
    """Ctrl-C during ``krishiv run --once``, sent to the whole process group (the JVM and its Python workers too)
    as a terminal sends it: the batch in flight finishes, no traceback, one line, exit 130."""
    spec = make_spec(max_records=1_000)
    produce_orders(spec, 3_000)  # three batches
    env = {**os.environ, "COLUMNS": "80"}
    run = subprocess.Popen(
        [*KRISHIV, "--spec", str(spec_file), "run", "--once"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        lines = _read_until(run, "orders_per_minute batch ", timeout_s=240)
        os.killpg(run.pid, signal.SIGINT)
        rest, err = run.communicate(timeout=180)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    out = "".join(lines) + rest
    assert run.returncode == 130, err
    assert "starting Spark (master local[2])\n" in out
    assert "query orders_per_minute started; waiting for its first batch\n" in out
    assert "Ctrl-C: stopping after the batch in flight (Ctrl-C again stops at once)\n" in out
    assert err.endswith(
        "krishiv run: stopped by Ctrl-C between batches; what was staged is kept and the next `krishiv run` goes "
        "on from there\n"
    )
    assert "Traceback" not in out + err and "KeyboardInterrupt" not in out + err
    # Spark's start-up chatter is kept out (spark_jobs/log4j2.properties); the JVM's own incubator notice stays.
    assert [line for line in err.splitlines() if "incubator" not in line] == [err.splitlines()[-1]], err
    assert all(len(line) <= 80 for line in out.splitlines())
    assert Ledger(spec.resolve(spec.storage.ledger_path)).pending_batches()  # what was staged is kept


def test_sigterm_while_a_run_waits_sets_the_stop_flag_and_the_handlers_come_back() -> None:
    """SIGTERM inside ``run``'s wait sets the stop flag and says so (no py4j call in the handler); the handlers
    that were there before come back after."""
    from krishiv.operations import _stop_requests

    said: list[str] = []
    before = signal.getsignal(signal.SIGTERM)
    with _stop_requests(True, said.append) as requested:
        os.kill(os.getpid(), signal.SIGTERM)
        assert requested.wait(10)
    assert requested.signal_name == "SIGTERM"
    assert said == ["SIGTERM: stopping after the batch in flight"]
    assert signal.getsignal(signal.SIGTERM) is before


# ------------------------------------------------------------------------------------------ rejects


def test_a_number_sent_as_a_json_string_names_the_field_and_what_it_got() -> None:
    from krishiv_core.spec import parse_spec
    from spark_jobs.record_decoder import Decoding, RecordDecoder

    spec = parse_spec(
        {
            "pipelines": [
                {
                    "name": "p",
                    "topic": "t",
                    "kind": "events",
                    "fields": {"id": "string", "amount": "long", "price": "double", "at": "timestamp_ms"},
                }
            ]
        }
    )
    values = {
        '{"id": "a", "amount": "12"}': 'mistyped field: amount (long, got a JSON string "12")',
        '{"id": "a", "amount": 12.5}': "mistyped field: amount (long, got a JSON number 12.5: not an integer)",
        '{"id": "a", "amount": 1, "price": "1.5"}': 'mistyped field: price (double, got a JSON string "1.5")',
        '{"id": "a", "at": "1767225600000"}': ('mistyped field: at (timestamp_ms, got a JSON string "1767225600000")'),
        '{"id": "a", "amount": "1", "price": [1]}': (
            'mistyped field: amount (long, got a JSON string "1"), price (double, got a JSON array)'
        ),
        '{"id": "a", "amount": 12': "malformed JSON",
        '{"id": "a", "amount": 12, "price": 1.5, "at": 1767225600000}': None,
    }
    n = len(values)
    decoder = RecordDecoder(Decoding.of(spec.pipelines[0]))
    rows = decoder.decode([None] * n, [v.encode() for v in values], "t", 0, list(range(n)), [0] * n).to_pylist()
    assert [r["reason"] for r in rows] == list(values.values())
