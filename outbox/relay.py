"""Phase 2 of the outbox: promote PENDING ledger entries into Iceberg snapshots, strictly in batch order.

For each pending entry of a table, oldest first:

1. If it staged no rows, mark it COMMITTED with no snapshot (nothing to publish).
2. Load the table and look for the batch: the intended snapshot id among the snapshots, or the query's
   high-water batch id in the table's properties at or past this batch (``krishiv.high-water.<query>``,
   set in the same metadata commit as each snapshot, so it survives snapshot expiry, compaction and
   other writers' snapshots at the head), or, for a table written before that property, a snapshot of
   this query among the current snapshot's ancestors whose high-water batch id is at or past it.
   Found: mark COMMITTED and move on. Nothing is committed twice.
3. Fail closed: if the table shows no trace of the query at all while the ledger holds COMMITTED batches
   of it with rows (the table was dropped and re-created, or restored from an older copy), stop with
   :class:`CommittedBatchesMissing` instead of appending. The table is reloaded before refusing: another
   committer may have committed (and marked) the first batches after this one loaded a fresh table; then the
   reloaded table shows them, and step 2 runs again on it.
4. Check every staged file still exists; a missing one stops the relay (committing would lose rows).
5. Commit one snapshot (:func:`commit_entry`, the one place the entry's operation is turned into a commit): a
   fast append that registers the staged files in place with their partition values, or a merge that
   replaces the rows of the entry's keys (``outbox.merge``); with the intended snapshot id, a summary naming
   query, batch, high-water batch and Kafka offsets, and the query's high-water property moved to this batch.
6. Mark the entry COMMITTED.

A conflict with another writer (``CommitFailedException``) means the commit did not happen: back off,
reload, go back to step 2. A REST catalog's refusal (400, 401, 403, 404, 422: ``krishiv_core.catalog.REFUSED_STATUSES``)
did not happen either, and will not succeed by asking again: :class:`~krishiv_core.catalog.CatalogRefused`, the entry
stays pending. Any other failure of the catalog call has an **unknown outcome**: pyiceberg's
``CommitStateUnknownException`` (a REST 500, 502 or 504), ``ServerError`` and ``ServiceUnavailableError`` (other
5xx), a ``requests`` timeout (``connection.timeout``: the server may apply the commit after the client gave up) or
dropped connection, and anything else. It is never retried blindly: the table is reloaded and step 2 decides, so
a commit the server applied is found and marked, and one it did not is made again, with the same intended snapshot
id on the reloaded head (if the first attempt lands late after all, the catalog's check of the head snapshot
refuses one of the two). pyiceberg itself re-sends a commit only after a 401 or 419 (an expired token), which the
server did not apply. Both loops are bounded by named constants; when the outcome stays unknown,
:class:`~krishiv_core.errors.CatalogUnavailable` names the batch and the entry stays pending for the next run.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException, NoSuchNamespaceError, NoSuchTableError, RESTError
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot

from krishiv_core.catalog import (
    REFUSED_STATUSES,
    CatalogRefused,
    failure_reason,
    http_status,
    masked,
    refusal_hint,
)
from krishiv_core.entries import MERGE, PENDING, OffsetSkip, OutboxEntry
from krishiv_core.errors import CatalogUnavailable, ConfigError, KrishivError
from krishiv_core.evolution import SchemaChange, bring_to_staged_schema
from krishiv_core.faults import fault_point
from krishiv_core.runbook import runbook
from outbox.data_files import data_file
from outbox.errors import (
    CommitConflict,
    CommittedBatchesMissing,
    LedgerBusyError,
    LedgerCorrupt,
    LedgerSchemaError,
)
from outbox.ledger import Ledger
from outbox.merge import merge_commit
from outbox.multi_table_commit import ATOMIC, DeferredCommits, commit_atomically, multi_table_commits
from outbox.snapshot_producer import fast_append

log = logging.getLogger(__name__)

SUMMARY_PIPELINE = "krishiv.pipeline"
SUMMARY_QUERY_ID = "krishiv.query-id"
SUMMARY_BATCH_ID = "krishiv.batch-id"
SUMMARY_HIGH_WATER = "krishiv.high-water-batch-id"
SUMMARY_OFFSETS = "krishiv.kafka-offsets"
SUMMARY_SKIPPED = "krishiv.skipped-offsets"  # operators' skips applied since the query's previous snapshot
#: Table property holding, per query, the highest batch id committed to the table.
HIGH_WATER_PROPERTY_PREFIX = "krishiv.high-water."

MAX_CONFLICT_RETRIES = 8
MAX_AMBIGUOUS_RECHECKS = 3
RETRY_BACKOFF_START_S = 0.05
RETRY_BACKOFF_MAX_S = 2.0
CATALOG_RELOAD_BUDGET_S = 20.0

#: Failures every table would meet alike (the catalog or the ledger is away or is not what it should be, a setting
#: is wrong): a commit run stops on them. Any other Krishiv error is certain and stops only the table it came from.
RUN_STOPS: tuple[type[Exception], ...] = (
    CatalogUnavailable,
    ConfigError,
    LedgerBusyError,
    LedgerCorrupt,
    LedgerSchemaError,
)
TABLE_STOPS: tuple[type[Exception], ...] = (KrishivError,)

#: The identity of a committed batch in the table: the snapshot that recorded it, None if expired.
_EXPIRED = -1


@dataclass
class TableCommitReport:
    table: str
    committed: list[int] = field(default_factory=list)  # batch ids committed by this run
    recovered: list[int] = field(default_factory=list)  # batch ids found already in the table
    empty: list[int] = field(default_factory=list)  # batch ids with nothing to publish
    snapshot_ids: list[int] = field(default_factory=list)
    commit_latencies_ms: list[float] = field(default_factory=list)
    records: int = 0
    #: Why the table's commits stopped in this run (one line naming the table and the way out), None if they did not.
    refused: str | None = None


def snapshot_summary(entry: OutboxEntry, skipped: list[OffsetSkip] = ()) -> dict[str, str]:  # type: ignore[assignment]
    summary = {
        SUMMARY_PIPELINE: entry.pipeline,
        SUMMARY_QUERY_ID: entry.query_id,
        SUMMARY_BATCH_ID: str(entry.batch_id),
        SUMMARY_HIGH_WATER: str(entry.batch_id),
        SUMMARY_OFFSETS: json.dumps(entry.offsets, sort_keys=True, separators=(",", ":")),
    }
    if skipped:
        summary[SUMMARY_SKIPPED] = json.dumps(
            [
                {
                    "topic": s.topic,
                    "partition": s.partition,
                    "from": s.from_offset,
                    "to": s.to_offset,
                    "batch": s.applied_batch_id,
                    "reason": s.reason,
                    "by": s.operator,
                    "at": s.created_at.isoformat(timespec="seconds"),
                }
                for s in skipped
            ],
            sort_keys=True,
            separators=(",", ":"),
        )
    return summary


def high_water_property(query_id: str) -> str:
    return HIGH_WATER_PROPERTY_PREFIX + query_id


def high_water_marks(table: Table) -> dict[str, int]:
    """Per query, the highest batch id committed to ``table``, from its properties (survives expiry)."""
    prefix = HIGH_WATER_PROPERTY_PREFIX
    return {k[len(prefix) :]: int(v) for k, v in table.properties.items() if k.startswith(prefix)}


def ancestors(table: Table) -> Iterator[Snapshot]:
    """The current snapshot and its parents, newest first, until the chain ends or was expired."""
    snapshot = table.current_snapshot()
    while snapshot is not None:
        yield snapshot
        if snapshot.parent_snapshot_id is None:
            return
        snapshot = table.metadata.snapshot_by_id(snapshot.parent_snapshot_id)


def _snapshot_of(table: Table, entry: OutboxEntry) -> int | None:
    for snapshot in table.snapshots():
        summary = snapshot.summary
        if (
            summary is not None
            and summary.get(SUMMARY_QUERY_ID) == entry.query_id
            and summary.get(SUMMARY_BATCH_ID) == str(entry.batch_id)
        ):
            return snapshot.snapshot_id
    return None


def find_committed(table: Table, entry: OutboxEntry) -> int | None:
    """The snapshot id that holds ``entry`` (``-1`` if it is committed but its snapshot expired), or None."""
    if table.metadata.snapshot_by_id(entry.intended_snapshot_id) is not None:
        return entry.intended_snapshot_id
    mark = table.properties.get(high_water_property(entry.query_id))
    if mark is not None:
        if int(mark) < entry.batch_id:
            return None
        found = _snapshot_of(table, entry)
        return _EXPIRED if found is None else found
    # A table committed to before the property existed: the high-water mark in the summaries still reachable.
    for snapshot in ancestors(table):
        summary = snapshot.summary
        if summary is None or summary.get(SUMMARY_QUERY_ID) != entry.query_id:
            continue
        if int(summary.get(SUMMARY_HIGH_WATER) or -1) < entry.batch_id:
            return None
        found = _snapshot_of(table, entry)
        return _EXPIRED if found is None else found
    return None


def shows_query(table: Table, query_id: str) -> bool:
    """Whether ``table`` holds any trace of ``query_id``: its high-water property or a snapshot of it."""
    if high_water_property(query_id) in table.properties:
        return True
    return any(s.summary is not None and s.summary.get(SUMMARY_QUERY_ID) == query_id for s in table.snapshots())


def commit_entry(table: Table, entry: OutboxEntry, summary: Mapping[str, str], properties: Mapping[str, str]) -> Table:
    """The one place the commit operation is chosen: an append registers the staged files as they are (each with
    its partition values); a merge replaces the rows of the entry's keys (``outbox.merge``). Either is one
    snapshot with the entry's intended id and ``summary``, and ``properties`` set in the same metadata commit."""
    if entry.operation.kind == MERGE:
        return merge_commit(table, entry, summary, properties)[0]
    return fast_append(
        table, [data_file(table, f.path) for f in entry.files], entry.intended_snapshot_id, summary, properties
    )


