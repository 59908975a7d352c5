"""Getting a stuck or damaged pipeline going again: ``krishiv skip-offsets`` (past offsets a query cannot read,
recorded in the ledger) and ``krishiv restage`` (pending batches whose staged files are gone, staged again)."""

from __future__ import annotations

import argparse

from krishiv.commands.common import console
from krishiv_core.spec import KrishivSpec


def cmd_skip_offsets(args: argparse.Namespace, spec: KrishivSpec) -> int:
    from krishiv.offsets import skip_offsets

    skip = skip_offsets(spec, spec.pipeline(args.pipeline), args.partition, args.to, args.reason, args.topic)
    console.print(
        f"recorded in the ledger: {skip.topic} partition {skip.partition} of query {skip.query_id} moves from offset "
        f"{skip.from_offset} to {skip.to_offset} ({skip.reason}; by {skip.operator}); the next batch reads from "
        "there, and the snapshot that publishes it names the skip"
    )
    return 0


def cmd_restage(args: argparse.Namespace, spec: KrishivSpec) -> int:
    from krishiv.operations import open_existing_ledger
    from krishiv.staging_files import restage

    pipeline = spec.pipeline(args.pipeline)
    open_existing_ledger(spec)  # a mistyped ledger path is an error, not "nothing to restage"
    result = restage(spec, pipeline)
    if not result.batches:
        console.print(f"{pipeline.name}: every pending batch still has its staged files; nothing to restage")
    else:
        console.print(
            f"{pipeline.name}: staged batches {result.batches} again (Spark replayed from batch {result.rewound_to} "
            "with the offsets the ledger recorded); `krishiv commit` publishes them"
        )
    return 0
