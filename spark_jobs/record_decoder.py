"""Kafka payloads to a pipeline's typed columns, in the source's tasks: one exact reading of every field type.

The rule (docs/spec.md, "Field types"): a record is a JSON object; each declared field is read from its top-level key.

- ``string``: a JSON string only; ``boolean``: true or false; ``double``: any JSON number;
- ``long``, ``int``, ``timestamp_ms``: a JSON integer token (no fraction, no exponent) in the type's range
  (``timestamp_ms``: epoch milliseconds of the years 1-9999);
- ``timestamp``: a JSON string in ISO 8601 as Python's ``datetime.fromisoformat`` reads it, UTC when it has no
  offset;
- ``decimal(p,s)``: a JSON number in plain notation, or a JSON string holding one, exactly representable: after
  dropping the fraction's trailing zeros at most ``s`` fraction digits, and at most ``p - s`` integer digits
  (leading zeros aside). A number is never read through a double.

A value that does not fit gives ``name (type, got <the JSON token>[: why])``; the record's reason is the first of
``null value``, ``malformed JSON`` (not one JSON object), ``mistyped field: …`` (every field that does not fit, in
spec order), ``null field: x`` / ``missing field: x`` (a required field or the event time, in spec order). A key
given twice counts once, the last.

Two readings, one rule. :func:`read_token` states it for one JSON token and decides every record that is not
plainly valid; the fast path (msgspec's typed decoder, then Arrow kernels for decimals) takes only what is certainly
valid under it, and sends everything else to :func:`read_token`, so a value's reading never depends on which path
took it. Spark receives typed columns and the reason; a valid row's raw value is not carried (rejects keep theirs),
except in a windowed pipeline, whose late events keep theirs (``Decoding.keep_values``).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime
from decimal import Context, Decimal
from typing import Annotated, Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from krishiv_core.formats import JSON, STRING
from krishiv_core.spec import EventField, FieldType, PipelineSpec
from krishiv_core.spec_types import ELEMENT, JSON_TEXT, LIST, MAP, STRUCT, VALUE, field_paths
from krishiv_core.tables import spark_type

#: The epoch milliseconds of a ``timestamp_ms`` field: 0001-01-01 to 9999-12-31, as Spark's timestamps.
TIMESTAMP_MS_RANGE = (-62_135_596_800_000, 253_402_300_799_999)
INTEGER_RANGES = {
    "long": (-(2**63), 2**63 - 1),
    "int": (-(2**31), 2**31 - 1),
    "timestamp_ms": TIMESTAMP_MS_RANGE,
}
#: A shown token is cut to this many characters.
SHOWN = 40
#: A Kafka record's columns: the source's raw schema, and its columns before the decoded fields (where ``value`` is
#: a reject's only).
KAFKA_COLUMNS = (
    ("key", pa.binary()),
    ("value", pa.binary()),
    ("topic", pa.string()),
    ("partition", pa.int32()),
    ("offset", pa.int64()),
    ("timestamp", pa.timestamp("us", tz="UTC")),
)
REASON = "reason"
#: An upsert row that is a tombstone (a null Kafka value): its key fields come from the Kafka key.
TOMBSTONE = "__tombstone"
#: A Debezium change event that deletes its row (``op = d``): its key fields come from ``before``.
CDC_DELETE = "__cdc_delete"

_PLAIN = re.compile(r"-?[0-9]+(\.[0-9]+)?")
_EXPONENT = re.compile(r"-?[0-9]+(\.[0-9]+)?[eE][+-]?[0-9]+")
#: A decimal token the fast path takes: plain digits, bare or in a string without escapes.
_FAST_DECIMAL = r'^"?-?0*(?P<i>[0-9]*?)(?:\.(?P<f>[0-9]*?)0*)?"?$'
_FAST_DECIMAL_GUARD = r'^"?-?[0-9]+(\.[0-9]+)?"?$'
#: Decimal arithmetic wide enough for any value of a decimal(38, s) (Python's default context keeps 28 digits).
EXACT = Context(prec=80)
_RAW_OBJECT = msgspec.json.Decoder(dict[str, msgspec.Raw])
_ANY = msgspec.json.Decoder()


def arrow_type(t: FieldType) -> pa.DataType:
    """The Arrow type the source hands Spark a field as. Every nested part is nullable, as Spark's DDL types of the
    query declare them (the rule has already refused a null where a part is required, and staging checks it again
    against the table's schema)."""
    if t.is_decimal:
        return pa.decimal128(t.precision, t.scale)
    if t.name == STRUCT:
        return pa.struct([pa.field(f.name, arrow_type(f.type)) for f in t.fields])
    if t.name == LIST:
        assert t.element is not None
        return pa.list_(pa.field(ELEMENT, arrow_type(t.element.type)))
    if t.name == MAP:
        assert t.element is not None and t.key is not None
        return pa.map_(arrow_type(t.key), pa.field(VALUE, arrow_type(t.element.type)))
    return {
        JSON_TEXT: pa.string(),
        "binary": pa.binary(),
        "string": pa.string(),
        "long": pa.int64(),
        "int": pa.int32(),
        "double": pa.float64(),
        "boolean": pa.bool_(),
        "timestamp": pa.timestamp("us", tz="UTC"),
        "timestamp_ms": pa.timestamp("us", tz="UTC"),
        "date": pa.date32(),
    }[t.name]


@dataclass(frozen=True)
class Decoding:
    """What the source decodes for a pipeline (picklable; an option of the source as JSON).

    ``fields`` are read and checked, ``required`` must be present and not null, ``output`` are the fields carried to
    Spark as columns, and ``tombstone_key`` (upsert) the key fields a tombstone's Kafka key holds.
    """

    fields: tuple[EventField, ...]
    required: frozenset[str]
    output: tuple[str, ...]
    tombstone_key: tuple[str, ...] | None = None
    #: How the records are encoded (``krishiv_core.formats``): value and key formats, envelope, Debezium options.
    value_format: str = JSON
    key_format: str = STRING
    envelope: str | None = None
    decimal_handling: str = "precise"
    #: The column that orders a Debezium pipeline's events (``_cdc_lsn`` or ``_cdc_ts``).
    cdc_version: str | None = None
    #: The Schema Registry client's configuration, resolved (the driver resolves it, as it does Kafka's settings).
    registry: Mapping[str, str] | None = None
    #: How long a task waits for a Schema Registry that does not answer (``KRISHIV_REGISTRY_OUTAGE_S``).
    registry_outage_s: float = 60.0
    #: The Avro reader schema (fields taken from the registry), else each record is read by its writer schema.
    reader_schema: str | None = None
    #: Carry every record's raw value, not only a reject's: a windowed pipeline keeps its late events' payloads
    #: (which events are late is known only in the sink, from the watermark the batch before left).
    keep_values: bool = False
    #: The registry's id of the schema the fields were taken from, when every field is a column (events, upsert): a
    #: record of a schema registered after it with a field not among them stops its batch (``NewWriterSchema``).
    fields_schema_id: int | None = None

    @classmethod
    def of(
        cls, pipeline: PipelineSpec, registry: Mapping[str, str] | None = None, registry_outage_s: float = 60.0
    ) -> Decoding:
        from krishiv_core.spec import EVENTS, UPSERT, WINDOWED

        fields = pipeline.fields
        if pipeline.event_time_field:  # the event time is required, and so every struct on its path
            fields = _required_at(fields, pipeline.event_time_field.split("."))
        required = {f.name for f in fields if f.required}
        if pipeline.kind in (EVENTS, UPSERT):
            output = tuple(f.name for f in fields)
        else:  # the top-level fields the aggregations, the group-by and the event time read
            read = {a.field for a in pipeline.aggregations if a.field} | set(pipeline.group_by)
            read.add(pipeline.event_time_field or "")
            tops = {name.split(".")[0] for name in read}
            output = tuple(f.name for f in fields if f.name in tops)
        key = tuple(pipeline.key) if pipeline.kind == UPSERT else None
        fmt = pipeline.record_format
        return cls(
            tuple(fields),
            frozenset(required),
            output,
            key,
            fmt.value,
            fmt.key,
            fmt.envelope,
            fmt.cdc.decimal_handling if fmt.cdc else "precise",
            fmt.cdc.version_column if fmt.cdc else None,
            dict(registry) if fmt.uses_registry and registry is not None else None,
            registry_outage_s,
            fmt.reader_schema,
            pipeline.kind == WINDOWED,
            fmt.fields_schema_id if pipeline.kind in (EVENTS, UPSERT) else None,
        )

    def to_option(self) -> str:
        return json.dumps(
            {
                "fields": [[f.name, f.type.declaration(), f.required] for f in self.fields],
                "required": sorted(self.required),
                "output": list(self.output),
                "tombstone_key": None if self.tombstone_key is None else list(self.tombstone_key),
                "format": [self.value_format, self.key_format, self.envelope, self.decimal_handling, self.cdc_version],
                "registry": None if self.registry is None else dict(self.registry),
                "registry_outage_s": self.registry_outage_s,
                "reader_schema": self.reader_schema,
                "keep_values": self.keep_values,
                "fields_schema_id": self.fields_schema_id,
            }
        )

    @classmethod
    def from_option(cls, text: str) -> Decoding:
        from krishiv_core.spec import parse_field_type

        doc = json.loads(text)
        fields = tuple(EventField(n, parse_field_type(t, n), bool(r)) for n, t, r in doc["fields"])
        key = doc.get("tombstone_key")
        value_format, key_format, envelope, handling, version = doc.get("format", [JSON, STRING, None, "precise", None])
        return cls(
            fields,
            frozenset(doc["required"]),
            tuple(doc["output"]),
            None if key is None else tuple(key),
            value_format,
            key_format,
            envelope,
            handling,
            version,
            doc.get("registry"),
            float(doc.get("registry_outage_s", 60.0)),
            doc.get("reader_schema"),
            bool(doc.get("keep_values", False)),
            doc.get("fields_schema_id"),
        )

    @property
    def is_plain_json(self) -> bool:
        """JSON values and string keys, no envelope: what :class:`RecordDecoder`'s fast path reads."""
        return self.value_format == JSON and self.envelope is None and self.key_format in (STRING, JSON)

    def field(self, name: str) -> EventField:
        return next(f for f in self.fields if f.name == name)

    def arrow_schema(self) -> pa.Schema:
        extra = [(TOMBSTONE, pa.bool_())] if self.tombstone_key is not None else []
        extra += [(CDC_DELETE, pa.bool_())] if self.envelope is not None else []
        return pa.schema(
            [*KAFKA_COLUMNS, (REASON, pa.string()), *extra] + [(n, arrow_type(self.field(n).type)) for n in self.output]
        )

    def spark_schema(self) -> str:
        extra = f", {TOMBSTONE} boolean" if self.tombstone_key is not None else ""
        extra += f", {CDC_DELETE} boolean" if self.envelope is not None else ""
        columns = "".join(f", `{n}` {spark_type(self.field(n).type)}" for n in self.output)
        return (
            "key binary, value binary, topic string, partition int, offset bigint, timestamp timestamp, "
            f"{REASON} string{extra}{columns}"
        )


def _required_at(fields: tuple[EventField, ...], parts: list[str]) -> tuple[EventField, ...]:
    """``fields`` with the field at the path ``parts`` and every struct on the way required."""
    out = []
    for f in fields:
        if f.name == parts[0]:
            t = f.type
            if len(parts) > 1 and t.name == STRUCT:
                t = replace(t, fields=_required_at(t.fields, parts[1:]))
            f = EventField(f.name, t, True)
        out.append(f)
    return tuple(out)


# --- the rule, one token at a time -----------------------------------------------------------------------------


class Malformed(Exception):
    """The record is not one JSON object (or a string in it is not valid UTF-8)."""


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def decimal_excess(digits: str, t: FieldType) -> str | None:
    """Why plain ``digits`` do not fit ``decimal(p,s)`` exactly (None when they do)."""
    whole, _, fraction = digits.lstrip("-").partition(".")
    whole, fraction = whole.lstrip("0"), fraction.rstrip("0")
    if len(fraction) > t.scale:
        return f"{_plural(len(fraction), 'decimal place')}, the scale is {t.scale}"
    if len(whole) > t.precision - t.scale:
        return f"{_plural(len(whole), 'integer digit')}, at most {t.precision - t.scale}"
    return None


def iso_time(text: str) -> datetime | None:
    try:
        return _utc(datetime.fromisoformat(text))
    except ValueError:
        return None


def shown_token(token: bytes) -> tuple[Any, str]:
    """(a JSON string token's value, else None; the token as a reason shows it: ``a JSON number 1.005``, cut to
    :data:`SHOWN` characters)."""
    first = token[:1]
    if first == b'"':
        try:
            value = _ANY.decode(token)
        except (msgspec.DecodeError, UnicodeDecodeError):
            raise Malformed from None
        return value, f"a JSON string {json.dumps(value, ensure_ascii=False)[:SHOWN]}"
    if first in (b"t", b"f"):
        return None, f"a JSON boolean {token.decode()}"
    if first == b"[":
        return None, "a JSON array"
    if first == b"{":
        return None, "a JSON object"
    return None, f"a JSON number {token.decode()[:SHOWN]}"


def read_token(token: bytes, t: FieldType) -> tuple[Any, str | None]:
    """(the value, None) or (None, ``(type, got …[: why])``) of one present, non-null JSON token as ``t``."""
    first = token[:1]
    value, got = shown_token(token)
    spelling = "" if first in (b'"', b"t", b"f", b"[", b"{") else token.decode()
    why: str | None = None
    name = t.name
    if name == "string" and first == b'"':
        return value, None
    if name == "boolean" and first in (b"t", b"f"):
        return token == b"true", None
    is_number = first not in (b'"', b"t", b"f", b"[", b"{")
    if name in INTEGER_RANGES and is_number:
        low, high = INTEGER_RANGES[name]
        exponent, fraction = "e" in spelling or "E" in spelling, "." in spelling
        # (a token of more than 20 digits is out of every range; int() of a very long one would refuse it)
        if not exponent and not fraction and len(spelling) <= 21 and low <= int(spelling) <= high:
            return int(spelling), None
        why = "exponent notation" if exponent else "not an integer" if fraction else "out of range"
    elif name == "double" and is_number:
        return float(spelling), None
    elif name == "binary" and first == b'"':
        data = read_binary(value)
        if data is not None:
            return data, None
        why = "not base64"
    elif name == "date" and first == b'"':
        try:
            return date.fromisoformat(value), None
        except ValueError:
            why = "not an ISO-8601 date"
    elif name == "timestamp" and first == b'"':
        moment = iso_time(value)
        if moment is not None:
            return moment, None
        why = "not an ISO-8601 time"
    elif t.is_decimal and (is_number or first == b'"'):
        digits = spelling if is_number else value
        if _EXPONENT.fullmatch(digits):
            why = "exponent notation, write it as plain digits"
        elif not _PLAIN.fullmatch(digits):
            why = "not a number"
        else:
            why = decimal_excess(digits, t)
            if why is None:
                return Decimal(digits).quantize(Decimal(1).scaleb(-t.scale), context=EXACT), None
    return None, f"({t}, got {got}" + (f": {why})" if why else ")")


def read_binary(text: str) -> bytes | None:
    """A ``binary`` value's bytes from base64 (RFC 4648, standard alphabet, padded), else None."""
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None


@dataclass(frozen=True)
class Reading:
    """One record as the rule reads it: the reason (None when valid) and the fields' values (a valid record's)."""

    reason: str | None
    values: dict[str, Any]


def read_record(value: bytes, decoding: Decoding) -> Reading:
    """The rule for one non-null Kafka value."""
    try:
        doc = _RAW_OBJECT.decode(value)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError):
        return Reading("malformed JSON", {})
    from spark_jobs.nested_json import Problems, read_fields

    problems = Problems()
    try:
        values = read_fields(doc, decoding.fields, "", problems, decoding.required)
    except Malformed:
        return Reading("malformed JSON", {})
    if problems.mistyped:
        return Reading("mistyped field: " + ", ".join(problems.mistyped), {})
    if problems.absent:
        return Reading(problems.absent[0], {})
    return Reading(None, values)


