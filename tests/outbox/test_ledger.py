"""The outbox ledger on a real DuckDB file, alone and with other processes contending for it."""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest

from outbox.errors import BatchReplayMismatch, LedgerBusyError, LedgerSchemaError
from outbox.ledger import COMMITTED, PENDING, SCHEMA_VERSION, Ledger, OffsetRanges, OutboxEntry, StagedFile

REPO_ROOT = Path(__file__).resolve().parents[2]
TABLE = "orders_per_minute"
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


@pytest.fixture
def ledger_path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "ledger.duckdb"


@pytest.fixture
def ledger(ledger_path: Path) -> Ledger:
    return Ledger(ledger_path, lock_timeout_s=10.0)


# ------------------------------------------------------------------------------------------- one process


def test_record_batch_inserts_once(ledger: Ledger, ledger_path: Path) -> None:
    first = [_entry("q1", 0, TABLE, intended_snapshot_id=111), _entry("q1", 0, REJECTS, intended_snapshot_id=222)]

    assert ledger.record_batch(first) == [True, True]
    assert ledger_path.exists()

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
    assert ledger.entries() == before
    assert ledger.get("q1", REJECTS, 0) is None


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


def test_reads_of_a_missing_file_create_nothing(ledger: Ledger, ledger_path: Path) -> None:
    assert ledger.entries() == []
    assert ledger.pending(TABLE) == []
    assert ledger.get("q", TABLE, 0) is None
    assert ledger.tables() == []
    assert ledger.schema_version() == 0
    assert not ledger_path.exists()


def test_schema_version_after_migrate(ledger: Ledger, ledger_path: Path) -> None:
    assert ledger.migrate() == 0
    assert ledger.schema_version() == SCHEMA_VERSION
    assert ledger.migrate() == SCHEMA_VERSION

    # Another instance finds the file already at the current version, and migrating again keeps data.
    ledger.record_batch([_entry("q1", 0)])
    again = Ledger(ledger_path, lock_timeout_s=10.0)
    assert again.migrate() == SCHEMA_VERSION
    assert again.schema_version() == SCHEMA_VERSION
    assert len(again.entries()) == 1


def test_newer_schema_version_is_refused(ledger: Ledger, ledger_path: Path) -> None:
    ledger.record_batch([_entry("q1", 0)])
    newer = SCHEMA_VERSION + 1
    con = duckdb.connect(str(ledger_path))
    try:
        con.execute("UPDATE ledger_meta SET value = ? WHERE key = 'schema_version'", [str(newer)])
    finally:
        con.close()

    fresh = Ledger(ledger_path, lock_timeout_s=10.0)
    with pytest.raises(LedgerSchemaError) as info:
        fresh.migrate()
    message = str(info.value)
    assert str(ledger_path) in message
    assert str(newer) in message

    with pytest.raises(LedgerSchemaError):
        Ledger(ledger_path).record_batch([_entry("q1", 1)])
    with pytest.raises(LedgerSchemaError):
        Ledger(ledger_path).entries()

    # The refusal left the file as it was.
    con = duckdb.connect(str(ledger_path), read_only=True)
    try:
        assert con.execute("SELECT value FROM ledger_meta WHERE key = 'schema_version'").fetchone() == (str(newer),)
        assert con.execute("SELECT count(*) FROM outbox").fetchone() == (1,)
    finally:
        con.close()


def test_entries_survive_reopening(ledger: Ledger, ledger_path: Path) -> None:
    recorded = [_entry("q1", b, t) for b in range(3) for t in (TABLE, REJECTS)]
    for b in range(3):
        ledger.record_batch([e for e in recorded if e.batch_id == b])
    ledger.mark_committed(recorded[0], 77)
    del ledger

    reopened = Ledger(ledger_path, lock_timeout_s=10.0)
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
    from outbox.ledger import Ledger, OutboxEntry, StagedFile

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
    ledger_path: Path, children: list[Child], processes: int
) -> None:
    batches = 40
    # Created up front: processes racing to create a brand-new DuckDB file can see a half-written header
    # ("not a valid DuckDB database file"), which the ledger does not retry; that is not what this test is about.
    Ledger(ledger_path).migrate()

    for proc in range(processes):
        children.append(Child(WRITER, str(ledger_path), str(proc), str(batches)))
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

    stored = Ledger(ledger_path).entries()
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


def test_writer_waits_for_a_short_lived_holder(ledger_path: Path, children: list[Child]) -> None:
    """A holder that lets go inside the retry budget delays the write but does not fail it."""
    ledger = Ledger(ledger_path, lock_timeout_s=30.0)
    ledger.record_batch([_entry("q0", 0)])

    holder = Child(HOLDER, str(ledger_path))
    children.append(holder)
    assert holder.read_line(timeout=CHILD_TIMEOUT_S) == "locked"

    outcome: queue.Queue[list[bool] | BaseException] = queue.Queue()

    def write() -> None:
        try:
            outcome.put(ledger.record_batch([_entry("q0", 1)]))
        except BaseException as exc:
            outcome.put(exc)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    holder.send("release")
    assert holder.finish(timeout=CHILD_TIMEOUT_S) == 0, holder.stderr

    result = outcome.get(timeout=CHILD_TIMEOUT_S)
    writer.join(timeout=CHILD_TIMEOUT_S)
    assert result == [True]
    assert [e.batch_id for e in ledger.pending(TABLE)] == [0, 1]
