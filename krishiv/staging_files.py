"""Staged files of a pipeline's tables, beyond the happy path: re-staging a batch whose files are gone, and
removing the files no ledger entry or snapshot refers to.

Staged files live beside each table's location (``spark_jobs.staging.staging_root``), where Iceberg's
standard orphan-file removal does not look. Two things can still go wrong with them:

- the files of a PENDING entry are deleted (by hand, by a too-wide cleanup): the relay stops on
  ``StagedFileMissing`` rather than commit a partial batch. ``krishiv restage`` rewinds the pipeline's
  checkpoint to the first such batch and runs the query once: Spark replays the batches from the offsets
  the ledger recorded, and the stager writes the missing files again (same rows, same intended snapshot);
- a stager that died between writing its files and recording them leaves files nothing refers to.
  ``krishiv clean-staging`` deletes staged files that neither a ledger entry nor any snapshot of the table
  refers to, and that are older than a grace period (a stager may be about to record them).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from pyiceberg.io import FileIO

from krishiv_core.errors import KrishivError
from krishiv_core.spec import KrishivSpec, PipelineSpec

#: A staged file younger than this may belong to a batch a live stager is about to record.
DEFAULT_GRACE_S = 3600.0


@dataclass
class Restaged:
    batches: list[int] = field(default_factory=list)  # the batches whose files were missing
    rewound_to: int | None = None  # the first batch Spark replayed


@dataclass
class Cleaned:
    table: str
    kept: int = 0
    young: int = 0  # unreferenced, but within the grace period
    removed: list[str] = field(default_factory=list)
    removed_bytes: int = 0


def _missing_batches(spec: KrishivSpec, pipeline: PipelineSpec) -> list[int]:
    from krishiv.operations import open_ledger
    from krishiv_core.catalog import load_catalog, qualified
    from outbox.relay import find_committed

    catalog, ledger = load_catalog(spec), open_ledger(spec)
    missing: set[int] = set()
    for name in pipeline.all_tables:
        table_name = qualified(spec, name)
        pending = ledger.pending(table_name)
        if not pending:
            continue
        table = catalog.load_table(table_name)
        for entry in pending:
            if all(table.io.new_input(f.path).exists() for f in entry.files):
                continue
            if find_committed(table, entry) is not None:
                raise KrishivError(
                    f"{table_name} already holds batch {entry.batch_id}, whose staged files are gone: the table "
                    "refers to deleted files; restore them from a backup, restaging cannot help"
                )
            missing.add(entry.batch_id)
    return sorted(missing)


def restage(spec: KrishivSpec, pipeline: PipelineSpec) -> Restaged:
    """Stage again every PENDING batch of the pipeline whose files are gone, from the offsets the ledger holds."""
    from krishiv.operations import open_ledger, run_pipelines
    from outbox.lease import stager_lease
    from spark_jobs.checkpoint import Checkpoint
    from spark_jobs.window_state import WindowStateStore

    result = Restaged()
    with stager_lease(open_ledger(spec), pipeline.name, "krishiv restage"):
        result.batches = _missing_batches(spec, pipeline)
        if not result.batches:
            return result
        checkpoint = Checkpoint(spec.checkpoint_dir(pipeline))
        first, last = result.batches[0], checkpoint.last_batch_id()
        if first > last:
            raise KrishivError(f"checkpoint {checkpoint.path} ends at batch {last}, before batch {first}")
        state = WindowStateStore(checkpoint.path)
        if first > 0 and not state.path(first - 1).exists():
            raise KrishivError(
                f"the open windows batch {first} starts from are no longer in {state.folder} (the last batches' "
                f"are kept); batch {first} cannot be computed again"
            )
        checkpoint.rewind(last - first + 1)
        result.rewound_to = first
    run_pipelines(spec, [pipeline], once=True, holder="krishiv restage")
    return result


def _referenced_by_snapshots(table) -> set[str]:
    paths: set[str] = set()
    seen: set[str] = set()
    for snapshot in table.snapshots():
        for manifest in snapshot.manifests(table.io):
            if manifest.manifest_path in seen:
                continue
            seen.add(manifest.manifest_path)
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False):
                paths.add(entry.data_file.file_path)
    return paths


def _listing(io: FileIO, root: str) -> list[tuple[str, float, int]]:
    """(path as the FileIO names it, modification time, size) of every file below ``root``.

    Listed through the table's own FileIO (its endpoint, region and keys: an ``s3://`` root is listed where the
    files were written, never at the public AWS host the default S3 filesystem would ask).
    """
    from pyarrow import fs
    from pyiceberg.io.pyarrow import PyArrowFileIO

    if not isinstance(io, PyArrowFileIO):
        raise KrishivError(
            f"clean-staging lists {root} through pyiceberg's PyArrowFileIO, but the table's FileIO is "
            f"{type(io).__name__}; remove py-io-impl from [iceberg.properties] to clean staged files"
        )
    scheme, netloc, base = io.parse_location(root, io.properties)
    filesystem = io.fs_by_scheme(scheme, netloc)
    infos = filesystem.get_file_info(fs.FileSelector(base, recursive=True, allow_not_found=True))
    prefix = root[: len(root) - len(base)] if root.endswith(base) else ""
    return [
        (prefix + info.path, info.mtime.timestamp() if info.mtime else 0.0, info.size or 0)
        for info in infos
        if info.type == fs.FileType.File
    ]


def clean_staging(
    spec: KrishivSpec, pipeline: PipelineSpec, grace_s: float = DEFAULT_GRACE_S, dry_run: bool = False
) -> list[Cleaned]:
    """Delete the pipeline's staged files that no ledger entry and no snapshot refers to, older than ``grace_s``."""
    from krishiv.operations import open_ledger
    from krishiv_core.catalog import load_catalog, qualified
    from spark_jobs.staging import staging_root

    catalog, ledger = load_catalog(spec), open_ledger(spec)
    now = time.time()
    results = []
    for name in pipeline.all_tables:
        table_name = qualified(spec, name)
        table = catalog.load_table(table_name)
        cleaned = Cleaned(table_name)
        listing = _listing(table.io, staging_root(table))
        if listing:
            referenced = ledger.staged_paths(table_name) | _referenced_by_snapshots(table)
            for path, mtime, size in listing:
                if path in referenced:
                    cleaned.kept += 1
                elif now - mtime < grace_s:
                    cleaned.young += 1
                else:
                    if not dry_run:
                        table.io.delete(path)
                    cleaned.removed.append(path)
                    cleaned.removed_bytes += size
        results.append(cleaned)
    return results
