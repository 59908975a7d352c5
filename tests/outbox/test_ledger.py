"""The outbox ledger on both of its databases, a real DuckDB file and a real PostgreSQL schema, alone and with other
processes contending for it; then what each database's own troubles look like (a damaged or foreign file, a locked
file, old DuckDB schemas; a foreign schema, a held write lock, a server that does not answer or refuses).

Every test of the ledger's behaviour takes ``ledger_location`` and so runs once on each database; the tests named for
one database (``ledger_path`` is a DuckDB file, :data:`ON_POSTGRESQL` a PostgreSQL schema) are about that one.
"""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import shutil
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import duckdb
import psycopg
import pytest

from krishiv.broker import free_port
from krishiv_core.entries import COMMITTED, PENDING, OffsetRanges, OutboxEntry, StagedFile
from krishiv_core.errors import BatchReplayMismatch
from krishiv_core.reject_rate import RejectRate
from outbox.errors import (
    LedgerBusyError,
    LedgerCorrupt,
    LedgerGone,
    LedgerLocationWrong,
    LedgerSchemaError,
    LedgerUnavailable,
    OffsetSkipConflict,
    ledger_outage,
)
from outbox.ledger import Ledger
from outbox.ledger.connection import is_server_location, open_backend
from outbox.ledger.schema import MIGRATIONS, SCHEMA_VERSION
from tests.conftest import PG_ADMIN_DSN

REPO_ROOT = Path(__file__).resolve().parents[2]
TABLE = "orders_per_minute"
RUNBOOK = "(see docs/operations.md: Recovery runbook"
REJECTS = "orders_per_minute_rejects"
CHILD_TIMEOUT_S = 120.0


def _offsets(batch_id: int, width: int = 10) -> OffsetRanges:
    start = batch_id * width
    return {"orders": {"0": [start, start + width], "1": [start + 1, start + width + 1]}}


def _entry(
    query_id: str,
    batch_id: int,
    table: str = TABLE,
    offsets: OffsetRanges | None = None,
    intended_snapshot_id: int | None = None,
) -> OutboxEntry:
    return OutboxEntry(
        query_id=query_id,
        pipeline="orders_per_minute",
        table=table,
        batch_id=batch_id,
        offsets=offsets if offsets is not None else _offsets(batch_id),
        files=(
            StagedFile(f"file:///staging/{table}/q={query_id}/b={batch_id}/part-0.parquet", 3, 1024),
            StagedFile(f"file:///staging/{table}/q={query_id}/b={batch_id}/part-1.parquet", 2, 900),
        ),
        intended_snapshot_id=intended_snapshot_id if intended_snapshot_id is not None else 1_000_000 + batch_id,
        metrics={"records_read": 20, "windows": 5},
    )


def _same(stored: OutboxEntry, recorded: OutboxEntry) -> bool:
    """The stored entry equals what was recorded, apart from the creation time the ledger adds."""
    assert stored.created_at is not None
    return stored == dataclasses.replace(recorded, created_at=stored.created_at)


#: A test of the PostgreSQL ledger alone: its ``ledger_location`` is a schema of the machine's server.
ON_POSTGRESQL = pytest.mark.parametrize(
    "ledger_location", [pytest.param("postgresql", marks=pytest.mark.postgres)], indirect=True
)


@pytest.fixture
def ledger_path(tmp_path: Path) -> Path:
    """A DuckDB ledger file, for the tests about DuckDB files."""
    return tmp_path / "state" / "ledger.duckdb"


@pytest.fixture
def ledger(ledger_location: str) -> Ledger:
    return Ledger(ledger_location, lock_timeout_s=10.0)


def _server_and_schema(location: str) -> tuple[str, str]:
    """A PostgreSQL ledger location's server URI (without ``schema=``), and its schema."""
    parts = urlsplit(location)
    query = parse_qsl(parts.query)
    rest = urlencode([(key, value) for key, value in query if key != "schema"])
    return urlunsplit(parts._replace(query=rest)), dict(query)["schema"]


