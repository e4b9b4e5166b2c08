"""The NVIDIA opaque configuration API (`resource.nvidia.com/v1beta1`): decode, validate, select.

What it does: decodes the `parameters` of a claim's or class's opaque config for our driver
strictly into `GpuConfig` / `MigDeviceConfig` values (unknown fields and bad values are a
`ConfigError` naming the field), picks for every allocation result the config that
applies to it, in the API's precedence order (built-in default < class configs < claim
configs; later entries win within a source; a config naming the request beats an unscoped
one), words a refused allocation config as the node agent reports it (`message`), and lists
the configs of a set of manifests that the node agent would refuse (`config_problems` for one
object, `problems` for a set, as the chart's admission policy refuses them). What it must not
do: any I/O, or apply a config (the node agent's sharing and state do that).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from dractl import model

__all__ = [
    "API_VERSION",
    "ConfigError",
    "DeviceKind",
    "Strategy",
    "MpsConfig",
    "Sharing",
    "GpuConfig",
    "MigDeviceConfig",
    "Config",
    "Selected",
    "decode",
    "select",
    "message",
    "config_problems",
    "problems",
]

API_VERSION = "resource.nvidia.com/v1beta1"
_MIB = 2**20


class ConfigError(ValueError):
    """A config that cannot be used. `field` is its path inside `parameters` (may be empty)
    and `index` the position in `status.allocation.devices.config` (None: not known here)."""

    def __init__(self, field: str, message: str, *, index: int | None = None) -> None:
        self.field = field
        self.message = message
        self.index = index
        where = f"config[{index}]" if index is not None else "config"
        super().__init__(f"{where} {field}: {message}" if field else f"{where}: {message}")

    def at(self, index: int) -> ConfigError:
        """The same error, located at config entry `index`."""
        return ConfigError(self.field, self.message, index=index)


class DeviceKind(enum.Enum):
    """Which config kind a device takes: a full GPU takes GpuConfig, a MIG device MigDeviceConfig."""

    GPU = "GpuConfig"
    MIG = "MigDeviceConfig"


class Strategy(enum.Enum):
    TIME_SLICING = "TimeSlicing"
    MPS = "MPS"


@dataclasses.dataclass(frozen=True, slots=True)
class MpsConfig:
    """MPS settings; limits are in MiB (the NVIDIA driver passes them as `<MiB>M`).

    `per_device_pinned_memory_limit_mib` is keyed by GPU UUID or by the device's index
    within the claim (as a decimal string), exactly as written by the user.
    """

    default_active_thread_percentage: int | None = None
    default_pinned_memory_limit_mib: int | None = None
    per_device_pinned_memory_limit_mib: Mapping[str, int] = dataclasses.field(default_factory=dict)
    multi_user: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class Sharing:
    """A sharing strategy. `interval` is set only for TimeSlicing, `mps` only for MPS."""

    strategy: Strategy
    interval: int | None = None  # TimeSlicing: 0 Default, 1 Short, 2 Medium, 3 Long
    mps: MpsConfig | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class GpuConfig:
    sharing: Sharing | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class MigDeviceConfig:
    sharing: Sharing | None = None


Config = GpuConfig | MigDeviceConfig

_INTERVALS = {"Default": 0, "Short": 1, "Medium": 2, "Long": 3}
_TOP_KEYS = frozenset({"apiVersion", "kind", "sharing"})
_GPU_SHARING_KEYS = frozenset({"strategy", "timeSlicingConfig", "mpsConfig"})
_MIG_SHARING_KEYS = frozenset({"strategy", "mpsConfig"})
_TIME_SLICING_KEYS = frozenset({"interval"})
_MPS_KEYS = frozenset(
    {
        "defaultActiveThreadPercentage",
        "defaultPinnedDeviceMemoryLimit",
        "defaultPerDevicePinnedMemoryLimit",
        "multiUser",
    }
)


def _object(raw: object, path: str, allowed: frozenset[str]) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise ConfigError(path, f"must be an object, got {type(raw).__name__}")
    # Sorted, so the message names the same field whatever order the keys came in (the chart's admission
    # policy, which sees keys unordered, names the same one).
    for key in sorted(raw, key=str):
        if key not in allowed:
            field = f"{path}.{key}" if path else str(key)
            raise ConfigError(field, f"unknown field (allowed: {', '.join(sorted(allowed))})")
    return raw


def _limit_mib(raw: object, path: str) -> int:
    try:
        value = model.quantity.parse(raw)
    except model.quantity.QuantityError as err:
        raise ConfigError(path, str(err)) from None
    mib = int(value.value // _MIB)
    if mib < 1:
        raise ConfigError(path, f"must be at least 1Mi, got {value.text}")
    return mib


def _mps(raw: object, path: str) -> MpsConfig:
    m = _object(raw, path, _MPS_KEYS)
    percentage = m.get("defaultActiveThreadPercentage")
    if percentage is not None and (
        isinstance(percentage, bool) or not isinstance(percentage, int) or not 0 <= percentage <= 100
    ):
        raise ConfigError(
            f"{path}.defaultActiveThreadPercentage", f"must be an integer from 0 to 100, got {percentage!r}"
        )
    default_limit = m.get("defaultPinnedDeviceMemoryLimit")
    per_device_raw = m.get("defaultPerDevicePinnedMemoryLimit")
    per_device: dict[str, int] = {}
    if per_device_raw is not None:
        per_path = f"{path}.defaultPerDevicePinnedMemoryLimit"
        if not isinstance(per_device_raw, Mapping):
            raise ConfigError(
                per_path,
                f"must be a map from GPU UUID or device index to a quantity, got {type(per_device_raw).__name__}",
            )
        for key, value in sorted(per_device_raw.items(), key=lambda item: str(item[0])):
            name = str(key)
            if not (name.isdigit() or name.startswith(("GPU-", "MIG-"))):
                raise ConfigError(
                    f"{per_path}[{name}]", "key must be a GPU/MIG UUID or the device's index within the claim"
                )
            per_device[name] = _limit_mib(value, f"{per_path}[{name}]")
    multi_user = m.get("multiUser", False)
    if not isinstance(multi_user, bool):
        raise ConfigError(f"{path}.multiUser", f"must be true or false, got {multi_user!r}")
    return MpsConfig(
        default_active_thread_percentage=percentage,
        default_pinned_memory_limit_mib=None
        if default_limit is None
        else _limit_mib(default_limit, f"{path}.defaultPinnedDeviceMemoryLimit"),
        per_device_pinned_memory_limit_mib=per_device,
        multi_user=multi_user,
    )


def _sharing(raw: object, kind: DeviceKind) -> Sharing:
    allowed = _GPU_SHARING_KEYS if kind is DeviceKind.GPU else _MIG_SHARING_KEYS
    m = _object(raw, "sharing", allowed)
    strategy_raw = m.get("strategy")
    try:
        strategy = Strategy(strategy_raw)
    except ValueError:
        raise ConfigError("sharing.strategy", f"must be TimeSlicing or MPS, got {strategy_raw!r}") from None
    if strategy is Strategy.TIME_SLICING:
        if m.get("mpsConfig") is not None:
            raise ConfigError("sharing.mpsConfig", "must not be set with strategy TimeSlicing")
        if kind is DeviceKind.MIG:
            # Accepted for compatibility with the NVIDIA driver; it has no effect on MIG devices.
            return Sharing(strategy=strategy)
        ts = _object(m.get("timeSlicingConfig") or {}, "sharing.timeSlicingConfig", _TIME_SLICING_KEYS)
        interval_raw = ts.get("interval", "Default")
        if not isinstance(interval_raw, str) or interval_raw not in _INTERVALS:
            raise ConfigError(
                "sharing.timeSlicingConfig.interval", f"must be Default, Short, Medium or Long, got {interval_raw!r}"
            )
        return Sharing(strategy=strategy, interval=_INTERVALS[interval_raw])
    if m.get("timeSlicingConfig") is not None:
        raise ConfigError("sharing.timeSlicingConfig", "must not be set with strategy MPS")
    return Sharing(strategy=strategy, mps=_mps(m.get("mpsConfig") or {}, "sharing.mpsConfig"))


def decode(parameters: object) -> Config:
    """Decode one opaque config's `parameters` strictly. Pure; raises `ConfigError`."""
    m = _object(parameters, "", _TOP_KEYS)
    if m.get("apiVersion") != API_VERSION:
        raise ConfigError("apiVersion", f"must be {API_VERSION}, got {m.get('apiVersion')!r}")
    try:
        kind = DeviceKind(m.get("kind"))
    except ValueError:
        raise ConfigError("kind", f"must be GpuConfig or MigDeviceConfig, got {m.get('kind')!r}") from None
    sharing = None if m.get("sharing") is None else _sharing(m["sharing"], kind)
    return GpuConfig(sharing=sharing) if kind is DeviceKind.GPU else MigDeviceConfig(sharing=sharing)


