"""Configuration in results: upstream catalog group E and the config cases of group F."""

from __future__ import annotations

from support.alloc_inputs import allocator, claim, first_available, opaque, request, sub
from support.devices import device_class, devices, rslice

from dractl import model


def config(outcome) -> list[tuple[str, tuple[str, ...], object]]:
    assert outcome.allocations is not None, outcome.reasons
    return [(c.source, c.requests, c.opaque.parameters["p"]) for c in outcome.allocations[0].config]


def claim_config(param: str, *requests: str) -> model.DeviceClaimConfiguration:
    return model.DeviceClaimConfiguration(requests=tuple(requests), opaque=opaque(param))


def test_with_class_device_config() -> None:
    """Class config is FromClass, with requests cleared when it covers every request."""
    classes = [device_class(config=[opaque("class")])]
    assert config(allocator([rslice(*devices(1))], classes).allocate([claim()])) == [("FromClass", (), "class")]


def test_with_class_device_config_with_multiple_request_and_configs() -> None:
    """One entry per class config, listing the requests that used the class."""
    classes = [device_class(config=[opaque("a1"), opaque("a2")]), device_class("class-c", config=[opaque("c")])]
    c = claim("c", request("req-0"), request("req-1"), request("req-2", "class-c"))
    assert config(allocator([rslice(*devices(3))], classes).allocate([c])) == [
        ("FromClass", ("req-0", "req-1"), "a1"),
        ("FromClass", ("req-0", "req-1"), "a2"),
        ("FromClass", ("req-2",), "c"),
    ]


def test_with_claim_config_for_two_requests() -> None:
    """Claim config naming two of three requests keeps its list."""
    c = claim("c", request("req-0"), request("req-1"), request("req-2"), config=[claim_config("x", "req-0", "req-1")])
    assert config(allocator([rslice(*devices(3))]).allocate([c])) == [("FromClaim", ("req-0", "req-1"), "x")]


def test_claim_with_device_config() -> None:
    """Claim config without requests is copied as FromClaim."""
    assert config(allocator([rslice(*devices(1))]).allocate([claim("c", config=[claim_config("x")])])) == [
        ("FromClaim", (), "x")
    ]


def test_claim_config_scoped_to_subrequests_of_one_request() -> None:
    """Config naming both subrequests of req-0 stays scoped when req-1 exists."""
    c = claim(
        "c",
        first_available("req-0", sub("a"), sub("b")),
        request("req-1"),
        config=[claim_config("x", "req-0/a", "req-0/b")],
    )
    assert config(allocator([rslice(*devices(2))]).allocate([c])) == [("FromClaim", ("req-0/a", "req-0/b"), "x")]


def test_claim_config_covering_all_requests_is_cleared() -> None:
    """Config covering req-0 through its chosen subrequest and req-1 gets requests cleared."""
    c = claim(
        "c",
        first_available("req-0", sub("a"), sub("b")),
        request("req-1"),
        config=[claim_config("x", "req-0/a", "req-1")],
    )
    assert config(allocator([rslice(*devices(2))]).allocate([c])) == [("FromClaim", (), "x")]


def test_prioritized_list_device_config() -> None:
    """Config for an unchosen subrequest is dropped; for the chosen one requests are cleared."""
    c = claim(
        "c",
        first_available("req-0", sub("a", "class-b"), sub("b")),
        config=[claim_config("for-a", "req-0/a"), claim_config("for-b", "req-0/b")],
    )
    assert config(allocator([rslice(*devices(1))]).allocate([c])) == [("FromClaim", (), "for-b")]


def test_prioritized_list_class_config() -> None:
    """Only the chosen subrequest's class config is emitted."""
    classes = [device_class(config=[opaque("a")]), device_class("class-b", driver="driver-b", config=[opaque("b")])]
    c = claim("c", first_available("req-0", sub("x", "class-b"), sub("y")))
    assert config(allocator([rslice(*devices(1))], classes).allocate([c])) == [("FromClass", (), "a")]
