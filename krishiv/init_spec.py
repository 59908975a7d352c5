"""``krishiv init``: a commented spec for a topic, its fields inferred from a sample of the topic's records.

The sample is the first records of each partition (up to ``--sample`` in all). Each JSON object's top-level keys
become fields, typed so that the rule of docs/spec.md "Field types" reads every sampled value: a string that is always
an ISO date is a ``date``, an ISO time a ``timestamp``, a number in plain digits (``"12.50"``) a decimal wide
enough for it; an integer is a ``long`` (a ``timestamp_ms`` when the name says time and the values are epoch
milliseconds of 2001 to 2286); a number with a fraction a decimal; ``true``/``false`` a ``boolean``. A key missing
from a record or null in one is optional. Objects, arrays and keys of mixed types are left out, each with a comment.
Records in the Confluent wire format or Debezium's envelope are recognised and the spec says what to set instead.
The user reads the fields it prints and the file it writes, and confirms with ``krishiv check``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date
from decimal import Decimal
from pathlib import Path
from typing import Any

from krishiv_core.errors import ConfigError
from spark_jobs.record_decoder import iso_time

KINDS = ("events", "upsert", "windowed")
_PLAIN_DECIMAL = re.compile(r"-?\d+(\.\d+)?")
_TIME_NAME = re.compile(r"(time|_ts$|^ts$|_at$|_ms$|date)", re.IGNORECASE)
_EPOCH_MS = (978_307_200_000, 9_999_999_999_999)  # 2001-01-01 .. 2286-11-20
SAMPLE_TIMEOUT_S = 10.0


@dataclass
class FieldGuess:
    name: str
    kinds: set[str] = field(default_factory=set)  # JSON kinds seen: string, integer, number, boolean, object, array
    values: list[Any] = field(default_factory=list)
    missing_or_null: bool = False

    def spec_type(self) -> tuple[str | None, str]:
        """(the field's type, a comment): None when the sample does not settle one."""
        kinds = self.kinds
        if kinds & {"object", "array"}:
            return None, f"left out: {self.name} holds JSON {' and '.join(sorted(kinds & {'object', 'array'}))}s"
        if kinds == {"boolean"}:
            return "boolean", ""
        if kinds <= {"integer", "number"} and kinds:
            if kinds == {"integer"}:
                low, high = _EPOCH_MS
                if _TIME_NAME.search(self.name) and all(low <= v <= high for v in self.values):
                    return "timestamp_ms", "epoch milliseconds"
                return "long", ""
            if any("E" in str(v) for v in self.values if isinstance(v, Decimal)):
                return "double", "exponent notation in the sample"
            return _decimal([format(v, "f") for v in self.values]), "or double"
        if kinds == {"string"}:
            texts = self.values
            if all(_is_date(t) for t in texts):
                return "date", ""
            if all(_is_time(t) for t in texts):
                return "timestamp", "ISO 8601"
            if all(_PLAIN_DECIMAL.fullmatch(t) for t in texts) and any("." in t for t in texts):
                return _decimal(texts), "numbers sent as strings"
            return "string", ""
        if "string" in kinds and kinds <= {"string", "integer", "number"}:
            texts = [v if isinstance(v, str | int) else format(v, "f") for v in self.values]
            texts = [str(v) for v in texts]
            # A decimal reads a JSON number and a string of one; whole numbers alone may be ids: left out, as before.
            if all(_PLAIN_DECIMAL.fullmatch(v) for v in texts) and any("." in v for v in texts):
                return _decimal(texts), "numbers, some sent as strings"
        if not kinds:
            return None, f"left out: {self.name} was null in every sampled record"
        return None, f"left out: {self.name} holds mixed types ({', '.join(sorted(kinds))})"


def _is_date(text: str) -> bool:
    try:
        date.fromisoformat(text)
        return len(text) == 10
    except ValueError:
        return False


def _is_time(text: str) -> bool:
    """A time by the field rule's reading of a ``timestamp`` (a date alone is a ``date`` here)."""
    return iso_time(text) is not None and not _is_date(text)


def _decimal(texts: Sequence[str]) -> str:
    """A decimal that holds every sampled value, with room for four more integer digits."""
    whole = max(len(t.lstrip("-").split(".")[0].lstrip("0")) for t in texts)
    scale = max(len(t.split(".")[1]) if "." in t else 0 for t in texts)
    precision = min(38, whole + scale + 4)
    return f"decimal({precision},{min(scale, precision)})"


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, Decimal | float):
        return "number"
    return {str: "string", dict: "object", list: "array"}[type(value)]