def read_tombstone_key(key: bytes | None, decoding: Decoding) -> Reading:
    """A tombstone's key fields from its Kafka key: the key itself for a one-field key (a string key as its text, a
    time key as ISO 8601 text, any other as its JSON token), else a JSON object holding the key fields, each at its
    path (``{"device": {"id": 7}, "site": "north"}`` for ``device.id`` and ``site``). The values come back at their
    paths: ``device.id`` as ``{"device": {"id": 7}}`` (the struct's other fields null)."""
    names = decoding.tombstone_key or ()
    without = Reading(f"tombstone without a key: expected the Kafka key to hold {', '.join(names)}", {})
    if key is None:
        return without
    paths = field_paths(decoding.fields)
    text = key.decode("utf-8", errors="replace")
    if len(names) == 1:
        name, t = names[0], paths[names[0]].type
        if t.name == "string":
            return Reading(None, _at_paths({name: text}))
        if t.name == "timestamp":
            moment = iso_time(text)
            if moment is None:
                return Reading(f"mistyped field: {name} ({t}, got {text[:SHOWN]}: not an ISO-8601 time)", {})
            return Reading(None, _at_paths({name: moment}))
        tokens = {name: text.strip().encode()}
        try:
            _ANY.decode(tokens[name])
        except (msgspec.DecodeError, UnicodeDecodeError):
            return without
    else:
        try:
            tokens = _tokens_at_paths(key, names)
        except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError):
            return without
    values: dict[str, Any] = {}
    mistyped: list[str] = []
    for name in names:
        token = tokens.get(name)
        if token is None or token == b"null":
            continue
        try:
            read, why = read_token(token, paths[name].type)
        except Malformed:
            return without
        if why is not None:
            mistyped.append(f"{name} {why}")
        values[name] = read
    if mistyped:
        return Reading("mistyped field: " + ", ".join(mistyped), {})
    if len(values) < len(names):
        return without
    return Reading(None, _at_paths(values))


