"""The node agent against a real kube-apiserver: slices published, a claim read and prepared, a taint written."""

from __future__ import annotations

import pathlib
import uuid

import controlplane
import pytest
from support import kube_objects, kubelet

from dractl import model
from dractl.kube import client
from dractl.node import agent, fakegpu, state

pytestmark = pytest.mark.timeout(180)

DRIVER = "gpu.nvidia.com"


@pytest.fixture
def node_name(kube_client: client.Client) -> str:
    name = f"node-{uuid.uuid4().hex[:8]}"
    kube_client.create(client.NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    return name


def _slices(kube_client: client.Client, node: str) -> tuple[model.ResourceSlice, ...]:
    found, _ = kube_client.list_resource_slices(field_selector=f"spec.nodeName={node},spec.driver={DRIVER}")
    return found


def test_agent_publishes_prepares_and_taints_through_the_api(
    control_plane: controlplane.ControlPlane,
    kube_client: client.Client,
    namespace: str,
    node_name: str,
    sock_dir: pathlib.Path,
    tmp_path: pathlib.Path,
) -> None:
    """Guards: with a real API the agent publishes the 8 GPUs, prepares an allocated claim it reads from the API,
    writes an XID taint into the slice, reports a checkpoint rebuilt after corruption as a Warning Event on the Node,
    and leaves the slices in place on stop."""
    settings = kubelet.agent_settings(
        tmp_path, sock_dir, node_name=node_name, kubeconfig=pathlib.Path(control_plane.kubeconfig)
    )
    gpus = fakegpu.FakeGpus(fakegpu.load_profile("a100-80gb-x8"), node_name=node_name)
    # A corrupt checkpoint is rebuilt with a Warning Event on the Node, not a crash.
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "checkpoint.json").write_text("{not json")
    node_agent = agent.Agent(settings, gpus=gpus, health_poll_s=0.05)
    node_agent.start()
    try:
        published = _slices(kube_client, node_name)
        assert sorted(d.name for s in published for d in s.devices) == sorted(f"gpu-{i}" for i in range(8))
        assert all(s.meta.owner_references and s.meta.owner_references[0]["name"] == node_name for s in published)

        created = kube_objects.create_allocated_claim(
            kube_client,
            "c",
            namespace=namespace,
            spec=kube_objects.ONE_GPU,
            allocated=kube_objects.allocation(node_name, ["gpu-3"]),
        )
        uid = created["metadata"]["uid"]
        answers = kubelet.prepare(
            node_agent.sockets.dra,
            state.ClaimRef(namespace=namespace, name="c", uid=uid),
            state.ClaimRef(namespace=namespace, name="gone", uid="0000"),
        )
        assert answers[uid].error == ""
        assert [d.device_name for d in answers[uid].devices] == ["gpu-3"]
        assert answers["0000"].error != ""

        gpus.inject_xid(3, 79)

        def tainted() -> bool:
            devices = {d.name: d for s in _slices(kube_client, node_name) for d in s.devices}
            return [(t.key, t.value, t.effect) for t in devices["gpu-3"].taints] == [
                (f"{DRIVER}/xid", "79", "NoSchedule")
            ]

        controlplane.wait_until(tainted, what="the xid taint on gpu-3 in the API", timeout=30)

        events = kube_client.list(client.EVENTS, namespace="default").items
        warnings = [
            e for e in events if e["involvedObject"].get("name") == node_name and e["reason"] == "CheckpointRebuilt"
        ]
        assert len(warnings) == 1 and warnings[0]["type"] == "Warning"
        assert "checkpoint" in warnings[0]["message"] and "is corrupt (not JSON" in warnings[0]["message"]
    finally:
        node_agent.stop()
    assert not node_agent.sockets.dra.exists()
    assert len(_slices(kube_client, node_name)) == len(published)
