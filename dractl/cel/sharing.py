"""Which devices a selector cannot tell apart, so that one evaluation serves them all.

What it does: `footprint(expression)` reads the library's checked AST and proves, with an
allow-list, that the expression sees a device only through named entries: `device.driver`,
`device.allowMultipleAllocations`, and `device.attributes[D]` / `device.capacity[D]` where the
domain `D` is a string literal or `device.driver`, each followed at once by a literal member
(`.x`, `["x"]`, `[?"x"]`, `.?x`, `has(...x)` or `"x" in ...`). `Footprint.key(driver, device)`
is then a value such that two devices with equal keys give the expression equal results (and
equal errors). Anything else that touches a device map (a map compared or passed whole, `dyn`,
a comprehension over it, `cel.bind` of it, a computed key, an optional domain) has no footprint:
every device is evaluated on its own.

Why here and not in the allocator: it is a property of CEL text and of how devices are turned
into CEL values (`environment.device_maps`), both of which this package owns; the allocator
only groups devices by the key and caches results.

What it must not do: evaluate expressions, or answer "shareable" for anything it does not
recognise. Unknown shapes and unreadable ASTs give None (no sharing), which is always correct.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import TypeVar

from dractl import model
from dractl.cel import checked, environment, program

_MAPS = {"device.attributes": 0, "device.capacity": 1}
_DRIVER = "device.driver"
_MEMBER_CALLS = frozenset({"_[_]", "_[?_]", "_?._"})
_MISSING = ("missing",)
_Entry = TypeVar("_Entry")


@dataclasses.dataclass(frozen=True, slots=True)
class Footprint:
    """The named attribute and capacity entries an expression reads, as (domain, identifier),
    each once, in a canonical order (so equal reads make equal footprints); a domain of None
    means the device's own driver (`device.attributes[device.driver]`)."""

    attributes: tuple[tuple[str | None, str], ...]
    capacity: tuple[tuple[str | None, str], ...]

    def key(self, driver: str, device: model.Device) -> Hashable:
        """Equal keys imply equal results of the expression. Pure.

        The key holds the driver, the multi-allocation flag and the value (or absence) of
        every entry read, typed so that `1`, `true` and `"1"` differ.
        """
        return self.keys([(driver, device)])[0]

    def keys(self, devices: Iterable[tuple[str, model.Device]]) -> list[Hashable]:
        """`key` of every (driver, device), in order. Pure.

        Only the entries read are looked up and converted: building the device's whole maps
        (`environment.device_maps`) for every device costs more than evaluating most selectors.
        Decoded devices share their equal attribute and capacity values, so each value object
        is converted once per call.
        """
        # By the id of a value object, the object (held, so that its id is not reused during
        # the call) and its image.
        images: dict[int, tuple[object, Hashable]] = {}
        return [
            (
                driver,
                device.allow_multiple_allocations,
                tuple(
                    _image(device.attributes, driver, entry, convert=environment.attribute_value, images=images)
                    for entry in self.attributes
                ),
                tuple(
                    _image(device.capacity, driver, entry, convert=_capacity_value, images=images)
                    for entry in self.capacity
                ),
            )
            for driver, device in devices
        ]


@functools.lru_cache(maxsize=4096)
def footprint(expression: str) -> Footprint | None:
    """The footprint of a selector, or None when its result may depend on more than named
    entries (or the expression does not compile). Pure; cached by text."""
    try:
        root = program.compile(expression).ast
    except program.CompileError:
        return None
    reads: tuple[set[tuple[str | None, str]], set[tuple[str | None, str]]] = (set(), set())
    if not _visit(root, reads):
        return None
    return Footprint(attributes=tuple(sorted(reads[0], key=_order)), capacity=tuple(sorted(reads[1], key=_order)))


def _domain(node: checked.Node) -> tuple[int, str | None] | None:
    """(map, domain) when `node` is `device.attributes[D]` or `device.capacity[D]` with a
    literal domain (or `device.driver`, given as None)."""
    if not (isinstance(node, checked.Call) and node.function == "_[_]" and node.target is None and len(node.args) == 2):
        return None
    container, key = node.args
    if not (isinstance(container, checked.Ident) and container.name in _MAPS):
        return None
    if isinstance(key, checked.Const) and isinstance(key.value, str):
        return _MAPS[container.name], key.value
    if isinstance(key, checked.Ident) and key.name == _DRIVER:
        return _MAPS[container.name], None
    return None