@dataclass
class Sample:
    records: int = 0
    json_objects: int = 0
    wire_format: int = 0  # values starting with the Confluent magic byte 0
    debezium: int = 0
    fields: dict[str, FieldGuess] = field(default_factory=dict)
    key_fields: list[str] = field(default_factory=list)  # the Kafka key's JSON object keys, when it is one


def analyse(values: Sequence[bytes | None], keys: Sequence[bytes | None]) -> Sample:
    """What the sampled records say about the topic's format and fields."""
    sample = Sample(records=len(values))
    docs = []
    for value in values:
        if value is None:
            continue
        if value[:1] == b"\x00":
            sample.wire_format += 1
            continue
        try:
            doc = json.loads(value, parse_float=Decimal)  # a fraction's digits as sent
        except (ValueError, UnicodeDecodeError):
            continue
        if isinstance(doc, dict):
            if {"op", "after"} <= set(doc) or {"op", "after"} <= set(doc.get("payload") or {}):
                sample.debezium += 1
                payload = doc.get("payload", doc)
                doc = payload.get("after") or payload.get("before") or {}
            docs.append(doc)
    sample.json_objects = len(docs)
    for doc in docs:
        for name, value in doc.items():
            guess = sample.fields.setdefault(name, FieldGuess(name))
            if value is None:
                guess.missing_or_null = True
                continue
            guess.kinds.add(_kind(value))
            guess.values.append(value)
    for guess in sample.fields.values():
        if any(guess.name not in doc for doc in docs):
            guess.missing_or_null = True
    for key in keys:
        try:
            doc = json.loads(key) if key else None
        except (ValueError, UnicodeDecodeError):
            doc = None
        if isinstance(doc, dict):
            doc = doc.get("payload", doc) if set(doc) == {"schema", "payload"} else doc
            sample.key_fields = list(doc)
            break
    return sample


def sample_topic(bootstrap: str, topic: str, settings: dict[str, str], limit: int) -> tuple[list, list]:
    """Up to ``limit`` records from the start of the topic's partitions: (values, keys)."""
    import time

    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    from spark_jobs.kafka_clients import KafkaProblems, build, list_topics

    config = {
        **settings,
        "bootstrap.servers": bootstrap,
        "group.id": "krishiv-init",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
    }
    problems = KafkaProblems(config)
    consumer = build(Consumer, config, problems)
    try:
        metadata = list_topics(consumer, problems, bootstrap, SAMPLE_TIMEOUT_S)  # one line if the broker is away
        partitions = sorted(metadata.topics[topic].partitions) if topic in metadata.topics else []
        if not partitions or metadata.topics[topic].error is not None:
            raise ConfigError("--topic", f"no topic {topic!r} on {bootstrap}: produce to it first (krishiv produce)")
        ends: dict[int, int] = {}  # the partitions still being read, to their high watermark
        for p in partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=SAMPLE_TIMEOUT_S)
            if high > low:
                ends[p] = high
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
        values, keys = [], []
        deadline = time.monotonic() + SAMPLE_TIMEOUT_S
        while ends and len(values) < limit and time.monotonic() < deadline:
            for msg in consumer.consume(min(500, limit - len(values)), 0.5):
                if msg.error() is None:
                    values.append(msg.value())
                    keys.append(msg.key())
                    if msg.offset() + 1 >= ends.get(msg.partition(), 0):
                        ends.pop(msg.partition(), None)
        return values[:limit], keys[:limit]
    finally:
        consumer.close()


