"""The decoder's fast paths agree with its long way: a device `_fast_device` takes is the value the
long way makes without any message, every device it refuses still gets the long way's messages, and
JSON reads as json.loads reads it."""

from __future__ import annotations

import json
from typing import Any

import hypothesis
import hypothesis.strategies as st
import pytest

from dractl.model.decode import loading, problems, resource_slices

_NAMES = st.sampled_from(["gpu-0", "gpu-1", "", "GPU-0", "a" * 64, "gpu_0", 7])
_ATTRIBUTE_NAMES = st.sampled_from(
    ["productName", "uuid", "gpu.nvidia.com/index", "resource.kubernetes.io/pcieRoot", "bad name", "a/b/c", "x" * 40, 3]
)
_KINDS = st.sampled_from(["string", "version", "int", "bool", "strings", "ints", "value", "quantity"])
_ITEMS = st.one_of(
    st.sampled_from(["A100", "8.0.0", "1.2", "", "x" * 65, "v1", "580.126.20"]),
    st.integers(min_value=-(2**64), max_value=2**64),
    st.booleans(),
    st.floats(allow_nan=False),
    st.none(),
    st.lists(st.sampled_from(["a", 1, True]), max_size=2),
)
_ATTRIBUTE = st.one_of(
    st.dictionaries(_KINDS, _ITEMS, min_size=0, max_size=2),
    _ITEMS,
)
_CAPACITY = st.one_of(
    st.fixed_dictionaries({"value": st.sampled_from(["80Gi", "1", "0.5", "1e3", "bad", "9Ei", "", 80, 1.5, None])}),
    st.fixed_dictionaries({"value": st.just("1Gi"), "requestPolicy": st.just({"default": "1Gi"})}),
    st.sampled_from(["80Gi", 80, None]),
)
_DEVICE = st.one_of(
    st.fixed_dictionaries(
        {"name": _NAMES},
        optional={
            "attributes": st.one_of(st.dictionaries(_ATTRIBUTE_NAMES, _ATTRIBUTE, max_size=4), st.none(), st.just([])),
            "capacity": st.one_of(st.dictionaries(_ATTRIBUTE_NAMES, _CAPACITY, max_size=3), st.none(), st.just("x")),
            "taints": st.just([{"key": "k", "effect": "NoSchedule"}]),
            "bogus": st.just(1),
        },
    ),
    st.sampled_from([None, "gpu-0", ["gpu-0"]]),
)


def _long_way(raw: object) -> tuple[object, list[str]]:
    out = problems.Results()
    device = resource_slices._device(problems.Report("p: ", out), raw, "spec.devices[0]", per_device=False)
    return device, out.problems


@hypothesis.settings(max_examples=400, deadline=None)
@hypothesis.given(_DEVICE)
def test_fast_device_equals_the_long_way_or_declines(raw: Any) -> None:
    """Guards: whatever `_fast_device` returns is exactly the long way's device for input the long way takes without
    messages; anything else it declines (None), so invalid devices still get their messages."""
    fast = resource_slices._fast_device(raw)
    slow, messages = _long_way(raw)
    if fast is not None:
        assert messages == []
        assert fast == slow


def test_fast_device_takes_the_common_gpu() -> None:
    """Guards: a GPU as drivers publish it (string, version, int and bool attributes, a memory) takes the fast path."""
    raw = {
        "name": "gpu-0",
        "attributes": {
            "productName": {"string": "NVIDIA A100-SXM4-80GB"},
            "driverVersion": {"version": "580.126.20"},
            "index": {"int": 0},
            "mig": {"bool": False},
            "resource.kubernetes.io/pcieRoot": {"string": "pci0000:10"},
        },
        "capacity": {"memory": {"value": "81920Mi"}},
    }
    fast = resource_slices._fast_device(raw)
    assert fast is not None
    assert fast == _long_way(raw)[0]


