"""One exact reading of a JSON value as a field's declared type, for every kind (README, "Field types").

A record is parsed once as a VARIANT (``try_parse_json``), which keeps a JSON number in plain notation of up to 38
digits as an exact DECIMAL (or an integer), so no number passes through a double on its way to a decimal or a
string. The value's token class (``schema_of_variant``: STRING, BIGINT, DECIMAL(p,s), DOUBLE, BOOLEAN, ARRAY<…>,
OBJECT<…>, VOID for a JSON null) decides whether it fits the field's type:

- ``string``: a JSON string only; ``long``, ``int``, ``timestamp_ms``: a JSON integer in the type's range;
  ``double``: any JSON number; ``boolean``: true or false; ``timestamp``: an ISO-8601 JSON string;
- ``decimal(p,s)``: a JSON number in plain notation, or a JSON string holding one, exactly representable: after
  dropping the fraction's trailing zeros at most ``s`` fraction digits, and at most ``p - s`` integer digits
  (leading zeros aside).

A value that does not fit gives ``name (type, got <the JSON token>[: why])``. Only rejected values reach the
branches that describe them (the raw text of a number is found in the record's text there, since the VARIANT
keeps a number's value, not its spelling), so the happy path pays for one parse and a class test per field.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from krishiv_core.spec import FieldType

#: JSON integers as the VARIANT types them.
_INTEGERS = ("BIGINT", "INT", "SMALLINT", "TINYINT")
_PLAIN = r"^-?[0-9]+(\.[0-9]+)?$"
_EXPONENT = r"^-?[0-9]+(\.[0-9]+)?[eE][+-]?[0-9]+$"
#: The epoch milliseconds of a ``timestamp_ms`` field: 0001-01-01 to 9999-12-31, as Spark's timestamps.
TIMESTAMP_MS_RANGE = (-62_135_596_800_000, 253_402_300_799_999)
#: A shown token is cut to this many characters.
SHOWN = 40


@dataclass(frozen=True)
class ParsedField:
    """One field of a record: its typed value (null unless it fits), and why it does not fit."""

    value: Column  # null when missing, null, or mistyped
    missing: Column  # the key is absent (or the record is not an object)
    null: Column  # the key holds a JSON null
    mistyped: Column  # ``name (type, got …[: why])`` where the value does not fit, else null


@dataclass(frozen=True)
class FieldSource:
    """Where a field's value comes from: its VARIANT (null when absent) and the spelling of a number, if found."""

    name: str
    type: FieldType
    value: Column
    raw: Column


def parse_record(text: Column) -> tuple[Column, Column]:
    """(the record as a VARIANT, whether it is a JSON object): not an object is ``malformed JSON``."""
    doc = F.try_parse_json(text)
    return doc, doc.isNotNull() & F.ltrim(text, F.lit(" \t\n\r")).startswith("{")


def record_field(doc: Column, text: Column, name: str, t: FieldType) -> FieldSource:
    """Field ``name`` of the record ``doc`` (parsed from ``text``), to read as ``t``."""
    value = F.try_variant_get(doc, f"$.{name}", "variant")  # the spec's names are identifiers
    raw = F.regexp_extract(text, rf'"{name}"\s*:\s*(-?[0-9][0-9.eE+-]*)', 1)
    return FieldSource(name, t, value, raw)


def key_field(key_text: Column, name: str, t: FieldType) -> FieldSource | ParsedField:
    """A one-field key from a Kafka key's text: a string key is the text itself, an ISO-8601 time key is cast from
    it; any other is its JSON token."""
    if t.name == "string":
        return ParsedField(key_text, key_text.isNull(), F.lit(False), F.lit(None).cast("string"))
    if t.name == "timestamp":
        value = key_text.try_cast("timestamp")
        why = F.concat(F.lit(f"{name} ({t}, got "), F.substring(key_text, 1, SHOWN), F.lit(": not an ISO-8601 time)"))
        return ParsedField(value, key_text.isNull(), F.lit(False), F.when(key_text.isNotNull() & value.isNull(), why))
    return FieldSource(name, t, F.try_parse_json(key_text), F.trim(key_text))


