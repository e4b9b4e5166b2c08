"""Devices for the CEL tests: an NVIDIA A100 as the NVIDIA DRA driver publishes it, and a fixture that builds inputs."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import pytest
from support import devices

from dractl import cel, model

DRIVER = "gpu.nvidia.com"
Attr = model.DeviceAttribute


A100_ATTRIBUTES = {
    "type": devices.attr("gpu"),
    "productName": devices.attr("NVIDIA A100-SXM4-80GB"),
    "architecture": devices.attr("Ampere"),
    "cudaComputeCapability": devices.attr("v:8.0.0"),
    "driverVersion": devices.attr("v:580.126.20"),
    "index": devices.attr(3),
    "migCapable": devices.attr(True),
    "resource.kubernetes.io/pcieRoot": devices.attr("pci0000:64"),
    "resource.kubernetes.io/numaNode": devices.attr([0, 1]),
    "example.com/versions": devices.attr(["v:1.2.3", "v:2.0.0-rc.1"]),
    "example.com/tags": devices.attr(["fast", "big"]),
}
A100_CAPACITY = {"memory": "80Gi", "multiprocessors": "108", "example.com/power": "400500m"}


@pytest.fixture
def gpu() -> cel.DeviceInput:
    """An A100 80GB from driver gpu.nvidia.com, with a few qualified and list attributes."""
    return cel.device_input(DRIVER, devices.device("gpu-0", attributes=A100_ATTRIBUTES, capacity=A100_CAPACITY))


@pytest.fixture
def make_input() -> Callable[..., cel.DeviceInput]:
    """Build a DeviceInput from plain attribute and capacity mappings."""

    def build(
        attributes: Mapping[str, Attr] | None = None,
        capacity: Mapping[str, str] | None = None,
        *,
        driver: str = DRIVER,
        multiple: bool = False,
    ) -> cel.DeviceInput:
        return cel.device_input(
            driver, devices.device("dev-0", attributes=attributes or {}, capacity=capacity or {}, multi=multiple)
        )

    return build


@pytest.fixture
def check(gpu: cel.DeviceInput) -> Callable[[str], bool]:
    """Compile an expression and evaluate it on the A100."""
    return lambda expression: cel.compile(expression).matches(gpu)