def test_a_bool_never_passes_for_an_int_through_the_memoised_attributes() -> None:
    """Guards: `{int: 1}` cached first does not make `{int: true}` valid, nor `{bool: 1}` after `{bool: true}`."""
    assert resource_slices._fast_device({"name": "g", "attributes": {"n": {"int": 1}}}) is not None
    assert resource_slices._fast_device({"name": "g", "attributes": {"n": {"int": True}}}) is None
    assert resource_slices._fast_device({"name": "g", "attributes": {"b": {"bool": True}}}) is not None
    assert resource_slices._fast_device({"name": "g", "attributes": {"b": {"bool": 1}}}) is None
    assert _long_way({"name": "g", "attributes": {"n": {"int": True}}})[1] == [
        "p: spec.devices[0].attributes[n].int: must be an integer, got a boolean"
    ]


_JSON_TEXTS = {
    "plain": '{"kind": "List", "items": [{"a": [1, -2, 3.5, true, null, "x\\u00e9"]}]}',
    "big integer": '{"n": 123456789012345678901234567890}',
    "nan and infinity": '{"a": NaN, "b": Infinity, "c": -Infinity}',
    "lone surrogate": '{"a": "\\ud800"}',
    "out of float range": '{"a": 1e400}',
    "duplicate keys": '{"a": 1, "a": 2}',
}


@pytest.mark.parametrize("text", list(_JSON_TEXTS.values()), ids=list(_JSON_TEXTS))
def test_json_is_read_as_json_loads_reads_it(text: str) -> None:
    """Guards: JSON input reads exactly as json.loads reads it, also where the faster msgspec decoder refuses it."""
    assert repr(loading._json(text)) == repr(json.loads(text))


def test_json_integers_beyond_4300_digits_still_read_as_floats() -> None:
    """Guards: an integer json.loads refuses for its length (and msgspec too) is read as a float, as before."""
    assert loading._json('{"n": ' + "9" * 5000 + "}") == {"n": float("inf")}


def _claim_document(**changes: Any) -> dict[str, Any]:
    document: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "team"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com"}}]}},
    }
    document.update(changes)
    return {key: value for key, value in document.items() if value is not None}


_CLAIMS = {
    "plain": _claim_document(),
    "v1beta2": _claim_document(apiVersion="resource.k8s.io/v1beta2"),
    "v1beta1 shape": _claim_document(
        apiVersion="resource.k8s.io/v1beta1",
        spec={"devices": {"requests": [{"name": "gpu", "deviceClassName": "gpu.example.com"}]}},
    ),
    "default namespace": _claim_document(metadata={"name": "c"}),
    "labels": _claim_document(metadata={"name": "c", "labels": {"a": "b"}}),
    "bad name": _claim_document(metadata={"name": "C_1"}),
    "status": _claim_document(status={"reservedFor": [{"resource": "pods", "name": "p", "uid": "u"}]}),
    "unknown top key": _claim_document(extra=1),
    "spec problem": _claim_document(spec={"devices": {"requests": [{"name": "gpu"}]}}),
    "no spec": _claim_document(spec=None),
}


@pytest.mark.parametrize("document", list(_CLAIMS.values()), ids=list(_CLAIMS))
def test_plain_claims_decode_as_the_long_way_does(document: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Guards: a claim decoded through `plain_claim` (its spec seen before) equals the long way's claim, and every
    claim it declines gets the long way's problems and warnings."""
    from dractl.model.decode import resource_claims

    def decode_twice() -> tuple[object, list[str]]:
        try:
            objects = loading.load_documents([document, document], file="m.json")
        except problems.DecodeError as error:
            return None, list(error.problems)
        return (objects.resource_claims, objects.warnings), []

    fast = decode_twice()
    monkeypatch.setattr(resource_claims, "plain_claim", lambda raw, source: None)
    assert fast == decode_twice()


def test_a_claim_whose_spec_was_seen_takes_the_plain_path() -> None:
    """Guards: once a spec decoded without messages, a plain claim with it skips the problem reporter (and one with
    status, labels or an unknown key does not)."""
    from dractl.model import types
    from dractl.model.decode import resource_claims

    loading.load_documents([_CLAIMS["plain"]])
    assert resource_claims.plain_claim(_CLAIMS["plain"], types.Source()) is not None
    for declined in ("status", "labels", "unknown top key", "bad name"):
        assert resource_claims.plain_claim(_CLAIMS[declined], types.Source()) is None, declined
