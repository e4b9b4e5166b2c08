"""Node state over the real ClaimSource (`dractl.kube.claims`) against a real kube-apiserver."""

from __future__ import annotations

import pathlib
import uuid
from typing import Any

import faultproxy
import pytest
from support import cdi_rules, kube_objects
from support.state_inputs import API, DRIVER, NODE, make_node

from dractl.kube import claims, client
from dractl.node import backend, cdi, state

pytestmark = pytest.mark.timeout(120)


def _allocated(kube: client.Client, namespace: str, name: str, *, config: list[dict[str, Any]]) -> state.ClaimRef:
    created = kube.create(
        client.RESOURCE_CLAIMS,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}},
        },
    )
    kube.update_status(
        client.RESOURCE_CLAIMS,
        {
            **created,
            "status": {
                "allocation": {
                    "devices": {
                        "results": [{"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-1"}],
                        "config": config,
                    }
                }
            },
        },
    )
    return state.ClaimRef(namespace=namespace, name=name, uid=created["metadata"]["uid"])


def _time_slicing(interval: str) -> list[dict[str, Any]]:
    parameters = {
        "apiVersion": API,
        "kind": "GpuConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": interval}},
    }
    return [{"source": "FromClaim", "requests": ["gpu"], "opaque": {"driver": DRIVER, "parameters": parameters}}]


def test_prepare_reads_the_live_claim_and_sweep_unprepares_it_once_deleted(
    tmp_path: pathlib.Path, kube_client: client.Client, namespace: str
) -> None:
    """Guards: prepare over the API (allocation and opaque config as stored); the sweep after a delete."""
    node = make_node(tmp_path)
    node.claims = claims.ApiClaimSource(kube_client)  # type: ignore[assignment]
    s = node.state()
    ref = _allocated(kube_client, namespace, "c", config=_time_slicing("Medium"))
    (device,) = s.prepare(ref)
    assert device.cdi_device_ids == (f"k8s.gpu.nvidia.com/claim={ref.uid}-gpu-1",)
    cdi_rules.check_file(cdi.spec_path(node.cdi_root, ref.uid))
    assert node.gpus.time_slice(1) is backend.TimeSlice.MEDIUM
    assert s.sweep() == state.SweepResult()
    kube_client.delete(client.RESOURCE_CLAIMS, "c", namespace=namespace)
    assert s.sweep().unprepared == (ref.uid,)
    assert node.cdi_files() == [] and node.gpus.time_slice(1) is backend.TimeSlice.DEFAULT


def test_a_recreated_claim_is_refused_for_the_old_uid_and_bad_config_is_named(
    tmp_path: pathlib.Path, kube_client: client.Client, namespace: str
) -> None:
    """Guards: the kubelet's old UID after the claim was recreated is refused; a bad stored config names its field."""
    node = make_node(tmp_path)
    node.claims = claims.ApiClaimSource(kube_client)  # type: ignore[assignment]
    s = node.state()
    old = _allocated(kube_client, namespace, "c", config=_time_slicing("Sometimes"))
    with pytest.raises(state.PrepareError, match=r"config\[0\] \(FromClaim\) opaque.parameters.sharing.timeSlicing"):
        s.prepare(old)
    kube_client.delete(client.RESOURCE_CLAIMS, "c", namespace=namespace)
    _allocated(kube_client, namespace, "c", config=[])
    with pytest.raises(state.PrepareError, match=f"the kubelet asked for {old.uid} \\(the claim was replaced\\)"):
        s.prepare(old)
    assert s.prepared() == {} and node.cdi_files() == []


def test_the_claims_on_a_node_are_those_allocated_in_its_pool_and_reserved_without_reading_a_pod(
    kube_client: client.Client,
    proxied_client: client.Client,
    fault_proxy: faultproxy.FaultProxy,
    namespace: str,
) -> None:
    """Guards the rebuild's source: `claims_on_node` returns exactly the claims, in every namespace, with a result of
    the driver in the node's pool and a non-empty reservedFor (a PodGroup's claim, reserved for the group, too); not
    an unreserved one, one in another pool or of
    another driver; and it reads no pod (pod specs hold secrets), only resourceclaims."""
    node, elsewhere = f"node-{uuid.uuid4().hex[:8]}", f"node-{uuid.uuid4().hex[:8]}"
    other_namespace = f"{namespace}-b"
    kube_objects.make_namespace(kube_client, other_namespace)
    here = kube_client.create(client.PODS, kube_objects.pod("here", namespace=namespace, claims=[], nodeName=node))

    # A claim of a PodGroup (KEP-5729) is reserved for the group, not for its pods.
    group = [{"apiGroup": "scheduling.k8s.io", "resource": "podgroups", "name": "train", "uid": str(uuid.uuid4())}]

    def make(
        name: str,
        pool: str,
        *,
        reserved: bool = True,
        driver: str = DRIVER,
        where: str = namespace,
        consumers: list[dict[str, str]] | None = None,
    ) -> None:
        allocated = kube_objects.allocation(pool, ["gpu-0"])
        allocated["devices"]["results"][0]["driver"] = driver
        created = kube_client.create(
            client.RESOURCE_CLAIMS, kube_objects.claim(name, namespace=where, spec=kube_objects.ONE_GPU)
        )
        status: dict[str, Any] = {"allocation": allocated}
        if reserved:
            status["reservedFor"] = consumers or kube_objects.reserved_for([here])
        kube_client.update_status(client.RESOURCE_CLAIMS, {**created, "status": status})

    make("held-here", node)
    make("held-by-a-pod-group", node, consumers=group)
    make("held-in-another-namespace", node, where=other_namespace)
    make("unreserved", node, reserved=False)
    make("other-pool", elsewhere)
    make("other-driver", node, driver="net.example.com")
    fault_proxy.clear()
    found = claims.ApiClaimSource(proxied_client).claims_on_node(driver=DRIVER, node=node)
    assert [(c.meta.namespace, c.meta.name) for c in found] == [
        (namespace, "held-by-a-pod-group"),
        (namespace, "held-here"),
        (other_namespace, "held-in-another-namespace"),
    ]
    assert all(c.allocation is not None and c.meta.uid for c in found)
    paths = [r.target.split("?")[0] for r in fault_proxy.requests]
    assert paths and all(p == "/apis/resource.k8s.io/v1/resourceclaims" for p in paths), paths
