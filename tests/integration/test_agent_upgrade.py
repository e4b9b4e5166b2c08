"""`dractl node-agent` through upgrades and restarts, as real processes against the session's kube-apiserver.

Issue 15: a checkpoint of another version or a corrupt one must never wipe the node, and a rolling update (a second
agent started on the same directories) must never take the first one's sockets. Each test runs agents with
`support.agent_process` on fake A100s with dynamic MIG. The claims are held the way the kubelet's node sees them:
allocated in the node's pool and reserved for pods bound to the node (Pod objects with `spec.nodeName`; no kubelet
runs); the agent reads those claims (never the pods) from the API to rebuild a lost checkpoint. What the agents left
is read from their files: the checkpoint, the CDI root and the fake's `fake-gpus.json` (the node's MIG instances).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
from support import agent_process, kube_objects

from dractl._proto import dra_v1_pb2
from dractl.kube import client
from dractl.node import checkpoint, plugin, slices

pytestmark = pytest.mark.timeout(300)

MINOR = 1
PROFILE_ID = 9  # 3g.40gb on A100-80GB
FIRST = slices.mig_device_name(MINOR, "3g.40gb", PROFILE_ID, 0)
SECOND = slices.mig_device_name(MINOR, "3g.40gb", PROFILE_ID, 4)
POD_A = "6a7b8c9d-aaaa-4000-8000-000000000001"
POD_B = "6a7b8c9d-bbbb-4000-8000-000000000002"


def _held_claim(kube_client: client.Client, node: agent_process.Node, name: str, device: str) -> dra_v1_pb2.Claim:
    """A claim for one MIG device allocated in the node's pool and reserved for a pod bound to the node."""
    pod = kube_client.create(
        client.PODS,
        kube_objects.pod(
            f"pod-{name}", namespace=node.namespace, claims=[kube_objects.of_claim(name)], nodeName=node.name
        ),
    )
    created = kube_client.create(
        client.RESOURCE_CLAIMS,
        kube_objects.claim(name, namespace=node.namespace, spec=kube_objects.claim_spec(f"mig-{node.name}")),
    )
    status = {
        "allocation": kube_objects.allocation(node.name, [device]),
        "reservedFor": kube_objects.reserved_for([pod]),
    }
    kube_client.update_status(client.RESOURCE_CLAIMS, {**created, "status": status})
    return dra_v1_pb2.Claim(namespace=node.namespace, name=name, uid=created["metadata"]["uid"])


def _answer(response: dra_v1_pb2.NodePrepareResourceResponse) -> list[tuple[str, str, list[str]]]:
    assert response.error == "", response.error
    return [(d.pool_name, d.device_name, list(d.cdi_device_ids)) for d in response.devices]


def _node_events(kube_client: client.Client, node: agent_process.Node, reason: str) -> list[dict[str, Any]]:
    events = kube_client.list(client.EVENTS, namespace="default").items
    return [e for e in events if e["involvedObject"].get("name") == node.name and e["reason"] == reason]


def _prepare_two(
    kube_client: client.Client, node: agent_process.Node, agent: agent_process.Agent
) -> dict[str, tuple[dra_v1_pb2.Claim, list[tuple[str, str, list[str]]]]]:
    """Two held claims, each with a MIG instance on GPU 1, prepared by `agent`: by name, the claim and its answer."""
    prepared = {}
    for name, device in (("first", FIRST), ("second", SECOND)):
        claim = _held_claim(kube_client, node, name, device)
        prepared[name] = (claim, _answer(agent.prepare(claim)))
    assert node.gpu_instances() == {MINOR: [(PROFILE_ID, 0, [0]), (PROFILE_ID, 4, [0])]}
    assert len(node.cdi_files()) == 2
    return prepared