@dataclasses.dataclass(frozen=True, slots=True)
class Selected:
    """The config that applies to one result: `index` into the allocation's config list,
    or None for the built-in default (no sharing)."""

    index: int | None
    config: Config


def _kind_of(config: Config) -> DeviceKind:
    return DeviceKind.GPU if isinstance(config, GpuConfig) else DeviceKind.MIG


def _names(request: str) -> tuple[str, str]:
    return request, request.split("/", 1)[0]


def select(
    configs: Sequence[model.DeviceAllocationConfiguration],
    *,
    driver: str,
    results: Sequence[tuple[str, DeviceKind]],
) -> tuple[Selected, ...]:
    """The config for each `(request, kind)` result, in result order. Pure; raises `ConfigError`.

    Every config for `driver` is decoded (and so validated) even when it applies to no
    result, as the NVIDIA driver does. A config that names a result's request (the full
    `req/sub` or its base `req`) but is of the other kind is an error; an unscoped config of
    the other kind is skipped. Precedence: class configs, then claim configs, later wins.
    """
    decoded: list[tuple[int, model.DeviceAllocationConfiguration, Config]] = []
    for index, entry in enumerate(configs):
        if entry.opaque.driver != driver:
            continue
        try:
            decoded.append((index, entry, decode(entry.opaque.parameters)))
        except ConfigError as err:
            raise err.at(index) from None
    # Highest precedence first: claim configs after class configs, later entries after earlier.
    ranked = sorted(decoded, key=lambda item: (item[1].source == "FromClaim", item[0]), reverse=True)
    chosen: list[Selected] = []
    for request, kind in results:
        names = _names(request)
        pick: Selected | None = None
        for index, entry, config in ranked:
            if entry.requests and any(name in entry.requests for name in names):
                if _kind_of(config) is not kind:
                    raise ConfigError(
                        "kind",
                        f"{_kind_of(config).value} cannot apply to request {request!r},"
                        f" a {kind.name} device (use {kind.value})",
                        index=index,
                    )
                pick = Selected(index=index, config=config)
                break
        if pick is None:
            for index, entry, config in ranked:
                if not entry.requests and _kind_of(config) is kind:
                    pick = Selected(index=index, config=config)
                    break
        if pick is None:
            pick = Selected(index=None, config=GpuConfig() if kind is DeviceKind.GPU else MigDeviceConfig())
        chosen.append(pick)
    return tuple(chosen)