def _tokens_at_paths(key: bytes, names: tuple[str, ...]) -> dict[str, bytes]:
    """Each dotted path's JSON token in a JSON object (``{"device": {"id": 7}}`` holds ``device.id``); a path whose
    structs are missing, null or not objects has none."""
    top = {n: bytes(raw) for n, raw in _RAW_OBJECT.decode(key).items()}
    out: dict[str, bytes] = {}
    for name in names:
        first, *inner = name.split(".")
        token = top.get(first)
        for part in inner:
            try:
                token = None if token is None else bytes(_RAW_OBJECT.decode(token).get(part, b"null"))
            except (msgspec.DecodeError, msgspec.ValidationError):
                token = None
        if token is not None:
            out[name] = token
    return out


def _at_paths(values: dict[str, Any]) -> dict[str, Any]:
    """Values at dotted paths as top-level values: ``{"device.id": 7}`` is ``{"device": {"id": 7}}``."""
    out: dict[str, Any] = {}
    for path, value in values.items():
        *structs, last = path.split(".")
        at = out
        for name in structs:
            at = at.setdefault(name, {})
        at[last] = value
    return out


# --- the fast path -----------------------------------------------------------------------------------------------


def _struct_type(f: EventField, required: bool) -> tuple[Any, Any]:
    """(msgspec type, default) a field decodes as on the fast path; a required field has no default and no null, so
    a record without it fails there and is read by the rule."""
    t = f.type
    if t.is_decimal or t.name == JSON_TEXT:
        return msgspec.Raw, (msgspec.NODEFAULT if required else msgspec.Raw(b"null"))
    if t.is_nested:
        from spark_jobs.nested_json import fast_type

        nested = fast_type(t)
        return (nested, msgspec.NODEFAULT) if required else (nested | None, None)
    if t.name in INTEGER_RANGES:
        low, high = INTEGER_RANGES[t.name]
        base: Any = Annotated[int, msgspec.Meta(ge=low, le=high)]
    else:
        base = {"string": str, "timestamp": str, "date": str, "binary": str, "double": float, "boolean": bool}[t.name]
    return (base, msgspec.NODEFAULT) if required else (base | None, None)


