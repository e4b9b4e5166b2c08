"""The node agent's slices against a real kube-apiserver when someone else changes them, and what /healthz says.

Each test starts an in-process agent (fake GPUs, its client built from a kubeconfig: the session's
API server or a fault proxy in front of it), then deletes or edits its slices, deletes and
registers its Node again, or breaks publishing, and waits (bounded) until the API holds exactly
the agent's slices again or /healthz names the problem.
"""

from __future__ import annotations

import collections.abc
import contextlib
import pathlib
import urllib.error
import uuid
from typing import Any

import controlplane
import faultproxy
import pytest
import structlog
from support import kubelet, observe

from dractl import config
from dractl.kube import client
from dractl.model import encode
from dractl.node import agent, fakegpu

pytestmark = pytest.mark.timeout(240)

DRIVER = config.DEFAULT_DRIVER_NAME
# Generous for a 2-core machine shared with other test runs; each wait ends as soon as its condition holds.
REPAIR_TIMEOUT_S = 30.0


def _create_node(api: client.Client, name: str) -> str:
    return str(
        api.create(client.NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})["metadata"]["uid"]
    )


@pytest.fixture
def node_name(kube_client: client.Client) -> str:
    name = f"node-{uuid.uuid4().hex[:8]}"
    _create_node(kube_client, name)
    return name


@pytest.fixture
def start_agent(
    control_plane: controlplane.ControlPlane, sock_dir: pathlib.Path, tmp_path: pathlib.Path
) -> collections.abc.Iterator[collections.abc.Callable[..., agent.Agent]]:
    """Start an agent for a node (fake GPUs, the given kubeconfig or the session's); each is stopped after the test."""
    with contextlib.ExitStack() as stack:

        def start(
            node: str,
            *,
            kubeconfig: pathlib.Path | None = None,
            profile: str = "a100-80gb-x8",
            mig_mode: config.MigMode = config.MigMode.DYNAMIC,
            consumable_memory: bool = False,
            differ_grace_s: float = agent.SLICES_DIFFER_GRACE_S,
            gpus: fakegpu.FakeGpus | None = None,
        ) -> agent.Agent:
            settings = kubelet.agent_settings(
                tmp_path / node,
                sock_dir / node,
                node_name=node,
                fake_profile=profile,
                mig_mode=mig_mode,
                consumable_memory=consumable_memory,
                kubeconfig=kubeconfig or pathlib.Path(control_plane.kubeconfig),
                health_port=0,
                metrics_port=0,
            )
            gpus = gpus or fakegpu.FakeGpus(fakegpu.load_profile(profile), node_name=node)
            started = agent.Agent(settings, gpus=gpus, health_poll_s=0.05, differ_grace_s=differ_grace_s)
            started.start()
            stack.callback(started.stop)
            return started

        yield start


def _stored(api: client.Client, node: str) -> list[dict[str, Any]]:
    items = api.list(client.RESOURCE_SLICES, field_selector=f"spec.nodeName={node},spec.driver={DRIVER}").items
    return sorted(items, key=lambda raw: raw["metadata"]["name"])


def _matches(api: client.Client, node_agent: agent.Agent, *, owner_uid: str | None = None) -> bool:
    """Whether the API holds exactly the agent's slices (same names and specs, one generation), owned by the Node."""
    stored = _stored(api, node_agent.settings.node_name)
    wanted = sorted((encode.resource_slice(s) for s in node_agent.slices), key=lambda raw: raw["metadata"]["name"])
    if [raw["metadata"]["name"] for raw in stored] != [raw["metadata"]["name"] for raw in wanted]:
        return False
    if len({raw["spec"]["pool"]["generation"] for raw in stored}) != 1:
        return False
    for raw, body in zip(stored, wanted, strict=True):
        spec, want = dict(raw["spec"]), dict(body["spec"])
        if {**spec, "pool": {}} != {**want, "pool": {}}:
            return False
        if raw["spec"]["pool"]["resourceSliceCount"] != len(wanted):
            return False
        if owner_uid is not None and [o["uid"] for o in raw["metadata"].get("ownerReferences", ())] != [owner_uid]:
            return False
    return True


