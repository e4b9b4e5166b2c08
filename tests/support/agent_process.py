"""`dractl node-agent` run for real, as a subprocess on fake A100s with dynamic MIG, against a real API server.

A `Node` is one node's directories (state, CDI root, sockets) and its Node object; `Node.start` runs an agent
process on them (several at once for a rolling update, each with its own `--pod-uid`) and waits until it logs that
it serves; `Node.refused` runs one that must refuse to start and returns its output. What the agents left is read
from their files: the checkpoint and the fake's `fake-gpus.json`. Every process is ended by `Node.stop_all`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import signal
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import controlplane
import yaml

from dractl import config
from dractl._proto import dra_v1_pb2
from dractl.node import checkpoint, plugin
from support import kubelet, observe

ROOT = pathlib.Path(__file__).resolve().parents[2]
DRIVER = config.DEFAULT_DRIVER_NAME
# Generous bounds for a 2-core machine shared with other test runs; each wait ends as soon as its condition holds.
START_TIMEOUT_S = 60.0


def write_profile(path: pathlib.Path, *, faults: list[dict[str, Any]]) -> None:
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
class Agent:
    """One agent process of a node, and its log."""

    node: Node
    process: subprocess.Popen[bytes]
    log: pathlib.Path
    pod_uid: str

    @property
    def sockets(self) -> plugin.Sockets:
        return self.node.sockets(self.pod_uid)

    def log_text(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def log_entries(self) -> list[dict[str, Any]]:
        return observe.log_entries(self.log)

    def started(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"the node agent exited with {self.process.returncode}:\n{self.log_text()}")
        return any(entry.get("event") == "node agent started" for entry in self.log_entries())

    def kill(self) -> None:
        """SIGKILL: the process gets no chance to roll back or clean up anything."""
        assert self.process.poll() is None, self.log_text()
        os.kill(self.process.pid, signal.SIGKILL)
        assert self.process.wait(timeout=30) == -signal.SIGKILL

    def terminate(self) -> int:
        """SIGTERM, as the kubelet stops a pod; returns the exit code (bounded wait)."""
        assert self.process.poll() is None, self.log_text()
        self.process.terminate()
        return self.process.wait(timeout=60)

    def stop(self) -> None:
        """End this process (by its PID), whatever state it is in. Idempotent."""
        controlplane.stop_process(self.process, grace=20.0)

    def prepare(self, claim: dra_v1_pb2.Claim) -> dra_v1_pb2.NodePrepareResourceResponse:
        return kubelet.prepare(self.sockets.dra, claim)[claim.uid]

    def unprepare(self, claim: dra_v1_pb2.Claim) -> dra_v1_pb2.NodeUnprepareResourceResponse:
        return kubelet.unprepare(self.sockets.dra, claim)[claim.uid]


@dataclasses.dataclass(slots=True)
class Node:
    """One node's directories and Kubernetes objects, and the agent processes run for it."""

    name: str
    namespace: str
    kubeconfig: pathlib.Path
    profile: pathlib.Path
    state_dir: pathlib.Path
    cdi_root: pathlib.Path
    sock_dir: pathlib.Path
    logs: pathlib.Path
    agents: list[Agent] = dataclasses.field(default_factory=list)

    def sockets(self, pod_uid: str = "") -> plugin.Sockets:
        return plugin.socket_paths(
            driver_name=DRIVER,
            registrar_dir=self.sock_dir / "reg",
            plugins_dir=self.sock_dir / "plugins",
            pod_uid=pod_uid,
        )

    def _launch(self, *, faults: list[dict[str, Any]], pod_uid: str) -> Agent:
        write_profile(self.profile, faults=faults)
        log = self.logs / f"agent-{len(self.agents) + 1}.log"
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
        if pod_uid:
            args += ["--pod-uid", pod_uid]
        env = {key: value for key, value in os.environ.items() if not key.startswith("DRACTL_") and key != "POD_UID"}
        with log.open("wb") as out:
            process = subprocess.Popen(args, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        agent = Agent(node=self, process=process, log=log, pod_uid=pod_uid)
        self.agents.append(agent)
        return agent

    def start(self, *, faults: Sequence[dict[str, Any]] = (), pod_uid: str = "") -> Agent:
        """Start `dractl node-agent` and wait until it logs that it serves (bounded)."""
        agent = self._launch(faults=list(faults), pod_uid=pod_uid)
        controlplane.wait_until(
            agent.started, what=f"the node agent logged that it started ({agent.log})", timeout=START_TIMEOUT_S
        )
        return agent

    def refused(self, *, pod_uid: str = "") -> tuple[int, list[str]]:
        """Run an agent that must not start: wait for it to exit (bounded) and return its exit code and the lines
        it wrote that are not JSON log entries (what a person reads: the error line)."""
        agent = self._launch(faults=[], pod_uid=pod_uid)
        code = agent.process.wait(timeout=START_TIMEOUT_S)
        lines = [line for line in agent.log_text().splitlines() if not line.startswith("{")]
        return code, lines

    def stop_all(self) -> None:
        for agent in self.agents:
            agent.stop()

    # --- what the agents left on disk ----------------------------------------------------------

    @property
    def checkpoint_path(self) -> pathlib.Path:
        return self.state_dir / "checkpoint.json"

    def checkpoint(self) -> checkpoint.Checkpoint:
        # An empty boot id skips the reboot check: the test reads what the agent wrote, as is.
        loaded = checkpoint.load(self.checkpoint_path, boot_id="")
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
