"""Per-claim CDI (Container Device Interface) specs, named and shaped as the NVIDIA driver does.

What it does: builds one transient spec per claim (kind `k8s.gpu.nvidia.com/claim`, one
device `<claimUID>-<device>` per prepared device, the lowest `cdiVersion` the content
needs), writes it atomically into the CDI root as `k8s.gpu.nvidia.com-claim_<claimUID>.yaml`,
lists and removes such files, and gets the driver's common edits (library mounts, hooks,
control nodes) from `nvidia-ctk cdi generate` when the agent is told to (`driverfiles` finds
them natively otherwise). What it must not do: decide which devices a claim gets or touch
GPUs; the spec content comes from state.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import re
import shutil
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

import structlog
import yaml

from dractl.node import checkpoint

__all__ = [
    "VENDOR",
    "CLASS",
    "KIND",
    "FILE_PREFIX",
    "ContainerEdits",
    "device_node",
    "mount",
    "device_name",
    "qualified_name",
    "spec_path",
    "device_entries",
    "spec_of",
    "build_spec",
    "minimum_version",
    "write_spec",
    "remove_spec",
    "claim_specs",
    "CommonEdits",
    "NoCommonEdits",
    "NvidiaCtk",
]

VENDOR = "k8s.gpu.nvidia.com"
CLASS = "claim"
KIND = f"{VENDOR}/{CLASS}"
FILE_PREFIX = f"{VENDOR}-{CLASS}_"
_EXTENSION = ".yaml"
_DEVICE_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?\Z")

_log = structlog.get_logger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class ContainerEdits:
    """CDI `containerEdits`, each entry already in the spec's JSON shape."""

    env: tuple[str, ...] = ()
    device_nodes: tuple[Mapping[str, Any], ...] = ()
    mounts: tuple[Mapping[str, Any], ...] = ()
    hooks: tuple[Mapping[str, Any], ...] = ()

    def merged(self, other: ContainerEdits) -> ContainerEdits:
        """Both edits; `other` wins for the same env key, device path or container path."""
        env = {item.split("=", 1)[0]: item for item in (*self.env, *other.env)}
        nodes = {node["path"]: node for node in (*self.device_nodes, *other.device_nodes)}
        mounts = {m["containerPath"]: m for m in (*self.mounts, *other.mounts)}
        return ContainerEdits(
            env=tuple(env.values()),
            device_nodes=tuple(nodes.values()),
            mounts=tuple(mounts.values()),
            hooks=(*self.hooks, *other.hooks),
        )

    def as_json(self) -> dict[str, Any]:
        raw: dict[str, Any] = {}
        if self.env:
            raw["env"] = list(self.env)
        if self.device_nodes:
            raw["deviceNodes"] = [dict(node) for node in self.device_nodes]
        if self.mounts:
            raw["mounts"] = [dict(m) for m in self.mounts]
        if self.hooks:
            raw["hooks"] = [dict(h) for h in self.hooks]
        return raw


def device_node(path: str) -> Mapping[str, Any]:
    """A character device node at the same path in host and container; the runtime fills
    in type, major and minor from the host device."""
    return {"path": path}


def mount(host_path: str, container_path: str, *, options: Sequence[str] = ("rbind", "rw")) -> Mapping[str, Any]:
    return {"hostPath": host_path, "containerPath": container_path, "options": list(options)}


def device_name(claim_uid: str, device: str) -> str:
    """The CDI device name of one prepared device: `<claimUID>-<device>`. Raises ValueError
    when the result breaks CDI's name rules (only possible for a malformed UID or name)."""
    name = f"{claim_uid}-{device}"
    if not _DEVICE_NAME.match(name):
        raise ValueError(f"CDI device name {name!r} must start and end alphanumeric and hold only [A-Za-z0-9_.:-]")
    return name


def qualified_name(claim_uid: str, device: str) -> str:
    """The fully-qualified CDI name the kubelet passes on: `k8s.gpu.nvidia.com/claim=<uid>-<device>`."""
    return f"{KIND}={device_name(claim_uid, device)}"


def spec_path(cdi_root: pathlib.Path, claim_uid: str) -> pathlib.Path:
    """`<cdi-root>/k8s.gpu.nvidia.com-claim_<claimUID>.yaml`, as the NVIDIA driver names it."""
    return cdi_root / f"{FILE_PREFIX}{claim_uid}{_EXTENSION}"


def minimum_version(spec: Mapping[str, Any]) -> str:
    """The lowest `cdiVersion` whose features cover the spec (as `MinimumRequiredVersion`).

    0.5.0 is the floor: claim UIDs make device names start with a digit and mounts carry
    `hostPath`; annotations need 0.6.0, additionalGids and intelRdt 0.7.0, netDevices 1.1.0.
    """
    edits = [spec.get("containerEdits") or {}, *((d.get("containerEdits") or {}) for d in spec.get("devices", ()))]
    if any(e.get("netDevices") for e in edits):
        return "1.1.0"
    if any(e.get("additionalGids") or e.get("intelRdt") for e in edits):
        return "0.7.0"
    if spec.get("annotations") or any(d.get("annotations") for d in spec.get("devices", ())):
        return "0.6.0"
    return "0.5.0"


