"""Protobuf schemas as the Schema Registry holds them: ``.proto`` text rendered from a ``FileDescriptorProto`` and
parsed back (no protoc on this machine), for ``tests.services.schema_registry``."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool

_F = descriptor_pb2.FieldDescriptorProto
_SCALARS: dict[str, int] = {
    "double": _F.TYPE_DOUBLE,
    "float": _F.TYPE_FLOAT,
    "int64": _F.TYPE_INT64,
    "uint64": _F.TYPE_UINT64,
    "int32": _F.TYPE_INT32,
    "fixed64": _F.TYPE_FIXED64,
    "fixed32": _F.TYPE_FIXED32,
    "bool": _F.TYPE_BOOL,
    "string": _F.TYPE_STRING,
    "bytes": _F.TYPE_BYTES,
    "uint32": _F.TYPE_UINT32,
    "sfixed32": _F.TYPE_SFIXED32,
    "sfixed64": _F.TYPE_SFIXED64,
    "sint32": _F.TYPE_SINT32,
    "sint64": _F.TYPE_SINT64,
}
_SCALAR_NAMES = {v: k for k, v in _SCALARS.items()}
_MESSAGE_MAX = 536870912  # exclusive end of a message's "reserved N to max"
_ENUM_MAX = 2147483647

#: Files every Confluent registry (and confluent-kafka's deserializer pool) knows without a reference.
_WELL_KNOWN_MODULES = (
    "google.protobuf.any_pb2",
    "google.protobuf.source_context_pb2",
    "google.protobuf.type_pb2",
    "google.protobuf.api_pb2",
    "google.protobuf.descriptor_pb2",
    "google.protobuf.duration_pb2",
    "google.protobuf.empty_pb2",
    "google.protobuf.field_mask_pb2",
    "google.protobuf.struct_pb2",
    "google.protobuf.timestamp_pb2",
    "google.protobuf.wrappers_pb2",
    "google.type.calendar_period_pb2",
    "google.type.color_pb2",
    "google.type.date_pb2",
    "google.type.datetime_pb2",
    "google.type.dayofweek_pb2",
    "google.type.expr_pb2",
    "google.type.fraction_pb2",
    "google.type.latlng_pb2",
    "google.type.money_pb2",
    "google.type.month_pb2",
    "google.type.postal_address_pb2",
    "google.type.quaternion_pb2",
    "google.type.timeofday_pb2",
    "confluent_kafka.schema_registry.confluent.meta_pb2",
    "confluent_kafka.schema_registry.confluent.type.decimal_pb2",
)
_well_known_files: dict[str, descriptor_pb2.FileDescriptorProto] | None = None


def _well_known() -> dict[str, descriptor_pb2.FileDescriptorProto]:
    global _well_known_files
    if _well_known_files is None:
        import importlib

        files = {}
        for module_name in _WELL_KNOWN_MODULES:
            try:
                serialized = importlib.import_module(module_name).DESCRIPTOR.serialized_pb
            except ImportError:
                continue
            proto = descriptor_pb2.FileDescriptorProto.FromString(serialized)
            files[proto.name] = proto
        _well_known_files = files
    return _well_known_files


def _add_well_known(pool: descriptor_pool.DescriptorPool, name: str) -> None:
    """Add the well-known file ``name`` (and what it imports) to ``pool``, if it is one and not there yet."""
    proto = _well_known().get(name)
    if proto is None:
        return
    for dependency in proto.dependency:
        _add_well_known(pool, dependency)
    _add_file(pool, proto)


def _add_file(pool: descriptor_pool.DescriptorPool, proto: descriptor_pb2.FileDescriptorProto) -> None:
    try:
        pool.FindFileByName(proto.name)
        return  # already there (a well-known file registered as a reference)
    except KeyError:
        pass
    try:
        pool.Add(proto)
    except Exception as e:
        raise InvalidProto(f"{proto.name}: {type(e).__name__}: {e}") from None


def _unused_file_name(pool: descriptor_pool.DescriptorPool) -> str:
    n = 0
    while True:
        name = f"schema-registry-candidate-{n}.proto"
        try:
            pool.FindFileByName(name)
        except KeyError:
            return name
        n += 1


class InvalidProto(Exception):
    """A descriptor the pool refuses (the registry answers 42201)."""


class _ProtoSyntaxError(Exception):
    pass


class _Unsupported(Exception):
    pass


def _json_name(name: str) -> str:
    """protoc's default json_name: underscores dropped, the next letter upper-cased."""
    out: list[str] = []
    upper = False
    for ch in name:
        if ch == "_":
            upper = True
        else:
            out.append(ch.upper() if upper else ch)
            upper = False
    return "".join(out)


