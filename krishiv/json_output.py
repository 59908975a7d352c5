"""The machine-readable output of ``status``, ``verify``, ``lineage`` and ``check`` (``--json``): one JSON document
on stdout.

Each document has ``"version": 1`` and the command's name (``"command"``); a later version may add keys, and
renames or removes one only with a new version number. Times are ISO 8601 in UTC, snapshot ids and offsets whole
numbers, a value not known ``null`` (the lag when the broker does not answer). docs/operations.md, "For scripts",
shows each shape.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from krishiv.check import Finding
from krishiv.cut import Cut
from krishiv.lineage import LineageRow
from krishiv.status import PipelineStatus
from krishiv.verify import Verification
from krishiv_core.reject_rate import RejectRate

VERSION = 1


def _time(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


def status_pipeline(s: PipelineStatus, kind: str, topics: Sequence[str], merged: set[str]) -> dict[str, Any]:
    """One pipeline's status: ``topic`` its first topic, ``topics`` every one it reads."""
    return {
        "name": s.pipeline,
        "kind": kind,
        "topic": topics[0],
        "topics": list(topics),
        "events": {"read": s.records_read, "rejected": s.rejects, "late": s.late_events},
        "late_batches": [{"batch_id": b, "late_events": n} for b, n in s.late_batches],
        "tables": [
            {
                "table": t.table,
                "pending": t.pending,
                "committed": t.committed,
                "rows_staged": t.rows_staged,
                "commit": "merge" if t.table in merged else "append",
                "last_commit_at": _time(t.last_commit_at),
                "last_snapshot_id": t.last_snapshot_id,
            }
            for t in s.tables
        ],
        "partitions": [
            {
                "partition": int(p.partition),
                **({"topic": p.topic} if p.topic is not None else {}),
                "latest": p.latest,
                "staged": p.staged,
                "committed": p.committed,
                "lag": p.lag,
            }
            for p in s.partitions
        ],
        "broker_error": s.broker_error,
        "leases": [
            {
                "name": lease.pipeline,
                "holder": lease.holder,
                "host": lease.host,
                "pid": lease.pid,
                "acquired_at": _time(lease.acquired_at),
                "expires_at": _time(lease.expires_at),
                "epoch": lease.epoch,
                "alive": lease.alive(),
            }
            for lease in s.leases
        ],
    }


def reject_rate_document(rate: RejectRate, warn_above: float) -> dict[str, Any]:
    """A pipeline's recent reject rate (``krishiv_core.reject_rate``), as ``status --json`` carries it."""
    return {
        "batches": rate.batches,
        "read": rate.records_read,
        "rejected": rate.rejects,
        "rate": rate.rate,
        "warn_above": warn_above,
        "alarming": rate.alarming(warn_above),
    }


def status_document(
    pipelines: Sequence[dict[str, Any]],
    removed: Sequence[dict[str, Any]],
    broker_error: str | None,
    batch_commits: str,
) -> str:
    """``krishiv status --json``: every pipeline, the pipelines removed from the spec with batches pending, the
    broker's error (then every lag is null and the command exits 1), and how the catalog commits a batch's tables
    (``atomic`` or ``table by table``, ``outbox.multi_table_commit``)."""
    doc = {
        "version": VERSION,
        "command": "status",
        "batch_commits": batch_commits,
        "pipelines": list(pipelines),
        "removed_pipelines": list(removed),
        "broker_error": broker_error,
    }
    return json.dumps(doc, indent=2)


def verify_document(results: Iterable[Verification]) -> str:
    """``krishiv verify --json``: each table's verdict (``ok`` false exits 1); a pipeline's first table also has the
    records its batches read and rejected (null on the others) and its warnings (which do not make it fail)."""
    tables = [
        {
            "table": r.table,
            "ok": r.ok,
            "rows": r.rows,
            "snapshots": r.snapshots,
            "key": list(r.key),
            "violations": list(r.violations),
            "records_read": r.records_read,
            "rejects": r.rejects,
            "warnings": list(r.warnings),
        }
        for r in results
    ]
    doc = {"version": VERSION, "command": "verify", "ok": all(t["ok"] for t in tables), "tables": tables}
    return json.dumps(doc, indent=2)


def cut_document(cuts: Iterable[Cut]) -> str:
    """``krishiv cut --json``: per pipeline, the batch of the cut and each table's snapshot as of it."""
    doc = {
        "version": VERSION,
        "command": "cut",
        "pipelines": [
            {
                "pipeline": c.pipeline,
                "query_id": c.query_id,
                "batch_id": c.batch_id,
                "tables": [
                    {"table": t.table, "snapshot_id": t.snapshot_id, "batch_id": t.batch_id, "expired": t.expired}
                    for t in c.tables
                ],
            }
            for c in cuts
        ],
    }
    return json.dumps(doc, indent=2)


def lineage_document(tables: Iterable[tuple[str, list[LineageRow]]]) -> str:
    """``krishiv lineage --json``: each table's snapshots, oldest first."""
    doc = {
        "version": VERSION,
        "command": "lineage",
        "tables": [
            {
                "table": table,
                "snapshots": [
                    {
                        "snapshot_id": r.snapshot_id,
                        "parent_id": r.parent_id,
                        "committed_at": _time(r.committed_at),
                        "operation": r.operation,
                        "query_id": r.query_id,
                        "batch_id": r.batch_id,
                        "high_water_batch_id": r.high_water_batch_id,
                        "added_records": r.added_records,
                        "deleted_records": r.deleted_records,
                        "maintenance": r.maintenance,
                    }
                    for r in rows
                ],
            }
            for table, rows in tables
        ],
    }
    return json.dumps(doc, indent=2)


def check_document(findings: Iterable[Finding]) -> str:
    """``krishiv check --json``: each finding (``ok`` false exits 1)."""
    checks = [{"pipeline": f.pipeline, "check": f.check, "ok": f.ok, "detail": f.detail} for f in findings]
    return json.dumps(
        {"version": VERSION, "command": "check", "ok": all(c["ok"] for c in checks), "checks": checks}, indent=2
    )