def _metric(node_agent: agent.Agent, name: str) -> float:
    value = node_agent.metrics.registry.get_sample_value(name)
    return 0.0 if value is None else value


def test_a_deleted_slice_and_then_every_slice_come_back(
    kube_client: client.Client, node_name: str, start_agent: collections.abc.Callable[..., agent.Agent]
) -> None:
    """Guards the repair of deletions: one slice deleted with kubectl, then all of them (what the kubelet does when
    it starts), are published again within seconds; the repairs are counted and /healthz stays 200."""
    node_agent = start_agent(node_name)
    assert _matches(kube_client, node_agent)
    victim = _stored(kube_client, node_name)[3]["metadata"]["name"]
    kube_client.delete(client.RESOURCE_SLICES, victim)
    controlplane.wait_until(
        lambda: _matches(kube_client, node_agent), what=f"slice {victim} published again", timeout=REPAIR_TIMEOUT_S
    )
    for raw in _stored(kube_client, node_name):
        kube_client.delete(client.RESOURCE_SLICES, raw["metadata"]["name"])
    controlplane.wait_until(
        lambda: _matches(kube_client, node_agent), what="every slice published again", timeout=REPAIR_TIMEOUT_S
    )
    assert _metric(node_agent, "dractl_node_slice_repairs_total") >= 2
    # The echo of the agent's own writes may still be compared: wait for that publish.
    controlplane.wait_until(
        lambda: _metric(node_agent, "dractl_node_slices_in_sync") == 1, what="the slices in sync", timeout=30
    )
    assert observe.get(node_agent.health_port, "/healthz") == (200, "ok\n")


def test_an_edited_slice_is_rewritten(
    kube_client: client.Client, node_name: str, start_agent: collections.abc.Callable[..., agent.Agent]
) -> None:
    """Guards the repair of edits: a device's attribute changed and a device removed by someone else are put back
    as the agent publishes them."""
    node_agent = start_agent(node_name, profile="t4-x2", mig_mode=config.MigMode.STATIC)
    raw = _stored(kube_client, node_name)[0]
    raw["spec"]["devices"][0]["attributes"]["productName"] = {"string": "edited"}
    del raw["spec"]["devices"][1]
    kube_client.update(client.RESOURCE_SLICES, raw)
    controlplane.wait_until(
        lambda: _matches(kube_client, node_agent), what="the edited slice rewritten", timeout=REPAIR_TIMEOUT_S
    )
    devices = _stored(kube_client, node_name)[0]["spec"]["devices"]
    assert [d["attributes"]["productName"]["string"] for d in devices] == ["Tesla T4", "Tesla T4"]


def test_a_node_registered_again_owns_the_slices(
    kube_client: client.Client, node_name: str, start_agent: collections.abc.Callable[..., agent.Agent]
) -> None:
    """Guards the owner reference: after the Node is deleted and registered again (a new uid), the slices point at
    the new Node within seconds, without the agent being told."""
    node_agent = start_agent(node_name, profile="t4-x2", mig_mode=config.MigMode.STATIC)
    kube_client.delete(client.NODES, node_name)
    new_uid = _create_node(kube_client, node_name)
    controlplane.wait_until(
        lambda: _matches(kube_client, node_agent, owner_uid=new_uid),
        what="the slices owned by the new Node",
        timeout=REPAIR_TIMEOUT_S,
    )


def test_slices_deleted_with_their_node_come_back_once_it_is_registered_again(
    kube_client: client.Client,
    upstream: controlplane.Components,
    node_name: str,
    start_agent: collections.abc.Callable[..., agent.Agent],
) -> None:
    """Guards the Node's lifecycle beside kube-controller-manager: its garbage collector deletes the slices of a
    deleted Node; /healthz then names the missing Node; once it is registered again the slices are created, owned
    by the new uid, and /healthz is 200."""
    node_agent = start_agent(node_name, profile="t4-x2", mig_mode=config.MigMode.STATIC)
    kube_client.delete(client.NODES, node_name)
    controlplane.wait_until(
        lambda: not _stored(kube_client, node_name), what="the garbage collector deleting the slices", timeout=90
    )
    status, text = controlplane.wait_until(
        lambda: (answer := observe.get(node_agent.health_port, "/healthz"))[0] == 503 and answer,
        what="/healthz naming the missing Node",
        timeout=REPAIR_TIMEOUT_S,
    )
    assert f"node {node_name}: there is no Node object of that name" in text
    new_uid = _create_node(kube_client, node_name)
    controlplane.wait_until(
        lambda: _matches(kube_client, node_agent, owner_uid=new_uid),
        what="the slices created for the new Node",
        timeout=REPAIR_TIMEOUT_S,
    )
    assert observe.get(node_agent.health_port, "/healthz") == (200, "ok\n")