def _flip_bytes(node: agent_process.Node) -> None:
    blob = bytearray(node.checkpoint_path.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    node.checkpoint_path.write_bytes(bytes(blob))


def _directory_instead(node: agent_process.Node) -> None:
    node.checkpoint_path.unlink()
    node.checkpoint_path.mkdir()


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        pytest.param(_flip_bytes, "is corrupt (", id="bytes-flipped"),
        pytest.param(_directory_instead, "is corrupt (a directory, not a file)", id="directory-at-the-path"),
    ],
)
def test_a_corrupt_checkpoint_while_claims_are_prepared_keeps_their_cdi_specs_and_mig_instances(
    kube_client: client.Client, agent_node: agent_process.Node, damage: Any, reason: str
) -> None:
    """Guards issue 15 (seen: flipped bytes made the start-up sweep destroy gpu-0/gi1 and gi2 and delete both CDI
    specs of claims live pods held; a directory at the path made the agent exit 1 for ever): the agent killed with
    two claims prepared restarts on a damaged checkpoint, rebuilds both claims from the API and the devices (a
    CheckpointRebuilt Warning Event on the Node), keeps every CDI spec and MIG instance, answers a prepare with the
    same devices, and unprepare still undoes each exactly."""
    node = agent_node
    agent = node.start()
    prepared = _prepare_two(kube_client, node, agent)
    instances, files, records = node.gpu_instances(), node.cdi_files(), node.checkpoint().claims
    agent.kill()
    damage(node)

    again = node.start()
    assert (node.gpu_instances(), node.cdi_files()) == (instances, files)
    assert node.checkpoint().claims == records
    (event,) = _node_events(kube_client, node, "CheckpointRebuilt")
    assert event["type"] == "Warning" and reason in event["message"]
    assert f"2 prepared claim(s) ({node.namespace}/first, {node.namespace}/second)" in event["message"]
    for claim, answer in prepared.values():
        assert _answer(again.prepare(claim)) == answer
    assert node.gpu_instances() == instances

    first, _ = prepared["first"]
    assert again.unprepare(first).error == ""
    assert node.gpu_instances() == {MINOR: [(PROFILE_ID, 4, [0])]}
    assert node.cdi_files() == [f for f in files if prepared["second"][0].uid in f]
    second, _ = prepared["second"]
    assert again.unprepare(second).error == ""
    assert (node.gpu_instances(), node.cdi_files(), node.checkpoint().claims) == ({}, [], {})


def test_a_checkpoint_of_version_plus_1_makes_the_agent_refuse_to_start_and_nothing_is_touched(
    kube_client: client.Client, agent_node: agent_process.Node
) -> None:
    """Guards issue 15 (seen: version 99 wiped the node): a checkpoint a newer agent wrote (intact, version + 1)
    stops the agent with exit 1 and one line naming the file and both versions, the same as a Warning Event on the
    Node; the file stays byte for byte, and the claims' CDI specs and MIG instances stay."""
    node = agent_node
    agent = node.start()
    _prepare_two(kube_client, node, agent)
    assert agent.terminate() == 0
    instances, files = node.gpu_instances(), node.cdi_files()
    newer = checkpoint.VERSION + 1
    data = {**json.loads(node.checkpoint_path.read_bytes())["data"], "newField": {"of": "a newer agent"}}
    covered = json.dumps({"data": data, "version": newer}, sort_keys=True, separators=(",", ":"))
    blob = f'{{"checksum":"{hashlib.sha256(covered.encode()).hexdigest()}",{covered[1:]}'.encode()
    node.checkpoint_path.write_bytes(blob)

    code, lines = node.refused()
    message = (
        f"checkpoint {node.checkpoint_path} is version {newer}, written by a newer dractl node agent; this agent "
        f"reads versions 1 to {checkpoint.VERSION}, so it does not start: run the newer agent again, or move the file "
        "away to have this one rebuild the node's state from the API and the devices (the file is left as it is)"
    )
    assert (code, lines) == (1, [f"dractl node-agent: error: {message}"])
    (event,) = _node_events(kube_client, node, "CheckpointTooNew")
    assert (event["type"], event["message"]) == ("Warning", message)
    assert node.checkpoint_path.read_bytes() == blob
    assert (node.gpu_instances(), node.cdi_files()) == (instances, files)


