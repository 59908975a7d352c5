"""Read Iceberg tables with engines written by others, as a user would.

Run by ``tests/services/other_engines.py`` with the Python of the engines' own virtualenv (it imports nothing of
Krishiv's): ``python engine_reader.py FOLDER ENGINE... NAME=METADATA_LOCATION...`` writes each table's rows as each
engine reads them to ``FOLDER/NAME/ENGINE.parquet``. Each engine reads a table from its metadata file and must
apply its delete files itself:

- ``polars-plugin``: ``pl.scan_iceberg(..., reader_override="native")`` planned by the ``polars-iceberg`` plugin
  (``POLARS_ICEBERG_PLANNER=plugin``: a table the plugin cannot plan fails instead of being planned by pyiceberg);
- ``polars-pyiceberg``: the same reader, the scan planned by pyiceberg (``POLARS_ICEBERG_PLANNER=pyiceberg``);
  ``reader_override="native"`` makes either fail rather than fall back to reading with pyiceberg;
- ``duckdb``: DuckDB's ``iceberg_scan``, its Iceberg and Avro extensions loaded from their PyPI packages;
- ``daft``: ``daft.read_iceberg`` of the table pyiceberg reads from the metadata file (daft plans with pyiceberg
  and reads the files, deletes applied, with its own reader).

``python engine_reader.py --sql OUT STATEMENT...`` runs each statement in one DuckDB connection with the Iceberg
extension loaded and writes the last one's rows to OUT (the queries the docs show, as written there).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def read_with_polars(metadata: str, out: Path, planner: str) -> None:
    import polars as pl

    os.environ["POLARS_ICEBERG_PLANNER"] = planner
    pl.scan_iceberg(metadata, reader_override="native").collect().write_parquet(out)


def duckdb_with_iceberg():  # type: ignore[no-untyped-def]
    import duckdb
    import duckdb_extension_avro
    import duckdb_extension_iceberg

    connection = duckdb.connect()
    connection.execute("SET autoinstall_known_extensions = false")
    for package in (duckdb_extension_avro, duckdb_extension_iceberg):
        (extension,) = Path(package.__file__).parent.glob("extensions/*/*.duckdb_extension")
        connection.execute(f"LOAD '{extension}'")
    return connection


def read_with_duckdb(metadata: str, out: Path) -> None:
    connection = duckdb_with_iceberg()
    connection.execute(f"COPY (SELECT * FROM iceberg_scan('{metadata}')) TO '{out}' (FORMAT parquet)")


def read_with_daft(metadata: str, out: Path) -> None:
    import daft
    import pyarrow.parquet as pq
    from pyiceberg.table import StaticTable

    pq.write_table(daft.read_iceberg(StaticTable.from_metadata(metadata)).to_arrow(), out)


def run_sql(out: str, *statements: str) -> None:
    import pyarrow.parquet as pq

    connection = duckdb_with_iceberg()
    result = None
    for statement in statements:
        result = connection.sql(statement)
    assert result is not None, "no statement"
    pq.write_table(result.arrow().read_all(), out)


def main(folder: str, *arguments: str) -> None:
    if folder == "--sql":
        run_sql(*arguments)
        return
    engines = [a for a in arguments if "=" not in a]
    for name, metadata in (a.split("=", 1) for a in arguments if "=" in a):
        (Path(folder) / name).mkdir(parents=True, exist_ok=True)
        for engine in engines:
            out = Path(folder) / name / f"{engine}.parquet"
            if engine == "duckdb":
                read_with_duckdb(metadata, out)
            elif engine == "daft":
                read_with_daft(metadata, out)
            else:
                read_with_polars(metadata, out, planner=engine.removeprefix("polars-"))


if __name__ == "__main__":
    main(*sys.argv[1:])