class RecordDecoder:
    """Decodes a task's Kafka records into the Arrow batch of :meth:`Decoding.arrow_schema`."""

    def __init__(self, decoding: Decoding) -> None:
        self.decoding = decoding
        self.schema = decoding.arrow_schema()
        specs = []
        for i, f in enumerate(decoding.fields):
            kind, default = _struct_type(f, f.name in decoding.required)
            specs.append((f"f{i}", kind) if default is msgspec.NODEFAULT else (f"f{i}", kind, default))
        rename = {f"f{i}": f.name for i, f in enumerate(decoding.fields)}
        struct = msgspec.defstruct("Record", specs, kw_only=True, rename=rename, gc=False)
        self._decode = msgspec.json.Decoder(struct).decode
        # a record the fast path cannot decode: every field absent (the rule reads it)
        self._empty = struct(
            **{f"f{i}": msgspec.Raw(b"null") if _raw(f.type) else None for i, f in enumerate(decoding.fields)}
        )
        self._attr = {f.name: f"f{i}" for i, f in enumerate(decoding.fields)}
        self._output = set(decoding.output)
        # what the fast path reads: the columns carried, and the types msgspec alone does not settle
        self._checked = [
            f
            for f in decoding.fields
            if f.name in self._output or f.type.is_decimal or f.type.name in _CONVERTED or f.type.is_nested
        ]
        from spark_jobs.nested_json import fast_column

        self._fast_column = fast_column

    def decode(
        self,
        keys: Sequence[bytes | None],
        values: Sequence[bytes | None],
        topic: str,
        partition: int,
        offsets: Sequence[int],
        timestamps_ms: Sequence[int],
    ) -> pa.RecordBatch:
        """One Arrow batch of the records, every column typed as :attr:`schema` (checked when it is built)."""
        columns, slow = self.fast_columns(values, topic)
        return self._assemble(len(values), keys, values, topic, partition, offsets, timestamps_ms, columns, slow)

    def fast_columns(self, values: Sequence[bytes | None], topic: str) -> tuple[dict[str, Any], list[int]]:
        """The output columns of the records the fast path reads (a list, or an Arrow array), and the rows it left
        to :meth:`read_slow`, which :meth:`_assemble` reads by the rule."""
        return self.record_columns(values)

    def record_columns(self, values: Sequence[bytes | None]) -> tuple[dict[str, Any], list[int]]:
        """:meth:`fast_columns` of plain JSON payloads (a JSON Schema value's too, once validated): msgspec's typed
        decoder, then Arrow kernels for decimals."""
        decode, rows, slow = self._decode, [], set()
        try:
            rows = [decode(v) for v in values]  # the common case: every record plainly valid
        except Exception:
            rows = []
            for i, v in enumerate(values):
                try:
                    rows.append(decode(v))
                except Exception:
                    rows.append(self._empty)
                    slow.add(i)
        columns: dict[str, Any] = {}
        for f in self._checked:
            listed = [getattr(r, self._attr[f.name]) for r in rows]
            if f.type.is_decimal:
                column, bad = fast_decimals(listed, f.type, f.name in self.decoding.required)
            elif f.type.name in ("timestamp", "date"):
                column, bad = fast_times(listed, dates=f.type.name == "date")
            elif _by_column(f.type):  # nested, json, binary: an Arrow column of the plainly valid values
                column, bad = self._fast_column(listed, f)
            else:
                column, bad = listed, []
            slow.update(bad)
            if f.name in self._output:
                columns[f.name] = column
        return columns, sorted(slow)

    def _assemble(
        self,
        n: int,
        keys: Sequence[bytes | None],
        values: Sequence[bytes | None],
        topic: str,
        partition: int,
        offsets: Sequence[int],
        timestamps_ms: Sequence[int],
        columns: dict[str, Any],
        slow: list[int],
    ) -> pa.RecordBatch:
        reasons: list[str | None] = [None] * n if slow else []
        kept: list[bytes | None] = [None] * n if slow else []
        tombstones: list[bool] = [False] * n if self.decoding.tombstone_key is not None and slow else []
        patches: dict[int, Reading] = {}
        deletes: list[bool] = [False] * n if self.decoding.envelope is not None else []
        for i in slow:
            value = values[i]
            reading = self.read_slow(keys[i], value, topic)
            if value is None and self.decoding.tombstone_key is not None:
                tombstones[i] = True
            if deletes:
                deletes[i] = bool(reading.values.get(CDC_DELETE))
            reasons[i] = reading.reason
            if reading.reason is not None:
                kept[i] = value
            patches[i] = reading
        arrays = []
        for name in self.decoding.output:
            t = self.decoding.field(name).type
            column = columns[name]
            if isinstance(column, list):
                for i, reading in patches.items():
                    column[i] = reading.values.get(name)
                arrays.append(_typed(column, t))
            else:  # an Arrow array from the fast path: the rule's readings replace its slow rows
                if patches:
                    patch = [None] * n
                    for i, reading in patches.items():
                        patch[i] = reading.values.get(name)
                    mask = np.zeros(n, dtype=bool)
                    mask[list(patches)] = True
                    column = pc.if_else(mask, pa.array(patch, column.type), column)
                arrays.append(column)
        stamps = pa.array(timestamps_ms, pa.int64()).cast(pa.timestamp("ms")).cast(pa.timestamp("us", tz="UTC"))
        if self.decoding.keep_values:
            raw = pa.array(values, pa.binary())
        else:  # a reject's only
            raw = pa.array(kept, pa.binary()) if slow else pa.nulls(n, pa.binary())
        head = [
            pa.array(keys, pa.binary()),
            raw,
            pa.repeat(pa.scalar(topic, pa.string()), n),
            pa.repeat(pa.scalar(partition, pa.int32()), n),
            pa.array(offsets, pa.int64()),
            stamps,
            pa.array(reasons, pa.string()) if slow else pa.nulls(n, pa.string()),
        ]
        if self.decoding.tombstone_key is not None:
            head.append(pa.array(tombstones, pa.bool_()) if slow else pa.repeat(pa.scalar(False), n))
        if self.decoding.envelope is not None:
            head.append(pa.array(deletes, pa.bool_()))
        return pa.RecordBatch.from_arrays([*head, *arrays], schema=self.schema)

    def read_slow(self, key: bytes | None, value: bytes | None, topic: str) -> Reading:
        """One record the fast path did not take, by the rule."""
        if value is None and self.decoding.tombstone_key is not None:
            return read_tombstone_key(key, self.decoding)
        if value is None:
            return Reading("null value", {})
        return read_record(value, self.decoding)

    def from_kafka(self, raw: pa.RecordBatch | pa.Table) -> pa.Table:
        """Decoded rows of a table of Kafka records (``key``, ``value``, ``topic``, ``partition``, ``offset``,
        ``timestamp``), one source task per (topic, partition) as the source would read them."""
        table = raw if isinstance(raw, pa.Table) else pa.Table.from_batches([raw])
        stamps = pc.cast(pc.cast(table.column("timestamp"), pa.timestamp("ms", tz="UTC")), pa.int64()).to_pylist()
        keys, values = table.column("key").to_pylist(), table.column("value").to_pylist()
        topics, partitions = table.column("topic").to_pylist(), table.column("partition").to_pylist()
        offsets = table.column("offset").to_pylist()
        groups: dict[tuple[str, int], list[int]] = {}
        for i, where in enumerate(zip(topics, partitions, strict=True)):
            groups.setdefault(where, []).append(i)
        batches = [
            self.decode(
                [keys[i] for i in rows],
                [values[i] for i in rows],
                topic,
                partition,
                [offsets[i] for i in rows],
                [stamps[i] for i in rows],
            )
            for (topic, partition), rows in groups.items()
        ]
        return pa.Table.from_batches(batches, schema=self.schema)


