"""The tree stays lint clean and formatted: `ruff check` and `ruff format --check` with pyproject.toml's settings."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
# The ruff of the interpreter running the tests (the .venv's, pinned in the `test` extra), not one
# found on PATH, so every machine checks with the same rules.
RUFF = pathlib.Path(sys.executable).parent / "ruff"


def _ruff(*args: str) -> subprocess.CompletedProcess[str]:
    if not RUFF.exists():
        pytest.skip(f"needs ruff next to {sys.executable}: pip install -e '.[test]'")
    return subprocess.run(
        [str(RUFF), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_ruff_check_finds_nothing() -> None:
    """Guards: `ruff check .` (rules E, F, W, I, UP, B; line length 120) reports no finding in the repository."""
    completed = _ruff("check", "--no-cache", "--output-format", "concise", ".")
    assert completed.returncode == 0, completed.stdout + completed.stderr


def test_ruff_format_changes_nothing() -> None:
    """Guards: `ruff format --check .` would reformat no file in the repository."""
    completed = _ruff("format", "--no-cache", "--check", ".")
    assert completed.returncode == 0, completed.stdout + completed.stderr
