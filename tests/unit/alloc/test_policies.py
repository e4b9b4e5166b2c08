"""Policies: first-fit reproduces upstream's order exactly; binpack packs nodes and GPUs,
keeps PCIe roots together and keeps large MIG profiles placeable."""

from __future__ import annotations

import pytest
from support.alloc_inputs import allocator, claim, held, match, memory_at_least, picked, request
from support.devices import counter_set, device, device_class, partitioned, rslice

from dractl import alloc

FIRST_FIT = alloc.Policy.FIRST_FIT
BINPACK = alloc.Policy.BINPACK


def two_nodes() -> list:
    return [rslice(device("a-1"), device("a-2"), node="node-1"), rslice(device("b-1"), device("b-2"), node="node-2")]


def test_first_fit_order() -> None:
    """First-fit: nodes by name, devices as listed, each claim takes the first free device."""
    a = allocator([rslice(device("z"), device("y"), node="node-b"), rslice(device("x"), node="node-a")])
    got = [(a.allocate([claim(f"c{i}")]).node, i) for i in range(3)]
    assert got == [("node-a", 0), ("node-b", 1), ("node-b", 2)]


def test_first_fit_ignores_usage() -> None:
    """First-fit takes node-1 even when node-2 is partly used."""
    outcome = allocator(two_nodes(), allocated=[held("x", "b-1", pool="node-2")], policy=FIRST_FIT).allocate([claim()])
    assert outcome.node == "node-1"


def test_binpack_prefers_used_nodes() -> None:
    """Binpack puts the claim on the partly used node."""
    outcome = allocator(two_nodes(), allocated=[held("x", "b-1", pool="node-2")], policy=BINPACK).allocate([claim()])
    assert outcome.node == "node-2" and picked(outcome) == [[("req-0", "b-2")]]


def test_binpack_fills_a_node_before_the_next() -> None:
    """Successive binpack claims fill one node first, ties broken by node name."""
    a = allocator(two_nodes(), policy=BINPACK)
    assert [a.allocate([claim(f"c{i}")]).node for i in range(4)] == ["node-1", "node-1", "node-2", "node-2"]


def pcie_node() -> list:
    return [
        rslice(*(device(f"gpu-{i}", attributes={"resource.kubernetes.io/pcieRoot": f"pci-{i // 2}"}) for i in range(4)))
    ]


@pytest.mark.parametrize(("policy", "expected"), [(FIRST_FIT, ["gpu-1", "gpu-2"]), (BINPACK, ["gpu-2", "gpu-3"])])
def test_keeps_pcie_root(policy: alloc.Policy, expected: list[str]) -> None:
    """A two-GPU request stays on one PCIe root under binpack; first-fit straddles."""
    outcome = allocator(pcie_node(), allocated=[held("x", "gpu-0")], policy=policy).allocate(
        [claim("c", request(count=2))]
    )
    assert [d for _, d in picked(outcome)[0]] == expected


def test_binpack_single_gpu_fills_broken_pcie_root() -> None:
    """A one-GPU request goes to the root that is already broken, keeping the other whole."""
    outcome = allocator(pcie_node(), allocated=[held("x", "gpu-2")], policy=BINPACK).allocate([claim()])
    assert picked(outcome) == [[("req-0", "gpu-3")]]


def mig_gpu(g: int) -> list:
    slices = {f"s{i}": 1 for i in range(8)}
    devs = [
        device(
            f"gpu-{g}-4g-{s}",
            attributes={"profile": "4g"},
            consumes={f"gpu-{g}": {f"s{i}": 1 for i in range(s, s + 4)}},
        )
        for s in (0, 4)
    ]
    devs += [
        device(f"gpu-{g}-1g-{s}", attributes={"profile": "1g"}, consumes={f"gpu-{g}": {f"s{s}": 1}}) for s in range(8)
    ]
    return [counter_set(f"gpu-{g}", **slices)], devs


def mig_slices(gpus: int) -> list:
    sets, devs = [], []
    for g in range(gpus):
        s, d = mig_gpu(g)
        sets += s
        devs += d
    return partitioned(*devs, counters=sets)


ONE_G = 'device.attributes["driver-a"].profile == "1g"'
FOUR_G = 'device.attributes["driver-a"].profile == "4g"'


@pytest.mark.parametrize(("policy", "expected"), [(FIRST_FIT, "gpu-0-1g-0"), (BINPACK, "gpu-0-1g-4")])
def test_keeps_large_mig_profiles(policy: alloc.Policy, expected: str) -> None:
    """With 1g at slot 5 used, binpack places the next 1g in the broken half, so a 4g still fits."""
    a = allocator(mig_slices(1), allocated=[held("x", "gpu-0-1g-5")], policy=policy)
    assert picked(a.allocate([claim("c", request("req-0", "class-a", ONE_G))])) == [[("req-0", expected)]]
    assert a.allocate([claim("d", request("req-0", "class-a", FOUR_G))]).ok is (policy is BINPACK)


