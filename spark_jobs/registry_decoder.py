"""Records in the Schema Registry formats, and Debezium change events, to a pipeline's typed columns.

A value (or key) in the Confluent wire format is a magic byte 0, a 4-byte big-endian schema id and the payload.
Each record is read in three steps, each a reject with its reason when it fails, never a crash:

1. the frame: fewer than 6 bytes is ``not in the Confluent wire format: N bytes``; another first byte is ``… magic
   byte 0x7b, expected 0``;
2. the writer schema, fetched by id through confluent-kafka's ``SchemaRegistryClient`` (which caches it): an id
   the registry does not know is ``schema id N is not in the registry``. A registry that does not answer (refused
   connection, timeout, 5xx) is retried with back-off for ``registry_outage_s``, then the task fails naming it; a
   401/403 fails it at once: records are never skipped, the batch fails whole and is read again when restarted.
   A writer schema registered after the one the pipeline's fields were taken from (a higher id) with a field they
   lack fails the batch too (:class:`NewWriterSchema`): read by the old fields, that field's values would be lost,
   so the run starts the query again with the subject's latest fields and the batch is read again with them;
3. the payload, by confluent-kafka's deserializer for the format (``AvroDeserializer``: read by the writer schema,
   or resolved to the reader schema Krishiv took the fields from; ``JSONDeserializer``: validated by the schema;
   ``ProtobufDeserializer``): a payload it cannot read is ``undecodable avro payload (schema id N): why``.

The decoded value is then read field by field (:func:`spark_jobs.value_reading.read_row`; a JSON Schema payload
by the JSON rule, so its decimals stay exact), after the Debezium envelope, when the pipeline has one, is opened
(:mod:`spark_jobs.debezium`).
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import date, datetime
from decimal import Decimal
from typing import Any

import pyarrow as pa

from krishiv_core.formats import AVRO, DEBEZIUM, JSON, JSON_SCHEMA, PROTOBUF, STRING
from krishiv_core.runbook import runbook
from krishiv_core.schema_fields import SEPARATOR
from krishiv_core.spec_types import LIST, STRUCT, EventField, FieldType
from spark_jobs.debezium import (
    Decoded,
    Unreadable,
    avro_hints,
    change_event,
    decode_columns,
    transaction_of,
    unwrap_json,
)
from spark_jobs.errors import KafkaSourceError, NewWriterSchema
from spark_jobs.record_decoder import (
    CDC_DELETE,
    SHOWN,
    Decoding,
    Reading,
    RecordDecoder,
    arrow_type,
    read_record,
    read_tombstone_key,
)
from spark_jobs.source_lines import say
from spark_jobs.value_reading import read_row, read_value

_HEADER = 5
_RUNBOOK = runbook("A Schema Registry that does not answer")
_NEW_FIELDS_RUNBOOK = runbook("A schema version with new fields")
#: The change-event columns a Debezium pipeline's table may carry (``krishiv_core.formats.CDC_COLUMNS``).
CDC_PREFIX = "_cdc_"
#: The column of a change event's source transaction (``cdc_columns`` ``tx``).
TX_COLUMN = "_cdc_tx"


class RegistryUnavailable(KafkaSourceError):
    """The Schema Registry did not answer within the bound, or refused Krishiv's credentials."""


class _Reject(Exception):
    """A record that is a reject: the message is its reason."""


_CLIENTS: dict[tuple[tuple[str, str], ...], Any] = {}


def decoder_for(decoding: Decoding) -> RecordDecoder:
    """The decoder of a pipeline's records: JSON's fast path, or the registry formats' and Debezium's."""
    return RecordDecoder(decoding) if decoding.is_plain_json else RegistryRecordDecoder(decoding)


