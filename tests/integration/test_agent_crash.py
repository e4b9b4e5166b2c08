"""Crash safety of `dractl node-agent` as a real process: SIGKILLed between PrepareStarted and PrepareCompleted.

Each test runs the agent as a subprocess (`python -m dractl node-agent`) on fake A100s with
dynamic MIG, against the session's real kube-apiserver. A `faults:` entry in the custom
profile file makes the agent hang in `create_compute_instance`, right after it created the
GPU instance of the claim's MIG device, with the checkpoint saying PrepareStarted. The test
SIGKILLs it there (nothing in the agent runs: no rollback, no cleanup), restarts it on the
same directories with the fault removed, and checks that the next NodePrepareResources or
NodeUnprepareResources converges with no leaked GPU instance, compute instance or CDI file.
The same holds when the checkpoint is corrupt on restart (a Warning Event, then the sweep),
when the claim is deleted while the agent is down (the start-up sweep), and for a graceful
SIGTERM during the stuck call (closing the fake ends the hang; the prepare rolls back).
What the agent left is read from its files: the checkpoint and the fake's `fake-gpus.json`.
"""

from __future__ import annotations

import collections.abc
import contextlib
import dataclasses
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import uuid
from typing import Any

import controlplane
import grpc
import pytest
import yaml
from support import kube_objects

from dractl import config
from dractl._proto import dra_v1_pb2, dra_v1_pb2_grpc
from dractl.kube import client
from dractl.node import cdi, checkpoint, plugin, slices

pytestmark = pytest.mark.timeout(240)

ROOT = pathlib.Path(__file__).resolve().parents[2]
DRIVER = config.DEFAULT_DRIVER_NAME
MINOR = 1
PROFILE_ID = 9  # 3g.40gb on A100-80GB
START = 4
DEVICE = slices.mig_device_name(MINOR, "3g.40gb", PROFILE_ID, START)
HANG = {"operation": "create_compute_instance", "action": "hang"}
# Generous bounds for a 2-core machine shared with other test runs; each wait ends as soon as its condition holds.
START_TIMEOUT_S = 60.0
HANG_TIMEOUT_S = 60.0
RPC_TIMEOUT_S = 60.0


def _write_profile(path: pathlib.Path, *, faults: list[dict[str, Any]]) -> None:
    """Two A100-80GB GPUs, MIG off; the same file name each time, since the fake state is tied to it."""
    document: dict[str, Any] = {
        "driverVersion": "580.126.20",
        "cudaDriverVersion": "13.0",
        "gpus": [
            {"model": "a100-sxm4-80gb", "pciBusID": "0000:07:00.0"},
            {"model": "a100-sxm4-80gb", "pciBusID": "0000:0f:00.0"},
        ],
    }
    if faults:
        document["faults"] = faults
    path.write_text(yaml.safe_dump(document), encoding="utf-8")


