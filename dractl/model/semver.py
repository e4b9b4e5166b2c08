"""Semantic versions (semver 2.0.0) as used by `version` device attributes and CEL `semver()`.

Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
import functools
import re

_STRICT = re.compile(
    r"^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)"
    r"(?:-((?:0|[1-9][0-9]*|[0-9]*[A-Za-z-][0-9A-Za-z-]*)(?:\.(?:0|[1-9][0-9]*|[0-9]*[A-Za-z-][0-9A-Za-z-]*))*))?"
    r"(?:\+([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?\Z"
)
_LOOSE = re.compile(r"^v?([0-9]+)(?:\.([0-9]+))?(?:\.([0-9]+))?(.*)\Z")


class SemverError(ValueError):
    """The text is not a semantic version."""


@functools.total_ordering
@dataclasses.dataclass(frozen=True, slots=True)
class Semver:
    """A parsed version. Ordering follows semver precedence (build metadata ignored)."""

    major: int
    minor: int
    patch: int
    prerelease: tuple[str, ...] = ()
    build: str = ""

    def _key(self) -> tuple[int, int, int, int, tuple[tuple[int, int, str], ...]]:
        # A version without pre-release parts sorts after any pre-release of it.
        pre = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in self.prerelease)
        return (self.major, self.minor, self.patch, 0 if self.prerelease else 1, pre)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Semver) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __lt__(self, other: Semver) -> bool:
        return self._key() < other._key()

    def __str__(self) -> str:
        text = f"{self.major}.{self.minor}.{self.patch}"
        if self.prerelease:
            text += "-" + ".".join(self.prerelease)
        if self.build:
            text += "+" + self.build
        return text


def parse(text: str, *, normalize: bool = False) -> Semver:
    """Parse strict semver 2.0.0; with `normalize`, accept "v1", "1.2" and leading zeros."""
    if normalize:
        loose = _LOOSE.match(text)
        if loose is None:
            raise SemverError(f"{text!r} is not a semantic version")
        major, minor, patch, rest = loose.groups()
        text = f"{int(major)}.{int(minor or 0)}.{int(patch or 0)}{rest}"
    match = _STRICT.match(text)
    if match is None:
        raise SemverError(f'{text!r} is not a semantic version (expected MAJOR.MINOR.PATCH such as "8.0.0")')
    major, minor, patch, pre, build = match.groups()
    return Semver(int(major), int(minor), int(patch), tuple(pre.split(".")) if pre else (), build or "")
