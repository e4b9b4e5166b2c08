"""Selector results are shared between devices only when the expression cannot tell them apart."""

from __future__ import annotations

import pytest

from alloc_inputs import allocator, claim, device, picked, request, rslice


def gpus() -> list:
    return [rslice(*(device(f"gpu-{i}", attributes={"uuid": f"GPU-{i}", "model": "a100"}, capacity={"memory": "40Gi"}) for i in range(3)))]


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ('device.attributes["driver-a"].uuid == "GPU-2"', "gpu-2"),
        ('device.attributes["driver-a"].model == "a100" && device.attributes["driver-a"].uuid.endsWith("1")', "gpu-1"),
        ('device.attributes["driver-a"].exists(k, device.attributes["driver-a"][k] == "GPU-2")', "gpu-2"),
        ('cel.bind(a, device.attributes["driver-a"], a.uuid == "GPU-1")', "gpu-1"),
        ('device.attributes["driver-a"]["uu" + "id"].endsWith("2")', "gpu-2"),
    ],
    ids=["named-attribute", "two-attributes", "comprehension", "bind", "computed-subscript"],
)
def test_devices_that_differ_are_evaluated_separately(expression: str, expected: str) -> None:
    """Devices that differ in an attribute the expression can see get their own result."""
    assert picked(allocator(gpus()).allocate([claim("c", request("req-0", "class-a", expression))])) == [[("req-0", expected)]]


def test_identical_devices_share_a_result() -> None:
    """Devices equal in what the expression names all match (results shared, answer unchanged)."""
    outcome = allocator(gpus()).allocate([claim("c", request("req-0", "class-a", 'device.capacity["driver-a"].memory.compareTo(quantity("40Gi")) == 0', count=3))])
    assert [d for _, d in picked(outcome)[0]] == ["gpu-0", "gpu-1", "gpu-2"]


def test_shared_runtime_error_names_the_first_device() -> None:
    """A runtime error shared by identical devices is reported on the first of them."""
    text = allocator(gpus()).allocate([claim("c", request("req-0", "class-a", 'device.attributes["driver-a"].missing == 1'))]).reasons
    assert "driver-a/node-1/gpu-0" in text[0].message
