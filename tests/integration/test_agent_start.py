"""The node agent's start while the API server cannot be reached: it waits in the process, /healthz says so, and a
stop or SIGTERM ends the wait with exit 0.

Each test runs `agent.run()` (fake GPUs, its client built from a kubeconfig: a fault proxy in front of the session's
API server, or a port nothing listens on), with its JSON log in a file, and watches what it logs and serves; every
wait is bounded.
"""

from __future__ import annotations

import os
import pathlib
import signal
import threading
import urllib.error
import uuid
from typing import Any

import controlplane
import faultproxy
import pytest
import yaml
from support import kubelet, observe

from dractl import config
from dractl.kube import client
from dractl.node import agent

pytestmark = pytest.mark.timeout(180)

DRIVER = config.DEFAULT_DRIVER_NAME
WAITING = "cannot reach the API server; trying again"
# Generous for a 2-core machine shared with other test runs; each wait ends as soon as its condition holds.
TIMEOUT_S = 60.0


class Running:
    """`agent.run()` on a thread of its own (so it installs no signal handler), its log in `log`; `end()` sets the
    stop event and returns the exit code."""

    def __init__(self, settings: config.NodeAgent, node_agent: agent.Agent, log: pathlib.Path) -> None:
        self.log = log
        self.stop = threading.Event()
        self._codes: list[int] = []
        self._out = log.open("w", encoding="utf-8", buffering=1)
        self._thread = threading.Thread(target=self._run, args=(settings, node_agent), name="test-agent-run")
        self._thread.start()

    def _run(self, settings: config.NodeAgent, node_agent: agent.Agent) -> None:
        self._codes.append(agent.run(settings, err=self._out, stop=self.stop, agent=node_agent))

    def waits(self) -> list[dict[str, Any]]:
        """The wait's warnings logged so far."""
        return [e for e in observe.log_entries(self.log) if e.get("event") == WAITING]

    def ended(self) -> bool:
        """Whether run() has returned (without the stop event, when asked before `end()`)."""
        return not self._thread.is_alive()

    def end(self) -> int | None:
        """Set the stop event and wait (bounded) for run() to return; its exit code, None if it did not return."""
        self.stop.set()
        self._thread.join(timeout=30)
        self._out.close()
        return None if self._thread.is_alive() else self._codes[0]


def _health(node_agent: agent.Agent) -> tuple[int, str]:
    """/healthz's answer; (0, "") while it is not bound yet."""
    return (0, "") if node_agent.health_port is None else observe.get(node_agent.health_port, "/healthz")


