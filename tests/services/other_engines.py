"""Iceberg readers written by others, in a virtualenv of their own, so their dependencies never reach ``.venv``.

The engines a user reads Krishiv's tables with: polars (``polars[iceberg]``: its native Parquet reader, with scans
planned by its ``polars-iceberg`` plugin or by pyiceberg), DuckDB with its Iceberg extension from PyPI, and daft. The
virtualenv is made once, with the uv beside this interpreter, under pytest's cache folder, named after the Python
and the pinned packages (so a change of either makes a new one); pytest-xdist workers that make it at the same time
each build their own copy and the first to finish keeps its. :meth:`OtherEngines.read` runs
``tests/services/engine_reader.py`` with that virtualenv's Python and returns each engine's rows as Arrow tables.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

#: Pinned, so a new release cannot change what the tests check; DuckDB's extensions are built for one DuckDB.
PACKAGES = (
    "polars[iceberg]==2.1.0",
    "polars-iceberg==0.1.0",
    "pyiceberg==0.12.0",
    "pyarrow==25.0.1",  # daft 0.7.26 takes pyarrow < 26
    "duckdb==1.5.5",
    "duckdb-extension-iceberg==1.5.5",
    "duckdb-extension-avro==1.5.5",
    "daft==0.7.26",
)
#: The engines ``engine_reader.py`` reads with: polars' native reader planned by its plugin and by pyiceberg (each
#: told to fail rather than fall back to reading with pyiceberg), DuckDB's ``iceberg_scan`` and daft's reader.
ENGINES = ("polars-plugin", "polars-pyiceberg", "duckdb", "daft")
READER = Path(__file__).with_name("engine_reader.py")
INSTALL_TIMEOUT_S = 600.0
READ_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class OtherEngines:
    python: Path  # the virtualenv's interpreter

    def read(
        self, tables: Mapping[str, str], folder: Path, engines: tuple[str, ...] = ENGINES
    ) -> dict[str, dict[str, pa.Table]]:
        """The rows of each table (name -> its metadata file's location) as each of ``engines`` reads them:
        name -> engine -> rows, in one process; ``folder`` receives a Parquet file per table and engine."""
        self._run(str(folder), *engines, *(f"{n}={m}" for n, m in tables.items()))
        return {n: {e: pq.read_table(folder / n / f"{e}.parquet") for e in engines} for n in tables}

    def duckdb_sql(self, statements: Sequence[str], out: Path) -> pa.Table:
        """The rows of the last of ``statements``, run in one DuckDB connection with its Iceberg extension loaded
        (``out`` receives them as Parquet)."""
        self._run("--sql", str(out), *statements)
        return pq.read_table(out)

    def _run(self, *arguments: str) -> None:
        done = subprocess.run(
            [str(self.python), str(READER), *arguments],
            capture_output=True,
            text=True,
            timeout=READ_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
            env={k: v for k, v in os.environ.items() if not k.startswith(("POLARS_", "PYICEBERG_", "VIRTUAL_ENV"))},
        )
        assert done.returncode == 0, f"{READER.name} failed:\n{done.stdout}\n{done.stderr}"


@pytest.fixture(scope="session")
def other_engines(request: pytest.FixtureRequest) -> OtherEngines:
    uv = Path(sys.executable).with_name("uv")
    if not uv.exists():
        pytest.fail(f"uv is not installed beside {sys.executable}; run scripts/setup.sh")
    key = hashlib.sha256("\n".join([sys.version, *PACKAGES]).encode()).hexdigest()[:16]
    root = request.config.cache.mkdir("other-engines")
    venv = root / key
    if not (venv / "ready").exists():
        building = root / f"{key}.{uuid.uuid4().hex[:8]}"
        try:
            for command in (
                [str(uv), "venv", "--quiet", "--python", sys.executable, str(building)],
                [str(uv), "pip", "install", "--quiet", "--python", str(building / "bin" / "python"), *PACKAGES],
            ):
                done = subprocess.run(command, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
                if done.returncode != 0:
                    pytest.fail(f"{' '.join(command[:3])} failed: {done.stderr.strip()}")
            (building / "ready").touch()
            with contextlib.suppress(OSError):  # another worker's copy is there already
                building.rename(venv)
        finally:
            shutil.rmtree(building, ignore_errors=True)
    return OtherEngines(venv / "bin" / "python")
