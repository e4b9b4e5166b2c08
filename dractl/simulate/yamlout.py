"""Block YAML for plain data (dicts, lists, strings, ints, bools, None), byte for byte as
PyYAML's `SafeDumper` writes it with `sort_keys=False`, `explicit_start=True` and a wide line,
about ten times faster.

Why: `-o yaml` prints thousands of ResourceClaims, and PyYAML's representer spends most of
its time on per-node Python bookkeeping. This writer handles the shapes `model.encode`
produces directly and asks PyYAML only for what it must decide itself: how to quote a string
that is not obviously plain (the answer is cached per string), and whole documents that hold
anything unusual (a multi-line string, a float, an odd key), which it dumps as before.

Pure apart from writing to the stream it is given. One difference from PyYAML on purpose:
an object referenced twice in a document is written twice, never as an anchor and alias
(`&id001`/`*id001`), as kubectl prints objects.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, TextIO

import yaml

_WIDTH = 1 << 16
# Characters that never need quoting in a plain scalar that starts with a letter or digit;
# whether such a string would read back as a string (not 1.5, true or null) PyYAML's resolver says.
_SAFE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]*")
_STR_TAG = "tag:yaml.org,2002:str"
_RESOLVER = yaml.resolver.Resolver()


def _resolves_to_str(value: str) -> bool:
    """Whether PyYAML reads `value`, written plain, back as a string."""
    tag: str = _RESOLVER.resolve(yaml.ScalarNode, value, (True, False))  # type: ignore[no-untyped-call]
    return tag == _STR_TAG


class _Unusual(Exception):
    """A document holds something this writer leaves to PyYAML."""


class Writer:
    """Writes documents to one stream. Caches how each distinct string is spelled, so one
    writer per output. Not thread-safe."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._scalars: dict[str, str | None] = {}  # string -> its spelling; None: needs PyYAML's document writer
        self._keys: dict[str, str] = {}  # mapping keys known to be plain

    def documents(self, documents: Iterable[Any], *, comments: Iterable[str | None] | None = None) -> None:
        """Each document after `---`, preceded by its comment lines (one `# ` line per line of
        the comment) when one is given."""
        notes = iter(comments) if comments is not None else None
        for document in documents:
            note = next(notes, None) if notes is not None else None
            if note:
                self._out.write("".join(f"# {line}\n" for line in note.splitlines()))
            lines: list[str] = []
            try:
                if isinstance(document, dict) and document:
                    lines.append("---\n")
                    self._mapping(document, indent="", lines=lines)
                else:
                    raise _Unusual
            except _Unusual:
                lines = [
                    yaml.dump(document, Dumper=yaml.CSafeDumper, sort_keys=False, explicit_start=True, width=_WIDTH)
                ]
            self._out.write("".join(lines))

    def _scalar(self, value: str) -> str:
        spelled = self._scalars.get(value, "")
        if spelled is None:
            raise _Unusual
        if spelled:
            return spelled
        if _SAFE.fullmatch(value) and _resolves_to_str(value):
            self._scalars[value] = value
            return value
        text = yaml.dump(value, Dumper=yaml.CSafeDumper, width=_WIDTH)
        if text.endswith("\n...\n"):
            text = text[:-5]
        text = text[:-1] if text.endswith("\n") else text
        if "\n" in text or not text:
            # Multi-line spellings depend on the indentation: PyYAML writes the document.
            self._scalars[value] = None
            raise _Unusual
        self._scalars[value] = text
        return text

    def _key(self, key: object) -> str:
        if isinstance(key, str):
            spelled = self._keys.get(key)
            if spelled is not None:
                return spelled
            if _SAFE.fullmatch(key):
                spelled = self._keys[key] = self._scalar(key)
                return spelled
        raise _Unusual

    def _inline(self, value: object) -> str | None:
        """The spelling of a value that fits after `key: ` or `- `, or None for a non-empty
        mapping or list."""
        if isinstance(value, str):
            return self._scalar(value)
        if value is True:
            return "true"
        if value is False:
            return "false"
        if value is None:
            return "null"
        if type(value) is int:
            return str(value)
        if isinstance(value, dict):
            return None if value else "{}"
        if isinstance(value, list):
            return None if value else "[]"
        raise _Unusual  # floats, tuples and other types: PyYAML decides

    def _mapping(self, mapping: dict[Any, Any], *, indent: str, lines: list[str], first: str | None = None) -> None:
        """`first` is the prefix of the first line ("- " after a list dash), else `indent`."""
        prefix = indent if first is None else first
        for key, value in mapping.items():
            spelled = self._inline(value)
            name = self._key(key)
            if spelled is not None:
                lines.append(f"{prefix}{name}: {spelled}\n")
            elif isinstance(value, dict):
                lines.append(f"{prefix}{name}:\n")
                self._mapping(value, indent=indent + "  ", lines=lines)
            else:
                lines.append(f"{prefix}{name}:\n")
                # PyYAML writes a list inside a mapping without indenting its dashes.
                self._sequence(value, indent=indent, lines=lines)
            prefix = indent

    def _sequence(self, items: list[Any], *, indent: str, lines: list[str], first: str | None = None) -> None:
        prefix = indent if first is None else first
        for item in items:
            spelled = self._inline(item)
            if spelled is not None:
                lines.append(f"{prefix}- {spelled}\n")
            elif isinstance(item, dict):
                self._mapping(item, indent=indent + "  ", lines=lines, first=prefix + "- ")
            else:
                self._sequence(item, indent=indent + "  ", lines=lines, first=prefix + "- ")
            prefix = indent
