"""The runtime dependencies' declared floors hold: the generated stubs accept them, and the oldest declared
version of every dependency, installed in a fresh virtual environment from PyPI, runs every mode."""

from __future__ import annotations

import hashlib
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROTO = ROOT / "dractl" / "_proto"
_REQUIREMENT = re.compile(r"^(?P<name>[A-Za-z0-9_.-]+)\s*(?P<specs>.*)$")


def _floors() -> dict[str, str]:
    """Each runtime dependency's lowest allowed version (`>=X` or `==X`), by lower-cased name."""
    document = tomllib.loads((ROOT / "pyproject.toml").read_text())
    floors = {}
    for requirement in document["project"]["dependencies"]:
        match = _REQUIREMENT.match(requirement.split(";")[0].strip())
        assert match is not None, requirement
        lowest = re.search(r"(?:>=|==)\s*([0-9][0-9A-Za-z.]*)", match["specs"])
        assert lowest is not None, f"pyproject.toml: dependency {requirement!r} declares no lowest version"
        floors[match["name"].lower()] = lowest[1]
    return floors


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def test_grpcio_and_protobuf_floors_are_what_the_generated_stubs_require() -> None:
    """Guards: every *_pb2_grpc.py refuses grpcio below its GRPC_GENERATED_VERSION and every *_pb2.py protobuf
    below its gencode version, so pyproject.toml's floors must be exactly those (a node with grpcio 1.84 once
    installed the agent and could not start it)."""
    floors = _floors()
    grpc_versions = set()
    for module in PROTO.glob("*_pb2_grpc.py"):
        generated = re.search(r"GRPC_GENERATED_VERSION = '([0-9.]+)'", module.read_text())
        assert generated is not None, module
        grpc_versions.add(generated[1])
    assert grpc_versions == {floors["grpcio"]}
    protobuf_versions = set()
    for module in PROTO.glob("*_pb2.py"):
        found = re.search(r"ValidateProtobufRuntimeVersion\(\s*\S+,\s*(\d+),\s*(\d+),\s*(\d+),", module.read_text())
        assert found is not None, module
        protobuf_versions.add(".".join(found.groups()))
    assert protobuf_versions == {floors["protobuf"]}


def _cache_dir() -> pathlib.Path:
    base = pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache")
    return base / "dractl"


def _minimum_environment(pins: list[str]) -> pathlib.Path:
    """A virtual environment of this interpreter holding exactly `pins` (and what they need), made once per set of
    pins and kept in the cache; built aside and renamed, so test runs at once never see a half-made one."""
    key = hashlib.sha256("\n".join([sys.version, *pins]).encode()).hexdigest()[:16]
    done = _cache_dir() / f"min-deps-{key}"
    if (done / "complete").exists():
        return done
    done.parent.mkdir(parents=True, exist_ok=True)
    building = pathlib.Path(tempfile.mkdtemp(prefix="min-deps-", dir=done.parent))
    try:
        subprocess.run([sys.executable, "-m", "venv", str(building)], check=True, capture_output=True)
        installed = subprocess.run(
            [str(building / "bin" / "python"), "-m", "pip", "install", "-q", "--no-input", *pins],
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert installed.returncode == 0, f"pip could not install the declared floors {pins}:\n{installed.stderr}"
        (building / "complete").write_text("\n".join(pins) + "\n")
        try:
            building.rename(done)
        except OSError:
            pass  # another run finished the same environment first; use that one
    finally:
        if building.exists():
            shutil.rmtree(building, ignore_errors=True)
    return done


def test_the_declared_minimum_versions_run_every_mode() -> None:
    """Guards: pyproject.toml's floors are true: with every runtime dependency at its lowest declared version
    (from PyPI, in a fresh environment cached under ~/.cache/dractl), every dractl module imports with warnings
    as errors, `dractl --version` works and `dractl discover --device-source fake` prints the fake node's slices."""
    floors = _floors()
    environment = _minimum_environment(sorted(f"{name}=={version}" for name, version in floors.items()))
    python = str(environment / "bin" / "python")
    listed = subprocess.run(
        [python, "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True, check=True
    ).stdout
    installed = {line.split("==")[0].lower().replace("_", "-"): line.split("==")[1] for line in listed.splitlines()}
    for name, version in floors.items():
        assert _version(installed[name.replace("_", "-")]) == _version(version), (name, installed[name])
    # The package itself comes from this tree (its compiled extensions are built in place), not from the venv.
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(ROOT), "HOME": str(pathlib.Path.home())}
    importing = (
        "import importlib, pkgutil, dractl\n"
        "for module in pkgutil.walk_packages(dractl.__path__, 'dractl.'):\n"
        "    if not module.name.endswith('__main__'):\n"
        "        importlib.import_module(module.name)\n"
        "print('imported')\n"
    )
    every = subprocess.run([python, "-W", "error", "-c", importing], env=env, capture_output=True, text=True)
    assert every.returncode == 0 and every.stdout == "imported\n", every.stderr
    version = subprocess.run([python, "-m", "dractl", "--version"], env=env, capture_output=True, text=True)
    assert version.returncode == 0 and version.stdout.strip().startswith("dractl"), version.stderr
    discover = subprocess.run(
        [python, "-m", "dractl", "discover", "--device-source", "fake", "--fake-profile", "t4-x2", "--node-name", "n"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert discover.returncode == 0, discover.stderr
    assert "name: gpu-0" in discover.stdout and "name: gpu-1" in discover.stdout
