"""Devices for the CEL tests: an NVIDIA A100 as the NVIDIA DRA driver publishes it, and a builder."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import pytest

from dractl import cel, model

DRIVER = "gpu.nvidia.com"
Attr = model.DeviceAttribute
Kind = model.AttributeKind


def _device(
    name: str, attributes: Mapping[str, Attr], capacity: Mapping[str, str], *, multiple: bool = False
) -> model.Device:
    return model.Device(
        name=name,
        attributes=dict(attributes),
        capacity={key: model.DeviceCapacity(model.quantity.parse(value)) for key, value in capacity.items()},
        allow_multiple_allocations=multiple,
    )


A100_ATTRIBUTES = {
    "type": Attr(Kind.STRING, ("gpu",)),
    "productName": Attr(Kind.STRING, ("NVIDIA A100-SXM4-80GB",)),
    "architecture": Attr(Kind.STRING, ("Ampere",)),
    "cudaComputeCapability": Attr(Kind.VERSION, (model.semver.parse("8.0.0"),), texts=("8.0.0",)),
    "driverVersion": Attr(Kind.VERSION, (model.semver.parse("580.126.20"),), texts=("580.126.20",)),
    "index": Attr(Kind.INT, (3,)),
    "migCapable": Attr(Kind.BOOL, (True,)),
    "resource.kubernetes.io/pcieRoot": Attr(Kind.STRING, ("pci0000:64",)),
    "resource.kubernetes.io/numaNode": Attr(Kind.INT, (0, 1), is_list=True),
    "example.com/versions": Attr(
        Kind.VERSION,
        (model.semver.parse("1.2.3"), model.semver.parse("2.0.0-rc.1")),
        is_list=True,
        texts=("1.2.3", "2.0.0-rc.1"),
    ),
    "example.com/tags": Attr(Kind.STRING, ("fast", "big"), is_list=True),
}
A100_CAPACITY = {"memory": "80Gi", "multiprocessors": "108", "example.com/power": "400500m"}


@pytest.fixture
def gpu() -> cel.DeviceInput:
    """An A100 80GB from driver gpu.nvidia.com, with a few qualified and list attributes."""
    return cel.device_input(DRIVER, _device("gpu-0", A100_ATTRIBUTES, A100_CAPACITY))


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
        return cel.device_input(driver, _device("dev-0", attributes or {}, capacity or {}, multiple=multiple))

    return build


@pytest.fixture
def check(gpu: cel.DeviceInput) -> Callable[[str], bool]:
    """Compile an expression and evaluate it on the A100."""
    return lambda expression: cel.compile(expression).matches(gpu)