def spec_text(
    sample: Sample,
    topic: str,
    kind: str,
    bootstrap: str,
    key: Sequence[str] = (),
    name: str | None = None,
    source: str | None = None,
) -> str:
    """The commented spec for ``topic``, inferred from ``source`` (``lines of F``; by default the topic's records)."""
    pipeline = name or re.sub(r"[^A-Za-z0-9_]", "_", topic)
    if not re.match(r"^[A-Za-z_]", pipeline):
        pipeline = f"p_{pipeline}"
    typed = [(g, *g.spec_type()) for g in sample.fields.values()]
    kept = [(g, t, note) for g, t, note in typed if t is not None]
    left = [note for _g, t, note in typed if t is None]
    lines = [
        f"# Written by krishiv init from {sample.records} {source or f'sampled records of topic {topic}'}.",
        "# Read the fields below and correct what the sample could not know; then: krishiv check",
        "",
        "[kafka]",
        f'bootstrap_servers = "{bootstrap}"',
        "",
        "[[pipelines]]",
        f'name = "{pipeline}"',
        f'kind = "{kind}"',
        f'topic = "{topic}"',
    ]
    if sample.debezium and kind == "upsert":
        lines.append('envelope = "debezium"                # Debezium change events: op, before, after, source')
    if kind == "events":
        lines.append('kafka_metadata = ["partition", "offset"]  # lets krishiv verify find a record twice')
    if kind == "upsert":
        lines.append(f"key = {json.dumps(list(key))}")
    times = [g.name for g, t, _ in kept if t in ("timestamp", "timestamp_ms") and not g.missing_or_null]
    if kind == "windowed":
        lines += [
            f'event_time_field = "{times[0]}"',
            'window = "1m"',
            'watermark_delay = "5s"',
            "",
            "[[pipelines.aggregations]]",
            'name = "events"',
            'function = "count"',
        ]
    lines += ["", "[pipelines.fields]"]
    for g, t, note in kept:
        declared = f'"{t}"' if not g.missing_or_null else f'{{ type = "{t}", required = false }}'
        lines.append(f"{g.name} = {declared}" + (f"  # {note}" if note else ""))
    lines += [f"# {note}" for note in left]
    return "\n".join(lines) + "\n"


def check_kind(sample: Sample, kind: str, key: Sequence[str]) -> None:
    """One line for a sample the kind cannot be written for."""
    if sample.wire_format:
        raise ConfigError(
            "topic",
            f"{sample.wire_format} of {sample.records} sampled records are in the Confluent wire format (Avro, "
            "Protobuf or JSON Schema): write the spec by hand with format and [schema_registry] (docs/formats.md); "
            "the fields can come from the registry",
        )
    if not sample.json_objects:
        raise ConfigError("topic", f"none of {sample.records} sampled records is a JSON object: nothing to infer from")
    typed = {g.name: g.spec_type()[0] for g in sample.fields.values()}
    if kind == "windowed" and not any(
        t in ("timestamp", "timestamp_ms") and not sample.fields[n].missing_or_null for n, t in typed.items()
    ):
        raise ConfigError(
            "--kind",
            "a windowed pipeline needs an event time, and no field of the sample is a time" + _near_times(sample),
        )
    if kind == "upsert":
        missing = [k for k in key if typed.get(k) is None or sample.fields[k].missing_or_null]
        if not key or missing:
            raise ConfigError(
                "--key",
                "an upsert pipeline needs --key FIELD[,FIELD], fields every sampled record has"
                + (f"; not {', '.join(missing)}" if missing else ""),
            )


def _near_times(sample: Sample) -> str:
    """The way out when no field is a time in every record: the fields that are one in most of them."""
    near = []
    for g in sample.fields.values():
        texts = [v for v in g.values if isinstance(v, str)]
        times = sum(_is_time(v) for v in texts)
        if texts and times >= 0.9 * len(g.values):
            near.append(f"{g.name} is one in {times} of {len(g.values)} sampled values")
    if not near:
        return (
            " in every sampled record: name one with --file of lines that hold it, or write the spec's fields by hand"
        )
    return (
        f' in every sampled record ({"; ".join(near)}): declare it "timestamp" in [pipelines.fields] and '
        "event_time_field in the spec (the records whose value is not a time become rejects), or sample clean lines "
        "with --file"
    )


def write_spec(path: Path, text: str, check_only: bool = False) -> None:
    """Write the spec; never over an existing file (``check_only``: only refuse one)."""
    if path.exists():
        raise ConfigError("--output", f"{path} exists: choose another --output, or remove it first")
    if not check_only:
        path.write_text(text)