#: Types whose fast-path value the rule still checks or converts (besides decimals and nested types).
_CONVERTED = ("timestamp", "date", "binary", JSON_TEXT)


def _raw(t: FieldType) -> bool:
    """A type the fast path decodes as its raw token."""
    return t.is_decimal or t.name == JSON_TEXT


def _by_column(t: FieldType) -> bool:
    return t.is_nested or t.name in ("binary", JSON_TEXT)


def _typed(column: list[Any], t: FieldType) -> pa.Array:
    if t.name == "timestamp_ms":
        return pa.array(column, pa.int64()).cast(pa.timestamp("ms")).cast(pa.timestamp("us", tz="UTC"))
    return pa.array(column, arrow_type(t))


def fast_decimals(raws: list[Any], t: FieldType, required: bool) -> tuple[pa.Array, list[int]]:
    """The decimals of the raw tokens that plainly fit ``t`` (bare or quoted plain digits), and the rows left to the
    rule: any other token, a null of a required field, a value that does not fit."""
    text = pa.array([bytes(r) for r in raws], pa.binary())
    try:
        text = text.cast(pa.string())
    except pa.ArrowInvalid:  # not UTF-8: the rule names it
        return pa.nulls(len(raws), arrow_type(t)), list(range(len(raws)))
    null = pc.equal(text, "null")
    parts = pc.extract_regex(text, _FAST_DECIMAL)
    whole = pc.utf8_length(parts.field("i"))
    fraction = pc.coalesce(pc.utf8_length(parts.field("f")), 0)
    fits = pc.and_(
        pc.match_substring_regex(text, _FAST_DECIMAL_GUARD),
        pc.and_(pc.less_equal(whole, t.precision - t.scale), pc.less_equal(fraction, t.scale)),
    )
    fits = pc.fill_null(fits, False)
    try:
        values = pc.cast(pc.if_else(fits, pc.utf8_trim(text, '"'), None), arrow_type(t))
    except pa.ArrowInvalid:
        return pa.nulls(len(raws), arrow_type(t)), list(range(len(raws)))
    settled = fits if required else pc.or_(fits, null)
    bad = pc.indices_nonzero(pc.invert(settled)).to_pylist()
    return values, bad


def fast_times(texts: list[str | None], dates: bool) -> tuple[list[Any], list[int]]:
    """The ISO-8601 times (or dates) of ``texts`` (None stays None), and the rows whose text is not one (left to
    the rule)."""
    try:
        if dates:
            return [None if s is None else date.fromisoformat(s) for s in texts], []
        return [None if s is None else _utc(datetime.fromisoformat(s)) for s in texts], []
    except ValueError:
        times: list[Any] = []
        bad = []
        for i, s in enumerate(texts):
            try:
                times.append(None if s is None else date.fromisoformat(s) if dates else _utc(datetime.fromisoformat(s)))
            except ValueError:
                times.append(None)
                bad.append(i)
        return times, bad


def _utc(moment: datetime) -> datetime:
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment
