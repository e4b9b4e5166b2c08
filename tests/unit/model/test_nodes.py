"""Node selectors, where slices and devices are usable, node discovery and pool gathering (`model.nodes`)."""

from __future__ import annotations

import pytest
from support import devices

from dractl import model
from dractl.model import nodes

DRIVER = "gpu.example.com"


def _selector(*terms: model.NodeSelectorTerm) -> model.NodeSelector:
    return model.NodeSelector(terms=terms)


def _expr(key: str, operator: str, *values: str) -> model.NodeSelectorTerm:
    return model.NodeSelectorTerm(
        match_expressions=(model.NodeSelectorRequirement(key=key, operator=operator, values=values),)
    )


def _field(operator: str, *values: str, key: str = "metadata.name") -> model.NodeSelectorTerm:
    return model.NodeSelectorTerm(
        match_fields=(model.NodeSelectorRequirement(key=key, operator=operator, values=values),)
    )


def _named(node: str) -> model.NodeSelector:
    return _selector(_field("In", node))


def _slice(
    name: str,
    *device_names: str,
    pool: str = "pool",
    generation: int = 1,
    count: int = 1,
    node: str | None = None,
    selector: model.NodeSelector | None = None,
    all_nodes: bool = False,
) -> model.ResourceSlice:
    return devices.rslice(
        *(devices.device(d) for d in device_names),
        name=name,
        node=node,
        driver=DRIVER,
        pool=pool,
        generation=generation,
        count=count,
        node_selector=selector,
        all_nodes=all_nodes,
    )


def _per_device(*devs: model.Device) -> model.ResourceSlice:
    """Slice and pool "p" (generation 0) with perDeviceNodeSelection: each device says where it is usable."""
    return devices.rslice(
        *devs, name="p", node=None, driver=DRIVER, pool="p", generation=0, per_device_node_selection=True
    )


LABELS = {"zone": "a", "gpus": "8"}


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        (_selector(_expr("zone", "In", "a", "b")), True),
        (_selector(_expr("zone", "In", "b")), False),
        (_selector(_expr("zone", "NotIn", "b")), True),
        (_selector(_expr("missing", "NotIn", "b")), True),
        (_selector(_expr("zone", "Exists")), True),
        (_selector(_expr("zone", "DoesNotExist")), False),
        (_selector(_expr("gpus", "Gt", "4")), True),
        (_selector(_expr("gpus", "Lt", "4")), False),
        (_selector(_expr("zone", "Gt", "4")), False),
        (_selector(_expr("gpus", "Gt", " 4")), False),
        (_selector(_expr("gpus", "Gt", "4_0")), False),
        (_selector(_expr("gpus", "Gt", "4", "5")), False),
        (_selector(_expr("zone", "In")), False),
        (_selector(_expr("zone", "Exists", "a")), False),
        (_selector(_expr("zone", "Near", "a")), False),
        (_selector(_expr("zone", "In", "b"), _expr("gpus", "Exists")), True),
        (_selector(model.NodeSelectorTerm()), False),
        (_named("node-1"), True),
        (_named("node-2"), False),
        (_selector(_field("NotIn", "node-2")), True),
        (_selector(_field("In", "node-1", "node-2")), False),
        (_selector(_field("Exists")), False),
        (_selector(_field("In", "a", key="metadata.namespace")), False),
        (_selector(_field("NotIn", "a", key="spec.unschedulable")), False),
    ],
    ids=[
        "in",
        "not-in-values",
        "notin",
        "notin-absent-key",
        "exists",
        "does-not-exist",
        "gt",
        "lt",
        "gt-non-integer",
        "gt-space-is-not-an-integer",
        "gt-underscore-is-not-an-integer",
        "gt-two-values",
        "in-without-values",
        "exists-with-values",
        "unknown-operator",
        "terms-ored",
        "empty-term-selects-nothing",
        "match-fields-name",
        "match-fields-other-name",
        "match-fields-notin",
        "match-fields-two-values",
        "match-fields-exists",
        "match-fields-other-field",
        "match-fields-other-field-notin",
    ],
)
def test_selector_matches_like_core_v1(selector: model.NodeSelector, expected: bool) -> None:
    """Guards: NodeSelector semantics of core/v1: ORed terms, ANDed requirements, each operator's value count, integer
    Gt/Lt as strconv parses them, matchFields only on metadata.name with In/NotIn and one value."""
    assert nodes.selector_matches(selector, name="node-1", labels=LABELS) is expected


def test_named_nodes_only_for_selectors_that_pin_names() -> None:
    """Guards: named_nodes lists the names of metadata.name In terms, skips empty terms, and is None when a term selects
    by labels."""
    assert nodes.named_nodes(_selector(_field("In", "b"), _field("In", "a"), model.NodeSelectorTerm())) == ("b", "a")
    assert nodes.named_nodes(_selector(_field("In", "b"), _expr("zone", "Exists"))) is None
    assert nodes.named_nodes(_selector(_field("NotIn", "b"))) is None


