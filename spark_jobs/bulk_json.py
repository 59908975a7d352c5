"""Plain JSON records read in bulk by Arrow's C++ JSON reader, wherever its reading is certainly the rule's.

The rule (:mod:`spark_jobs.record_decoder`, docs/spec.md "Field types") is stated one token at a time, and its fast
path decodes records one by one with msgspec. For a spec of flat fields (every type but ``binary``, ``json`` and the
nested ones) Arrow's reader parses a whole block of records against the fields' Arrow types in C++, several times
faster. It is given a block only where it reads exactly what the rule reads; anywhere else (or where Arrow refuses
the block, as it does a record that is not plainly valid) the block is halved, down to :data:`MIN_BLOCK` records,
and what is left goes to the record-by-record fast path, so a value's reading never depends on the path.

Where Arrow's reader and the rule part, and how each difference is kept out of the bulk path:

* **Lines are not records.** Arrow reads newline-delimited JSON (a carriage return ends a line too, and a line may
  hold several objects), and pyarrow 26 crashes on a line that is a bare ``null``. Each value is wrapped as
  ``{"v": <value>}`` on its own line: a value that is not one JSON object is then an error or a null ``v`` (read by
  the rule), a value of two objects an error or a second row (the rows must be as many as the values), and a block
  whose values hold a line break is not bulk read.
* **NaN and Infinity** are not JSON (the rule calls the record malformed); Arrow reads them, even in a key no field
  names. A block holding either word anywhere is not bulk read.
* **Decimals.** Arrow reads exponent notation, a leading ``+`` or ``.`` and a trailing ``.``, which the rule refuses:
  a block is bulk read only if every token of each decimal field's key is ``null`` or plain digits, bare or quoted
  (a regular expression over the block, occurrences of the key counted against its plain tokens).
* **Escapes.** A key spelt with ``\\u`` escapes would pass that count unseen, and Arrow reads some invalid
  surrogates: a block holding ``\\u`` is not bulk read. Arrow does not check UTF-8 either: the block is checked first.
* **Required fields** missing or null, and ``timestamp_ms`` values outside its years, are rows the rule reads.
* **Times**: ``timestamp`` and ``date`` fields are read as strings and converted by the fast path's own conversion.

Blocks that hold a reject cost Arrow more than one parse (the halves are parsed again); a block of
:data:`MIN_BLOCK` records or fewer that Arrow refuses goes to the fast path whole.
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from krishiv_core.spec import EventField
from spark_jobs.record_decoder import EXACT, TIMESTAMP_MS_RANGE, Decoding, arrow_type, fast_times, typed_column

#: A refused block is halved down to this many records; a smaller one goes to the record-by-record path.
MIN_BLOCK = 512
#: The types Arrow reads as the rule does (times as strings, converted as the fast path converts them).
BULK_TYPES = frozenset({"string", "boolean", "double", "long", "int", "timestamp_ms", "timestamp", "date"})
_FIELD_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_WRAP = b'{"v":'
_BETWEEN = b'}\n{"v":'
_PLAIN_TOKEN = rb'"\s*:\s*(?:null|("?)-?[0-9]+(?:\.[0-9]+)?\1)\s*[,}]'
_BLOCK_OPTIONS = pj.ReadOptions(use_threads=False, block_size=1 << 30)

#: What the record-by-record path gives for a slice: columns (lists or Arrow arrays) and the rows left to the rule.
Columns = tuple[dict[str, Any], list[int]]


def bulk_reader(decoding: Decoding, min_block: int = MIN_BLOCK) -> BulkJson | None:
    """The bulk reader of a pipeline's records, or None where its fields are not all of :data:`BULK_TYPES`."""
    if not decoding.is_plain_json:
        return None
    if not all(
        (f.type.is_decimal or f.type.name in BULK_TYPES) and _FIELD_NAME.fullmatch(f.name) for f in decoding.fields
    ):
        return None
    return BulkJson(decoding, min_block)


def _read_as(f: EventField) -> pa.DataType:
    name = f.type.name
    if name in ("timestamp", "date"):
        return pa.string()
    if name == "timestamp_ms":
        return pa.int64()
    return arrow_type(f.type)


