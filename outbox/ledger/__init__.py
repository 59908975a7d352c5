"""The outbox ledger: one DuckDB file recording every staged batch and whether it reached Iceberg.

:class:`Ledger` is the one interface the rest of Krishiv uses; every method is one short transaction on the file.
It is put together from one module per concern, each written against :mod:`outbox.ledger.connection`:

* :mod:`~outbox.ledger.connection`: opening the DuckDB file (locks retried, a file that is no ledger refused),
  transactions and reads, and migrating the file; the only module that calls DuckDB's API.
* :mod:`~outbox.ledger.schema`: the tables, as the migrations that build them.
* :mod:`~outbox.ledger.entries`: recording a batch's entries, marking one committed, reading them back.
* :mod:`~outbox.ledger.queries`: the aggregates and lookups of status, the sensors, the checks and ``verify``.
* :mod:`~outbox.ledger.retention`: folding old committed entries into the archive (``krishiv ledger-compact``).
* :mod:`~outbox.ledger.leases`: the stager lease that fences a pipeline's one running query.
* :mod:`~outbox.ledger.skips`: operator-approved skips over offsets.

Its errors are :mod:`outbox.errors`' (:class:`~outbox.errors.LedgerBusyError`, :class:`~outbox.errors.LedgerCorrupt`,
…). What the hot paths read (sensors, ``krishiv status``, the asset checks) is answered in SQL, never by loading
every entry, and includes the archive that compaction folds COMMITTED entries older than a retention into.
"""

from __future__ import annotations

from outbox.ledger.entries import Entries
from outbox.ledger.leases import Leases
from outbox.ledger.queries import Queries
from outbox.ledger.retention import Retention
from outbox.ledger.skips import OffsetSkips

__all__ = ["Ledger"]


class Ledger(Entries, Queries, Retention, OffsetSkips, Leases):
    """Narrow interface over the ledger file; every method is one short transaction."""
