"""Staged files written by the Spark tasks themselves, so a batch's rows never pass through the driver.

Raw events and upserts arrive at full Kafka throughput: collecting a batch to the driver would make its memory
grow with the batch. :func:`write_in_tasks` runs ``mapInArrow`` over the batch: each task splits its rows by
target (a route's table, or an upsert's data and delete-key files), writes them with
:func:`krishiv_core.parquet_files.write_staged_files` through a FileIO rebuilt from the table's properties, and
returns one small row per file written. Only those rows (path, records, bytes, content) reach the driver, for
the outbox entry. A target is chosen by the string value of one column, which is not written.

Each task writes files of fresh names, so a task retried by Spark leaves the files of its failed attempt
unreferenced; they are removed with the rest of the batch's unreferenced files (``krishiv clean-staging``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyspark.sql import DataFrame

from krishiv_core.entries import DATA, StagedFile
from krishiv_core.parquet_files import load_io, write_staged_files

FILES_SCHEMA = "target string, path string, records bigint, bytes bigint, content string"
_FILES_ARROW = pa.schema(
    [
        ("target", pa.string()),
        ("path", pa.string()),
        ("records", pa.int64()),
        ("bytes", pa.int64()),
        ("content", pa.string()),
    ]
)


@dataclass(frozen=True)
class WriteTarget:
    """Where the rows whose target column equals ``name`` go: a table's FileIO, schema, partitioning and folder."""

    name: str
    #: The table's FileIO properties, resolved secrets included (an S3 secret key, a vended credential): the tasks
    #: rebuild the FileIO from them, since an executor has neither the spec nor its environment. Kept out of repr.
    io_properties: dict[str, str] = field(repr=False)
    location: str
    schema_json: str
    spec_json: str
    folder: str
    content: str = DATA
    columns: tuple[str, ...] = field(default=())  # the columns written; all of the schema's if empty

    @classmethod
    def of(
        cls, name: str, table: Table, folder: str, *, content: str = DATA, schema: Schema | None = None
    ) -> WriteTarget:
        schema = schema if schema is not None else table.schema()
        spec = table.spec() if content == DATA else PartitionSpec()  # delete keys: one file per task
        return cls(
            name,
            dict(table.io.properties),
            table.location(),
            schema.model_dump_json(),
            spec.model_dump_json(),
            folder,
            content,
            tuple(f.name for f in schema.fields),
        )


def _write_task(targets: Sequence[WriteTarget], target_column: str):
    """The function each task runs: write its rows per target, yield one row per file."""

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        # A task whose rows were all rejects (or tombstones of another task's keys, or none at all) gets no batch:
        # it writes nothing and says so with an empty row set, never an error.
        received = list(batches)
        rows = pa.Table.from_batches(received) if received else None
        out: list[dict[str, object]] = []
        if rows is not None and rows.num_rows:
            for target in targets:
                mine = rows.filter(pc.equal(rows.column(target_column), target.name))
                if not mine.num_rows:
                    continue
                schema = Schema.model_validate_json(target.schema_json)
                spec = PartitionSpec.model_validate_json(target.spec_json)
                io = load_io(target.io_properties, target.location)
                for f in write_staged_files(
                    io, schema, spec, mine.select(list(target.columns)), target.folder, target.content
                ):
                    out.append(
                        {
                            "target": target.name,
                            "path": f.path,
                            "records": f.records,
                            "bytes": f.bytes,
                            "content": f.content,
                        }
                    )
        yield pa.RecordBatch.from_pylist(out, schema=_FILES_ARROW)

    return write


def write_in_tasks(
    rows: DataFrame, targets: Sequence[WriteTarget], target_column: str
) -> dict[str, tuple[StagedFile, ...]]:
    """Write ``rows`` in the Spark tasks, each row to the target its ``target_column`` names; the files by target.

    A row whose target is not among ``targets`` is not written (the caller routes every row to one).
    """
    written = rows.mapInArrow(_write_task(list(targets), target_column), FILES_SCHEMA).toArrow()
    files: dict[str, list[StagedFile]] = {t.name: [] for t in targets}
    for row in written.to_pylist():
        files[row["target"]].append(StagedFile(row["path"], row["records"], row["bytes"], row["content"]))
    return {name: tuple(sorted(found, key=lambda f: f.path)) for name, found in files.items()}