def registry_client(config: Mapping[str, str]) -> Any:
    """One ``SchemaRegistryClient`` per configuration in a process, so its schema cache serves every task."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    key = tuple(sorted(config.items()))
    client = _CLIENTS.get(key)
    if client is None:
        client = _CLIENTS[key] = SchemaRegistryClient.new_client(dict(config))  # mock:// for unit tests
    return client


def _status(exc: Exception) -> int | None:
    return getattr(exc, "http_status_code", None)


def fetch_writer_schema(client: Any, schema_id: int, url: str, outage_s: float, fmt: str | None = None) -> Any:
    """The registry's schema of ``schema_id`` (cached by the client), None if the registry does not know it;
    :class:`RegistryUnavailable` when it does not answer within ``outage_s`` or refuses the credentials."""
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    began = time.monotonic()
    deadline = began + outage_s
    pause = 0.5
    waiting = False
    while True:
        try:
            schema = client.get_schema(schema_id, fmt=fmt)  # cached by id, whatever the format: always ask the same
            if waiting:
                say(f"the Schema Registry at {url} is back after {time.monotonic() - began:.0f}s")
            return schema
        except SchemaRegistryError as exc:
            status = _status(exc)
            if status == 404:
                return None
            if status in (401, 403):
                raise RegistryUnavailable(
                    f"the Schema Registry at {url} refused Krishiv ({status} {exc.error_message}): check the "
                    f"credentials in [schema_registry] (basic.auth.user.info or bearer.auth.*) {_RUNBOOK}"
                ) from None
            problem = f"{status} {exc.error_message}"
            if status is not None and status < 500:
                raise RegistryUnavailable(
                    f"the Schema Registry at {url} answered {problem} for schema id {schema_id} {_RUNBOOK}"
                ) from None
        except Exception as exc:  # connection refused, timeout: the client's own errors are not one class
            problem = f"{type(exc).__name__}: {str(exc)[:200]}"
        if time.monotonic() + pause > deadline:
            raise RegistryUnavailable(
                f"the Schema Registry at {url} did not answer for {outage_s:.0f}s ({problem}); the batch's records "
                "were not read: start again once it answers (KRISHIV_REGISTRY_OUTAGE_S sets how long to wait) "
                + _RUNBOOK
            )
        if not waiting:
            waiting = True
            say(f"the Schema Registry at {url} did not answer ({problem}); retrying for up to {outage_s:g}s")
        time.sleep(pause)
        pause = min(pause * 2, 5.0)


class FormatReader:
    """Bytes in one format to a decoded value, by confluent-kafka's deserializer for it."""

    def __init__(self, fmt: str, decoding: Decoding, field: str, outage_s: float) -> None:
        from confluent_kafka.serialization import MessageField

        self.fmt = fmt
        self.field = MessageField.KEY if field == "key" else MessageField.VALUE
        self.what = "key" if field == "key" else "payload"
        self.outage_s = outage_s
        self._deserialize: Callable[[bytes, Any], Any] | None = None
        #: Per schema id as framed (4 bytes): the id, its Debezium column hints, and its Avro reader (None: the
        #: deserializer reads it).
        self._known: dict[bytes, tuple[int, dict[str, Any], Callable[[bytes], Any] | None]] = {}
        self.reader_schema = decoding.reader_schema if field == "value" else None
        #: The schema id the fields were taken from (values only): a later writer schema's fields are checked.
        self.fields_schema_id = decoding.fields_schema_id if field == "value" else None
        self.fields = decoding.fields
        # the fields were taken flattened (``flatten = true``) when the schema has records and the fields no struct
        self.flatten = not any(f.type.name == STRUCT for f in decoding.fields)
        self.debezium = decoding.envelope is not None
        if fmt in (AVRO, PROTOBUF, JSON_SCHEMA):
            assert decoding.registry is not None, "a registry format needs [schema_registry]"
            self.url = decoding.registry.get("url", "")
            self.client = registry_client(decoding.registry)
            self._deserialize = self._deserializer()

    def _deserializer(self) -> Callable[[bytes, Any], Any]:
        if self.fmt == AVRO:
            from confluent_kafka.schema_registry.avro import AvroDeserializer

            return AvroDeserializer(self.client, schema_str=self.reader_schema)
        if self.fmt == JSON_SCHEMA:
            from confluent_kafka.schema_registry.json_schema import JSONDeserializer

            return JSONDeserializer(None, schema_registry_client=self.client)
        from spark_jobs.protobuf_messages import ProtobufReader

        return ProtobufReader(self.client)

    def frame(self, data: bytes) -> tuple[int, Any]:
        """The schema id of a value in the Confluent wire format and its schema, once the registry knows it."""
        if len(data) <= _HEADER:
            raise _Reject(
                f"not in the Confluent wire format: {len(data)} bytes, expected a magic byte 0, a 4-byte schema "
                f"id and the {self.fmt} {self.what}"
            )
        if data[0] != 0:
            raise _Reject(f"not in the Confluent wire format: magic byte 0x{data[0]:02x}, expected 0")
        schema_id = int.from_bytes(data[1:_HEADER], "big")
        fmt = "serialized" if self.fmt == PROTOBUF else None  # as ProtobufReader asks (and confluent-kafka's own)
        schema = fetch_writer_schema(self.client, schema_id, self.url, self.outage_s, fmt)
        if schema is None:
            raise _Reject(f"schema id {schema_id} is not in the Schema Registry at {self.url}")
        return schema_id, schema

    def _check_new_fields(self, schema_id: int, schema: Any, topic: str) -> None:
        """Raise :class:`NewWriterSchema` when ``schema`` (registered after the fields' schema) has a field the query
        does not read: read by the old fields its value would be lost for good. Checked once per schema id."""
        from krishiv_core.errors import ConfigError
        from krishiv_core.schema_fields import fields_of

        try:
            fields = fields_of(self.client, schema, schema_id, self.fmt, self.debezium, self.flatten)
        except ConfigError as exc:
            new = f"a field Krishiv's tables do not hold ({exc})"
        else:
            known = set(type_paths(self.fields))
            new_paths = [p.split(": ")[0] for p in type_paths(fields) if p not in known]
            # each new part once, by its outermost path (``tags``, not also ``tags[]``)
            names = [
                p for p in new_paths if not any(p.startswith(q) and p[len(q)] in ".[{" for q in new_paths if q != p)
            ]
            if not names:
                return
            new = f"fields the query does not read ({', '.join(names)})"
        raise NewWriterSchema(
            f"topic {topic}: records of schema id {schema_id} have {new}; the query's fields are schema id "
            f"{self.fields_schema_id}'s: the batch was stopped before anything was staged, so no value is lost, and "
            "krishiv run starts the query again with the fields of the subject's latest version; if that version "
            "lacks them too, register the records' version under the pipeline's subject or list the fields under "
            f"[pipelines.fields] {_NEW_FIELDS_RUNBOOK}"
        )

    def read(self, data: bytes, topic: str) -> Decoded:
        """The decoded value (a dict for a record, a message, a JSON object) with its Debezium column hints."""
        assert self._deserialize is not None
        known = self._known.get(data[1:_HEADER]) if len(data) > _HEADER and data[0] == 0 else None
        if known is None:
            schema_id, schema = self.frame(data)
            if self.fields_schema_id is not None and schema_id > self.fields_schema_id:
                self._check_new_fields(schema_id, schema, topic)
            hints = avro_hints(schema.schema_str) if self.fmt == AVRO else {}
            plain = not (schema.rule_set and schema.rule_set.domain_rules)
            reader = None
            if plain and self.fmt == AVRO:
                reader = avro_reader(self._deserialize, schema)
            elif plain and self.fmt == JSON_SCHEMA and not schema.references:
                reader = json_schema_reader(schema.schema_str)
            known = self._known[data[1:_HEADER]] = (schema_id, hints, reader)
        schema_id, hints, reader = known
        try:
            if reader is not None:
                try:
                    return Decoded(reader(data[_HEADER:]), hints)
                except NotPlainlyValid:
                    pass  # the deserializer reads it, and says why it is not valid
            from confluent_kafka.serialization import SerializationContext

            return Decoded(self._deserialize(data, SerializationContext(topic, self.field)), hints)
        except _unreadable() as exc:
            why = str(exc).strip() or type(exc).__name__
            if isinstance(exc, EOFError | StopIteration):
                why = "it ends before the record does (truncated)"
            raise _Reject(f"undecodable {self.fmt} {self.what} (schema id {schema_id}): {why[:200]}") from None


