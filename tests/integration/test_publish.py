"""Slice publication against a real kube-apiserver: every fake profile and MIG mode accepted, no writes when unchanged.

A change (a health taint, a smaller inventory) bumps the pool generation in every slice.
"""

from __future__ import annotations

import uuid
from typing import Any

import faultproxy
import pytest

from dractl import config, model
from dractl.kube import client
from dractl.node import fakegpu, inventory, publish, slices

pytestmark = pytest.mark.timeout(180)

DRIVER = "gpu.nvidia.com"


def _node(api: client.Client) -> tuple[str, str]:
    name = f"node-{uuid.uuid4().hex[:8]}"
    created = api.create(client.NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    return name, created["metadata"]["uid"]


def _desired(
    profile: str,
    node: str,
    *,
    mig_mode: config.MigMode = config.MigMode.STATIC,
    taints: dict[str, tuple[model.DeviceTaint, ...]] | None = None,
) -> tuple[model.ResourceSlice, ...]:
    gpus = fakegpu.FakeGpus(fakegpu.load_profile(profile), node_name=node)
    return slices.build(
        inventory.read(gpus),
        options=slices.Options(node_name=node, driver_name=DRIVER, mig_mode=mig_mode, taints=taints or {}),
    )


def _published(api: client.Client, node: str) -> list[dict[str, Any]]:
    items = api.list(client.RESOURCE_SLICES, field_selector=f"spec.nodeName={node}").items
    return sorted(items, key=lambda raw: raw["metadata"]["name"])


def _devices(items: list[dict[str, Any]]) -> list[str]:
    return sorted(device["name"] for raw in items for device in raw["spec"].get("devices", ()))


@pytest.mark.parametrize("mig_mode", list(config.MigMode), ids=lambda mode: f"mig-{mode.value}")
@pytest.mark.parametrize("profile", fakegpu.builtin_profiles())
def test_every_profile_publishes_accepted_slices_and_a_second_publish_writes_nothing(
    profile: str,
    mig_mode: config.MigMode,
    kube_client: client.Client,
    proxied_client: client.Client,
    fault_proxy: faultproxy.FaultProxy,
) -> None:
    """Guards: the API server accepts each fake profile's slices in each MIG mode; republishing writes nothing."""
    node, uid = _node(kube_client)
    desired = _desired(profile, node, mig_mode=mig_mode)
    publisher = publish.Publisher(proxied_client, driver=DRIVER, node_name=node)
    result = publisher.publish(desired)
    assert (result.created, result.updated, result.deleted) == (len(desired), 0, 0)
    items = _published(kube_client, node)
    assert len(items) == len(desired)
    assert _devices(items) == sorted(d.name for s in desired for d in s.devices)
    assert {raw["spec"]["pool"]["generation"] for raw in items} == {result.generation}
    assert {raw["spec"]["pool"]["resourceSliceCount"] for raw in items} == {len(desired)}
    assert all(
        raw["metadata"]["ownerReferences"]
        == [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid, "controller": True}]
        for raw in items
    )
    fault_proxy.clear()
    again = publisher.publish(desired)
    assert again.writes == 0
    assert fault_proxy.writes() == []
    # A restarted agent (a new publisher) finds the same slices and writes nothing either.
    assert publish.Publisher(proxied_client, driver=DRIVER, node_name=node).publish(desired).writes == 0
    assert fault_proxy.writes() == []


def test_a_health_taint_republishes_every_slice_at_the_next_generation(
    kube_client: client.Client, proxied_client: client.Client, fault_proxy: faultproxy.FaultProxy
) -> None:
    """Guards: a device taint from a health event changes the slices; all are updated in place with generation + 1."""
    node, _ = _node(kube_client)
    publisher = publish.Publisher(proxied_client, driver=DRIVER, node_name=node)
    first = publisher.publish(_desired("a100-mig-mixed", node, mig_mode=config.MigMode.DYNAMIC))
    names_before = [raw["metadata"]["name"] for raw in _published(kube_client, node)]
    taint = model.DeviceTaint(key=f"{DRIVER}/xid", value="79", effect="NoSchedule")
    fault_proxy.clear()
    tainted = _desired("a100-mig-mixed", node, mig_mode=config.MigMode.DYNAMIC, taints={"gpu-3": (taint,)})
    second = publisher.publish(tainted)
    assert second.generation == first.generation + 1
    assert (second.created, second.updated, second.deleted) == (0, len(tainted), 0)
    assert {r.method for r in fault_proxy.writes()} == {"PUT"}
    items = _published(kube_client, node)
    assert [raw["metadata"]["name"] for raw in items] == names_before
    assert {raw["spec"]["pool"]["generation"] for raw in items} == {second.generation}
    taints = {device["name"]: device.get("taints") for raw in items for device in raw["spec"].get("devices", ())}
    assert [{k: v for k, v in t.items() if k != "timeAdded"} for t in taints["gpu-3"]] == [
        {"key": f"{DRIVER}/xid", "value": "79", "effect": "NoSchedule"}
    ]
    assert taints["gpu-3"][0]["timeAdded"]  # the API server fills it in; the publisher must not rewrite for it
    assert all(value is None for name, value in taints.items() if name != "gpu-3")
    fault_proxy.clear()
    assert publisher.publish(tainted).writes == 0
    assert fault_proxy.writes() == []