def _map_entry_name(field_name: str) -> str:
    """protoc's name for a map field's entry type: CamelCase of the field name + ``Entry``."""
    return "".join(part[:1].upper() + part[1:] for part in field_name.split("_")) + "Entry"


def _quote(value: str) -> str:
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    return '"' + escaped.replace("\t", "\\t") + '"'


def _unquote(token: str) -> str:
    body = token[1:-1]
    out: list[str] = []
    i = 0
    simple = {"n": "\n", "r": "\r", "t": "\t", "\\": "\\", '"': '"', "'": "'", "a": "\a", "b": "\b", "f": "\f"}
    while i < len(body):
        ch = body[i]
        if ch != "\\" or i + 1 == len(body):
            out.append(ch)
            i += 1
            continue
        nxt = body[i + 1]
        if nxt in simple:
            out.append(simple[nxt])
            i += 2
        elif nxt in "xX":
            digits = re.match(r"[0-9a-fA-F]{1,2}", body[i + 2 :])
            out.append(chr(int(digits.group(), 16)) if digits else nxt)
            i += 2 + (len(digits.group()) if digits else 0)
        elif nxt.isdigit():
            digits = re.match(r"[0-7]{1,3}", body[i + 1 :])
            assert digits is not None
            out.append(chr(int(digits.group(), 8)))
            i += 1 + len(digits.group())
        else:
            out.append(nxt)
            i += 2
    return "".join(out)


def _type_text(f: descriptor_pb2.FieldDescriptorProto) -> str:
    if f.type in _SCALAR_NAMES:
        return _SCALAR_NAMES[f.type]
    if f.type == _F.TYPE_GROUP:
        raise _Unsupported("groups")
    return f.type_name


def _field_text(
    f: descriptor_pb2.FieldDescriptorProto,
    proto3: bool,
    entry: descriptor_pb2.DescriptorProto | None = None,
    in_oneof: bool = False,
) -> str:
    if entry is not None:
        key, value = sorted(entry.field, key=lambda g: g.number)
        type_text, label = f"map<{_type_text(key)}, {_type_text(value)}>", ""
    else:
        type_text = _type_text(f)
        if in_oneof:
            label = ""
        elif f.label == _F.LABEL_REPEATED:
            label = "repeated "
        elif proto3:
            label = "optional " if f.proto3_optional else ""
        else:
            label = "required " if f.label == _F.LABEL_REQUIRED else "optional "
    options = []
    if f.HasField("default_value"):
        if f.type == _F.TYPE_STRING:
            options.append(f"default = {_quote(f.default_value)}")
        elif f.type == _F.TYPE_BYTES:
            options.append(f'default = "{f.default_value}"')  # already C-escaped in the descriptor
        else:
            options.append(f"default = {f.default_value}")
    if f.HasField("json_name") and f.json_name != _json_name(f.name):
        options.append(f"json_name = {_quote(f.json_name)}")
    if f.options.HasField("packed"):
        options.append(f"packed = {str(f.options.packed).lower()}")
    if f.options.deprecated:
        options.append("deprecated = true")
    suffix = f" [{', '.join(options)}]" if options else ""
    return f"{label}{type_text} {f.name} = {f.number}{suffix};"


def _reserved_lines(
    indent: str, ranges: Sequence[tuple[int, int, bool]], names: Sequence[str], lines: list[str]
) -> None:
    """``ranges`` are (start, inclusive end, reaches the maximum)."""
    if ranges:
        parts = [f"{s} to max" if to_max else str(s) if s == e else f"{s} to {e}" for s, e, to_max in ranges]
        lines.append(f"{indent}reserved {', '.join(parts)};")
    if names:
        lines.append(f"{indent}reserved {', '.join(_quote(n) for n in names)};")