def avro_reader(deserializer: Any, writer: Any) -> Callable[[bytes], Any]:
    """How ``AvroDeserializer`` reads a payload of ``writer`` (a schema with no data-contract rules): the same
    ``fastavro.schemaless_reader`` call with the deserializer's own parsed schemas (its reader schema, else the
    writer's), without its per-record work for rules, subjects and tags (60 of the 75 µs a record took).
    ``tests/spark_jobs/test_registry_decoder.py`` holds the canary on the deserializer's internals used here."""
    from fastavro import schemaless_reader

    parsed = deserializer._get_parsed_schema(writer)
    reader = deserializer._reader_schema if deserializer._reader_schema is not None else parsed
    return lambda payload: schemaless_reader(io.BytesIO(payload), parsed, reader, False)


class NotPlainlyValid(Exception):
    """A payload a compiled validator does not take: the deserializer reads it (and names what is wrong)."""


def json_schema_reader(schema_str: str) -> Callable[[bytes], Any] | None:
    """How ``JSONDeserializer`` reads a payload of a schema without rules or references, with the schema compiled
    once by jsonschema-rs (about 90 times python-jsonschema's validation, which was most of a record's time): the
    payload parsed by ``json.loads`` as the deserializer parses it, then validated by the draft its ``$schema`` names
    (else 2020-12, as ``jsonschema.validators.validator_for``) without format assertions, as the deserializer
    validates. A payload it does not take (unparsable, invalid, a value it cannot hold) raises
    :class:`NotPlainlyValid`, and the deserializer reads it: a record is a reject only by the deserializer's word.
    None when jsonschema-rs cannot compile the schema (every payload is then the deserializer's).
    ``tests/spark_jobs/test_json_schema_reader.py`` compares the two validators on generated documents."""
    import json

    import jsonschema_rs

    try:
        validator = jsonschema_rs.validator_for(json.loads(schema_str), validate_formats=False)
    except Exception:  # a schema jsonschema-rs does not compile: the deserializer validates as before
        return None

    def read(payload: bytes) -> Any:
        try:
            doc = json.loads(payload)
            valid = validator.is_valid(doc)
        except Exception:
            raise NotPlainlyValid from None
        if not valid:
            raise NotPlainlyValid
        return doc

    return read