def device_entries(*, claim_uid: str, devices: Sequence[tuple[str, ContainerEdits]]) -> tuple[dict[str, Any], ...]:
    """The spec's `devices` entries: `devices` are `(device name in the slice, its edits)` in
    result order. Pure; the checkpoint records them, so a removed spec can be written again."""
    return tuple({"name": device_name(claim_uid, name), "containerEdits": edits.as_json()} for name, edits in devices)


def spec_of(entries: Sequence[Mapping[str, Any]], *, common: ContainerEdits) -> dict[str, Any]:
    """The claim's spec from its device entries; `common` edits apply whenever any device of
    the claim is used. Pure."""
    spec: dict[str, Any] = {"cdiVersion": "", "kind": KIND, "devices": [dict(entry) for entry in entries]}
    common_json = common.as_json()
    if common_json:
        spec["containerEdits"] = common_json
    spec["cdiVersion"] = minimum_version(spec)
    return spec


def build_spec(
    *, claim_uid: str, devices: Sequence[tuple[str, ContainerEdits]], common: ContainerEdits
) -> dict[str, Any]:
    """`spec_of(device_entries(...))`: the claim's spec from `(device name, edits)` pairs. Pure."""
    return spec_of(device_entries(claim_uid=claim_uid, devices=devices), common=common)


def write_spec(cdi_root: pathlib.Path, claim_uid: str, spec: Mapping[str, Any]) -> pathlib.Path:
    """Write the claim's spec atomically (temp `.<name>.*.tmp`, which runtimes ignore, then
    rename) and return its path. Idempotent: rewriting the same content is harmless."""
    path = spec_path(cdi_root, claim_uid)
    text = yaml.dump(dict(spec), Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper), sort_keys=False)
    # No fsync: the runtime needs only the atomic rename. After a process crash the page
    # cache still holds the file; after a power loss the boot id changes, the checkpoint is
    # discarded and the sweep removes the file, so flushing it would buy nothing.
    checkpoint.write_atomically(path, text.encode(), fsync=False)
    return path


def remove_spec(path: pathlib.Path) -> None:
    """Delete a spec file; a missing file is fine (idempotent)."""
    path.unlink(missing_ok=True)


def claim_specs(cdi_root: pathlib.Path) -> dict[str, pathlib.Path]:
    """Our per-claim spec files in the CDI root, by claim UID (other vendors' files ignored)."""
    if not cdi_root.is_dir():
        return {}
    found = {}
    for path in sorted(cdi_root.glob(f"{FILE_PREFIX}*{_EXTENSION}")):
        found[path.name[len(FILE_PREFIX) : -len(_EXTENSION)]] = path
    return found


class CommonEdits(Protocol):
    """Where the edits every claim spec shares (driver libraries, hooks, control nodes) come from."""

    def common_edits(self) -> ContainerEdits: ...


class NoCommonEdits:
    """No common edits: a spec of the claim's own edits alone (tests of what those hold)."""

    def common_edits(self) -> ContainerEdits:
        return ContainerEdits()


Runner = Callable[[Sequence[str]], str]


def _run(argv: Sequence[str]) -> str:
    completed = subprocess.run(list(argv), capture_output=True, text=True, timeout=60, check=True)
    return completed.stdout


def _edits_from_json(raw: Mapping[str, Any]) -> ContainerEdits:
    return ContainerEdits(
        env=tuple(str(item) for item in raw.get("env") or ()),
        device_nodes=tuple(raw.get("deviceNodes") or ()),
        mounts=tuple(raw.get("mounts") or ()),
        hooks=tuple(raw.get("hooks") or ()),
    )


class NvidiaCtk:
    """Common edits from `nvidia-ctk cdi generate --format=json` (the spec-level
    `containerEdits` of its output), cached after the first success.

    When the tool is not on PATH the edits are empty and one log line says so. When it is
    there but fails, `common_edits` raises OSError: a spec without the driver's mounts and
    hooks would give the container a GPU it cannot use, so the prepare fails (and rolls
    back) and the kubelet's retry runs the tool again. `runner` and `which` are injectable.
    """

    def __init__(
        self,
        *,
        executable: str = "nvidia-ctk",
        extra_args: Iterable[str] = (),
        runner: Runner = _run,
        which: Callable[[str], str | None] = shutil.which,
    ) -> None:
        self._executable = executable
        self._extra_args = tuple(extra_args)
        self._runner = runner
        self._which = which
        self._cached: ContainerEdits | None = None
        self._said_absent = False

    def common_edits(self) -> ContainerEdits:
        if self._cached is not None:
            return self._cached
        path = self._which(self._executable)
        if path is None:
            if not self._said_absent:
                _log.info(
                    "nvidia-ctk not on PATH: CDI specs carry no driver library mounts or hooks",
                    executable=self._executable,
                )
                self._said_absent = True
            return ContainerEdits()
        try:
            output = self._runner([path, "cdi", "generate", "--format=json", *self._extra_args])
            generated = json.loads(output)
            edits = _edits_from_json(generated.get("containerEdits") or {})
        except (OSError, subprocess.SubprocessError, ValueError, AttributeError, TypeError) as err:
            raise OSError(f"{path} cdi generate failed, so the CDI spec would lack the driver's files: {err}") from err
        self._cached = edits
        return edits
