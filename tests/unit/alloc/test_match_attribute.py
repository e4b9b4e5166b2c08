"""matchAttribute: upstream catalog group D and list-type attributes (group L)."""

from __future__ import annotations

import pytest
from support.alloc_inputs import allocator, claim, match, picked, reasons, request
from support.devices import device, rslice


def two(a1: dict[str, object], a2: dict[str, object], *more: dict[str, object]) -> list:
    return [rslice(*(device(f"device-{i + 1}", attributes=a) for i, a in enumerate((a1, a2, *more))))]


def test_with_constraint() -> None:
    """int, version, string and bool attributes all equal: two devices."""
    attrs = {"numa": 1, "version": "v:1.0.0", "name": "x", "ok": True}
    c = claim("c", request(count=2), constraints=[match(f"driver-a/{k}") for k in attrs])
    assert picked(allocator(two(attrs, attrs)).allocate([c])) == [[("req-0", "device-1"), ("req-0", "device-2")]]


@pytest.mark.parametrize(
    ("name", "a1", "a2", "best"),
    [
        ("with-constraint-non-existent-attribute", {"numa": 1}, {}, "1"),
        ("with-constraint-not-matching-int-attribute", {"numa": 1}, {"numa": 2}, "1"),
        ("with-constraint-not-matching-string-attribute", {"numa": "a"}, {"numa": "b"}, "a"),
        ("with-constraint-not-matching-bool-attribute", {"numa": True}, {"numa": False}, "True"),
        ("with-constraint-not-matching-version-attribute", {"numa": "v:1.0.0"}, {"numa": "v:2.0.0"}, "1.0.0"),
        ("types-differ", {"numa": 1}, {"numa": "1"}, "1"),
    ],
)
def test_not_matching(name: str, a1: dict[str, object], a2: dict[str, object], best: str) -> None:
    """Differing (or missing) values fail the constraint, and the reason names it and the best value's count."""
    outcome = allocator(two(a1, a2)).allocate([claim("c", request(count=2), constraints=[match("driver-a/numa")])])
    assert reasons(outcome) == (
        "req-0: device class class-a matches 2 devices; 2 pass the request's selectors; 2 of those are "
        "free on the candidate nodes (2 needed); no node has 2 free with one value of driver-a/numa "
        f"(matchAttribute): the best, node-1 (driver-a/numa {best}), has 1; constraint matchAttribute driver-a/numa "
        "could not be met"
    )
    assert any("matchAttribute driver-a/numa" in r.message for r in outcome.reasons)


def test_with_constraint_for_request() -> None:
    """A constraint scoped to req-0 leaves req-1 unconstrained."""
    slices = two({"numa": 1}, {"numa": 1}, {"numa": 2})
    c = claim("c", request("req-0", count=2), request("req-1"), constraints=[match("driver-a/numa", "req-0")])
    assert picked(allocator(slices).allocate([c])) == [
        [("req-0", "device-1"), ("req-0", "device-2"), ("req-1", "device-3")]
    ]


def test_with_constraint_for_request_retry() -> None:
    """A second global constraint forces backtracking to device-2/device-3."""
    slices = two({"numa": 1, "x": 1}, {"numa": 1, "x": 2}, {"numa": 1, "x": 2})
    c = claim("c", request(count=2), constraints=[match("driver-a/numa"), match("driver-a/x")])
    assert picked(allocator(slices).allocate([c])) == [[("req-0", "device-2"), ("req-0", "device-3")]]


def test_version_compares_as_text() -> None:
    """Versions in constraints compare as strings (upstream): 1.0.0 and 1.0.0+build differ."""
    assert reasons(
        allocator(two({"v": "v:1.0.0"}, {"v": "v:1.0.0+b"})).allocate(
            [claim("c", request(count=2), constraints=[match("driver-a/v")])]
        )
    ) == (
        "req-0: device class class-a matches 2 devices; 2 pass the request's selectors; 2 of those are "
        "free on the candidate nodes (2 needed); no node has 2 free with one value of driver-a/v (matchAttribute): "
        "the best, node-1 (driver-a/v 1.0.0), has 1; constraint matchAttribute driver-a/v could not be met"
    )


def test_bare_attribute_name_in_driver_domain() -> None:
    """A fully qualified name in the driver's domain finds a bare attribute name."""
    assert (
        allocator(two({"numa": 1}, {"driver-a/numa": 1}))
        .allocate([claim("c", request(count=2), constraints=[match("driver-a/numa")])])
        .ok
    )


@pytest.mark.parametrize(
    ("name", "values", "ok"),
    [
        ("list-attributes-match-constaint-scalar-string-values", ["a", "a"], True),
        ("list-attributes-match-constaint-list-of-string-values-with-common-elements", [["a", "b"], ["b", "c"]], True),
        (
            "list-attributes-match-constaint-list-of-string-values-with-partially-common-elements",
            [["a", "b"], ["b", "c"], ["c", "a"]],
            False,
        ),
        ("list-attributes-match-constaint-list-of-string-values-without-common-elements", [["a"], ["b"]], False),
        (
            "list-attributes-match-constaint-mixed-scalar-and-list-of-string-values-with-common-elements",
            ["a", ["a", "b"]],
            True,
        ),
        (
            "list-attributes-match-constaint-mixed-scalar-and-list-of-string-values-without-common-elements",
            ["c", ["a", "b"]],
            False,
        ),
        ("list-attributes-match-constaint-list-of-int-values-with-common-elements", [[1, 2], [2, 3]], True),
        ("list-attributes-match-constaint-list-of-bool-values-with-common-elements", [[True], [True, False]], True),
        (
            "list-attributes-match-constaint-list-of-version-values-with-common-elements",
            [["v:1.0.0", "v:2.0.0"], ["v:2.0.0"]],
            True,
        ),
    ],
)
def test_list_attributes(name: str, values: list[object], ok: bool) -> None:
    """List attributes match when the intersection over every device is non-empty."""
    slices = [rslice(*(device(f"device-{i + 1}", attributes={"l": v}) for i, v in enumerate(values)))]
    c = claim("c", request(count=len(values)), constraints=[match("driver-a/l")])
    assert allocator(slices).allocate([c]).ok is ok


def test_list_intersection_recomputed_on_backtracking() -> None:
    """dractl: the running intersection widens again when the search backtracks."""
    values = [["a", "b"], ["a"], ["b"], ["b"]]
    slices = [rslice(*(device(f"device-{i + 1}", attributes={"l": v}) for i, v in enumerate(values)))]
    c = claim("c", request(count=3), constraints=[match("driver-a/l")])
    assert picked(allocator(slices).allocate([c])) == [
        [("req-0", "device-1"), ("req-0", "device-3"), ("req-0", "device-4")]
    ]
