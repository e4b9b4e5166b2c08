"""The package's layers hold: import-linter's contracts in pyproject.toml, and the Cython core behind its facade."""

from __future__ import annotations

import ast
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "dractl"


def test_import_linter_contracts_are_kept() -> None:
    """Guards: every [tool.importlinter] contract (cli -> modes -> alloc -> cel -> model,
    the model's isolation) is kept."""
    lint_imports = pathlib.Path(sys.executable).parent / "lint-imports"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    completed = subprocess.run(
        [str(lint_imports), "--no-cache"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr


def _imported_modules(path: pathlib.Path) -> set[str]:
    """Absolute module names a source file imports, `from a import b` counted as `a` and `a.b`.

    Relative imports are resolved against the file's own package, so `from . import _alloc`
    in dractl/ counts as `dractl._alloc`.
    """
    package = list(path.relative_to(ROOT).with_suffix("").parts[:-1])
    if path.name == "__init__.py":
        package = list(path.relative_to(ROOT).parts[:-1])
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *(node.module.split(".") if node.module else [])])
            if module:
                names.add(module)
            names.update(f"{module}.{alias.name}".lstrip(".") for alias in node.names)
    return names


# Who may import what, beyond the import-linter contracts: compiled modules are invisible to
# import-linter, and these libraries are confined to one place each (STYLE.md).
_CONFINED = {
    "dractl._alloc": ("dractl/alloc/",),
    "kubernetes": ("dractl/kube/",),
    "pynvml": ("dractl/node/nvml.py",),
    "grpc": ("dractl/node/plugin", "dractl/_proto/"),
}


def _importers(module: str) -> list[str]:
    found = []
    for path in PACKAGE.rglob("*.py"):
        imported = _imported_modules(path)
        if any(name == module or name.startswith(module + ".") for name in imported):
            found.append(str(path.relative_to(ROOT)))
    return sorted(found)


@pytest.mark.parametrize("module", sorted(_CONFINED))
def test_confined_modules_are_imported_only_in_their_place(module: str) -> None:
    """Guards: the Cython core, the Kubernetes client, NVML and gRPC are each imported only where STYLE.md puts them."""
    allowed = _CONFINED[module]
    stray = [path for path in _importers(module) if not path.startswith(allowed)]
    assert stray == []


def test_the_allocator_package_imports_the_cython_core_even_relatively() -> None:
    """Guards: the import check itself sees `from dractl import _alloc` and relative forms (else it guards nothing)."""
    assert _importers("dractl._alloc") == [
        "dractl/alloc/__init__.py",
        "dractl/alloc/ledger.py",
        "dractl/alloc/plans.py",
        "dractl/alloc/reasons.py",
    ]