def test_a_hand_written_version_1_checkpoint_is_migrated_with_every_claim(
    kube_client: client.Client, agent_node: agent_process.Node
) -> None:
    """Guards issue 15 (a rollout that bumps the version): the checkpoint as a version-1 agent writes it (its
    checksum over `data` only, written here by hand) keeps both claims: the agent starts, keeps their devices,
    answers a prepare with the same devices, leaves the file as it is until a claim changes, then writes this
    version."""
    node = agent_node
    agent = node.start()
    prepared = _prepare_two(kube_client, node, agent)
    assert agent.terminate() == 0
    instances, records = node.gpu_instances(), node.checkpoint().claims
    data = json.loads(node.checkpoint_path.read_bytes())["data"]
    checksum = hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    node.checkpoint_path.write_text(json.dumps({"version": 1, "checksum": checksum, "data": data}, indent=2))

    again = node.start()
    assert node.gpu_instances() == instances and node.checkpoint().claims == records
    for claim, answer in prepared.values():
        assert _answer(again.prepare(claim)) == answer
    assert json.loads(node.checkpoint_path.read_bytes())["version"] == 1
    first, _ = prepared["first"]
    assert again.unprepare(first).error == ""
    assert json.loads(node.checkpoint_path.read_bytes())["version"] == checkpoint.VERSION
    assert node.gpu_instances() == {MINOR: [(PROFILE_ID, 4, [0])]}
    assert list(node.checkpoint().claims) == [prepared["second"][0].uid]


def test_two_agents_started_one_after_the_other_while_claims_are_prepared(
    kube_client: client.Client, agent_node: agent_process.Node
) -> None:
    """Guards issue 15's rolling update (seen: the second agent removed the first one's live sockets, and the first
    one's SIGTERM then left none): with --pod-uid a new agent starts beside the old one while claims are prepared;
    its start-up sweep keeps their devices, it answers them from the shared checkpoint without a second instance,
    the old one's SIGTERM removes only its own sockets, and the new one then unprepares and prepares."""
    node = agent_node
    old = node.start(pod_uid=POD_A)
    first = _held_claim(kube_client, node, "first", FIRST)
    answer = _answer(old.prepare(first))
    instances, files = node.gpu_instances(), node.cdi_files()

    new = node.start(pod_uid=POD_B)
    assert (node.gpu_instances(), node.cdi_files()) == (instances, files)
    assert plugin.probe(old.sockets) == [] and plugin.probe(new.sockets) == []
    assert sorted(p.name for p in (node.sock_dir / "reg").iterdir()) == sorted(
        [f"{agent_process.DRIVER}-{POD_A}-reg.sock", f"{agent_process.DRIVER}-{POD_B}-reg.sock"]
    )
    assert _answer(new.prepare(first)) == answer
    assert node.gpu_instances() == instances

    assert old.terminate() == 0
    assert not old.sockets.dra.exists() and not old.sockets.registration.exists()
    assert plugin.probe(new.sockets) == []
    second = _held_claim(kube_client, node, "second", SECOND)
    assert [device for _, device, _ in _answer(new.prepare(second))] == [SECOND]
    assert new.unprepare(first).error == ""
    assert node.gpu_instances() == {MINOR: [(PROFILE_ID, 4, [0])]}
    assert [f for f in node.cdi_files() if first.uid in f] == []
    assert list(node.checkpoint().claims) == [second.uid]


def test_a_second_agent_without_a_pod_uid_refuses_to_start_and_the_first_keeps_serving(
    kube_client: client.Client, agent_node: agent_process.Node
) -> None:
    """Guards issue 15: a second agent on the same fixed socket names exits 1 with one line naming the socket and
    --pod-uid, before touching anything; the first agent's sockets still answer and its claim stays prepared."""
    node = agent_node
    first = node.start()
    claim = _held_claim(kube_client, node, "first", FIRST)
    answer = _answer(first.prepare(claim))
    instances, files = node.gpu_instances(), node.cdi_files()

    code, lines = node.refused()
    assert (code, lines) == (
        1,
        [
            f"dractl node-agent: error: another node agent is serving {node.sockets().dra}: stop it first, or give "
            "each agent its own sockets with --pod-uid (rolling updates)"
        ],
    )
    assert plugin.probe(node.sockets()) == []
    assert _answer(first.prepare(claim)) == answer
    assert (node.gpu_instances(), node.cdi_files()) == (instances, files)
