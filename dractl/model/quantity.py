"""Kubernetes resource quantities ("40Gi", "1.5", "100m", "1e3") as exact values.

Pure: no I/O. A `Quantity` keeps the text it was parsed from, so values round-trip into
output exactly as the user or the API wrote them.
"""

from __future__ import annotations

import dataclasses
import fractions
import functools
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
_PATTERN = re.compile(
    r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(?:([eE][+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]))?$"
)


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
        value = self.value
        # Most quantities are whole: their numerator is the answer, without Fraction.__ceil__.
        return value.numerator if value.denominator == 1 else math.ceil(value)


# resource.Quantity rounds precision finer than 1n (10^-9) up and caps binary-suffixed values
# at the largest int64; decimal ones it keeps exact. Capacities and counters must fit in an
# int64 for the allocator (`fits_int64`), so the decoder refuses larger ones with a message.
MAX_VALUE = 2**63 - 1
_NANO = 10**9
_MAX_MAGNITUDE = 100  # dractl's own bound on the work: no quantity of 10^100 or more is meaningful
_SIGNIFICANT = _MAX_MAGNITUDE + 20  # digits kept exactly; anything after them is far below 1n
_EXPONENT_DIGITS = 6  # exponents of more digits are out of range whatever the mantissa


def parse(raw: object) -> Quantity:
    """Parse a quantity from its text (or a YAML int/float). Raises `QuantityError`.

    Like resource.Quantity, precision finer than 1n is rounded up, away from zero. Values are
    exact otherwise (check `fits_int64` where an int64 is needed). The work is bounded whatever
    the input: values of 10^100 or more (thousands of digits, or an exponent like `1e999999`)
    are refused without building the number.
    """
    if type(raw) is str:
        return _parse_text(raw)
    if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
        raise QuantityError(f'must be a quantity string such as "40Gi", got {type(raw).__name__}')
    if isinstance(raw, float) and not math.isfinite(raw):
        raise QuantityError(f"{raw!r} is not a quantity (a finite number with an optional suffix such as Gi)")
    return _parse_text(raw if isinstance(raw, str) else repr(raw))


@functools.lru_cache(maxsize=4096)
def _parse_text(text: str) -> Quantity:
    """`parse` of a text, remembered: the API's objects repeat a few quantities ("100m", "1Gi") in every pod and
    node, and a `Quantity` is immutable. A text that raises is not remembered."""
    match = _PATTERN.match(text.strip())
    if match is None:
        raise QuantityError(
            f"{_shown(text)} is not a quantity "
            "(expected a number with an optional suffix such as Ki, Mi, Gi, m, k, M, G)"
        )
    mantissa, exponent_text, suffix = match.group(1), match.group(2), match.group(3) or ""
    negative = mantissa.startswith("-")
    whole, _, fraction = mantissa.lstrip("+-").partition(".")
    significant = (whole + fraction).lstrip("0")
    text = text.strip()
    if not significant:
        return Quantity(value=fractions.Fraction(0), text=text)
    # The decimal position of the first significant digit, and the scale the suffix adds.
    whole_digits = len(whole.lstrip("0"))
    lead = whole_digits - 1 if whole_digits else -(len(fraction) - len(fraction.lstrip("0"))) - 1
    exponent, binary = 0, 1
    if exponent_text:
        digits = exponent_text[1:].lstrip("+-").lstrip("0")
        if len(digits) > _EXPONENT_DIGITS:
            exponent = -(10**_EXPONENT_DIGITS) if exponent_text[1:].startswith("-") else 10**_EXPONENT_DIGITS
        else:
            exponent = int(exponent_text[1:])
    elif suffix in _BINARY:
        binary = _BINARY[suffix]
    else:
        exponent = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}[suffix]
    magnitude = lead + exponent + len(str(binary)) - 1
    if magnitude >= _MAX_MAGNITUDE:
        raise QuantityError(f"{_shown(text)} is too large: quantities of 10^{_MAX_MAGNITUDE} or more are not supported")
    if magnitude < -11:
        nano = 1  # non-zero but far below 1n: the API rounds it up to 1n
    else:
        kept = significant[:_SIGNIFICANT]
        exact = (
            fractions.Fraction(int(kept)) * fractions.Fraction(10) ** (lead - len(kept) + 1 + exponent) * binary * _NANO
        )
        nano = math.ceil(exact)
        if nano == exact and len(significant) > _SIGNIFICANT and significant[_SIGNIFICANT:].strip("0"):
            nano += 1
    return Quantity(value=fractions.Fraction(-nano if negative else nano, _NANO), text=text)


def fits_int64(q: Quantity) -> bool:
    """Whether the value lies within +-(2^63-1), what an int64 (and a binary-suffixed resource.Quantity) holds."""
    value = q.value
    return abs(value.numerator) <= MAX_VALUE * value.denominator  # integer arithmetic: far cheaper than Fraction's


def shown(text: str) -> str:
    """The text quoted for a message, shortened when it is absurdly long."""
    return _shown(text)


def _shown(text: str) -> str:
    """The text quoted for a message, shortened when it is absurdly long."""
    return repr(text) if len(text) <= 64 else f"{text[:40]!r}... ({len(text)} characters)"


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