def _render_enum(e: descriptor_pb2.EnumDescriptorProto, depth: int, lines: list[str]) -> None:
    indent, inner = "  " * depth, "  " * (depth + 1)
    lines.append(f"{indent}enum {e.name} {{")
    if e.options.allow_alias:
        lines.append(f"{inner}option allow_alias = true;")
    for v in e.value:
        suffix = " [deprecated = true]" if v.options.deprecated else ""
        lines.append(f"{inner}{v.name} = {v.number}{suffix};")
    ranges = [(r.start, r.end, r.end == _ENUM_MAX) for r in e.reserved_range]
    _reserved_lines(inner, ranges, list(e.reserved_name), lines)
    lines.append(f"{indent}}}")


def _render_message(
    msg: descriptor_pb2.DescriptorProto, full_name: str, depth: int, proto3: bool, lines: list[str]
) -> None:
    if msg.extension or msg.extension_range:
        raise _Unsupported("extensions")
    indent, inner = "  " * depth, "  " * (depth + 1)
    entries = {n.name: n for n in msg.nested_type if n.options.map_entry}

    def entry_of(f: descriptor_pb2.FieldDescriptorProto) -> descriptor_pb2.DescriptorProto | None:
        if f.type != _F.TYPE_MESSAGE or f.label != _F.LABEL_REPEATED:
            return None
        scope, _, name = f.type_name.lstrip(".").rpartition(".")
        return entries.get(name) if scope == full_name else None

    # The fields in order, a oneof at its first member; each item knows the map entry it declares, if any.
    items: list[tuple[str | None, list[str]]] = []
    done_oneofs: set[int] = set()
    for f in msg.field:
        if f.HasField("oneof_index") and not f.proto3_optional:
            if f.oneof_index in done_oneofs:
                continue
            done_oneofs.add(f.oneof_index)
            members = [
                g
                for g in msg.field
                if g.HasField("oneof_index") and not g.proto3_optional and g.oneof_index == f.oneof_index
            ]
            block = [f"{inner}oneof {msg.oneof_decl[f.oneof_index].name} {{"]
            block += [f"{inner}  {_field_text(g, proto3, in_oneof=True)}" for g in members]
            items.append((None, [*block, f"{inner}}}"]))
        else:
            entry = entry_of(f)
            items.append((entry.name if entry else None, [inner + _field_text(f, proto3, entry)]))
    declared = {name for name, _ in items if name is not None}
    if set(entries) - declared:
        raise _Unsupported("a map entry type without its map field")

    lines.append(f"{indent}message {msg.name} {{")
    for e in msg.enum_type:
        _render_enum(e, depth + 1, lines)
    # Nested types and fields interleaved so that parsing the text back gives the same nested_type order
    # (protoc adds a map field's entry type where the field is declared).
    j = 0
    for nested in msg.nested_type:
        if nested.options.map_entry:
            while j < len(items):
                name, block = items[j]
                j += 1
                lines.extend(block)
                if name == nested.name:
                    break
        else:
            _render_message(nested, f"{full_name}.{nested.name}", depth + 1, proto3, lines)
    for _, block in items[j:]:
        lines.extend(block)
    ranges = [(r.start, r.end - 1, r.end >= _MESSAGE_MAX) for r in msg.reserved_range]
    _reserved_lines(inner, ranges, list(msg.reserved_name), lines)
    lines.append(f"{indent}}}")


def _render_proto(proto: descriptor_pb2.FileDescriptorProto) -> str:
    """The ``.proto`` text of a file descriptor (file options dropped); ``_Unsupported`` for what it cannot show."""
    if proto.service or proto.extension:
        raise _Unsupported("services or extensions")
    if proto.syntax not in ("", "proto2", "proto3"):
        raise _Unsupported(f"syntax {proto.syntax}")
    proto3 = proto.syntax == "proto3"
    lines = [f'syntax = "{proto.syntax or "proto2"}";']
    if proto.package:
        lines.append(f"package {proto.package};")
    if proto.dependency:
        lines.append("")
        for i, dependency in enumerate(proto.dependency):
            kind = "public " if i in proto.public_dependency else "weak " if i in proto.weak_dependency else ""
            lines.append(f"import {kind}{_quote(dependency)};")
    for msg in proto.message_type:
        lines.append("")
        _render_message(msg, f"{proto.package}.{msg.name}" if proto.package else msg.name, 0, proto3, lines)
    for e in proto.enum_type:
        lines.append("")
        _render_enum(e, 0, lines)
    return "\n".join(lines) + "\n"