def _unreadable() -> tuple[type[BaseException], ...]:
    """What a deserializer raises for a payload it cannot read (the record is a reject). Anything else (a missing
    module, a bug) fails the batch whole: a record is never made a reject by Krishiv's own fault."""
    from confluent_kafka.serialization import SerializationError
    from fastavro.read import SchemaResolutionError
    from google.protobuf.message import DecodeError

    return (
        SerializationError,
        SchemaResolutionError,
        DecodeError,
        EOFError,
        StopIteration,
        ValueError,
        IndexError,
        OverflowError,
        UnicodeDecodeError,
    )


def _read_fields(row: Mapping[str, Any], types: Mapping[str, Any], names: Sequence[str], required: Any) -> Reading:
    """The fields ``names`` of a decoded row by the value rule (``types``: each field's type, nested ones to any
    depth); ``required`` says which must be present (inside structs, the types say)."""
    return read_row(row, [EventField(n, types[n]) for n in names], required)


def flattened(row: Mapping[str, Any], names: frozenset[str], prefix: str = "") -> Mapping[str, Any]:
    """A decoded record with each nested record that is not a field (``names``) as its fields, ``<record>_<field>``
    (a pipeline with ``flatten = true``, ``krishiv_core.schema_fields``); a field's own value (a struct, a map) is
    kept whole."""
    if not prefix and not any(k not in names and isinstance(v, Mapping) for k, v in row.items()):
        return row
    flat: dict[str, Any] = {}
    for name, value in row.items():
        if isinstance(value, Mapping) and prefix + name not in names:
            flat |= flattened(value, names, f"{prefix}{name}{SEPARATOR}")
        else:
            flat[prefix + name] = value
    return flat


def type_paths(fields: Sequence[EventField]) -> list[str]:
    """Every part of the fields in order, named by its path (``gps.lat``, ``tags[].at``, ``attrs{}``) with its type
    (``gps.lat: double``): a part of one field list the other lacks is a field (or a type) the other does not read."""

    def walk(t: FieldType, path: str) -> list[str]:
        parts = [f"{path}: {t}" if t.is_decimal else f"{path}: {t.name}"]
        if t.name == STRUCT:
            for f in t.fields:
                parts += walk(f.type, f"{path}.{f.name}")
        elif t.element is not None:
            parts += walk(t.element.type, path + ("[]" if t.name == LIST else "{}"))
        return parts

    return [p for f in fields for p in walk(f.type, f.name)]


