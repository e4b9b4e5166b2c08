"""CDI specification rules, written from the CDI SPEC (research/kubelet-plugin.md section 4), reusable by tests.

`problems(spec)` lists every rule a parsed spec breaks (empty when valid); `check_file(path)`
loads a spec file, asserts it is valid and returns it. The rules: file extension; top-level
and containerEdits keys (loading is strict); `cdiVersion` a known version at least the
minimum the features need; `kind` = `vendor/class` with CDI's charset; device names; the
shapes of env, deviceNodes, mounts and hooks.
"""

from __future__ import annotations

import json
import pathlib
import re
from collections.abc import Mapping
from typing import Any

import yaml

VERSIONS = ("0.1.0", "0.2.0", "0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0")
_TOP_KEYS = {"cdiVersion", "kind", "annotations", "devices", "containerEdits"}
_DEVICE_KEYS = {"name", "annotations", "containerEdits"}
_EDIT_KEYS = {"env", "deviceNodes", "hooks", "mounts", "intelRdt", "additionalGids", "netDevices"}
_NODE_KEYS = {"path", "hostPath", "type", "major", "minor", "fileMode", "permissions", "uid", "gid"}
_MOUNT_KEYS = {"hostPath", "containerPath", "options", "type"}
_HOOK_KEYS = {"hookName", "path", "args", "env", "timeout"}
_HOOK_NAMES = {"prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop"}
_VENDOR = re.compile(r"^[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")
_CLASS = _VENDOR
_DEVICE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")
_ENV = re.compile(r"^[^=]+=.*$", re.DOTALL)


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def _edits_problems(edits: object, where: str) -> tuple[list[str], bool, bool]:
    """Problems of one containerEdits, and whether it uses hostPath / 0.7.0+ fields."""
    out: list[str] = []
    host_path = newer = False
    if not isinstance(edits, Mapping):
        return [f"{where}: containerEdits must be an object"], False, False
    for key in edits:
        if key not in _EDIT_KEYS:
            out.append(f"{where}: unknown containerEdits field {key!r}")
    for item in edits.get("env") or ():
        if not isinstance(item, str) or not _ENV.match(item):
            out.append(f"{where}: env entry {item!r} is not KEY=VALUE")
    for node in edits.get("deviceNodes") or ():
        if not isinstance(node, Mapping):
            out.append(f"{where}: deviceNode {node!r} is not an object")
            continue
        out.extend(f"{where}: unknown deviceNode field {k!r}" for k in node if k not in _NODE_KEYS)
        path = node.get("path")
        if not isinstance(path, str) or not path.startswith("/"):
            out.append(f"{where}: deviceNode path {path!r} must be an absolute path")
        if "type" in node and node["type"] not in ("b", "c", "u", "p"):
            out.append(f"{where}: deviceNode type {node['type']!r} must be b, c, u or p")
        if "permissions" in node and not set(str(node["permissions"])) <= set("rwm"):
            out.append(f"{where}: deviceNode permissions {node['permissions']!r} must be a subset of rwm")
        host_path = host_path or "hostPath" in node
    for m in edits.get("mounts") or ():
        if not isinstance(m, Mapping):
            out.append(f"{where}: mount {m!r} is not an object")
            continue
        out.extend(f"{where}: unknown mount field {k!r}" for k in m if k not in _MOUNT_KEYS)
        if not m.get("hostPath") or not m.get("containerPath"):
            out.append(f"{where}: mount {m!r} needs hostPath and containerPath")
        if not isinstance(m.get("options", []), list) or not all(isinstance(o, str) for o in m.get("options", [])):
            out.append(f"{where}: mount options must be a list of strings")
    for hook in edits.get("hooks") or ():
        if not isinstance(hook, Mapping):
            out.append(f"{where}: hook {hook!r} is not an object")
            continue
        out.extend(f"{where}: unknown hook field {k!r}" for k in hook if k not in _HOOK_KEYS)
        if hook.get("hookName") not in _HOOK_NAMES:
            out.append(f"{where}: hookName {hook.get('hookName')!r} is not one of {sorted(_HOOK_NAMES)}")
        if not str(hook.get("path", "")).startswith("/"):
            out.append(f"{where}: hook path {hook.get('path')!r} must be absolute")
        for item in hook.get("env") or ():
            if not isinstance(item, str) or not _ENV.match(item):
                out.append(f"{where}: hook env entry {item!r} is not KEY=VALUE")
    newer = bool(edits.get("additionalGids") or edits.get("intelRdt"))
    return out, host_path, newer


