"""The command line of ``krishiv``: ``build_parser`` (every command, its options and their help), the help
formatter and the environment epilog of ``krishiv --help``, and the argument types (sizes, durations, counts,
ports)."""

from __future__ import annotations

import argparse
import textwrap
from importlib.metadata import PackageNotFoundError, version

from krishiv.operations import LEDGER_LOCK_TIMEOUT_ENV, STAGER_LEASE_TTL_ENV
from krishiv_core.errors import ConfigError
from krishiv_core.reject_rate import REJECT_RATE_ENV
from krishiv_core.spec import ENV_OVERRIDES, SPEC_FILE_ENV

#: What ``krishiv --help`` says first.
DESCRIPTION = """krishiv: exactly-once Kafka -> Spark -> Iceberg through an outbox ledger.
broker, produce, run, commit, status, lineage, verify, demo, the operator's
tools (ledger-compact, ledger-copy, skip-offsets, restage, clean-staging)
and table maintenance (compact, expire-snapshots, remove-orphans, maintain)."""

# ------------------------------------------------------------------------------------------ argument types


def _size(text: str) -> int:
    from krishiv_core.spec import parse_size_bytes

    try:
        return parse_size_bytes(int(text) if text.strip().isdigit() else text, "size")
    except ConfigError:
        raise argparse.ArgumentTypeError(f"expected a size such as 128MiB, 512KiB or 1GB, got {text!r}") from None


def _positive(text: str) -> int:
    count = _count(text)
    if count < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return count


