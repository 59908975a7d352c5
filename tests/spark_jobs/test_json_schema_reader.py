"""JSON Schema values validated by jsonschema-rs (``spark_jobs.registry_decoder.json_schema_reader``) are only ever
taken where the deserializer's own validator, python-jsonschema, takes them too: generated documents against
schemas of every draft the registry serves, with the keywords whose implementations could part (integers written
with a fraction, big numbers, regular expressions, formats, unique items of mixed types). A document the compiled
validator refuses is read by the deserializer, so only this direction decides a record."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema.validators import validator_for

from spark_jobs.registry_decoder import NotPlainlyValid, json_schema_reader

ORDER = {
    "type": "object",
    "properties": {
        "order_id": {"type": "string", "minLength": 1, "maxLength": 12, "pattern": "^o-\\d+$"},
        "amount": {"type": "number", "minimum": 0, "exclusiveMaximum": 1000, "multipleOf": 0.01},
        "count": {"type": "integer", "maximum": 9007199254740993},
        "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True, "maxItems": 3},
        "kind": {"enum": ["a", "b", 1, None, 1.5]},
        "at": {"type": "string", "format": "date-time"},
        "meta": {
            "type": "object",
            "properties": {"v": {"const": 2}},
            "additionalProperties": False,
        },
        "choice": {"oneOf": [{"type": "integer"}, {"type": "number", "minimum": 10}]},
        "maybe": {"anyOf": [{"type": "null"}, {"type": "string", "pattern": "x$"}]},
        "flag": {"not": {"const": False}},
    },
    "required": ["order_id"],
    "if": {"properties": {"kind": {"const": "a"}}},
    "then": {"required": ["amount"]},
}
SCHEMAS = {
    "2020-12 (no $schema)": ORDER,
    "draft-07": {"$schema": "http://json-schema.org/draft-07/schema#", **ORDER},
    "draft-04": {
        "$schema": "http://json-schema.org/draft-04/schema#",
        **{k: v for k, v in ORDER.items() if k not in ("if", "then")},
        "properties": {
            **ORDER["properties"],
            "amount": {"type": "number", "minimum": 0, "maximum": 1000, "exclusiveMaximum": True},
        },
    },
}

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0.0, 1.0, 2.0, 10.0, 999.99, 1000.0, 0.015, 1e20, -0.0, 9007199254740993]),
    st.text(max_size=8),
    st.sampled_from(["o-1", "o-12", "o-", "o-1\n", "o-١٢", "a", "b", "x", "ax", "x\n", "2026-01-01T00:00:00Z", "no"]),
)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner))
documents = st.dictionaries(
    st.sampled_from([*ORDER["properties"], "other"]), values | st.just({"v": 2}), max_size=8
).map(lambda d: {"order_id": "o-1", **d} if len(d) % 2 else d)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
@settings(max_examples=300, deadline=None)
@given(doc=documents)
def test_a_document_the_compiled_validator_takes_is_valid_for_the_deserializers_validator(name, doc) -> None:
    schema = SCHEMAS[name]
    read = json_schema_reader(json.dumps(schema))
    assert read is not None, "jsonschema-rs compiles the schema"
    python = validator_for(schema)(schema)
    payload = json.dumps(doc).encode()
    try:
        read(payload)
    except NotPlainlyValid:
        return  # the deserializer reads it and decides
    assert python.is_valid(json.loads(payload)), f"jsonschema-rs took {payload!r}, python-jsonschema does not"


def test_valid_documents_are_taken_and_what_is_not_json_goes_to_the_deserializer() -> None:
    read = json_schema_reader(json.dumps(ORDER))
    assert read is not None
    assert read(b'{"order_id": "o-7", "amount": 12.5, "tags": ["x"], "at": "not a time"}')["order_id"] == "o-7"
    for payload in (b'{"order_id": 5}', b"{", b'{"order_id": "o-1", "amount": NaN}', b'{"amount": 1}'):
        with pytest.raises(NotPlainlyValid):
            read(payload)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_valid_orders_with_one_part_changed_agree_and_most_are_taken(name) -> None:
    """Seeded mutations of a valid order, one property at a time: whatever the compiled validator takes is valid
    for python-jsonschema, and it takes the valid ones (the fast path is used, not only fallen back from)."""
    import random

    rng = random.Random(36)
    schema = SCHEMAS[name]
    read = json_schema_reader(json.dumps(schema))
    assert read is not None
    python = validator_for(schema)(schema)
    base = {"order_id": "o-1", "amount": 12.5, "count": 3, "tags": ["x", "y"], "kind": "b", "meta": {"v": 2}}
    odd = [None, True, 0, 1.0, 2**64, -1, 999.995, 1000, "o-١", "o-1\n", "", [], {}, ["x", "x"], [1, "1"], 1.5]
    taken = 0
    for _ in range(2000):
        doc = dict(base)
        doc[rng.choice([*ORDER["properties"], "other"])] = rng.choice(odd)
        payload = json.dumps(doc).encode()
        try:
            read(payload)
        except NotPlainlyValid:
            continue
        taken += 1
        assert python.is_valid(json.loads(payload)), payload
    assert taken > 200
