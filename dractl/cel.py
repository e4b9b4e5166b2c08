"""The Kubernetes DRA CEL environment for device selectors, on `cel-expr-python`.

What it does: compiles selector expressions (cached by their text) in the environment the API
server and the scheduler use for `resource.k8s.io/v1` device selectors, and evaluates them
against per-device inputs that are built once per device and reused for every expression.
Expressions that Kubernetes rejects are rejected here at compile time, with the library's
position marker and, where we know one, the expression to write instead.

What it must not do: know about claims, classes, pools or the allocator's caching per slice
generation, or do I/O. It is the only module that imports `cel_expr_python`; callers see
`compile`, `device_input`, `Program.matches` and the two error types.

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
* Kubernetes returns an empty map for an unknown domain. The library has no lazy maps, so each
  `device.attributes[d]` and `device.capacity[d]` is rewritten, on tokens, to
  `device.attributes[?d].orValue({})` before compiling.
"""

from __future__ import annotations

import dataclasses
import difflib
import fractions
import functools
import re
import typing
from collections.abc import Callable, Iterator, Sequence

from cel_expr_python import cel
from cel_expr_python.ext import ext_bindings, ext_optional, ext_strings
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from dractl import model

MAX_EXPRESSION_BYTES = 10 * 1024
"""Kubernetes' `CELSelectorExpressionMaxLength`."""

LIST_INCLUDES_LIMIT = 48
"""`includes()` refuses lists longer than this, like Kubernetes' list-type attributes."""

_HINT_DOMAIN = "gpu.nvidia.com"
"""The domain used in suggested rewrites: dractl's default driver name."""


class CompileError(ValueError):
    """The expression does not compile, is too long, or does not yield a bool."""

    def __init__(self, expression: str, message: str) -> None:
        super().__init__(f"CEL expression {_quote(expression)} is invalid: {message}")
        self.expression = expression
        self.message = message


class EvalError(ValueError):
    """Evaluation failed at run time or did not yield a bool."""

    def __init__(self, expression: str, message: str) -> None:
        super().__init__(f"CEL expression {_quote(expression)} failed: {message}")
        self.expression = expression
        self.message = message


def _quote(expression: str) -> str:
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
def _quantity_message(value: fractions.Fraction) -> typing.Any:
    return _QuantityMessage(s=str(value))


@functools.lru_cache(maxsize=4096)
def _semver_message(version: model.semver.Semver) -> typing.Any:
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
    return _quantity_message(_parse_quantity(text))


def _is_quantity(text: str) -> bool:
    try:
        _parse_quantity(text)
    except model.quantity.QuantityError:
        return False
    return True


def _cel_semver(text: str, normalize: bool = False) -> typing.Any:
    return _semver_message(model.semver.parse(text, normalize=normalize))


def _is_semver(text: str, normalize: bool = False) -> bool:
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
    return _quantity_message(_fraction(message.s) + addend)


def _sub(message: typing.Any, other: typing.Any) -> typing.Any:
    subtrahend = other if isinstance(other, int) else _fraction(other.s)
    return _quantity_message(_fraction(message.s) - subtrahend)


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
            raise ValueError(f"includes() supports lists of at most {LIST_INCLUDES_LIMIT} entries, this one has {len(container)}")
        return any(_equal(element, item) for element in container)
    return _equal(container, item)


# --- The environment -----------------------------------------------------------------------

_T = cel.Type


