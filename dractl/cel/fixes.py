"""What to write instead: rewrites and notes for selectors that Kubernetes rejects.

What it does: `compile_message` returns the library's message (with its position marker), then,
where the known fixes reach an expression that compiles, `write instead: <rewrite>`, and a note
per fix. The fixes cover the mistakes of the seed articles: `#` comments, the device plugin's
resource name as the driver, `device.attributes["memory"].quantity().value() >= N` and friends,
`>=`/`+` on quantities and versions, and misspelt or missing `device` fields.

What it must not do: change what compiles; it only explains what does not.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence

from dractl import model
from dractl.cel import environment, lexer

_HINT_DOMAIN = "gpu.nvidia.com"
"""The domain used in suggested rewrites: dractl's default driver name."""

_MAX_FIXES = 16
_ERROR_LINE = re.compile(r"ERROR: <input>:(?P<line>\d+):(?P<column>\d+): (?P<what>[^\n]*)")
_NO_OVERLOAD = re.compile(
    r"found no matching overload for '_(?P<op>[^_]+)_' applied to '\((?P<left>[^,]+), (?P<right>[^)]+)\)'"
)
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


def compile_message(expression: str, raw: str) -> str:
    """The library's message (with its position marker), then the rewrite and the notes."""
    lines = [environment.STATUS.sub("", raw)]
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
            environment.ENV.compile(candidate)
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
    hashes = [token for token in lexer.tokens(text) if token.kind == "hash"]
    for token in reversed(hashes):
        text = _replace(text, token.start, token.start + 1, "//")
    return text, ("CEL comments start with //, not #" if hashes else None)


def _fix_driver_name(text: str) -> tuple[str, str | None]:
    tokens = lexer.tokens(text)
    wrong = [
        tokens[index + 4]
        for index in range(len(tokens) - 4)
        if lexer.is_field(tokens, index, "driver")
        and tokens[index + 3].text in ("==", "!=")
        and _literal(tokens[index + 4]) == "nvidia.com/gpu"
    ]
    for token in reversed(wrong):
        text = _replace(text, token.start, token.end, f'"{_HINT_DOMAIN}"')
    note = f'the NVIDIA DRA driver is named "{_HINT_DOMAIN}"; "nvidia.com/gpu" is the device plugin\'s resource name'
    return text, (note if wrong else None)


def _literal(token: lexer.Token) -> str | None:
    """The value of a plain (unprefixed, escape-free) string literal token."""
    if (
        token.kind == "string"
        and token.text[:1] in "\"'"
        and "\\" not in token.text
        and not token.text.startswith(('"""', "'''"))
    ):
        return token.text[1:-1]
    return None


def _fix_article_attributes(text: str) -> tuple[str, str | None]:
    """`device.attributes["memory"].quantity().value() >= N` and friends from older articles."""
    tokens = lexer.tokens(text)
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


def _article_lookup(tokens: Sequence[lexer.Token], index: int) -> tuple[int, str, str] | None:
    """Match `device.attributes["key"].accessor()[.value()] [op literal]` at `index`."""
    if not lexer.is_field(tokens, index, "attributes"):
        return None
    shape = [token.text for token in tokens[index + 3 : index + 10]]
    if (
        len(shape) < 7
        or shape[0] != "["
        or shape[2] != "]"
        or shape[3] != "."
        or shape[4] not in _ACCESSORS
        or shape[5:7] != ["(", ")"]
    ):
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
        note = (
            f'"{key}" is a capacity, read as {base}: capacity and attributes are keyed by domain, then name, and '
            "quantities compare with compareTo()"
        )
        if operator is not None and operand is not None and operand.kind in ("number", "string"):
            amount = _quantity_text(operand, memory=name == "memory")
            return end + 2, f'{base}.compareTo(quantity("{amount}")) {operator} 0', note
        return end, base, note
    base = f'device.attributes["{domain}"].{name}'
    if kind == "version":
        note = (
            f'"{key}" is the version attribute {base}: versions compare with compareTo(semver(...)), as strings '
            '"10.0" < "8.0"'
        )
        version = _literal(operand) if operand is not None else None
        if operator is not None and version is not None and environment.is_semver(version, normalize=True):
            normalized = environment.semver_message(model.semver.parse(version, normalize=True)).s
            return end + 2, f'{base}.compareTo(semver("{normalized}")) {operator} 0', note
        return end, base, note
    return end, base, f"attributes are keyed by domain, then name: {base}"


