"""Staged files of a pipeline's tables, beyond the happy path: re-staging a batch whose files are gone, and
removing the files no ledger entry or snapshot refers to.

Staged files live beside each table's location (``spark_jobs.staging.staging_root``), where Iceberg's
standard orphan-file removal does not look. Two things can still go wrong with them:

- the files of a PENDING entry are deleted (by hand, by a too-wide cleanup): the relay stops on
  ``StagedFileMissing`` rather than commit a partial batch. ``krishiv restage`` rewinds the pipeline's
  checkpoint to the first such batch and runs the query once: Spark replays the batches from the offsets
  the ledger recorded, and the stager writes the missing files again (same rows, same intended snapshot);
- a stager that died between writing its files and recording them leaves files nothing refers to.
  ``krishiv clean-staging`` deletes staged files that neither a PENDING ledger entry nor any retained snapshot
  of the table refers to, and that are older than a grace period (a stager may be about to record them): the
  orphan removal of ``outbox.orphans``, limited to the staging folders. While the pipeline's stager holds its
  lease, the files of the batches it may still be writing are kept, however old
  (:func:`outbox.orphans.in_flight_files`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from krishiv_core.errors import KrishivError
from krishiv_core.runbook import runbook
from krishiv_core.spec import KrishivSpec, PipelineSpec

#: The runbook section of a pending batch whose staged files are gone.
GONE = runbook("A staged file that is gone")

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
                    f"refers to deleted files; restore them from a backup, restaging cannot help {GONE}"
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
            raise KrishivError(
                f"checkpoint {checkpoint.path} ends at batch {last}, before batch {first} "
                + runbook("A checkpoint that does not match its ledger")
            )
        state = WindowStateStore(checkpoint.path)
        if first > 0 and not state.path(first - 1).exists():
            raise KrishivError(
                f"the open windows batch {first} starts from are no longer in {state.folder} (the last batches' "
                f"are kept); batch {first} cannot be computed again {GONE}"
            )
        checkpoint.rewind(last - first + 1)
        result.rewound_to = first
    run_pipelines(spec, [pipeline], once=True, holder="krishiv restage")
    return result


def clean_staging(
    spec: KrishivSpec,
    pipeline: PipelineSpec,
    grace_s: float = DEFAULT_GRACE_S,
    dry_run: bool = False,
    force: bool = False,
) -> list[Cleaned]:
    """Delete the pipeline's staged files that neither a PENDING entry nor a retained snapshot refers to, older
    than ``grace_s`` (below the floor only with ``force``): ``outbox.orphans`` limited to the staging folders
    (``krishiv remove-orphans`` does the table locations too)."""
    from krishiv.operations import open_ledger
    from krishiv_core.catalog import load_catalog, qualified
    from outbox.orphans import in_flight_files, remove_orphans, staging_root

    catalog, ledger = load_catalog(spec), open_ledger(spec)
    results = []
    for name in pipeline.all_tables:
        table_name = qualified(spec, name)
        root = staging_root(catalog.load_table(table_name))
        if root is None:  # a table at a bucket's root: never staged for
            results.append(Cleaned(table_name))
            continue
        report = remove_orphans(
            lambda t=table_name: catalog.load_table(t),
            lambda t=table_name: [f.path for e in ledger.pending(t) for f in e.files],
            grace_s=grace_s,
            roots=[root],
            dry_run=dry_run,
            force=force,
            in_flight=lambda t=table_name: in_flight_files(ledger, pipeline.name, t),
        )
        results.append(Cleaned(table_name, report.referenced, report.young, report.removed, report.removed_bytes))
    return results
