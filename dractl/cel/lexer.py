"""A tokenizer for CEL text, and the optional-domain rewrite that works on its tokens.

What it does: splits an expression into significant tokens (strings, numbers, identifiers,
operators; `#` comments are kept as a token so the fixes can point at them) and finds matching
brackets. Kubernetes returns an empty map for an unknown domain; the library has no lazy maps, so
each `device.attributes[d]` and `device.capacity[d]` is rewritten, on tokens, to
`device.attributes[?d].orValue({})` before compiling.

What it must not do: decide what an expression means; the library's checked AST does that
(`checked`), and this module only serves text rewrites and hints.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator, Sequence

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
CLOSING = {"(": ")", "[": "]", "{": "}"}
OPENING = {closing: opening for opening, closing in CLOSING.items()}


@dataclasses.dataclass(frozen=True, slots=True)
class Token:
    kind: str
    text: str
    start: int
    end: int


def tokens(text: str) -> list[Token]:
    """Significant tokens (no spaces or `//` comments); a `#...` comment is kept as a token."""
    return [
        Token(match.lastgroup or "other", match.group(), match.start(), match.end())
        for match in _TOKEN.finditer(text)
        if match.lastgroup not in _SKIPPED
    ]


def matching(tokens: Sequence[Token], index: int) -> int | None:
    """Index of the bracket that closes `tokens[index]`, or opens it if it is a closing one."""
    own = tokens[index].text
    if own in CLOSING:
        step, partner = 1, CLOSING[own]
    else:
        step, partner = -1, OPENING[own]
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


def is_field(tokens: Sequence[Token], index: int, name: str) -> bool:
    """Whether tokens[index:] start `device . <name>` with `device` not itself a field."""
    return (
        index + 2 < len(tokens)
        and tokens[index].text == "device"
        and tokens[index + 1].text == "."
        and tokens[index + 2].text == name
        and (index == 0 or tokens[index - 1].text != ".")
    )


def _domain_lookups(tokens: Sequence[Token]) -> Iterator[tuple[int, int]]:
    """(open, close) token indices of each `[...]` right after device.attributes/capacity."""
    for index in range(len(tokens)):
        if (is_field(tokens, index, "attributes") or is_field(tokens, index, "capacity")) and index + 3 < len(tokens):
            bracket = index + 3
            if tokens[bracket].text == "[" and bracket + 1 < len(tokens) and tokens[bracket + 1].text != "?":
                close = matching(tokens, bracket)
                if close is not None:
                    yield bracket, close


def optional_domains(expression: str) -> str:
    """Rewrite `device.attributes[d]` to `device.attributes[?d].orValue({})` (same for capacity)."""
    inserts: list[tuple[int, str]] = []
    found = tokens(expression)
    for open_index, close_index in _domain_lookups(found):
        inserts.append((found[open_index].end, "?"))
        inserts.append((found[close_index].end, ".orValue({})"))
    text = expression
    for position, insert in sorted(inserts, reverse=True):
        text = text[:position] + insert + text[position:]
    return text
