"""Arrow's block reading of plain JSON records (:mod:`spark_jobs.bulk_json`): every record it takes is read as the
rule reads it, and each way Arrow's reader parts from the rule is kept out.

The rule's readings here are written from docs/spec.md ("Field types") case by case; the generated values of every
type go through the bulk path too, in test_record_decoder's properties (``path="bulk"``). The canary at the end
pins what the bulk path relies on pyarrow's JSON reader to refuse.
"""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime
from decimal import Decimal

import pyarrow as pa
import pyarrow.json as pj
import pytest

from krishiv_core.spec import parse_spec
from spark_jobs.bulk_json import MIN_BLOCK, bulk_reader
from spark_jobs.record_decoder import Decoding, RecordDecoder

PIPELINE = parse_spec(
    {
        "pipelines": [
            {
                "name": "p",
                "kind": "events",
                "topic": "t",
                "fields": {
                    "id": "string",
                    "n": {"type": "long", "required": False},
                    "amount": {"type": "decimal(12,2)", "required": False},
                    "x": {"type": "double", "required": False},
                    "at": "timestamp_ms",
                    "ts": {"type": "timestamp", "required": False},
                },
            }
        ]
    },
    env={},
).pipelines[0]
MALFORMED = "malformed JSON"


def _valid(i: int) -> bytes:
    return json.dumps({"id": f"o-{i}", "n": i, "amount": f"{i}.25", "x": i / 4, "at": 1_700_000_000_000 + i}).encode()


def _decoder() -> RecordDecoder:
    decoder = RecordDecoder(Decoding.of(PIPELINE))
    assert decoder.bulk is not None, "a spec of flat fields is read in bulk"
    return decoder


def _rows(decoder: RecordDecoder, values: list[bytes | None]) -> list[dict]:
    n = len(values)
    return decoder.decode([None] * n, values, "t", 0, list(range(n)), [0] * n).to_pylist()


# (the value, the reason docs/spec.md gives it: None when valid)
EDGES = [
    (
        b'{"id": "a", "at": 1, "amount": 1e2}',
        "mistyped field: amount (decimal(12,2), got a JSON number 1e2: exponent notation, write it as plain digits)",
    ),
    (
        b'{"id": "a", "at": 1, "amount": "1E+2"}',
        'mistyped field: amount (decimal(12,2), got a JSON string "1E+2": exponent notation, write it as plain digits)',
    ),
    (
        b'{"id": "a", "at": 1, "amount": "+1.5"}',
        'mistyped field: amount (decimal(12,2), got a JSON string "+1.5": not a number)',
    ),
    (
        b'{"id": "a", "at": 1, "amount": ".5"}',
        'mistyped field: amount (decimal(12,2), got a JSON string ".5": not a number)',
    ),
    (
        b'{"id": "a", "at": 1, "amount": "1."}',
        'mistyped field: amount (decimal(12,2), got a JSON string "1.": not a number)',
    ),
    (
        b'{"id": "a", "at": 1, "amount": 12345678901}',
        "mistyped field: amount (decimal(12,2), got a JSON number 12345678901: 11 integer digits, at most 10)",
    ),
    (b'{"id": "a", "at": 1, "amount": "0001234567890.10"}', None),  # leading zeros aside: 10 integer digits
    (b'{"id": "a", "at": 1, "amount": 1.230}', None),  # trailing zeros of the fraction aside
    (
        b'{"id": "a", "at": 1, "am\\u006funt": 1e2}',
        "mistyped field: amount (decimal(12,2), got a JSON number 1e2: exponent notation, write it as plain digits)",
    ),  # the key spelt with an escape is the same key
    (b'{"id": "a", "at": 1, "other": NaN}', MALFORMED),  # not JSON, even in a key no field names
    (b'{"id": "a", "at": 1, "x": Infinity}', MALFORMED),
    (b'{"id": "a", "at": 1}\n{"id": "b", "at": 2}', MALFORMED),  # two objects in one value
    (b'{"id": "a", "at": 1} {"id": "b", "at": 2}', MALFORMED),
    (b'{"id": "a",\r"at": 1}', None),  # whitespace between tokens, a line break included
    (b'{"id": "a",\n"at": 1}', None),
    (b"null", MALFORMED),
    (b"", MALFORMED),
    (b"[1]", MALFORMED),
    (b'{"id": "a", "at": 1, "id": "b"}', None),  # a key given twice counts once, the last
    (b'{"id": "\xff", "at": 1}', MALFORMED),  # not UTF-8
    (b'{"id": "\\ud800", "at": 1}', MALFORMED),  # a lone surrogate
    (
        b'{"id": "a", "at": 253402300800000}',
        "mistyped field: at (timestamp_ms, got a JSON number 253402300800000: out of range)",
    ),
    (b'{"id": "a", "at": null}', "null field: at"),
    (b'{"id": "a"}', "missing field: at"),
    (b'{"id": "a", "at": 1, "n": 1.0}', "mistyped field: n (long, got a JSON number 1.0: not an integer)"),
    (b'{"id": "a", "at": 1, "n": "1"}', 'mistyped field: n (long, got a JSON string "1")'),
    (b'{"id": 5, "at": 1}', "mistyped field: id (string, got a JSON number 5)"),
    (b'{"id": "a", "at": 1, "ts": "2026-01-01T05:30:00+05:30"}', None),
    (
        b'{"id": "a", "at": 1, "ts": "soon"}',
        'mistyped field: ts (timestamp, got a JSON string "soon": not an ISO-8601 time)',
    ),
]