def _driver_domain(tokens: Sequence[lexer.Token]) -> str:
    """The domain of the driver the expression tests for, for names we do not know."""
    for index in range(len(tokens) - 4):
        if lexer.is_field(tokens, index, "driver") and tokens[index + 3].text == "==":
            driver = _literal(tokens[index + 4])
            if driver is not None:
                # A driver name is a DNS subdomain; "vendor.com/thing" is a device plugin
                # resource name and says nothing about the DRA driver's name.
                return driver if "/" not in driver else "<driver name>"
    return _HINT_DOMAIN


def _camel(key: str) -> str:
    head, *rest = re.split(r"[-_]", key)
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _quantity_text(token: lexer.Token, *, memory: bool) -> str:
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
        tokens = lexer.tokens(text)
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


def _fix_operator(
    text: str, tokens: Sequence[lexer.Token], at: int, match: re.Match[str]
) -> tuple[str | None, str | None] | None:
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


def _operand_start(tokens: Sequence[lexer.Token], index: int) -> int | None:
    """First token of the member/call/index chain that ends at `tokens[index]`."""
    while index >= 0:
        token = tokens[index]
        if token.text in lexer.OPENING:
            opener = lexer.matching(tokens, index)
            if opener is None:
                return None
            index = opener
            before = tokens[index - 1] if index > 0 else None
            if (
                token.text == "]"
                and before is not None
                and (before.kind in ("ident", "string", "number") or before.text in lexer.OPENING)
            ):
                index -= 1  # an index: the chain continues with what is indexed
                continue
            if token.text == ")" and before is not None and before.kind == "ident":
                index -= 1  # a call: the function name belongs to the operand
        elif token.kind not in ("ident", "string", "number"):
            return None
        if index >= 2 and tokens[index - 1].text == ".":
            index -= 2
        elif index >= 3 and tokens[index - 1].text == "?" and tokens[index - 2].text == ".":
            index -= 3
        else:
            return index
    return None


def _operand_end(tokens: Sequence[lexer.Token], index: int) -> int | None:
    """Last token of the (unary-prefixed) member/call/index chain that starts at `tokens[index]`."""
    while index < len(tokens) and tokens[index].text in ("-", "!"):
        index += 1
    if index >= len(tokens):
        return None
    token = tokens[index]
    if token.text in lexer.CLOSING:
        end = lexer.matching(tokens, index)
    elif token.kind == "ident" and index + 1 < len(tokens) and tokens[index + 1].text == "(":
        end = lexer.matching(tokens, index + 1)
    elif token.kind in ("ident", "string", "number"):
        end = index
    else:
        return None
    while end is not None and end + 1 < len(tokens):
        following = tokens[end + 1].text
        if following == "[":
            end = lexer.matching(tokens, end + 1)
        elif following == "." and end + 2 < len(tokens):
            name = end + 3 if tokens[end + 2].text == "?" else end + 2
            if name >= len(tokens) or tokens[name].kind != "ident":
                return None
            end = lexer.matching(tokens, name + 1) if name + 1 < len(tokens) and tokens[name + 1].text == "(" else name
        else:
            break
    return end


def _fix_undeclared(
    text: str, tokens: Sequence[lexer.Token], at: int | None, name: str
) -> tuple[str | None, str | None]:
    fields = ", ".join(f"device.{field}" for field in _DEVICE_FIELDS)
    if name == "device":
        return None, f"`device` is used through its fields: {fields}"
    if name.startswith("device.") and at is not None:
        field = name.partition(".")[2]
        # The checker points at the dot before the field.
        lookup = next((i + 2 for i in range(max(at - 2, 0), at + 1) if lexer.is_field(tokens, i, field)), None)
        close = difflib.get_close_matches(field, _DEVICE_FIELDS, n=1)
        if close and lookup is not None:
            token = tokens[lookup]
            return _replace(
                text, token.start, token.end, close[0]
            ), f"`device` has no field {field!r}; did you mean device.{close[0]}?"
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
