"""The CEL environment of Kubernetes DRA device selectors: types, functions and device values.

What it does: declares the `device` fields with exact types, the quantity and semver libraries
and `includes()`, and converts a model device into the maps CEL sees. It is the only module of
the package that imports `cel_expr_python`.

What it must not do: compile or evaluate expressions for callers (`program` does), or know about
claims, classes or the allocator.

How the environment is built, and why:

* `device` is not one variable of a dynamic type, because then the checker would accept `>=` on
  a quantity. Its fields are declared as dotted variables with exact types instead
  (`device.capacity` is `map(string, map(string, kubernetes.Quantity))`), so the checker rejects
  what Kubernetes rejects. A bare `device` is therefore an undeclared reference.
* Quantities and versions are protobuf messages (`kubernetes.Quantity`, `kubernetes.Semver`) made
  at import time, because the library cannot pass opaque Python objects. Each message holds
  the canonical text of its value (a reduced fraction, a version without build metadata), so
  the library's structural `==` is value equality, as in Kubernetes.
* The runtime registers member functions by argument kind, and both messages are the same kind
  ("struct"), so `compareTo`, `isGreaterThan` and `isLessThan` have one implementation that
  serves both types; the checker still sees two typed overloads.
"""

from __future__ import annotations

import fractions
import functools
import re
import typing
from collections.abc import Callable, Sequence

from cel_expr_python import cel
from cel_expr_python.ext import ext_bindings, ext_optional, ext_strings
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from dractl import model

LIST_INCLUDES_LIMIT = 48
"""`includes()` refuses lists longer than this, like Kubernetes' list-type attributes."""

STATUS = re.compile(r"^[A-Z_]+: |\s*\[[A-Z_]+\]$")
"""The library's status prefix and suffix around its messages, which say nothing to a user."""


def quote(expression: str) -> str:
    """An expression on one line between backquotes, for messages. Pure."""
    # Multi-line selectors (YAML block scalars) read better on one line in a message.
    return "`" + " ".join(expression.split()) + "`"


# --- Quantity and Semver values ------------------------------------------------------------


def _message_classes() -> tuple[type[typing.Any], type[typing.Any]]:
    """Build the two one-field message types in a private descriptor pool."""
    proto = descriptor_pb2.FileDescriptorProto(name="dractl/cel.proto", package="kubernetes", syntax="proto3")
    for name in ("Quantity", "Semver"):
        message = proto.message_type.add(name=name)
        message.field.add(
            name="s",
            number=1,
            type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
            label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
        )
    _POOL.Add(proto)
    return (
        message_factory.GetMessageClass(_POOL.FindMessageTypeByName("kubernetes.Quantity")),
        message_factory.GetMessageClass(_POOL.FindMessageTypeByName("kubernetes.Semver")),
    )


_POOL = descriptor_pool.DescriptorPool()
_QuantityMessage, _SemverMessage = _message_classes()
_QUANTITY = cel.Type("kubernetes.Quantity")
_SEMVER = cel.Type("kubernetes.Semver")


# Messages are cached by value: devices share a handful of capacities and versions, and
# nothing mutates a message once made (the library copies what it receives).
@functools.lru_cache(maxsize=4096)
def quantity_message(value: fractions.Fraction) -> typing.Any:
    return _QuantityMessage(s=str(value))


@functools.lru_cache(maxsize=4096)
def semver_message(version: model.semver.Semver) -> typing.Any:
    # Build metadata does not take part in comparisons and no function exposes it, so it is
    # left out: equal versions then have equal messages.
    text = f"{version.major}.{version.minor}.{version.patch}"
    if version.prerelease:
        text += "-" + ".".join(version.prerelease)
    return _SemverMessage(s=text)


@functools.lru_cache(maxsize=4096)
def _fraction(text: str) -> fractions.Fraction:
    return fractions.Fraction(text)


@functools.lru_cache(maxsize=4096)
def _version(text: str) -> model.semver.Semver:
    return model.semver.parse(text)


@functools.lru_cache(maxsize=1024)
def _parse_quantity(text: str) -> fractions.Fraction:
    return model.quantity.parse(text).value


def _cel_quantity(text: str) -> typing.Any:
    return quantity_message(_parse_quantity(text))


def _is_quantity(text: str) -> bool:
    try:
        _parse_quantity(text)
    except model.quantity.QuantityError:
        return False
    return True


def _cel_semver(text: str, normalize: bool = False) -> typing.Any:
    return semver_message(model.semver.parse(text, normalize=normalize))


def is_semver(text: str, normalize: bool = False) -> bool:
    try:
        model.semver.parse(text, normalize=normalize)
    except model.semver.SemverError:
        return False
    return True


