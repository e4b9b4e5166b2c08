"""`mypy --strict` holds on the whole package, with the settings in pyproject.toml."""

from __future__ import annotations

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_package_is_strictly_typed() -> None:
    """Guards: every module under dractl/ (and the core's .pyi stub) passes mypy --strict."""
    completed = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
