"""The committed gRPC stubs: regenerated output is identical, and the wire names match upstream's."""

from __future__ import annotations

import importlib.util
import pathlib
import subprocess
import sys
from typing import Any

import pytest

from dractl._proto import (
    dra_v1_pb2,
    dra_v1beta1_pb2,
    health_v1_pb2,
    health_v1alpha1_pb2,
    pluginregistration_pb2,
)

ROOT = pathlib.Path(__file__).resolve().parents[3]
PROTO_DIR = ROOT / "dractl" / "_proto"


def test_regenerating_the_stubs_changes_nothing(tmp_path: pathlib.Path) -> None:
    """Guards: the committed *_pb2*.py/.pyi files are exactly what tools/gen_proto.py writes from the .proto files."""
    if importlib.util.find_spec("grpc_tools") is None:
        pytest.skip("grpcio-tools is missing: pip install -e '.[test]'")
    completed = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gen_proto.py"), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    generated = {p.name: p.read_bytes() for p in (tmp_path / "dractl" / "_proto").iterdir()}
    committed = {p.name: p.read_bytes() for p in PROTO_DIR.iterdir() if "_pb2" in p.name and p.is_file()}
    assert sorted(generated) == sorted(committed)
    changed = [name for name in generated if generated[name] != committed[name]]
    assert changed == []


@pytest.mark.parametrize(
    ("module", "service", "methods"),
    [
        (pluginregistration_pb2, "pluginregistration.Registration", ["GetInfo", "NotifyRegistrationStatus"]),
        (dra_v1_pb2, "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin", ["NodePrepareResources", "NodeUnprepareResources"]),
        (
            dra_v1beta1_pb2,
            "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin",
            ["NodePrepareResources", "NodeUnprepareResources"],
        ),
        (health_v1_pb2, "v1.DRAResourceHealth", ["NodeWatchResources"]),
        (health_v1alpha1_pb2, "v1alpha1.DRAResourceHealth", ["NodeWatchResources"]),
    ],
    ids=["registration", "dra-v1", "dra-v1beta1", "health-v1", "health-v1alpha1"],
)
def test_service_and_method_names_are_upstreams(module: object, service: str, methods: list[str]) -> None:
    """Guards: the full gRPC service names (hence the method paths the kubelet calls) are exactly upstream's."""
    services = list(module.DESCRIPTOR.services_by_name.values())  # type: ignore[attr-defined]
    assert [s.full_name for s in services] == [service]
    assert [m.name for m in services[0].methods] == methods


def _fields(message: object) -> dict[str, tuple[int, bool]]:
    descriptor = message.DESCRIPTOR  # type: ignore[attr-defined]
    return {f.name: (f.number, f.has_presence) for f in descriptor.fields}


def test_registration_field_numbers() -> None:
    """Guards: PluginInfo and RegistrationStatus field numbers match research/kubelet-plugin.md 1.2."""
    assert {k: n for k, (n, _) in _fields(pluginregistration_pb2.PluginInfo).items()} == {
        "type": 1,
        "name": 2,
        "endpoint": 3,
        "supported_versions": 4,
    }
    assert {k: n for k, (n, _) in _fields(pluginregistration_pb2.RegistrationStatus).items()} == {
        "plugin_registered": 1,
        "error": 2,
    }


@pytest.mark.parametrize("module", [dra_v1_pb2, dra_v1beta1_pb2], ids=["v1", "v1beta1"])
def test_dra_field_numbers(module: Any) -> None:
    """Guards: Claim, Device and the response messages keep upstream's field numbers in both versions."""
    m = module
    assert {k: n for k, (n, _) in _fields(m.Claim).items()} == {"namespace": 1, "uid": 2, "name": 3}
    assert {k: n for k, (n, _) in _fields(m.NodePrepareResourceResponse).items()} == {"devices": 1, "error": 2}
    assert {k: n for k, (n, _) in _fields(m.NodeUnprepareResourceResponse).items()} == {"error": 1}
    prepare_response = m.NodePrepareResourcesResponse.DESCRIPTOR.fields_by_name["claims"]
    assert prepare_response.number == 1 and prepare_response.message_type.GetOptions().map_entry


def test_share_id_is_an_optional_field_5_in_v1_only() -> None:
    """Guards: v1 Device.share_id is field 5 with explicit presence (proto3 optional); v1beta1 has no field 5."""
    assert _fields(dra_v1_pb2.Device) == {
        "request_names": (1, False),
        "pool_name": (2, False),
        "device_name": (3, False),
        "cdi_device_ids": (4, False),
        "share_id": (5, True),
    }
    assert "share_id" not in _fields(dra_v1beta1_pb2.Device)
    device = dra_v1_pb2.Device(share_id="")
    assert device.HasField("share_id")


@pytest.mark.parametrize("module", [health_v1_pb2, health_v1alpha1_pb2], ids=["v1", "v1alpha1"])
def test_health_field_numbers(module: Any) -> None:
    """Guards: DeviceHealth's fields and the HealthStatus values match research/kubelet-plugin.md 2.4."""
    m = module
    assert {k: n for k, (n, _) in _fields(m.DeviceHealth).items()} == {
        "device": 1,
        "health": 2,
        "last_updated_time": 3,
        "health_check_timeout_seconds": 4,
        "message": 5,
    }
    assert {k: n for k, (n, _) in _fields(m.DeviceIdentifier).items()} == {"pool_name": 1, "device_name": 2}
    assert dict(m.HealthStatus.items()) == {"UNKNOWN": 0, "HEALTHY": 1, "UNHEALTHY": 2}