def _compare(left: typing.Any, right: typing.Any) -> int:
    """Compare two quantities or two versions (-1, 0, 1); the shared runtime overload."""
    if isinstance(left, _QuantityMessage) and isinstance(right, _QuantityMessage):
        quantities = _fraction(left.s), _fraction(right.s)
        return (quantities[0] > quantities[1]) - (quantities[0] < quantities[1])
    if isinstance(left, _SemverMessage) and isinstance(right, _SemverMessage):
        versions = _version(left.s), _version(right.s)
        return (versions[0] > versions[1]) - (versions[0] < versions[1])
    # Reachable only through dyn attribute values, which the checker cannot type.
    raise TypeError(f"cannot compare {_kind(left)} with {_kind(right)}")


def _kind(value: typing.Any) -> str:
    if isinstance(value, _QuantityMessage):
        return "a quantity"
    if isinstance(value, _SemverMessage):
        return "a semver"
    return f"a {type(value).__name__}"


_INT64 = 2**63


def _as_integer(message: typing.Any) -> int:
    value = _fraction(message.s)
    if value.denominator != 1 or not -_INT64 <= value < _INT64:
        raise ValueError(f"quantity {value} cannot be converted to an int64 without loss")
    return int(value)


def _is_integer(message: typing.Any) -> bool:
    value = _fraction(message.s)
    return value.denominator == 1 and -_INT64 <= value < _INT64


def _add(message: typing.Any, other: typing.Any) -> typing.Any:
    addend = other if isinstance(other, int) else _fraction(other.s)
    return quantity_message(_fraction(message.s) + addend)


def _sub(message: typing.Any, other: typing.Any) -> typing.Any:
    subtrahend = other if isinstance(other, int) else _fraction(other.s)
    return quantity_message(_fraction(message.s) - subtrahend)


def _sign(message: typing.Any) -> int:
    value = _fraction(message.s)
    return (value > 0) - (value < 0)


def _equal(left: typing.Any, right: typing.Any) -> bool:
    # Messages hold canonical text, so equality of values is equality of messages.
    return bool(left == right)


def _includes(container: typing.Any, item: typing.Any) -> bool:
    """`includes()` of the DRA list-type attributes: membership for lists, equality for scalars."""
    if isinstance(container, list):
        if len(container) > LIST_INCLUDES_LIMIT:
            raise ValueError(
                f"includes() supports lists of at most {LIST_INCLUDES_LIMIT} entries, this one has {len(container)}"
            )
        return any(_equal(element, item) for element in container)
    return _equal(container, item)


# --- The environment -----------------------------------------------------------------------

_T = cel.Type


def _member(
    name: str, result: typing.Any, params: Sequence[typing.Any], impl: Callable[..., typing.Any] | None = None
) -> typing.Any:
    overload_id = "_".join([name, *(str(p.name()).replace(".", "_").lower() for p in params)])
    if impl is None:
        return cel.Overload(overload_id, result, list(params), is_member=True)
    return cel.Overload(overload_id, result, list(params), is_member=True, impl=impl)


def _global(name: str, result: typing.Any, params: Sequence[typing.Any], impl: Callable[..., typing.Any]) -> typing.Any:
    overload_id = "_".join([name, *(str(p.name()).lower() for p in params)])
    return cel.Overload(overload_id, result, list(params), impl=impl)