def problems(spec: object) -> list[str]:
    """Every CDI rule the parsed spec breaks; empty when it is valid."""
    if not isinstance(spec, Mapping):
        return ["spec must be an object"]
    out = [f"unknown top-level field {k!r}" for k in spec if k not in _TOP_KEYS]
    version = spec.get("cdiVersion")
    if version not in VERSIONS:
        out.append(f"cdiVersion {version!r} is not one of {VERSIONS}")
        version = VERSIONS[-1]
    kind = spec.get("kind")
    vendor, _, klass = str(kind).partition("/")
    if not isinstance(kind, str) or not _VENDOR.match(vendor) or not _CLASS.match(klass):
        out.append(f"kind {kind!r} must be vendor/class (letters, digits, _ . -; starting with a letter)")
    needed = "0.3.0"
    if "." in klass or spec.get("annotations"):
        needed = "0.6.0"
    devices = spec.get("devices")
    if not isinstance(devices, list) or not devices:
        out.append("devices must be a non-empty list")
        devices = []
    names: set[str] = set()
    edit_sets: list[tuple[str, Any]] = [("spec", spec["containerEdits"])] if "containerEdits" in spec else []
    for n, device in enumerate(devices):
        where = f"devices[{n}]"
        if not isinstance(device, Mapping):
            out.append(f"{where}: must be an object")
            continue
        out.extend(f"{where}: unknown device field {k!r}" for k in device if k not in _DEVICE_KEYS)
        name = device.get("name")
        if not isinstance(name, str) or not _DEVICE.match(name):
            out.append(f"{where}: name {name!r} must start and end alphanumeric with only [A-Za-z0-9_.:-] inside")
        elif name in names:
            out.append(f"{where}: duplicate device name {name!r}")
        else:
            names.add(name)
            if name[0].isdigit() and _version_key(needed) < (0, 5, 0):
                needed = "0.5.0"
        if device.get("annotations") and _version_key(needed) < (0, 6, 0):
            needed = "0.6.0"
        edits = device.get("containerEdits")
        if not edits:
            out.append(f"{where}: a device needs non-empty containerEdits")
        else:
            edit_sets.append((where, edits))
    for where, edits in edit_sets:
        found, host_path, newer = _edits_problems(edits, where)
        out.extend(found)
        if host_path and _version_key(needed) < (0, 5, 0):
            needed = "0.5.0"
        if newer and _version_key(needed) < (0, 7, 0):
            needed = "0.7.0"
        if isinstance(edits, Mapping) and edits.get("netDevices"):
            needed = "1.1.0"
    if _version_key(str(version)) < _version_key(needed):
        out.append(f"cdiVersion {version} is below {needed}, the minimum its content needs")
    return out


def load(path: pathlib.Path) -> Any:
    if path.suffix == ".json":
        return json.loads(path.read_text())
    if path.suffix == ".yaml":
        return yaml.safe_load(path.read_text())
    raise AssertionError(f"{path}: a CDI spec file must end in .json or .yaml")


def check_file(path: pathlib.Path) -> Any:
    """Load a CDI spec file, assert it follows every rule, and return it."""
    spec = load(path)
    found = problems(spec)
    assert found == [], f"{path} breaks the CDI spec: {found}"
    return spec
