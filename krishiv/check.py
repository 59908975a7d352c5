"""``krishiv check``: what ``krishiv run`` checks before Spark starts, run without changing anything.

For each pipeline: the broker answers and has the topic, the topic is the one the last batch read and holds the
offsets the next batch starts from; the catalog answers; each table the pipeline writes is
new (created at the first run) or takes the spec (its purpose, its schema: the columns a run would add, widen or
relax, or the refusal a run would stop with; its partitioning); the ledger, the checkpoint and the tables tell one
history; and the pipeline's recent batches are not mostly rejects (``krishiv_core.reject_rate``: a spec that reads
nothing of what the topic holds fails here). Nothing is created, evolved or leased: a table is compared with the
spec in a transaction never committed. Each finding is one line; the command exits 1 if any check fails.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from krishiv_core.errors import KrishivError
from krishiv_core.spec import KrishivSpec, PipelineSpec
from krishiv_core.tables import OutputTable


@dataclass(frozen=True)
class Finding:
    pipeline: str
    check: str  # broker, offsets, catalog, table <name>, history, rejects
    ok: bool
    detail: str


def _checked(pipeline: str, check: str, run: Callable[[], str]) -> Finding:
    try:
        return Finding(pipeline, check, True, run())
    except KrishivError as exc:
        return Finding(pipeline, check, False, str(exc))


def _topic(spec: KrishivSpec, p: PipelineSpec) -> str:
    from krishiv.preflight import check_topics

    metadata = check_topics(spec, [p])

    def shown(topic: str) -> str:
        described = metadata.topics.get(topic)
        if described is None or not described.partitions:
            return f"{topic}: not made yet"
        n = len(described.partitions)
        return f"{topic}: {n} partition{'s' * (n != 1)}"

    if p.members:
        return f"topics on {spec.kafka.bootstrap_servers}: " + ", ".join(map(shown, p.topics))
    n = len(metadata.topics[p.topic].partitions)
    return f"topic {p.topic} on {spec.kafka.bootstrap_servers}: {n} partition{'s' * (n != 1)}"


def _catalog(spec: KrishivSpec) -> str:
    from krishiv.preflight import check_catalog
    from krishiv_core.catalog import catalog_exists, redact

    if catalog_exists(spec) is False:  # a SQL catalog not created yet: checking it would create it
        return f"no catalog at {redact(spec.catalog_uri())} yet: the first run creates it"
    check_catalog(spec)
    return f"catalog at {redact(spec.catalog_uri())} answers"


def _table(spec: KrishivSpec, p: PipelineSpec, t: OutputTable) -> str:
    from pyiceberg.exceptions import NoSuchTableError

    from krishiv_core.catalog import catalog_exists, load_catalog, qualified, table_identifier
    from krishiv_core.evolution import partitioning_differs, table_changes
    from krishiv_core.table_purpose import check_purpose

    name = t.name
    if catalog_exists(spec) is False:
        return "new: created at the first run"
    try:
        table = load_catalog(spec).load_table(table_identifier(spec, name))
    except NoSuchTableError:
        return "new: created at the first run"
    if not t.rejects:
        check_purpose(p.writer_of(name), qualified(spec, name), table.properties)
    changes = table_changes(table, t.schema, qualified(spec, name))
    said = []
    if changes.add:
        said.append("adds " + ", ".join(f.name for f in changes.add))
    if changes.widen:
        said.append("widens " + ", ".join(n for n, _ in changes.widen))
    if changes.make_optional:
        said.append("makes optional " + ", ".join(changes.make_optional))
    if partitioning_differs(table, t.partition_by):
        said.append("changes the partitioning (for new files)")
    return "takes the spec as it is" if not said else "the next run " + "; ".join(said)


def _history(spec: KrishivSpec, p: PipelineSpec) -> str:
    from krishiv.operations import open_ledger
    from krishiv.preflight import check_history, check_new_catalog, check_topic_unchanged
    from krishiv_core.catalog import catalog_exists, load_catalog
    from spark_jobs.job import check_checkpoint
    from spark_jobs.window_state import check_output_mode

    ledger = open_ledger(spec)
    if not ledger.exists():
        return f"no ledger yet at {ledger.path}: the first run starts one"
    check_topic_unchanged([p], ledger)
    if catalog_exists(spec) is False:
        check_new_catalog(spec, [p], ledger, lambda _line: None)  # refuses a catalog lost with batches committed
    else:
        check_history(load_catalog(spec), spec, [p], ledger)
    check_output_mode(p, check_checkpoint(spec, p, ledger))
    return "the ledger, the checkpoint and the tables tell one history"


def _offsets(spec: KrishivSpec, p: PipelineSpec) -> str:
    """The offsets the next batch starts from are on the broker: the topic is the incarnation the last batch read,
    and retention has not deleted what the query has yet to read (``status`` warns of the same; ``run`` stops)."""
    from datetime import UTC, datetime

    from krishiv.operations import open_ledger
    from krishiv.status import pipeline_status, read_broker_side, status_warnings
    from krishiv_core.catalog import qualified

    ledger = open_ledger(spec)
    if not ledger.exists():
        return "nothing read yet: the first run starts at the topic's first offsets"
    latest, side = read_broker_side(spec, p.topic)
    table = qualified(spec, p.all_tables[0])
    s = pipeline_status(ledger, p.name, table, p.topic, latest)
    problems = status_warnings(s, side, ledger.newest_topic_id(table), [], None, datetime.now(UTC))
    if problems:
        raise OffsetsNotReadable("; ".join(problems))
    return "the next batch's offsets are on the broker"


def _rejects(spec: KrishivSpec, p: PipelineSpec, warn_above: float) -> str:
    """The pipeline's recent batches are not mostly rejects (``krishiv_core.reject_rate``): fails as ``status``
    warns, so a spec that reads nothing of what the topic holds does not check clean."""
    from krishiv.operations import open_ledger
    from krishiv.reject_storms import pipeline_warning, recent_rejects
    from krishiv_core.catalog import qualified

    ledger = open_ledger(spec)
    if not ledger.exists():
        return "nothing read yet"
    recent = ledger.recent_rejects(qualified(spec, p.all_tables[0]), pipeline=p.name)
    storm = pipeline_warning(recent, warn_above, qualified(spec, p.rejects_table))
    if storm:
        raise RejectStorm(storm)
    return recent_rejects(recent, warn_above) if recent.batches else "nothing read yet"


class RejectStorm(KrishivError):
    """Most records the pipeline's recent batches read were rejects: its spec does not read what the topic holds."""