def _sample_size(text: str) -> int | None:
    """``init --sample``: a whole number of at least 1, or ``all`` (None: every record)."""
    if text.strip().lower() == "all":
        return None
    try:
        return _positive(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, or all, got {text!r}") from None


def _min_files(text: str) -> int:
    count = _count(text)
    if count < 2:
        raise argparse.ArgumentTypeError(
            f"expected a whole number of at least 2 (one file is not compacted), got {text!r}"
        )
    return count


_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def _duration(text: str) -> float:
    """Seconds from ``7d``, ``12h``, ``30m``, ``45s`` or a plain number of seconds."""
    raw = text.strip().lower()
    unit = _DURATION_UNITS.get(raw[-1:])
    try:
        value = float(raw[:-1] if unit else raw) * (unit or 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a duration such as 7d, 12h, 30m or 3600, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite duration of at least 0, got {text!r}")
    return value


def _count(text: str) -> int:
    try:
        count = int(text)
    except ValueError:
        count = -1
    if count < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 0, got {text!r}")
    return count


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number from 1 to 65535, got {text!r}")
    return port


def format_duration(seconds: float) -> str:
    """``7d``, ``12h``, ``30m`` or ``45s``: a duration as ``--retention`` and ``--grace`` take it."""
    for unit in ("w", "d", "h", "m"):
        if seconds >= _DURATION_UNITS[unit] and seconds % _DURATION_UNITS[unit] == 0:
            return f"{int(seconds // _DURATION_UNITS[unit])}{unit}"
    return f"{seconds:g}s"


# ------------------------------------------------------------------------------------------ parser


def _version() -> str:
    try:
        return version("krishiv")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def _environment() -> str:
    """The epilog of ``krishiv --help``: every environment variable Krishiv reads, within 80 columns."""
    variables = [
        (SPEC_FILE_ENV, "the spec file when --spec is not given"),
        *((var, f"overrides {field}") for var, field in ENV_OVERRIDES.items()),
        (LEDGER_LOCK_TIMEOUT_ENV, "seconds to wait for a ledger another process holds (default 30)"),
        (STAGER_LEASE_TTL_ENV, "seconds a stager's lease lasts unless renewed (default 30)"),
        ("KRISHIV_BROKER_OUTAGE_S", "seconds a running query waits for a broker that stopped answering (default 300)"),
        ("KRISHIV_LEDGER_OUTAGE_S", "seconds a continuous run waits for a ledger it could not write (default 300)"),
        ("KRISHIV_STATUS_PENDING_S", "status warns of entries pending longer than this many seconds (600)"),
        (REJECT_RATE_ENV, "run, status and verify warn (check fails) above this share of rejects (0.5)"),
        ("KRISHIV_REGISTRY_OUTAGE_S", "seconds a query's tasks wait for a Schema Registry that stopped answering (60)"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "export metrics over OTLP/HTTP there (with the other OTEL_* variables)"),
        ("KRISHIV_METRICS_PORT", "serve Prometheus metrics on this port (0: any free port)"),
        ("KRISHIV_METRICS_HOST", "the address the metrics endpoint binds (default 127.0.0.1)"),
        ("KRISHIV_METRICS_REFRESH_S", "seconds a metrics reading is reused (default 5)"),
        ("PYICEBERG_CATALOG__KRISHIV__*", "pyiceberg's own catalog properties (the spec's [iceberg.properties] win)"),
        ("${NAME}", "any variable the spec's properties refer to: secrets, read when a client is built"),
        ("JAVA_HOME", "the Java 17+ Spark runs on (default: java on PATH)"),
        ("KRISHIV_FAULTS, KRISHIV_FAULTS_LOG", "fault injection, for the tests only"),
    ]
    lines = ["environment variables:"]
    for name, text in variables:
        wrapped = textwrap.wrap(text, 78 - 32)
        if len(name) > 29:
            lines.append(f"  {name}")
            lines += [" " * 32 + w for w in wrapped]
        else:
            lines.append(f"  {name:<30}{wrapped[0]}")
            lines += [" " * 32 + w for w in wrapped[1:]]
    lines += ["", f"krishiv {_version()}; first steps: docs/quickstart.md; every spec key: docs/spec.md."]
    return "\n".join(lines)


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the epilog's layout and adds ``(default: X)`` to an option whose help does not name its default."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        shown = action.default not in (None, False, argparse.SUPPRESS) and action.option_strings
        if shown and "default" not in text:
            text += " (default: %(default)s)"
        return text


_SPEC_HELP = f"pipeline spec file (default: ${SPEC_FILE_ENV}, else ./krishiv.toml)"


def _json(c: argparse.ArgumentParser) -> None:
    c.add_argument(
        "--json", action="store_true", help="one JSON document on stdout, its shape versioned (docs/operations.md)"
    )


_VERBOSE_HELP = "log what the relay and stager do"


def _command(
    sub: argparse._SubParsersAction,
    name: str,
    text: str,
    *,
    pipeline: str | None = "the pipeline (default: every pipeline)",
    spec: bool = True,
) -> argparse.ArgumentParser:
    """A subcommand taking ``--spec`` (here too, so it may follow the command) and, unless None, ``--pipeline``."""
    c = sub.add_parser(name, help=text, description=textwrap.fill(text, 79), formatter_class=_HelpFormatter)
    if spec:
        c.add_argument("--spec", default=argparse.SUPPRESS, help=_SPEC_HELP)
    c.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help=_VERBOSE_HELP)
    if pipeline:
        c.add_argument("--pipeline", help=pipeline)
    return c


def _wide(c: argparse.ArgumentParser) -> None:
    c.add_argument("--wide", action="store_true", help="whole ids, namespaces and offsets (wider than 80 columns)")


def _metrics_port(c: argparse.ArgumentParser) -> None:
    c.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="serve Prometheus metrics on this port, on 127.0.0.1 unless $KRISHIV_METRICS_HOST "
        "(default: $KRISHIV_METRICS_PORT, else none)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="krishiv", description=DESCRIPTION, epilog=_environment(), formatter_class=_HelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"krishiv {_version()}")
    parser.add_argument("--spec", help=_SPEC_HELP)
    parser.add_argument("-v", "--verbose", action="store_true", help=_VERBOSE_HELP)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    b = _command(
        sub, "broker", "run a local Tansu Kafka broker in the foreground until Ctrl-C", pipeline=None, spec=False
    )
    b.add_argument(
        "--port", type=_port, help="the port it listens on (default: the port of $KRISHIV_KAFKA_BOOTSTRAP, else 9092)"
    )
    b.add_argument("--host", default="127.0.0.1", help="the address it listens on")

    text = "write a spec for a topic, its fields inferred from a sample of its records"
    i = _command(sub, "init", text, pipeline=None, spec=False)
    i.add_argument("--topic", required=True, help="the topic to read")
    i.add_argument("--kind", choices=("events", "upsert", "windowed"), default="events", help="what the table holds")
    i.add_argument("--key", help="upsert: the key field(s), comma-separated (default: the Kafka key's fields)")
    i.add_argument("--bootstrap", help="host:port (default: $KRISHIV_KAFKA_BOOTSTRAP, else 127.0.0.1:9092)")
    i.add_argument(
        "--sample",
        type=_sample_size,
        default=500,
        help="how many records to infer the fields from, the first of each partition or of --file (all: every one)",
    )
    i.add_argument("--file", help="infer from your own JSON lines file instead of the topic's records")
    i.add_argument("--output", default="krishiv.toml", help="the spec file to write (never overwritten)")

    t = _command(sub, "topic", "list the broker's topics, describe one, or create one", pipeline=None)
    t.add_argument("action", choices=("list", "describe", "create"), help="what to do")
    t.add_argument("name", nargs="?", help="the topic (describe, create)")
    t.add_argument("--partitions", type=_positive, help="create: how many (default: the spec's kafka.partitions)")
    t.add_argument(
        "--bootstrap",
        help="host:port, when there is no spec yet (default: $KRISHIV_KAFKA_BOOTSTRAP, else 127.0.0.1:9092)",
    )

    one = "the pipeline whose topic to write (default: the spec's first)"
    text = "produce seeded demo orders, or your own JSON lines, to a pipeline's topic"
    p = _command(sub, "produce", text, pipeline=one)
    p.add_argument("--file", help="a JSON lines file (- for standard input): one record per line, sent as it is")
    p.add_argument("--key", help="with --file: the field whose value is each record's Kafka key (default: no key)")
    p.add_argument("--records", type=_count, default=10_000, help="how many orders")
    p.add_argument("--rate", type=float, help="events per second (default: as fast as possible)")
    p.add_argument("--seed", type=int, default=7, help="the random seed: the same seed gives the same orders")
    p.add_argument(
        "--late",
        type=_count,
        default=0,
        help="how many events carry an event time ten minutes behind the others (placed in the last quarter)",
    )
    p.add_argument("--malformed", type=_count, default=0, help="how many events are malformed")

    r = _command(
        sub,
        "run",
        "run the Spark streaming job: stage each batch and commit it as soon as it is staged (with --once or "
        "--no-commit, stage only); Ctrl-C stops it between batches",
    )
    r.add_argument(
        "--once", action="store_true", help="process what is in the topic now, stage it, then stop (default: run on)"
    )
    r.add_argument(
        "--no-commit",
        action="store_true",
        help="stage only; leave phase 2 to krishiv commit or Dagster (a run with --once never commits)",
    )
    _metrics_port(r)

    c = _command(sub, "commit", "commit pending batches to Iceberg (phase 2)")
    _wide(c)
    _metrics_port(c)
    c = _command(sub, "status", "outbox, events and lag per pipeline; exit 1 if the broker does not answer")
    _wide(c)
    _json(c)
    c = _command(sub, "lineage", "snapshot lineage of the tables, newest last")
    _wide(c)
    _json(c)
    c = _command(sub, "cut", "each table's snapshot as of one batch, to read every table at the same cut")
    c.add_argument("--batch", type=int, help="the batch of the cut (default: the newest committed to every table)")
    _wide(c)
    _json(c)
    _json(_command(sub, "verify", "check the exactly-once invariants; exit 1 on any violation"))
    text = "what krishiv run checks before Spark starts (broker, topic, catalog, tables, history), changing nothing"
    _json(_command(sub, "check", text + "; exit 1 if a check fails"))

    lc = _command(
        sub,
        "ledger-compact",
        "fold committed ledger entries older than the retention into per-query totals",
        pipeline=None,
    )
    lc.add_argument(
        "--retention", type=_duration, default=_duration("7d"), help="keep entries committed within this (default 7d)"
    )

    copy = _command(
        sub,
        "ledger-copy",
        "copy the ledger into a new, empty one elsewhere (a DuckDB file onto PostgreSQL), refusing while a stager "
        "runs; the old one then refuses every use",
        pipeline=None,
    )
    copy.add_argument(
        "--to",
        required=True,
        metavar="LOCATION",
        help="where: postgresql://user@host:5432/db?schema=krishiv, duckdb:///path or a path (required)",
    )

    so = _command(
        sub,
        "skip-offsets",
        "move a stopped query past offsets it cannot read exactly (topic re-created, retention); recorded",
        pipeline="the pipeline (default: the spec's first)",
    )
    so.add_argument("--topic", help="the topic of the partition, for a pipeline over several topics")
    so.add_argument("--partition", type=int, required=True, help="the partition the query is stuck on (required)")
    so.add_argument(
        "--to", type=int, required=True, help="the offset to read on from, within the partition's log (required)"
    )
    so.add_argument(
        "--reason", required=True, help="why; kept in the ledger and the next snapshot's summary (required)"
    )

    _command(
        sub,
        "restage",
        "stage again the pending batches whose staged files are gone",
        pipeline="the pipeline (default: the spec's first)",
    )

    cs = _command(sub, "clean-staging", "remove staged files no ledger entry or snapshot refers to")
    cs.add_argument(
        "--grace", type=_duration, default=_duration("1h"), help="keep files younger than this (default 1h)"
    )
    cs.add_argument("--dry-run", action="store_true", help="list what would be removed, remove nothing")
    cs.add_argument("--force", action="store_true", help="allow a grace below 10m (only when nothing is staging)")

    m = "[maintenance]"  # the spec's section, which the options override
    es = _command(
        sub, "expire-snapshots", "expire old snapshots of the pipelines' tables (keeps files; see remove-orphans)"
    )
    es.add_argument(
        "--keep-last", type=_positive, metavar="N", help=f"always keep the newest N snapshots (default: {m}, 100)"
    )
    es.add_argument(
        "--keep-younger-than",
        type=_duration,
        metavar="D",
        help=f"also keep snapshots younger than this, e.g. 15m, 7d (default: {m}, 15m)",
    )
    es.add_argument("--dry-run", action="store_true", help="list what would be expired, expire nothing")

    ro = _command(
        sub, "remove-orphans", "remove files no retained snapshot, metadata or pending ledger entry refers to"
    )
    ro.add_argument(
        "--grace", type=_duration, metavar="D", help=f"keep files younger than this (default: {m}, 24h; at least 10m)"
    )
    ro.add_argument("--force", action="store_true", help="allow a grace below 10m (nothing may be writing the tables)")
    ro.add_argument("--dry-run", action="store_true", help="list what would be removed, remove nothing")

    co = _command(sub, "compact", "rewrite small data files into files of a target size, one replace snapshot")
    co.add_argument(
        "--target-file-size", type=_size, metavar="SIZE", help=f"size of the rewritten files (default: {m}, 128MiB)"
    )
    co.add_argument(
        "--min-files",
        type=_min_files,
        metavar="N",
        help=f"compact a partition with this many small files (default: {m}, 5)",
    )
    co.add_argument("--dry-run", action="store_true", help="list what would be rewritten, write nothing")

    mt = _command(sub, "maintain", "compact, expire snapshots and remove orphans with the spec's [maintenance]")
    mt.add_argument("--dry-run", action="store_true", help="list what each step would do, change nothing")

    d = _command(sub, "demo", "broker + produce + run + commit + show, on embedded defaults", pipeline=None)
    d.add_argument("--records", type=_count, default=20_000, help="how many orders")
    d.add_argument("--late", type=_count, default=25, help="how many events arrive ten minutes late")
    d.add_argument("--malformed", type=_count, default=30, help="how many events are malformed")
    d.add_argument("--seed", type=int, default=7, help="the random seed")
    d.add_argument(
        "--state",
        default="state/demo",
        help="folder for the demo's catalog, warehouse and ledger; emptied first, so it must be new, empty or "
        "one an earlier demo made (it holds .krishiv-demo-state) (default: state/demo)",
    )
    return parser