@dataclasses.dataclass(slots=True)
class Node:
    """One node's directories and Kubernetes objects, and the agent process running for it."""

    name: str
    namespace: str
    kubeconfig: pathlib.Path
    profile: pathlib.Path
    state_dir: pathlib.Path
    cdi_root: pathlib.Path
    sock_dir: pathlib.Path
    logs: pathlib.Path
    process: subprocess.Popen[bytes] | None = None
    log: pathlib.Path | None = None
    starts: int = 0

    @property
    def sockets(self) -> plugin.Sockets:
        return plugin.socket_paths(
            driver_name=DRIVER, registrar_dir=self.sock_dir / "reg", plugins_dir=self.sock_dir / "plugins"
        )

    def start(self, *, faults: list[dict[str, Any]]) -> None:
        """Start `dractl node-agent` and wait until it logs that it serves (bounded)."""
        assert self.process is None or self.process.poll() is not None
        _write_profile(self.profile, faults=faults)
        self.starts += 1
        self.log = self.logs / f"agent-{self.starts}.log"
        args = [
            sys.executable,
            "-m",
            "dractl",
            "node-agent",
            "--node-name",
            self.name,
            "--device-source",
            "fake",
            "--fake-profile",
            str(self.profile),
            "--mig-mode",
            "dynamic",
            "--cdi-root",
            str(self.cdi_root),
            "--kubelet-registrar-dir",
            str(self.sock_dir / "reg"),
            "--kubelet-plugins-dir",
            str(self.sock_dir / "plugins"),
            "--state-dir",
            str(self.state_dir),
            "--kubeconfig",
            str(self.kubeconfig),
            "--health-port=-1",
            "--metrics-port=-1",
            "--log-format",
            "json",
        ]
        env = {key: value for key, value in os.environ.items() if not key.startswith("DRACTL_")}
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(args, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        controlplane.wait_until(
            self._started, what=f"the node agent logged that it started ({self.log})", timeout=START_TIMEOUT_S
        )

    def _started(self) -> bool:
        assert self.process is not None and self.log is not None
        if self.process.poll() is not None:
            raise AssertionError(f"the node agent exited with {self.process.returncode}:\n{self.log_text()}")
        return any(entry.get("event") == "node agent started" for entry in self.log_entries())

    def log_text(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace") if self.log is not None else ""

    def log_entries(self) -> list[dict[str, Any]]:
        entries = []
        for line in self.log_text().splitlines():
            with contextlib.suppress(ValueError):
                entry = json.loads(line)
                if isinstance(entry, dict):
                    entries.append(entry)
        return entries

    def kill(self) -> None:
        """SIGKILL: the process gets no chance to roll back or clean up anything."""
        assert self.process is not None and self.process.poll() is None, self.log_text()
        os.kill(self.process.pid, signal.SIGKILL)
        assert self.process.wait(timeout=30) == -signal.SIGKILL

    def stop(self) -> None:
        """End the agent this test started (by its PID), whatever state it is in. Idempotent."""
        if self.process is not None:
            controlplane.stop_process(self.process, grace=20.0)

    # --- what the agent left on disk -----------------------------------------------------------

    def checkpoint(self) -> checkpoint.Checkpoint:
        # An empty boot id skips the reboot check: the test reads what the agent wrote, as is.
        loaded = checkpoint.load(self.state_dir / "checkpoint.json", boot_id="")
        assert loaded.warning is None, loaded.warning
        return loaded.checkpoint

    def gpu_instances(self) -> dict[int, list[tuple[int, int, list[int]]]]:
        """GPU instances in the fake's state file, per minor: (profile id, placement start, compute instance ids)."""
        path = self.state_dir / "fake-gpus.json"
        if not path.exists():
            return {}
        document = json.loads(path.read_text(encoding="utf-8"))
        return {
            int(minor): [(gi["profileId"], gi["start"], gi["computeInstances"]) for gi in gpu["gpuInstances"]]
            for minor, gpu in document["gpus"].items()
            if gpu["gpuInstances"]
        }

    def cdi_files(self) -> list[str]:
        return sorted(p.name for p in self.cdi_root.iterdir()) if self.cdi_root.exists() else []


@pytest.fixture
def node(
    control_plane: controlplane.ControlPlane, kube_client: client.Client, namespace: str, tmp_path: pathlib.Path
) -> collections.abc.Iterator[Node]:
    """A Node object, a DeviceClass and the directories of one agent; the agent is stopped at the end."""
    name = f"node-{uuid.uuid4().hex[:8]}"
    kube_client.create(client.NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    kube_client.create(
        client.DEVICE_CLASSES,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": f"mig-{name}"},
            "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}]},
        },
    )
    # Unix socket paths are limited to 107 bytes, so the sockets live in a short /tmp directory.
    sock_dir = pathlib.Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))
    (tmp_path / "logs").mkdir()
    found = Node(
        name=name,
        namespace=namespace,
        kubeconfig=pathlib.Path(control_plane.kubeconfig),
        profile=tmp_path / "a100-crash.yaml",
        state_dir=tmp_path / "state",
        cdi_root=tmp_path / "cdi",
        sock_dir=sock_dir,
        logs=tmp_path / "logs",
    )
    try:
        yield found
    finally:
        found.stop()
        shutil.rmtree(sock_dir, ignore_errors=True)
        with contextlib.suppress(client.NotFound):
            kube_client.delete(client.DEVICE_CLASSES, f"mig-{name}")


def _allocated_claim(kube_client: client.Client, node: Node, name: str = "mig") -> dra_v1_pb2.Claim:
    """A ResourceClaim for one 3g.40gb MIG device, allocated to the node's dynamic MIG device at slice 4."""
    created = kube_objects.create_allocated_claim(
        kube_client,
        name,
        namespace=node.namespace,
        spec=kube_objects.claim_spec(f"mig-{node.name}", request="mig"),
        allocated=kube_objects.allocation(node.name, [DEVICE], request="mig"),
    )
    return dra_v1_pb2.Claim(namespace=node.namespace, name=name, uid=created["metadata"]["uid"])


