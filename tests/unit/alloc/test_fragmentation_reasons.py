"""Refusal reasons that name fragmentation: enough devices free in all, but not on one node (or partition)."""

from __future__ import annotations

from support.alloc_inputs import allocator, claim, held, match, reasons, request
from support.devices import device, devices, rslice


def _nodes(*free: int, size: int = 4) -> tuple[list, list]:
    """Nodes node-1.. of `size` devices each, the first `free[i]` of node i free, the rest held (one claim each)."""
    slices = [rslice(*devices(size), node=f"node-{i + 1}") for i in range(len(free))]
    allocated = [
        held(f"h-{i + 1}", *(f"device-{k + 1}" for k in range(n, size)), pool=f"node-{i + 1}")
        for i, n in enumerate(free)
        if n < size
    ]
    return slices, allocated


def test_no_node_has_enough_names_the_best_node() -> None:
    """A count-based refusal with enough free devices in all says no node has that many, and names the best one."""
    slices, allocated = _nodes(2, 3, 1)
    outcome = allocator(slices, allocated=allocated).allocate([claim("c", request("gpu", count=4))])
    assert reasons(outcome) == (
        "gpu: device class class-a matches 12 devices; 12 pass the request's selectors; 6 of those are free on the "
        "candidate nodes (4 needed); no node has 4 free: the best, node-2, has 3\n"
        "None: a repack would admit it: move default/h-2 (device-4 on node-2 -> device-1 on node-1)"
    )


def test_a_shortage_is_not_called_fragmentation() -> None:
    """Too few devices free in all keeps the plain count: fragmentation is not the cause."""
    slices, allocated = _nodes(1, 1)
    text = reasons(allocator(slices, allocated=allocated).allocate([claim("c", request("gpu", count=4))]))
    assert "2 of those are free on the candidate nodes (4 needed)" in text and "no node has" not in text


def test_the_best_node_is_among_the_candidate_nodes() -> None:
    """Only the nodes the caller allows count: the best node named is the best of those."""
    slices, allocated = _nodes(3, 2, 2)
    outcome = allocator(slices, allocated=allocated).allocate(
        [claim("c", request("gpu", count=4))], nodes=("node-2", "node-3")
    )
    assert reasons(outcome) == (
        "gpu: device class class-a matches 12 devices; 12 pass the request's selectors; 4 of those are free on the "
        "candidate nodes (4 needed); no node has 4 free: the best, node-2, has 2\n"
        "None: a repack would admit it: move default/h-2 (device-3, device-4 on node-2 -> device-1 on node-1)"
    )


def test_no_partition_has_enough_names_the_best_partition() -> None:
    """A matchAttribute refusal where a node has enough free devices, but none sharing one value of the attribute,
    names the attribute and the best node and value."""
    slices = [
        rslice(
            *(device(f"gpu-{k}", attributes={"partition": k // 4}) for k in range(8)),
            node="node-1",
        )
    ]
    allocated = [held("h", "gpu-0", "gpu-4", pool="node-1")]
    c = claim("c", request("gpu", count=4), constraints=[match("driver-a/partition")])
    text = reasons(allocator(slices, allocated=allocated).allocate([c]))
    assert text.startswith(
        "gpu: device class class-a matches 8 devices; 8 pass the request's selectors; 6 of those are free on the "
        "candidate nodes (4 needed); no node has 4 free with one value of driver-a/partition (matchAttribute): "
        "the best, node-1 (driver-a/partition 0), has 3"
    )
