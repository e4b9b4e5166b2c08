"""The package's layers hold: import-linter's contracts in pyproject.toml, and the Cython core behind its facade."""

from __future__ import annotations

import ast
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "dractl"


def test_import_linter_contracts_are_kept() -> None:
    """Guards: every [tool.importlinter] contract (cli -> modes -> alloc -> cel -> model, the model's isolation) is kept."""
    lint_imports = pathlib.Path(sys.executable).parent / "lint-imports"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    completed = subprocess.run(
        [str(lint_imports), "--no-cache"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr


def _imported_modules(path: pathlib.Path) -> set[str]:
    """Absolute module names a source file imports, `from a import b` counted as `a` and `a.b`."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_only_the_facade_imports_the_cython_core() -> None:
    """Guards: dractl._alloc is imported only by dractl/alloc.py (import-linter cannot see compiled modules, so this is checked here)."""
    importers = sorted(
        str(path.relative_to(ROOT)) for path in PACKAGE.rglob("*.py") if "dractl._alloc" in _imported_modules(path)
    )
    assert importers == ["dractl/alloc.py"]