def _prepare(node: Node, claim: dra_v1_pb2.Claim) -> dra_v1_pb2.NodePrepareResourceResponse:
    with grpc.insecure_channel(f"unix:{node.sockets.dra}") as channel:
        response = dra_v1_pb2_grpc.DRAPluginStub(channel).NodePrepareResources(
            dra_v1_pb2.NodePrepareResourcesRequest(claims=[claim]), timeout=RPC_TIMEOUT_S
        )
    return response.claims[claim.uid]


def _unprepare(node: Node, claim: dra_v1_pb2.Claim) -> dra_v1_pb2.NodeUnprepareResourceResponse:
    with grpc.insecure_channel(f"unix:{node.sockets.dra}") as channel:
        response = dra_v1_pb2_grpc.DRAPluginStub(channel).NodeUnprepareResources(
            dra_v1_pb2.NodeUnprepareResourcesRequest(claims=[claim]), timeout=RPC_TIMEOUT_S
        )
    return response.claims[claim.uid]


class HungPrepare:
    """NodePrepareResources called in a thread, as the kubelet would, against an agent that will hang in it."""

    def __init__(self, node: Node, claim: dra_v1_pb2.Claim) -> None:
        self.outcome: list[object] = []
        self._thread = threading.Thread(target=self._call, args=(node, claim), daemon=True)
        self._thread.start()

    def _call(self, node: Node, claim: dra_v1_pb2.Claim) -> None:
        try:
            self.outcome.append(_prepare(node, claim))
        except grpc.RpcError as error:
            self.outcome.append(error)

    def failed(self) -> grpc.RpcError:
        """The call's error once the agent is dead: it must not have reported success (bounded wait)."""
        self._thread.join(timeout=RPC_TIMEOUT_S)
        assert not self._thread.is_alive(), "NodePrepareResources did not end after the agent was killed"
        (outcome,) = self.outcome
        assert isinstance(outcome, grpc.RpcError), f"the hung prepare returned {outcome!r}"
        return outcome


def _hang_in_prepare(node: Node, claim: dra_v1_pb2.Claim) -> HungPrepare:
    """Start the agent with the hang fault, call prepare, and wait until it is stuck between
    PrepareStarted and PrepareCompleted with the GPU instance made; return the pending call."""
    node.start(faults=[HANG])
    call = HungPrepare(node, claim)

    def stuck() -> bool:
        if node.process is not None and node.process.poll() is not None:
            raise AssertionError(f"the node agent exited:\n{node.log_text()}")
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
    return call


def _assert_nothing_left(node: Node, claim: dra_v1_pb2.Claim) -> None:
    assert node.gpu_instances() == {}
    assert node.cdi_files() == []
    assert claim.uid not in node.checkpoint().claims


def test_killed_mid_prepare_then_prepared_again_leaks_nothing(kube_client: client.Client, node: Node) -> None:
    """Guards issue 6's crash safety: SIGKILL between PrepareStarted and PrepareCompleted, restart, prepare again:
    one GPU and compute instance for the placement, one CDI file, PrepareCompleted; unprepare then leaves nothing."""
    claim = _allocated_claim(kube_client, node)
    call = _hang_in_prepare(node, claim)
    node.kill()
    assert call.failed().code() is grpc.StatusCode.UNAVAILABLE
    assert node.checkpoint().claims[claim.uid].phase is checkpoint.Phase.STARTED

    node.start(faults=[])
    prepared = _prepare(node, claim)
    assert prepared.error == ""
    assert [(d.pool_name, d.device_name) for d in prepared.devices] == [(node.name, DEVICE)]
    assert [list(d.cdi_device_ids) for d in prepared.devices] == [[cdi.qualified_name(claim.uid, DEVICE)]]
    assert node.gpu_instances() == {MINOR: [(PROFILE_ID, START, [0])]}
    assert cdi.claim_specs(node.cdi_root) == {claim.uid: node.cdi_root / node.cdi_files()[0]}
    assert node.cdi_files() == [cdi.spec_path(node.cdi_root, claim.uid).name]
    record = node.checkpoint().claims[claim.uid]
    assert record.phase is checkpoint.Phase.COMPLETED
    assert [(m.device, m.gi_id, m.ci_id) for m in record.mig] == [(DEVICE, 1, 0)]

    assert _unprepare(node, claim).error == ""
    _assert_nothing_left(node, claim)


