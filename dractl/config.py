"""Frozen settings per mode, built by the CLI from flags and environment variables.

What it does: holds the values a mode runs with, already parsed and defaulted, so each
mode's `run()` takes one value instead of a list of flags. What it must not do: read the
environment, parse flags or import any other dractl layer; the CLI does the parsing and
this module sits at the bottom of the layers beside `model`.
"""

from __future__ import annotations

import dataclasses
import enum
import pathlib


class Policy(enum.Enum):
    """The allocation policy, by its CLI spelling; `alloc.Policy` is this same enum."""

    FIRST_FIT = "first-fit"  # upstream's choices exactly
    BINPACK = "binpack"  # scored: pack nodes and GPUs, keep locality, avoid MIG fragmentation


class OutputFormat(enum.Enum):
    TABLE = "table"
    JSON = "json"
    YAML = "yaml"


DEFAULT_SEARCH_LIMIT = 1_000_000


@dataclasses.dataclass(frozen=True, slots=True)
class Simulate:
    """Settings of `dractl simulate`. No `paths` means the built-in example cluster."""

    paths: tuple[pathlib.Path, ...] = ()
    policy: Policy = Policy.BINPACK
    output: OutputFormat = OutputFormat.TABLE
    timing: bool = False
    search_limit: int = DEFAULT_SEARCH_LIMIT