def test_a_wrong_node_name_fails_healthz_until_the_node_exists(
    kube_client: client.Client, start_agent: collections.abc.Callable[..., agent.Agent]
) -> None:
    """Guards --node-name: an agent for a node with no Node object serves, but /healthz is 503 naming it and the
    flag, and publishes nothing; when the Node appears, the slices follow without a restart."""
    name = f"node-missing-{uuid.uuid4().hex[:6]}"
    node_agent = start_agent(name, profile="t4-x2", mig_mode=config.MigMode.STATIC)
    status, text = observe.get(node_agent.health_port, "/healthz")
    assert status == 503
    assert text == (
        f"node {name}: there is no Node object of that name, so no ResourceSlice is published (is --node-name right?)\n"
    )
    assert _stored(kube_client, name) == []
    assert _metric(node_agent, "dractl_node_publish_failures_total") >= 1
    uid = _create_node(kube_client, name)
    controlplane.wait_until(
        lambda: _matches(kube_client, node_agent, owner_uid=uid), what="the slices published", timeout=REPAIR_TIMEOUT_S
    )
    assert observe.get(node_agent.health_port, "/healthz") == (200, "ok\n")


def test_slices_that_cannot_be_repaired_fail_healthz_and_show_in_metrics(
    kube_client: client.Client,
    fault_proxy: faultproxy.FaultProxy,
    node_name: str,
    start_agent: collections.abc.Callable[..., agent.Agent],
) -> None:
    """Guards the health condition "the API's slices differ from this node's": while every slice write fails, a
    deleted slice stays gone, /healthz turns 503 after the grace naming why, the in-sync gauge is 0 and failed
    publishes are counted; once writes work again the slice is back and /healthz is 200."""
    node_agent = start_agent(
        node_name, kubeconfig=fault_proxy.kubeconfig, profile="t4-x2", mig_mode=config.MigMode.STATIC, differ_grace_s=1
    )
    fault_proxy.add(faultproxy.respond(503, method="POST", path="/resourceslices", count=None))
    kube_client.delete(client.RESOURCE_SLICES, _stored(kube_client, node_name)[0]["metadata"]["name"])
    # While the first failing publish still retries, /healthz may already say that a change is being compared.
    status, text = controlplane.wait_until(
        lambda: (
            (answer := observe.get(node_agent.health_port, "/healthz"))[0] == 503
            and "publishing failed" in answer[1]
            and answer
        ),
        what="/healthz failing on slices that differ, after a failed publish",
        timeout=REPAIR_TIMEOUT_S,
    )
    assert text.startswith("the ResourceSlices in the API have differed from this node's for")
    assert "503 ServiceUnavailable" in text
    assert _metric(node_agent, "dractl_node_slices_in_sync") == 0
    assert _metric(node_agent, "dractl_node_publish_failures_total") >= 1
    metrics = observe.get(node_agent.metrics_port, "/metrics")[1]
    assert "process_resident_memory_bytes" in metrics and "python_info" in metrics
    fault_proxy.clear()
    node_agent.tick()
    controlplane.wait_until(
        lambda: _matches(kube_client, node_agent), what="the slice published again", timeout=REPAIR_TIMEOUT_S
    )
    assert observe.get(node_agent.health_port, "/healthz") == (200, "ok\n")


