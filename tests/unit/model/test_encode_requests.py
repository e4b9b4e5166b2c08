"""Encoding a claim's requests: `exactly` and the `firstAvailable` entries share their fields and the API's order."""

from __future__ import annotations

from typing import Any

from dractl import model
from dractl.model import encode, quantity


def _encoded_requests(*requests: model.DeviceRequest) -> list[dict[str, Any]]:
    claim = model.ResourceClaim(
        meta=model.ObjectMeta(name="c", namespace="ns"), spec=model.ResourceClaimSpec(requests=requests)
    )
    encoded: list[dict[str, Any]] = encode.resource_claim(claim)["spec"]["devices"]["requests"]
    return encoded


def test_exactly_and_first_available_list_their_fields_in_the_api_order() -> None:
    """Guards: both forms write deviceClassName, selectors, allocationMode, count, tolerations and capacity in the
    API's order; only the entries carry a name and only `exactly` carries adminAccess (false included)."""
    toleration = model.DeviceToleration(key="example.com/maintenance", operator="Exists")
    memory = {"memory": quantity.parse("10Gi")}
    exactly = model.ExactDeviceRequest(
        device_class_name="gpu.nvidia.com",
        selectors=("device.driver == 'gpu.nvidia.com'",),
        count=2,
        admin_access=False,
        tolerations=(toleration,),
        capacity_requests=memory,
    )
    entry = model.DeviceSubRequest(
        name="small",
        device_class_name="mig.nvidia.com",
        selectors=("true",),
        count=3,
        tolerations=(toleration,),
        capacity_requests=memory,
    )
    whole, alternatives = _encoded_requests(
        model.DeviceRequest("gpus", exactly=exactly), model.DeviceRequest("mig", first_available=(entry,))
    )
    shared = ["deviceClassName", "selectors", "allocationMode", "count"]
    assert list(whole["exactly"]) == [*shared, "adminAccess", "tolerations", "capacity"]
    assert whole["exactly"]["adminAccess"] is False
    (encoded_entry,) = alternatives["firstAvailable"]
    assert list(encoded_entry) == ["name", *shared, "tolerations", "capacity"]
    assert encoded_entry["name"] == "small" and encoded_entry["count"] == 3
    assert encoded_entry["capacity"] == {"requests": {"memory": "10Gi"}}