def read_fields(
    df: DataFrame, sources: Sequence[FieldSource | ParsedField], prefix: str
) -> tuple[DataFrame, list[ParsedField]]:
    """``df`` with each source read (columns named from ``prefix``), and the fields as columns of it.

    Each step is a projection of its own, referring to the columns of the step before, so an expensive expression
    occurs once per projection: Spark's common-subexpression elimination would otherwise compute a repeated one
    for every row, even one only a rejected row's message needs (a regular expression over the record's text).
    """

    def name(step: str, i: int) -> str:
        return f"{prefix}_{step}_{i}"

    def col(step: str, i: int) -> Column:
        return F.col(name(step, i))

    read = [(i, s) for i, s in enumerate(sources) if isinstance(s, FieldSource)]

    def step(make) -> list[Column]:
        return [make(i, s) for i, s in read]

    df = df.select("*", *step(lambda i, s: s.value.alias(name("v", i))))
    df = df.select("*", *step(lambda i, s: F.schema_of_variant(col("v", i)).alias(name("c", i))))
    columns = []
    for i, s in read:
        typed, fits = _candidate(col("v", i), col("c", i), s.type)
        present = col("v", i).isNotNull() & ~F.is_variant_null(col("v", i))
        columns += [typed.alias(name("t", i)), (present & ~fits).alias(name("bad", i))]
    df = df.select("*", *columns)
    # Only a rejected value is described: its spelling as written, else the VARIANT's rendering (see _spelling).
    df = df.select(
        "*",
        *step(lambda i, s: F.when(col("bad", i), s.raw).alias(name("raw", i))),
        *step(lambda i, s: F.when(col("bad", i), F.to_json(col("v", i))).alias(name("js", i))),
        *step(lambda i, s: F.when(col("bad", i), F.try_variant_get(col("v", i), "$", "double")).alias(name("d", i))),
    )
    df = df.select(
        "*",
        *step(
            lambda i, s: F.when(col("bad", i), _spelling(col("raw", i), col("js", i), col("d", i))).alias(name("sp", i))
        ),
    )
    df = df.select(
        "*",
        *step(
            lambda i, s: F.when(col("bad", i), _message(col("v", i), col("c", i), col("sp", i), col("js", i), s)).alias(
                name("m", i)
            )
        ),
    )
    fields = []
    for i, s in enumerate(sources):
        if isinstance(s, ParsedField):
            fields.append(s)
            continue
        value = col("v", i)
        fields.append(
            ParsedField(F.when(~col("bad", i), col("t", i)), value.isNull(), F.is_variant_null(value), col("m", i))
        )
    return df, fields


def _candidate(value: Column, cls: Column, t: FieldType) -> tuple[Column, Column]:
    """(the value typed as ``t``, whether it fits ``t``) of a present, non-null VARIANT of class ``cls``."""
    is_int = cls.isin(*_INTEGERS)
    is_number = is_int | cls.startswith("DECIMAL") | (cls == "DOUBLE")
    if t.name == "string":
        return F.try_variant_get(value, "$", "string"), cls == "STRING"
    if t.name in ("long", "int", "timestamp_ms"):
        typed = F.try_variant_get(value, "$", "int" if t.name == "int" else "bigint")
        fits = is_int & typed.isNotNull()
        if t.name == "timestamp_ms":  # the years 1-9999, as Spark's timestamps
            fits = fits & typed.between(*TIMESTAMP_MS_RANGE)
            return F.when(fits, F.timestamp_millis(typed)), fits
        return typed, fits
    if t.name == "double":
        return F.try_variant_get(value, "$", "double"), is_number
    if t.name == "boolean":
        return F.try_variant_get(value, "$", "boolean"), cls == "BOOLEAN"
    if t.name == "timestamp":
        typed = F.when(cls == "STRING", F.try_variant_get(value, "$", "string").try_cast("timestamp"))
        return typed, typed.isNotNull()
    if t.is_decimal:
        string = F.when(is_int | cls.startswith("DECIMAL") | (cls == "STRING"), F.try_variant_get(value, "$", "string"))
        fits = string.rlike(_PLAIN) & _decimal_excess(string, t).isNull()
        return F.when(fits, string.try_cast(f"decimal({t.precision},{t.scale})")), F.coalesce(fits, F.lit(False))
    raise ValueError(f"no reading for type {t}")  # pragma: no cover - the spec refuses other types


