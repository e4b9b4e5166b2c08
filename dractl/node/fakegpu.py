"""A deterministic fake of NVML: the GPUs of a node described by a profile, in memory.

What it does: `FakeGpus` implements `backend.NvmlBackend` over a `Profile` (built-in ones in
`profiles/*.yaml`, or a custom YAML file in the same format) with NVML's rules for MIG:
GPU-instance profiles with NVML's valid placements, creation only at an allowed placement
that overlaps no existing GPU instance, NVML's return codes for every refusal, MIG devices
with UUIDs, XID and GPU-lost events, and fault injection (`fail`, `mark_lost`, `hold`) for tests.
A MIG mode change follows NVML's activation rules: Ampere (A100, A30) needs a GPU reset for it,
which NVML refuses with IN_USE while another client holds the GPU (`hold`: DCGM, nvsm, a CUDA
process) or GPU instances exist; Hopper and later change the mode without a reset, and any
GPU refuses to turn MIG off while GPU instances exist.
A profile file may list `faults:` that are injected from the start through the same `fail`,
so a separate process (a node agent under test) can be made to fail or hang at one exact
NVML call: `{operation: create_compute_instance, action: hang}` blocks that call (with the
fake's lock released) until the fake is closed or the process dies, which leaves the GPU
instance made just before it for a crash test to find.
UUIDs are stable per node name and minor (UUIDv5), so the same profile on the same node
always yields the same devices. With `state_file` the mutable state (MIG mode, GPU and
compute instances, compute mode, time-slice) is written to JSON after every change and read
back on construction, so a restarted node agent sees the MIG devices it made before.

What it must not do: touch real hardware or `pynvml`, or know about Kubernetes.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import json
import os
import pathlib
import re
import stat
import threading
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from dractl.model import decode, quantity
from dractl.node import backend, driverfiles

__all__ = [
    "PROFILES_DIR",
    "MAX_MEMORY_SLICES",
    "ProfileError",
    "StateFileError",
    "FaultAction",
    "FaultSpec",
    "MigProfileSpec",
    "GpuModel",
    "GpuSpec",
    "Profile",
    "builtin_profiles",
    "load_profile",
    "parse_profile",
    "gpu_uuid",
    "FakeGpus",
    "write_driver_root",
]

PROFILES_DIR = pathlib.Path(__file__).resolve().parent / "profiles"
_MODELS_FILE = PROFILES_DIR / "models.yaml"

# A fixed namespace for every fake UUID: uuid5(NAMESPACE_DNS, "fakegpu.dractl.dev").
_UUID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_DNS, "fakegpu.dractl.dev")

_MIB = 2**20
# The memory slices of a MIG-capable GPU: 8 on every one so far (A100, H100, H200, B200). Placements in a profile file
# are bounded by it: each slice a placement covers becomes a counter, a name and a loop iteration downstream.
MAX_MEMORY_SLICES = 8
_STATE_VERSION = 1


class ProfileError(ValueError):
    """A fake profile that cannot be used; `str()` names the file and the field."""


class StateFileError(ValueError):
    """A fake state file that cannot be read back; `str()` names the file and the problem."""


@dataclasses.dataclass(frozen=True, slots=True)
class GpuModel:
    """A GPU product: what NVML reports for every GPU of this model."""

    key: str
    product_name: str
    brand: str
    architecture: str
    cuda_compute_capability: tuple[int, int]
    memory_bytes: int
    multiprocessors: int
    engines: backend.Engines
    mig_profiles: tuple[backend.GpuInstanceProfile, ...] = ()


MigProfileSpec = tuple[str, int]  # (profile name, placement start) of a MIG device to pre-create


@dataclasses.dataclass(frozen=True, slots=True)
class GpuSpec:
    """One GPU of a profile, as the profile file describes it (before any change)."""

    model: GpuModel
    minor: int
    pci_bus_id: str
    pcie_root: str | None = None
    numa_node: int | None = None
    mig_mode: backend.MigMode = backend.MigMode.DISABLED
    mig_devices: tuple[MigProfileSpec, ...] = ()
    fabric: backend.FabricInfo | None = None


class FaultAction(enum.Enum):
    """What an injected fault does to the call it hits."""

    FAIL = "fail"  # raise NvmlError(code) at once
    HANG = "hang"  # block until the fake is closed (or the process dies)


@dataclasses.dataclass(frozen=True, slots=True)
class FaultSpec:
    """A fault a profile file injects from the start: the arguments of one `FakeGpus.fail` call."""

    operation: str
    action: FaultAction = FaultAction.FAIL
    code: int = backend.Return.UNKNOWN
    minor: int | None = None
    times: int = 1


@dataclasses.dataclass(frozen=True, slots=True)
class Profile:
    name: str
    driver_version: str
    cuda_driver_version: str
    gpus: tuple[GpuSpec, ...]
    faults: tuple[FaultSpec, ...] = ()


# --- Profiles ---------------------------------------------------------------------------------


def builtin_profiles() -> tuple[str, ...]:
    """Names of the built-in profiles, sorted. Pure (reads the package's data directory)."""
    return tuple(sorted(p.stem for p in PROFILES_DIR.glob("*.yaml") if p.name != _MODELS_FILE.name))


def load_profile(name_or_file: str) -> Profile:
    """A built-in profile by name, or a profile file by path. Raises `ProfileError`."""
    if name_or_file in builtin_profiles():
        path = PROFILES_DIR / f"{name_or_file}.yaml"
        return parse_profile(_read_yaml(path, label=f"fake profile {name_or_file}"), name=name_or_file, file=str(path))
    path = pathlib.Path(name_or_file)
    if not path.is_file():
        known = ", ".join(builtin_profiles())
        raise ProfileError(f"fake profile {name_or_file!r}: neither a built-in profile ({known}) nor a readable file")
    return parse_profile(_read_yaml(path, label=str(path)), name=path.stem, file=str(path))


def _read_yaml(path: pathlib.Path, *, label: str) -> object:
    """The profile document, read as every YAML file dractl reads is (bounded: nesting, aliases, size, digits; an
    unknown tag or a bad date is text, which the field checks then refuse by name)."""
    try:
        return decode.load_config(path)
    except decode.ConfigError as error:
        raise ProfileError(f"{label}: {error}") from None


def _builtin_models() -> dict[str, GpuModel]:
    raw = _read_yaml(_MODELS_FILE, label=str(_MODELS_FILE))
    p = _Parser(str(_MODELS_FILE))
    top = p.mapping(raw, "")
    return p.models(top.get("models"), "models")


def parse_profile(raw: object, *, name: str, file: str = "<profile>") -> Profile:
    """Validate a decoded profile document. Raises `ProfileError` naming `file` and the field.

    Format (keys in camelCase, as in the built-in files):
    `driverVersion` (required, "580.126.20"), `cudaDriverVersion` (required, "13.0"),
    `models` (optional: more GPU models, keyed by name, beside the built-in ones), and
    `gpus` (required, non-empty list) of `{model, pciBusID, pcieRoot?, numaNode?, minor?,
    migMode? (enabled|disabled), migDevices? [{profile, start}], fabric? {clusterUUID?,
    cliqueID?, moduleID?, partitions? {<GPU count>: <partition id>}}}`, and `faults`
    (optional list, for tests) of `{operation, action? (fail|hang, default fail), code? (an
    NVML return code name such as INSUFFICIENT_RESOURCES, required for fail, refused for
    hang), minor? (only the GPU with that minor; not for driver_info, gpus, wait_events),
    times? (how many calls it hits, default 1)}`, each applied as one `FakeGpus.fail` call.
    """
    p = _Parser(file)
    top = p.mapping(raw, "")
    p.keys(top, "", {"driverVersion", "cudaDriverVersion", "models", "gpus", "faults"})
    driver = p.string(top, "driverVersion", "", required=True, pattern=_VERSION, example="580.126.20")
    cuda = p.string(top, "cudaDriverVersion", "", required=True, pattern=_MAJOR_MINOR, example='"13.0"')
    models = _builtin_models()
    if top.get("models") is not None:
        models.update(p.models(top["models"], "models"))
    items = p.list(top.get("gpus"), "gpus", required=True)
    if not items:
        raise ProfileError(f"{file}: gpus: must list at least one GPU")
    gpus = [p.gpu(item, f"gpus[{i}]", index=i, models=models) for i, item in enumerate(items)]
    seen: dict[object, str] = {}
    for i, gpu in enumerate(gpus):
        for what, value in (("minor", gpu.minor), ("pciBusID", gpu.pci_bus_id)):
            if (what, value) in seen:
                raise ProfileError(f"{file}: gpus[{i}].{what}: {value} repeats {seen[(what, value)]}")
            seen[(what, value)] = f"gpus[{i}]"
    faults = p.faults(top.get("faults"), "faults", minors={gpu.minor for gpu in gpus})
    return Profile(name=name, driver_version=driver, cuda_driver_version=cuda, gpus=tuple(gpus), faults=faults)


_VERSION = re.compile(r"^\d+\.\d+(\.\d+)?\Z")
_MAJOR_MINOR = re.compile(r"^\d+\.\d+\Z")
_BUS_ID = re.compile(r"^([0-9a-f]{4,8}):([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])\Z")
_PCIE_ROOT = re.compile(r"^pci[0-9a-f]{4}:[0-9a-f]{2}\Z")
_PROFILE_NAME = re.compile(r"^\d+g\.\d+gb(\+[a-z.]+)?\Z")
_ENGINE_KEYS = {
    "copyEngines": "copy_engines",
    "decoders": "decoders",
    "encoders": "encoders",
    "jpegEngines": "jpeg_engines",
    "ofaEngines": "ofa_engines",
}


class _Parser:
    """Field-by-field validation of profile documents; every error names file and field."""

    def __init__(self, file: str) -> None:
        self.file = file

    def fail(self, path: str, problem: str) -> ProfileError:
        return ProfileError(f"{self.file}: {path or '(top level)'}: {problem}")

    def mapping(self, raw: object, path: str) -> dict[str, Any]:
        if not isinstance(raw, dict):
            raise self.fail(path, f"must be a mapping, got {_kind(raw)}")
        return {str(k): v for k, v in raw.items()}

    def keys(self, m: Mapping[str, Any], path: str, allowed: set[str]) -> None:
        for key in m:
            if key not in allowed:
                raise self.fail(_join(path, key), f"unknown field (allowed: {', '.join(sorted(allowed))})")

    def list(self, raw: object, path: str, *, required: bool = False) -> list[Any]:
        if raw is None and not required:
            return []
        if not isinstance(raw, list):
            raise self.fail(path, f"must be a list, got {_kind(raw)}")
        return raw

    def string(
        self,
        m: Mapping[str, Any],
        key: str,
        path: str,
        *,
        required: bool = False,
        pattern: re.Pattern[str] | None = None,
        example: str = "",
    ) -> str:
        value = m.get(key)
        where = _join(path, key)
        if value is None:
            if required:
                raise self.fail(where, f"required{f' (e.g. {example})' if example else ''}")
            return ""
        if not isinstance(value, str) or not value:
            raise self.fail(
                where, f"must be a non-empty string, got {_kind(value)}{f' (quote it: {example})' if example else ''}"
            )
        if pattern is not None and not pattern.match(value):
            raise self.fail(where, f"{value!r} is not valid{f' (expected e.g. {example})' if example else ''}")
        return value

    def integer(
        self,
        m: Mapping[str, Any],
        key: str,
        path: str,
        *,
        required: bool = False,
        minimum: int = 0,
        maximum: int | None = None,
    ) -> int | None:
        value = m.get(key)
        where = _join(path, key)
        if value is None:
            if required:
                raise self.fail(where, "required")
            return None
        if not isinstance(value, int) or isinstance(value, bool):
            raise self.fail(where, f"must be an integer, got {_kind(value)}")
        if value < minimum:
            raise self.fail(where, f"must be >= {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise self.fail(where, f"must be <= {maximum}, got {value}")
        return value

    def bytes_(self, m: Mapping[str, Any], key: str, path: str) -> int:
        where = _join(path, key)
        if m.get(key) is None:
            raise self.fail(where, "required (a quantity such as 81920Mi)")
        try:
            q = quantity.parse(m[key])
        except quantity.QuantityError as error:
            raise self.fail(where, str(error)) from None
        if q.value <= 0 or q.value.denominator != 1:
            raise self.fail(where, f"must be a positive whole number of bytes, got {q}")
        return int(q.value)

    def engines(self, raw: object, path: str) -> backend.Engines:
        if raw is None:
            return backend.Engines()
        m = self.mapping(raw, path)
        self.keys(m, path, set(_ENGINE_KEYS))
        return backend.Engines(**{_ENGINE_KEYS[k]: self.integer(m, k, path) or 0 for k in m})

    def models(self, raw: object, path: str) -> dict[str, GpuModel]:
        m = self.mapping(raw, path)
        return {key: self.model(value, _join(path, key), key=key) for key, value in m.items()}

    def model(self, raw: object, path: str, *, key: str) -> GpuModel:
        m = self.mapping(raw, path)
        self.keys(
            m,
            path,
            {
                "productName",
                "brand",
                "architecture",
                "cudaComputeCapability",
                "memory",
                "multiprocessors",
                "engines",
                "migProfiles",
            },
        )
        cc = self.string(m, "cudaComputeCapability", path, required=True, pattern=_MAJOR_MINOR, example='"8.0"')
        major, minor = (int(part) for part in cc.split("."))
        memory = self.bytes_(m, "memory", path)
        profiles = [
            self.mig_profile(item, f"{path}.migProfiles[{i}]", memory=memory)
            for i, item in enumerate(self.list(m.get("migProfiles"), f"{path}.migProfiles"))
        ]
        ids = [p.id for p in profiles]
        names = [p.name for p in profiles]
        for i, profile in enumerate(profiles):
            if ids.count(profile.id) > 1 or names.count(profile.name) > 1:
                raise self.fail(f"{path}.migProfiles[{i}]", f"profile id {profile.id} / name {profile.name} repeats")
        return GpuModel(
            key=key,
            product_name=self.string(m, "productName", path, required=True, example="NVIDIA A100-SXM4-80GB"),
            brand=self.string(m, "brand", path) or "Nvidia",
            architecture=self.string(m, "architecture", path, required=True, example="Ampere"),
            cuda_compute_capability=(major, minor),
            memory_bytes=memory,
            multiprocessors=self.integer(m, "multiprocessors", path, required=True, minimum=1) or 0,
            engines=self.engines(m.get("engines"), f"{path}.engines"),
            mig_profiles=tuple(sorted(profiles, key=lambda p: (p.slice_count, p.memory_bytes, p.id))),
        )

    def mig_profile(self, raw: object, path: str, *, memory: int) -> backend.GpuInstanceProfile:
        m = self.mapping(raw, path)
        self.keys(
            m,
            path,
            {
                "id",
                "name",
                "slices",
                "instances",
                "memory",
                "multiprocessors",
                "engines",
                "placementSize",
                "placements",
            },
        )
        size = self.integer(m, "placementSize", path, required=True, minimum=1, maximum=MAX_MEMORY_SLICES) or 1
        starts = self.list(m.get("placements"), f"{path}.placements", required=True)
        if not starts:
            raise self.fail(f"{path}.placements", "must list at least one placement start")
        placements = []
        for i, start in enumerate(starts):
            if not isinstance(start, int) or isinstance(start, bool) or start < 0:
                raise self.fail(f"{path}.placements[{i}]", f"must be a slice index >= 0, got {_kind(start)} {start!r}")
            if start % size:
                raise self.fail(f"{path}.placements[{i}]", f"start {start} is not a multiple of placementSize {size}")
            if start + size > MAX_MEMORY_SLICES:
                raise self.fail(
                    f"{path}.placements[{i}]",
                    f"start {start} + placementSize {size} passes the GPU's {MAX_MEMORY_SLICES} memory slices",
                )
            placements.append(backend.Placement(start=start, size=size))
        if len(set(placements)) != len(placements):
            raise self.fail(f"{path}.placements", "placement starts repeat")
        profile_memory = self.bytes_(m, "memory", path)
        if profile_memory > memory:
            raise self.fail(f"{path}.memory", "must not exceed the GPU's memory")
        return backend.GpuInstanceProfile(
            id=self.integer(m, "id", path, required=True) or 0,
            name=self.string(m, "name", path, required=True, pattern=_PROFILE_NAME, example="1g.10gb"),
            slice_count=self.integer(m, "slices", path, required=True, minimum=1) or 1,
            instance_count=self.integer(m, "instances", path, minimum=1) or len(placements),
            memory_bytes=profile_memory,
            multiprocessors=self.integer(m, "multiprocessors", path, required=True, minimum=1) or 1,
            engines=self.engines(m.get("engines"), f"{path}.engines"),
            placements=tuple(sorted(placements)),
        )

    def gpu(self, raw: object, path: str, *, index: int, models: Mapping[str, GpuModel]) -> GpuSpec:
        m = self.mapping(raw, path)
        self.keys(m, path, {"model", "minor", "pciBusID", "pcieRoot", "numaNode", "migMode", "migDevices", "fabric"})
        key = self.string(m, "model", path, required=True, example="a100-sxm4-80gb")
        if key not in models:
            raise self.fail(
                f"{path}.model", f"unknown model {key!r} (known: {', '.join(sorted(models))}; add it under models:)"
            )
        model = models[key]
        bus = self.string(m, "pciBusID", path, required=True, example='"0000:07:00.0"').lower()
        match = _BUS_ID.match(bus)
        if match is None:
            raise self.fail(f"{path}.pciBusID", f'{bus!r} is not a PCI address (expected e.g. "0000:07:00.0")')
        root = self.string(m, "pcieRoot", path, pattern=_PCIE_ROOT, example="pci0000:00") or None
        mode_text = m.get("migMode", "disabled")
        if mode_text not in ("enabled", "disabled"):
            raise self.fail(f"{path}.migMode", f"must be enabled or disabled, got {mode_text!r}")
        mode = backend.MigMode.ENABLED if mode_text == "enabled" else backend.MigMode.DISABLED
        if mode is backend.MigMode.ENABLED and not model.mig_profiles:
            raise self.fail(f"{path}.migMode", f"model {key} has no migProfiles: it cannot enable MIG")
        devices = self.mig_devices(m.get("migDevices"), f"{path}.migDevices", model=model)
        if devices and mode is not backend.MigMode.ENABLED:
            raise self.fail(f"{path}.migDevices", "MIG devices need migMode: enabled")
        minor = self.integer(m, "minor", path)
        return GpuSpec(
            model=model,
            minor=index if minor is None else minor,
            pci_bus_id=f"{int(match.group(1), 16):04x}:{match.group(2)}:{match.group(3)}.{match.group(4)}",
            pcie_root=root,
            numa_node=self.integer(m, "numaNode", path),
            mig_mode=mode,
            mig_devices=devices,
            fabric=self.fabric(m.get("fabric"), f"{path}.fabric"),
        )

    def mig_devices(self, raw: object, path: str, *, model: GpuModel) -> tuple[MigProfileSpec, ...]:
        by_name = {p.name: p for p in model.mig_profiles}
        taken: dict[int, str] = {}
        result = []
        for i, item in enumerate(self.list(raw, path)):
            ipath = f"{path}[{i}]"
            m = self.mapping(item, ipath)
            self.keys(m, ipath, {"profile", "start"})
            name = self.string(m, "profile", ipath, required=True, example="3g.40gb")
            if name not in by_name:
                raise self.fail(
                    f"{ipath}.profile", f"{model.key} has no MIG profile {name!r} (known: {', '.join(by_name)})"
                )
            start = self.integer(m, "start", ipath, required=True)
            placement = next((p for p in by_name[name].placements if p.start == start), None)
            if placement is None:
                starts = ", ".join(str(p.start) for p in by_name[name].placements)
                raise self.fail(f"{ipath}.start", f"{name} cannot start at slice {start} (valid starts: {starts})")
            for s in placement.slices:
                if s in taken:
                    raise self.fail(ipath, f"{name} at {start} overlaps {taken[s]} (memory slice {s})")
            for s in placement.slices:
                taken[s] = f"{path}[{i}]"
            result.append((name, placement.start))
        return tuple(result)

    def fabric(self, raw: object, path: str) -> backend.FabricInfo | None:
        if raw is None:
            return None
        m = self.mapping(raw, path)
        self.keys(m, path, {"clusterUUID", "cliqueID", "moduleID", "partitions"})
        partitions = []
        if m.get("partitions") is not None:
            for count, pid in self.mapping(m["partitions"], f"{path}.partitions").items():
                where = f"{path}.partitions[{count}]"
                if not count.isdigit() or int(count) < 1:
                    raise self.fail(where, "keys are GPU counts (1, 2, 4, 8)")
                if not isinstance(pid, int) or isinstance(pid, bool) or pid < 0:
                    raise self.fail(where, f"must be a partition id >= 0, got {_kind(pid)}")
                partitions.append((int(count), pid))
        return backend.FabricInfo(
            cluster_uuid=self.string(m, "clusterUUID", path),
            clique_id=self.integer(m, "cliqueID", path) or 0,
            module_id=self.integer(m, "moduleID", path, minimum=1),
            partitions=tuple(sorted(partitions, reverse=True)),
        )

    def faults(self, raw: object, path: str, *, minors: set[int]) -> tuple[FaultSpec, ...]:
        result = []
        for i, item in enumerate(self.list(raw, path)):
            ipath = f"{path}[{i}]"
            m = self.mapping(item, ipath)
            self.keys(m, ipath, {"operation", "action", "code", "minor", "times"})
            operation = self.string(m, "operation", ipath, required=True, example="create_compute_instance")
            if operation not in OPERATIONS:
                raise self.fail(
                    f"{ipath}.operation", f"unknown operation {operation!r} (known: {', '.join(sorted(OPERATIONS))})"
                )
            action_text = self.string(m, "action", ipath) or FaultAction.FAIL.value
            if action_text not in {a.value for a in FaultAction}:
                raise self.fail(f"{ipath}.action", f"must be fail or hang, got {action_text!r}")
            action = FaultAction(action_text)
            code: int = backend.Return.UNKNOWN
            if action is FaultAction.HANG:
                if m.get("code") is not None:
                    raise self.fail(f"{ipath}.code", "only for action: fail (a hung call returns no code)")
            else:
                name = self.string(m, "code", ipath, required=True, example="INSUFFICIENT_RESOURCES")
                if name not in backend.Return.__members__ or name == backend.Return.SUCCESS.name:
                    raise self.fail(
                        f"{ipath}.code", f"{name!r} is not an NVML error code name (e.g. INSUFFICIENT_RESOURCES)"
                    )
                code = backend.Return[name]
            minor = self.integer(m, "minor", ipath)
            if minor is not None and operation in _NO_MINOR_OPERATIONS:
                raise self.fail(
                    f"{ipath}.minor", f"{operation} is not called on one GPU, so the fault would never fire"
                )
            if minor is not None and minor not in minors:
                known = ", ".join(str(n) for n in sorted(minors))
                raise self.fail(f"{ipath}.minor", f"no GPU in this profile has minor {minor} (minors: {known})")
            times = self.integer(m, "times", ipath, minimum=1)
            result.append(
                FaultSpec(
                    operation=operation, action=action, code=code, minor=minor, times=1 if times is None else times
                )
            )
        return tuple(result)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _kind(value: object) -> str:
    if value is None:
        return "nothing"
    return {
        dict: "a mapping",
        list: "a list",
        str: "a string",
        bool: "a boolean",
        int: "an integer",
        float: "a number",
    }.get(type(value), type(value).__name__)


def gpu_uuid(node_name: str, minor: int) -> str:
    """The fake GPU UUID of `minor` on `node_name`: `GPU-` + UUIDv5. Pure and stable."""
    return f"GPU-{uuid.uuid5(_UUID_NAMESPACE, f'{node_name}/gpu/{minor}')}"


# --- The fake backend ---------------------------------------------------------------------------


@dataclasses.dataclass(slots=True)
class _Gi:
    profile: backend.GpuInstanceProfile
    placement: backend.Placement
    cis: list[int] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(slots=True)
class _Gpu:
    spec: GpuSpec
    uuid: str
    index: int
    mig_mode: backend.MigMode
    gis: dict[int, _Gi] = dataclasses.field(default_factory=dict)
    compute_mode: backend.ComputeMode = backend.ComputeMode.DEFAULT
    time_slice: backend.TimeSlice = backend.TimeSlice.DEFAULT
    lost: bool = False
    recovery: backend.RecoveryAction = backend.RecoveryAction.NONE
    holders: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(slots=True)
class _Fault:
    code: int
    minor: int | None
    times: int
    action: FaultAction = FaultAction.FAIL


# The operations `fail` can target: every NvmlBackend method.
OPERATIONS = frozenset(
    {
        "driver_info",
        "gpus",
        "gpu_instance_profiles",
        "gpu_instances",
        "compute_instances",
        "mig_devices",
        "set_mig_mode",
        "create_gpu_instance",
        "create_compute_instance",
        "destroy_compute_instance",
        "destroy_gpu_instance",
        "compute_mode",
        "set_compute_mode",
        "set_time_slice",
        "recovery_action",
        "wait_events",
    }
)
# The operations not called on one GPU: a fault on them cannot be limited to a minor.
_NO_MINOR_OPERATIONS = frozenset({"driver_info", "gpus", "wait_events"})
# Architectures whose MIG mode only changes through a GPU reset (NVIDIA's MIG user guide: "Setting
# MIG mode on the A100/A30 requires a GPU reset"); Hopper and later toggle it in place.
_MIG_MODE_NEEDS_RESET = frozenset({"Ampere"})


class FakeGpus:
    """`backend.NvmlBackend` over a `Profile`, with NVML's rules and return codes.

    Thread-safe (one lock), so a health thread may wait for events while another thread
    creates MIG devices. Deterministic: the same profile, node name and sequence of calls
    give the same GI/CI ids and UUIDs. GI ids are the lowest free id from 1, CI ids the
    lowest free from 0 within their GI; the single compute instance of a GI spans it all.
    """

    def __init__(self, profile: Profile, *, node_name: str, state_file: pathlib.Path | None = None) -> None:
        self.profile = profile
        self.node_name = node_name
        self.state_file = state_file
        self._lock = threading.RLock()
        self._events_ready = threading.Condition(self._lock)
        self._events: collections.deque[backend.Event] = collections.deque()
        self._faults: dict[str, list[_Fault]] = {}
        # Calls blocked by a hang fault wait here; close() wakes them.
        self._unhang = threading.Condition(self._lock)
        self._hung: list[str] = []
        self._closed = False
        # NVML enumerates GPUs in PCI bus order; the minor number is the driver's own. Indexed by minor (unique in a
        # profile), so a node of many GPUs is set up in linear time rather than one list search per GPU.
        index = {spec.minor: i for i, spec in enumerate(sorted(profile.gpus, key=lambda g: g.pci_bus_id))}
        self._gpus: dict[int, _Gpu] = {
            spec.minor: _Gpu(
                spec=spec, uuid=gpu_uuid(node_name, spec.minor), index=index[spec.minor], mig_mode=spec.mig_mode
            )
            for spec in sorted(profile.gpus, key=lambda g: g.minor)
        }
        if state_file is not None and state_file.exists():
            self._load_state(state_file)
        else:
            for gpu in self._gpus.values():
                for name, start in gpu.spec.mig_devices:
                    profile_ = next(p for p in gpu.spec.model.mig_profiles if p.name == name)
                    placement = next(p for p in profile_.placements if p.start == start)
                    gi = self._new_gi(gpu, profile_, placement)
                    gpu.gis[gi].cis.append(0)
            self._save()
        for fault in profile.faults:
            self.fail(fault.operation, fault.code, minor=fault.minor, times=fault.times, action=fault.action)

    # --- Test controls (not part of NvmlBackend) ---

    def fail(
        self,
        operation: str,
        code: int = backend.Return.UNKNOWN,
        *,
        minor: int | None = None,
        times: int = 1,
        action: FaultAction = FaultAction.FAIL,
    ) -> None:
        """Make the next `times` calls of `operation` (on `minor`, or any GPU) raise NvmlError(code),
        or with `FaultAction.HANG` block until `close()` (then raise NvmlError(UNINITIALIZED)).

        A hung call has done nothing (it hangs before its checks), and it releases the fake's
        lock while it waits, so other threads keep using the fake. Faults stack per operation;
        the oldest one with calls left fires first. Profile files' `faults:` come through here.
        """
        if operation not in OPERATIONS:
            raise ValueError(f"unknown operation {operation!r} (known: {', '.join(sorted(OPERATIONS))})")
        if minor is not None and operation in _NO_MINOR_OPERATIONS:
            raise ValueError(f"{operation} is not called on one GPU: a fault on minor {minor} would never fire")
        if times < 1:
            raise ValueError(f"times must be >= 1, got {times}")
        with self._lock:
            self._faults.setdefault(operation, []).append(
                _Fault(code=int(code), minor=minor, times=times, action=FaultAction(action))
            )

    def hung(self) -> tuple[str, ...]:
        """The operations blocked in a hang fault right now, oldest first (for tests to wait on)."""
        with self._lock:
            return tuple(self._hung)

    def hold(self, minor: int, holder: str) -> None:
        """Another client (DCGM, nvsm, a CUDA process) opens the GPU until `release`: on Ampere, where a
        MIG mode change needs a GPU reset, `set_mig_mode` then fails with IN_USE as NVML's activation does."""
        with self._lock:
            self._gpu(minor, check_lost=False).holders.append(holder)

    def release(self, minor: int, holder: str) -> None:
        """`holder` closes the GPU again. Raises ValueError when it did not hold it."""
        with self._lock:
            self._gpu(minor, check_lost=False).holders.remove(holder)

    def mark_lost(self, minor: int) -> None:
        """The GPU falls off the bus: every later call on it raises GPU_IS_LOST; one GPU_LOST event."""
        with self._lock:
            gpu = self._gpu(minor, check_lost=False)
            gpu.lost = True
            self._events.append(backend.Event(kind=backend.EventKind.GPU_LOST, minor=minor, gpu_uuid=gpu.uuid))
            self._events_ready.notify_all()

    def inject_xid(
        self, minor: int, xid: int, *, mig_uuid: str | None = None, recovery: backend.RecoveryAction | None = None
    ) -> None:
        """Queue an XID event on a GPU (or one of its MIG devices) for `wait_events`; `recovery` is the
        recovery action the driver sets with it (the real driver does for the XIDs that need a reset)."""
        with self._lock:
            gpu = self._gpu(minor, check_lost=False)
            if recovery is not None:
                gpu.recovery = recovery
            self._events.append(
                backend.Event(kind=backend.EventKind.XID, minor=minor, gpu_uuid=gpu.uuid, mig_uuid=mig_uuid, xid=xid)
            )
            self._events_ready.notify_all()

    def reset_gpu(self, minor: int) -> None:
        """An operator resets the GPU (`nvidia-smi -r`): it answers again and needs no recovery."""
        with self._lock:
            gpu = self._gpu(minor, check_lost=False)
            gpu.lost = False
            gpu.recovery = backend.RecoveryAction.NONE

    def time_slice(self, minor: int) -> backend.TimeSlice:
        """The time-slice last set on the GPU (NVML offers no getter; the fake does, for tests)."""
        with self._lock:
            return self._gpu(minor).time_slice

    # --- NvmlBackend ---

    def driver_info(self) -> backend.DriverInfo:
        with self._lock:
            self._maybe_fail("driver_info", None)
            return backend.DriverInfo(
                driver_version=self.profile.driver_version, cuda_driver_version=self.profile.cuda_driver_version
            )

    def gpus(self) -> tuple[backend.GpuInfo, ...]:
        with self._lock:
            self._maybe_fail("gpus", None)
            return tuple(self._info(gpu) for gpu in self._gpus.values())

    def gpu_instance_profiles(self, minor: int) -> tuple[backend.GpuInstanceProfile, ...]:
        with self._lock:
            self._maybe_fail("gpu_instance_profiles", minor)
            return self._mig_gpu(minor).spec.model.mig_profiles

    def gpu_instances(self, minor: int) -> tuple[backend.GpuInstance, ...]:
        with self._lock:
            self._maybe_fail("gpu_instances", minor)
            gpu = self._gpu(minor)
            return tuple(
                backend.GpuInstance(parent_minor=minor, gi_id=gi_id, profile_id=gi.profile.id, placement=gi.placement)
                for gi_id, gi in sorted(gpu.gis.items())
            )

    def compute_instances(self, minor: int, *, gi_id: int) -> tuple[backend.ComputeInstance, ...]:
        with self._lock:
            self._maybe_fail("compute_instances", minor)
            gi = self._gi(self._gpu(minor), gi_id)
            return tuple(
                backend.ComputeInstance(parent_minor=minor, gi_id=gi_id, ci_id=ci, slice_count=gi.profile.slice_count)
                for ci in sorted(gi.cis)
            )

    def mig_devices(self, minor: int) -> tuple[backend.MigDevice, ...]:
        with self._lock:
            self._maybe_fail("mig_devices", minor)
            gpu = self._gpu(minor)
            devices = [self._mig(gpu, gi_id, gi, ci) for gi_id, gi in gpu.gis.items() for ci in gi.cis]
            return tuple(sorted(devices, key=lambda d: (d.placement.start, d.gi_id, d.ci_id)))

    def set_mig_mode(self, minor: int, mode: backend.MigMode) -> None:
        with self._lock:
            self._maybe_fail("set_mig_mode", minor)
            gpu = self._mig_gpu(minor)
            if mode is gpu.mig_mode:
                return  # Already in that mode: nothing to activate.
            if mode is backend.MigMode.DISABLED and gpu.gis:
                raise backend.NvmlError(backend.Return.IN_USE, f"GPU {minor} still has {len(gpu.gis)} GPU instance(s)")
            if gpu.spec.model.architecture in _MIG_MODE_NEEDS_RESET and gpu.holders:
                raise backend.NvmlError(
                    backend.Return.IN_USE,
                    f"GPU {minor} ({gpu.spec.model.architecture}) needs a reset to change its MIG mode, "
                    f"and {', '.join(gpu.holders)} still hold(s) it",
                )
            gpu.mig_mode = backend.MigMode(mode)
            self._save()

    def create_gpu_instance(self, minor: int, *, profile_id: int, placement: backend.Placement) -> backend.GpuInstance:
        with self._lock:
            self._maybe_fail("create_gpu_instance", minor)
            gpu = self._gpu(minor)
            if not gpu.spec.model.mig_profiles or gpu.mig_mode is not backend.MigMode.ENABLED:
                raise backend.NvmlError(backend.Return.NOT_SUPPORTED, f"GPU {minor} does not have MIG mode enabled")
            profile = next((p for p in gpu.spec.model.mig_profiles if p.id == profile_id), None)
            if profile is None:
                raise backend.NvmlError(
                    backend.Return.INVALID_ARGUMENT, f"GPU {minor} has no GPU-instance profile id {profile_id}"
                )
            if placement not in profile.placements:
                raise backend.NvmlError(
                    backend.Return.INVALID_ARGUMENT,
                    f"{profile.name} cannot be placed at start {placement.start} size {placement.size}",
                )
            for gi_id, gi in gpu.gis.items():
                if set(gi.placement.slices) & set(placement.slices):
                    raise backend.NvmlError(
                        backend.Return.INSUFFICIENT_RESOURCES,
                        f"placement {placement.start}+{placement.size} overlaps GPU instance {gi_id} "
                        f"({gi.profile.name})",
                    )
            if sum(1 for gi in gpu.gis.values() if gi.profile.id == profile_id) >= profile.instance_count:
                raise backend.NvmlError(
                    backend.Return.INSUFFICIENT_RESOURCES, f"no more {profile.name} instances on GPU {minor}"
                )
            gi_id = self._new_gi(gpu, profile, placement)
            self._save()
            return backend.GpuInstance(parent_minor=minor, gi_id=gi_id, profile_id=profile_id, placement=placement)

    def create_compute_instance(self, minor: int, *, gi_id: int) -> backend.MigDevice:
        with self._lock:
            self._maybe_fail("create_compute_instance", minor)
            gpu = self._gpu(minor)
            gi = self._gi(gpu, gi_id)
            if gi.cis:
                raise backend.NvmlError(
                    backend.Return.INSUFFICIENT_RESOURCES, f"GPU instance {gi_id} already has a compute instance"
                )
            gi.cis.append(0)
            self._save()
            return self._mig(gpu, gi_id, gi, 0)

    def destroy_compute_instance(self, minor: int, *, gi_id: int, ci_id: int) -> None:
        with self._lock:
            self._maybe_fail("destroy_compute_instance", minor)
            gi = self._gi(self._gpu(minor), gi_id)
            if ci_id not in gi.cis:
                raise backend.NvmlError(
                    backend.Return.NOT_FOUND, f"GPU instance {gi_id} has no compute instance {ci_id}"
                )
            gi.cis.remove(ci_id)
            self._save()

    def destroy_gpu_instance(self, minor: int, *, gi_id: int) -> None:
        with self._lock:
            self._maybe_fail("destroy_gpu_instance", minor)
            gpu = self._gpu(minor)
            gi = self._gi(gpu, gi_id)
            if gi.cis:
                raise backend.NvmlError(backend.Return.IN_USE, f"GPU instance {gi_id} still has compute instances")
            del gpu.gis[gi_id]
            self._save()

    def compute_mode(self, minor: int) -> backend.ComputeMode:
        with self._lock:
            self._maybe_fail("compute_mode", minor)
            return self._gpu(minor).compute_mode

    def recovery_action(self, minor: int) -> backend.RecoveryAction:
        with self._lock:
            self._maybe_fail("recovery_action", minor)
            return self._gpu(minor).recovery

    def set_compute_mode(self, minor: int, mode: backend.ComputeMode) -> None:
        with self._lock:
            self._maybe_fail("set_compute_mode", minor)
            self._gpu(minor).compute_mode = backend.ComputeMode(mode)
            self._save()

    def set_time_slice(self, minor: int, time_slice: backend.TimeSlice) -> None:
        with self._lock:
            self._maybe_fail("set_time_slice", minor)
            self._gpu(minor).time_slice = backend.TimeSlice(time_slice)
            self._save()

    def wait_events(self, *, timeout_s: float) -> tuple[backend.Event, ...]:
        with self._lock:
            self._maybe_fail("wait_events", None)
            self._events_ready.wait_for(lambda: bool(self._events) or self._closed, timeout=max(timeout_s, 0.0))
            events = tuple(self._events)
            self._events.clear()
            return events

    def close(self) -> None:
        """End event waits and hung calls. Idempotent."""
        with self._lock:
            self._closed = True
            self._events_ready.notify_all()
            self._unhang.notify_all()

    # --- Internals ---

    def _maybe_fail(self, operation: str, minor: int | None) -> None:
        for fault in self._faults.get(operation, ()):
            if fault.times > 0 and (fault.minor is None or fault.minor == minor):
                fault.times -= 1
                if fault.action is FaultAction.HANG:
                    self._hang(operation)
                raise backend.NvmlError(fault.code, f"injected fault in {operation}")

    def _hang(self, operation: str) -> None:
        """Block the calling thread until close(). Called with the lock held; waiting on a
        condition of the lock releases it (every recursion level of the RLock), so the rest
        of the process goes on as it would beside one stuck driver call."""
        self._hung.append(operation)
        try:
            self._unhang.wait_for(lambda: self._closed)
        finally:
            self._hung.remove(operation)
        raise backend.NvmlError(
            backend.Return.UNINITIALIZED, f"injected hang in {operation} ended: the fake was closed"
        )

    def _gpu(self, minor: int, *, check_lost: bool = True) -> _Gpu:
        gpu = self._gpus.get(minor)
        if gpu is None:
            raise backend.NvmlError(backend.Return.NOT_FOUND, f"no GPU with minor number {minor}")
        if check_lost and gpu.lost:
            raise backend.NvmlError(backend.Return.GPU_IS_LOST, f"GPU {minor} ({gpu.uuid}) is lost")
        return gpu

    def _mig_gpu(self, minor: int) -> _Gpu:
        """`_gpu(minor)`, raising NOT_SUPPORTED (as NVML) when its model has no MIG."""
        gpu = self._gpu(minor)
        if not gpu.spec.model.mig_profiles:
            raise backend.NvmlError(
                backend.Return.NOT_SUPPORTED, f"GPU {minor} ({gpu.spec.model.product_name}) has no MIG"
            )
        return gpu

    @staticmethod
    def _gi(gpu: _Gpu, gi_id: int) -> _Gi:
        gi = gpu.gis.get(gi_id)
        if gi is None:
            raise backend.NvmlError(backend.Return.NOT_FOUND, f"GPU {gpu.spec.minor} has no GPU instance {gi_id}")
        return gi

    @staticmethod
    def _new_gi(gpu: _Gpu, profile: backend.GpuInstanceProfile, placement: backend.Placement) -> int:
        gi_id = next(i for i in range(1, len(gpu.gis) + 2) if i not in gpu.gis)
        gpu.gis[gi_id] = _Gi(profile=profile, placement=placement)
        return gi_id

    def _mig(self, gpu: _Gpu, gi_id: int, gi: _Gi, ci_id: int) -> backend.MigDevice:
        key = f"{gpu.uuid}/gi/{gi_id}/ci/{ci_id}/{gi.profile.id}/{gi.placement.start}"
        return backend.MigDevice(
            uuid=f"MIG-{uuid.uuid5(_UUID_NAMESPACE, key)}",
            parent_minor=gpu.spec.minor,
            parent_uuid=gpu.uuid,
            profile_id=gi.profile.id,
            profile_name=gi.profile.name,
            placement=gi.placement,
            gi_id=gi_id,
            ci_id=ci_id,
            memory_bytes=gi.profile.memory_bytes,
        )

    def _info(self, gpu: _Gpu) -> backend.GpuInfo:
        spec, model = gpu.spec, gpu.spec.model
        return backend.GpuInfo(
            minor=spec.minor,
            index=gpu.index,
            uuid=gpu.uuid,
            name=model.product_name,
            brand=model.brand,
            architecture=model.architecture,
            cuda_compute_capability=model.cuda_compute_capability,
            memory_bytes=model.memory_bytes,
            pci_bus_id=spec.pci_bus_id,
            pcie_root=spec.pcie_root,
            numa_node=spec.numa_node,
            multiprocessors=model.multiprocessors,
            engines=model.engines,
            mig_capable=bool(model.mig_profiles),
            mig_mode=gpu.mig_mode,
            fabric=spec.fabric,
        )

    # --- Persistence ---

    def _save(self) -> None:
        if self.state_file is None:
            return
        document = {
            "version": _STATE_VERSION,
            "node": self.node_name,
            "profile": self.profile.name,
            "gpus": {
                str(minor): {
                    "migMode": gpu.mig_mode.name.lower(),
                    "computeMode": gpu.compute_mode.name,
                    "timeSlice": gpu.time_slice.name,
                    "gpuInstances": [
                        {
                            "giId": gi_id,
                            "profileId": gi.profile.id,
                            "start": gi.placement.start,
                            "computeInstances": gi.cis,
                        }
                        for gi_id, gi in sorted(gpu.gis.items())
                    ],
                }
                for minor, gpu in self._gpus.items()
            },
        }
        # Write a sibling temp file and rename it over the old one, so a crash mid-write
        # leaves either the old state or the new one, never half a file.
        tmp = self.state_file.with_name(f".{self.state_file.name}.tmp")
        tmp.write_text(json.dumps(document, indent=1, sort_keys=True), encoding="utf-8")
        os.replace(tmp, self.state_file)

    def _load_state(self, path: pathlib.Path) -> None:
        def fail(problem: str) -> StateFileError:
            return StateFileError(f"fake GPU state {path}: {problem}")

        try:
            document = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            raise fail(f"cannot read: {error}") from None
        if not isinstance(document, dict) or document.get("version") != _STATE_VERSION:
            raise fail(f"not a version {_STATE_VERSION} state document")
        if document.get("node") != self.node_name or document.get("profile") != self.profile.name:
            raise fail(
                f"written for node {document.get('node')!r} profile {document.get('profile')!r}, "
                f"not node {self.node_name!r} profile {self.profile.name!r}: delete it to start afresh"
            )
        gpus = document.get("gpus")
        if not isinstance(gpus, dict):
            raise fail("gpus: must be a mapping")
        try:
            for minor_text, raw in gpus.items():
                gpu = self._gpus[int(minor_text)]
                gpu.mig_mode = backend.MigMode[str(raw["migMode"]).upper()]
                gpu.compute_mode = backend.ComputeMode[raw["computeMode"]]
                gpu.time_slice = backend.TimeSlice[raw["timeSlice"]]
                gpu.gis = {}
                for item in raw["gpuInstances"]:
                    profile = next(p for p in gpu.spec.model.mig_profiles if p.id == item["profileId"])
                    placement = next(p for p in profile.placements if p.start == item["start"])
                    gpu.gis[int(item["giId"])] = _Gi(
                        profile=profile, placement=placement, cis=[int(ci) for ci in item["computeInstances"]]
                    )
        except (KeyError, ValueError, TypeError, StopIteration) as error:
            raise fail(f"gpus: does not match profile {self.profile.name}: {error!r}") from None


# --- A fake driver root -------------------------------------------------------------------------

# (library file prefix, the suffix of the name programs load it by; None: the versioned file name
# itself, as for libnvidia-gpucomp), as a 580-series driver installs them.
_FAKE_LIBRARIES = (
    ("libcuda.so", "1"),
    ("libcudadebugger.so", "1"),
    ("libnvidia-ml.so", "1"),
    ("libnvidia-cfg.so", "1"),
    ("libnvidia-ptxjitcompiler.so", "1"),
    ("libnvidia-nvvm.so", "4"),
    ("libnvidia-gpucomp.so", None),
    ("libnvidia-allocator.so", "1"),
    ("libnvidia-opencl.so", "1"),
    ("libnvidia-pkcs11-openssl3.so", None),
)
_FAKE_TOOLS = ("nvidia-debugdump", "nvidia-persistenced", "nvidia-cuda-mps-control", "nvidia-cuda-mps-server")


def write_driver_root(
    root: pathlib.Path,
    *,
    driver: backend.DriverInfo,
    gpus: Sequence[backend.GpuInfo],
    machine: str | None = None,
) -> pathlib.Path:
    """Lay out a driver installation of `driver`'s version for `gpus` under `root`, as the NVIDIA
    driver's installer does, and return `root`. Idempotent (files are rewritten). Pure apart from
    the files: it asks NVML nothing (the caller passes what it read).

    Libraries of the driver's version (placeholders, not ELF) with their soname links in
    `/usr/lib/<triplet>`, an `/etc/ld.so.cache` in glibc's format listing them (plus what a real
    cache also holds: an unrelated library, a 32-bit build and an older driver's NVML, which
    discovery must skip), the binaries (`nvidia-smi -L` lists the GPUs named by
    `NVIDIA_VISIBLE_DEVICES`, or all; the others exit 1), GSP firmware, and the persistenced
    socket behind the `/var/run -> /run` link distributions have. So a fake node's CDI specs mount
    files that exist, and a container given them runs the fake `nvidia-smi`.
    """
    version = driver.driver_version
    arch = driverfiles.ld_cache_arch(machine)
    triplet = f"{machine or os.uname().machine}-linux-gnu"
    libdir = f"/usr/lib/{triplet}"
    entries: list[driverfiles.LdCacheEntry] = []
    for prefix, suffix in _FAKE_LIBRARIES:
        real = f"{prefix}.{version}"
        _write(root, f"{libdir}/{real}", f"fake {real}\n")
        name = f"{prefix}.{suffix}" if suffix is not None else real
        if name != real:
            _link(root, f"{libdir}/{name}", real)
        entries.append(driverfiles.LdCacheEntry(name=name, path=f"{libdir}/{name}", flags=arch))
    _link(root, f"{libdir}/libcuda.so", "libcuda.so.1")
    entries.append(driverfiles.LdCacheEntry(name="libcuda.so", path=f"{libdir}/libcuda.so", flags=arch))
    # What discovery must leave out: not a driver library, a 32-bit build, another driver's file.
    _write(root, f"{libdir}/libz.so.1.2.13", "fake zlib\n")
    _link(root, f"{libdir}/libz.so.1", "libz.so.1.2.13")
    _write(root, f"/usr/lib/i386-linux-gnu/libcuda.so.{version}", "fake 32-bit libcuda\n")
    _link(root, "/usr/lib/i386-linux-gnu/libcuda.so.1", f"libcuda.so.{version}")
    _write(root, "/usr/lib/nvidia-470/libnvidia-ml.so.470.256.02", "fake old NVML\n")
    _link(root, "/usr/lib/nvidia-470/libnvidia-ml.so.1", "libnvidia-ml.so.470.256.02")
    entries += [
        driverfiles.LdCacheEntry(name="libz.so.1", path=f"{libdir}/libz.so.1", flags=arch),
        driverfiles.LdCacheEntry(name="libcuda.so.1", path="/usr/lib/i386-linux-gnu/libcuda.so.1", flags=0x0003),
        driverfiles.LdCacheEntry(name="libnvidia-ml.so.1", path="/usr/lib/nvidia-470/libnvidia-ml.so.1", flags=arch),
    ]
    _write(root, driverfiles.LD_CACHE, driverfiles.write_ld_cache(entries))
    listing = "".join(f"{gpu.index}|{gpu.name}|{gpu.uuid}\n" for gpu in gpus)
    smi = (
        "#!/bin/sh\n"
        "# dractl's fake driver: lists the fake GPUs this container was given.\n"
        '[ "$1" = "-L" ] || { echo "fake nvidia-smi: only -L is supported" >&2; exit 2; }\n'
        'visible=",${NVIDIA_VISIBLE_DEVICES:-all},"\n'
        "while IFS='|' read -r index name uuid; do\n"
        '  case "$visible" in *",all,"*|*",$uuid,"*) echo "GPU $index: $name (UUID: $uuid)";; esac\n'
        "done <<'EOF'\n"
        f"{listing}EOF\n"
    )
    _write(root, "/usr/bin/nvidia-smi", smi, mode=0o755)
    for tool in _FAKE_TOOLS:
        _write(root, f"/usr/bin/{tool}", f'#!/bin/sh\necho "fake {tool}: no GPU behind it" >&2\nexit 1\n', mode=0o755)
    for firmware in ("gsp_ga10x.bin", "gsp_tu10x.bin"):
        _write(root, f"/lib/firmware/nvidia/{version}/{firmware}", f"fake {firmware}\n")
    _link(root, "/var/run", "/run")
    socket_path = root / "run/nvidia-persistenced/socket"
    socket_path.parent.mkdir(parents=True, exist_ok=True)
    socket_path.unlink(missing_ok=True)
    # A socket inode made without binding one: no path length limit, and nothing to close.
    os.mknod(socket_path, stat.S_IFSOCK | 0o666)
    return root


def _write(root: pathlib.Path, path: str, content: str | bytes, *, mode: int = 0o644) -> None:
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(content.encode() if isinstance(content, str) else content)
    target.chmod(mode)


def _link(root: pathlib.Path, path: str, to: str) -> None:
    link = root / path.lstrip("/")
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(to)