def _run_sql(location: str, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
    """One statement (``?`` placeholders) on the ledger's database itself, past the ledger: in the DuckDB file, or
    in the PostgreSQL schema (which need not exist yet); returns its rows, if it has any."""
    if is_server_location(location):
        uri, schema = _server_and_schema(location)
        with psycopg.connect(uri, autocommit=True, connect_timeout=10) as con:
            con.execute(f'SET search_path = "{schema}"')
            cursor = con.execute(sql.replace("?", "%s").encode(), list(params) or None)
            return cursor.fetchall() if cursor.description else []
    con = duckdb.connect(location)
    try:
        cursor = con.execute(sql, list(params))
        return cursor.fetchall() if cursor.description else []
    finally:
        con.close()


def _nothing_at(location: str) -> bool:
    """Nothing was made at the ledger's location: no DuckDB file, no PostgreSQL schema."""
    if not is_server_location(location):
        return not Path(location).exists()
    _, schema = _server_and_schema(location)
    return not _run_sql(location, "SELECT 1 FROM pg_namespace WHERE nspname = ?", [schema])


@pytest.fixture
def second_location(ledger_location: str, tmp_path: Path) -> Iterator[str]:
    """Another new ledger on the same database as ``ledger_location`` (another file, or another schema)."""
    if not is_server_location(ledger_location):
        yield str(tmp_path / "second.duckdb")
        return
    _, schema = _server_and_schema(ledger_location)
    yield ledger_location.replace(f"schema={schema}", f"schema={schema}_b")
    _run_sql(ledger_location, f'DROP SCHEMA IF EXISTS "{schema}_b" CASCADE')


# ------------------------------------------------------------------------------------------- one process


def test_record_batch_inserts_once(ledger: Ledger) -> None:
    first = [_entry("q1", 0, TABLE, intended_snapshot_id=111), _entry("q1", 0, REJECTS, intended_snapshot_id=222)]

    assert not ledger.exists()
    assert ledger.record_batch(first) == [True, True]
    assert ledger.exists()

    stored = ledger.entries()
    assert len(stored) == 2
    assert all(e.status == PENDING and e.committed_snapshot_id is None and e.committed_at is None for e in stored)
    by_table = {e.table: e for e in stored}
    assert _same(by_table[TABLE], first[0])
    assert _same(by_table[REJECTS], first[1])
    assert by_table[TABLE].record_count == 5
    assert ledger.tables() == [TABLE, REJECTS]
    assert ledger.query_ids("orders_per_minute") == ["q1"]


def test_replay_changes_nothing_and_keeps_the_intended_snapshot_id(ledger: Ledger) -> None:
    ledger.record_batch(
        [_entry("q1", 0, TABLE, intended_snapshot_id=111), _entry("q1", 0, REJECTS, intended_snapshot_id=222)]
    )
    before = ledger.entries()

    replay = [_entry("q1", 0, TABLE, intended_snapshot_id=999), _entry("q1", 0, REJECTS, intended_snapshot_id=998)]
    assert ledger.record_batch(replay) == [False, False]
    assert ledger.record_batch(replay[:1]) == [False]

    after = ledger.entries()
    assert after == before
    assert ledger.get("q1", TABLE, 0) is not None
    assert ledger.get("q1", TABLE, 0).intended_snapshot_id == 111  # type: ignore[union-attr]
    assert ledger.get("q1", REJECTS, 0).intended_snapshot_id == 222  # type: ignore[union-attr]
    assert {t: e.intended_snapshot_id for t, e in ledger.batch("q1", 0).items()} == {TABLE: 111, REJECTS: 222}
    assert ledger.batch("q1", 1) == {}


def test_partial_replay_inserts_only_the_missing_entry(ledger: Ledger) -> None:
    ledger.record_batch([_entry("q1", 0, TABLE, intended_snapshot_id=111)])

    assert ledger.record_batch([_entry("q1", 0, TABLE, intended_snapshot_id=5), _entry("q1", 0, REJECTS)]) == [
        False,
        True,
    ]
    assert ledger.get("q1", TABLE, 0).intended_snapshot_id == 111  # type: ignore[union-attr]
    assert ledger.get("q1", REJECTS, 0) is not None


def test_replay_with_other_offsets_raises_and_writes_nothing(ledger: Ledger) -> None:
    ledger.record_batch([_entry("q1", 0, TABLE)])
    before = ledger.entries()

    other = {"orders": {"0": [0, 12], "1": [1, 11]}}
    # The new rejects entry comes first in the call: the mismatch must roll it back too.
    with pytest.raises(BatchReplayMismatch) as info:
        ledger.record_batch([_entry("q1", 0, REJECTS), _entry("q1", 0, TABLE, offsets=other)])

    message = str(info.value)
    assert "batch 0" in message and "q1" in message and TABLE in message
    assert message.endswith(f"{RUNBOOK} > A checkpoint that does not match its ledger)")
    assert ledger.entries() == before
    assert ledger.get("q1", REJECTS, 0) is None


def test_a_ledger_file_removed_while_in_use_is_not_made_again(tmp_path: Path) -> None:
    """A stager whose state folder was removed under it must not record batches into a new, empty ledger."""
    path = tmp_path / "state" / "ledger.duckdb"
    ledger = Ledger(path)
    ledger.record_batch([_entry("q1", 0)])
    shutil.rmtree(tmp_path / "state")
    with pytest.raises(LedgerGone, match=r"is gone: it was removed while in use; nothing was written"):
        ledger.record_batch([_entry("q1", 1)])
    assert not (tmp_path / "state").exists()


def test_same_batch_id_of_another_query_or_table_is_a_new_entry(ledger: Ledger) -> None:
    ledger.record_batch([_entry("q1", 0, TABLE)])
    other = {"orders": {"0": [500, 600]}}
    assert ledger.record_batch([_entry("q2", 0, TABLE, offsets=other), _entry("q1", 0, REJECTS, offsets=other)]) == [
        True,
        True,
    ]
    assert len(ledger.entries()) == 3


def test_mark_committed(ledger: Ledger) -> None:
    e0, e1 = _entry("q1", 0), _entry("q1", 1)
    ledger.record_batch([e0])
    ledger.record_batch([e1])

    ledger.mark_committed(e0, 4242)

    stored = ledger.get("q1", TABLE, 0)
    assert stored is not None
    assert stored.status == COMMITTED
    assert stored.committed_snapshot_id == 4242
    assert stored.committed_at is not None and stored.created_at is not None
    assert stored.committed_at >= stored.created_at
    assert [e.batch_id for e in ledger.pending(TABLE)] == [1]
    assert [e.batch_id for e in ledger.entries(status=COMMITTED)] == [0]

    # Only a pending entry moves: a second mark does not overwrite the first.
    ledger.mark_committed(e0, 9999)
    assert ledger.get("q1", TABLE, 0).committed_snapshot_id == 4242  # type: ignore[union-attr]

    # An entry with nothing to publish is committed without a snapshot.
    ledger.mark_committed(e1, None)
    stored1 = ledger.get("q1", TABLE, 1)
    assert stored1 is not None and stored1.status == COMMITTED and stored1.committed_snapshot_id is None
    assert ledger.pending(TABLE) == []


def test_times_read_back_are_utc_whatever_the_machines_zone(ledger_location: str) -> None:
    """status, lineage and --json print the ledger's times as UTC; in a process whose zone is not UTC, DuckDB would
    hand back its local time (the same instant, labelled with another offset, printed as if it were UTC), and
    PostgreSQL its session's zone."""
    script = textwrap.dedent(
        f"""
        import sys
        from datetime import UTC, datetime
        sys.path[:0] = {[str(Path(__file__).resolve().parents[2])]!r}
        from tests.outbox.test_ledger import TABLE, _entry
        from outbox.ledger import Ledger
        ledger = Ledger({ledger_location!r})
        entry = _entry("q1", 0)
        ledger.record_batch([entry])
        before = datetime.now(UTC)
        ledger.mark_committed(entry, 1)
        stored, summary = ledger.get("q1", TABLE, 0), ledger.table_summary(TABLE)
        for when in (stored.created_at, stored.committed_at, summary.last_commit_at):
            assert when.utcoffset().total_seconds() == 0, when
        assert abs((summary.last_commit_at - before).total_seconds()) < 60
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], env={**os.environ, "TZ": "Asia/Kolkata"}, capture_output=True, text=True
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_pending_is_in_batch_order(ledger: Ledger) -> None:
    # Recorded out of order, and a second query (whose id sorts first) appears after the first one.
    for batch_id in (2, 0, 1):
        ledger.record_batch([_entry("q-zzz", batch_id), _entry("q-zzz", batch_id, REJECTS)])
    ledger.record_batch([_entry("q-aaa", 0)])
    ledger.record_batch([_entry("q-zzz", 3)])

    assert [(e.query_id, e.batch_id) for e in ledger.pending(TABLE)] == [
        ("q-zzz", 0),
        ("q-zzz", 1),
        ("q-zzz", 2),
        ("q-zzz", 3),
        ("q-aaa", 0),
    ]
    assert [e.batch_id for e in ledger.pending(REJECTS)] == [0, 1, 2]
    assert ledger.query_ids("orders_per_minute") == ["q-zzz", "q-aaa"]

    ledger.mark_committed(_entry("q-zzz", 0), 1)
    assert [(e.query_id, e.batch_id) for e in ledger.pending(TABLE)][:2] == [("q-zzz", 1), ("q-zzz", 2)]


def test_reads_of_a_missing_ledger_create_nothing(ledger: Ledger, ledger_location: str) -> None:
    assert ledger.entries() == []
    assert ledger.pending(TABLE) == []
    assert ledger.get("q", TABLE, 0) is None
    assert ledger.tables() == []
    assert ledger.schema_version() == 0
    assert not ledger.exists()
    assert _nothing_at(ledger_location)


def test_schema_version_after_migrate(ledger: Ledger, ledger_location: str) -> None:
    assert ledger.migrate() == 0
    assert ledger.schema_version() == SCHEMA_VERSION
    assert ledger.migrate() == SCHEMA_VERSION

    # Another instance finds the ledger already at the current version, and migrating again keeps data.
    ledger.record_batch([_entry("q1", 0)])
    again = Ledger(ledger_location, lock_timeout_s=10.0)
    assert again.migrate() == SCHEMA_VERSION
    assert again.schema_version() == SCHEMA_VERSION
    assert len(again.entries()) == 1


def test_newer_schema_version_is_refused(ledger: Ledger, ledger_location: str) -> None:
    ledger.record_batch([_entry("q1", 0)])
    newer = SCHEMA_VERSION + 1
    _run_sql(ledger_location, "UPDATE ledger_meta SET value = ? WHERE key = 'schema_version'", [str(newer)])

    fresh = Ledger(ledger_location, lock_timeout_s=10.0)
    with pytest.raises(LedgerSchemaError) as info:
        fresh.migrate()
    message = str(info.value)
    assert fresh.path in message
    assert str(newer) in message
    assert message.endswith(f"upgrade Krishiv {RUNBOOK} > A ledger that is locked or damaged)")

    with pytest.raises(LedgerSchemaError):
        Ledger(ledger_location).record_batch([_entry("q1", 1)])
    with pytest.raises(LedgerSchemaError):
        Ledger(ledger_location).entries()

    # The refusal left the ledger as it was.
    assert _run_sql(ledger_location, "SELECT value FROM ledger_meta WHERE key = 'schema_version'") == [(str(newer),)]
    assert _run_sql(ledger_location, "SELECT count(*) FROM outbox") == [(1,)]


def test_entries_survive_reopening(ledger: Ledger, ledger_location: str) -> None:
    recorded = [_entry("q1", b, t) for b in range(3) for t in (TABLE, REJECTS)]
    for b in range(3):
        ledger.record_batch([e for e in recorded if e.batch_id == b])
    ledger.mark_committed(recorded[0], 77)
    del ledger

    reopened = Ledger(ledger_location, lock_timeout_s=10.0)
    stored = reopened.entries()
    assert len(stored) == len(recorded)
    stored_by_key = {e.key: e for e in stored}
    for e in recorded:
        got = stored_by_key[e.key]
        if e.key == recorded[0].key:
            assert got.status == COMMITTED and got.committed_snapshot_id == 77
            got = dataclasses.replace(got, status=PENDING, committed_snapshot_id=None, committed_at=None)
        assert _same(got, e)
    assert [e.batch_id for e in reopened.entries(table=TABLE)] == [0, 1, 2]


# ------------------------------------------------------------------------------------------- child processes


class Child:
    """A Python child process whose stdout lines are read in the background, so waits have timeouts."""

    def __init__(self, code: str, *args: str) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(code), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO_ROOT,
            env=env,
        )
        self.pid = self.proc.pid
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._stderr: list[str] = []
        threading.Thread(target=self._pump_stdout, daemon=True).start()
        threading.Thread(target=self._pump_stderr, daemon=True).start()

    def _pump_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def _pump_stderr(self) -> None:
        assert self.proc.stderr is not None
        self._stderr.extend(self.proc.stderr)

    @property
    def stderr(self) -> str:
        return "".join(self._stderr)

    def read_line(self, timeout: float) -> str:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"child {self.pid} printed nothing within {timeout}s; stderr: {self.stderr}") from None
        if line is None:
            self.proc.wait(timeout=timeout)
            raise AssertionError(f"child {self.pid} exited ({self.proc.returncode}) early; stderr: {self.stderr}")
        return line

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def finish(self, timeout: float) -> int:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        return self.proc.wait(timeout=timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


@pytest.fixture
def children() -> Iterator[list[Child]]:
    started: list[Child] = []
    yield started
    for child in started:
        child.kill()


WRITER = """
    import json, sys, time
    from krishiv_core.entries import OutboxEntry, StagedFile
    from outbox.ledger import Ledger

    path, proc, batches = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    ledger = Ledger(path, lock_timeout_s=60.0)
    print("ready", flush=True)
    assert sys.stdin.readline().strip() == "go"
    results, waits = [], []
    for batch in range(batches):
        offsets = {"orders": {str(proc): [batch * 10, batch * 10 + 10]}}
        entries = [
            OutboxEntry(
                query_id=f"proc-{proc}-query-{batch}",
                pipeline="orders_per_minute",
                table=table,
                batch_id=batch,
                offsets=offsets,
                files=(StagedFile(f"file:///s/{table}/{proc}/{batch}.parquet", proc + 1, 100 + batch),),
                intended_snapshot_id=proc * 1_000_000 + batch * 10 + n,
                metrics={"records_read": 10},
            )
            for n, table in enumerate(("orders_per_minute", "orders_per_minute_rejects"))
        ]
        started = time.monotonic()
        results.append(ledger.record_batch(entries))
        waits.append(time.monotonic() - started)
    print(json.dumps({"results": results, "max_wait_s": max(waits)}), flush=True)
"""

HOLDER = """
    import sys
    import duckdb

    con = duckdb.connect(sys.argv[1])
    con.execute("SELECT count(*) FROM outbox").fetchone()
    print("locked", flush=True)
    sys.stdin.readline()
    con.close()
    print("released", flush=True)
"""


@pytest.mark.parametrize("processes", [2, 3])
def test_contending_processes_lose_nothing_and_write_no_half_batch(
    ledger_location: str, children: list[Child], processes: int
) -> None:
    batches = 40
    # Created up front: racing creators of a brand-new ledger are test_racing_creators_all_get_the_ledger's subject.
    Ledger(ledger_location).migrate()

    for proc in range(processes):
        children.append(Child(WRITER, ledger_location, str(proc), str(batches)))
    for child in children:
        assert child.read_line(timeout=CHILD_TIMEOUT_S) == "ready"
    started = time.monotonic()
    for child in children:
        child.send("go")

    reports = [json.loads(child.read_line(timeout=CHILD_TIMEOUT_S)) for child in children]
    codes = [child.finish(timeout=CHILD_TIMEOUT_S) for child in children]
    elapsed = time.monotonic() - started

    assert codes == [0] * processes, [c.stderr for c in children]
    assert elapsed < CHILD_TIMEOUT_S
    for report in reports:
        assert report["results"] == [[True, True]] * batches
        assert report["max_wait_s"] < 60.0  # each call's wait stayed inside its retry budget

    stored = Ledger(ledger_location).entries()
    assert len(stored) == 2 * batches * processes
    assert len({e.key for e in stored}) == len(stored)
    by_batch: dict[tuple[str, int], list[OutboxEntry]] = {}
    for e in stored:
        by_batch.setdefault((e.query_id, e.batch_id), []).append(e)
    for proc in range(processes):
        for batch in range(batches):
            pair = by_batch.get((f"proc-{proc}-query-{batch}", batch))
            assert pair is not None, f"batch {batch} of process {proc} is missing"
            assert sorted(e.table for e in pair) == [TABLE, REJECTS], f"half-written batch {batch} of {proc}"
            for e in pair:
                n = 0 if e.table == TABLE else 1
                assert e.offsets == {"orders": {str(proc): [batch * 10, batch * 10 + 10]}}
                assert e.intended_snapshot_id == proc * 1_000_000 + batch * 10 + n
                assert e.files == (StagedFile(f"file:///s/{e.table}/{proc}/{batch}.parquet", proc + 1, 100 + batch),)
                assert e.status == PENDING
    assert len(by_batch) == batches * processes


CREATOR = """
    import sys
    from outbox.ledger import Ledger

    ledger = Ledger(sys.argv[1], lock_timeout_s=60.0)
    print("ready", flush=True)
    assert sys.stdin.readline().strip() == "go"
    ledger.migrate()
    print(ledger.schema_version(), flush=True)
"""


def test_racing_creators_all_get_the_ledger(ledger_location: str, children: list[Child]) -> None:
    """Processes creating the same new ledger at once (a file, a schema): one makes it, the others wait for it."""
    if not is_server_location(ledger_location):
        Path(ledger_location).parent.mkdir(parents=True)
    for _ in range(3):
        children.append(Child(CREATOR, ledger_location))
    for child in children:
        assert child.read_line(timeout=CHILD_TIMEOUT_S) == "ready"
    for child in children:
        child.send("go")
    assert [child.read_line(timeout=CHILD_TIMEOUT_S) for child in children] == [str(SCHEMA_VERSION)] * 3
    assert [child.finish(timeout=CHILD_TIMEOUT_S) for child in children] == [0, 0, 0], [c.stderr for c in children]
    assert Ledger(ledger_location).record_batch([_entry("q", 0)]) == [True]


def test_readers_looking_while_the_ledger_is_made_see_none_or_all_of_it(ledger_location: str) -> None:
    """A reader that looks while another process's migration commits sees no ledger yet, or the whole of it: never
    the made tables as some other program's (seen once in CI on PostgreSQL, when the reader's two looks straddled
    the commit). Several rounds, a reader polling through each migration."""
    for round_ in range(10):
        location = (
            f"{ledger_location}_{round_}" if is_server_location(ledger_location) else f"{ledger_location}.{round_}"
        )
        if not is_server_location(location):
            Path(location).parent.mkdir(parents=True, exist_ok=True)
        errors: list[BaseException] = []
        made = threading.Event()

        def look(location: str = location, errors: list[BaseException] = errors, made: threading.Event = made) -> None:
            while True:
                try:
                    if Ledger(location, lock_timeout_s=10.0).exists() and made.is_set():
                        return
                except BaseException as exc:  # reported below
                    errors.append(exc)
                    return

        reader = threading.Thread(target=look, daemon=True)
        reader.start()
        Ledger(location, lock_timeout_s=10.0).migrate()
        made.set()
        reader.join(CHILD_TIMEOUT_S)
        assert not reader.is_alive() and errors == [], errors
        if is_server_location(location):
            _run_sql(location, f'DROP SCHEMA IF EXISTS "{_server_and_schema(location)[1]}" CASCADE')


@pytest.mark.parametrize("migrated", [False, True], ids=["fresh-instance", "migrated-instance"])
def test_write_blocked_by_another_process_fails_within_its_budget(
    ledger_path: Path, children: list[Child], migrated: bool
) -> None:
    setup = Ledger(ledger_path, lock_timeout_s=10.0)
    setup.record_batch([_entry("q0", 0)])
    before = setup.entries()

    ledger = Ledger(ledger_path, lock_timeout_s=1.0)
    if migrated:
        ledger.migrate()

    holder = Child(HOLDER, str(ledger_path))
    children.append(holder)
    assert holder.read_line(timeout=CHILD_TIMEOUT_S) == "locked"

    attempt = [_entry("q1", 0, TABLE), _entry("q1", 0, REJECTS)]
    started = time.monotonic()
    with pytest.raises(LedgerBusyError) as info:
        ledger.record_batch(attempt)
    waited = time.monotonic() - started

    assert 0.9 <= waited < 5.0
    assert info.value.path == str(ledger_path)
    message = str(info.value)
    assert str(ledger_path) in message
    assert "nothing was written" in message
    assert str(holder.pid) in message  # DuckDB's detail names the holding process
    assert message.endswith(f"{RUNBOOK} > A ledger that is locked or damaged)")

    holder.send("release")
    assert holder.read_line(timeout=CHILD_TIMEOUT_S) == "released"
    assert holder.finish(timeout=CHILD_TIMEOUT_S) == 0, holder.stderr

    assert ledger.entries() == before
    assert ledger.get("q1", TABLE, 0) is None and ledger.get("q1", REJECTS, 0) is None

    assert ledger.record_batch(attempt) == [True, True]
    stored = {e.key: e for e in ledger.entries()}
    assert set(stored) == {("q0", TABLE, 0), ("q1", TABLE, 0), ("q1", REJECTS, 0)}
    assert _same(stored[("q1", TABLE, 0)], attempt[0])


def test_read_blocked_by_a_writer_fails_within_its_budget(ledger_path: Path, children: list[Child]) -> None:
    ledger = Ledger(ledger_path, lock_timeout_s=1.0)
    ledger.record_batch([_entry("q0", 0)])

    holder = Child(HOLDER, str(ledger_path))
    children.append(holder)
    assert holder.read_line(timeout=CHILD_TIMEOUT_S) == "locked"

    started = time.monotonic()
    with pytest.raises(LedgerBusyError) as info:
        ledger.pending(TABLE)
    waited = time.monotonic() - started
    assert 0.9 <= waited < 5.0
    assert str(ledger_path) in str(info.value)

    holder.send("release")
    assert holder.finish(timeout=CHILD_TIMEOUT_S) == 0, holder.stderr
    assert [e.key for e in ledger.pending(TABLE)] == [("q0", TABLE, 0)]


def _record_in_background(
    ledger: Ledger, entries: list[OutboxEntry]
) -> tuple[threading.Thread, queue.Queue[list[bool] | BaseException]]:
    """``record_batch`` in a thread of its own; its result (or error) arrives on the queue."""
    outcome: queue.Queue[list[bool] | BaseException] = queue.Queue()

    def write() -> None:
        try:
            outcome.put(ledger.record_batch(entries))
        except BaseException as exc:
            outcome.put(exc)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    return writer, outcome


def test_writer_waits_for_a_short_lived_holder(ledger_path: Path, children: list[Child]) -> None:
    """A holder that lets go inside the retry budget delays the write but does not fail it."""
    ledger = Ledger(ledger_path, lock_timeout_s=30.0)
    ledger.record_batch([_entry("q0", 0)])

    holder = Child(HOLDER, str(ledger_path))
    children.append(holder)
    assert holder.read_line(timeout=CHILD_TIMEOUT_S) == "locked"

    writer, outcome = _record_in_background(ledger, [_entry("q0", 1)])
    holder.send("release")
    assert holder.finish(timeout=CHILD_TIMEOUT_S) == 0, holder.stderr

    result = outcome.get(timeout=CHILD_TIMEOUT_S)
    writer.join(timeout=CHILD_TIMEOUT_S)
    assert result == [True]
    assert [e.batch_id for e in ledger.pending(TABLE)] == [0, 1]


PG_HOLDER = """
    import sys
    from outbox.ledger import Ledger

    # A write transaction of the ledger's own, left open: the ledger's write lock is held until told to let go.
    with Ledger(sys.argv[1])._transaction() as con:
        print("locked", con.execute("SELECT pg_backend_pid()").fetchone()[0], flush=True)
        sys.stdin.readline()
    print("released", flush=True)
"""


def _hold_postgresql_write_lock(location: str, children: list[Child]) -> tuple[Child, int]:
    """A child process holding the PostgreSQL ledger's write lock, and its server process's pid."""
    holder = Child(PG_HOLDER, location)
    children.append(holder)
    said, backend = holder.read_line(timeout=CHILD_TIMEOUT_S).split()
    assert said == "locked"
    return holder, int(backend)


def _release(holder: Child) -> None:
    holder.send("release")
    assert holder.read_line(timeout=CHILD_TIMEOUT_S) == "released"
    assert holder.finish(timeout=CHILD_TIMEOUT_S) == 0, holder.stderr


@ON_POSTGRESQL
@pytest.mark.parametrize("migrated", [False, True], ids=["fresh-instance", "migrated-instance"])
def test_a_postgresql_write_blocked_by_another_process_fails_within_its_budget_while_reads_go_on(
    ledger_location: str, children: list[Child], migrated: bool
) -> None:
    """The counterpart of the DuckDB file lock: another process's write holds the ledger, and a write waits its
    budget, then fails naming the holder, having written nothing. Unlike DuckDB's lock it blocks no reader."""
    setup = Ledger(ledger_location, lock_timeout_s=10.0)
    setup.record_batch([_entry("q0", 0)])
    before = setup.entries()

    ledger = Ledger(ledger_location, lock_timeout_s=1.0)
    if migrated:
        ledger.migrate()
    holder, backend = _hold_postgresql_write_lock(ledger_location, children)

    attempt = [_entry("q1", 0, TABLE), _entry("q1", 0, REJECTS)]
    started = time.monotonic()
    with pytest.raises(LedgerBusyError) as info:
        ledger.record_batch(attempt)
    waited = time.monotonic() - started

    assert 0.9 <= waited < 5.0
    assert not isinstance(info.value, LedgerUnavailable)  # the server answered: the ledger was busy
    assert info.value.path == ledger.path
    message = str(info.value)
    assert ledger.path in message
    assert "nothing was written" in message
    assert f"server process {backend}" in message  # the holder, as the server knows it
    assert message.endswith(f"{RUNBOOK} > A ledger that is locked or damaged)")

    # Readers go on meanwhile, and see nothing of the failed write.
    assert ledger.entries() == before
    assert ledger.get("q1", TABLE, 0) is None and ledger.get("q1", REJECTS, 0) is None
    assert [e.key for e in Ledger(ledger_location, lock_timeout_s=1.0).pending(TABLE)] == [("q0", TABLE, 0)]

    _release(holder)
    assert ledger.record_batch(attempt) == [True, True]
    stored = {e.key: e for e in ledger.entries()}
    assert set(stored) == {("q0", TABLE, 0), ("q1", TABLE, 0), ("q1", REJECTS, 0)}
    assert _same(stored[("q1", TABLE, 0)], attempt[0])


@ON_POSTGRESQL
def test_a_postgresql_writer_waits_for_a_short_lived_holder(ledger_location: str, children: list[Child]) -> None:
    """A holder that lets go inside the retry budget delays the write but does not fail it."""
    Ledger(ledger_location).record_batch([_entry("q0", 0)])
    name = f"waiting-writer-{uuid.uuid4().hex[:8]}"  # names the writer's session, to see it wait
    ledger = Ledger(f"{ledger_location}&application_name={name}", lock_timeout_s=30.0)
    ledger.migrate()
    holder, _ = _hold_postgresql_write_lock(ledger_location, children)

    writer, outcome = _record_in_background(ledger, [_entry("q0", 1)])
    deadline = time.monotonic() + CHILD_TIMEOUT_S
    # Its first try at the lock failed (it rolled back) and it is waiting to try again.
    while not _run_sql(
        ledger_location, "SELECT 1 FROM pg_stat_activity WHERE application_name = ? AND query = 'ROLLBACK'", [name]
    ):
        assert writer.is_alive() and time.monotonic() < deadline, "the writer never waited for the lock"
        time.sleep(0.02)
    _release(holder)

    result = outcome.get(timeout=CHILD_TIMEOUT_S)
    writer.join(timeout=CHILD_TIMEOUT_S)
    assert result == [True]
    assert [e.batch_id for e in ledger.pending(TABLE)] == [0, 1]


def test_a_postgresql_server_that_is_not_listening_is_unavailable_within_the_budget() -> None:
    port = free_port()  # nothing listens there
    ledger = Ledger(f"postgresql://krishiv:s3cret-pw@127.0.0.1:{port}/ledgers?schema=krishiv", lock_timeout_s=1.0)
    assert "s3cret-pw" not in ledger.path

    for call in (ledger.exists, ledger.entries, lambda: ledger.record_batch([_entry("q", 0)])):
        started = time.monotonic()
        with pytest.raises(LedgerUnavailable) as info:
            call()
        waited = time.monotonic() - started
        assert 0.9 <= waited < 5.0  # retried for the budget, then given up
        assert isinstance(info.value, LedgerBusyError)  # what callers retry later
        assert info.value.written is False and info.value.path == ledger.path
        message = str(info.value)
        assert f"ledger postgresql://krishiv:***@127.0.0.1:{port}/ledgers?schema=krishiv " in message
        assert "s3cret-pw" not in message
        assert "nothing was written" in message
        assert message.endswith(f"{RUNBOOK} > A ledger that is locked or damaged)")


@pytest.mark.postgres
def test_a_wrong_postgresql_database_is_refused_at_once() -> None:
    """The server answers, and says no: no waiting makes a missing database appear, so nothing waits the budget."""
    missing = f"no_such_database_{uuid.uuid4().hex[:8]}"
    server = urlsplit(PG_ADMIN_DSN)
    ledger = Ledger(urlunsplit(server._replace(path=f"/{missing}", query="schema=krishiv")), lock_timeout_s=30.0)

    for call in (ledger.entries, lambda: ledger.record_batch([_entry("q", 0)])):
        started = time.monotonic()
        with pytest.raises(LedgerUnavailable) as info:
            call()
        assert time.monotonic() - started < 5.0  # not the 30 s budget
        message = str(info.value)
        assert f"ledger {ledger.path} refused the connection: " in message
        assert f'database "{missing}" does not exist' in message  # the server's own words
        assert info.value.written is False


@pytest.mark.parametrize(
    ("location", "said"),
    [
        ("postgresql://krishiv:s3cret-pw@127.0.0.1/ledgers?sslmod=require", "unknown parameter 'sslmod'"),
        ("postgresql://krishiv:s3cret-pw@[127.0.0.1/ledgers", "it does not parse"),
        ("postgresql://krishiv:s3cret-pw@127.0.0.1:54x/ledgers", "port '54x' is not a number"),
    ],
)
def test_a_postgresql_location_that_cannot_be_right_is_refused_before_connecting(location: str, said: str) -> None:
    """No server is asked (none would make it right), and no retry is made: the ledger is not even opened."""
    with pytest.raises(LedgerLocationWrong) as info:
        Ledger(location, lock_timeout_s=30.0)
    message = str(info.value)
    assert said in message and "s3cret-pw" not in message
    assert message.endswith(f"{RUNBOOK} > A location that cannot be right)")


@pytest.mark.postgres
def test_a_setting_libpq_refuses_when_it_connects_is_refused_without_a_retry() -> None:
    """libpq checks an enumerated value (``sslmode``) only when it connects, before reaching the server: a location
    that cannot be right, said at once, with its runbook section."""
    ledger = Ledger(f"{PG_ADMIN_DSN}{'&' if '?' in PG_ADMIN_DSN else '?'}sslmode=requir", lock_timeout_s=30.0)
    with pytest.raises(LedgerLocationWrong) as info:  # not LedgerUnavailable after the 30 s budget
        ledger.entries()
    assert not ledger_outage(info.value), "no waiting makes the setting right"
    message = str(info.value)
    assert 'invalid sslmode value: "requir"' in message
    assert message.endswith(f"{RUNBOOK} > A location that cannot be right)")


# ------------------------------------------------------------------------------------------- not a ledger


def _age(path: Path, seconds: float = 3600.0) -> None:
    """Make the file look old, so the ledger does not wait for a creator to write its header."""
    past = time.time() - seconds
    os.utime(path, (past, past))


@pytest.mark.parametrize(
    ("content", "found"),
    [(b"", "empty file"), (b"PK\x03\x04 this is a zip, not a ledger" * 100, "not a DuckDB file")],
    ids=["empty", "foreign-bytes"],
)
def test_a_file_that_is_not_duckdb_is_named_at_once(ledger_path: Path, content: bytes, found: str) -> None:
    ledger_path.parent.mkdir(parents=True)
    ledger_path.write_bytes(content)
    _age(ledger_path)
    ledger = Ledger(ledger_path, lock_timeout_s=30.0)

    started = time.monotonic()
    for call in (ledger.entries, ledger.migrate, ledger.schema_version, lambda: ledger.record_batch([_entry("q", 0)])):
        with pytest.raises(LedgerCorrupt) as info:
            call()
        message = str(info.value)
        assert f"ledger {ledger_path} is not a DuckDB ledger ({found})" in message
        assert message.endswith(
            f"restore it from a backup or point storage.ledger_path at the right file {RUNBOOK} > A ledger that is "
            "locked or damaged)"
        )
        assert "stayed locked" not in message
        assert info.value.path == str(ledger_path)
    assert time.monotonic() - started < 5.0  # not the 30 s lock budget
    assert ledger_path.read_bytes() == content


def test_a_truncated_ledger_is_named_damaged(ledger_path: Path) -> None:
    Ledger(ledger_path).record_batch([_entry("q", 0)])
    os.truncate(ledger_path, 5000)
    _age(ledger_path)
    with pytest.raises(LedgerCorrupt) as info:
        Ledger(ledger_path, lock_timeout_s=30.0).entries()
    assert f"ledger {ledger_path} is not a DuckDB ledger (a damaged DuckDB file: " in str(info.value)


def test_a_fresh_empty_file_gets_a_moment_then_the_same_error(ledger_path: Path) -> None:
    """A file modified a moment ago may be another process's ledger being created: a short grace, not 30 s."""
    ledger_path.parent.mkdir(parents=True)
    ledger_path.write_bytes(b"")
    started = time.monotonic()
    with pytest.raises(LedgerCorrupt, match="empty file"):
        Ledger(ledger_path, lock_timeout_s=30.0).entries()
    assert time.monotonic() - started < 5.0


def test_another_duckdb_database_is_refused_and_left_alone(ledger_path: Path) -> None:
    ledger_path.parent.mkdir(parents=True)
    con = duckdb.connect(str(ledger_path))
    con.execute("CREATE TABLE invoices (id INTEGER); INSERT INTO invoices VALUES (1)")
    con.close()
    ledger = Ledger(ledger_path, lock_timeout_s=10.0)

    for call in (ledger.entries, ledger.pending_batches, ledger.migrate, lambda: ledger.record_batch([_entry("q", 0)])):
        with pytest.raises(LedgerCorrupt) as info:
            call()
        assert "a DuckDB file without Krishiv's ledger tables; it holds invoices" in str(info.value)

    con = duckdb.connect(str(ledger_path), read_only=True)
    try:
        tables = [r[0] for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()]
    finally:
        con.close()
    assert tables == ["invoices"]  # nothing was migrated into it


def test_an_empty_duckdb_database_becomes_a_ledger(ledger_path: Path) -> None:
    ledger_path.parent.mkdir(parents=True)
    duckdb.connect(str(ledger_path)).close()
    ledger = Ledger(ledger_path, lock_timeout_s=10.0)
    assert ledger.entries() == []
    assert ledger.record_batch([_entry("q", 0)]) == [True]
    assert ledger.schema_version() == SCHEMA_VERSION


def _tables(location: str) -> list[str]:
    _, schema = _server_and_schema(location)
    return [
        name
        for (name,) in _run_sql(
            location, "SELECT table_name FROM information_schema.tables WHERE table_schema = ? ORDER BY 1", [schema]
        )
    ]


@ON_POSTGRESQL
def test_a_postgresql_schema_holding_other_tables_is_refused_and_left_alone(ledger_location: str) -> None:
    _, schema = _server_and_schema(ledger_location)
    _run_sql(ledger_location, f'CREATE SCHEMA "{schema}"; CREATE TABLE invoices (id INTEGER)')
    _run_sql(ledger_location, "INSERT INTO invoices VALUES (1)")
    ledger = Ledger(ledger_location, lock_timeout_s=30.0)

    started = time.monotonic()
    calls = (ledger.exists, ledger.entries, ledger.pending_batches, ledger.schema_version, ledger.migrate)
    for call in (*calls, lambda: ledger.record_batch([_entry("q", 0)]), lambda: ledger.compact(0)):
        with pytest.raises(LedgerCorrupt) as info:
            call()
        message = str(info.value)
        assert f"ledger {ledger.path} is not a PostgreSQL ledger (" in message
        assert schema in info.value.found and "invoices" in info.value.found
        assert message.endswith(
            "restore it from a backup or point storage.ledger_path at the right database and schema "
            f"{RUNBOOK} > A ledger that is locked or damaged)"
        )
        assert info.value.path == ledger.path
    assert time.monotonic() - started < 5.0  # at once, not after the 30 s lock budget

    assert _tables(ledger_location) == ["invoices"]  # nothing was migrated into it
    assert _run_sql(ledger_location, "SELECT id FROM invoices") == [(1,)]


@ON_POSTGRESQL
def test_an_empty_postgresql_schema_becomes_a_ledger(ledger_location: str) -> None:
    _, schema = _server_and_schema(ledger_location)
    _run_sql(ledger_location, f'CREATE SCHEMA "{schema}"')
    ledger = Ledger(ledger_location, lock_timeout_s=10.0)
    assert not ledger.exists() and ledger.entries() == []
    assert ledger.record_batch([_entry("q", 0)]) == [True]
    assert ledger.exists() and ledger.schema_version() == SCHEMA_VERSION
    assert {"ledger_meta", "outbox", "stager_lease"} <= set(_tables(ledger_location))


# ------------------------------------------------------------------------------------------- aggregate reads


def _committed_entry(query_id: str, batch_id: int, table: str = TABLE, **metrics: int) -> OutboxEntry:
    e = _entry(query_id, batch_id, table)
    return dataclasses.replace(e, metrics={"records_read": 20, "rejects": 1, "late_events": 2, **metrics})


def _fill(ledger: Ledger, batches: int, queries: tuple[str, ...] = ("q-b", "q-a")) -> list[OutboxEntry]:
    """Batches of both tables for each query, the first two thirds committed (with and without snapshots)."""
    recorded = []
    for query_id in queries:
        for b in range(batches):
            pair = [_committed_entry(query_id, b, TABLE), _committed_entry(query_id, b, REJECTS)]
            ledger.record_batch(pair)
            recorded += pair
    for n, e in enumerate(recorded):
        if e.batch_id < batches * 2 // 3:
            ledger.mark_committed(e, None if n % 5 == 0 else 10_000 + n)
    return recorded


def _expected_ends(entries: list[OutboxEntry], status: str | None = None) -> dict[str, int]:
    ends: dict[str, int] = {}
    for e in entries:
        if status is None or e.status == status:
            for p, (_start, end) in e.offsets["orders"].items():
                ends[p] = max(ends.get(p, 0), end)
    return ends


def test_aggregate_reads_agree_with_the_entries(ledger: Ledger) -> None:
    _fill(ledger, 30)
    everything = ledger.entries(table=TABLE)
    committed = [e for e in everything if e.status == COMMITTED]
    pending = [e for e in everything if e.status == PENDING]

    assert ledger.end_offsets(TABLE, "orders") == _expected_ends(everything)
    assert ledger.end_offsets(TABLE, "orders", status=COMMITTED) == _expected_ends(committed)
    assert ledger.end_offsets(TABLE, "orders", status=PENDING) == _expected_ends(pending)
    assert ledger.end_offsets(TABLE, "orders", pipeline="another") == {}
    assert ledger.end_offsets(TABLE, "refunds") == {}

    summary = ledger.table_summary(TABLE, pipeline="orders_per_minute", topic="orders")
    assert (summary.pending, summary.committed, summary.archived) == (len(pending), len(committed), 0)
    assert summary.records_read == sum(e.metrics["records_read"] for e in everything)
    assert summary.rejects == len(everything) and summary.late_events == 2 * len(everything)
    assert summary.committed_records == sum(e.record_count for e in committed)
    last = max(committed, key=lambda e: e.committed_at)  # type: ignore[arg-type,return-value]
    with_snapshot = max(
        (e for e in committed if e.committed_snapshot_id is not None),
        key=lambda e: e.committed_at,  # type: ignore[arg-type,return-value]
    )
    assert summary.last_commit_at == last.committed_at
    assert summary.last_snapshot_id == with_snapshot.committed_snapshot_id
    assert summary.oldest_pending_at == min(e.created_at for e in pending)  # type: ignore[type-var]
    assert summary.staged_offsets == _expected_ends(everything)
    assert summary.committed_offsets == _expected_ends(committed)
    other = ledger.table_summary(TABLE, pipeline="another", topic="orders")
    assert (other.committed, other.staged_offsets, other.committed_offsets) == (0, {}, {})
    assert ledger.table_summary(TABLE, topic="orders").committed_offsets == _expected_ends(committed)

    keys = [(p.query_id, p.table, p.batch_id) for p in ledger.pending_batches([TABLE])]
    assert keys == [e.key for e in ledger.pending(TABLE)]
    assert [p.created_at for p in ledger.pending_batches([TABLE])] == [e.created_at for e in pending]
    both = ledger.pending_batches([TABLE, REJECTS])
    assert sorted(p.table for p in both) == sorted(e.table for e in ledger.entries(status=PENDING))
    assert ledger.pending_batches([]) == []

    batches = ledger.committed_batches(TABLE)
    assert batches.records == {(e.query_id, e.batch_id): e.record_count for e in committed}
    assert list(batches.records) == [(e.query_id, e.batch_id) for e in committed]  # commit order
    assert batches.total_records == summary.committed_records


def test_recent_rejects_add_up_the_newest_batches_of_a_pipeline_pending_or_committed(ledger: Ledger) -> None:
    """The rate ``krishiv status`` and ``check`` warn of, and the Dagster check reads (``krishiv_core.reject_rate``):
    the records read and rejected by the newest batches of a pipeline's first table."""
    counts = [(20, 0), (10, 10), (30, 5), (8, 8)]  # (records read, rejects) of batches 0 to 3, recorded in order
    for batch_id, (read, rejects) in enumerate(counts):
        entry = dataclasses.replace(_entry("q1", batch_id), metrics={"records_read": read, "rejects": rejects})
        assert ledger.record_batch([entry]) == [True]
        if batch_id < 2:
            ledger.mark_committed(entry, entry.intended_snapshot_id)
    other = dataclasses.replace(_entry("q2", 0), pipeline="another", metrics={"records_read": 7, "rejects": 1})
    ledger.record_batch([other])

    def folded(batches: list[tuple[int, int]]) -> RejectRate:
        return RejectRate(sum(r for r, _ in batches), sum(j for _, j in batches), len(batches))

    assert ledger.recent_rejects(TABLE, pipeline="orders_per_minute", batches=3) == folded(counts[-3:])
    assert ledger.recent_rejects(TABLE, pipeline="orders_per_minute") == folded(counts)  # fewer than the default 10
    assert ledger.recent_rejects(TABLE, batches=1) == RejectRate(7, 1, 1)  # every pipeline's: the newest is another's
    assert ledger.recent_rejects(REJECTS) == RejectRate(0, 0, 0)


def test_aggregate_reads_of_a_missing_ledger_create_nothing(ledger: Ledger, ledger_location: str) -> None:
    assert ledger.end_offsets(TABLE, "orders") == {}
    assert ledger.table_summary(TABLE, topic="orders").pending == 0
    assert ledger.pending_batches() == []
    assert ledger.committed_batches(TABLE).total_records == 0
    assert ledger.recent_rejects(TABLE) == RejectRate(0, 0, 0)
    assert ledger.skips("q") == []
    assert ledger.compact(0).entries_archived == 0
    assert not ledger.exists()
    assert _nothing_at(ledger_location)


def _schema_2_ledger(location: str, entries: list[OutboxEntry]) -> None:
    """A ledger as the Krishiv before the normalised reads wrote it (schema version 2), in either database."""
    backend = open_backend(location, 10.0)
    with backend.transaction() as con:
        backend.prepare(con)
        con.execute("CREATE TABLE ledger_meta (key VARCHAR PRIMARY KEY, value VARCHAR)")
        for migration in backend.dialect.migrations[:2]:
            con.execute(migration)
        con.execute("INSERT INTO ledger_meta VALUES ('schema_version', '2')")
        for e in entries:
            con.execute(
                "INSERT INTO outbox VALUES (?, ?, ?, ?, ?, ?, NULL, ?, ?, ?, ?, now(), NULL)",
                [
                    e.query_id,
                    e.pipeline,
                    e.table,
                    e.batch_id,
                    PENDING,
                    e.intended_snapshot_id,
                    json.dumps(e.offsets),
                    json.dumps([f.to_json() for f in e.files]),
                    e.record_count,
                    json.dumps(e.metrics),
                ],
            )
        con.execute(
            "INSERT INTO stager_lease VALUES "
            "('orders_per_minute', 'krishiv run', 'h', 1, now(), now() - INTERVAL '1 hour')"
        )


def test_a_schema_2_ledger_is_back_filled_by_its_first_read(ledger_location: str) -> None:
    """Migration 3's back-fill, in each database's SQL, reads the offsets and metrics out of the entries' JSON."""
    old = [
        _committed_entry("q1", 0),
        dataclasses.replace(_committed_entry("q1", 1), offsets={"orders": {"0": [10, 25]}, "payments": {"3": [7, 9]}}),
        dataclasses.replace(_committed_entry("q1", 2), metrics={}),
    ]
    _schema_2_ledger(ledger_location, old)
    ledger = Ledger(ledger_location, lock_timeout_s=10.0)

    assert ledger.end_offsets(TABLE, "orders") == {"0": 30, "1": 31}
    assert ledger.end_offsets(TABLE, "payments") == {"3": 9}
    assert ledger.schema_version() == SCHEMA_VERSION
    summary = ledger.table_summary(TABLE)
    assert (summary.pending, summary.records_read, summary.rejects, summary.late_events) == (3, 40, 2, 4)
    stored = ledger.entries()
    assert stored == [dataclasses.replace(e, created_at=s.created_at) for e, s in zip(old, stored, strict=True)]
    assert ledger.live_lease("orders_per_minute") is None  # the old lease row reads, with no token
    assert ledger.acquire_lease("orders_per_minute", "krishiv run", 30).mine


def test_commits_since_lists_each_commit_once_in_the_order_it_reached_the_ledger(ledger: Ledger) -> None:
    for b in range(3):
        ledger.record_batch([_entry("q1", b), _entry("q1", b, REJECTS)])
    assert ledger.last_commit_seq() == 0 and ledger.commits_since(0) == []

    seqs = [
        ledger.mark_committed(_entry("q1", 0), 7_000, "krishiv run", 12.5),
        ledger.mark_committed(_entry("q1", 0, REJECTS), None, "krishiv run"),
        ledger.mark_committed(_entry("q1", 1), 7_001, "dagster run 1a2b3c4d", 30.0),
    ]
    assert seqs == [1, 2, 3]
    assert ledger.mark_committed(_entry("q1", 1), 9_999, "krishiv commit") is None  # not pending: nothing changes

    first, empty, by_dagster = ledger.commits_since(0)
    assert (first.commit_seq, first.table, first.batch_id, first.committed_snapshot_id) == (1, TABLE, 0, 7_000)
    assert (first.committed_by, first.commit_ms, first.record_count, first.pipeline) == (
        "krishiv run",
        12.5,
        5,
        "orders_per_minute",
    )
    assert first.offsets == _offsets(0) and first.query_id == "q1"
    assert first.committed_at >= first.created_at and first.staged_to_committed_s >= 0
    assert (empty.table, empty.committed_snapshot_id, empty.commit_ms) == (REJECTS, None, None)
    assert (by_dagster.batch_id, by_dagster.committed_by) == (1, "dagster run 1a2b3c4d")

    # A cursor: read on from the last record; filter by table; at most ``limit``.
    assert [c.commit_seq for c in ledger.commits_since(1)] == [2, 3]
    assert [c.commit_seq for c in ledger.commits_since(0, [TABLE])] == [1, 3]
    assert [c.commit_seq for c in ledger.commits_since(0, limit=2)] == [1, 2]
    assert ledger.commits_since(0, []) == [] and ledger.commits_since(3) == []
    assert ledger.last_commit_seq() == 3

    # Compaction folds old commits away, the latest one too (batch 2 of the rejects is pending, so it is the
    # newest entry compaction keeps); the sequence goes on from where it was.
    ledger.mark_committed(_entry("q1", 2), 7_002)
    ledger.mark_committed(_entry("q1", 1, REJECTS), None)
    assert ledger.compact(0, now=datetime.now(UTC) + timedelta(seconds=1)).entries_archived == 4
    assert [c.commit_seq for c in ledger.commits_since(0)] == [4]
    assert ledger.last_commit_seq() == 5
    assert ledger.mark_committed(_entry("q1", 2, REJECTS), None, "krishiv run") == 6
    assert [(c.table, c.batch_id) for c in ledger.commits_since(5)] == [(REJECTS, 2)]


def test_newest_commits_are_the_last_of_each_table_up_to_a_number_in_commit_order(ledger: Ledger) -> None:
    """Five batches of the table and of its rejects committed interleaved, a sixth pending: the newest two of each
    table up to a sequence number, oldest first, and nothing reading on from that number lists them again."""
    for b in range(6):
        ledger.record_batch([_entry("q1", b), _entry("q1", b, REJECTS)])
    order = [(TABLE, 0), (TABLE, 1), (REJECTS, 0), (TABLE, 2), (REJECTS, 1), (REJECTS, 2), (TABLE, 3), (TABLE, 4)]
    seq = {key: ledger.mark_committed(_entry("q1", key[1], key[0]), None, "krishiv run") for key in order}

    def numbers(per_table: int, through: int, tables: tuple[str, ...] = (TABLE, REJECTS)) -> list[int]:
        return [c.commit_seq for c in ledger.newest_commits(tables, per_table, through)]

    # Folded separately: per table, the last ``per_table`` of its commits numbered up to ``through``; then all sorted.
    def expected(per_table: int, through: int, tables: tuple[str, ...] = (TABLE, REJECTS)) -> list[int]:
        chosen: list[int] = []
        for table in tables:
            chosen += sorted(n for (t, _), n in seq.items() if t == table and n <= through)[-per_table:]
        return sorted(chosen)

    last = ledger.last_commit_seq()
    assert numbers(2, last) == expected(2, last) == [seq[(REJECTS, 1)], seq[(REJECTS, 2)], seq[(TABLE, 3)], last]
    assert numbers(2, 5) == expected(2, 5) and numbers(10, last) == expected(10, last) == sorted(seq.values())
    assert numbers(3, last, (REJECTS,)) == expected(3, last, (REJECTS,))
    assert numbers(0, last) == numbers(2, last, ()) == numbers(2, 0) == []
    newest = ledger.newest_commits([TABLE], 1, last)[0]
    assert (newest.table, newest.batch_id, newest.committed_by) == (TABLE, 4, "krishiv run")
    assert ledger.commits_since(last) == []  # reading on from ``through`` lists none of them again


def _schema_7_ledger(path: Path) -> None:
    """A ledger as the Krishiv before commit sequence numbers wrote it: one batch committed, one pending, a lease."""
    path.parent.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect(str(path))
    try:
        con.execute("CREATE TABLE ledger_meta (key VARCHAR PRIMARY KEY, value VARCHAR)")
        for migration in MIGRATIONS[:7]:
            con.execute(migration)
        con.execute("INSERT INTO ledger_meta VALUES ('schema_version', '7')")
        for e, status in ((_entry("q1", 0), COMMITTED), (_entry("q1", 1), PENDING)):
            con.execute(
                "INSERT INTO outbox (query_id, pipeline, table_name, batch_id, status, intended_snapshot_id, "
                "committed_snapshot_id, offsets, files, record_count, metrics, created_at, committed_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, now(), ?)",
                [
                    e.query_id,
                    e.pipeline,
                    e.table,
                    e.batch_id,
                    status,
                    e.intended_snapshot_id,
                    e.intended_snapshot_id if status == COMMITTED else None,
                    json.dumps(e.offsets),
                    json.dumps([f.to_json() for f in e.files]),
                    e.record_count,
                    json.dumps(e.metrics),
                    datetime.now(UTC) if status == COMMITTED else None,
                ],
            )
        con.execute(
            "INSERT INTO stager_lease VALUES ('orders_per_minute', 'krishiv run', 'elsewhere', 1, now(), "
            "now() + INTERVAL 1 HOUR, 'token-of-another-process', NULL)"
        )
    finally:
        con.close()


def test_a_schema_7_ledger_upgrades_and_numbers_only_the_commits_after(ledger_path: Path) -> None:
    _schema_7_ledger(ledger_path)
    ledger = Ledger(ledger_path, lock_timeout_s=10.0)

    assert ledger.commits_since(0) == [] and ledger.last_commit_seq() == 0  # the old commit has no number
    assert ledger.schema_version() == SCHEMA_VERSION
    lease = ledger.live_lease("orders_per_minute")
    assert lease is not None and not lease.committing and "committing" not in lease.describe()
    assert [e.batch_id for e in ledger.entries(status=COMMITTED)] == [0]

    assert ledger.mark_committed(_entry("q1", 1), 1_000_001, "krishiv commit", 8.0) == 1
    (commit,) = ledger.commits_since(0)
    assert (commit.batch_id, commit.committed_by, commit.commit_ms) == (1, "krishiv commit", 8.0)


# ------------------------------------------------------------------------------------------- compaction


def test_compaction_keeps_every_total_and_the_newest_entry(ledger: Ledger) -> None:
    _fill(ledger, 12)
    before = {t: ledger.table_summary(t, topic="orders") for t in (TABLE, REJECTS)}
    offsets_before = {s: ledger.end_offsets(TABLE, "orders", status=s) for s in (None, COMMITTED, PENDING)}
    committed_before = ledger.committed_batches(TABLE)
    pending_before = ledger.entries(status=PENDING)
    hot_before = len(ledger.entries())
    query_ids = ledger.query_ids("orders_per_minute")

    # Nothing is old enough yet.
    assert ledger.compact(retention_s=3600).entries_archived == 0

    report = ledger.compact(retention_s=0, now=datetime.now(UTC) + timedelta(seconds=1))
    # Batches 0..7 are committed per query and table; batch 7 is not the newest (11 is), so all 8 go.
    assert report.entries_archived == 2 * 2 * 8
    assert report.groups == 4
    assert report.entries_kept == hot_before - report.entries_archived

    for t in (TABLE, REJECTS):
        after = ledger.table_summary(t, topic="orders")
        assert after.archived == 16
        assert dataclasses.replace(after, archived=0) == before[t]
    assert {s: ledger.end_offsets(TABLE, "orders", status=s) for s in (None, COMMITTED, PENDING)} == offsets_before
    assert ledger.entries(status=PENDING) == pending_before
    assert ledger.entries(status=COMMITTED) == []
    committed_after = ledger.committed_batches(TABLE)
    assert committed_after.total_records == committed_before.total_records
    assert committed_after.archived_through == {"q-b": 7, "q-a": 7}
    assert all(committed_after.includes(q, b) for q, b in committed_before.records)
    assert not committed_after.includes("q-a", 8)
    assert ledger.last_batch_id("q-a", TABLE) == 11
    assert ledger.get("q-a", TABLE, 11) is not None
    assert ledger.query_ids("orders_per_minute") == query_ids
    assert ledger.tables() == [TABLE, REJECTS]

    # A second run finds nothing more to fold.
    assert ledger.compact(retention_s=0, now=datetime.now(UTC) + timedelta(seconds=1)).entries_archived == 0


def test_compaction_runs_from_the_commit_path_at_most_once_per_interval(ledger: Ledger) -> None:
    _fill(ledger, 12)
    later = datetime.now(UTC) + timedelta(days=8)
    first = ledger.compact_if_due(now=later)
    assert first is not None and first.entries_archived == 2 * 2 * 8, "entries past the 7-day retention fold"
    for e in ledger.entries(status=PENDING):
        if e.batch_id < 11:
            ledger.mark_committed(e, None)
    assert ledger.compact_if_due(now=later + timedelta(minutes=30)) is None, "not due again within the hour"
    again = ledger.compact_if_due(now=later + timedelta(days=9))
    assert again is not None and again.entries_archived == 2 * 2 * 3, "batches 8 to 10; the newest, 11, stays"


def test_compaction_keeps_the_newest_entry_even_when_committed_and_old(ledger: Ledger) -> None:
    for b in range(3):
        e = _committed_entry("q1", b)
        ledger.record_batch([e])
        ledger.mark_committed(e, 500 + b)
    report = ledger.compact(retention_s=0, now=datetime.now(UTC) + timedelta(days=30))
    assert report.entries_archived == 2
    assert [e.batch_id for e in ledger.entries()] == [2]
    summary = ledger.table_summary(TABLE)
    assert (summary.committed, summary.archived, summary.last_snapshot_id) == (3, 2, 502)


def test_compaction_in_small_chunks_gives_the_same_archive(ledger_location: str, second_location: str) -> None:
    whole, chunked = Ledger(ledger_location), Ledger(second_location)
    for book in (whole, chunked):
        _fill(book, 15, queries=("q1",))
    later = datetime.now(UTC) + timedelta(seconds=1)
    assert whole.compact(0, now=later).entries_archived == chunked.compact(0, now=later, chunk=7).entries_archived
    for t in (TABLE, REJECTS):
        a, b = (book.table_summary(t, topic="orders") for book in (whole, chunked))
        assert dataclasses.replace(a, last_commit_at=None, oldest_pending_at=None) == dataclasses.replace(
            b, last_commit_at=None, oldest_pending_at=None
        )
        assert a.archived == 10
    assert whole.committed_batches(TABLE) == chunked.committed_batches(TABLE)


def test_a_replay_of_a_compacted_batch_is_recognised_or_refused(ledger: Ledger) -> None:
    _fill(ledger, 6, queries=("q1",))
    ledger.compact(retention_s=0, now=datetime.now(UTC) + timedelta(seconds=1))
    assert ledger.get("q1", TABLE, 1) is None

    # The same offsets (inside what the archive committed): already there, nothing recorded.
    assert ledger.record_batch([_entry("q1", 1, TABLE), _entry("q1", 1, REJECTS)]) == [False, False]
    assert ledger.get("q1", TABLE, 1) is None

    # Offsets beyond what the archive committed: the checkpoint was rewound past the retention.
    beyond = {"orders": {"0": [10, 900]}}
    with pytest.raises(BatchReplayMismatch, match="rewound past the ledger's retention"):
        ledger.record_batch([_entry("q2", 0), _entry("q1", 1, offsets=beyond)])
    assert ledger.get("q2", TABLE, 0) is None  # rolled back with it


def test_ledger_compact_command(tmp_path: Path, ledger_location: str, capsys: pytest.CaptureFixture[str]) -> None:
    from chaos.workspace import SPEC_TEMPLATE
    from krishiv.cli import main

    spec_file = tmp_path / "krishiv.toml"
    spec = SPEC_TEMPLATE.format(
        bootstrap="127.0.0.1:1",
        partitions=4,
        catalog_uri="sqlite:///catalog.db",
        warehouse="warehouse",
        topic="orders",
        max_records=100,
    )
    spec_file.write_text(spec.replace('ledger_path = "ledger.duckdb"', f'ledger_path = "{ledger_location}"'))
    ledger = Ledger(ledger_location)
    _fill(ledger, 6, queries=("q1",))

    assert main(["--spec", str(spec_file), "ledger-compact"]) == 0
    assert "0 committed entries older than 1w folded" in " ".join(capsys.readouterr().out.split())

    assert main(["--spec", str(spec_file), "ledger-compact", "--retention", "0s"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    # Batches 0-3 of each table are committed, and none is its table's newest (5).
    assert "8 committed entries older than 0s folded into the archive of 2 query/table pairs; 4 entries kept" in out
    assert ledger.table_summary(TABLE).archived == 4

    with pytest.raises(SystemExit):
        main(["--spec", str(spec_file), "ledger-compact", "--retention", "soon"])
    assert "expected a duration such as 7d" in capsys.readouterr().err


def test_status_reads_totals_through_compaction(ledger: Ledger) -> None:
    from krishiv.status import pipeline_status

    _fill(ledger, 9, queries=("q1",))
    before = pipeline_status(ledger, "orders_per_minute", TABLE, "orders", {"0": 200, "1": 200})
    ledger.compact(retention_s=0, now=datetime.now(UTC) + timedelta(seconds=1))
    after = pipeline_status(ledger, "orders_per_minute", TABLE, "orders", {"0": 200, "1": 200})
    # The late events by batch are the recent batches' the ledger still lists: the newest of them, the rest folded.
    assert after.late_batches == before.late_batches[: len(after.late_batches)] and after.late_batches
    assert dataclasses.replace(after, late_batches=[]) == dataclasses.replace(before, late_batches=[])
    assert (before.pending, before.committed, before.records_read) == (3, 6, 180)
    assert [(p.partition, p.staged, p.committed, p.lag) for p in before.partitions] == [
        ("0", 90, 60, 140),
        ("1", 91, 61, 139),
    ]


# ------------------------------------------------------------------------------------------- offset skips


def test_offset_skips_are_recorded_once_and_applied_by_one_batch(ledger: Ledger) -> None:
    skip = ledger.record_skip("orders_per_minute", "q1", "orders", 2, 100, 500, "deleted by retention", "ana")
    assert (skip.partition, skip.from_offset, skip.to_offset, skip.applied_batch_id) == ("2", 100, 500, None)
    assert skip.created_at is not None

    # The same skip again is the same record; another target for the same start is refused.
    assert ledger.record_skip("orders_per_minute", "q1", "orders", "2", 100, 500, "again", "bo") == skip
    with pytest.raises(OffsetSkipConflict, match="from offset 100 to 500") as info:
        ledger.record_skip("orders_per_minute", "q1", "orders", 2, 100, 700, "other", "bo")
    assert str(info.value).endswith(f"{RUNBOOK} > Offsets a query cannot read exactly)")
    backwards = ledger.record_skip("orders_per_minute", "q1", "orders", 0, 9000, 0, "topic re-created", "ana")
    ledger.record_skip("orders_per_minute", "q1", "payments", 0, 5, 6, "x", "ana")
    ledger.record_skip("orders_per_minute", "q2", "orders", 2, 100, 500, "another query", "ana")

    assert ledger.skips("q1", "orders") == [backwards, skip]
    assert len(ledger.skips("q1")) == 3

    applied = ledger.mark_skip_applied(skip, 7)
    assert applied == dataclasses.replace(skip, applied_batch_id=7)
    assert ledger.mark_skip_applied(skip, 7) == applied  # a replay of batch 7
    with pytest.raises(OffsetSkipConflict, match="applied by batch 7") as info:
        ledger.mark_skip_applied(skip, 8)
    assert str(info.value).endswith(f"{RUNBOOK} > A checkpoint that does not match its ledger)")
    assert ledger.skips("q1", "orders") == [backwards, applied]
    with pytest.raises(OffsetSkipConflict, match="no skip"):
        ledger.mark_skip_applied(dataclasses.replace(skip, from_offset=1), 7)
    with pytest.raises(ValueError):
        ledger.record_skip("orders_per_minute", "q1", "orders", 1, -1, 5, "x", "ana")


def test_aggregate_reads_on_thousands_of_entries_agree_with_the_entries(tmp_path: Path, ledger_location: str) -> None:
    """The benchmark's bulk-built ledger (4,000 entries, 4 partitions, two queries), before and after compaction;
    built in DuckDB and, for PostgreSQL, moved there as the benchmark and ``krishiv ledger-copy`` move one."""
    from benchmarks.ledger_scale import REJECTS as BENCH_REJECTS
    from benchmarks.ledger_scale import TABLE as BENCH_TABLE
    from benchmarks.ledger_scale import TOPIC, build

    built = tmp_path / "built.duckdb"
    build(built, 4_000, 4)
    ledger = Ledger(built)
    if is_server_location(ledger_location):
        ledger.copy_to(Ledger(ledger_location))
        ledger = Ledger(ledger_location)

    def expected(table: str) -> dict[str, object]:
        everything = ledger.entries(table=table)
        committed = [e for e in everything if e.status == COMMITTED]
        with_snapshot = [e for e in committed if e.committed_snapshot_id is not None]
        return {
            "pending": len(everything) - len(committed),
            "committed": len(committed),
            "records_read": sum(e.metrics.get("records_read", 0) for e in everything),
            "rejects": sum(e.metrics.get("rejects", 0) for e in everything),
            "late_events": sum(e.metrics.get("late_events", 0) for e in everything),
            "committed_records": sum(e.record_count for e in committed),
            "last_commit_at": max(e.committed_at for e in committed),  # type: ignore[type-var]
            "last_snapshot_id": max(with_snapshot, key=lambda e: e.committed_at).committed_snapshot_id,  # type: ignore[arg-type,return-value]
            "staged_offsets": _expected_ends(everything),
            "committed_offsets": _expected_ends(committed),
        }

    def actual(table: str) -> dict[str, object]:
        summary = ledger.table_summary(table, pipeline="orders_per_minute", topic=TOPIC)
        return {key: getattr(summary, key) for key in expected_before[table]}

    tables = (BENCH_TABLE, BENCH_REJECTS)
    expected_before = {t: expected(t) for t in tables}
    assert {t: actual(t) for t in tables} == expected_before
    assert expected_before[BENCH_TABLE]["committed"] == 1_995
    assert len(ledger.pending_batches(tables)) == 10
    assert ledger.committed_batches(BENCH_TABLE).total_records == expected_before[BENCH_TABLE]["committed_records"]

    report = ledger.compact(retention_s=1_000)
    assert 2_900 < report.entries_archived < 3_100  # a 1,000 s retention over 4,000 s of 2 s batches
    assert {t: actual(t) for t in tables} == expected_before
    assert ledger.end_offsets(BENCH_TABLE, TOPIC) == expected_before[BENCH_TABLE]["staged_offsets"]
    assert ledger.committed_batches(BENCH_TABLE).total_records == expected_before[BENCH_TABLE]["committed_records"]


def test_an_entry_keeps_the_schema_id_it_was_staged_for_and_older_entries_read_none(ledger_path: Path) -> None:
    _schema_7_ledger(ledger_path)  # staged before schema ids were recorded
    ledger = Ledger(ledger_path, lock_timeout_s=10.0)
    assert [e.schema_id for e in ledger.entries()] == [None, None]

    staged = dataclasses.replace(_entry("q1", 2), schema_id=3)
    assert ledger.record_batch([staged]) == [True]
    assert ledger.batch("q1", 2)[staged.table].schema_id == 3


def test_the_incarnations_that_read_an_offset_are_counted_by_topic_id_through_the_archive(ledger: Ledger) -> None:
    """A topic re-created reuses its offsets: the ledger says from how many topic ids (incarnations) committed batches
    read each one, also after compaction folded the batches into the archive; a pending batch counts for nothing."""
    batches = [
        dataclasses.replace(_entry("q", 0, offsets={"t": {"0": [0, 10]}}), topic_id="old"),
        dataclasses.replace(_entry("q", 1, offsets={"t": {"0": [0, 5]}}), topic_id="new"),
        dataclasses.replace(_entry("q", 2, offsets={"t": {"0": [5, 8]}}), topic_id="new"),
        dataclasses.replace(_entry("q", 3, offsets={"t": {"0": [8, 9]}}), topic_id="new"),
    ]
    for e in batches:
        ledger.record_batch([e])
    for e in batches[:3]:
        ledger.mark_committed(e, 1)
    asked = [(0, 3), (0, 7), (0, 8), (0, 9), (0, 10), (1, 3)]
    expected = {(0, 3): 2, (0, 7): 2, (0, 8): 1, (0, 9): 1}  # 8 by "old" only: batch 3 is pending
    assert ledger.incarnations_reading("orders_per_minute", "t", asked) == expected
    assert ledger.incarnations_reading("another_pipeline", "t", asked) == {}
    assert ledger.compact(0, now=datetime.now(UTC) + timedelta(seconds=1)).entries_archived == 3
    assert ledger.incarnations_reading("orders_per_minute", "t", asked) == expected


def test_staged_and_committed_offsets_are_the_newest_incarnations_of_the_topic(ledger: Ledger) -> None:
    """A topic re-created starts at offset 0 again: the staged and committed ends (what status's lag and the Dagster
    sensor compare with the topic's latest offsets) are those read from the newest incarnation, not the old one's
    higher ones, before and after compaction; an entry with no recorded topic id counts as the newest one's."""
    old = [
        dataclasses.replace(_entry("q", b, offsets={"t": {"0": [100 * b, 100 * b + 100], "1": [0, 50]}}), topic_id="A")
        for b in range(3)
    ]
    new = [
        dataclasses.replace(_entry("q", 3, offsets={"t": {"0": [0, 40], "1": [0, 7]}}), topic_id="B"),
        dataclasses.replace(_entry("q", 4, offsets={"t": {"0": [40, 60]}}), topic_id=None),
        dataclasses.replace(_entry("q", 5, offsets={"t": {"0": [60, 65]}}), topic_id="B"),
    ]
    for e in old + new:
        ledger.record_batch([e])
    for e in old + new[:2]:
        ledger.mark_committed(e, 1)

    def ends() -> tuple[dict[str, int], dict[str, int], dict[str, int], dict[str, int]]:
        summary = ledger.table_summary(TABLE, topic="t")
        return (
            ledger.end_offsets(TABLE, "t"),
            ledger.end_offsets(TABLE, "t", status=COMMITTED),
            summary.staged_offsets,
            summary.committed_offsets,
        )

    # By the documented rule: the highest end per partition among the entries read from incarnation B (or none).
    staged, committed = {"0": 65, "1": 7}, {"0": 60, "1": 7}
    assert ends() == (staged, committed, staged, committed)
    assert ledger.compact(0, now=datetime.now(UTC) + timedelta(seconds=1)).entries_archived >= 3
    assert ends() == (staged, committed, staged, committed)
    # Named by its pipeline, the same.
    assert ledger.end_offsets(TABLE, "t", pipeline="orders_per_minute") == staged
