"""YAML read the way kubectl reads it: YAML 1.1 scalars as sigs.k8s.io/yaml (goyaml.v2) resolves them.

What it does: parses multi-document YAML with libyaml (PyYAML's C parser) and builds plain Python
values (dict, list, str, int, float, bool, None) with goyaml.v2's rules for plain scalars:
`y`/`yes`/`on` (any of their three spellings) are true and `n`/`no`/`off` false; integers take
Go's base prefixes (`0x1F`, `0o17`, `0b101`, and `0777` as octal) with `_` removed; integers
beyond uint64 become floats like Go's; `1e999999` (out of float range) and timestamps stay
strings; sexagesimal `1:30` is a string. Tags behave as in goyaml.v2: `!!str`, `!!int`,
`!!float`, `!!bool`, `!!null` and `!!timestamp` convert or refuse the value, `!!binary` is
base64-decoded, and unknown tags (`!foo`, `!!python/object:...`) are ignored: the value keeps
its text. Merge keys (`<<`) are supported.

Bounds: flow nesting (`[`/`{`) deeper than `MAX_FLOW_DEPTH` is refused before parsing; the fast
path gives up past that depth; and before PyYAML's recursive composer sees the text, block
indentation wider than `MAX_INDENT` columns is refused too, so its recursion stays far from the C
stack's end (100,000 levels used to kill the process with a signal). Aliases are checked after parsing:
an alias to a node that contains it, or aliases that would expand the document past
`MAX_EXPANDED_NODES` values ("billion laughs"), are refused.

Plain documents (nearly every manifest) are read by `_fastyaml`, libyaml's events straight into
values; documents with anchors, aliases, tags or merge keys, and syntax errors, go through
PyYAML with the same scalar rules (`yaml11_pyyaml`, imported only then).

What it must not do: validate Kubernetes fields (the decoders do) or read files. Pure.
"""

from __future__ import annotations

import functools
import itertools
import math
import re
from collections.abc import Iterator

from dractl.model.decode import _fastyaml

MAX_FLOW_DEPTH = 1000
MAX_INDENT = 2000
MAX_EXPANDED_NODES = 1_000_000

_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_BOOL = "tag:yaml.org,2002:bool"
_NULL = "tag:yaml.org,2002:null"
_STR = "tag:yaml.org,2002:str"
_TIMESTAMP = "tag:yaml.org,2002:timestamp"
_BINARY = "tag:yaml.org,2002:binary"
_MERGE = "tag:yaml.org,2002:merge"
_SEQ = "tag:yaml.org,2002:seq"
_MAP = "tag:yaml.org,2002:map"
_RESOLVABLE = frozenset({_STR, _BOOL, _INT, _FLOAT, _NULL, _TIMESTAMP})

_WORDS: dict[str, tuple[str, object]] = {}
for _spellings, _entry in (
    (("y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON"), (_BOOL, True)),
    (("n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF"), (_BOOL, False)),
    (("", "~", "null", "Null", "NULL"), (_NULL, None)),
    ((".nan", ".NaN", ".NAN"), (_FLOAT, math.nan)),
    ((".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF"), (_FLOAT, math.inf)),
    (("-.inf", "-.Inf", "-.INF"), (_FLOAT, -math.inf)),
    (("<<",), (_MERGE, "<<")),
):
    for _word in _spellings:
        _WORDS[_word] = _entry

_FLOAT_TEXT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?\Z")
_GO_INT = re.compile(r"[-+]?(0[xX][0-9a-fA-F]+|0[oO][0-7]+|0[bB][01]+|0[0-7]*|[1-9][0-9]*)\Z")
_TIMESTAMP_TEXT = re.compile(
    r"[0-9]{4}-[0-9]{1,2}-[0-9]{1,2}"
    r"(?:(?:[Tt][0-9]{1,2}:[0-9]{1,2}:[0-9]{1,2}(?:\.[0-9]+)?(?:Z|[-+][0-9]{2}:[0-9]{2}))"
    r"|(?: [0-9]{1,2}:[0-9]{1,2}:[0-9]{1,2}(?:\.[0-9]+)?))?\Z"
)
_INT64_MIN, _UINT64_MAX = -(2**63), 2**64 - 1
_FLOW = re.compile(r"[\[\]{}]")
_FLOW_DELTA = {"[": 1, "{": 1, "]": -1, "}": -1}
# A line's indentation plus its compact indicators (`- - - x`): each nesting level takes a column.
_DEEP_BLOCK = re.compile(rf"^[ \t?:-]{{{MAX_INDENT}}}", re.MULTILINE)


_TOO_DEEP_FLOW = f"nested too deeply: more than {MAX_FLOW_DEPTH} levels of [ and {{"


class YamlError(ValueError):
    """Text that is not YAML kubectl would accept; the message names the line and column when known."""


def load_all(text: str) -> Iterator[object]:
    """The documents of a YAML stream, as plain values. Raises `YamlError`; empty documents yield None.

    Pure. Bounded: see the module docstring for the depth and alias limits.
    """
    # Plain documents (no anchors, aliases, tags or merge keys: nearly every manifest) take the
    # libyaml fast path, seven times faster; anything else, errors included, takes PyYAML's.
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError as error:
        check_flow_nesting(text)  # the nesting problem comes first, as for UTF-8 text
        raise YamlError(f"not UTF-8 text: {error.reason} at character {error.start}") from None
    # `check_flow_nesting`, counted in C over the bytes: a tenth of its time on a large file.
    if len(text) > MAX_FLOW_DEPTH and _fastyaml.flow_depth(data) > MAX_FLOW_DEPTH:
        raise YamlError(_TOO_DEEP_FLOW)
    documents = _fastyaml.load_all(data, _plain_value, MAX_FLOW_DEPTH)
    if documents is not None:
        yield from documents
        return
    check_block_nesting(text)
    yield from load_all_with_pyyaml(text)


