"""The NVIDIA opaque config API: strict decoding with field-named errors, and which config applies to which result."""

from __future__ import annotations

from typing import Any

import pytest

from dractl import model
from dractl.model import decode, opaque

API = opaque.API_VERSION
GPU = opaque.DeviceKind.GPU
MIG = opaque.DeviceKind.MIG


def _gpu(sharing: Any = None) -> dict[str, Any]:
    raw: dict[str, Any] = {"apiVersion": API, "kind": "GpuConfig"}
    if sharing is not None:
        raw["sharing"] = sharing
    return raw


def _entry(
    parameters: Any, *, requests: tuple[str, ...] = (), source: str = "FromClaim", driver: str = "gpu.nvidia.com"
) -> model.DeviceAllocationConfiguration:
    return model.DeviceAllocationConfiguration(
        source=source, requests=requests, opaque=model.OpaqueDeviceConfiguration(driver=driver, parameters=parameters)
    )


def test_time_slicing_intervals_map_to_0_to_3_and_default_to_default() -> None:
    """Guards: Default/Short/Medium/Long map to 0-3, and a TimeSlicing config without interval means Default."""
    for name, value in (("Default", 0), ("Short", 1), ("Medium", 2), ("Long", 3)):
        config = opaque.decode(_gpu({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": name}}))
        assert config == opaque.GpuConfig(sharing=opaque.Sharing(strategy=opaque.Strategy.TIME_SLICING, interval=value))
    assert opaque.decode(_gpu({"strategy": "TimeSlicing"})).sharing == opaque.Sharing(
        opaque.Strategy.TIME_SLICING, interval=0
    )


def test_mps_fields_are_decoded_with_limits_in_mib() -> None:
    """Guards: MPS thread percentage, default and per-device pinned limits (UUID or index keys) in MiB, multiUser."""
    config = opaque.decode(
        _gpu(
            {
                "strategy": "MPS",
                "mpsConfig": {
                    "defaultActiveThreadPercentage": 0,
                    "defaultPinnedDeviceMemoryLimit": "1536Mi",
                    "defaultPerDevicePinnedMemoryLimit": {"GPU-abc": "2Gi", 0: "1G"},
                    "multiUser": True,
                },
            }
        )
    )
    assert config.sharing is not None and config.sharing.mps == opaque.MpsConfig(
        default_active_thread_percentage=0,
        default_pinned_memory_limit_mib=1536,
        per_device_pinned_memory_limit_mib={"GPU-abc": 2048, "0": 953},
        multi_user=True,
    )
    assert opaque.decode(
        {"apiVersion": API, "kind": "MigDeviceConfig", "sharing": {"strategy": "MPS"}}
    ) == opaque.MigDeviceConfig(sharing=opaque.Sharing(opaque.Strategy.MPS, mps=opaque.MpsConfig()))


@pytest.mark.parametrize(
    ("parameters", "field", "message"),
    [
        pytest.param([], "", "must be an object, got list", id="not-object"),
        pytest.param(
            {"kind": "GpuConfig"}, "apiVersion", "must be resource.nvidia.com/v1beta1, got None", id="no-api-version"
        ),
        pytest.param(
            {"apiVersion": API, "kind": "VfioDeviceConfig"}, "kind", "must be GpuConfig or MigDeviceConfig", id="kind"
        ),
        pytest.param({**_gpu(), "extra": 1}, "extra", "unknown field", id="unknown-top"),
        pytest.param(_gpu({"strategy": "MPS", "extra": 1}), "sharing.extra", "unknown field", id="unknown-sharing"),
        pytest.param(_gpu({}), "sharing.strategy", "must be TimeSlicing or MPS, got None", id="no-strategy"),
        pytest.param(
            _gpu({"strategy": "mps"}), "sharing.strategy", "must be TimeSlicing or MPS, got 'mps'", id="strategy-case"
        ),
        pytest.param(
            _gpu({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": 5}}),
            "sharing.timeSlicingConfig.interval",
            "must be Default, Short, Medium or Long",
            id="interval",
        ),
        pytest.param(
            _gpu({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": ["Long"]}}),
            "sharing.timeSlicingConfig.interval",
            "must be Default, Short, Medium or Long, got ['Long']",
            id="interval-list",
        ),
        pytest.param(
            _gpu({"strategy": "TimeSlicing", "timeSlicingConfig": {"length": "Long"}}),
            "sharing.timeSlicingConfig.length",
            "unknown field",
            id="ts-unknown",
        ),
        pytest.param(
            _gpu({"strategy": "TimeSlicing", "mpsConfig": {}}),
            "sharing.mpsConfig",
            "must not be set with strategy TimeSlicing",
            id="ts-with-mps",
        ),
        pytest.param(
            _gpu({"strategy": "MPS", "timeSlicingConfig": {}}),
            "sharing.timeSlicingConfig",
            "must not be set with strategy MPS",
            id="mps-with-ts",
        ),
        pytest.param(
            _gpu({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": -1}}),
            "sharing.mpsConfig.defaultActiveThreadPercentage",
            "from 0 to 100",
            id="percentage-low",
        ),
        pytest.param(
            _gpu({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": "50"}}),
            "sharing.mpsConfig.defaultActiveThreadPercentage",
            "from 0 to 100, got '50'",
            id="percentage-text",
        ),
        pytest.param(
            _gpu({"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "512Ki"}}),
            "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit",
            "at least 1Mi",
            id="limit-small",
        ),
        pytest.param(
            _gpu({"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "lots"}}),
            "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit",
            "is not a quantity",
            id="limit-text",
        ),
        pytest.param(
            _gpu({"strategy": "MPS", "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {"gpu0": "1Gi"}}}),
            "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[gpu0]",
            "UUID or the device's index",
            id="per-device-key",
        ),
        pytest.param(
            _gpu({"strategy": "MPS", "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": ["1Gi"]}}),
            "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit",
            "must be a map",
            id="per-device-list",
        ),
        pytest.param(
            _gpu({"strategy": "MPS", "mpsConfig": {"multiUser": "yes"}}),
            "sharing.mpsConfig.multiUser",
            "true or false",
            id="multi-user",
        ),
        pytest.param(
            {
                "apiVersion": API,
                "kind": "MigDeviceConfig",
                "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {}},
            },
            "sharing.timeSlicingConfig",
            "unknown field",
            id="mig-ts-config",
        ),
    ],
)
def test_each_bad_field_is_refused_with_its_path(parameters: Any, field: str, message: str) -> None:
    """Guards: strict decoding: every unknown field or bad value is a ConfigError naming the field path."""
    with pytest.raises(opaque.ConfigError) as caught:
        opaque.decode(parameters)
    assert caught.value.field == field
    assert message in caught.value.message


def test_claim_configs_beat_class_configs_and_later_entries_win() -> None:
    """Guards: precedence: class < claim, earlier < later; a config naming the request beats unscoped."""
    class_named = _entry(
        _gpu({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Short"}}),
        requests=("a",),
        source="FromClass",
    )
    claim_unscoped = _entry(_gpu({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Medium"}}))
    claim_first = _entry(_gpu({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}), requests=("b",))
    claim_second = _entry(_gpu({"strategy": "MPS"}), requests=("b",))
    # Claim entries listed before the class entry: the source decides, not the position.
    chosen = opaque.select(
        [claim_unscoped, claim_first, claim_second, class_named],
        driver="gpu.nvidia.com",
        results=[("a", GPU), ("b/x", GPU), ("c", GPU)],
    )
    assert [c.index for c in chosen] == [3, 2, 0]


def test_unscoped_config_of_the_other_kind_is_skipped_and_default_applies() -> None:
    """Guards: an unscoped GpuConfig does not apply to a MIG result, which gets the default MigDeviceConfig."""
    chosen = opaque.select(
        [_entry(_gpu({"strategy": "MPS"}))], driver="gpu.nvidia.com", results=[("m", MIG), ("g", GPU)]
    )
    assert chosen[0] == opaque.Selected(index=None, config=opaque.MigDeviceConfig())
    assert chosen[1].index == 0


def test_named_config_of_the_wrong_kind_is_an_error_with_its_index() -> None:
    """Guards: a GpuConfig naming a MIG request is refused with its index and the kind to use."""
    entries = [_entry({"x": 1}, driver="other.example.com"), _entry(_gpu(), requests=("m",))]
    with pytest.raises(
        opaque.ConfigError,
        match=r"config\[1\] kind: GpuConfig cannot apply to request 'm', a MIG device \(use MigDeviceConfig\)",
    ):
        opaque.select(entries, driver="gpu.nvidia.com", results=[("m", MIG)])


def test_every_config_of_our_driver_is_validated_even_if_unused() -> None:
    """Guards: a bad config of our driver fails even if unused; other drivers' configs are ignored."""
    entries = [
        _entry({"whatever": True}, driver="other.example.com"),
        _entry(_gpu({"strategy": "X"}), requests=("unused",)),
    ]
    with pytest.raises(opaque.ConfigError) as caught:
        opaque.select(entries, driver="gpu.nvidia.com", results=[("gpu", GPU)])
    assert caught.value.index == 1 and caught.value.field == "sharing.strategy"


_MANIFESTS = """\
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: shared-gpu}
spec:
  config:
  - opaque:
      driver: gpu.nvidia.com
      parameters: {apiVersion: resource.nvidia.com/v1beta1, kind: GpuConfig, sharing: {strategy: mps}}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: tuned, namespace: team-a}
spec:
  devices:
    requests:
    - {name: gpu, exactly: {deviceClassName: gpu.nvidia.com}}
    config:
    - opaque: {driver: net.example.com, parameters: {anything: [goes]}}
    - requests: [gpu]
      opaque:
        driver: gpu.nvidia.com
        parameters:
          apiVersion: resource.nvidia.com/v1beta1
          kind: GpuConfig
          sharing: {strategy: TimeSlicing, timeSlicingConfig: {interval: Fast}}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: mig, namespace: team-a}
spec:
  spec:
    devices:
      requests:
      - {name: mig, exactly: {deviceClassName: mig.nvidia.com}}
      config:
      - opaque: {driver: gpu.nvidia.com, parameters: {apiVersion: resource.nvidia.com/v1, kind: MigDeviceConfig}}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: plain, namespace: team-a}
spec:
  devices:
    requests:
    - {name: gpu, exactly: {deviceClassName: gpu.nvidia.com}}
    config:
    - opaque: {driver: gpu.nvidia.com, parameters: {apiVersion: resource.nvidia.com/v1beta1, kind: GpuConfig}}
"""


def test_problems_names_file_object_and_field_of_each_config_the_agent_would_refuse() -> None:
    """Guards: `problems` finds a refused config in a DeviceClass, a ResourceClaim and a ResourceClaimTemplate, each
    with its own path and the agent's message (as the chart's admission policy words it), and passes other drivers'
    configs and good ones."""
    objects = decode.load_text(_MANIFESTS, file="cluster.yaml")
    assert opaque.problems(objects, driver="gpu.nvidia.com") == (
        "cluster.yaml: DeviceClass shared-gpu: spec.config[0].opaque.parameters.sharing.strategy: "
        + _message(_gpu({"strategy": "mps"})),
        "cluster.yaml: ResourceClaim team-a/tuned: spec.devices.config[1].opaque.parameters"
        ".sharing.timeSlicingConfig.interval: "
        + _message(_gpu({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Fast"}})),
        "cluster.yaml: ResourceClaimTemplate team-a/mig: spec.spec.devices.config[0].opaque.parameters"
        ".apiVersion: " + _message({"apiVersion": "resource.nvidia.com/v1", "kind": "MigDeviceConfig"}),
    )
    assert opaque.problems(objects, driver="other.example.com") == ()


def _message(parameters: Any) -> str:
    with pytest.raises(opaque.ConfigError) as caught:
        opaque.decode(parameters)
    return caught.value.message
