"""CEL runtime errors surface where upstream's lazy, in-order evaluation would meet them.

Upstream evaluates a device's selectors when the search tries the device (after checking
that it is not in use), and collects All-mode sets before searching a node. A device that
matches before the search reaches a failing one wins; the error ends the claim only when the
search reaches the failing device. dractl evaluates every device up front but raises the error
at the same place.
"""

from __future__ import annotations

import pytest
from support.alloc_inputs import allocator, claim, first_available, held, node, picked, reasons, request, sub
from support.devices import device, device_class, rslice

from dractl import alloc

# Fails on a device without the attribute "model" ("no such key").
FAILING = 'device.attributes["driver-a"].model == "x"'
POLICIES = pytest.mark.parametrize(
    "policy", [alloc.Policy.FIRST_FIT, alloc.Policy.BINPACK], ids=["first-fit", "binpack"]
)


def good(name: str) -> object:
    return device(name, attributes={"model": "x"})


def bad(name: str) -> object:
    return device(name)


@POLICIES
def test_device_before_the_failing_one_is_allocated(policy: alloc.Policy) -> None:
    """A device that matches before the search reaches a failing one is allocated."""
    outcome = allocator([rslice(good("device-1"), bad("device-2"))], policy=policy).allocate(
        [claim("c", request("req-0", "class-a", FAILING))]
    )
    assert picked(outcome) == [[("req-0", "device-1")]]


def test_failing_device_first_fails_the_claim() -> None:
    """When the search tries the failing device first, the claim fails with the error, which
    quotes the expression, names the device and says which selector failed."""
    outcome = allocator([rslice(bad("device-1"), good("device-2"))]).allocate(
        [claim("c", request("req-0", "class-a", FAILING))]
    )
    text = reasons(outcome)
    assert outcome.reasons[0].claim == "default/c" and outcome.reasons[0].request == "req-0"
    assert (
        "selectors[0]: CEL expression `" + FAILING + "` failed on device driver-a/node-1/device-1: no such key: model"
        in text
    )


def test_count_two_reaches_the_failing_device() -> None:
    """count=2 with one good device before a failing one: the search needs a second device,
    reaches the failing one and fails with its error."""
    outcome = allocator([rslice(good("device-1"), bad("device-2"), good("device-3"))]).allocate(
        [claim("c", request("req-0", "class-a", FAILING, count=2))]
    )
    assert "device-2" in reasons(outcome) and "no such key" in reasons(outcome)


def test_failing_device_past_a_too_short_list_is_still_met() -> None:
    """Too few candidates do not end the search before it meets a failing device (upstream
    tries every device)."""
    outcome = allocator([rslice(good("device-1"), bad("device-2"))]).allocate(
        [claim("c", request("req-0", "class-a", FAILING, count=3))]
    )
    assert "device-2" in reasons(outcome)


def test_failing_device_held_by_another_claim_is_skipped() -> None:
    """A failing device that an allocated claim holds is in use; upstream checks that first
    and never evaluates it, so the search goes on to the next device."""
    outcome = allocator([rslice(bad("device-1"), good("device-2"))], allocated=[held("other", "device-1")]).allocate(
        [claim("c", request("req-0", "class-a", FAILING))]
    )
    assert picked(outcome) == [[("req-0", "device-2")]]


def test_failing_device_taken_earlier_in_the_claim_is_skipped() -> None:
    """A failing device already taken by an earlier request of the same allocation is in use
    for the later request, so its selector is never evaluated there."""
    first = request("req-0", "class-a")
    second = request("req-1", "class-a", FAILING)
    outcome = allocator([rslice(bad("device-1"), good("device-2"))]).allocate([claim("c", first, second)])
    assert picked(outcome) == [[("req-0", "device-1"), ("req-1", "device-2")]]


def test_class_selector_error_follows_the_same_rule() -> None:
    """A failing class selector is raised where the search meets the device, like a request's;
    the reason names the class and its selector."""
    classes = [device_class("class-a", FAILING)]
    ok = allocator([rslice(good("device-1"), bad("device-2"))], classes).allocate(
        [claim("c", request("req-0", "class-a"))]
    )
    assert picked(ok) == [[("req-0", "device-1")]]
    failed = allocator([rslice(bad("device-1"), good("device-2"))], classes).allocate(
        [claim("c", request("req-0", "class-a"))]
    )
    assert "device class class-a: selectors[1]: CEL expression" in reasons(failed) and "device-1" in reasons(failed)


def test_all_mode_fails_on_any_failing_device_of_the_node() -> None:
    """All mode collects its set before searching, so a failing device anywhere on the node
    fails the claim, even one that another claim holds."""
    outcome = allocator([rslice(good("device-1"), bad("device-2"))], allocated=[held("other", "device-2")]).allocate(
        [claim("c", request("req-0", "class-a", FAILING, all=True))]
    )
    assert "device-2" in reasons(outcome)


