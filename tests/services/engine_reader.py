"""Read Iceberg tables with engines written by others, as a user would.

Run by ``tests/services/other_engines.py`` with the Python of the engines' own virtualenv (it imports nothing of
Krishiv's): ``python engine_reader.py FOLDER ENGINE... NAME=METADATA_LOCATION...`` writes each table's rows as each
engine reads them to ``FOLDER/NAME/ENGINE.parquet``. Each engine reads a table from its metadata file and must
apply its delete files itself:

- ``polars-plugin``: ``pl.scan_iceberg(..., reader_override="native")`` planned by the ``polars-iceberg`` plugin
  (``POLARS_ICEBERG_PLANNER=plugin``: a table the plugin cannot plan fails instead of being planned by pyiceberg);
- ``polars-pyiceberg``: the same reader, the scan planned by pyiceberg (``POLARS_ICEBERG_PLANNER=pyiceberg``);
  ``reader_override="native"`` makes either fail rather than fall back to reading with pyiceberg;
- ``duckdb``: DuckDB's ``iceberg_scan``, its Iceberg and Avro extensions loaded from their PyPI packages.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def read_with_polars(metadata: str, out: Path, planner: str) -> None:
    import polars as pl

    os.environ["POLARS_ICEBERG_PLANNER"] = planner
    pl.scan_iceberg(metadata, reader_override="native").collect().write_parquet(out)


def read_with_duckdb(metadata: str, out: Path) -> None:
    import duckdb
    import duckdb_extension_avro
    import duckdb_extension_iceberg

    connection = duckdb.connect()
    connection.execute("SET autoinstall_known_extensions = false")
    for package in (duckdb_extension_avro, duckdb_extension_iceberg):
        (extension,) = Path(package.__file__).parent.glob("extensions/*/*.duckdb_extension")
        connection.execute(f"LOAD '{extension}'")
    connection.execute(f"COPY (SELECT * FROM iceberg_scan('{metadata}')) TO '{out}' (FORMAT parquet)")


def main(folder: str, *arguments: str) -> None:
    engines = [a for a in arguments if "=" not in a]
    for name, metadata in (a.split("=", 1) for a in arguments if "=" in a):
        (Path(folder) / name).mkdir(parents=True, exist_ok=True)
        for engine in engines:
            out = Path(folder) / name / f"{engine}.parquet"
            if engine == "duckdb":
                read_with_duckdb(metadata, out)
            else:
                read_with_polars(metadata, out, planner=engine.removeprefix("polars-"))


if __name__ == "__main__":
    main(*sys.argv[1:])