def _member(node: checked.Node) -> tuple[int, str | None, str] | None:
    """(map, domain, identifier) when `node` reads one literal member of a domain lookup."""
    if isinstance(node, checked.Select):
        found = _domain(node.operand)
        return None if found is None else (*found, node.field)
    if not isinstance(node, checked.Call) or node.target is not None or len(node.args) != 2:
        return None
    if node.function in _MEMBER_CALLS:
        lookup, name = node.args
    elif node.function == "@in":
        name, lookup = node.args
    else:
        return None
    found = _domain(lookup)
    if found is None or not (isinstance(name, checked.Const) and isinstance(name.value, str)):
        return None
    return (*found, name.value)


def _visit(node: checked.Node, reads: tuple[set[tuple[str | None, str]], set[tuple[str | None, str]]]) -> bool:
    """Record the members `node` reads; False when it uses a device map any other way."""
    member = _member(node)
    if member is not None:
        reads[member[0]].add((member[1], member[2]))
        return True
    if isinstance(node, checked.Ident):
        return node.name not in _MAPS
    if isinstance(node, checked.Const):
        return True
    if isinstance(node, checked.Select):
        return _visit(node.operand, reads)
    if isinstance(node, checked.Call):
        parts = node.args if node.target is None else (node.target, *node.args)
        return all(_visit(part, reads) for part in parts)
    if isinstance(node, checked.ListLit):
        return all(_visit(element, reads) for element in node.elements)
    if isinstance(node, checked.MapLit):
        return all(_visit(part, reads) for key, value in node.entries for part in (key, value) if part is not None)
    return all(
        _visit(part, reads)
        for part in (node.iter_range, node.accu_init, node.loop_condition, node.loop_step, node.result)
    )


def _order(entry: tuple[str | None, str]) -> tuple[str, str]:
    return (entry[0] or "", entry[1]) if entry[0] is not None else ("\x00", entry[1])


def _image(
    entries: Mapping[str, _Entry],
    driver: str,
    entry: tuple[str | None, str],
    *,
    convert: Callable[[_Entry], object],
    images: dict[int, tuple[object, Hashable]],
) -> Hashable:
    """The typed image of the attribute or capacity `entry` names in `entries` (`_MISSING` when
    there is none), its CEL value made by `convert`; each value object is converted once per
    `images`."""
    value = _named(entries, driver, entry)
    if value is None:
        return _MISSING
    found = images.get(id(value))
    if found is None:
        found = images[id(value)] = (value, _hashable(convert(value)))
    return found[1]


def _capacity_value(capacity: model.DeviceCapacity) -> object:
    """One capacity as CEL sees it: a quantity."""
    return environment.quantity_message(capacity.value.value)


def _named(entries: Mapping[str, _Entry], driver: str, entry: tuple[str | None, str]) -> _Entry | None:
    """The device's attribute or capacity that `environment.device_maps` puts at (domain,
    identifier), or None. Pure. A name `domain/id` splits at its first slash and a name
    without one belongs to the driver's domain, so at most two names land on one entry; when
    both are given, the later one in the device's order wins, as it does in the maps."""
    domain = driver if entry[0] is None else entry[0]
    identifier = entry[1]
    qualified = f"{domain}/{identifier}"
    by_domain = entries.get(qualified) if "/" not in domain else None
    plain = entries.get(identifier) if domain == driver and "/" not in identifier else None
    if by_domain is not None and plain is not None:
        names = list(entries)
        return by_domain if names.index(qualified) > names.index(identifier) else plain
    return by_domain if by_domain is not None else plain


def _hashable(value: object) -> Hashable:
    """A typed, hashable image of an input value: equal images mean equal CEL values."""
    if isinstance(value, list):
        return ("list", tuple(_hashable(item) for item in value))
    if environment.is_quantity_value(value):
        return ("quantity", environment.message_text(value))
    if environment.is_semver_value(value):
        return ("semver", environment.message_text(value))
    return (type(value).__name__, value)