def _message(value: Column, cls: Column, spelling: Column, rendered: Column, s: FieldSource) -> Column:
    """``name (type, got <the JSON token>[: why])`` of a value that does not fit: ``spelling`` is the number as
    written, ``rendered`` the VARIANT's JSON."""
    t = s.type
    is_int = cls.isin(*_INTEGERS)
    is_number = is_int | cls.startswith("DECIMAL") | (cls == "DOUBLE")
    why: Column | None = None
    if t.name in ("long", "int", "timestamp_ms"):
        why = F.when(is_int, F.lit("out of range")).when(is_number, _integer_why(spelling))
    elif t.name == "timestamp":
        why = F.when(cls == "STRING", F.lit("not an ISO-8601 time"))
    elif t.is_decimal:
        # exact digits: a string as sent; an integer or DECIMAL as the VARIANT holds it; a DOUBLE as written
        digits = F.when(cls == "DOUBLE", spelling).otherwise(F.try_variant_get(value, "$", "string"))
        why = F.when(
            is_number | (cls == "STRING"),
            F.when(digits.rlike(_PLAIN), _decimal_excess(digits, t))
            .when(digits.rlike(_EXPONENT), F.lit("exponent notation, write it as plain digits"))
            .otherwise(F.lit("not a number")),
        )
    got = F.concat(F.lit(f"{s.name} ({t}, got "), _token(cls, spelling, rendered))
    if why is not None:
        got = F.concat(got, F.coalesce(F.concat(F.lit(": "), why), F.lit("")))
    return F.concat(got, F.lit(")"))


def _spelling(raw: Column, rendered: Column, as_double: Column) -> Column:
    """A number's text as written (``raw``, found in the record's text) when it reads as the same number, else the
    VARIANT's own rendering (a record whose field name is also nested: the first spelling found was another's)."""
    same = raw.try_cast("double") == as_double
    return F.when((raw != "") & same, raw).otherwise(rendered)


def _token(cls: Column, spelling: Column, rendered: Column) -> Column:
    """What the JSON gave: ``a JSON string "12"``, ``a JSON number 12.5``, ``a JSON array``…"""
    shown = F.substring(rendered, 1, SHOWN)
    return (
        F.when(cls == "STRING", F.concat(F.lit("a JSON string "), shown))
        .when(cls == "BOOLEAN", F.concat(F.lit("a JSON boolean "), shown))
        .when(cls.startswith("ARRAY"), F.lit("a JSON array"))
        .when(cls.startswith("OBJECT"), F.lit("a JSON object"))
        .otherwise(F.concat(F.lit("a JSON number "), F.substring(spelling, 1, SHOWN)))
    )


def _integer_why(spelling: Column) -> Column:
    """Why a JSON number that is not a plain integer token does not fit an integer type."""
    return (
        F.when(spelling.rlike("[eE]"), F.lit("exponent notation"))
        .when(spelling.contains("."), F.lit("not an integer"))
        .otherwise(F.lit("out of range"))
    )


def _decimal_excess(digits: Column, t: FieldType) -> Column:
    """Null when plain ``digits`` fit ``decimal(p,s)`` exactly, else which bound they pass."""
    unsigned = F.ltrim(digits, F.lit("-"))
    integer = F.length(F.ltrim(F.substring_index(unsigned, ".", 1), F.lit("0")))
    fraction = F.length(F.when(unsigned.contains("."), F.rtrim(F.substring_index(unsigned, ".", -1), F.lit("0"))))
    fraction = F.coalesce(fraction, F.lit(0))
    whole = t.precision - t.scale
    return F.when(
        fraction > t.scale,
        F.concat(_count(fraction, "decimal place"), F.lit(f", the scale is {t.scale}")),
    ).when(integer > whole, F.concat(_count(integer, "integer digit"), F.lit(f", at most {whole}")))


def _count(n: Column, noun: str) -> Column:
    return F.concat(n.cast("string"), F.lit(f" {noun}"), F.when(n != 1, F.lit("s")).otherwise(F.lit("")))
