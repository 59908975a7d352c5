"""``krishiv init``: a commented spec for a topic, its fields inferred from a sample of the topic's records.

The sample is the first records of each partition, or the first lines of a file (``--sample``, 500 unless told;
``all`` reads every one), and init says how many it read of how many. Each JSON object's top-level keys become
fields, each typed (its shape too) by what most of its sampled values fit, objects and arrays as structs, maps,
lists or ``json`` at any depth (``krishiv/init_types.py``: the rule, and the comment naming the values that will be
rejects). A key
missing from a record or null in one is optional; a nested field's declaration is an inline table, split into dotted
keys when long, after a comment line per part saying what was inferred and why. A sampled record
that is not a JSON object is named in the spec's header: it will be a reject. Records in the Confluent wire format
or Debezium's envelope are recognised and the spec says what to set instead. The user reads the fields it prints
and the file it writes, and confirms with ``krishiv check``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from krishiv.init_types import FieldGuess, json_kind
from krishiv_core.errors import ConfigError
from krishiv_core.schema_fields import connect_field, envelope_row
from krishiv_core.spec_types import EventField, FieldPath, field_paths
from spark_jobs.record_decoder import iso_time

KINDS = ("events", "upsert", "windowed")
SAMPLE_TIMEOUT_S = 10.0  # a topic's sample ends once nothing more arrived for this long
_RAW_OBJECT = msgspec.json.Decoder(dict[str, msgspec.Raw])
_TEXT = msgspec.json.Decoder(str)


@dataclass
class Sampled:
    """The records init read: each value and key, where it was, and how many there were to read."""

    noun: str  # what was read: "line", "record"
    of: str  # where: the file, "topic T"
    total: int  # the file's lines, or the topic's offsets (about its records: markers and gaps count)
    values: list[bytes | None] = field(default_factory=list)
    keys: list[bytes | None] = field(default_factory=list)
    where: list[str] = field(default_factory=list)  # each record's place: "line 17", "partition 0 offset 9"
    complete: bool = False  # every one was read

    @property
    def described(self) -> str:
        """``all 40 lines of F``, or ``the first 500 of 5,000 lines of F`` and how to read more."""
        n = len(self.values)
        if self.complete:
            return f"{'all ' if n > 1 else ''}{n:,} {self.noun}{'' if n == 1 else 's'} of {self.of}"
        about = "about " if self.noun == "record" else ""
        return (
            f"the first {n:,} of {about}{self.total:,} {self.noun}s of {self.of} "
            "(--sample N reads more, --sample all every one)"
        )


def sample_file(path: str, limit: int | None) -> Sampled:
    """The first ``limit`` non-blank lines of a JSON lines file (``None``: all), each named by its line number."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError("--file", f"cannot read {path}: {exc}") from None
    lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    read = lines[:limit]
    sampled = Sampled("line", path, len(lines), complete=len(read) == len(lines))
    for n, line in read:
        sampled.values.append(line.encode())
        sampled.keys.append(None)
        sampled.where.append(f"line {n}")
    return sampled


@dataclass
class Sample:
    records: int = 0
    json_objects: int = 0
    wire_format: int = 0  # values starting with the Confluent magic byte 0
    debezium: int = 0
    fields: dict[str, FieldGuess] = field(default_factory=dict)
    key_fields: list[str] = field(default_factory=list)  # the Kafka key's JSON object keys, when it is one
    not_objects: list[str] = field(default_factory=list)  # where the records that are no JSON object were: rejects
    #: The columns of Debezium's row in the first sampled envelope that carries its Connect schema (JSON converter
    #: with ``schemas.enable``): they type the fields they name, as the Avro schema would.
    connect_row: dict[str, Any] = field(default_factory=dict)


def _object(raw: bytes | msgspec.Raw | None) -> dict[str, bytes] | None:
    """A JSON object's members as their tokens, or None for anything else (a string that is not UTF-8 included,
    which makes the whole record malformed JSON to the field rule)."""
    if raw is None:
        return None
    try:
        members = _RAW_OBJECT.decode(raw)
        msgspec.json.decode(raw)  # every string in it valid
    except (msgspec.DecodeError, UnicodeDecodeError):
        return None
    return {name: bytes(token) for name, token in members.items()}


