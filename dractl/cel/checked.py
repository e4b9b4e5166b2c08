"""The library's checked AST, decoded into small immutable nodes.

What it does: `decode` turns the bytes of `Expression.serialize()` (a `google.protobuf.Any`
holding a `cel.expr.CheckedExpr`) into a tree of `Node` values: constants, identifiers,
selections, calls, list and map literals and comprehensions, with macros already expanded by
the parser and qualified variable names (`device.attributes`) already resolved by the checker
into one identifier. The analyses (`sharing`, `cost`) walk this tree.

What it must not do: evaluate anything, or guess. The bytes are read with a minimal protobuf
wire reader (the `cel.expr` protos are not shipped in Python); anything it does not recognise
raises `Unreadable`, and callers then take the safe answer (no sharing, no cost proof).

Field numbers are those of cel-spec `proto/cel/expr/syntax.proto` and `checked.proto`.
"""

from __future__ import annotations

import dataclasses
import struct

_CHECKED_EXPR = "type.googleapis.com/cel.expr.CheckedExpr"


class Unreadable(ValueError):
    """The serialized expression is not in the shape this decoder knows."""


@dataclasses.dataclass(frozen=True, slots=True)
class Const:
    """A literal. `value` is None for null, else bool, int, float, str or bytes."""

    value: object


@dataclasses.dataclass(frozen=True, slots=True)
class Ident:
    """A variable: a declared one (possibly qualified, `device.driver`) or a local one."""

    name: str


@dataclasses.dataclass(frozen=True, slots=True)
class Select:
    """`operand.field`; `test_only` for `has(operand.field)`."""

    operand: Node
    field: str
    test_only: bool


@dataclasses.dataclass(frozen=True, slots=True)
class Call:
    """A function or operator (`_==_`, `_[_]`, `@in` ...); `target` for the receiver style."""

    function: str
    target: Node | None
    args: tuple[Node, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class ListLit:
    elements: tuple[Node, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class MapLit:
    """A map literal (or a message literal when `message` is set)."""

    message: str
    entries: tuple[tuple[Node | None, Node], ...]  # (key, value); the key is None for a message field


@dataclasses.dataclass(frozen=True, slots=True)
class Comprehension:
    """A macro after expansion (`all`, `exists`, `map`, `filter`, `cel.bind` ...)."""

    iter_var: str
    iter_var2: str
    iter_range: Node
    accu_var: str
    accu_init: Node
    loop_condition: Node
    loop_step: Node
    result: Node


Node = Const | Ident | Select | Call | ListLit | MapLit | Comprehension


def decode(serialized: bytes) -> Node:
    """The root node of a serialized checked expression. Pure. Raises `Unreadable`."""
    try:
        envelope = _fields(serialized)
        if _string(envelope, 1) != _CHECKED_EXPR:
            raise Unreadable("not a cel.expr.CheckedExpr")
        checked = _fields(_one(envelope, 2))
        return _expr(_one(checked, 4), depth=0)
    except (IndexError, KeyError, struct.error, UnicodeDecodeError) as error:
        raise Unreadable(f"malformed checked expression: {error}") from None


# --- protobuf wire format --------------------------------------------------------------------

_Fields = dict[int, list[object]]
_MAX_DEPTH = 512  # the library's own parser refuses deeper nesting long before this


def _varint(data: bytes, i: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[i]
        i += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return result, i
        if shift > 70:
            raise Unreadable("varint too long")


def _fields(data: bytes) -> _Fields:
    """Field number -> values in order (ints for varints, bytes for length-delimited)."""
    out: _Fields = {}
    i = 0
    while i < len(data):
        key, i = _varint(data, i)
        number, wire = key >> 3, key & 7
        value: object
        if wire == 0:
            value, i = _varint(data, i)
        elif wire == 2:
            size, i = _varint(data, i)
            if i + size > len(data):
                raise Unreadable("truncated field")
            value, i = data[i : i + size], i + size
        elif wire == 1:
            value, i = struct.unpack_from("<d", data, i)[0], i + 8
        elif wire == 5:
            value, i = data[i : i + 4], i + 4
        else:
            raise Unreadable(f"wire type {wire}")
        out.setdefault(number, []).append(value)
    return out


def _one(fields: _Fields, number: int) -> bytes:
    value = fields[number][-1]
    if not isinstance(value, bytes):
        raise Unreadable(f"field {number} is not a message")
    return value


def _maybe(fields: _Fields, number: int) -> bytes | None:
    return _one(fields, number) if number in fields else None


def _string(fields: _Fields, number: int) -> str:
    return _one(fields, number).decode() if number in fields else ""


def _int(fields: _Fields, number: int) -> int:
    value = fields[number][-1] if number in fields else 0
    if not isinstance(value, int):
        raise Unreadable(f"field {number} is not a varint")
    return value


def _expr(data: bytes, *, depth: int) -> Node:
    if depth > _MAX_DEPTH:
        raise Unreadable("expression nested too deeply")
    fields = _fields(data)
    down = depth + 1
    if 3 in fields:
        return Const(_constant(_fields(_one(fields, 3))))
    if 4 in fields:
        return Ident(_string(_fields(_one(fields, 4)), 1))
    if 5 in fields:
        select = _fields(_one(fields, 5))
        return Select(_expr(_one(select, 1), depth=down), _string(select, 2), bool(_int(select, 3)))
    if 6 in fields:
        call = _fields(_one(fields, 6))
        target = _maybe(call, 1)
        args = tuple(_expr(arg, depth=down) for arg in call.get(3, ()) if isinstance(arg, bytes))
        return Call(_string(call, 2), None if target is None else _expr(target, depth=down), args)
    if 7 in fields:
        # Optional elements (`[?x]`) are kept as elements: the analyses over-approximate.
        listed = _fields(_one(fields, 7))
        return ListLit(tuple(_expr(e, depth=down) for e in listed.get(1, ()) if isinstance(e, bytes)))
    if 8 in fields:
        created = _fields(_one(fields, 8))
        entries: list[tuple[Node | None, Node]] = []
        for raw in created.get(2, ()):
            if not isinstance(raw, bytes):
                raise Unreadable("map entry")
            entry = _fields(raw)
            key = _maybe(entry, 3)
            entries.append((None if key is None else _expr(key, depth=down), _expr(_one(entry, 4), depth=down)))
        return MapLit(_string(created, 1), tuple(entries))
    if 9 in fields:
        c = _fields(_one(fields, 9))
        return Comprehension(
            iter_var=_string(c, 1),
            iter_var2=_string(c, 8),
            iter_range=_expr(_one(c, 2), depth=down),
            accu_var=_string(c, 3),
            accu_init=_expr(_one(c, 4), depth=down),
            loop_condition=_expr(_one(c, 5), depth=down),
            loop_step=_expr(_one(c, 6), depth=down),
            result=_expr(_one(c, 7), depth=down),
        )
    raise Unreadable("expression of an unknown kind")


def _constant(fields: _Fields) -> object:
    if 1 in fields:
        return None
    if 2 in fields:
        return bool(_int(fields, 2))
    if 3 in fields:
        value = _int(fields, 3)
        return value - (1 << 64) if value >= 1 << 63 else value
    if 4 in fields:
        return _int(fields, 4)
    if 5 in fields:
        double = fields[5][-1]
        if not isinstance(double, float):
            raise Unreadable("double constant")
        return double
    if 6 in fields:
        return _string(fields, 6)
    if 7 in fields:
        return _one(fields, 7)
    raise Unreadable("constant of an unknown kind")
