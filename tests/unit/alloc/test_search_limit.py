"""The search limit ends a pathological search with a clear reason instead of hanging."""

from __future__ import annotations

from support.alloc_inputs import allocator, claim, first_available, match, picked, reasons, request, sub
from support.devices import device, devices, rslice


def alternating(n: int) -> list:
    # Half the devices have j=0, half j=1: more than n/2 devices with one j value cannot exist.
    return [rslice(*(device(f"device-{i}", attributes={"j": i % 2}) for i in range(n)))]


def test_search_limit_reached() -> None:
    """An impossible search beyond the bound stops with "search limit reached"."""
    outcome = allocator(alternating(30), search_limit=1000).allocate(
        [claim("c", request(count=16), constraints=[match("driver-a/j")])]
    )
    assert "search limit reached after 1000 steps" in reasons(outcome)


def test_generous_limit_gives_a_definite_answer() -> None:
    """The same searches complete under the default bound: no solution, or the first one."""
    outcome = allocator(alternating(30)).allocate([claim("c", request(count=16), constraints=[match("driver-a/j")])])
    assert "search limit" not in reasons(
        outcome
    ) and "constraint matchAttribute driver-a/j could not be met" in reasons(outcome)
    outcome = allocator(alternating(30)).allocate([claim("c", request(count=3), constraints=[match("driver-a/j")])])
    assert picked(outcome) == [[("req-0", "device-0"), ("req-0", "device-2"), ("req-0", "device-4")]]


def test_state_is_clean_after_the_limit() -> None:
    """A search stopped by the limit holds nothing afterwards: every device is still free."""
    a = allocator(alternating(30), search_limit=1000)
    assert reasons(a.allocate([claim("c0", request(count=16), constraints=[match("driver-a/j")])])) == (
        "None: search limit reached after 1000 steps without finding an allocation; the claims' "
        "constraints are too hard to satisfy together (raise the search limit or simplify the "
        "constraints)\n"
        "req-0: device class class-a matches 30 devices; 30 pass the request's selectors; 30 of those are "
        "free on the candidate nodes (16 needed); no node has 16 free with one value of driver-a/j (matchAttribute): "
        "the best, node-1 (driver-a/j 0), has 15; constraint matchAttribute driver-a/j could not be met"
    )
    assert len(picked(a.allocate([claim("c1", request(count=30))]))[0]) == 30


def test_claim_limit_prunes_instead_of_searching() -> None:
    """A first subrequest that leaves no room under 32 results is abandoned at once, not
    searched device by device (C(40, 32) combinations would exceed any bound)."""
    c = claim("c", first_available("req-0", sub("a", count=32), sub("b", count=16)), request("req-1", count=16))
    outcome = allocator([rslice(*devices(40))], search_limit=10_000).allocate([c])
    assert [r for r, _ in picked(outcome)[0]] == ["req-0/b"] * 16 + ["req-1"] * 16
