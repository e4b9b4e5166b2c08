"""distinctAttribute: upstream catalog group K and list-type cases of group L."""

from __future__ import annotations

import pytest
from support.alloc_inputs import allocator, claim, distinct, picked, reasons, request
from support.devices import device, rslice


def slices_with(values: list[object]) -> list:
    return [
        rslice(*(device(f"device-{i + 1}", attributes={} if v is None else {"a": v}) for i, v in enumerate(values)))
    ]


def test_with_distinct_constraints() -> None:
    """Scoped distinct constraints over four devices."""
    slices = slices_with([1, 1, 2, 3])
    c = claim(
        "c",
        request("req-0"),
        request("req-1"),
        request("req-2"),
        constraints=[distinct("driver-a/a", "req-0", "req-1"), distinct("driver-a/a", "req-1", "req-2")],
    )
    assert picked(allocator(slices).allocate([c])) == [
        [("req-0", "device-1"), ("req-1", "device-3"), ("req-2", "device-2")]
    ]


def test_with_distinct_constraints_attribute_not_set() -> None:
    """A device without the attribute cannot join the constraint."""
    assert reasons(
        allocator(slices_with([None, None])).allocate(
            [claim("c", request(count=2), constraints=[distinct("driver-a/a")])]
        )
    ) == (
        "req-0: device class class-a matches 2 devices; 2 pass the request's selectors; 2 of those are "
        "free on the candidate nodes (2 needed); constraint distinctAttribute driver-a/a could not be met"
    )


def test_pairwise_distinct_within_one_request() -> None:
    """dractl: pairwise distinct over every device, even with count 3 in one request."""
    slices = slices_with([1, 2, 1, 3])
    c = claim("c", request(count=3), constraints=[distinct("driver-a/a")])
    assert picked(allocator(slices).allocate([c])) == [
        [("req-0", "device-1"), ("req-0", "device-2"), ("req-0", "device-4")]
    ]
    assert reasons(
        allocator(slices_with([1, 2, 1])).allocate([claim("c", request(count=3), constraints=[distinct("driver-a/a")])])
    ) == (
        "req-0: device class class-a matches 3 devices; 3 pass the request's selectors; 3 of those are "
        "free on the candidate nodes (3 needed); constraint distinctAttribute driver-a/a could not be met"
    )


def test_distinct_constraint_one_multi_allocatable_device() -> None:
    """The same multi-allocatable device twice violates distinctness."""
    slices = [rslice(device("device-1", attributes={"a": 1}, multi=True))]
    c = claim("c", request("req-0"), request("req-1"), constraints=[distinct("driver-a/a")])
    assert reasons(allocator(slices).allocate([c])) == (
        "req-1: device class class-a matches 1 device; 1 pass the request's selectors; 1 of those are free "
        "on the candidate nodes (1 needed); constraint distinctAttribute driver-a/a could not be met"
    )


def test_distinct_constraint_two_multi_allocatable_devices() -> None:
    """Two multi-allocatable devices with distinct values satisfy it."""
    slices = [
        rslice(device("device-1", attributes={"a": 1}, multi=True), device("device-2", attributes={"a": 2}, multi=True))
    ]
    c = claim("c", request("req-0"), request("req-1"), constraints=[distinct("driver-a/a")])
    assert picked(allocator(slices).allocate([c])) == [[("req-0", "device-1"), ("req-1", "device-2")]]


@pytest.mark.parametrize(
    ("name", "values", "expected"),
    [
        ("list-attributes-distinct-constraint-scalar-string-values-all-distinct", ["a", "b"], ["device-1", "device-2"]),
        ("list-attributes-distinct-constraint-scalar-string-values-not-distinct", ["a", "a"], None),
        (
            "list-attributes-distinct-constraint-list-of-string-values-all-distinct",
            [["a", "b"], ["b", "c"], ["c", "d"]],
            ["device-1", "device-3"],
        ),
        (
            "list-attributes-distinct-constraint-list-of-string-values-with-common-elements",
            [["a", "b"], ["b", "c"]],
            None,
        ),
        (
            "list-attributes-distinct-constraint-mixed-scalar-and-list-all-distinct",
            ["a", ["a", "b"], ["c"]],
            ["device-1", "device-3"],
        ),
        (
            "list-attributes-distinct-constraint-list-of-int-values-all-distinct",
            [[1, 2], [3]],
            ["device-1", "device-2"],
        ),
        (
            "list-attributes-distinct-constraint-list-of-bool-values-all-distinct",
            [[True], [False]],
            ["device-1", "device-2"],
        ),
        (
            "list-attributes-distinct-constraint-list-of-version-values-all-distinct",
            [["v:1.0.0"], ["v:2.0.0"]],
            ["device-1", "device-2"],
        ),
    ],
)
def test_list_attributes(name: str, values: list[object], expected: list[str] | None) -> None:
    """List attributes are distinct when the value sets are pairwise disjoint."""
    outcome = allocator(slices_with(values)).allocate(
        [claim("c", request(count=2), constraints=[distinct("driver-a/a")])]
    )
    if expected is None:
        assert reasons(outcome) == (
            "req-0: device class class-a matches 2 devices; 2 pass the request's selectors; 2 of those are "
            "free on the candidate nodes (2 needed); constraint distinctAttribute driver-a/a could not be met"
        )
    else:
        assert [d for _, d in picked(outcome)[0]] == expected
