"""Crash safety of `dractl node-agent` as a real process: SIGKILLed between PrepareStarted and PrepareCompleted.

Each test runs the agent as a subprocess (`python -m dractl node-agent`, see `support.agent_process`) on fake
A100s with dynamic MIG, against the session's real kube-apiserver. A `faults:` entry in the custom profile file
makes the agent hang in `create_compute_instance`, right after it created the GPU instance of the claim's MIG
device, with the checkpoint saying PrepareStarted. The test SIGKILLs it there (nothing in the agent runs: no
rollback, no cleanup), restarts it on the same directories with the fault removed, and checks that the next
NodePrepareResources or NodeUnprepareResources converges with no leaked GPU instance, compute instance or CDI file.
The same holds when the checkpoint is corrupt on restart (a Warning Event; the claim no pod here holds is swept),
when the claim is deleted while the agent is down (the start-up sweep), and for a graceful SIGTERM during the stuck
call (closing the fake ends the hang; the prepare rolls back).
"""

from __future__ import annotations

import threading
from typing import Any

import controlplane
import grpc
import pytest
from support import agent_process, kube_objects, kubelet

from dractl._proto import dra_v1_pb2
from dractl.kube import client
from dractl.node import cdi, checkpoint, slices

pytestmark = pytest.mark.timeout(240)

MINOR = 1
PROFILE_ID = 9  # 3g.40gb on A100-80GB
START = 4
DEVICE = slices.mig_device_name(MINOR, "3g.40gb", PROFILE_ID, START)
HANG = {"operation": "create_compute_instance", "action": "hang"}
HANG_TIMEOUT_S = 60.0


def _allocated_claim(kube_client: client.Client, node: agent_process.Node, name: str = "mig") -> dra_v1_pb2.Claim:
    """A ResourceClaim for one 3g.40gb MIG device, allocated to the node's dynamic MIG device at slice 4."""
    created = kube_objects.create_allocated_claim(
        kube_client,
        name,
        namespace=node.namespace,
        spec=kube_objects.claim_spec(f"mig-{node.name}", request="mig"),
        allocated=kube_objects.allocation(node.name, [DEVICE], request="mig"),
    )
    return dra_v1_pb2.Claim(namespace=node.namespace, name=name, uid=created["metadata"]["uid"])


class HungPrepare:
    """NodePrepareResources called in a thread, as the kubelet would, against an agent that will hang in it."""

    def __init__(self, agent: agent_process.Agent, claim: dra_v1_pb2.Claim) -> None:
        self.outcome: list[object] = []
        self._thread = threading.Thread(target=self._call, args=(agent, claim), daemon=True)
        self._thread.start()

    def _call(self, agent: agent_process.Agent, claim: dra_v1_pb2.Claim) -> None:
        try:
            self.outcome.append(agent.prepare(claim))
        except grpc.RpcError as error:
            self.outcome.append(error)

    def failed(self) -> grpc.RpcError:
        """The call's error once the agent is dead: it must not have reported success (bounded wait)."""
        self._thread.join(timeout=kubelet.RPC_TIMEOUT_S)
        assert not self._thread.is_alive(), "NodePrepareResources did not end after the agent was killed"
        (outcome,) = self.outcome
        assert isinstance(outcome, grpc.RpcError), f"the hung prepare returned {outcome!r}"
        return outcome


def _hang_in_prepare(node: agent_process.Node, claim: dra_v1_pb2.Claim) -> tuple[agent_process.Agent, HungPrepare]:
    """Start the agent with the hang fault, call prepare, and wait until it is stuck between
    PrepareStarted and PrepareCompleted with the GPU instance made; return the agent and the pending call."""
    agent = node.start(faults=[HANG])
    call = HungPrepare(agent, claim)

    def stuck() -> bool:
        if agent.process.poll() is not None:
            raise AssertionError(f"the node agent exited:\n{agent.log_text()}")
        record = node.checkpoint().claims.get(claim.uid)
        return (
            record is not None
            and record.phase is checkpoint.Phase.STARTED
            and node.gpu_instances().get(MINOR) == [(PROFILE_ID, START, [])]
        )

    controlplane.wait_until(
        stuck, what="the checkpoint shows PrepareStarted and the fake a GPU instance at 4", timeout=HANG_TIMEOUT_S
    )
    assert node.cdi_files() == []
    return agent, call


def _assert_nothing_left(node: agent_process.Node, claim: dra_v1_pb2.Claim) -> None:
    assert node.gpu_instances() == {}
    assert node.cdi_files() == []
    assert claim.uid not in node.checkpoint().claims