def test_slice_and_device_selection() -> None:
    """Guards: nodeName, allNodes, nodeSelector and perDeviceNodeSelection decide where a slice is relevant; an
    anonymous node only gets allNodes."""
    on_a = _slice("a", "d", node="node-a")
    everywhere = _slice("e", "d", all_nodes=True)
    zoned = _slice("z", "d", selector=_selector(_expr("zone", "In", "a")))
    per_device = _per_device(devices.device("x", node_name="node-b"))
    unselected = _slice("u", "d")
    assert [
        nodes.slice_selects(s, name="node-a", labels=LABELS) for s in (on_a, everywhere, zoned, per_device, unselected)
    ] == [True, True, True, False, False]
    assert [
        nodes.slice_selects(s, name="node-b", labels={}) for s in (on_a, everywhere, zoned, per_device, unselected)
    ] == [False, True, False, True, False]
    assert [nodes.slice_selects(s, name=None, labels={}) for s in (on_a, everywhere, zoned, per_device)] == [
        False,
        True,
        False,
        False,
    ]


def test_discover_prefers_node_objects() -> None:
    """Guards: Node objects are the nodes, with their labels, sorted; slices then add no names."""
    found = nodes.discover(
        nodes=[
            model.Node(meta=model.ObjectMeta(name="n2", labels={"a": "b"})),
            model.Node(meta=model.ObjectMeta(name="n1")),
        ],
        slices=[_slice("s", "d", node="elsewhere")],
    )
    assert (found.names, found.has_nodes, found.labels_of("n2"), found.labels_of("n1")) == (
        ("n1", "n2"),
        True,
        {"a": "b"},
        {},
    )


def test_discover_without_nodes_takes_every_name_a_slice_gives() -> None:
    """Guards: without Node objects the nodes are slice nodeNames,
    per-device nodeNames and metadata.name In values of selectors."""
    per_device = _per_device(
        devices.device("x", node_name="node-d"), devices.device("y", node_selector=_named("node-e"))
    )
    slices = [
        _slice("a", "d", node="node-b"),
        _slice("s", "d", selector=_named("node-c")),
        _slice("z", "d", selector=_selector(_expr("zone", "Exists"))),
        per_device,
    ]
    found = nodes.discover(nodes=[], slices=slices)
    assert (found.names, found.has_nodes) == (("node-b", "node-c", "node-d", "node-e"), False)


def test_complete_pool_is_usable_with_sorted_slices() -> None:
    """Guards: a pool whose slices are all published is usable; its slices are sorted by name and the same Pool object
    is returned for the same generation."""
    slices = [_slice("s2", "d2", count=2), _slice("s1", "d1", count=2)]
    pools = nodes.Pools(slices)
    view = pools.view(slices)
    assert view.problems == ()
    (usable,) = view.usable
    assert [s.meta.name for s in usable.pool.slices] == ["s1", "s2"]
    assert usable.pool is pools.pool((DRIVER, "pool"), 1)
    assert usable.pool.device("d2") is not None and usable.pool.device("d9") is None


def test_incomplete_newest_generation_is_a_problem_even_when_an_older_one_is_complete() -> None:
    """Guards: upstream never falls back to an older generation:
    1 of 2 slices of generation 2 makes the pool incomplete."""
    slices = [_slice("old", "d1", generation=1), _slice("new", "d2", generation=2, count=2)]
    view = nodes.Pools(slices).current()
    assert view.usable == ()
    assert [p.message() for p in view.problems] == [
        f"resource pool {DRIVER}/pool is currently being updated: 1 of 2 slices of generation 2 are published"
    ]


def test_node_sees_an_old_complete_generation_while_another_node_sees_the_new_one() -> None:
    """Guards: per node the highest generation among its own slices counts; complete there means usable, even if newer
    ones exist elsewhere."""
    old = _slice("old", "d1", node="node-1", generation=1)
    new = _slice("new", "d2", node="node-2", generation=2)
    pools = nodes.Pools([old, new])
    assert [u.pool.generation for u in pools.view([old]).usable] == [1]
    assert [u.pool.generation for u in pools.view([new]).usable] == [2]


def test_obsolete_incomplete_generation_is_dropped_silently() -> None:
    """Guards: an incomplete generation with a newer one elsewhere is obsolete: neither usable nor a problem."""
    stale = _slice("s1", "d1", node="node-1", generation=1, count=2)
    newer = _slice("s2", "d2", node="node-2", generation=2, count=2)
    assert nodes.Pools([stale, newer]).view([stale]) == nodes.View(usable=(), problems=())


def test_invalid_pool_is_a_problem() -> None:
    """Guards: a device listed twice in one pool generation makes the pool invalid, with the device named."""
    slices = [_slice("a", "d1", count=2), _slice("b", "d1", count=2)]
    (problem,) = nodes.Pools(slices).current().problems
    assert problem.message() == f"resource pool {DRIVER}/pool is invalid: device 'd1' is listed more than once"


def test_pools_of_two_drivers_with_one_name_are_distinct() -> None:
    """Guards: pools are keyed by (driver, name): the same pool name under two drivers gives two pools."""
    a = _slice("a", "d1")
    b = devices.rslice(devices.device("d1"), name="b", node=None, driver="other.example.com", pool="pool", generation=0)
    assert [u.pool.key for u in nodes.Pools([a, b]).current().usable] == [
        (DRIVER, "pool"),
        ("other.example.com", "pool"),
    ]