def message(err: ConfigError, configs: Sequence[model.DeviceAllocationConfiguration]) -> str:
    """Where `err` (raised by `select` over `configs`, a claim's `status.allocation.devices.config`) lies and what it
    is, as the node agent reports it: `status.allocation.devices.config[i] (FromClaim) opaque.parameters.<field>:
    <message>`. Pure."""
    if err.index is None:
        return f"opaque config: {err}"
    field = f".{err.field}" if err.field else ""
    where = f"status.allocation.devices.config[{err.index}] ({configs[err.index].source}) opaque.parameters{field}"
    return f"{where}: {err.message}"


def config_problems(configs: Sequence[model.OpaqueDeviceConfiguration], *, path: str, driver: str) -> Iterator[str]:
    """Each config for `driver` in `configs` (an object's config list at `path`, e.g. `spec.devices.config`) that
    `decode` refuses, as the chart's admission policy words it: `<path>[i].opaque.parameters.<field>: <message>`.
    Pure."""
    for index, entry in enumerate(configs):
        if entry.driver != driver:
            continue
        try:
            decode(entry.parameters)
        except ConfigError as err:
            field = f".{err.field}" if err.field else ""
            yield f"{path}[{index}].opaque.parameters{field}: {err.message}"


def problems(objects: model.Objects, *, driver: str) -> tuple[str, ...]:
    """Every opaque config for `driver` in the DeviceClasses, ResourceClaims and ResourceClaimTemplates of `objects`
    that `decode` refuses, as the chart's admission policy refuses it at apply time and with its message:
    `<file>: <Kind> <name>: <path>[i].opaque.parameters.<field>: <message>`. Pure."""
    found: list[str] = []
    for device_class in objects.device_classes:
        prefix = f"{device_class.source}: DeviceClass {device_class.meta.name}"
        found.extend(f"{prefix}: {p}" for p in config_problems(device_class.config, path="spec.config", driver=driver))
    specs: list[tuple[str, str, model.ObjectMeta, model.Source, model.ResourceClaimSpec]] = [
        ("ResourceClaim", "spec.devices.config", c.meta, c.source, c.spec) for c in objects.resource_claims
    ]
    specs.extend(
        ("ResourceClaimTemplate", "spec.spec.devices.config", t.meta, t.source, t.spec)
        for t in objects.resource_claim_templates
    )
    for kind, path, meta, source, spec in specs:
        if spec.config:
            prefix = f"{source}: {kind} {meta.namespace}/{meta.name}"
            opaques = [c.opaque for c in spec.config]
            found.extend(f"{prefix}: {p}" for p in config_problems(opaques, path=path, driver=driver))
    return tuple(found)
