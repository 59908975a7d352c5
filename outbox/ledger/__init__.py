"""The outbox ledger: a DuckDB file or a PostgreSQL schema recording every staged batch and whether it reached Iceberg.

:class:`Ledger` is the one interface the rest of Krishiv uses; every method is one short transaction. It is put
together from one module per concern, each written against :mod:`outbox.ledger.connection`:

* :mod:`~outbox.ledger.connection`: the database chosen by the ledger's location, transactions and reads, and
  migrating it; under it :mod:`~outbox.ledger.duckdb_file` (the only module calling DuckDB's API: locks retried,
  a file that is no ledger refused) and :mod:`~outbox.ledger.postgres` (the only one calling psycopg), with
  :mod:`~outbox.ledger.dialect` for the SQL they spell apart.
* :mod:`~outbox.ledger.schema`: the tables, as the migrations that build them (in both databases' DDL).
* :mod:`~outbox.ledger.entries`: recording a batch's entries, marking one committed, reading them back.
* :mod:`~outbox.ledger.queries`: the aggregates and lookups of status, the sensors, the checks and ``verify``.
* :mod:`~outbox.ledger.retention`: folding old committed entries into the archive (``krishiv ledger-compact``).
* :mod:`~outbox.ledger.leases`: the stager lease that fences a pipeline's one running query.
* :mod:`~outbox.ledger.skips`: operator-approved skips over offsets.
* :mod:`~outbox.ledger.copying`: copying the ledger into another database (``krishiv ledger-copy``).

Its errors are :mod:`outbox.errors`' (:class:`~outbox.errors.LedgerBusyError`, :class:`~outbox.errors.LedgerCorrupt`,
…). What the hot paths read (sensors, ``krishiv status``, the asset checks) is answered in SQL, never by loading
every entry, and includes the archive that compaction folds COMMITTED entries older than a retention into.
"""

from __future__ import annotations

from outbox.ledger.copying import Copying
from outbox.ledger.entries import Entries
from outbox.ledger.leases import Leases
from outbox.ledger.queries import Queries
from outbox.ledger.retention import Retention
from outbox.ledger.skips import OffsetSkips

__all__ = ["Ledger"]


class Ledger(Entries, Queries, Retention, OffsetSkips, Leases, Copying):
    """Narrow interface over the ledger's database; every method is one short transaction."""
