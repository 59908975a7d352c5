"""A field inside struct columns of an Arrow table, by its dotted path (``meta.ts``: field ``ts`` of column ``meta``).

The spec names fields inside structs by their dotted paths (docs/spec.md, "Paths in keys"); the relay's merge and
the partition values read such a field's values out of the table's struct columns. A column whose own name is the
path wins (a flat table keyed by paths, as the merge builds them); a null struct on the way gives a null.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc


def column_at(rows: pa.Table, path: str) -> pa.ChunkedArray:
    """The values at ``path`` in ``rows``: the column of that name, else the field reached through its structs."""
    if path in rows.column_names:
        return rows.column(path)
    top, *inner = path.split(".")
    column = rows.column(top)  # KeyError when the table has no such column
    for name in inner:
        column = pc.struct_field(column, name)
    return column


def flat_table(rows: pa.Table, paths: list[str]) -> pa.Table:
    """A table of the values at each of ``paths``, one column named by its path."""
    return pa.table([column_at(rows, p) for p in paths], names=list(paths))


def top_level(paths: list[str]) -> list[str]:
    """The top-level columns holding ``paths``, each once, in order (``device`` of ``device.id``)."""
    return list(dict.fromkeys(p.split(".", 1)[0] for p in paths))