def test_fewer_slices_delete_the_extra_ones(kube_client: client.Client) -> None:
    """Guards: when the node's inventory shrinks, the remaining slices are updated and the extra ones deleted."""
    node, _ = _node(kube_client)
    publisher = publish.Publisher(kube_client, driver=DRIVER, node_name=node)
    big = _desired("a100-80gb-x8", node, mig_mode=config.MigMode.DYNAMIC)
    small = _desired("t4-x2", node)
    assert len(big) > len(small)
    publisher.publish(big)
    result = publisher.publish(small)
    assert result.deleted == len(big) - len(small)
    items = _published(kube_client, node)
    assert len(items) == len(small)
    assert _devices(items) == sorted(d.name for s in small for d in s.devices)
    assert {raw["spec"]["pool"]["resourceSliceCount"] for raw in items} == {len(small)}


def test_other_nodes_and_drivers_are_left_alone(kube_client: client.Client) -> None:
    """Guards: the publisher lists and deletes only its own node's slices for its own driver."""
    node, _ = _node(kube_client)
    other_node, _ = _node(kube_client)
    kube_client.create(
        client.RESOURCE_SLICES,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-other-driver"},
            "spec": {
                "driver": "other.example.com",
                "nodeName": node,
                "pool": {"name": node, "resourceSliceCount": 1},
                "devices": [{"name": "x"}],
            },
        },
    )
    publish.Publisher(kube_client, driver=DRIVER, node_name=other_node).publish(_desired("t4-x2", other_node))
    publish.Publisher(kube_client, driver=DRIVER, node_name=node).publish(())
    assert [raw["spec"]["driver"] for raw in _published(kube_client, node)] == ["other.example.com"]
    assert len(_published(kube_client, other_node)) == len(_desired("t4-x2", other_node))


def test_a_conflicting_write_is_retried_after_a_fresh_list(
    kube_client: client.Client, proxied_client: client.Client, fault_proxy: faultproxy.FaultProxy
) -> None:
    """Guards: a 409 on an update makes the publisher list again and finish; the slices end up as desired."""
    node, _ = _node(kube_client)
    publisher = publish.Publisher(proxied_client, driver=DRIVER, node_name=node)
    publisher.publish(_desired("t4-x2", node))
    fault_proxy.add(faultproxy.respond(409, method="PUT", path="/resourceslices/"))
    taint = model.DeviceTaint(key=f"{DRIVER}/gpu-lost", effect="NoSchedule")
    result = publisher.publish(_desired("t4-x2", node, taints={"gpu-1": (taint,)}))
    assert result.updated == len(_desired("t4-x2", node))
    assert any(r.fault == "status 409" for r in fault_proxy.requests)
    devices = {device["name"]: device for raw in _published(kube_client, node) for device in raw["spec"]["devices"]}
    assert [(t["key"], t["effect"]) for t in devices["gpu-1"]["taints"]] == [(f"{DRIVER}/gpu-lost", "NoSchedule")]


def test_a_slice_deleted_between_the_list_and_its_update_is_created_after_a_fresh_list(
    kube_client: client.Client, proxied_client: client.Client, fault_proxy: faultproxy.FaultProxy
) -> None:
    """Guards: a 404 on an update (someone deleted the slice after the publisher listed it) makes the publisher
    list again and finish, as a 409 does, instead of failing the publish."""
    node, _ = _node(kube_client)
    publisher = publish.Publisher(proxied_client, driver=DRIVER, node_name=node)
    publisher.publish(_desired("t4-x2", node))
    fault_proxy.add(faultproxy.respond(404, method="PUT", path="/resourceslices/"))
    taint = model.DeviceTaint(key=f"{DRIVER}/gpu-lost", effect="NoSchedule")
    publisher.publish(_desired("t4-x2", node, taints={"gpu-0": (taint,)}))
    assert any(r.fault == "status 404" for r in fault_proxy.requests)
    devices = {device["name"]: device for raw in _published(kube_client, node) for device in raw["spec"]["devices"]}
    assert [(t["key"], t["effect"]) for t in devices["gpu-0"]["taints"]] == [(f"{DRIVER}/gpu-lost", "NoSchedule")]


def test_a_missing_node_is_one_clear_error(kube_client: client.Client) -> None:
    """Guards: publishing for a node that has no Node object fails with a message naming the node, writing nothing."""
    node = f"node-missing-{uuid.uuid4().hex[:6]}"
    with pytest.raises(publish.PublishError, match=f"node {node}: the Node object does not exist"):
        publish.Publisher(kube_client, driver=DRIVER, node_name=node).publish(_desired("t4-x2", node))
    assert _published(kube_client, node) == []


def test_slices_for_another_node_are_refused(kube_client: client.Client) -> None:
    """Guards: desired slices naming another node or driver are a clear error, not a write to another pool."""
    node, _ = _node(kube_client)
    other, _ = _node(kube_client)
    with pytest.raises(publish.PublishError, match="spec.nodeName"):
        publish.Publisher(kube_client, driver=DRIVER, node_name=node).publish(_desired("t4-x2", other))


def test_a_recreated_node_gets_its_slices_owned_by_the_new_uid(kube_client: client.Client) -> None:
    """Guards: after the Node is deleted and registered again,
    republishing points the owner reference at the new uid."""
    node, old_uid = _node(kube_client)
    publisher = publish.Publisher(kube_client, driver=DRIVER, node_name=node)
    desired = _desired("t4-x2", node)
    publisher.publish(desired)
    kube_client.delete(client.NODES, node)
    new_uid = kube_client.create(client.NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})[
        "metadata"
    ]["uid"]
    assert new_uid != old_uid
    result = publisher.publish(desired)
    # When kube-controller-manager runs in this session (coexistence tests start it), its
    # garbage collector may already have deleted the old Node's slices: then they are created.
    assert result.updated + result.created == len(desired)
    owners = {raw["metadata"]["ownerReferences"][0]["uid"] for raw in _published(kube_client, node)}
    assert owners == {new_uid}