#: The Python type a deserializer gives a value that certainly fits a field of each type (a decimal's and an
#: integer's range are Arrow's to check); the fast path takes a value only of this exact type.
_PLAIN_TYPES: dict[str, type] = {
    "string": str,
    "long": int,
    "int": int,
    "double": float,
    "boolean": bool,
    "decimal": Decimal,
    "timestamp": datetime,
    "timestamp_ms": datetime,
    "date": date,
    "binary": bytes,
}


class RegistryRecordDecoder(RecordDecoder):
    """:class:`RecordDecoder` for the Schema Registry formats and the Debezium envelope, into the same Arrow batch:
    its own fast path (:meth:`fast_columns`) and rule (:meth:`read_slow`)."""

    def __init__(self, decoding: Decoding) -> None:
        super().__init__(decoding)
        outage_s = decoding.registry_outage_s
        self.values = FormatReader(decoding.value_format, decoding, "value", outage_s)
        self.keys = FormatReader(decoding.key_format, decoding, "key", outage_s)
        self._types = {f.name: f.type for f in decoding.fields}
        self._names = tuple(f.name for f in decoding.fields)
        self._field_names = frozenset(self._names)
        self._row_fields = tuple(f.name for f in decoding.fields if not f.name.startswith(CDC_PREFIX))
        self._cdc_fields = tuple(f.name for f in decoding.fields if f.name.startswith(CDC_PREFIX))

    def fast_columns(self, values: Sequence[bytes | None], topic: str) -> tuple[dict[str, Any], list[int]]:
        """The fast path of Avro and Protobuf values, one rule: each value decoded once and each field's column
        built by Arrow where every value is plainly of its type (:data:`_PLAIN_TYPES`; a nested or ``json`` value is
        read by the rule) and fits; any record with anything else (not decodable, a null required field, a value of
        another type, a nested part that does not fit, one Arrow refuses) is left to
        :meth:`read_slow`, which reads it by the rule, so a record's reading never depends on the path. JSON Schema
        values: :meth:`_json_schema_columns`; Debezium records are all read by :meth:`read_slow`."""
        n = len(values)
        if self.decoding.envelope is None and self.decoding.value_format == JSON_SCHEMA:
            return self._json_schema_columns(values, topic)
        if self.decoding.envelope is not None or self.decoding.value_format not in (AVRO, PROTOBUF):
            return {name: [None] * n for name in self.decoding.output}, list(range(n))
        rows: list[Mapping[str, Any]] = []
        slow: set[int] = set()
        empty: Mapping[str, Any] = {}
        for i, value in enumerate(values):
            try:
                decoded = self.values.read(value, topic).payload if value is not None else None
            except _Reject:
                decoded = None
            if not isinstance(decoded, Mapping):
                slow.add(i)
                rows.append(empty)
            else:
                rows.append(flattened(decoded, self._field_names))
        columns: dict[str, Any] = {}
        for f in self.decoding.fields:
            listed = [row.get(f.name) for row in rows]
            plain = _PLAIN_TYPES.get(f.type.name)
            required = f.name in self.decoding.required
            seen = set(map(type, listed))
            # every value plainly of its type (the common case): nothing to look at one by one
            if plain is None or not seen <= {plain, type(None)} or (required and type(None) in seen):
                self._check_values(listed, f, plain, required, slow)
            if f.name not in self._output:
                continue
            try:
                columns[f.name] = pa.array(listed, arrow_type(f.type))
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):  # a value out of the type's range
                columns[f.name] = [None] * n
                slow.update(range(n))
        return columns, sorted(slow)

    def _check_values(
        self, listed: list[Any], f: EventField, plain: type | None, required: bool, slow: set[int]
    ) -> None:
        """Each value of a field's column: a null where the field is required, a nested or ``json`` value with a
        problem, or a value of another type than the field's leaves its record to the rule (its place nulled)."""
        for i, v in enumerate(listed):
            if v is None:
                if required:
                    slow.add(i)
            elif plain is None:  # nested or json: read by the rule here, a record with any problem is slow
                read, problems = read_value(v, f.type, f.name, self.decoding.required)
                if problems:
                    slow.add(i)
                listed[i] = None if problems else read
            elif type(v) is not plain:
                slow.add(i)
                listed[i] = None

    def _json_schema_columns(self, values: Sequence[bytes | None], topic: str) -> tuple[dict[str, Any], list[int]]:
        """JSON Schema values as :meth:`read_slow` reads them, validated by their writer schema then read by the JSON
        rule, with the plain JSON fast path (:meth:`record_columns`) over the payloads that passed; a value that did
        not is left to :meth:`read_slow`, which says why."""
        payloads: list[bytes | None] = []
        invalid: set[int] = set()
        for i, value in enumerate(values):
            try:
                if value is None:
                    raise _Reject("null value")
                self.values.read(value, topic)  # validated by its writer schema
                payloads.append(value[_HEADER:])
            except (_Reject, Unreadable):
                payloads.append(None)
                invalid.add(i)
        columns, slow = self.record_columns(payloads)
        return columns, sorted(invalid.union(slow))

    def read_slow(self, key: bytes | None, value: bytes | None, topic: str) -> Reading:
        """One record by the rule of its format and envelope."""
        try:
            if value is None:
                return self._tombstone(key, topic)
            if self.decoding.envelope == DEBEZIUM:
                return self._change(self._read(self.values, value, topic), key, topic)
            if self.decoding.value_format == JSON_SCHEMA:
                self.values.read(value, topic)  # validated by its writer schema
                return read_record(value[_HEADER:], self.decoding)
            decoded = self.values.read(value, topic).payload
            if not isinstance(decoded, Mapping):
                return Reading(f"expected a record, got {type(decoded).__name__} {str(decoded)[:SHOWN]}", {})
            return _read_fields(flattened(decoded, self._field_names), self._types, self._names, self.decoding.required)
        except (_Reject, Unreadable) as reject:
            return Reading(str(reject), {})

    @staticmethod
    def _read(reader: FormatReader, data: bytes, topic: str) -> Decoded:
        what = "key" if reader.what == "key" else "value"
        return unwrap_json(data, what) if reader.fmt == JSON else reader.read(data, topic)

    def _key_row(self, key: bytes | None, topic: str) -> Mapping[str, Any]:
        """The key fields a Kafka key holds (a Debezium key is a struct of the key columns)."""
        names = self.decoding.tombstone_key or ()
        if key is None:
            raise _Reject(f"no Kafka key: expected it to hold {', '.join(names)}")
        decoded = self._read(self.keys, key, topic)
        row = decoded.payload
        if not isinstance(row, Mapping):
            row = {names[0]: row} if len(names) == 1 else {}
        types = {n: self._types[n] for n in names}
        return decode_columns(row, types, decoded.hints, self.decoding.decimal_handling)

    def _tombstone(self, key: bytes | None, topic: str) -> Reading:
        if self.decoding.tombstone_key is None:
            return Reading("null value", {})
        if self.decoding.key_format == STRING or (self.decoding.key_format == JSON and self.decoding.envelope is None):
            return read_tombstone_key(key, self.decoding)
        names = self.decoding.tombstone_key
        return _read_fields(self._key_row(key, topic), self._types, names, set(names))

    def _change(self, decoded: Decoded, key: bytes | None, topic: str) -> Reading:
        try:
            event = change_event(decoded, self._types, self.decoding.decimal_handling, self.decoding.cdc_version)
        except Unreadable as reject:
            return self._counted(Reading(str(reject), {}), decoded.payload)
        names = self.decoding.tombstone_key or ()
        if event.deletes:
            row: Mapping[str, Any] = event.before or {}
            if any(row.get(n) is None for n in names):  # REPLICA IDENTITY without the key: the Kafka key has it
                row = self._key_row(key, topic)
            fields = [*names, *self._cdc_fields]
            reading = _read_fields({**row, **event.cdc}, self._types, fields, set(names))
        else:
            fields = [*self._row_fields, *self._cdc_fields]
            reading = _read_fields({**(event.after or {}), **event.cdc}, self._types, fields, self.decoding.required)
        if reading.reason is None:
            reading.values[CDC_DELETE] = event.deletes
        return self._counted(reading, decoded.payload)

    def _counted(self, reading: Reading, payload: Any) -> Reading:
        """A reject keeps its source transaction (``_cdc_tx``), which still counts it among the transaction's
        events (``spark_jobs.transaction_gate``): its END counts it too."""
        if reading.reason is not None and TX_COLUMN in self._types and isinstance(payload, Mapping):
            reading.values[TX_COLUMN] = transaction_of(payload.get("transaction"))
        return reading
