"""Reading a Krishiv table from a downstream asset of one's own, at the snapshot Dagster shows as committed.

A user's asset that depends on a table asset (``deps=[dg.AssetKey(["iceberg", namespace, table])]``) runs after a
commit materialized that table; :func:`committed_table` then reads the table as of that materialization, not as of
whatever a committer added since, so the asset's result matches the materialization that triggered it (and the
checks evaluated on it). docs/dagster.md has the example.

dagster-iceberg's IO manager reads a table's current snapshot only, and its current release (0.3.14) requires a
pyiceberg older than the 0.12 Krishiv pins; the component's ``iceberg`` resource
(:class:`krishiv_assets.resources.IcebergCatalogResource`) gives the same pyiceberg catalog the commits go to.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import dagster as dg

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.expressions import BooleanExpression

    from krishiv_assets.resources import IcebergCatalogResource

#: How many of a table's newest materializations are searched for the last one that published a snapshot (the ones
#: between are batches that published nothing, which leave the table as it was).
MATERIALIZATIONS_SEARCHED = 100
_NO_SNAPSHOT = ("", "none")


def committed_snapshot_id(instance: dg.DagsterInstance, key: dg.AssetKey) -> int | None:
    """The snapshot of table asset ``key`` as of its latest materialization: the newest snapshot a commit run
    (``current_snapshot_id``) or a reported commit (``snapshot_id``) named; None if none of its newest
    :data:`MATERIALIZATIONS_SEARCHED` materializations did (the table's current snapshot is then read)."""
    records = instance.fetch_materializations(key, limit=MATERIALIZATIONS_SEARCHED).records  # newest first
    for record in records:
        materialization = record.asset_materialization
        metadata = materialization.metadata if materialization else {}
        for label in ("current_snapshot_id", "snapshot_id"):
            entry = metadata.get(label)
            text = str(entry.value) if entry is not None else ""
            if text not in _NO_SNAPSHOT:
                return int(text)
    return None


def committed_table(
    context: dg.AssetExecutionContext,
    iceberg: IcebergCatalogResource,
    key: dg.AssetKey,
    row_filter: str | BooleanExpression = "True",
    selected_fields: tuple[str, ...] = ("*",),
) -> pa.Table:
    """The rows of table asset ``key`` (``iceberg/<namespace>/<table>``) as of its latest materialization, read with
    pyiceberg through the ``iceberg`` resource (an upsert table's deletes applied); ``row_filter`` and
    ``selected_fields`` as pyiceberg's ``Table.scan`` takes them."""
    if len(key.path) != 3 or key.path[0] != "iceberg":
        raise dg.Failure(
            description=f"{key.to_user_string()} is not a Krishiv table asset (iceberg/<namespace>/<table>)"
        )
    table = iceberg.catalog().load_table(".".join(key.path[1:]))
    snapshot = committed_snapshot_id(context.instance, key)
    context.log.info(f"reading {key.to_user_string()} at snapshot {snapshot if snapshot is not None else 'current'}")
    return table.scan(row_filter=row_filter, selected_fields=selected_fields, snapshot_id=snapshot).to_arrow()
