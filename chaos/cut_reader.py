"""A user's reader beside the pipelines: it takes every table's pointer in ONE read of the catalog's database, as a
query joining the tables would see them, and keeps each table's high-water batch per query at that cut. Checked
afterwards against the ledger: a batch with rows for several tables must be in all of them or in none, in every
observation (PROTOCOL.md, invariant 19)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from pyiceberg.catalog.sql import IcebergTables, SqlCatalog
from pyiceberg.io import load_file_io
from pyiceberg.serializers import FromInputFile
from sqlalchemy import select
from sqlalchemy.orm import Session

from outbox.ledger import Ledger
from outbox.relay import HIGH_WATER_PROPERTY_PREFIX

#: Each observation: per table, per query, the highest batch id the table holds.
Cut = dict[str, dict[str, int]]


@dataclass
class CutReader:
    catalog: SqlCatalog
    cuts: list[Cut] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _marks: dict[str, dict[str, int]] = field(default_factory=dict)  # metadata location -> its high-water marks
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> CutReader:
        self._thread = threading.Thread(target=self._run, name="cut-reader", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.cuts.append(self.read())
            except Exception as exc:  # the catalog's database busy or restarting: the next read tries again
                self.errors.append(f"{type(exc).__name__}: {exc}")
                self._stop.wait(0.05)

    def read(self) -> Cut:
        with Session(self.catalog.engine) as session:
            rows = session.execute(
                select(IcebergTables.table_namespace, IcebergTables.table_name, IcebergTables.metadata_location).where(
                    IcebergTables.catalog_name == self.catalog.name
                )
            ).all()
        return {f"{ns}.{name}": self._marks_of(location) for ns, name, location in rows if location}

    def _marks_of(self, location: str) -> dict[str, int]:
        if location not in self._marks:
            metadata = FromInputFile.table_metadata(load_file_io(location=location).new_input(location))
            prefix = HIGH_WATER_PROPERTY_PREFIX
            self._marks[location] = {
                k[len(prefix) :]: int(v) for k, v in metadata.properties.items() if k.startswith(prefix)
            }
        return self._marks[location]


def half_committed(cuts: list[Cut], ledger: Ledger) -> list[str]:
    """Each observation of a batch in some of its tables and not in others, described."""
    tables_of: dict[tuple[str, int], set[str]] = {}
    for e in ledger.entries():
        if not e.changes_nothing:
            tables_of.setdefault((e.query_id, e.batch_id), set()).add(e.table)
    found = []
    for i, cut in enumerate(cuts):
        for (query, batch), tables in tables_of.items():
            if len(tables) < 2:
                continue
            shown = {t for t in tables if cut.get(t, {}).get(query, -1) >= batch}
            if shown and shown != tables:
                found.append(f"cut {i}: batch {batch} of {query} in {sorted(shown)}, not in {sorted(tables - shown)}")
    return found