def _sockets() -> set[str]:
    """This process's open sockets (the `socket:[inode]` links under /proc/self/fd)."""
    found = set()
    for fd in pathlib.Path("/proc/self/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue  # Closed since the listing (the listing's own descriptor, or another thread's).
        if target.startswith("socket:"):
            found.add(target)
    return found


def test_an_api_server_answering_503_at_start_is_waited_for_then_the_agent_publishes(
    kube_client: client.Client, fault_proxy: faultproxy.FaultProxy, sock_dir: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    """Guards: 503s at start (a control plane being upgraded) are waited for in the process, one warning per try
    naming the server, the error and the next delay (1 s, doubling); /healthz answers 200 naming the wait and
    /metrics is not bound yet; once the server answers, the agent starts, publishes its slices and binds /metrics on
    the Node's InternalIP (not on loopback for good)."""
    node = f"node-{uuid.uuid4().hex[:8]}"
    created = kube_client.create(client.NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
    created["status"] = {"addresses": [{"type": "InternalIP", "address": "127.0.0.2"}]}
    kube_client.update_status(client.NODES, created)
    fault_proxy.add(faultproxy.respond(503, path="/version", count=None, reason="ServiceUnavailable"))
    server = f"https://127.0.0.1:{fault_proxy.port}"
    settings = kubelet.agent_settings(
        tmp_path,
        sock_dir,
        node_name=node,
        fake_profile="t4-x2",
        kubeconfig=fault_proxy.kubeconfig,
        health_port=0,
        metrics_port=0,
        log_format=config.LogFormat.JSON,
    )
    node_agent = agent.Agent(settings, health_poll_s=0.05)

    def published() -> bool:
        found, _ = kube_client.list_resource_slices(field_selector=f"spec.nodeName={node},spec.driver={DRIVER}")
        return sorted(d.name for s in found for d in s.devices) == ["gpu-0", "gpu-1"]

    running = Running(settings, node_agent, tmp_path / "agent.log")
    try:
        controlplane.wait_until(lambda: len(running.waits()) >= 2, what="two tries logged", timeout=TIMEOUT_S)
        status, text = _health(node_agent)
        assert status == 200 and text.startswith(f"waiting for the API server {server}: 503 ServiceUnavailable"), text
        assert node_agent.metrics_port is None
        assert not published()
        fault_proxy.clear()  # The server answers from now on.

        controlplane.wait_until(published, what="the slices published after the wait", timeout=TIMEOUT_S)
        controlplane.wait_until(
            lambda: _health(node_agent) == (200, "ok\n"), what="/healthz ok once started", timeout=TIMEOUT_S
        )
        waits = running.waits()
        assert [w["retry_in_s"] for w in waits[:2]] == [1.0, 2.0]
        assert all(w["level"] == "warning" and w["server"] == server for w in waits)
        assert all(w["error"].startswith("503 ServiceUnavailable") for w in waits)
        status, text = observe.get(node_agent.metrics_port, "/metrics", host="127.0.0.2")
        assert status == 200 and "dractl_node_published_devices 2.0" in text
    finally:
        code = running.end()
    assert code == 0
    assert "dractl node-agent: error" not in running.log.read_text()


def test_an_api_server_nothing_answers_is_waited_for_and_a_stop_ends_the_wait(
    sock_dir: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    """Guards: an API server nothing answers at start is waited for (not one line and exit 1, which the kubelet's
    restart back-off would stretch to minutes): the warning names the server and the connection error, /healthz
    answers 200 naming the wait (the chart's livenessProbe must not restart the pod for it) and /metrics is not bound
    meanwhile; setting the stop event ends run() with 0 and leaves no socket, port or thread."""
    kubeconfig = controlplane.unreachable_kubeconfig(tmp_path / "kubeconfig")
    server = yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    settings = kubelet.agent_settings(
        tmp_path, sock_dir, kubeconfig=kubeconfig, health_port=0, metrics_port=0, log_format=config.LogFormat.JSON
    )
    node_agent = agent.Agent(settings)
    threads, sockets = set(threading.enumerate()), _sockets()
    running = Running(settings, node_agent, tmp_path / "agent.log")
    try:
        controlplane.wait_until(running.waits, what="a try logged", timeout=TIMEOUT_S)
        status, text = _health(node_agent)
        assert status == 200 and text.startswith(f"waiting for the API server {server}: GET /version: "), text
        [first, *_] = running.waits()
        assert first["server"] == server and first["retry_in_s"] == 1.0 and "Connection refused" in first["error"]
        assert node_agent.metrics_port is None
        port = node_agent.health_port
    finally:
        code = running.end()
    assert code == 0
    assert "dractl node-agent: error" not in running.log.read_text()
    with pytest.raises(urllib.error.URLError):
        observe.get(port, "/healthz")
    # The endpoint's last request thread may still be closing its connection when run() returns.
    controlplane.wait_until(
        lambda: set(threading.enumerate()) <= threads and _sockets() <= sockets,
        what="no thread or socket of the agent left",
        timeout=TIMEOUT_S,
    )


@pytest.mark.parametrize("server", ["not a url", "", "ftp://127.0.0.1:6443"], ids=["not-a-url", "empty", "not-http"])
def test_a_malformed_server_url_is_one_line_and_exit_1_not_a_wait(
    server: str, sock_dir: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    """Guards: a kubeconfig whose server is not an http(s) URL (`not a url`, an empty `server:`) is a configuration
    error, not an unreachable server: run() (which would wait for an unreachable one) ends by itself with exit 1 and
    one line naming the kubeconfig and the server, having tried nothing and bound nothing."""
    kubeconfig = controlplane.write_kubeconfig(tmp_path / "kubeconfig", server=server)
    settings = kubelet.agent_settings(
        tmp_path, sock_dir, kubeconfig=kubeconfig, health_port=0, log_format=config.LogFormat.JSON
    )
    node_agent = agent.Agent(settings)
    running = Running(settings, node_agent, tmp_path / "agent.log")
    try:
        controlplane.wait_until(running.ended, what="run() returned by itself", timeout=TIMEOUT_S)
    finally:
        code = running.end()
    assert code == 1
    assert running.waits() == []
    assert node_agent.health_port is None
    assert running.log.read_text().splitlines() == [
        f"dractl node-agent: error: cannot build a Kubernetes client from kubeconfig {kubeconfig}: the cluster's "
        f"server {server!r} is not a URL such as https://HOST:PORT"
    ]


def test_sigterm_while_waiting_for_the_api_server_exits_0(sock_dir: pathlib.Path, tmp_path: pathlib.Path) -> None:
    """Guards: run() installs its SIGTERM handler before the start, so the kubelet stopping a pod whose agent waits
    for the API server ends the wait with exit 0 (not the signal's default action), the handlers restored after."""
    kubeconfig = controlplane.unreachable_kubeconfig(tmp_path / "kubeconfig")
    log = tmp_path / "agent.log"
    settings = kubelet.agent_settings(
        tmp_path, sock_dir, kubeconfig=kubeconfig, health_port=0, log_format=config.LogFormat.JSON
    )
    node_agent = agent.Agent(settings)
    original = signal.getsignal(signal.SIGTERM)
    fallback = threading.Event()
    failures: list[BaseException] = []

    def terminate_while_waiting() -> None:
        # SIGTERM only once the agent's handler is installed (else it would kill pytest); otherwise end run() by its
        # stop event and keep the reason for the test's thread.
        try:
            controlplane.wait_until(
                lambda: _health(node_agent)[1].startswith("waiting for the API server"),
                what="/healthz naming the wait",
                timeout=TIMEOUT_S,
            )
            assert signal.getsignal(signal.SIGTERM) is not original, "no SIGTERM handler while waiting"
        except BaseException as error:  # noqa: BLE001 - reported by the test's thread below
            failures.append(error)
            fallback.set()
        else:
            os.kill(os.getpid(), signal.SIGTERM)

    killer = threading.Thread(target=terminate_while_waiting, name="test-sigterm")
    killer.start()
    with log.open("w", encoding="utf-8", buffering=1) as out:
        code = agent.run(settings, err=out, agent=node_agent, stop=fallback)
    killer.join(timeout=30)
    assert failures == []
    assert code == 0
    assert signal.getsignal(signal.SIGTERM) is original
    assert [e["event"] for e in observe.log_entries(log)][-1] == "node agent stopped while waiting for the API server"


def test_start_without_a_stop_event_does_not_wait_for_the_api_server(
    sock_dir: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    """Guards: `Agent.start()` without a stop event (the tests that start an agent themselves) does not wait: an API
    server nothing answers is an AgentError at once, one line naming the server (not "answered: 0 ..."), with
    /healthz closed again."""
    kubeconfig = controlplane.unreachable_kubeconfig(tmp_path / "kubeconfig")
    server = yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    node_agent = agent.Agent(kubelet.agent_settings(tmp_path, sock_dir, kubeconfig=kubeconfig, health_port=0))
    with pytest.raises(agent.AgentError) as caught:
        node_agent.start()
    [line] = str(caught.value).splitlines()
    assert line.startswith(f"cannot start: cannot reach the API server {server}: GET /version: "), line
    with pytest.raises(urllib.error.URLError):
        observe.get(node_agent.health_port, "/healthz")
