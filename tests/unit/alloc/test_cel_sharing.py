"""Selector results are shared between devices only when the expression cannot tell them apart."""

from __future__ import annotations

import pytest
from support.alloc_inputs import allocator, claim, picked, request
from support.devices import device, rslice


def gpus() -> list:
    return [
        rslice(
            *(
                device(f"gpu-{i}", attributes={"uuid": f"GPU-{i}", "model": "a100"}, capacity={"memory": "40Gi"})
                for i in range(3)
            )
        )
    ]


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
    assert picked(allocator(gpus()).allocate([claim("c", request("req-0", "class-a", expression))])) == [
        [("req-0", expected)]
    ]


def test_identical_devices_share_a_result() -> None:
    """Devices equal in what the expression names all match (results shared, answer unchanged)."""
    outcome = allocator(gpus()).allocate(
        [
            claim(
                "c",
                request(
                    "req-0", "class-a", 'device.capacity["driver-a"].memory.compareTo(quantity("40Gi")) == 0', count=3
                ),
            )
        ]
    )
    assert [d for _, d in picked(outcome)[0]] == ["gpu-0", "gpu-1", "gpu-2"]


def test_shared_runtime_error_names_the_first_device() -> None:
    """A runtime error shared by identical devices is reported on the first of them."""
    text = (
        allocator(gpus())
        .allocate([claim("c", request("req-0", "class-a", 'device.attributes["driver-a"].missing == 1'))])
        .reasons
    )
    assert "driver-a/node-1/gpu-0" in text[0].message


def two_lookalikes() -> list:
    """gpu-0 {x: "1"} and gpu-1 {x: "1", z: "2"}: equal in x, different as whole maps."""
    return [rslice(device("gpu-0", attributes={"x": "1"}), device("gpu-1", attributes={"x": "1", "z": "2"}))]


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ('{"x": "1"} == device.attributes["driver-a"]', ["gpu-0"]),
        ('{"x": "1"} != device.attributes["driver-a"]', ["gpu-1"]),
        ('device.attributes["driver-a"] == {"x": "1"}', ["gpu-0"]),
        ('dyn(device.attributes["driver-a"]) == {"x": "1"}', ["gpu-0"]),
        ('dyn(device.attributes["driver-a"]).?z.orValue("") == "2"', ["gpu-1"]),
        ('size(device.attributes["driver-a"]) == 1', ["gpu-0"]),
        ('device.attributes["driver-a"].exists(k, k == "z")', ["gpu-1"]),
        ('device.attributes["driver-a"].all(k, k == "x")', ["gpu-0"]),
        ('device.attributes["driver-a"].map(k, k).size() == 2', ["gpu-1"]),
        ('device.attributes["driver-a"].filter(k, k != "x").size() == 0', ["gpu-0"]),
        ('device.attributes["driver-a"][?["z", "x"][0]].orValue("") == "2"', ["gpu-1"]),
        ('cel.bind(m, device.attributes["driver-a"], "z" in m)', ["gpu-1"]),
        ('[device.attributes["driver-a"]][0] == {"x": "1"}', ["gpu-0"]),
    ],
    ids=[
        "map-literal-eq",
        "map-literal-ne",
        "map-literal-eq-right",
        "dyn-eq",
        "dyn-member",
        "size",
        "exists",
        "all",
        "map",
        "filter",
        "computed-key",
        "bind",
        "in-list-literal",
    ],
)
def test_whole_map_uses_are_evaluated_per_device(expression: str, expected: list[str]) -> None:
    """Devices equal in the members an expression names but not as whole maps get their own
    result when the expression uses the whole map (issue 5: a count=2 request got both)."""
    outcome = allocator(two_lookalikes()).allocate([claim("c", request("req-0", "class-a", expression))])
    assert [d for _, d in picked(outcome)[0]] == expected
    both = allocator(two_lookalikes()).allocate([claim("c", request("req-0", "class-a", expression, count=2))])
    assert not both.ok, f"{expression} must not select both devices"
