"""Kubernetes resource quantities ("40Gi", "1.5", "100m", "1e3") as exact values.

Pure: no I/O. A `Quantity` keeps the text it was parsed from, so values round-trip into
output exactly as the user or the API wrote them.
"""

from __future__ import annotations

import dataclasses
import fractions
import math
import re

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": fractions.Fraction(1, 10**9),
    "u": fractions.Fraction(1, 10**6),
    "m": fractions.Fraction(1, 10**3),
    "": fractions.Fraction(1),
    "k": fractions.Fraction(10**3),
    "M": fractions.Fraction(10**6),
    "G": fractions.Fraction(10**9),
    "T": fractions.Fraction(10**12),
    "P": fractions.Fraction(10**15),
    "E": fractions.Fraction(10**18),
}
_PATTERN = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(?:([eE][+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]))?$")


class QuantityError(ValueError):
    """The text is not a Kubernetes quantity."""


@dataclasses.dataclass(frozen=True, slots=True)
class Quantity:
    """An exact quantity. Equality and ordering compare values, not spellings."""

    value: fractions.Fraction
    text: str = dataclasses.field(compare=False)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Quantity) and self.value == other.value

    def __hash__(self) -> int:
        return hash(self.value)

    def __lt__(self, other: Quantity) -> bool:
        return self.value < other.value

    def __le__(self, other: Quantity) -> bool:
        return self.value <= other.value

    def __str__(self) -> str:
        return self.text

    def as_int(self) -> int:
        """The value rounded up to an integer, like the API's `Quantity.Value()`."""
        return math.ceil(self.value)


def parse(raw: object) -> Quantity:
    """Parse a quantity from its text (or a YAML int/float). Raises `QuantityError`."""
    if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
        raise QuantityError(f"must be a quantity string such as \"40Gi\", got {type(raw).__name__}")
    text = raw if isinstance(raw, str) else repr(raw)
    match = _PATTERN.match(text.strip())
    if match is None:
        raise QuantityError(f"{text!r} is not a quantity (expected a number with an optional suffix such as Ki, Mi, Gi, m, k, M, G)")
    number = fractions.Fraction(match.group(1))
    if match.group(2):
        value = number * fractions.Fraction(10) ** int(match.group(2)[1:])
    else:
        suffix = match.group(3) or ""
        value = number * (_BINARY[suffix] if suffix in _BINARY else _DECIMAL[suffix])
    return Quantity(value=value, text=text.strip())


def from_int(value: int) -> Quantity:
    """An integer quantity spelled in plain digits."""
    return Quantity(value=fractions.Fraction(value), text=str(value))


def format_bytes(value: int) -> str:
    """The shortest exact binary-suffixed spelling of an integer ("80Gi", "4864Mi", "7")."""
    for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        unit = _BINARY[suffix]
        if value and value % unit == 0:
            return f"{value // unit}{suffix}"
    return str(value)
