"""`dractl controller` as a real process against a real kube-apiserver: claims, probes, metrics, leader election,
and a leader paused past its lease (SIGSTOP) that must not write when it goes on.

Each replica is a subprocess (`python -m dractl controller`) with its own kubeconfig (or the fault
proxy's, to see its every request), scoped to the test's namespace (its watches and its Lease live
there), short lease timings, ephemeral ports and JSON logs, which the test reads to learn the
identity and ports. The test plays the API user with a direct client; every wait is a condition
with a deadline.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import controlplane
import faultproxy
import pytest
from prometheus_client import parser
from support import kube_objects, node_group, observe

from dractl.kube import client

pytestmark = pytest.mark.timeout(240)

ROOT = pathlib.Path(__file__).resolve().parents[2]
LEASE_DURATION = 6.0
RENEW_DEADLINE = 4.0
RETRY_PERIOD = 0.5
LEASE = "dractl-controller"
START_TIMEOUT = 60.0
TAKEOVER_TIMEOUT = 2 * LEASE_DURATION + 10  # the lease duration after the last renewal, plus scheduling slack


@dataclasses.dataclass(slots=True)
class Replica:
    """One `dractl controller` process: its log (JSON lines) and what it said about itself at start."""

    name: str
    process: subprocess.Popen[bytes]
    log: pathlib.Path
    identity: str = ""
    metrics_port: int = 0
    health_port: int = 0

    def entries(self) -> list[dict[str, Any]]:
        return observe.log_entries(self.log)

    def logged(self, event: str) -> dict[str, Any] | None:
        """The first log entry whose event starts with `event`; fails at once if the process has exited."""
        for entry in self.entries():
            if str(entry.get("event", "")).startswith(event):
                return entry
        if self.process.poll() is not None:
            raise AssertionError(f"{self.name} exited with {self.process.returncode}:\n{self.text()}")
        return None

    def text(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def wait_logged(self, event: str, *, timeout: float = START_TIMEOUT) -> dict[str, Any]:
        return controlplane.wait_until(
            lambda: self.logged(event), what=f"{self.name} logged {event!r} ({self.log})", timeout=timeout
        )

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float | None:
        """One sample from /metrics, or None when the series does not exist."""
        _, text = observe.get(self.metrics_port, "/metrics")
        for family in parser.text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v for k, v in (labels or {}).items()):
                    return float(sample.value)
        return None

    def wait_exit(self, *, timeout: float = 30.0) -> int:
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.name} did not exit within {timeout:g}s:\n{self.text()}") from None

    def stop(self) -> None:
        """End exactly this process, whatever state it is in. Idempotent."""
        controlplane.stop_process(self.process, grace=20.0)


@pytest.fixture
def kubeconfig(control_plane: controlplane.ControlPlane, tmp_path: pathlib.Path) -> pathlib.Path:
    """A kubeconfig file of the subprocesses' own (the admin identity of the session's API server)."""
    path = tmp_path / "controller.kubeconfig"
    shutil.copyfile(control_plane.kubeconfig, path)
    return path


@pytest.fixture
def start_replica(kubeconfig: pathlib.Path, namespace: str, tmp_path: pathlib.Path) -> Iterator[Callable[..., Replica]]:
    """Starts `dractl controller` replicas on the test namespace and waits until each serves; stops them at the end
    (last started first, each even when stopping another failed). `start(name, via=..., controllers=..., extra=...)`
    talks through the kubeconfig `via` (default: the test's own), runs `controllers` (default: claims) and takes the
    `extra` flags last."""
    with contextlib.ExitStack() as started:

        def start(
            name: str,
            *,
            via: pathlib.Path | None = None,
            controllers: Sequence[str] = ("claims",),
            extra: Sequence[str] = (),
        ) -> Replica:
            log = tmp_path / f"{name}.log"
            args = [
                sys.executable,
                "-m",
                "dractl",
                "controller",
                "--kubeconfig",
                str(via or kubeconfig),
                "--controllers",
                ",".join(controllers),
                "--namespace",
                namespace,
                "--lease-namespace",
                namespace,
                "--lease-duration",
                str(LEASE_DURATION),
                "--renew-deadline",
                str(RENEW_DEADLINE),
                "--retry-period",
                str(RETRY_PERIOD),
                "--metrics-port",
                "0",
                "--health-port",
                "0",
                "--log-format",
                "json",
                *extra,
            ]
            env = {key: value for key, value in os.environ.items() if not key.startswith("DRACTL_")}
            with log.open("wb") as sink:
                process = subprocess.Popen(args, cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT)
            replica = Replica(name=name, process=process, log=log)
            started.callback(replica.stop)
            entry = replica.wait_logged("controller started")
            replica.identity = str(entry["identity"])
            replica.metrics_port = int(entry["metrics_port"])
            replica.health_port = int(entry["health_port"])
            return replica

        yield start


def _lease(api: client.Client, namespace: str) -> dict[str, Any]:
    try:
        return api.get(client.LEASES, LEASE, namespace=namespace).get("spec") or {}
    except client.NotFound:
        return {}


def _holder(api: client.Client, namespace: str) -> str:
    return str(_lease(api, namespace).get("holderIdentity") or "")


def _template(api: client.Client, namespace: str) -> None:
    api.create(client.RESOURCE_CLAIM_TEMPLATES, kube_objects.template("gpu-template", namespace=namespace))


def _pod(api: client.Client, namespace: str, name: str) -> dict[str, Any]:
    body = kube_objects.pod(name, namespace=namespace, claims=[kube_objects.from_template("gpu-template")])
    return api.create(client.PODS, body)


def _claim_of(api: client.Client, namespace: str, pod: dict[str, Any]) -> str:
    """The claim recorded for the pod's `gpu` entry once it exists and the pod controls it, else ""."""
    status = api.get(client.PODS, pod["metadata"]["name"], namespace=namespace).get("status") or {}
    recorded = {e["name"]: e.get("resourceClaimName", "") for e in status.get("resourceClaimStatuses") or ()}
    name = recorded.get("gpu", "")
    if not name:
        return ""
    try:
        claim = api.get(client.RESOURCE_CLAIMS, name, namespace=namespace)
    except client.NotFound:
        return ""
    owners = claim["metadata"].get("ownerReferences") or []
    return name if any(ref.get("uid") == pod["metadata"]["uid"] and ref.get("controller") for ref in owners) else ""


def _wait_claim(api: client.Client, namespace: str, pod: dict[str, Any]) -> str:
    return controlplane.wait_until(
        lambda: _claim_of(api, namespace, pod), what=f"pod {pod['metadata']['name']} has its claim"
    )


def test_one_replica_leads_makes_claims_serves_probes_and_releases_the_lease_on_sigterm(
    kube_client: client.Client, namespace: str, start_replica: Callable[..., Replica]
) -> None:
    """Guards: the process leads, a pod with a claim template gets its claim, /readyz /healthz /metrics answer,
    stdlib logs come out as JSON, and SIGTERM exits 0 promptly with the lease released."""
    a = start_replica("a")
    a.wait_logged("controllers started")
    assert _holder(kube_client, namespace) == a.identity
    assert observe.get(a.health_port, "/readyz") == (200, "leader: claims synced\n")
    assert observe.get(a.health_port, "/healthz") == (200, "ok\n")
    assert a.metric("dractl_controller_leader") == 1
    assert a.metric("dractl_controller_queue_depth", {"controller": "claims"}) is not None
    # The first campaign found no Lease: one 404 on GET, counted by the process-level API error metric.
    assert a.metric("dractl_controller_api_errors_total", {"verb": "get", "resource": "leases", "code": "404"}) == 1

    _template(kube_client, namespace)
    pod = _pod(kube_client, namespace, "train")
    claim = _wait_claim(kube_client, namespace, pod)
    assert claim.startswith("train-gpu-")
    assert a.metric("dractl_claim_controller_creates_total", {"status": "success"}) == 1
    created = a.wait_logged("created ResourceClaim")
    assert created["logger"] == "dractl.controller.claims" and created["level"] == "info"

    a.process.send_signal(signal.SIGTERM)
    assert a.wait_exit(timeout=20) == 0
    assert _holder(kube_client, namespace) == ""
    assert a.logged("controller stopped") is not None
    assert "Traceback" not in a.text()


def test_two_replicas_one_leads_and_the_other_takes_over_when_it_is_killed(
    kube_client: client.Client, namespace: str, start_replica: Callable[..., Replica]
) -> None:
    """Guards: of two replicas only the Lease holder runs controllers (the standby builds none and is ready);
    after SIGKILL of the leader the standby takes over within the lease duration and keeps making claims, without
    a duplicate; its SIGTERM releases the lease."""
    a = start_replica("a")
    a.wait_logged("controllers started")
    b = start_replica("b")
    assert observe.get(b.health_port, "/readyz") == (200, "standby: another replica leads\n")
    assert observe.get(b.health_port, "/healthz") == (200, "ok\n")
    assert _holder(kube_client, namespace) == a.identity
    assert (a.metric("dractl_controller_leader"), b.metric("dractl_controller_leader")) == (1, 0)

    _template(kube_client, namespace)
    first = _pod(kube_client, namespace, "first")
    first_claim = _wait_claim(kube_client, namespace, first)
    assert a.metric("dractl_claim_controller_creates_total", {"status": "success"}) == 1
    # The standby built no controller: none of the claim controller's series exist there, so it wrote nothing.
    assert b.metric("dractl_claim_controller_queue_depth") is None
    assert b.logged("became the leader") is None

    a.process.send_signal(signal.SIGKILL)
    assert a.wait_exit() == -signal.SIGKILL
    b.wait_logged("controllers started", timeout=TAKEOVER_TIMEOUT)
    assert _holder(kube_client, namespace) == b.identity
    assert int(_lease(kube_client, namespace).get("leaseTransitions") or 0) == 1
    assert b.metric("dractl_controller_leader") == 1
    controlplane.wait_until(lambda: observe.get(b.health_port, "/readyz")[0] == 200, what="b is ready as the leader")

    second = _pod(kube_client, namespace, "second")
    second_claim = _wait_claim(kube_client, namespace, second)
    assert b.metric("dractl_claim_controller_creates_total", {"status": "success"}) == 1
    claims = sorted(c["metadata"]["name"] for c in kube_client.list(client.RESOURCE_CLAIMS, namespace=namespace).items)
    assert claims == sorted([first_claim, second_claim])

    b.process.send_signal(signal.SIGTERM)
    assert b.wait_exit(timeout=20) == 0
    assert _holder(kube_client, namespace) == ""


def _steal(api: client.Client, namespace: str) -> None:
    """Write the Lease as held by "thief", renewed now (a conflicting write by the replica is simply retried)."""
    lease = api.get(client.LEASES, LEASE, namespace=namespace)
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    lease["spec"] = {**lease["spec"], "holderIdentity": "thief", "renewTime": now}
    with contextlib.suppress(client.Conflict):
        api.update(client.LEASES, lease)


def test_a_replica_that_loses_its_lease_stops_and_exits_1(
    kube_client: client.Client, namespace: str, start_replica: Callable[..., Replica]
) -> None:
    """Guards: when another holder renews the Lease, the replica gives up after its renew deadline, stops its
    controllers and exits 1 (so the Deployment restarts it), as client-go's processes do."""
    a = start_replica("a")
    a.wait_logged("controllers started")

    def exited() -> bool:
        if a.process.poll() is not None:
            return True
        _steal(kube_client, namespace)  # Keep the thief's record fresh, as a live holder would.
        return False

    controlplane.wait_until(
        exited, what="the replica exits after losing the lease", timeout=TAKEOVER_TIMEOUT, interval=0.2
    )
    assert a.wait_exit() == 1
    assert a.logged("leader election lost") is not None
    assert a.logged("controllers stopped") is not None
    assert _holder(kube_client, namespace) == "thief"


def test_a_leader_paused_past_its_lease_writes_nothing_after_the_takeover_and_no_device_goes_twice(
    kube_client: client.Client,
    namespace: str,
    fault_proxy: faultproxy.FaultProxy,
    start_replica: Callable[..., Replica],
) -> None:
    """Guards: a leader paused with SIGSTOP while it has pods in hand, long enough for the standby to take over, sends
    not one write once resumed (the fault proxy in front of it sees none arrive after the takeover): its writes are
    fenced on the lease, and it exits 1. The standby's resync finishes the work: every pod bound with the one claim
    it records, allocated and reserved for it, no device in two claims.

    The pause lands while the leader's one claim worker waits for the answer to a create the proxy holds (less
    than lease duration - renew deadline): a request already on its way when a process stops is what that margin
    is for, and the instant between the fence's last check and the socket is too short for a test to aim at."""
    node_group.ensure_device_classes(kube_client)
    group = node_group.Group(kube_client, namespace=namespace, scheduler_name="dractl")
    try:
        node = group.node("dgx-a100-01")  # 8 GPUs
        _template(kube_client, namespace)
        both = ("claims", "scheduler")
        a = start_replica("a", via=fault_proxy.kubeconfig, controllers=both, extra=["--workers", "1"])
        a.wait_logged("controllers started")
        b = start_replica("b", controllers=both)
        held = RENEW_DEADLINE / 4  # Each write of the leader waits this long in the proxy.
        fault_proxy.add(
            faultproxy.latency(held, method="POST", count=None), faultproxy.latency(held, method="PATCH", count=None)
        )
        pods = [group.pod(f"p{i}", claims=[kube_objects.from_template("gpu-template")]) for i in range(8)]
        controlplane.wait_until(
            lambda: any(target.split("?")[0].endswith("/resourceclaims") for _, target in fault_proxy.holding),
            what="the proxy holds the leader's first claim create",
        )
        a.process.send_signal(signal.SIGSTOP)
        try:
            controlplane.wait_until(
                lambda: _holder(kube_client, namespace) == b.identity,
                what="the standby takes the lease over",
                timeout=TAKEOVER_TIMEOUT,
            )
            takeover = time.monotonic()
            for pod in pods:
                group.wait_bound(pod["metadata"]["name"])
        finally:
            a.process.send_signal(signal.SIGCONT)
        assert a.wait_exit() == 1
        assert a.logged("leader election lost") is not None
        late = [f"{r.method} {r.target}" for r in fault_proxy.writes() if r.received >= takeover]
        assert late == []

        claims = kube_client.list(client.RESOURCE_CLAIMS, namespace=namespace).items
        devices = [
            (result["pool"], result["device"])
            for claim in claims
            for result in claim["status"]["allocation"]["devices"]["results"]
        ]
        assert len(devices) == len(set(devices)) == len(claims) == len(pods)
        for pod in pods:
            assert group.bound(pod["metadata"]["name"]) == node
            claim = group.pod_claim(pod["metadata"]["name"])
            assert [entry["uid"] for entry in claim["status"]["reservedFor"]] == [pod["metadata"]["uid"]]
    finally:
        group.cleanup()


def test_a_leader_paused_in_the_middle_of_a_gangs_commit_leaves_no_half_bound_gang(
    kube_client: client.Client,
    namespace: str,
    fault_proxy: faultproxy.FaultProxy,
    start_replica: Callable[..., Replica],
) -> None:
    """Guards: a leader paused (SIGSTOP) while it writes the claims of a 3-pod gang (PodGroup minCount 3), long
    enough for the standby to take over, writes nothing once resumed and exits 1; the standby finishes the gang from
    what the API shows: all 3 pods bound, each claim allocated once and reserved for its own pod, no device twice.
    The pause lands while the proxy holds one of the leader's claim writes (see the test above for why)."""
    node_group.ensure_device_classes(kube_client)
    group = node_group.Group(kube_client, namespace=namespace, scheduler_name="dractl")
    try:
        nodes = [group.node("t4-node-01") for _ in range(3)]  # 2 GPUs each; every pod claims both of one node
        kube_client.create(
            client.POD_GROUPS,
            {
                "apiVersion": "scheduling.k8s.io/v1alpha2",
                "kind": "PodGroup",
                "metadata": {"name": "train", "namespace": namespace},
                "spec": {"schedulingPolicy": {"gang": {"minCount": 3}}},
            },
        )
        a = start_replica("a", via=fault_proxy.kubeconfig, controllers=("scheduler",), extra=["--workers", "1"])
        a.wait_logged("controllers started")
        b = start_replica("b", controllers=("scheduler",))
        fault_proxy.add(faultproxy.latency(RENEW_DEADLINE / 4, method="PATCH", path="/resourceclaims/", count=None))
        pods = []
        for index in range(3):
            name = f"worker-{index}"
            group.claim(name, kube_objects.claim_spec(count=2))
            body = kube_objects.pod(
                name,
                namespace=namespace,
                claims=[kube_objects.of_claim(name)],
                cpu="100m",
                schedulerName="dractl",
                nodeSelector={node_group.GROUP_LABEL: group.id},
                tolerations=[group.toleration],
                schedulingGroup={"podGroupName": "train"},
            )
            pods.append(kube_client.create(client.PODS, body))
        controlplane.wait_until(
            lambda: any("/resourceclaims/" in target for _, target in fault_proxy.holding),
            what="the proxy holds one of the leader's claim writes for the gang",
        )
        a.process.send_signal(signal.SIGSTOP)
        try:
            controlplane.wait_until(
                lambda: _holder(kube_client, namespace) == b.identity,
                what="the standby takes the lease over",
                timeout=TAKEOVER_TIMEOUT,
            )
            takeover = time.monotonic()
            bound = sorted(group.wait_bound(pod["metadata"]["name"]) for pod in pods)
        finally:
            a.process.send_signal(signal.SIGCONT)
        assert a.wait_exit() == 1
        late = [f"{r.method} {r.target}" for r in fault_proxy.writes() if r.received >= takeover]
        assert late == []
        assert bound == sorted(nodes)
        devices = []
        for pod in pods:
            claim = group.get_claim(pod["metadata"]["name"])
            assert [entry["uid"] for entry in claim["status"]["reservedFor"]] == [pod["metadata"]["uid"]]
            devices += [(r["pool"], r["device"]) for r in claim["status"]["allocation"]["devices"]["results"]]
        assert len(devices) == len(set(devices)) == 6
    finally:
        group.cleanup()