def test_a_second_agent_for_the_node_is_named_in_the_log_and_the_fight_backs_off(
    control_plane: controlplane.ControlPlane,
    node_name: str,
    sock_dir: pathlib.Path,
    tmp_path: pathlib.Path,
    start_agent: collections.abc.Callable[..., agent.Agent],
) -> None:
    """Guards against two agents for one node and driver (another release, another plugin directory) rewriting each
    other's slices at full speed: each write of one is a repair for the other, the log names the likely cause, and
    the repairs in a row back off instead of starting over at every echo."""
    first = start_agent(node_name, profile="t4-x2", mig_mode=config.MigMode.STATIC)
    settings = kubelet.agent_settings(
        tmp_path / "second",
        sock_dir / "second",
        node_name=node_name,
        fake_profile="a100-80gb-x8",
        mig_mode=config.MigMode.STATIC,
        kubeconfig=pathlib.Path(control_plane.kubeconfig),
        health_port=0,
        metrics_port=0,
    )
    gpus = fakegpu.FakeGpus(fakegpu.load_profile("a100-80gb-x8"), node_name=node_name)
    second = agent.Agent(settings, gpus=gpus, health_poll_s=0.05)
    with structlog.testing.capture_logs() as logs:
        second.start()
        try:
            hint = controlplane.wait_until(
                lambda: next((log for log in list(logs) if log["event"].startswith("another writer")), None),
                what="the log naming a second writer",
                timeout=REPAIR_TIMEOUT_S,
            )
        finally:
            second.stop()
    assert hint["node"] == node_name and hint["repairs_in_a_row"] >= agent.REPAIRS_BEFORE_HINT
    assert hint["next_publish_after_s"] >= 1.0
    assert _metric(first, "dractl_node_slice_repairs_total") + _metric(second, "dractl_node_slice_repairs_total") >= 3


def test_a_change_that_leaves_the_slices_as_published_writes_nothing(
    kube_client: client.Client,
    fault_proxy: faultproxy.FaultProxy,
    node_name: str,
    start_agent: collections.abc.Callable[..., agent.Agent],
) -> None:
    """Guards against a write loop: an event that leaves the slices' content as published (here an annotation
    someone adds; the agent's own writes come back the same way) wakes a publish that lists and writes nothing."""
    node_agent = start_agent(node_name, kubeconfig=fault_proxy.kubeconfig)
    controlplane.wait_until(node_agent.synced.in_sync, what="the slices in sync", timeout=REPAIR_TIMEOUT_S)
    fault_proxy.clear()
    name = _stored(kube_client, node_name)[0]["metadata"]["name"]
    kube_client.patch(client.RESOURCE_SLICES, name, {"metadata": {"annotations": {"example.com/seen": "yes"}}})
    controlplane.wait_until(
        lambda: any(
            r.method == "GET" and "/resourceslices?" in r.target and "watch=true" not in r.target
            for r in fault_proxy.requests
        ),
        what="the woken publisher listing the slices",
        timeout=REPAIR_TIMEOUT_S,
    )
    controlplane.wait_until(node_agent.synced.in_sync, what="the slices in sync", timeout=REPAIR_TIMEOUT_S)
    assert fault_proxy.writes() == []
    assert _metric(node_agent, "dractl_node_slice_repairs_total") == 0


def test_metrics_listen_on_the_nodes_internal_ip(
    kube_client: client.Client, start_agent: collections.abc.Callable[..., agent.Agent]
) -> None:
    """Guards the default --metrics-address: the Node's InternalIP (here 127.0.0.2, a loopback address), not every
    address of a host-network pod; /healthz stays on 127.0.0.1."""
    name = f"node-{uuid.uuid4().hex[:8]}"
    _create_node(kube_client, name)
    node = kube_client.get(client.NODES, name)
    node["status"] = {
        "addresses": [{"type": "Hostname", "address": name}, {"type": "InternalIP", "address": "127.0.0.2"}]
    }
    kube_client.update_status(client.NODES, node)
    node_agent = start_agent(name, profile="t4-x2", mig_mode=config.MigMode.STATIC)
    status, text = observe.get(node_agent.metrics_port, "/metrics", host="127.0.0.2")
    assert status == 200 and "dractl_node_published_devices 2.0" in text
    with pytest.raises(urllib.error.URLError):
        observe.get(node_agent.metrics_port, "/metrics")
    assert observe.get(node_agent.health_port, "/healthz") == (200, "ok\n")