_TOKEN = re.compile(
    r"""
    (?P<space>\s+)
    | (?P<comment>//[^\n]*|/\*.*?\*/)
    | (?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')
    | (?P<number>0[xX][0-9a-fA-F]+|(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?)
    | (?P<ident>\.?[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)
    | (?P<symbol>[{}\[\]()<>;=,:+-])
    """,
    re.VERBOSE | re.DOTALL,
)


class _ProtoParser:
    """A ``.proto`` text parser for the subset messages on Kafka use; builds a ``FileDescriptorProto``.

    Types are resolved as protoc does (innermost scope outwards) against the file itself and ``pool`` (the
    well-known files and the schema's references).
    """

    def __init__(self, text: str, pool: descriptor_pool.DescriptorPool) -> None:
        self.tokens: list[tuple[str, str]] = []
        pos = 0
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if m is None:
                raise _ProtoSyntaxError(f"unexpected character {text[pos]!r} at offset {pos}")
            pos = m.end()
            kind = m.lastgroup
            assert kind is not None
            if kind not in ("space", "comment"):
                self.tokens.append((kind, m.group()))
        self.pos = 0
        self.pool = pool
        self.proto3 = False
        self.local: dict[str, int] = {}  # full name -> TYPE_MESSAGE / TYPE_ENUM
        self.unresolved: list[tuple[descriptor_pb2.FieldDescriptorProto, str, str]] = []

    # tokens
    def peek(self, ahead: int = 0) -> str | None:
        i = self.pos + ahead
        return self.tokens[i][1] if i < len(self.tokens) else None

    def next(self) -> str:
        if self.pos >= len(self.tokens):
            raise _ProtoSyntaxError("unexpected end of text")
        self.pos += 1
        return self.tokens[self.pos - 1][1]

    def kind(self) -> str | None:
        return self.tokens[self.pos][0] if self.pos < len(self.tokens) else None

    def expect(self, value: str) -> None:
        got = self.next()
        if got != value:
            raise _ProtoSyntaxError(f"expected {value!r}, got {got!r}")

    def ident(self) -> str:
        if self.kind() != "ident":
            raise _ProtoSyntaxError(f"expected a name, got {self.peek()!r}")
        return self.next()

    def string(self) -> str:
        if self.kind() != "string":
            raise _ProtoSyntaxError(f"expected a string, got {self.peek()!r}")
        value = _unquote(self.next())
        while self.kind() == "string":  # adjacent literals concatenate
            value += _unquote(self.next())
        return value

    def integer(self) -> int:
        sign = 1
        if self.peek() == "-":
            self.next()
            sign = -1
        token = self.next()
        try:
            return sign * int(token, 0)
        except ValueError:
            raise _ProtoSyntaxError(f"expected an integer, got {token!r}") from None

    def constant(self) -> tuple[str, str]:
        """(kind, text) of an option value; aggregates ``{...}`` are skipped."""
        if self.peek() == "{":
            depth = 0
            while True:
                token = self.next()
                depth += {"{": 1, "}": -1}.get(token, 0)
                if depth == 0:
                    return "aggregate", ""
        if self.kind() == "string":
            return "string", self.string()
        sign = ""
        if self.peek() in ("-", "+"):
            sign = "-" if self.next() == "-" else ""
        return "plain", sign + self.next()

    def option_name(self) -> str:
        parts = []
        while self.peek() not in ("=", None):
            parts.append(self.next())
        return "".join(parts)

    # grammar
    def parse(self) -> descriptor_pb2.FileDescriptorProto:
        proto = descriptor_pb2.FileDescriptorProto()
        if self.peek() == "syntax":
            self.next()
            self.expect("=")
            syntax = self.string()
            self.expect(";")
            if syntax not in ("proto2", "proto3"):
                raise _ProtoSyntaxError(f"unsupported syntax {syntax!r}")
            self.proto3 = syntax == "proto3"
            if self.proto3:
                proto.syntax = "proto3"
        elif self.peek() == "edition":
            raise _ProtoSyntaxError("editions are not supported by the test registry")
        else:
            if self.kind() != "ident" or self.peek() not in ("package", "import", "option", "message", "enum", ";"):
                raise _ProtoSyntaxError(f"not a .proto file: starts with {self.peek()!r}")
        while self.peek() is not None:
            token = self.next()
            if token == ";":
                continue
            if token == "package":
                proto.package = self.ident().lstrip(".")
                self.expect(";")
            elif token == "import":
                kind = self.next() if self.peek() in ("public", "weak") else ""
                proto.dependency.append(self.string())
                _add_well_known(self.pool, proto.dependency[-1])
                if kind == "public":
                    proto.public_dependency.append(len(proto.dependency) - 1)
                elif kind == "weak":
                    proto.weak_dependency.append(len(proto.dependency) - 1)
                self.expect(";")
            elif token == "option":
                self.option_name()
                self.expect("=")
                self.constant()
                self.expect(";")  # file options are dropped, as the rendering drops them
            elif token == "message":
                self.message(proto.message_type, proto.package)
            elif token == "enum":
                self.enum(proto.enum_type, proto.package)
            else:
                raise _ProtoSyntaxError(f"{token!r} is not supported by the test registry")
        self.resolve()
        return proto

    def message(self, container: Any, scope: str) -> None:
        name = self.ident()
        msg = container.add(name=name)
        full = f"{scope}.{name}" if scope else name
        self.local[full] = _F.TYPE_MESSAGE
        self.expect("{")
        optional3: list[descriptor_pb2.FieldDescriptorProto] = []
        while self.peek() != "}":
            token = self.peek()
            if token is None:
                raise _ProtoSyntaxError(f"message {name} is not closed")
            if token == ";":
                self.next()
            elif token == "message":
                self.next()
                self.message(msg.nested_type, full)
            elif token == "enum":
                self.next()
                self.enum(msg.enum_type, full)
            elif token == "option":
                self.next()
                self.option_name()
                self.expect("=")
                self.constant()
                self.expect(";")
            elif token == "reserved":
                self.next()
                self.reserved(msg, _MESSAGE_MAX, exclusive=True)
            elif token == "oneof":
                self.next()
                index = len(msg.oneof_decl)
                msg.oneof_decl.add(name=self.ident())
                self.expect("{")
                while self.peek() != "}":
                    if self.peek() == ";":
                        self.next()
                    elif self.peek() == "option":
                        self.next()
                        self.option_name()
                        self.expect("=")
                        self.constant()
                        self.expect(";")
                    else:
                        self.field(msg, full, oneof_index=index)
                self.expect("}")
            elif token in ("extensions", "extend", "group") or self.peek(1) == "group":
                raise _ProtoSyntaxError(f"{token} is not supported by the test registry")
            elif token == "map" and self.peek(1) == "<":
                self.map_field(msg, full)
            else:
                f = self.field(msg, full)
                if f.proto3_optional:
                    optional3.append(f)
        self.next()
        for f in optional3:  # protoc's synthetic oneofs, after the real ones
            f.oneof_index = len(msg.oneof_decl)
            msg.oneof_decl.add(name=f"_{f.name}")

    def field(
        self, msg: descriptor_pb2.DescriptorProto, scope: str, oneof_index: int | None = None
    ) -> descriptor_pb2.FieldDescriptorProto:
        label = self.next() if oneof_index is None and self.peek() in ("optional", "required", "repeated") else None
        type_name = self.ident()
        name = self.ident()
        self.expect("=")
        number = self.integer()
        f = msg.field.add(name=name, number=number)
        f.label = {"repeated": _F.LABEL_REPEATED, "required": _F.LABEL_REQUIRED}.get(label or "", _F.LABEL_OPTIONAL)
        if label == "optional" and self.proto3:
            f.proto3_optional = True
        if type_name in _SCALARS:
            f.type = _SCALARS[type_name]  # type: ignore[assignment]
        else:
            self.unresolved.append((f, scope, type_name))
        if oneof_index is not None:
            f.oneof_index = oneof_index
        self.field_options(f)
        self.expect(";")
        return f

    def field_options(self, f: descriptor_pb2.FieldDescriptorProto) -> None:
        if self.peek() != "[":
            return
        self.next()
        while True:
            name = self.option_name()
            self.expect("=")
            _, value = self.constant()
            if name == "default":
                f.default_value = value
            elif name == "json_name":
                f.json_name = value
            elif name == "packed":
                f.options.packed = value == "true"
            elif name == "deprecated":
                f.options.deprecated = value == "true"
            if self.peek() == ",":
                self.next()
                continue
            self.expect("]")
            return

    def map_field(self, msg: descriptor_pb2.DescriptorProto, scope: str) -> None:
        self.expect("map")
        self.expect("<")
        key_type = self.ident()
        self.expect(",")
        value_type = self.ident()
        self.expect(">")
        name = self.ident()
        self.expect("=")
        number = self.integer()
        if key_type not in _SCALARS or key_type in ("double", "float", "bytes"):
            raise _ProtoSyntaxError(f"invalid map key type {key_type!r}")
        entry = msg.nested_type.add(name=_map_entry_name(name))
        entry.options.map_entry = True
        entry.field.add(name="key", number=1, label=_F.LABEL_OPTIONAL, type=_SCALARS[key_type])  # type: ignore[arg-type]
        value = entry.field.add(name="value", number=2, label=_F.LABEL_OPTIONAL)
        if value_type in _SCALARS:
            value.type = _SCALARS[value_type]  # type: ignore[assignment]
        else:
            self.unresolved.append((value, f"{scope}.{entry.name}", value_type))
        f = msg.field.add(name=name, number=number, label=_F.LABEL_REPEATED, type=_F.TYPE_MESSAGE)
        f.type_name = f".{scope}.{entry.name}"
        self.field_options(f)
        self.expect(";")

    def enum(self, container: Any, scope: str) -> None:
        name = self.ident()
        e = container.add(name=name)
        self.local[f"{scope}.{name}" if scope else name] = _F.TYPE_ENUM
        self.expect("{")
        while self.peek() != "}":
            token = self.peek()
            if token is None:
                raise _ProtoSyntaxError(f"enum {name} is not closed")
            if token == ";":
                self.next()
            elif token == "option":
                self.next()
                option = self.option_name()
                self.expect("=")
                _, value = self.constant()
                self.expect(";")
                if option == "allow_alias":
                    e.options.allow_alias = value == "true"
            elif token == "reserved":
                self.next()
                self.reserved(e, _ENUM_MAX, exclusive=False)
            else:
                v = e.value.add(name=self.ident())
                self.expect("=")
                v.number = self.integer()
                if self.peek() == "[":
                    self.next()
                    while self.peek() != "]":
                        option = self.option_name()
                        self.expect("=")
                        _, value = self.constant()
                        if option == "deprecated":
                            v.options.deprecated = value == "true"
                        if self.peek() == ",":
                            self.next()
                    self.next()
                self.expect(";")
        self.next()

    def reserved(self, target: Any, maximum: int, exclusive: bool) -> None:
        if self.kind() == "string":
            while True:
                target.reserved_name.append(self.string())
                if self.peek() != ",":
                    break
                self.next()
        else:
            while True:
                start = self.integer()
                end = start
                if self.peek() == "to":
                    self.next()
                    if self.peek() == "max":
                        self.next()
                        end = maximum - 1 if exclusive else maximum
                    else:
                        end = self.integer()
                target.reserved_range.add(start=start, end=end + 1 if exclusive else end)
                if self.peek() != ",":
                    break
                self.next()
        self.expect(";")

    def resolve(self) -> None:
        for f, scope, raw in self.unresolved:
            full, kind = self.lookup(raw, scope)
            f.type = kind  # type: ignore[assignment]
            f.type_name = f".{full}"

    def lookup(self, raw: str, scope: str) -> tuple[str, int]:
        if raw.startswith("."):
            candidates = [raw[1:]]
        else:
            parts = scope.split(".") if scope else []
            candidates = [".".join([*parts[:i], raw]) for i in range(len(parts), -1, -1)]
        for candidate in candidates:
            if candidate in self.local:
                return candidate, self.local[candidate]
            try:
                self.pool.FindMessageTypeByName(candidate)
                return candidate, _F.TYPE_MESSAGE
            except KeyError:
                pass
            try:
                self.pool.FindEnumTypeByName(candidate)
                return candidate, _F.TYPE_ENUM
            except KeyError:
                pass
        raise _ProtoSyntaxError(f"unknown type {raw!r} (in {scope or 'the file'})")
