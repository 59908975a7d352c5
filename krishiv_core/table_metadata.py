"""pyiceberg's table-metadata update without its closing deep copy of the whole history.

pyiceberg 0.12's ``update_table_metadata`` ends every call with ``model_copy(deep=True)`` of the result. A commit
computes it about three times (twice in the transaction, once in the catalog), and at 1,000 snapshots those deep
copies were most of a commit's time in ``krishiv bench``. The copy protects nothing: every update handler builds
new lists and dicts and copies models with ``model_copy(update=...)``, and pyiceberg's models are frozen, so a
snapshot shared between the old and the new metadata is never changed in place.

:func:`updated_metadata` runs pyiceberg's own handlers (private: ``_apply_table_update``, its context and the
metadata-log update), so every update keeps pyiceberg's checks and semantics;
``tests/krishiv_core/test_sql_catalog.py`` pins that its result equals pyiceberg's, and breaks if those names go.
"""

from __future__ import annotations

from datetime import datetime

from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.update import (
    TableUpdate,
    _apply_table_update,
    _TableMetadataUpdateContext,
    _update_table_metadata_log,
)
from pyiceberg.utils.datetime import datetime_to_millis


def updated_metadata(
    base: TableMetadata, updates: tuple[TableUpdate, ...], metadata_location: str | None = None
) -> TableMetadata:
    """``base`` with ``updates`` applied, as pyiceberg 0.12's ``update_table_metadata`` computes it for an existing
    table (the handlers, a metadata-log entry for ``metadata_location``, the last-updated time, the partition spec
    and sort order checks), without the deep copy: what did not change is shared with ``base``."""
    context = _TableMetadataUpdateContext()
    new = base
    for update in updates:
        new = _apply_table_update(update, new, context)
    if context.has_changes():
        if metadata_location:
            new = _update_table_metadata_log(new, metadata_location, base.last_updated_ms)
        if base.last_updated_ms == new.last_updated_ms:
            new = new.model_copy(update={"last_updated_ms": datetime_to_millis(datetime.now().astimezone())})
    new.spec().check_compatible(new.schema())
    new.sort_order().check_compatible(new.schema())
    return new