@pytest.mark.parametrize(("value", "reason"), EDGES, ids=[str(i) for i in range(len(EDGES))])
def test_an_edge_value_alone_and_among_valid_records_is_read_by_the_rule(value, reason):
    decoder = _decoder()
    alone = _rows(decoder, [value])[0]
    assert alone["reason"] == reason
    values = [_valid(i) for i in range(3 * MIN_BLOCK)]
    values[MIN_BLOCK + 7] = value
    rows = _rows(decoder, values)
    assert rows[MIN_BLOCK + 7] == {**alone, "offset": MIN_BLOCK + 7}
    assert [r["reason"] for i, r in enumerate(rows) if i != MIN_BLOCK + 7] == [None] * (len(values) - 1)
    assert [r["amount"] for r in rows[:MIN_BLOCK]] == [Decimal(f"{i}.25") for i in range(MIN_BLOCK)]
    assert decoder.bulk is not None and decoder.bulk.bulk_records >= 2 * MIN_BLOCK, "the halves without it are bulk"


def test_plain_records_are_read_in_bulk_with_their_values():
    decoder = _decoder()
    values = [_valid(i) for i in range(5_000)]
    values[10] = json.dumps({"id": "t", "at": 5, "ts": "2026-01-01T00:00:00Z", "amount": None}).encode()
    values[11] = None  # a null value
    rows = _rows(decoder, values)
    assert decoder.bulk is not None and decoder.bulk.fallback_records <= MIN_BLOCK
    assert rows[10]["ts"] == datetime(2026, 1, 1, tzinfo=UTC) and rows[10]["amount"] is None
    assert rows[11]["reason"] == "null value"
    assert rows[4999] == {
        "key": None,
        "value": None,
        "topic": "t",
        "partition": 0,
        "offset": 4999,
        "timestamp": datetime(1970, 1, 1, tzinfo=UTC),
        "reason": None,
        "id": "o-4999",
        "n": 4999,
        "amount": Decimal("4999.25"),
        "x": 4999 / 4,
        "at": datetime(2023, 11, 14, 22, 13, 24, 999_000, tzinfo=UTC),
        "ts": None,
    }


def test_specs_the_bulk_path_cannot_read_exactly_keep_the_record_path():
    nested = parse_spec(
        {"pipelines": [{"name": "p", "kind": "events", "topic": "t", "fields": {"b": "binary", "j": "json"}}]}, env={}
    ).pipelines[0]
    assert bulk_reader(Decoding.of(nested)) is None
    assert bulk_reader(Decoding.of(PIPELINE)) is not None


@pytest.mark.parametrize(
    ("line", "column_type"),
    [
        (b'{"v": 1.0}', pa.int64()),
        (b'{"v": 1e3}', pa.int64()),
        (b'{"v": 9223372036854775808}', pa.int64()),
        (b'{"v": 2147483648}', pa.int32()),
        (b'{"v": "1"}', pa.int64()),
        (b'{"v": true}', pa.int64()),
        (b'{"v": 1}', pa.bool_()),
        (b'{"v": 5}', pa.string()),
        (b'{"v": {"a": 1}}', pa.string()),
        (b'{"v": "5"}', pa.float64()),
        (b'{"v": 1e400}', pa.float64()),
        (b'{"v": 1.234}', pa.decimal128(12, 2)),
        (b'{"v": 99999999999.99}', pa.decimal128(12, 2)),
        (b'{"v": 1, "v": 2}', pa.int64()),
        (b'{"v": 1,}', pa.int64()),
        (b'{"v": "\\ud800"}', pa.string()),
        (b'{"v": 5}', pa.struct([("a", pa.int64())])),
    ],
)
def test_canary_pyarrow_json_reader_refuses_what_the_bulk_path_leaves_to_the_rule(line, column_type):
    """The bulk path takes a block Arrow reads without error; these are the refusals it counts on (an int token
    with a fraction, a number for a string, a key twice, a decimal that does not fit, ...). A pyarrow that reads any
    of them stops being exact here: see spark_jobs/bulk_json.py before upgrading."""
    options = pj.ParseOptions(explicit_schema=pa.schema([("v", column_type)]), unexpected_field_behavior="ignore")
    with pytest.raises(pa.ArrowInvalid):
        pj.read_json(io.BytesIO(line), parse_options=options)
