"""Failure reasons: per request, what a person can act on."""

from __future__ import annotations

from support.alloc_inputs import ONE_DEVICE_TWO_CLAIMS, allocator, claim, distinct, held, match, reasons, request
from support.devices import counter_set, device, device_class, devices, partitioned, rslice

from dractl import alloc


def test_counts_per_request() -> None:
    """The reason counts class matches, selector passes and free devices, and names the request."""
    slices = [
        rslice(
            device("device-1", attributes={"ok": True}),
            device("device-2", attributes={"ok": True}),
            device("device-3", attributes={"ok": False}),
        )
    ]
    outcome = allocator(slices, allocated=[held("x", "device-1")]).allocate(
        [claim("c", request("gpu", "class-a", 'device.attributes["driver-a"].ok', count=2))]
    )
    reason, repack = outcome.reasons
    assert reason.claim == "default/c" and reason.request == "gpu"
    assert (
        reason.message
        == "device class class-a matches 3 devices; 2 pass the request's selectors; 1 of those are free on the "
        "candidate nodes (2 needed)"
    )
    assert repack == alloc.Reason(
        "default/c", None, "a repack would admit it: move default/x (device-1 on node-1 -> device-3 on node-1)"
    )


def test_compile_error_carries_the_hint() -> None:
    """A quantity compared with >= fails to compile, and the reason says what to write instead."""
    text = reasons(
        allocator([rslice(*devices(1))]).allocate(
            [claim("c", request("req-0", "class-a", 'device.capacity["driver-a"].memory >= quantity("1Gi")'))]
        )
    )
    assert "selectors[0]" in text and "compareTo(" in text


def test_class_compile_error_names_the_class() -> None:
    """A class selector that does not compile names the class and the selector index."""
    classes = [device_class("broken", "device.nope ==")]
    assert "device class broken: selectors[1]" in reasons(
        allocator([rslice(*devices(1))], classes).allocate([claim("c", request("req-0", "broken"))])
    )


def test_constraint_reason() -> None:
    """An unmet constraint is named with its attribute and scope."""
    slices = [rslice(device("device-1", attributes={"n": 1}), device("device-2", attributes={"n": 2}))]
    c = claim("c", request("a"), request("b"), constraints=[match("driver-a/n", "a", "b")])
    assert "constraint matchAttribute driver-a/n over a, b could not be met" in reasons(allocator(slices).allocate([c]))


def test_counter_reason() -> None:
    """A counter that ran out is named with its set and pool."""
    slices = partitioned(
        device("d1", consumes={"gpu-0": {"memory": 4}}),
        device("d2", consumes={"gpu-0": {"memory": 4}}),
        counters=[counter_set("gpu-0", memory=4)],
    )
    text = reasons(allocator(slices).allocate([claim("c", request(count=2))]))
    assert "counter memory of counter set gpu-0 in pool driver-a/node-1 ran out" in text


def test_constraint_reason_in_a_joint_allocation_names_that_claims_constraint() -> None:
    """Claims allocated together number constraints across the call; each reason still names its own claim's constraint
    (found by the oracle property)."""
    slices = [rslice(device("device-0"), device("device-1", attributes={"model": "a100"}))]
    first = claim("c0", request("r0"), constraints=[distinct("driver-a/model")])
    second = claim("c1", request("r0"), constraints=[distinct("driver-a/model")])
    outcome = allocator(slices).allocate([first, second])
    assert reasons(outcome) == (
        "r0: device class class-a matches 2 devices; 2 pass the request's selectors; 2 of those are free "
        "on the candidate nodes (1 needed); constraint distinctAttribute driver-a/model could not be met\n"
        "r0: device class class-a matches 2 devices; 2 pass the request's selectors; 2 of those are free "
        "on the candidate nodes (1 needed); constraint distinctAttribute driver-a/model could not be met"
    )
    assert "constraint distinctAttribute driver-a/model could not be met" in reasons(outcome)


def test_unknown_constraint_request() -> None:
    """A constraint naming a request the claim lacks is reported."""
    assert "names the request 'nope'" in reasons(
        allocator([rslice(*devices(1))]).allocate([claim("c", constraints=[match("driver-a/n", "nope")])])
    )


def test_unknown_class_lists_known_classes() -> None:
    """An unknown class reason lists the classes that exist."""
    assert "name one of: class-a, class-b" in reasons(
        allocator([rslice(*devices(1))]).allocate([claim("c", request("req-0", "gpu"))])
    )


def test_failure_commits_nothing() -> None:
    """A failed joint allocation leaves every device free."""
    a = allocator([rslice(*devices(1))])
    assert reasons(a.allocate([claim("c0"), claim("c1")])) == ONE_DEVICE_TWO_CLAIMS
    assert a.allocate([claim("c2")]).ok


def test_only_the_blocking_request_is_explained() -> None:
    """A request that could be satisfied is not blamed when another one cannot."""
    outcome = allocator([rslice(*devices(1))]).allocate([claim("c", request("fine"), request("stuck", "class-b"))])
    assert [r.request for r in outcome.reasons] == ["stuck"]


def test_requests_that_only_fail_together() -> None:
    """Claims that fit one at a time but not together say so."""
    outcome = allocator([rslice(*devices(1))]).allocate([claim("c0"), claim("c1")])
    assert "none of the 1 candidate node has devices for all requests together" in reasons(outcome)