def test_killed_mid_prepare_then_prepared_again_leaks_nothing(
    kube_client: client.Client, agent_node: agent_process.Node
) -> None:
    """Guards issue 6's crash safety: SIGKILL between PrepareStarted and PrepareCompleted, restart, prepare again:
    one GPU and compute instance for the placement, one CDI file, PrepareCompleted; unprepare then leaves nothing."""
    node = agent_node
    claim = _allocated_claim(kube_client, node)
    dead, call = _hang_in_prepare(node, claim)
    dead.kill()
    assert call.failed().code() is grpc.StatusCode.UNAVAILABLE
    assert node.checkpoint().claims[claim.uid].phase is checkpoint.Phase.STARTED

    agent = node.start()
    prepared = agent.prepare(claim)
    assert prepared.error == ""
    assert [(d.pool_name, d.device_name) for d in prepared.devices] == [(node.name, DEVICE)]
    assert [list(d.cdi_device_ids) for d in prepared.devices] == [[cdi.qualified_name(claim.uid, DEVICE)]]
    assert node.gpu_instances() == {MINOR: [(PROFILE_ID, START, [0])]}
    assert cdi.claim_specs(node.cdi_root) == {claim.uid: node.cdi_root / node.cdi_files()[0]}
    assert node.cdi_files() == [cdi.spec_path(node.cdi_root, claim.uid).name]
    record = node.checkpoint().claims[claim.uid]
    assert record.phase is checkpoint.Phase.COMPLETED
    assert [(m.device, m.gi_id, m.ci_id) for m in record.mig] == [(DEVICE, 1, 0)]

    assert agent.unprepare(claim).error == ""
    _assert_nothing_left(node, claim)


def test_killed_mid_prepare_then_unprepared_leaks_nothing(
    kube_client: client.Client, agent_node: agent_process.Node
) -> None:
    """Guards the kubelet giving up: SIGKILL mid-prepare, restart, NodeUnprepareResources with no prepare in
    between removes the GPU instance the dead agent made, and no CDI file or record is left."""
    node = agent_node
    claim = _allocated_claim(kube_client, node)
    dead, call = _hang_in_prepare(node, claim)
    dead.kill()
    call.failed()

    agent = node.start()
    # The start-up sweep keeps the instance: the interrupted record still owns it and its claim exists.
    assert node.gpu_instances() == {MINOR: [(PROFILE_ID, START, [])]}
    assert agent.unprepare(claim).error == ""
    _assert_nothing_left(node, claim)


def test_corrupt_checkpoint_on_restart_is_a_warning_event_and_the_agent_serves(
    kube_client: client.Client, agent_node: agent_process.Node
) -> None:
    """Guards a corrupt checkpoint after a crash: a CheckpointRebuilt Warning Event on the Node, the agent keeps
    running (no crash loop); the claim no pod on this node holds is not rebuilt, so the start-up sweep removes its
    orphaned GPU instance, and the claim prepares once."""
    node = agent_node
    claim = _allocated_claim(kube_client, node)
    dead, call = _hang_in_prepare(node, claim)
    dead.kill()
    call.failed()
    node.checkpoint_path.write_text('{"version": 2, "checksum": "0", "data": {', encoding="utf-8")

    agent = node.start()

    def rebuilt_events() -> list[dict[str, Any]]:
        events = kube_client.list(client.EVENTS, namespace="default").items
        return [
            e for e in events if e["involvedObject"].get("name") == node.name and e["reason"] == "CheckpointRebuilt"
        ]

    (event,) = rebuilt_events()
    assert event["type"] == "Warning" and event["involvedObject"]["kind"] == "Node"
    assert "checkpoint" in event["message"] and "corrupt (not JSON" in event["message"]
    assert node.gpu_instances() == {}  # nothing owns the instance any more, so the start-up sweep destroyed it

    prepared = agent.prepare(claim)
    assert prepared.error == "" and [d.device_name for d in prepared.devices] == [DEVICE]
    assert node.gpu_instances() == {MINOR: [(PROFILE_ID, START, [0])]}
    assert node.cdi_files() == [cdi.spec_path(node.cdi_root, claim.uid).name]
    assert agent.process.poll() is None

    # A second restart finds the checkpoint the first one rewrote: no new warning, the claim still prepared.
    agent.stop()
    again = node.start()
    assert [e["count"] for e in rebuilt_events()] == [1]
    assert node.checkpoint().claims[claim.uid].phase is checkpoint.Phase.COMPLETED
    assert again.prepare(claim).error == ""
    assert node.gpu_instances() == {MINOR: [(PROFILE_ID, START, [0])]}


def test_killed_mid_prepare_and_claim_deleted_meanwhile_is_swept_at_start(
    kube_client: client.Client, agent_node: agent_process.Node
) -> None:
    """Guards the kubelet never coming back for the claim: SIGKILL mid-prepare, the ResourceClaim deleted while
    the agent is down; the restarted agent's start-up sweep alone removes the GPU instance and the record."""
    node = agent_node
    claim = _allocated_claim(kube_client, node)
    dead, call = _hang_in_prepare(node, claim)
    dead.kill()
    call.failed()
    kube_client.delete(client.RESOURCE_CLAIMS, claim.name, namespace=claim.namespace)

    node.start()
    _assert_nothing_left(node, claim)
    assert node.checkpoint().claims == {}


def test_sigterm_mid_prepare_rolls_back_and_exits(kube_client: client.Client, agent_node: agent_process.Node) -> None:
    """Guards a graceful stop during a stuck prepare: the agent exits 0 within the deadline, the prepare fails
    (never a success the kubelet would trust), and its rollback leaves no GPU instance, CDI file or record."""
    node = agent_node
    claim = _allocated_claim(kube_client, node)
    agent, call = _hang_in_prepare(node, claim)
    assert agent.terminate() == 0, agent.log_text()
    call.failed()
    _assert_nothing_left(node, claim)
