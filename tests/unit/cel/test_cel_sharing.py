"""`cel.sharing.footprint`: which expressions may share one result between devices.

The allow-list is proved from the library's checked AST; the allocator's tests
(tests/unit/alloc/test_cel_sharing.py) and the property tests check the answers it leads to.
"""

from __future__ import annotations

import pytest
from support import devices

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
        return footprint.key(D, devices.device("d", attributes={"x": values[0]} if values else {}))

    assert len({key(1), key(True), key("1"), key()}) == 4
    assert key(1) == key(1)


def _key_from_maps(footprint: cel.sharing.Footprint, driver: str, device: model.Device) -> object:
    """The key as the maps CEL evaluates define it: each entry read, looked up in `device_maps`."""
    maps = cel.environment.device_maps(driver, device)

    def image(values: cel.environment.DomainMaps, entry: tuple[str | None, str]) -> object:
        found = values.get(driver if entry[0] is None else entry[0], {})
        return cel.sharing._MISSING if entry[1] not in found else cel.sharing._hashable(found[entry[1]])

    def ordered(entries: tuple[tuple[str | None, str], ...]) -> list[tuple[str | None, str]]:
        return sorted(entries, key=cel.sharing._order)

    return (
        driver,
        device.allow_multiple_allocations,
        tuple(image(maps[0], entry) for entry in ordered(footprint.attributes)),
        tuple(image(maps[1], entry) for entry in ordered(footprint.capacity)),
    )


@pytest.mark.parametrize(
    "names",
    [
        ("model",),
        (f"{D}/model",),
        ("model", f"{D}/model"),
        (f"{D}/model", "model"),
        ("other.com/model",),
        ("model", "other.com/model"),
        (),
    ],
    ids=["plain", "qualified", "plain-then-qualified", "qualified-then-plain", "other-domain", "both-domains", "none"],
)
def test_keys_read_entries_as_the_cel_maps_hold_them(names: tuple[str, ...]) -> None:
    """A key looks up only the entries read, yet equals the key read from the whole CEL maps:
    a plain name belongs to the driver's domain, and when a device spells one entry both ways
    the later spelling wins, for attributes and capacity alike."""
    footprint = cel.sharing.footprint(
        f'device.attributes["{D}"].model == "a" && device.attributes["other.com"].model == "b" && '
        f'device.attributes[device.driver].model == "c" && '
        f'device.capacity["{D}"].model.compareTo(quantity("1")) >= 0'
    )
    assert footprint is not None
    attributes = {name: f"value-{i}" for i, name in enumerate(names)}
    capacity = {name: f"{i + 1}" for i, name in enumerate(names)}
    for driver in (D, "other.com"):
        device = devices.device("d", attributes=attributes, capacity=capacity)
        assert footprint.key(driver, device) == _key_from_maps(footprint, driver, device)


def test_keys_of_many_devices_match_the_cel_maps() -> None:
    """The batch form converts each shared value object once, yet gives every device the key
    its own maps give: shared and distinct values, absent entries, and two drivers."""
    footprint = cel.sharing.footprint(
        f'device.attributes["{D}"].model == "a" && device.capacity["{D}"].memory.compareTo(quantity("1")) >= 0'
    )
    assert footprint is not None
    shared_model = model.DeviceAttribute(model.AttributeKind.STRING, ("a100",))
    shared_memory = model.DeviceCapacity(value=model.quantity.parse("80Gi"))
    devices = [
        (D, model.Device(name="a", attributes={"model": shared_model}, capacity={"memory": shared_memory})),
        (D, model.Device(name="b", attributes={"model": shared_model}, capacity={"memory": shared_memory})),
        (
            D,
            model.Device(
                name="c",
                attributes={"model": model.DeviceAttribute(model.AttributeKind.STRING, ("h100",))},
                capacity={"memory": model.DeviceCapacity(value=model.quantity.parse("40Gi"))},
            ),
        ),
        (D, model.Device(name="d")),
        ("other.com", model.Device(name="e", attributes={"model": shared_model}, capacity={"memory": shared_memory})),
    ]
    keys = footprint.keys(devices)
    assert keys == [_key_from_maps(footprint, driver, device) for driver, device in devices]
    assert len(set(keys)) == 4
