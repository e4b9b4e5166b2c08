"""Node state over the real ClaimSource (`dractl.kube.claims`) against a real kube-apiserver."""

from __future__ import annotations

import pathlib
import uuid
from typing import Any

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


def test_the_claims_on_a_node_are_those_its_pods_name_in_its_pool_and_reserved_for_them(
    kube_client: client.Client, namespace: str
) -> None:
    """Guards the rebuild's source: `claims_on_node` returns exactly the claims a pod bound to the node names (in its
    spec, or in its status for a claim made from a template) that have a result of the driver in the node's pool and
    are reserved for a pod on the node; not one only pods elsewhere hold, an unreserved one, one in another pool or
    of another driver, and a named claim that does not exist is no error."""
    node, elsewhere = f"node-{uuid.uuid4().hex[:8]}", f"node-{uuid.uuid4().hex[:8]}"

    def pod(name: str, claims: list[str], **spec: Any) -> dict[str, Any]:
        entries = [kube_objects.of_claim(claim, pod_claim=claim) for claim in claims]
        return kube_client.create(client.PODS, kube_objects.pod(name, namespace=namespace, claims=entries, **spec))

    named_here = ["held-here", "held-here-and-away", "unreserved", "other-pool", "other-driver", "missing"]
    here = pod("here", named_here, nodeName=node)
    away = pod("away", ["held-away", "held-here-and-away"], nodeName=elsewhere)
    unbound = pod("unbound", ["held-by-unbound"])
    templated = kube_client.create(
        client.PODS,
        kube_objects.pod(
            "templated", namespace=namespace, claims=[kube_objects.from_template("t", pod_claim="tmpl")], nodeName=node
        ),
    )
    kube_client.update_status(
        client.PODS,
        {**templated, "status": {"resourceClaimStatuses": [{"name": "tmpl", "resourceClaimName": "from-template"}]}},
    )

    def make(name: str, pool: str, pods: list[dict[str, Any]], *, driver: str = DRIVER) -> None:
        allocated = kube_objects.allocation(pool, ["gpu-0"])
        allocated["devices"]["results"][0]["driver"] = driver
        created = kube_client.create(
            client.RESOURCE_CLAIMS, kube_objects.claim(name, namespace=namespace, spec=kube_objects.ONE_GPU)
        )
        status: dict[str, Any] = {"allocation": allocated}
        if pods:
            status["reservedFor"] = kube_objects.reserved_for(pods)
        kube_client.update_status(client.RESOURCE_CLAIMS, {**created, "status": status})

    make("held-here", node, [here])
    make("held-here-and-away", node, [away, here])
    make("held-away", node, [away])
    make("held-by-unbound", node, [unbound])
    make("unreserved", node, [])
    make("other-pool", elsewhere, [here])
    make("other-driver", node, [here], driver="net.example.com")
    make("from-template", node, [templated])
    found = claims.ApiClaimSource(kube_client).claims_on_node(driver=DRIVER, node=node)
    assert [c.meta.name for c in found] == ["from-template", "held-here", "held-here-and-away"]
    assert all(c.allocation is not None and c.meta.uid for c in found)