def _merged(reports: list[TableCommitReport]) -> list[TableCommitReport]:
    """One report per table, in first-seen order: a table's batches may be committed with another table's."""
    by_table: dict[str, TableCommitReport] = {}
    for r in reports:
        into = by_table.setdefault(r.table, r)
        if into is r:
            continue
        into.committed += r.committed
        into.recovered += r.recovered
        into.empty += r.empty
        into.snapshot_ids += r.snapshot_ids
        into.commit_latencies_ms += r.commit_latencies_ms
        into.records += r.records
        into.refused = into.refused or r.refused
    return list(by_table.values())


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _backoff(attempt: int) -> float:
    return min(RETRY_BACKOFF_START_S * (2**attempt), RETRY_BACKOFF_MAX_S) * random.uniform(0.5, 1.0)


class CommitRelay:
    """Commits a ledger's pending entries for the tables of one catalog."""

    def __init__(
        self,
        ledger: Ledger,
        catalog: Catalog | Callable[[], Catalog],
        catalog_address: str = "catalog",
        committed_by: str = "krishiv commit",
    ) -> None:
        self.ledger = ledger
        self._catalog = catalog
        self.catalog_address = catalog_address
        self.committed_by = committed_by  # recorded with each commit in the ledger (who committed it)
        self._skips: dict[str, list[OffsetSkip]] = {}
        #: Reports of the other tables the last :meth:`commit_table` committed batches to (a batch's siblings).
        self.also: list[TableCommitReport] = []

    @property
    def catalog(self) -> Catalog:
        if callable(self._catalog) and not isinstance(self._catalog, Catalog):
            self._catalog = self._catalog()
        return self._catalog  # type: ignore[return-value]

    def run(self, tables: list[str] | None = None) -> list[TableCommitReport]:
        """Commit each table's pending entries (``tables``, or every table of the ledger), one table after the other.

        A table that refuses (:data:`TABLE_STOPS`: the catalog refused it, a staged file is gone, the table lost the
        query's batches, a merge is refused, writers kept winning) stops that table (and, on a catalog that commits
        a batch at once, the other tables of the batch it refused on): its report's ``refused`` says why, its
        entries stay pending, and the other tables are still committed. An outage of the catalog or
        the ledger, which no other table would escape, is raised at once.
        """
        reports = []
        for name in dict.fromkeys(tables if tables is not None else self.ledger.tables()):
            report = TableCommitReport(name)
            try:
                self.commit_table(name, report)
            except RUN_STOPS:
                raise
            except TABLE_STOPS as exc:
                report.refused = _first_line(exc)
                log.warning("commits of %s stopped: %s", name, report.refused)
            reports.append(report)
            reports += self.also
        return _merged(reports)

    def commit_table(self, table_name: str, report: TableCommitReport | None = None) -> TableCommitReport:
        """Commit ``table_name``'s pending entries in order into ``report`` (a new one by default); the first that
        cannot be committed raises, leaving it and those after it pending.

        On a catalog with atomic multi-table commits (``outbox.multi_table_commit``), a batch that also has rows
        for other tables (its rejects, its other routes) is committed to all of them in one catalog transaction;
        their reports are in :attr:`also` afterwards. A sibling table's earlier pending batches of the query are
        committed first, so each table still takes its batches in order."""
        report = report if report is not None else TableCommitReport(table_name)
        reports = {table_name: report}
        try:
            self._commit_pending(table_name, reports)
        finally:  # what a batch's other tables got, even when a later batch stopped this table
            self.also = [r for name, r in reports.items() if name != table_name]
        return report

    def _commit_pending(self, table_name: str, reports: dict[str, TableCommitReport]) -> None:
        report = reports[table_name]
        pending = self.ledger.pending(table_name)
        if not pending:
            return
        self._skips = {}
        siblings: dict[tuple[str, int], list[str]] | None = None  # read once the catalog has answered
        tables: dict[str, Table] = {}
        for entry in pending:
            if entry.changes_nothing:
                self.ledger.mark_committed(entry, None, self.committed_by)
                report.empty.append(entry.batch_id)
                continue
            if table_name not in tables:
                tables[table_name] = self._load(table_name)
                fault_point("relay.table_loaded", entry.batch_id)
            if siblings is None:
                siblings = self._pending_siblings(pending)
            batch = [entry, *self._batch_rows_elsewhere(entry, siblings)]
            for other in batch[1:]:
                if any(
                    q == other.query_id and b < other.batch_id and other.table in names
                    for (q, b), names in siblings.items()
                ):
                    self._commit_earlier(other, tables, reports)
            for other in batch[1:]:
                if other.table not in tables:
                    tables[other.table] = self._load(other.table)
            self._commit_batch(tables, batch, reports)

    def _pending_siblings(self, pending: list[OutboxEntry]) -> dict[tuple[str, int], list[str]]:
        """On an atomic catalog: for each pending batch of these entries' pipelines, the tables it is pending in
        (one ledger read per pipeline); empty on a catalog that commits table by table."""
        if multi_table_commits(self.catalog) != ATOMIC:
            return {}
        tables: dict[tuple[str, int], list[str]] = {}
        for pipeline in dict.fromkeys(e.pipeline for e in pending):
            for key in self.ledger.pending_batches(tables=None, pipeline=pipeline):
                tables.setdefault((key.query_id, key.batch_id), []).append(key.table)
        return tables

    def _batch_rows_elsewhere(
        self, entry: OutboxEntry, siblings: dict[tuple[str, int], list[str]]
    ) -> list[OutboxEntry]:
        """The batch's pending entries with rows for other tables (committed with this one, at once)."""
        if not set(siblings.get((entry.query_id, entry.batch_id), ())) - {entry.table}:
            return []
        batch = self.ledger.batch(entry.query_id, entry.batch_id)  # every table's entry of the batch, in one read
        return [
            e
            for table, e in sorted(batch.items())
            if table != entry.table and e.status == PENDING and not e.changes_nothing
        ]

    def _commit_earlier(
        self, entry: OutboxEntry, tables: dict[str, Table], reports: dict[str, TableCommitReport]
    ) -> None:
        """Commit the query's pending batches before ``entry`` in its table, each on its own: there are some only
        where a batch was committed table by table and a crash came between its tables."""
        report = reports.setdefault(entry.table, TableCommitReport(entry.table))
        for earlier in self.ledger.pending(entry.table):
            if earlier.query_id != entry.query_id or earlier.batch_id >= entry.batch_id:
                continue
            if earlier.changes_nothing:
                self.ledger.mark_committed(earlier, None, self.committed_by)
                report.empty.append(earlier.batch_id)
                continue
            if earlier.table not in tables:
                tables[earlier.table] = self._load(earlier.table)
            self._commit_batch(tables, [earlier], reports)

    # ------------------------------------------------------------------------------------ steps

    def _load(self, table_name: str) -> Table:
        deadline = time.monotonic() + CATALOG_RELOAD_BUDGET_S
        attempt = 0
        while True:
            try:
                return self.catalog.load_table(table_name)
            except (NoSuchTableError, NoSuchNamespaceError) as exc:
                raise CatalogRefused(
                    f"table {table_name} is not in the Iceberg catalog at {self.catalog_address} "
                    f"({self._shown(exc)}); its pending entries stay pending: check [iceberg] namespace and the "
                    "catalog's prefix or warehouse, or run krishiv run to create it "
                    + runbook("A catalog that refuses")
                ) from exc
            except KrishivError as exc:
                if not isinstance(exc, CatalogUnavailable) or time.monotonic() >= deadline:
                    raise  # a refusal, a missing ${VARIABLE}; or the catalog did not come back
            except RESTError as exc:
                status = http_status(exc)
                if status in REFUSED_STATUSES:
                    raise CatalogRefused(
                        f"Iceberg catalog at {self.catalog_address} refused to load table {table_name} "
                        f"(HTTP {status}): {self._shown(exc)}{refusal_hint(status)}; pending entries stay pending "
                        + runbook("A catalog that refuses")
                    ) from exc
                self._give_up_after(deadline, table_name, exc)
            except Exception as exc:
                self._give_up_after(deadline, table_name, exc)
            time.sleep(_backoff(attempt))
            attempt += 1

    def _give_up_after(self, deadline: float, table_name: str, exc: Exception) -> None:
        if time.monotonic() >= deadline:
            raise CatalogUnavailable(
                f"Iceberg catalog at {self.catalog_address} did not answer for {CATALOG_RELOAD_BUDGET_S:.0f}s "
                f"while loading {table_name}: {self._shown(exc)}; pending entries stay pending"
            ) from exc

    def _shown(self, exc: BaseException) -> str:
        """``exc`` in a few words, with the catalog's secrets masked when the catalog was built."""
        text = failure_reason(exc)
        if isinstance(self._catalog, Catalog):
            text = masked(text, self._catalog.properties, str(self._catalog.properties.get("uri", "")))
        return text

    def _found(self, table: Table, entry: OutboxEntry) -> tuple[Table, int | None]:
        """The table (reloaded if another committer got there after it was loaded) and the snapshot that holds
        ``entry`` in it, or None."""
        found = find_committed(table, entry)
        if found is None:
            fresh = self._fail_closed(table, entry)
            if fresh is not None:  # another committer got there after this one loaded the table: check again
                table, found = fresh, find_committed(fresh, entry)
        return table, found

    def _commit_batch(
        self, tables: dict[str, Table], batch: list[OutboxEntry], reports: dict[str, TableCommitReport]
    ) -> None:
        """Commit one batch's entries (one per table, the same query and batch id): each found already in its
        table is marked; the others are committed at once, in one catalog transaction when there are several
        (``outbox.multi_table_commit``), then marked. ``tables`` is updated with each table as committed."""
        conflicts = ambiguous = 0
        batch_id = batch[0].batch_id
        while True:
            todo = []
            for entry in batch:
                report = reports.setdefault(entry.table, TableCommitReport(entry.table))
                tables[entry.table], found = self._found(tables[entry.table], entry)
                if found is None:
                    todo.append(entry)
                    continue
                self.ledger.mark_committed(entry, None if found == _EXPIRED else found, self.committed_by)
                report.recovered.append(entry.batch_id)
            if not todo:
                return
            started = time.perf_counter()
            try:
                for entry in todo:
                    if entry.schema_change is not None:  # the stager may have died between the record and the change
                        change = SchemaChange.from_json(entry.schema_change)
                        tables[entry.table] = bring_to_staged_schema(
                            tables[entry.table], change, entry.table, f"batch {entry.batch_id}"
                        )
                fault_point("relay.before_catalog_commit", batch_id)
                self._commit_at_once(tables, todo)
                fault_point("relay.after_catalog_commit", batch_id)
            except CommitFailedException as exc:
                conflicts += 1
                names = ", ".join(e.table for e in todo)
                if conflicts > MAX_CONFLICT_RETRIES:
                    raise CommitConflict(
                        f"{names} batch {batch_id}: {MAX_CONFLICT_RETRIES} commits lost to concurrent "
                        f"writers; the entry stays pending: {exc}"
                    ) from exc
                log.info("commit of %s batch %s conflicted (%s); re-checking", names, batch_id, self._shown(exc))
                time.sleep(_backoff(conflicts))
                for entry in todo:
                    tables[entry.table] = self._load(entry.table)
                continue
            except KrishivError:
                raise  # refused before the catalog was called (a staged file missing, a merge key null): certain
            except Exception as exc:
                names = ", ".join(e.table for e in todo)
                if isinstance(exc, RESTError) and http_status(exc) in REFUSED_STATUSES:
                    raise CatalogRefused(
                        f"Iceberg catalog at {self.catalog_address} refused the commit of {names} batch "
                        f"{batch_id} (HTTP {http_status(exc)}): {self._shown(exc)}; the entry stays pending "
                        + runbook("A catalog that refuses")
                    ) from exc
                ambiguous += 1
                if ambiguous > MAX_AMBIGUOUS_RECHECKS:
                    raise CatalogUnavailable(
                        f"Iceberg catalog at {self.catalog_address}: the commit of {names} batch "
                        f"{batch_id} had an unknown outcome {ambiguous} times, each reload showing it not "
                        f"committed (last: {type(exc).__name__}: {self._shown(exc)}); the entry stays pending and "
                        "the next krishiv commit checks the table for it first"
                    ) from exc
                log.warning(
                    "commit of %s batch %s has an unknown outcome (%s: %s); reloading to check",
                    names,
                    batch_id,
                    type(exc).__name__,
                    self._shown(exc),
                )
                time.sleep(_backoff(ambiguous))
                for entry in todo:
                    tables[entry.table] = self._load(entry.table)
                continue
            commit_ms = (time.perf_counter() - started) * 1000
            for entry in todo:
                report = reports[entry.table]
                report.commit_latencies_ms.append(commit_ms)
                self.ledger.mark_committed(entry, entry.intended_snapshot_id, self.committed_by, commit_ms)
                report.committed.append(entry.batch_id)
                report.snapshot_ids.append(entry.intended_snapshot_id)
                report.records += entry.record_count
            return

    def _commit_at_once(self, tables: dict[str, Table], entries: list[OutboxEntry]) -> None:
        """One snapshot per entry's table; several in one catalog transaction."""

        def summary(entry: OutboxEntry, table: Table) -> tuple[dict[str, str], dict[str, str]]:
            return snapshot_summary(entry, self._skips_since(table, entry)), {
                high_water_property(entry.query_id): str(entry.batch_id)
            }

        if len(entries) == 1:
            (entry,) = entries
            tables[entry.table] = commit_entry(tables[entry.table], entry, *summary(entry, tables[entry.table]))
            return
        deferred = DeferredCommits(self.catalog)
        for entry in entries:
            commit_entry(deferred.table(tables[entry.table]), entry, *summary(entry, tables[entry.table]))
        committed = commit_atomically(self.catalog, list(deferred.commits.values()), entries[0].batch_id)  # type: ignore[arg-type]
        for entry in entries:
            tables[entry.table] = committed[tables[entry.table].name()]

    def _skips_since(self, table: Table, entry: OutboxEntry) -> list[OffsetSkip]:
        """The operator's skips applied by batches of the query after its last snapshot in ``table``, up to this
        one's: the snapshot that publishes them says so."""
        if entry.query_id not in self._skips:
            self._skips[entry.query_id] = self.ledger.skips(entry.query_id)
        previous = int(table.properties.get(high_water_property(entry.query_id), -1))
        return [
            s
            for s in self._skips[entry.query_id]
            if s.applied_batch_id is not None and previous < s.applied_batch_id <= entry.batch_id
        ]

    def _fail_closed(self, table: Table, entry: OutboxEntry) -> Table | None:
        """Refuse to append a batch of a query the table has no trace of while the ledger says some of its
        batches are in it: appending would duplicate them (or build on a table that lost them).

        ``table`` may be older than the ledger read: another committer (``krishiv commit`` beside a running
        committer, a Dagster commit run) may have committed and marked the query's first batches after this one
        loaded it. So the table is reloaded first; if the fresh table shows the query, it is returned for the
        caller to look for the batch again. Only a fresh table with no trace is refused."""
        if shows_query(table, entry.query_id):
            return None
        committed = self.ledger.last_committed_batch(entry.query_id, entry.table)
        if committed is None:
            return None
        fresh = self._load(entry.table)
        if shows_query(fresh, entry.query_id):
            return fresh
        raise CommittedBatchesMissing(
            f"{entry.table} shows no trace of query {entry.query_id} (no krishiv.high-water property, no "
            f"snapshot), but ledger {self.ledger.path} holds its batches up to {committed} as COMMITTED; the "
            "table was dropped, re-created or restored from an older copy. Refusing to append batch "
            f"{entry.batch_id}; restore the table, or start over in a new table under a new pipeline name "
            + runbook("A catalog that is missing")
        )