class OffsetsNotReadable(KrishivError):
    """The topic was re-created, or retention deleted offsets the query has not read: the next run would stop."""


def check_pipelines(spec: KrishivSpec, pipelines: Sequence[PipelineSpec]) -> list[Finding]:
    """Every finding, in order; a pipeline whose broker or catalog does not answer skips what needs them."""
    from krishiv_core.reject_rate import reject_rate_warn
    from krishiv_core.tables import output_tables

    warn_above = reject_rate_warn()
    findings: list[Finding] = []
    catalog = _checked("*", "catalog", lambda: _catalog(spec))
    for p in pipelines:
        findings.append(_checked(p.name, "broker", lambda p=p: _topic(spec, p)))
        if findings[-1].ok:
            findings.append(_checked(p.name, "offsets", lambda p=p: _offsets(spec, p)))
        findings.append(Finding(p.name, catalog.check, catalog.ok, catalog.detail))
        if catalog.ok:
            for t in output_tables(p):
                findings.append(_checked(p.name, f"table {t.name}", lambda t=t, p=p: _table(spec, p, t)))
            findings.append(_checked(p.name, "history", lambda p=p: _history(spec, p)))
        findings.append(_checked(p.name, "rejects", lambda p=p: _rejects(spec, p, warn_above)))
    return findings
