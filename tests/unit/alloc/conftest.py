"""Allocator test set-up: this directory on sys.path, so tests import the input
constructors from `alloc_inputs` (pytest runs with --import-mode=importlib)."""

from __future__ import annotations

import pathlib
import sys

HERE = str(pathlib.Path(__file__).resolve().parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)