@pytest.mark.parametrize(("policy", "expected"), [(FIRST_FIT, "gpu-0-1g-0"), (BINPACK, "gpu-1-1g-4")])
def test_binpack_prefers_partly_used_gpu(policy: alloc.Policy, expected: str) -> None:
    """A MIG slice goes to the GPU that is already partitioned (keeping GPU 0 whole), in
    the half whose 4g profile is already blocked."""
    outcome = allocator(mig_slices(2), allocated=[held("x", "gpu-1-1g-7")], policy=policy).allocate(
        [claim("c", request("req-0", "class-a", ONE_G))]
    )
    assert picked(outcome) == [[("req-0", expected)]]


@pytest.mark.parametrize("policy", list(alloc.Policy))
def test_policies_agree_on_feasibility(policy: alloc.Policy) -> None:
    """Both policies find the same feasible/infeasible answers on a constrained claim."""
    classes = [device_class()]
    ok = (
        allocator(mig_slices(2), classes, policy=policy)
        .allocate([claim("c", request("req-0", "class-a", FOUR_G, count=4))])
        .ok
    )
    bad = (
        allocator(mig_slices(2), classes, policy=policy)
        .allocate([claim("c", request("req-0", "class-a", FOUR_G, count=5))])
        .ok
    )
    assert (ok, bad) == (True, False)


@pytest.mark.parametrize(("policy", "expected"), [(FIRST_FIT, "node-1"), (BINPACK, "node-2")])
def test_binpack_leaves_large_gpus_to_claims_that_need_them(policy: alloc.Policy, expected: str) -> None:
    """A small claim goes to the GPU that serves the fewest request shapes seen so far
    (the 16Gi one), leaving the 80Gi GPU for the 40Gi claims."""
    slices = [
        rslice(
            device("big-1", capacity={"memory": "80Gi"}), device("big-2", capacity={"memory": "80Gi"}), node="node-1"
        ),
        rslice(device("small", capacity={"memory": "16Gi"}), node="node-2"),
    ]
    a = allocator(slices, policy=policy)
    assert a.allocate([claim("large", request("req-0", "class-a", memory_at_least("40Gi")))]).node == "node-1"
    assert a.allocate([claim("small", request("req-0", "class-a", memory_at_least("8Gi")))]).node == expected
    assert a.allocate([claim("large-2", request("req-0", "class-a", memory_at_least("40Gi")))]).ok is (
        policy is BINPACK
    )


@pytest.mark.parametrize(("policy", "expected"), [(FIRST_FIT, "node-1"), (BINPACK, "node-2")])
def test_binpack_keeps_the_last_whole_node_for_a_request_of_several_devices(
    policy: alloc.Policy, expected: str
) -> None:
    """With a 4-device request known, a 1-device claim takes a GPU of the broken node, although that node's
    GPUs serve one more request shape, so the 4 free GPUs of the other node stay together for it."""
    big = {"model": "big"}
    slices = [
        rslice(*(device(f"a-{i}", attributes=big) for i in range(4)), node="node-2"),
        rslice(*(device(f"b-{i}") for i in range(4)), node="node-1"),
    ]
    a = allocator(slices, allocated=[held("x", "a-0", pool="node-2")], policy=policy)
    four = claim("four", request(count=4))
    a.consider([four, claim("big", request("req-0", "class-a", 'device.attributes["driver-a"].model == "big"'))])
    assert a.allocate([claim("one")]).node == expected
    assert a.allocate([four]).ok is (policy is BINPACK)


@pytest.mark.parametrize(("policy", "expected"), [(FIRST_FIT, "gpu-0"), (BINPACK, "gpu-2")])
def test_binpack_takes_a_loose_gpu_before_breaking_an_nvlink_pair(policy: alloc.Policy, expected: str) -> None:
    """With a 2-device request over one `partition2` value known, a 1-device claim takes the free GPU of the
    broken pair, so the other pair stays whole for it."""
    slices = [rslice(*(device(f"gpu-{i}", attributes={"partition2": str(i // 2)}) for i in range(4)))]
    a = allocator(slices, allocated=[held("x", "gpu-3")], policy=policy)
    pair = claim("pair", request(count=2), constraints=[match("driver-a/partition2", "req-0")])
    a.consider([pair])
    assert picked(a.allocate([claim("one")])) == [[("req-0", expected)]]
    assert a.allocate([pair]).ok is (policy is BINPACK)