def _member(name: str, result: typing.Any, params: Sequence[typing.Any], impl: Callable[..., typing.Any] | None = None) -> typing.Any:
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
        cel.FunctionDecl("asApproximateFloat", [_member("asApproximateFloat", _T.DOUBLE, [Q], lambda m: float(_fraction(m.s)))]),
        cel.FunctionDecl("add", [_member("add", Q, [Q, Q], _add), _member("add", Q, [Q, _T.INT], _add)]),
        cel.FunctionDecl("sub", [_member("sub", Q, [Q, Q], _sub), _member("sub", Q, [Q, _T.INT], _sub)]),
        cel.FunctionDecl(
            "semver",
            [_global("semver", S, [_T.STRING], _cel_semver), _global("semver", S, [_T.STRING, _T.BOOL], _cel_semver)],
        ),
        cel.FunctionDecl(
            "isSemver",
            [_global("isSemver", _T.BOOL, [_T.STRING], _is_semver), _global("isSemver", _T.BOOL, [_T.STRING, _T.BOOL], _is_semver)],
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

_ENV = cel.NewEnv(
    _POOL,
    variables=_VARIABLES,
    extensions=[ext_strings.ExtStrings(), ext_bindings.ExtBindings(), ext_optional.ExtOptional()],
    functions=_functions(),
)


# --- Tokens: the optional-domain rewrite and the hints work on these ------------------------

_TOKEN = re.compile(
    r"""
    (?P<space>\s+)
  | (?P<comment>//[^\n]*)
  | (?P<hash>\#[^\n]*)
  | (?P<string>
        [bB]?[rR][bB]?(?:\"\"\"[\s\S]*?\"\"\"|'''[\s\S]*?'''|"[^"\n]*"|'[^'\n]*')
      | [bB]?(?:\"\"\"(?:\\[\s\S]|[^\\])*?\"\"\"|'''(?:\\[\s\S]|[^\\])*?'''|"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*')
    )
  | (?P<number>(?:0[xX][0-9a-fA-F]+|[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?)[uU]?)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op>==|!=|>=|<=|&&|\|\||[-+*/%!<>?:.,()\[\]{}])
  | (?P<other>.)
    """,
    re.VERBOSE,
)
_SKIPPED = frozenset({"space", "comment"})
_CLOSING = {"(": ")", "[": "]", "{": "}"}
_OPENING = {closing: opening for opening, closing in _CLOSING.items()}


@dataclasses.dataclass(frozen=True, slots=True)
class _Token:
    kind: str
    text: str
    start: int
    end: int


def _tokens(text: str) -> list[_Token]:
    """Significant tokens (no spaces or `//` comments); a `#...` comment is kept as a token."""
    return [
        _Token(match.lastgroup or "other", match.group(), match.start(), match.end())
        for match in _TOKEN.finditer(text)
        if match.lastgroup not in _SKIPPED
    ]


def _matching(tokens: Sequence[_Token], index: int) -> int | None:
    """Index of the bracket that closes `tokens[index]`, or opens it if it is a closing one."""
    own = tokens[index].text
    if own in _CLOSING:
        step, partner = 1, _CLOSING[own]
    else:
        step, partner = -1, _OPENING[own]
    depth = 0
    position = index
    while 0 <= position < len(tokens):
        if tokens[position].text == own:
            depth += 1
        elif tokens[position].text == partner:
            depth -= 1
            if depth == 0:
                return position
        position += step
    return None


def _is_field(tokens: Sequence[_Token], index: int, name: str) -> bool:
    """Whether tokens[index:] start `device . <name>` with `device` not itself a field."""
    return (
        index + 2 < len(tokens)
        and tokens[index].text == "device"
        and tokens[index + 1].text == "."
        and tokens[index + 2].text == name
        and (index == 0 or tokens[index - 1].text != ".")
    )


def _domain_lookups(tokens: Sequence[_Token]) -> Iterator[tuple[int, int]]:
    """(open, close) token indices of each `[...]` right after device.attributes/capacity."""
    for index in range(len(tokens)):
        if (_is_field(tokens, index, "attributes") or _is_field(tokens, index, "capacity")) and index + 3 < len(tokens):
            bracket = index + 3
            if tokens[bracket].text == "[" and bracket + 1 < len(tokens) and tokens[bracket + 1].text != "?":
                close = _matching(tokens, bracket)
                if close is not None:
                    yield bracket, close


def _optional_domains(expression: str) -> str:
    """Rewrite `device.attributes[d]` to `device.attributes[?d].orValue({})` (same for capacity)."""
    inserts: list[tuple[int, str]] = []
    tokens = _tokens(expression)
    for open_index, close_index in _domain_lookups(tokens):
        inserts.append((tokens[open_index].end, "?"))
        inserts.append((tokens[close_index].end, ".orValue({})"))
    text = expression
    for position, insert in sorted(inserts, reverse=True):
        text = text[:position] + insert + text[position:]
    return text


# --- Programs and device inputs ------------------------------------------------------------

class DeviceInput:
    """The `device` variable of one device, converted once and reused for every program.

    The library converts the maps lazily on first use and keeps them, so the first evaluation
    on an input costs more than the next ones. Whether one input may be evaluated from two
    threads at once is not documented by the library: keep each input within one thread.
    """

    __slots__ = ("driver", "name", "_activation")

    def __init__(self, *, driver: str, name: str, activation: typing.Any) -> None:
        self.driver = driver
        self.name = name
        self._activation = activation

    def __repr__(self) -> str:
        return f"DeviceInput({self.driver}/{self.name})"


def _attribute_value(attribute: model.DeviceAttribute) -> typing.Any:
    if attribute.kind is model.AttributeKind.VERSION:
        values = [_semver_message(typing.cast(model.semver.Semver, value)) for value in attribute.values]
    else:
        values = list(attribute.values)
    return values if attribute.is_list else values[0]


@functools.lru_cache(maxsize=4096)
def _split(name: str, driver: str) -> tuple[str, str]:
    domain, slash, identifier = name.partition("/")
    return (domain, identifier) if slash else (driver, name)


def device_input(driver: str, device: model.Device) -> DeviceInput:
    """Convert one device for evaluation: pure, about 20 µs, so build it once per device.

    Unqualified attribute and capacity names go under the driver's domain, `domain/id` under
    its own, as in Kubernetes.
    """
    attributes: dict[str, dict[str, typing.Any]] = {}
    for name, attribute in device.attributes.items():
        domain, identifier = _split(name, driver)
        attributes.setdefault(domain, {})[identifier] = _attribute_value(attribute)
    capacity: dict[str, dict[str, typing.Any]] = {}
    for name, entry in device.capacity.items():
        domain, identifier = _split(name, driver)
        capacity.setdefault(domain, {})[identifier] = _quantity_message(entry.value.value)
    activation = _ENV.Activation(
        {
            "device.driver": driver,
            "device.allowMultipleAllocations": device.allow_multiple_allocations,
            "device.attributes": attributes,
            "device.capacity": capacity,
        }
    )
    return DeviceInput(driver=driver, name=device.name, activation=activation)


_MISSING_KEY = re.compile(r'Key not found in map\s*:\s*"?(?P<key>.*?)"?$')
_STATUS = re.compile(r"^[A-Z_]+: |\s*\[[A-Z_]+\]$")


def _runtime_message(raw: str) -> str:
    missing = _MISSING_KEY.search(raw)
    if missing is not None:
        key = missing.group("key")
        return (
            f"no such key: {key} (the device has no attribute or capacity {key!r} in that domain; "
            f"guard the lookup with has(...) or write .?{key}.orValue(<default>))"
        )
    return _STATUS.sub("", raw)


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class Program:
    """A compiled selector. Evaluate it with `matches`; it is immutable and shareable."""

    expression: str
    _compiled: typing.Any

    def matches(self, device: DeviceInput) -> bool:
        """True if the selector accepts the device. Pure. Raises `EvalError`."""
        try:
            result = self._compiled.eval(device._activation)
        except RuntimeError as error:
            # The library raises (rather than returning an error value) when its
            # comprehension iteration budget runs out.
            raise EvalError(self.expression, _runtime_message(str(error))) from None
        value = result.value()
        if value is True or value is False:
            return value
        if result.type() == _T.ERROR:
            raise EvalError(self.expression, _runtime_message(str(value)))
        raise EvalError(self.expression, f"must evaluate to bool, but evaluated to {_describe(result)}")


def _describe(result: typing.Any) -> str:
    return f"{str(result.type().name()).lower()} {result.value()!r}"


@functools.lru_cache(maxsize=4096)
def compile(expression: str) -> Program:  # noqa: A001  (the public name other modules use)
    """Compile a selector once; cached by its text (failures are not cached). Raises `CompileError`."""
    size = len(expression.encode())
    if size > MAX_EXPRESSION_BYTES:
        raise CompileError(expression, f"it is {size} bytes long; the limit is {MAX_EXPRESSION_BYTES} bytes (10 KiB)")
    # Compile the text as written first, so that positions in messages are the user's.
    try:
        _ENV.compile(expression)
        compiled = _ENV.compile(_optional_domains(expression))
    except RuntimeError as error:
        raise CompileError(expression, _compile_message(expression, str(error))) from None
    if compiled.return_type() != _T.BOOL and compiled.return_type() != _T.DYN:
        kind = str(compiled.return_type().name()).lower()
        raise CompileError(expression, f"it must evaluate to bool, but evaluates to {kind}")
    return Program(expression, compiled)


# --- Compile errors: what to write instead -------------------------------------------------

_MAX_FIXES = 16
_ERROR_LINE = re.compile(r"ERROR: <input>:(?P<line>\d+):(?P<column>\d+): (?P<what>[^\n]*)")
_NO_OVERLOAD = re.compile(r"found no matching overload for '_(?P<op>[^_]+)_' applied to '\((?P<left>[^,]+), (?P<right>[^)]+)\)'")
_UNDECLARED = re.compile(r"undeclared reference to '(?P<name>[^']+)'")
_COMPARISONS = frozenset({"<", "<=", ">", ">=", "==", "!="})
_ARITHMETIC = {"+": "add", "-": "sub"}
_OPAQUE = {"kubernetes.Quantity": "quantity", "kubernetes.Semver": "semver"}
_NUMBERS = frozenset({"int", "uint", "double"})
_DEVICE_FIELDS = ("driver", "attributes", "capacity", "allowMultipleAllocations")
_ACCESSORS = frozenset({"quantity", "string", "int", "bool", "version"})
_ACCESSOR_KINDS = {"quantity": "capacity"}

# Names that articles use for NVIDIA device properties, and what the NVIDIA DRA driver
# publishes instead: (kind, name). Kinds: "capacity", "version" or "plain".
_ARTICLE_NAMES = {
    "memory": ("capacity", "memory"),
    "gpu-memory": ("capacity", "memory"),
    "compute-capability": ("version", "cudaComputeCapability"),
    "cuda-compute-capability": ("version", "cudaComputeCapability"),
    "cuda-version": ("version", "cudaDriverVersion"),
    "driver-version": ("version", "driverVersion"),
    "architecture": ("plain", "architecture"),
    "product-name": ("plain", "productName"),
    "model": ("plain", "productName"),
}


def _compile_message(expression: str, raw: str) -> str:
    """The library's message (with its position marker), then the rewrite and the notes."""
    lines = [_STATUS.sub("", raw)]
    rewrite, notes = _suggest(expression)
    if rewrite is not None:
        lines.append("write instead: " + "\n    ".join(rewrite.strip().split("\n")))
    lines.extend(f"note: {note}" for note in notes)
    return "\n".join(lines)


def _suggest(expression: str) -> tuple[str | None, list[str]]:
    """A rewrite that compiles, if the known fixes get there, and why each fix is needed."""
    notes: list[str] = []
    candidate = expression
    for fix in (_fix_hash_comments, _fix_driver_name, _fix_article_attributes):
        candidate, note = fix(candidate)
        if note:
            notes.append(note)
    for _ in range(_MAX_FIXES):
        try:
            _ENV.compile(candidate)
        except RuntimeError as error:
            fixed, note = _fix_checker_error(candidate, str(error))
            if note and note not in notes:
                notes.append(note)
            if fixed is None:
                return None, notes
            candidate = fixed
        else:
            return (candidate if candidate != expression else None), notes
    return None, notes


def _replace(text: str, start: int, end: int, replacement: str) -> str:
    return text[:start] + replacement + text[end:]


def _fix_hash_comments(text: str) -> tuple[str, str | None]:
    hashes = [token for token in _tokens(text) if token.kind == "hash"]
    for token in reversed(hashes):
        text = _replace(text, token.start, token.start + 1, "//")
    return text, ("CEL comments start with //, not #" if hashes else None)


def _fix_driver_name(text: str) -> tuple[str, str | None]:
    tokens = _tokens(text)
    wrong = [
        tokens[index + 4]
        for index in range(len(tokens) - 4)
        if _is_field(tokens, index, "driver") and tokens[index + 3].text in ("==", "!=") and _literal(tokens[index + 4]) == "nvidia.com/gpu"
    ]
    for token in reversed(wrong):
        text = _replace(text, token.start, token.end, f'"{_HINT_DOMAIN}"')
    note = f'the NVIDIA DRA driver is named "{_HINT_DOMAIN}"; "nvidia.com/gpu" is the device plugin\'s resource name'
    return text, (note if wrong else None)


def _literal(token: _Token) -> str | None:
    """The value of a plain (unprefixed, escape-free) string literal token."""
    if token.kind == "string" and token.text[:1] in "\"'" and "\\" not in token.text and not token.text.startswith(('"""', "'''")):
        return token.text[1:-1]
    return None


def _fix_article_attributes(text: str) -> tuple[str, str | None]:
    """`device.attributes["memory"].quantity().value() >= N` and friends from older articles."""
    tokens = _tokens(text)
    notes: list[str] = []
    edits: list[tuple[int, int, str]] = []
    index = 0
    while index < len(tokens):
        match = _article_lookup(tokens, index)
        if match is None:
            index += 1
            continue
        end, replacement, note = match
        edits.append((tokens[index].start, tokens[end].end, replacement))
        notes.append(note)
        index = end + 1
    for start, end, replacement in reversed(edits):
        text = _replace(text, start, end, replacement)
    if not notes:
        return text, None
    notes.append("attribute values are already typed: CEL has no .string(), .quantity() or .value() on them")
    return text, "; ".join(dict.fromkeys(notes))


def _article_lookup(tokens: Sequence[_Token], index: int) -> tuple[int, str, str] | None:
    """Match `device.attributes["key"].accessor()[.value()] [op literal]` at `index`."""
    if not _is_field(tokens, index, "attributes"):
        return None
    shape = [token.text for token in tokens[index + 3 : index + 10]]
    if len(shape) < 7 or shape[0] != "[" or shape[2] != "]" or shape[3] != "." or shape[4] not in _ACCESSORS or shape[5:7] != ["(", ")"]:
        return None
    key = _literal(tokens[index + 4])
    if key is None or "." in key or "/" in key:
        return None
    end = index + 9
    if [token.text for token in tokens[end + 1 : end + 5]] == [".", "value", "(", ")"]:
        end += 4
    if key in _ARTICLE_NAMES:
        (kind, name), domain = _ARTICLE_NAMES[key], _HINT_DOMAIN
    else:
        kind, name, domain = _ACCESSOR_KINDS.get(shape[4], "plain"), _camel(key), _driver_domain(tokens)
    operator = tokens[end + 1].text if end + 1 < len(tokens) and tokens[end + 1].text in _COMPARISONS else None
    operand = tokens[end + 2] if operator is not None and end + 2 < len(tokens) else None
    if kind == "capacity":
        base = f'device.capacity["{domain}"].{name}'
        note = f'"{key}" is a capacity, read as {base}: capacity and attributes are keyed by domain, then name, and quantities compare with compareTo()'
        if operator is not None and operand is not None and operand.kind in ("number", "string"):
            amount = _quantity_text(operand, memory=name == "memory")
            return end + 2, f'{base}.compareTo(quantity("{amount}")) {operator} 0', note
        return end, base, note
    base = f'device.attributes["{domain}"].{name}'
    if kind == "version":
        note = f'"{key}" is the version attribute {base}: versions compare with compareTo(semver(...)), as strings "10.0" < "8.0"'
        version = _literal(operand) if operand is not None else None
        if operator is not None and version is not None and _is_semver(version, normalize=True):
            normalized = _semver_message(model.semver.parse(version, normalize=True)).s
            return end + 2, f'{base}.compareTo(semver("{normalized}")) {operator} 0', note
        return end, base, note
    return end, base, f'attributes are keyed by domain, then name: {base}'


def _driver_domain(tokens: Sequence[_Token]) -> str:
    """The domain of the driver the expression tests for, for names we do not know."""
    for index in range(len(tokens) - 4):
        if _is_field(tokens, index, "driver") and tokens[index + 3].text == "==":
            driver = _literal(tokens[index + 4])
            if driver is not None:
                # A driver name is a DNS subdomain; "vendor.com/thing" is a device plugin
                # resource name and says nothing about the DRA driver's name.
                return driver if "/" not in driver else "<driver name>"
    return _HINT_DOMAIN


def _camel(key: str) -> str:
    head, *rest = re.split(r"[-_]", key)
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _quantity_text(token: _Token, *, memory: bool) -> str:
    """The quantity literal for a number an article compared `.value()` with."""
    literal = _literal(token)
    if literal is not None:
        return literal
    try:
        number = int(token.text)
    except ValueError:
        return token.text
    # Articles write "24GB" as 24000000000; GPU memory is published in binary units.
    if memory and number and number % 10**9 == 0:
        return f"{number // 10**9}Gi"
    return str(number)


def _fix_checker_error(text: str, raw: str) -> tuple[str | None, str | None]:
    """One fix for the first checker error we know how to fix, and the note that explains it."""
    for error in _ERROR_LINE.finditer(raw):
        offset = _offset(text, int(error.group("line")), int(error.group("column")))
        tokens = _tokens(text)
        at = next((i for i, token in enumerate(tokens) if token.start == offset), None)
        no_overload = _NO_OVERLOAD.search(error.group("what"))
        if no_overload is not None and at is not None:
            fixed = _fix_operator(text, tokens, at, no_overload)
            if fixed is not None:
                return fixed
        undeclared = _UNDECLARED.search(error.group("what"))
        if undeclared is not None:
            return _fix_undeclared(text, tokens, at, undeclared.group("name"))
    return None, None


def _offset(text: str, line: int, column: int) -> int:
    lines = text.split("\n")
    return sum(len(previous) + 1 for previous in lines[: line - 1]) + column - 1


def _fix_operator(text: str, tokens: Sequence[_Token], at: int, match: re.Match[str]) -> tuple[str | None, str | None] | None:
    operator, left_type, right_type = match.group("op"), match.group("left"), match.group("right")
    opaque = _OPAQUE.get(left_type) or _OPAQUE.get(right_type)
    if opaque is None or (operator not in _COMPARISONS and operator not in _ARITHMETIC):
        return None
    start, end = _operand_start(tokens, at - 1), _operand_end(tokens, at + 1)
    if start is None or end is None:
        return None, f"{opaque} values have no {operator} operator; use compareTo(), add() or sub()"
    left = text[tokens[start].start : tokens[at - 1].end]
    right = text[tokens[at + 1].start : tokens[end].end]
    if left_type in _NUMBERS or left_type == "string":
        # `40 < q` reads as `q > 40` once the quantity is the receiver.
        left, right, left_type, right_type = right, left, right_type, left_type
        operator = {"<": ">", "<=": ">=", ">": "<", ">=": "<="}.get(operator, operator)
    right = _as_opaque(right, right_type, opaque)
    if operator in _ARITHMETIC:
        replacement = f"{left}.{_ARITHMETIC[operator]}({right})"
        note = f"{opaque} values have no {operator} operator; use {_ARITHMETIC[operator]}()"
    else:
        replacement = f"{left}.compareTo({right}) {operator} 0"
        note = f"{opaque} values cannot be compared with {operator}; compareTo() returns -1, 0 or 1"
    return _replace(text, tokens[start].start, tokens[end].end, replacement), note


def _as_opaque(operand: str, operand_type: str, opaque: str) -> str:
    """Wrap a literal compared with a quantity or version in `quantity(...)`/`semver(...)`."""
    if operand_type in _OPAQUE:
        return operand
    if operand_type == "string":
        return f"{opaque}({operand})"
    if operand_type in _NUMBERS and opaque == "quantity" and re.fullmatch(r"[0-9]+(\.[0-9]+)?", operand):
        return f'quantity("{operand}")'
    return operand


def _operand_start(tokens: Sequence[_Token], index: int) -> int | None:
    """First token of the member/call/index chain that ends at `tokens[index]`."""
    while index >= 0:
        token = tokens[index]
        if token.text in _OPENING:
            opener = _matching(tokens, index)
            if opener is None:
                return None
            index = opener
            before = tokens[index - 1] if index > 0 else None
            if token.text == "]" and before is not None and (before.kind in ("ident", "string", "number") or before.text in _OPENING):
                index -= 1  # an index: the chain continues with what is indexed
                continue
            if token.text == ")" and before is not None and before.kind == "ident":
                index -= 1  # a call: the function name belongs to the operand
        elif token.kind not in ("ident", "string", "number"):
            return None
        if index >= 2 and tokens[index - 1].text == "." :
            index -= 2
        elif index >= 3 and tokens[index - 1].text == "?" and tokens[index - 2].text == ".":
            index -= 3
        else:
            return index
    return None


def _operand_end(tokens: Sequence[_Token], index: int) -> int | None:
    """Last token of the (unary-prefixed) member/call/index chain that starts at `tokens[index]`."""
    while index < len(tokens) and tokens[index].text in ("-", "!"):
        index += 1
    if index >= len(tokens):
        return None
    token = tokens[index]
    if token.text in _CLOSING:
        end = _matching(tokens, index)
    elif token.kind == "ident" and index + 1 < len(tokens) and tokens[index + 1].text == "(":
        end = _matching(tokens, index + 1)
    elif token.kind in ("ident", "string", "number"):
        end = index
    else:
        return None
    while end is not None and end + 1 < len(tokens):
        following = tokens[end + 1].text
        if following == "[":
            end = _matching(tokens, end + 1)
        elif following == "." and end + 2 < len(tokens):
            name = end + 3 if tokens[end + 2].text == "?" else end + 2
            if name >= len(tokens) or tokens[name].kind != "ident":
                return None
            end = _matching(tokens, name + 1) if name + 1 < len(tokens) and tokens[name + 1].text == "(" else name
        else:
            break
    return end


def _fix_undeclared(text: str, tokens: Sequence[_Token], at: int | None, name: str) -> tuple[str | None, str | None]:
    fields = ", ".join(f"device.{field}" for field in _DEVICE_FIELDS)
    if name == "device":
        return None, f"`device` is used through its fields: {fields}"
    if name.startswith("device.") and at is not None:
        field = name.partition(".")[2]
        # The checker points at the dot before the field.
        lookup = next((i + 2 for i in range(max(at - 2, 0), at + 1) if _is_field(tokens, i, field)), None)
        close = difflib.get_close_matches(field, _DEVICE_FIELDS, n=1)
        if close and lookup is not None:
            token = tokens[lookup]
            return _replace(text, token.start, token.end, close[0]), f"`device` has no field {field!r}; did you mean device.{close[0]}?"
        return None, f"`device` has no field {field!r}; its fields are {fields}"
    # The checker points at the call's opening parenthesis.
    if at is None or at < 2 or tokens[at - 2].text != ".":
        return None, None
    if name in ("quantity", "semver"):
        example = "40Gi" if name == "quantity" else "8.0.0"
        return None, (
            f'{name}() is a function of a string, such as {name}("{example}"); '
            "capacity values already are quantities and version attributes already are semvers"
        )
    if name in _ACCESSORS or name == "value":
        return None, f"attribute values are already typed: compare them directly, without .{name}()"
    return None, None


def _selector_problems(prefix: str, path: str, expressions: Sequence[str]) -> Iterator[str]:
    for index, expression in enumerate(expressions):
        try:
            compile(expression)
        except CompileError as error:
            yield f"{prefix}: {path}[{index}].cel.expression: {error}"


def _claim_spec_problems(prefix: str, path: str, spec: model.ResourceClaimSpec) -> Iterator[str]:
    for r, request in enumerate(spec.requests):
        if request.exactly is not None:
            yield from _selector_problems(prefix, f"{path}.requests[{r}].exactly.selectors", request.exactly.selectors)
        for s, sub in enumerate(request.first_available):
            yield from _selector_problems(prefix, f"{path}.requests[{r}].firstAvailable[{s}].selectors", sub.selectors)


def problems(objects: model.Objects) -> tuple[str, ...]:
    """Every selector in `objects` that does not compile, as the API server would reject it:
    `<file>: <Kind> <name>: <field path>: <message with the fix>`. Pure apart from the
    compile cache; an empty result means every expression compiles."""
    found: list[str] = []
    for device_class in objects.device_classes:
        prefix = f"{device_class.source}: DeviceClass {device_class.meta.name}"
        found.extend(_selector_problems(prefix, "spec.selectors", device_class.selectors))
    for claim in objects.resource_claims:
        prefix = f"{claim.source}: ResourceClaim {claim.meta.namespace}/{claim.meta.name}"
        found.extend(_claim_spec_problems(prefix, "spec.devices", claim.spec))
    for template in objects.resource_claim_templates:
        prefix = f"{template.source}: ResourceClaimTemplate {template.meta.namespace}/{template.meta.name}"
        found.extend(_claim_spec_problems(prefix, "spec.spec.devices", template.spec))
    return tuple(found)