def analyse(values: Sequence[bytes | None], keys: Sequence[bytes | None], where: Sequence[str] = ()) -> Sample:
    """What the sampled records say about the topic's format and fields (``where``: each record's place)."""
    sample = Sample(records=len(values))
    places = list(where) or [f"record {n}" for n in range(1, len(values) + 1)]
    docs: list[tuple[dict[str, bytes], str]] = []
    for value, place in zip(values, places, strict=True):
        if value is None:
            continue
        if value[:1] == b"\x00":
            sample.wire_format += 1
            continue
        doc = _object(value)
        if doc is None:
            sample.not_objects.append(place)
            continue
        payload = _object(doc.get("payload"))
        envelope = doc if {"op", "after"} <= set(doc) else payload if {"op", "after"} <= set(payload or {}) else None
        if envelope is not None:
            sample.debezium += 1
            if envelope is payload and not sample.connect_row:
                try:
                    columns = envelope_row(json.loads(doc["schema"]))
                    sample.connect_row = {c["field"]: c for c in columns if isinstance(c, dict) and "field" in c}
                except (ConfigError, ValueError, TypeError, KeyError, AttributeError):
                    pass
            doc = _object(envelope.get("after")) or _object(envelope.get("before")) or {}
        docs.append((doc, place))
    sample.json_objects = len(docs)
    for doc, place in docs:
        for name, token in doc.items():
            guess = sample.fields.setdefault(name, FieldGuess(name))
            if token == b"null":
                guess.missing_or_null = True
            else:
                guess.seen.append((token, place))
    for guess in sample.fields.values():
        if any(guess.name not in doc for doc, _ in docs):
            guess.missing_or_null = True
    for key in keys:
        try:
            key_doc = json.loads(key) if key else None
        except (ValueError, UnicodeDecodeError):
            key_doc = None
        if isinstance(key_doc, dict):
            key_doc = key_doc.get("payload", key_doc) if set(key_doc) == {"schema", "payload"} else key_doc
            sample.key_fields = list(key_doc)
            break
    return sample


def sample_topic(bootstrap: str, topic: str, settings: dict[str, str], limit: int | None) -> Sampled:
    """Up to ``limit`` records (``None``: all) from the start of the topic's partitions, read until each
    partition's high watermark when sampling began, or until nothing more arrives for ``SAMPLE_TIMEOUT_S``."""
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
        total = 0
        for p in partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=SAMPLE_TIMEOUT_S)
            if high > low:
                ends[p] = high
                total += high - low
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
        sampled = Sampled("record", f"topic {topic}", total)
        wanted = total if limit is None else limit
        deadline = time.monotonic() + SAMPLE_TIMEOUT_S
        while ends and len(sampled.values) < wanted and time.monotonic() < deadline:
            for msg in consumer.consume(min(500, wanted - len(sampled.values)), 0.5):
                deadline = time.monotonic() + SAMPLE_TIMEOUT_S
                if msg.error() is None:
                    sampled.values.append(msg.value())
                    sampled.keys.append(msg.key())
                    sampled.where.append(f"partition {msg.partition()} offset {msg.offset()}")
                    if msg.offset() + 1 >= ends.get(msg.partition(), 0):
                        ends.pop(msg.partition(), None)
        sampled.complete = not ends
        return sampled
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
    """The commented spec for ``topic``, inferred from ``source`` (what was sampled, as ``Sampled.described`` says
    it; by default the sample's records of the topic)."""
    pipeline = name or re.sub(r"[^A-Za-z0-9_]", "_", topic)
    if not re.match(r"^[A-Za-z_]", pipeline):
        pipeline = f"p_{pipeline}"
    kept: list[tuple[EventField, str, Sequence[tuple[str, str]]]] = []
    left: list[str] = []
    for g in sample.fields.values():
        if g.name in sample.connect_row:  # Debezium's schema says the column's type: its encoding is not the type
            try:
                kept.append((connect_field(sample.connect_row[g.name]), "Debezium's schema", ()))
            except ConfigError as exc:
                left.append(f"{g.name}: left out: Debezium's schema says it {str(exc).split(': ', 1)[1]}")
            continue
        t, note = g.spec_type()
        if t is None:
            left.append(note)
        else:
            kept.append((EventField(g.name, t, not g.missing_or_null), note, g.parts))
    lines = [
        f"# Written by krishiv init from {source or f'{sample.records} sampled records of topic {topic}'}.",
        *([f"# {not_objects(sample)}"] if sample.not_objects else []),
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
    times = event_times(sample)
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
    for f, note, parts in kept:
        lines += field_lines(f, note, parts)
    lines += [f"# {note}" for note in left]
    return "\n".join(lines) + "\n"


#: A nested field's declaration longer than this is split into dotted keys, a part a line (``gps.fields.lat = …``).
LINE = 100
_TIMES = ("timestamp", "timestamp_ms")


def field_lines(f: EventField, note: str, parts: Sequence[tuple[str, str]] = ()) -> list[str]:
    """A field's declaration in ``[pipelines.fields]``: a scalar's on one line, its note beside it; a nested
    type's as an inline table (split into dotted keys when longer than ``LINE``), after a comment line for it and
    for each of its parts that has a note, each named by its path."""
    if not f.type.is_nested:
        return [f"{f.name} = {_toml(f.declaration())}" + (f"  # {note}" if note else "")]
    said = [(f.name, note)] * bool(note) + list(parts)
    return [f"# {path}: {n}" for path, n in said] + _declared(f.name, f.declaration())


def _declared(key: str, decl: Any) -> list[str]:
    one = f"{key} = {_toml(decl)}"
    if len(one) <= LINE or not isinstance(decl, dict):
        return [one]
    ordered = sorted(decl.items(), key=lambda kv: kv[0] not in ("type", "required"))  # type and required first
    return [line for k, v in ordered for line in _declared(f"{key}.{k}", v)]


def _toml(decl: Any) -> str:
    """A declaration (``FieldType.declaration()``: names, tables of them, ``required``) as a TOML value."""
    if isinstance(decl, bool):
        return "true" if decl else "false"
    if isinstance(decl, dict):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in decl.items()) + " }"
    return json.dumps(decl)