# An API server that serves Kubernetes 1.35 (the 1.36 binary emulating it) with the DRA gates that were alpha
# then left off, as a 1.35 cluster has them by default.
GATES_OFF = "DRAPartitionableDevices=false,DRAConsumableCapacity=false,DRADeviceTaints=false,DRADeviceTaintRules=false"


@pytest.fixture(scope="module")
def plane_135() -> collections.abc.Iterator[controlplane.ControlPlane]:
    try:
        with controlplane.running(apiserver_args=["--emulated-version=1.35", f"--feature-gates={GATES_OFF}"]) as plane:
            yield plane
    except controlplane.Unavailable as missing:
        pytest.skip(str(missing))


@pytest.fixture
def client_135(plane_135: controlplane.ControlPlane) -> collections.abc.Iterator[client.Client]:
    connected = client.connect(plane_135.kubeconfig)
    try:
        yield connected
    finally:
        connected.close()


def test_the_server_version_is_the_emulated_one(client_135: client.Client, kube_client: client.Client) -> None:
    """Guards /version: the version a server serves is its emulated one (1.35 here), the binary's kept for
    messages; the session's server serves 1.36."""
    version = client_135.server_version()
    assert (version.major, version.minor) == (1, 35) and version.git_version.startswith("v1.36.")
    assert (kube_client.server_version().major, kube_client.server_version().minor) == (1, 36)


@pytest.mark.parametrize(
    ("flag", "flags", "gate"),
    [
        ("--mig-mode dynamic", {"mig_mode": config.MigMode.DYNAMIC}, "DRAPartitionableDevices"),
        (
            "--consumable-memory",
            {"profile": "t4-x2", "mig_mode": config.MigMode.STATIC, "consumable_memory": True},
            "DRAConsumableCapacity",
        ),
    ],
    ids=["dynamic-mig", "consumable-memory"],
)
def test_a_flag_whose_feature_gate_is_off_is_one_line_and_nothing_is_published(
    flag: str,
    flags: dict[str, Any],
    gate: str,
    client_135: client.Client,
    plane_135: controlplane.ControlPlane,
    start_agent: collections.abc.Callable[..., agent.Agent],
) -> None:
    """Guards the feature check: a flag that needs a gate the server has off ends the start with one line naming
    the flag, the gate and the server's version, and no slice is written (the server would have dropped the
    counters, and MIG placements would overlap)."""
    name = f"node-{uuid.uuid4().hex[:8]}"
    _create_node(client_135, name)
    with pytest.raises(agent.AgentError) as caught:
        start_agent(name, kubeconfig=pathlib.Path(plane_135.kubeconfig), **flags)
    message = str(caught.value)
    assert message.startswith(f"{flag} needs the {gate} feature gate, which is off on this API server (Kubernetes 1.35")
    assert f"--feature-gates={gate}=true; on by default from Kubernetes 1.36" in message
    assert _stored(client_135, name) == []


def test_without_device_taints_health_is_not_written_into_the_slices(
    client_135: client.Client,
    plane_135: controlplane.ControlPlane,
    start_agent: collections.abc.Callable[..., agent.Agent],
) -> None:
    """Guards dropped device taints: the agent starts, an XID leaves the published slices as they were (no taint the
    server would drop, so no rewrite loop), and the API holds exactly the agent's slices."""
    name = f"node-{uuid.uuid4().hex[:8]}"
    _create_node(client_135, name)
    gpus = fakegpu.FakeGpus(fakegpu.load_profile("t4-x2"), node_name=name)
    node_agent = start_agent(
        name, kubeconfig=pathlib.Path(plane_135.kubeconfig), mig_mode=config.MigMode.STATIC, gpus=gpus
    )
    before = node_agent.slices
    monitor = node_agent.monitor
    assert monitor is not None
    gpus.inject_xid(0, 79)
    controlplane.wait_until(lambda: monitor.taints()["gpu-0"], what="the XID seen by the monitor", timeout=30)
    controlplane.wait_until(node_agent.synced.in_sync, what="the slices in sync", timeout=REPAIR_TIMEOUT_S)
    assert node_agent.slices == before
    assert _matches(client_135, node_agent)
    assert all("taints" not in device for raw in _stored(client_135, name) for device in raw["spec"]["devices"])