class BulkJson:
    """Reads blocks of plain JSON records with Arrow where :func:`bulk_reader` allows it."""

    def __init__(self, decoding: Decoding, min_block: int = MIN_BLOCK) -> None:
        self.decoding = decoding
        self.min_block = min_block
        schema = pa.schema([("v", pa.struct([(f.name, _read_as(f)) for f in decoding.fields]))])
        self._options = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
        #: Per decimal field: its key, and the key followed by a plain token (``null``, or digits, bare or quoted).
        self._decimals = [
            (b'"' + f.name.encode() + b'"', re.compile(b'"' + re.escape(f.name.encode()) + _PLAIN_TOKEN))
            for f in decoding.fields
            if f.type.is_decimal
        ]
        self._decimal_fields = [f for f in decoding.fields if f.type.is_decimal]
        self._required = [f.name for f in decoding.fields if f.name in decoding.required]
        self._times = [f for f in decoding.fields if f.type.name in ("timestamp", "date", "timestamp_ms")]
        #: Blocks Arrow read, and records the record-by-record path took: for tests and profiles.
        self.bulk_records = 0
        self.fallback_records = 0

    def columns(self, values: Sequence[bytes | None], fallback: Callable[[Sequence[bytes | None]], Columns]) -> Columns:
        """The output columns of ``values`` as Arrow arrays, and the rows left to the rule; ``fallback``: the
        record-by-record fast path, for the slices Arrow does not take."""
        pieces: list[Columns] = []
        self._read(values, 0, fallback, pieces)
        if len(pieces) == 1:
            return pieces[0]
        columns = {name: pa.concat_arrays([piece[name] for piece, _ in pieces]) for name in self.decoding.output}
        return columns, [i for _, slow in pieces for i in slow]

    def _read(
        self,
        values: Sequence[bytes | None],
        start: int,
        fallback: Callable[[Sequence[bytes | None]], Columns],
        pieces: list[Columns],
    ) -> None:
        read = self._block(values)
        if read is not None:
            self.bulk_records += len(values)
            columns, slow = read
            pieces.append((columns, [start + i for i in slow]))
            return
        if len(values) > self.min_block:
            half = len(values) // 2
            self._read(values[:half], start, fallback, pieces)
            self._read(values[half:], start + half, fallback, pieces)
            return
        self.fallback_records += len(values)
        columns, slow = fallback(values)
        arrays = {name: self._array(columns[name], name) for name in self.decoding.output}
        pieces.append((arrays, [start + i for i in slow]))

    def _array(self, column: Any, name: str) -> pa.Array:
        return column if isinstance(column, pa.Array) else typed_column(column, self.decoding.field(name).type)

    def _block(self, values: Sequence[bytes | None]) -> Columns | None:
        """The block read by Arrow, or None where the bulk path may not take it whole."""
        present = values if None not in values else [b"null" if v is None else v for v in values]
        block = _WRAP + _BETWEEN.join(present) + b"}"
        if (
            block.count(b"\n") != len(values) - 1
            or b"\r" in block
            or b"\\u" in block
            or b"NaN" in block
            or b"Infinity" in block
        ):
            return None
        for key, plain in self._decimals:
            if block.count(key) != len(plain.findall(block)):
                return None
        try:
            block.decode("utf-8")
            table = pj.read_json(io.BytesIO(block), read_options=_BLOCK_OPTIONS, parse_options=self._options)
        except (pa.ArrowInvalid, UnicodeDecodeError):
            return None
        if table.num_rows != len(values):
            return None
        records = table.column("v").combine_chunks()
        slow_mask = records.is_null()
        for name in self._required:
            slow_mask = pc.or_(slow_mask, records.field(name).is_null())
        converted: dict[str, Any] = {}
        for f in self._decimal_fields:  # Arrow checks a decimal's precision only for a token with a fraction
            largest = Decimal(10**f.type.precision - 1).scaleb(-f.type.scale, EXACT)
            largest = pa.scalar(largest, pa.decimal128(38, f.type.scale))
            wide = records.field(f.name).cast(pa.decimal128(38, f.type.scale))
            slow_mask = pc.or_(slow_mask, pc.fill_null(pc.greater(pc.abs(wide), largest), False))
        for f in self._times:
            column = records.field(f.name)
            if f.type.name == "timestamp_ms":
                low, high = TIMESTAMP_MS_RANGE
                outside = pc.or_(pc.less(column, low), pc.greater(column, high))
                slow_mask = pc.or_(slow_mask, pc.fill_null(outside, False))
                inside = pc.if_else(pc.fill_null(outside, False), None, column)
                converted[f.name] = inside.cast(pa.timestamp("ms")).cast(pa.timestamp("us", tz="UTC"))
            else:
                times, bad = fast_times(column.to_pylist(), dates=f.type.name == "date")
                if bad:
                    slow_mask = pc.or_(slow_mask, _mask(len(values), bad))
                converted[f.name] = pa.array(times, arrow_type(f.type))
        slow = pc.indices_nonzero(pc.fill_null(slow_mask, True)).to_pylist()
        columns = {name: converted.get(name, records.field(name)) for name in self.decoding.output}
        return columns, slow


def _mask(n: int, rows: list[int]) -> pa.Array:
    mask = np.zeros(n, dtype=bool)
    mask[rows] = True
    return pa.array(mask)