def _functions() -> list[typing.Any]:
    Q, S = _QUANTITY, _SEMVER
    shared = [
        # The implementation goes on the first overload only: the runtime keys functions by
        # argument kind and both message types are the same kind (see the module docstring).
        cel.FunctionDecl(name, [_member(name, result, [Q, Q], impl), _member(name, result, [S, S])])
        for name, result, impl in (
            ("compareTo", _T.INT, _compare),
            ("isGreaterThan", _T.BOOL, lambda a, b: _compare(a, b) > 0),
            ("isLessThan", _T.BOOL, lambda a, b: _compare(a, b) < 0),
        )
    ]
    includes = cel.FunctionDecl(
        "includes",
        # The runtime dispatches on concrete kinds, so each element kind gets its own overload.
        # Attributes hold ints, bools, strings and versions, never quantities.
        [_member("includes", _T.BOOL, [_T.List(_T.DYN), kind], _includes) for kind in (_T.INT, _T.STRING, _T.BOOL, S)]
        + [_member("includes", _T.BOOL, [kind, kind], _equal) for kind in (_T.INT, _T.STRING, _T.BOOL, S)],
    )
    return [
        *shared,
        includes,
        cel.FunctionDecl("quantity", [_global("quantity", Q, [_T.STRING], _cel_quantity)]),
        cel.FunctionDecl("isQuantity", [_global("isQuantity", _T.BOOL, [_T.STRING], _is_quantity)]),
        cel.FunctionDecl("sign", [_member("sign", _T.INT, [Q], _sign)]),
        cel.FunctionDecl("isInteger", [_member("isInteger", _T.BOOL, [Q], _is_integer)]),
        cel.FunctionDecl("asInteger", [_member("asInteger", _T.INT, [Q], _as_integer)]),
        cel.FunctionDecl(
            "asApproximateFloat", [_member("asApproximateFloat", _T.DOUBLE, [Q], lambda m: float(_fraction(m.s)))]
        ),
        cel.FunctionDecl("add", [_member("add", Q, [Q, Q], _add), _member("add", Q, [Q, _T.INT], _add)]),
        cel.FunctionDecl("sub", [_member("sub", Q, [Q, Q], _sub), _member("sub", Q, [Q, _T.INT], _sub)]),
        cel.FunctionDecl(
            "semver",
            [_global("semver", S, [_T.STRING], _cel_semver), _global("semver", S, [_T.STRING, _T.BOOL], _cel_semver)],
        ),
        cel.FunctionDecl(
            "isSemver",
            [
                _global("isSemver", _T.BOOL, [_T.STRING], is_semver),
                _global("isSemver", _T.BOOL, [_T.STRING, _T.BOOL], is_semver),
            ],
        ),
        cel.FunctionDecl("major", [_member("major", _T.INT, [S], lambda m: _version(m.s).major)]),
        cel.FunctionDecl("minor", [_member("minor", _T.INT, [S], lambda m: _version(m.s).minor)]),
        cel.FunctionDecl("patch", [_member("patch", _T.INT, [S], lambda m: _version(m.s).patch)]),
    ]


_VARIABLES = {
    "device.driver": _T.STRING,
    "device.allowMultipleAllocations": _T.BOOL,
    "device.attributes": _T.Map(_T.STRING, _T.Map(_T.STRING, _T.DYN)),
    "device.capacity": _T.Map(_T.STRING, _T.Map(_T.STRING, _QUANTITY)),
}

ENV = cel.NewEnv(
    _POOL,
    variables=_VARIABLES,
    extensions=[ext_strings.ExtStrings(), ext_bindings.ExtBindings(), ext_optional.ExtOptional()],
    functions=_functions(),
)


def attribute_value(attribute: model.DeviceAttribute) -> typing.Any:
    """One attribute as CEL sees it: a list for list attributes, versions as semver messages."""
    if attribute.kind is model.AttributeKind.VERSION:
        values = [semver_message(typing.cast(model.semver.Semver, value)) for value in attribute.values]
    else:
        values = list(attribute.values)
    return values if attribute.is_list else values[0]


@functools.lru_cache(maxsize=4096)
def _split(name: str, driver: str) -> tuple[str, str]:
    domain, slash, identifier = name.partition("/")
    return (domain, identifier) if slash else (driver, name)


BOOL = _T.BOOL
DYN = _T.DYN
ERROR = _T.ERROR

DomainMaps = dict[str, dict[str, typing.Any]]
"""`device.attributes` or `device.capacity` as CEL sees it: domain -> identifier -> value."""


def device_maps(driver: str, device: model.Device) -> tuple[DomainMaps, DomainMaps]:
    """The attribute and capacity maps of one device, as CEL sees them. Pure.

    Unqualified attribute and capacity names go under the driver's domain, `domain/id` under
    its own, as in Kubernetes.
    """
    attributes: DomainMaps = {}
    for name, attribute in device.attributes.items():
        domain, identifier = _split(name, driver)
        attributes.setdefault(domain, {})[identifier] = attribute_value(attribute)
    capacity: DomainMaps = {}
    for name, entry in device.capacity.items():
        domain, identifier = _split(name, driver)
        capacity.setdefault(domain, {})[identifier] = quantity_message(entry.value.value)
    return attributes, capacity


def activation(driver: str, device: model.Device) -> typing.Any:
    """The library's activation holding the `device` variable of one device. Pure."""
    attributes, capacity = device_maps(driver, device)
    return ENV.Activation(
        {
            "device.driver": driver,
            "device.allowMultipleAllocations": device.allow_multiple_allocations,
            "device.attributes": attributes,
            "device.capacity": capacity,
        }
    )


def is_quantity_value(value: object) -> bool:
    """Whether a CEL input value is a quantity message."""
    return isinstance(value, _QuantityMessage)


def is_semver_value(value: object) -> bool:
    """Whether a CEL input value is a semver message."""
    return isinstance(value, _SemverMessage)


def message_text(message: typing.Any) -> str:
    """The canonical text a quantity or semver message holds (equal texts, equal values)."""
    return str(message.s)