def test_first_available_falls_through_only_without_error() -> None:
    """A subrequest whose search meets a failing device ends the claim; it does not fall
    through to the next subrequest (upstream returns the error)."""
    req = first_available("req-0", sub("a", "class-a", FAILING, count=2), sub("b", "class-a"))
    outcome = allocator([rslice(good("device-1"), bad("device-2"))]).allocate([claim("c", req)])
    assert "req-0/a" in {r.request for r in outcome.reasons} and "device-2" in reasons(outcome)


def test_an_earlier_node_that_fits_wins_over_a_later_error() -> None:
    """Nodes are searched in order: a node that fits before the node with the failing device wins."""
    slices = [rslice(good("device-1"), node="node-1"), rslice(bad("device-2"), node="node-2")]
    outcome = allocator(slices, nodes=[node("node-1"), node("node-2")]).allocate(
        [claim("c", request("req-0", "class-a", FAILING))]
    )
    assert outcome.node == "node-1"


def test_an_error_on_an_earlier_node_ends_the_attempt() -> None:
    """A failing device on the first node searched ends the attempt, though a later node fits."""
    slices = [rslice(bad("device-1"), node="node-1"), rslice(good("device-2"), node="node-2")]
    outcome = allocator(slices, nodes=[node("node-1"), node("node-2")]).allocate(
        [claim("c", request("req-0", "class-a", FAILING))]
    )
    assert "device-1" in reasons(outcome)


def test_an_error_holds_nothing() -> None:
    """A claim that failed on an error holds nothing: the next claim gets the devices."""
    a = allocator([rslice(good("device-1"), bad("device-2"))])
    failed = a.allocate([claim("c", request("req-0", "class-a", FAILING, count=2))])
    assert not failed.ok
    assert picked(a.allocate([claim("d", request("req-0", "class-a", count=2))])) == [
        [("req-0", "device-1"), ("req-0", "device-2")]
    ]


def test_binpack_tries_failing_devices_last() -> None:
    """Binpack tries a device whose selector failed after every candidate: a failing device
    listed first does not stop it when a later device fits (first-fit, in upstream's order,
    fails there), and the error ends the attempt only when nothing else fits."""
    slices = [rslice(bad("device-1"), good("device-2"))]
    first_fit = allocator(slices).allocate([claim("c", request("req-0", "class-a", FAILING))])
    assert "device-1" in reasons(first_fit)
    binpack = allocator(slices, policy=alloc.Policy.BINPACK).allocate(
        [claim("c", request("req-0", "class-a", FAILING))]
    )
    assert picked(binpack) == [[("req-0", "device-2")]]
    short = allocator(slices, policy=alloc.Policy.BINPACK).allocate(
        [claim("c", request("req-0", "class-a", FAILING, count=2))]
    )
    assert "device-1" in reasons(short)


def test_binpack_tries_another_node_before_a_selector_error_ends_the_claim() -> None:
    """Guards: under binpack, a failing device on the first-ranked node does not end the claim when another fits."""
    # node-2 is partly used, so binpack ranks it first; its good devices cannot hold two.
    slices = [
        rslice(good("gpu-0"), good("gpu-1"), node="node-1"),
        rslice(good("gpu-0"), bad("gpu-1"), good("gpu-2"), node="node-2"),
    ]
    allocator_ = allocator(slices, policy=alloc.Policy.BINPACK, allocated=[held("old", "gpu-2", pool="node-2")])
    outcome = allocator_.allocate([claim("c", request("req-0", "class-a", FAILING, count=2))])
    assert outcome.node == "node-1"
    assert picked(outcome) == [[("req-0", "gpu-0"), ("req-0", "gpu-1")]]


def test_binpack_does_not_count_a_failing_device_toward_a_pcie_root() -> None:
    """Guards: a device whose selector failed does not make its PCIe root look able to hold the whole request."""
    root = "resource.kubernetes.io/pcieRoot"

    def on(name: str, pci: str, **attributes: str) -> object:
        return device(name, attributes={root: pci, **attributes})

    devices = [
        on("gpu-a0", "pci-a", model="x"),
        on("gpu-a1", "pci-a"),  # fails: no "model"
        on("gpu-b0", "pci-b", model="x"),
        on("gpu-b1", "pci-b", model="x"),
        on("gpu-c0", "pci-c", model="x"),
        on("gpu-c1", "pci-c", model="x"),
        on("gpu-c2", "pci-c", model="x"),
    ]
    outcome = allocator([rslice(*devices)], policy=alloc.Policy.BINPACK).allocate(
        [claim("c", request("req-0", "class-a", FAILING, count=2))]
    )
    assert picked(outcome) == [[("req-0", "gpu-b0"), ("req-0", "gpu-b1")]]
