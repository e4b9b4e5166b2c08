"""`cel.sharing.footprint`: which expressions may share one result between devices.

The allow-list is proved from the library's checked AST; the allocator's tests
(tests/unit/alloc/test_cel_sharing.py) and the property tests check the answers it leads to.
"""

from __future__ import annotations

import pytest

from dractl import cel, model

D = "gpu.nvidia.com"


@pytest.mark.parametrize(
    ("expression", "attributes", "capacity"),
    [
        (f'device.attributes["{D}"].model == "a100"', {(D, "model")}, set()),
        (f'device.attributes["{D}"]["model"] == "a100"', {(D, "model")}, set()),
        (f'device.attributes["{D}"].?model.orValue("") == "a100"', {(D, "model")}, set()),
        (f'has(device.attributes["{D}"].model)', {(D, "model")}, set()),
        (f'"model" in device.attributes["{D}"]', {(D, "model")}, set()),
        ('device.attributes[device.driver].numa == 0 && device.driver == "x"', {(None, "numa")}, set()),
        (f'device.capacity["{D}"].memory.compareTo(quantity("40Gi")) >= 0', set(), {(D, "memory")}),
        (
            f'device.attributes["{D}"].tags.exists(t, t == "fast") && device.allowMultipleAllocations',
            {(D, "tags")},
            set(),
        ),
    ],
    ids=["member", "index", "optional", "has", "in", "driver-domain", "capacity", "comprehension-over-a-member"],
)
def test_named_members_have_a_footprint(
    expression: str, attributes: set[tuple[str | None, str]], capacity: set[tuple[str | None, str]]
) -> None:
    """Expressions that read only literal members of literal (or driver) domains are shareable,
    and their footprint lists exactly those members."""
    found = cel.sharing.footprint(expression)
    assert found is not None
    assert (set(found.attributes), set(found.capacity)) == (attributes, capacity)


@pytest.mark.parametrize(
    "expression",
    [
        f'{{"x": "1"}} == device.attributes["{D}"]',
        f'device.attributes["{D}"] != {{}}',
        f'dyn(device.attributes["{D}"]).x == 1',
        f'size(device.attributes["{D}"]) > 1',
        f'device.attributes["{D}"].exists(k, k == "x")',
        f'device.attributes["{D}"].all(k, true)',
        f'device.attributes["{D}"].map(k, k).size() > 0',
        f'device.attributes["{D}"].filter(k, true).size() > 0',
        f'device.attributes["{D}"]["mo" + "del"] == "a100"',
        'device.attributes["gpu" + ".nvidia.com"].model == "a100"',
        f'cel.bind(a, device.attributes["{D}"], a.model == "a100")',
        f'"{D}" in device.attributes',
        'device.capacity.exists(d, d == "x")',
        "not valid CEL (",
    ],
    ids=[
        "map-literal-eq",
        "map-ne",
        "dyn",
        "size",
        "exists",
        "all",
        "map",
        "filter",
        "computed-key",
        "computed-domain",
        "bind",
        "domain-in",
        "domain-comprehension",
        "invalid",
    ],
)
def test_whole_map_uses_have_no_footprint(expression: str) -> None:
    """Anything that uses a device map beyond one literal member (or does not compile) is
    evaluated per device."""
    assert cel.sharing.footprint(expression) is None


def test_keys_tell_types_and_absence_apart() -> None:
    """Keys differ for 1, true and "1", and for an absent attribute."""
    footprint = cel.sharing.footprint(f'device.attributes["{D}"].x == 1')
    assert footprint is not None

    def key(*values: object) -> object:
        kinds = {bool: model.AttributeKind.BOOL, int: model.AttributeKind.INT, str: model.AttributeKind.STRING}
        attributes = {"x": model.DeviceAttribute(kinds[type(values[0])], values)} if values else {}
        return footprint.key(D, model.Device(name="d", attributes=attributes))

    assert len({key(1), key(True), key("1"), key()}) == 4
    assert key(1) == key(1)