def not_objects(sample: Sample) -> str:
    """The sampled records that are not JSON objects, which the pipeline will make rejects."""
    n = len(sample.not_objects)
    shown = ", ".join(sample.not_objects[:3]) + (f" and {n - 3:,} more" if n > 3 else "")
    said = "is not a JSON object and will be a reject" if n == 1 else "are not JSON objects and will be rejects"
    return f"{n:,} of {sample.records:,} sampled records {said}: {shown}"


def inferred_paths(sample: Sample) -> dict[str, FieldPath]:
    """Every field init declares, by its path (``gps``, ``gps.lat``), top-level fields first."""
    fields = []
    for g in sample.fields.values():
        t = g.spec_type()[0]
        if t is not None:
            fields.append(EventField(g.name, t, not g.missing_or_null))
    return dict(sorted(field_paths(tuple(fields)).items(), key=lambda kv: kv[0].count(".")))


def event_times(sample: Sample) -> list[str]:
    """The fields, by their paths, that are a time in every sampled record: what may be a windowed event time."""
    return [path for path, p in inferred_paths(sample).items() if p.type.name in _TIMES and p.required]


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
    paths = inferred_paths(sample)
    if kind == "windowed" and not event_times(sample):
        raise ConfigError(
            "--kind",
            "a windowed pipeline needs an event time, and no field of the sample is a time" + _near_times(sample),
        )
    if kind == "upsert":
        missing = [k for k in key if k not in paths or not paths[k].required or not paths[k].type.is_scalar]
        if not key or missing:
            raise ConfigError(
                "--key",
                "an upsert pipeline needs --key FIELD[,FIELD], fields every sampled record has, each one value "
                "(a dotted path names one inside a struct: device.id)"
                + (f"; not {', '.join(missing)}" if missing else ""),
            )


def _near_times(sample: Sample) -> str:
    """The way out when no field is a time in every record: the fields that are one in most of them."""
    near = []
    for g in sample.fields.values():
        texts = [_TEXT.decode(token) for token, _ in g.seen if json_kind(token) == "string"]
        times = sum(iso_time(t) is not None and len(t) != 10 for t in texts)  # a date alone is no event time
        if texts and times >= 0.9 * len(g.seen):
            near.append(f"{g.name} is one in {times} of {len(g.seen)} sampled values")
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