def load_all_with_pyyaml(text: str) -> Iterator[object]:
    """`load_all` through PyYAML alone (the path for anchors, tags, merge keys and errors).

    Pure; the caller must have run `check_flow_nesting` and `check_block_nesting`. Public so
    tests can hold the fast path to it.
    """
    # Imported here: PyYAML's Python modules take about 15 ms to import, and JSON input and
    # plain YAML documents (the fast path) never need them.
    from dractl.model.decode import yaml11_pyyaml

    return yaml11_pyyaml.load_all(text)


def check_flow_nesting(text: str) -> None:
    """Refuse text nested deeper than `MAX_FLOW_DEPTH` brackets, before a recursive parser sees it.

    Counts every bracket, also those inside quoted strings: an over-estimate that only ever
    refuses more, and real manifests stay far below the limit either way. Cheap for block-style
    YAML (a few brackets in CEL selectors).
    """
    if len(text) > MAX_FLOW_DEPTH and text.count("[") + text.count("{") > MAX_FLOW_DEPTH:
        deltas = map(_FLOW_DELTA.__getitem__, _FLOW.findall(text))
        if max(itertools.accumulate(deltas), default=0) > MAX_FLOW_DEPTH:
            raise YamlError(_TOO_DEEP_FLOW)


def check_block_nesting(text: str) -> None:
    """Refuse block nesting (indentation and compact `- - -` indicators) wider than `MAX_INDENT` columns.

    Only PyYAML needs it: the fast path is iterative and bounds its own depth.
    """
    if len(text) > MAX_INDENT:
        deep = _DEEP_BLOCK.search(text)
        if deep is not None:
            line = text.count("\n", 0, deep.start()) + 1
            raise YamlError(f"line {line}: nested too deeply: indented more than {MAX_INDENT} columns")


def _check_aliases(value: object) -> str | None:
    """Refuse aliases that contain themselves or expand the document past `MAX_EXPANDED_NODES`.

    Shared values are counted once per reference, as a JSON encoder would expand them;
    memoised by identity, so the walk costs one visit per distinct container.
    """
    sizes: dict[int, int] = {}
    active: set[int] = set()
    stack: list[tuple[object, Iterator[object] | None]] = [(value, None)]
    totals: list[int] = [0]
    while stack:
        current, children = stack[-1]
        if children is None:
            key = id(current)
            if key in sizes:
                stack.pop()
                totals[-1] += sizes[key]
                continue
            if key in active:
                return "an alias refers to a value that contains it (a recursive anchor)"
            active.add(key)
            items = current.values() if isinstance(current, dict) else current
            stack[-1] = (current, iter(items))  # type: ignore[call-overload]
            totals.append(1)
            continue
        for child in children:
            if isinstance(child, (dict, list)):
                stack.append((child, None))
                break
            totals[-1] += 1
        else:
            stack.pop()
            size = totals.pop()
            sizes[id(current)] = size
            active.discard(id(current))
            totals[-1] += size
            if totals[-1] > MAX_EXPANDED_NODES:
                return f"aliases expand to more than {MAX_EXPANDED_NODES} values (an alias bomb)"
    return None


@functools.lru_cache(maxsize=65536)
def _plain(text: str) -> tuple[str, object]:
    """goyaml.v2's resolution of a plain (unquoted, untagged) scalar: (tag, value)."""
    word = _WORDS.get(text)
    if word is not None:
        return word
    first = text[:1]
    if first == ".":
        return _go_float(text) or (_STR, text)
    if not (first.isdigit() or first in "+-"):
        return _STR, text
    if _TIMESTAMP_TEXT.match(text):
        return _TIMESTAMP, text  # goyaml.v2 hands timestamps to untyped targets as their text
    number = _go_int(text.replace("_", ""))
    if number is not None:
        return number
    return _go_float(text.replace("_", "")) or (_STR, text)


@functools.lru_cache(maxsize=65536)
def _plain_value(text: str) -> object:
    """The value of a plain scalar (`_plain` without its tag), for the fast path."""
    return _plain(text)[1]


def _go_int(text: str) -> tuple[str, object] | None:
    """Go's ParseInt/ParseUint with base 0 (then float for values beyond uint64); None if not an integer."""
    if not _GO_INT.match(text):
        return None
    sign = -1 if text[0] == "-" else 1
    digits = text.lstrip("+-")
    if len(digits) > 2 and digits[1] in "xXoObB":
        base = {"x": 16, "o": 8, "b": 2}[digits[1].lower()]
        digits = digits[2:]
    else:
        base = 8 if len(digits) > 1 and digits[0] == "0" else 10
    # Bound the work before converting: a uint64 has at most 64 binary digits.
    if len(digits.lstrip("0")) > 64:
        value = None
    else:
        value = sign * int(digits, base)
    if value is not None and _INT64_MIN <= value <= _UINT64_MAX:
        return _INT, value
    if base == 10:
        return _go_float(text)
    return None


def _go_float(text: str) -> tuple[str, object] | None:
    """Go's ParseFloat for text that looks like a float; out of range (`1e999999`) is not a float."""
    if not _FLOAT_TEXT.match(text):
        return None
    value = float(text)
    if math.isinf(value):
        return None
    return _FLOAT, value
