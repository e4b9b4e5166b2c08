"""Device taints and request tolerations: upstream catalog group H."""

from __future__ import annotations

import pytest
from support.alloc_inputs import allocator, claim, picked, reasons, request, toleration
from support.devices import device, rslice, taint


def test_tainted_two_devices() -> None:
    """Untolerated NoSchedule and NoExecute taints block both devices, and the reason says so."""
    slices = [
        rslice(device("device-1", taints=[taint("a")]), device("device-2", taints=[taint("b", effect="NoExecute")]))
    ]
    outcome = allocator(slices).allocate([claim()])
    assert reasons(outcome) == (
        "req-0: device class class-a matches 2 devices; 2 pass the request's selectors; 2 of those have a "
        "taint the request does not tolerate; 0 of those are free on the candidate nodes (1 needed)"
    )


def test_tainted_one_device_two_taints() -> None:
    """One tolerated taint is not enough when a second one is not."""
    slices = [rslice(device("device-1", taints=[taint("a"), taint("b", effect="NoExecute")]))]
    assert reasons(
        allocator(slices).allocate([claim("c", request("req-0", tolerations=[toleration("a", operator="Exists")]))])
    ) == (
        "req-0: device class class-a matches 1 device; 1 pass the request's selectors; 1 of those have a "
        "taint the request does not tolerate; 0 of those are free on the candidate nodes (1 needed)"
    )


def test_tainted_two_devices_tolerated() -> None:
    """An Equal/NoExecute toleration admits device-2; the toleration is copied to the result."""
    tol = toleration("b", value="v", effect="NoExecute")
    slices = [
        rslice(
            device("device-1", taints=[taint("a")]), device("device-2", taints=[taint("b", "v", effect="NoExecute")])
        )
    ]
    outcome = allocator(slices).allocate([claim("c", request("req-0", tolerations=[tol]))])
    assert picked(outcome) == [[("req-0", "device-2")]]
    assert outcome.allocations is not None and outcome.allocations[0].results[0].tolerations == (tol,)


@pytest.mark.parametrize("effect", ["None", "SomethingNew"])
def test_tainted_no_effect(effect: str) -> None:
    """Effect None and unknown effects are ignored."""
    assert allocator([rslice(device("device-1", taints=[taint("a", effect=effect)]))]).allocate([claim()]).ok


def test_tainted_one_device_two_taints_both_tolerated() -> None:
    """Both tolerations are copied to the result."""
    tols = [toleration("a", operator="Exists"), toleration("b", operator="Exists")]
    slices = [rslice(device("device-1", taints=[taint("a"), taint("b", effect="NoExecute")]))]
    outcome = allocator(slices).allocate([claim("c", request("req-0", tolerations=tols))])
    assert outcome.allocations is not None and outcome.allocations[0].results[0].tolerations == tuple(tols)


@pytest.mark.parametrize(
    ("tol", "ok"),
    [
        (toleration(operator="Exists"), True),
        (toleration("a", value="x"), True),
        (toleration("a", value="y"), False),
        (toleration("a", operator="Exists", effect="NoExecute"), False),
        (toleration("a", operator="Exists", effect="NoSchedule"), True),
        (toleration("a", operator="Bogus"), False),
    ],
    ids=["exists-any-key", "equal-value", "equal-other-value", "other-effect", "same-effect", "unknown-operator"],
)
def test_toleration_matching(tol: object, ok: bool) -> None:
    """Toleration rules: empty key with Exists matches all; Equal needs the value; the effect must agree."""
    slices = [rslice(device("device-1", taints=[taint("a", "x")]))]
    assert allocator(slices).allocate([claim("c", request("req-0", tolerations=[tol]))]).ok is ok