def test_killed_mid_prepare_then_unprepared_leaks_nothing(kube_client: client.Client, node: Node) -> None:
    """Guards the kubelet giving up: SIGKILL mid-prepare, restart, NodeUnprepareResources with no prepare in
    between removes the GPU instance the dead agent made, and no CDI file or record is left."""
    claim = _allocated_claim(kube_client, node)
    call = _hang_in_prepare(node, claim)
    node.kill()
    call.failed()

    node.start(faults=[])
    # The start-up sweep keeps the instance: the interrupted record still owns it and its claim exists.
    assert node.gpu_instances() == {MINOR: [(PROFILE_ID, START, [])]}
    assert _unprepare(node, claim).error == ""
    _assert_nothing_left(node, claim)


def test_corrupt_checkpoint_on_restart_is_a_warning_event_and_the_agent_serves(
    kube_client: client.Client, node: Node
) -> None:
    """Guards a corrupt checkpoint after a crash: a NodeStateReset Warning Event on the Node, the agent keeps
    running (no crash loop), its sweep removes the orphaned GPU instance, and the claim prepares once."""
    claim = _allocated_claim(kube_client, node)
    call = _hang_in_prepare(node, claim)
    node.kill()
    call.failed()
    (node.state_dir / "checkpoint.json").write_text('{"version": 1, "checksum": "0", "data": {', encoding="utf-8")

    node.start(faults=[])

    def reset_events() -> list[dict[str, Any]]:
        events = kube_client.list(client.EVENTS, namespace="default").items
        return [e for e in events if e["involvedObject"].get("name") == node.name and e["reason"] == "NodeStateReset"]

    (event,) = reset_events()
    assert event["type"] == "Warning" and event["involvedObject"]["kind"] == "Node"
    assert "checkpoint" in event["message"] and "corrupt" in event["message"]
    assert node.gpu_instances() == {}  # nothing owns the instance any more, so the start-up sweep destroyed it

    prepared = _prepare(node, claim)
    assert prepared.error == "" and [d.device_name for d in prepared.devices] == [DEVICE]
    assert node.gpu_instances() == {MINOR: [(PROFILE_ID, START, [0])]}
    assert node.cdi_files() == [cdi.spec_path(node.cdi_root, claim.uid).name]
    assert node.process is not None and node.process.poll() is None

    # A second restart finds the checkpoint the first one rewrote: no new warning, the claim still prepared.
    node.stop()
    node.start(faults=[])
    assert [e["count"] for e in reset_events()] == [1]
    assert node.checkpoint().claims[claim.uid].phase is checkpoint.Phase.COMPLETED
    assert _prepare(node, claim).error == ""
    assert node.gpu_instances() == {MINOR: [(PROFILE_ID, START, [0])]}


def test_killed_mid_prepare_and_claim_deleted_meanwhile_is_swept_at_start(
    kube_client: client.Client, node: Node
) -> None:
    """Guards the kubelet never coming back for the claim: SIGKILL mid-prepare, the ResourceClaim deleted while
    the agent is down; the restarted agent's start-up sweep alone removes the GPU instance and the record."""
    claim = _allocated_claim(kube_client, node)
    call = _hang_in_prepare(node, claim)
    node.kill()
    call.failed()
    kube_client.delete(client.RESOURCE_CLAIMS, claim.name, namespace=claim.namespace)

    node.start(faults=[])
    _assert_nothing_left(node, claim)
    assert node.checkpoint().claims == {}


def test_sigterm_mid_prepare_rolls_back_and_exits(kube_client: client.Client, node: Node) -> None:
    """Guards a graceful stop during a stuck prepare: the agent exits 0 within the deadline, the prepare fails
    (never a success the kubelet would trust), and its rollback leaves no GPU instance, CDI file or record."""
    claim = _allocated_claim(kube_client, node)
    call = _hang_in_prepare(node, claim)
    assert node.process is not None
    node.process.terminate()
    assert node.process.wait(timeout=60) == 0, node.log_text()
    call.failed()
    _assert_nothing_left(node, claim)
