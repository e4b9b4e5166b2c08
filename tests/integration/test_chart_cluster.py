"""The chart installed by Helm into a real kube-apiserver with RBAC on: its admission policies and its accounts, proven.

One control plane for the module (etcd + kube-apiserver 1.36.2, `--authorization-mode RBAC`, an
audit log of every request a service account makes). The chart is installed with
helm-python-sdk (Helm's own install action: every object goes through the API server's
validation, the policies' CEL is compiled by it). The dractl processes then run with real
service account tokens of the chart's accounts: the node agent's bound to a pod on a node, so the
token carries the node's name as the kubelet's pods get it.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import datetime
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import controlplane
import helm_python
import pytest
from support import chart, kube_objects, kubelet, observe

from dractl._proto import dra_v1_pb2
from dractl.kube import access, leader
from dractl.kube import client as kube_client
from dractl.model import opaque
from dractl.node import plugin, state

pytestmark = pytest.mark.timeout(600)

ROOT = pathlib.Path(__file__).resolve().parents[2]
SYSTEM = chart.NAMESPACE
NODE_AGENT = f"{chart.RELEASE}-node-agent"
CONTROLLER = f"{chart.RELEASE}-controller"
VALUES = {"controller": {"controllers": ["claims", "scheduler"]}, "nodeAgent": {"deviceSource": "fake"}}
API = opaque.API_VERSION
TOKEN_REQUEST_SECONDS = 3600
START_TIMEOUT_S = 60.0
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived", "ResponseStarted"],
    "rules": [{"level": "Metadata", "userGroups": ["system:serviceaccounts"]}, {"level": "None"}],
}
SLICES_V1 = kube_client.RESOURCE_SLICES
CLAIMS_V1BETA2 = kube_client.Resource("resource.k8s.io", "v1beta2", "resourceclaims", "ResourceClaim", namespaced=True)


@dataclasses.dataclass(frozen=True, slots=True)
class Cluster:
    plane: controlplane.ControlPlane
    admin: kube_client.Client
    directory: pathlib.Path
    audit_log: pathlib.Path

    def kubeconfig(self, name: str, token: str) -> pathlib.Path:
        """A kubeconfig that authenticates with `token` (JSON is valid YAML)."""
        return controlplane.write_kubeconfig(
            self.directory / f"{name}.kubeconfig", server=self.plane.url, ca=self.plane.ca.cert, token=token
        )

    def token(self, account: str, *, pod: dict[str, Any] | None = None) -> str:
        """A service account token of `account` (TokenRequest), bound to `pod` when given (it then names its node)."""
        spec: dict[str, Any] = {"expirationSeconds": TOKEN_REQUEST_SECONDS}
        if pod is not None:
            spec["boundObjectRef"] = {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": pod["metadata"]["name"],
                "uid": pod["metadata"]["uid"],
            }
        answer = self.admin.create(
            kube_objects.SERVICE_ACCOUNTS,
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
            namespace=SYSTEM,
            name=account,
            subresource="token",
        )
        return str(answer["status"]["token"])

    def agent_pod(self, node: str) -> dict[str, Any]:
        """The node agent's pod on `node`, as the DaemonSet would make it (no kubelet runs it: it is for its token).
        Made once; later calls return it."""
        body = kube_objects.pod(
            f"agent-{node}", namespace=SYSTEM, claims=[], nodeName=node, serviceAccountName=NODE_AGENT
        )
        del body["spec"]["resourceClaims"]
        try:
            return self.admin.create(kube_client.PODS, body)
        except kube_client.AlreadyExists:
            return self.admin.get(kube_client.PODS, body["metadata"]["name"], namespace=SYSTEM)

    def audited(self, token: str) -> list[dict[str, Any]]:
        """The audit log's completed requests made with `token` (told apart by its JWT ID), in order."""
        payload = token.split(".")[1]
        jti = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))["jti"]
        entries = [json.loads(line) for line in self.audit_log.read_text().splitlines() if line.strip()]
        return [
            e
            for e in entries
            if e.get("stage") == "ResponseComplete"
            and f"JTI={jti}" in e.get("user", {}).get("extra", {}).get("authentication.kubernetes.io/credential-id", [])
        ]


def _node(admin: kube_client.Client, name: str) -> None:
    admin.create(kube_client.NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    kube_objects.make_ready(admin, name)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A control plane with RBAC and an audit log, the chart installed in dractl-system, nodes node-a and node-b."""
    directory = tmp_path_factory.mktemp("chart-cluster")
    policy = directory / "audit-policy.json"
    policy.write_text(json.dumps(AUDIT_POLICY))
    audit_log = directory / "audit.log"
    args = ["--allow-privileged=true", f"--audit-policy-file={policy}", f"--audit-log-path={audit_log}"]
    try:
        plane = controlplane.ControlPlane.start(authorization="RBAC", apiserver_args=args)
    except controlplane.Unavailable as missing:
        pytest.skip(str(missing))
    admin = kube_client.connect(plane.kubeconfig)
    try:
        kube_objects.make_namespace(admin, SYSTEM)
        with helm_python.Config(kubeconfig_path=str(plane.kubeconfig), namespace=SYSTEM) as helm:
            release = helm.install(chart.CHART, chart.RELEASE, VALUES, namespace=SYSTEM, timeout=120)
        assert release["status"] == "deployed", release
        for node in ("node-a", "node-b"):
            _node(admin, node)
        found = Cluster(plane=plane, admin=admin, directory=directory, audit_log=audit_log)
        _wait_for_policies(found)
        yield found
    finally:
        admin.close()
        plane.stop()


def _gpu_config(sharing: Any) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "GpuConfig", "sharing": sharing}


def _claim(parameters: Any, name: str = "config") -> dict[str, Any]:
    """A claim whose second config entry (index 1) is `parameters` for our driver; the first is another driver's."""
    body = kube_objects.claim(name, namespace="default", spec=kube_objects.claim_spec())
    body["spec"]["devices"]["config"] = [
        {"opaque": {"driver": "net.example.com", "parameters": {"anything": ["goes"]}}},
        {"requests": ["gpu"], "opaque": {"driver": kube_objects.DRIVER, "parameters": parameters}},
    ]
    return body


def _refusal(make: Any) -> str:
    """The API server's message when `make()` is refused, else "" (accepted)."""
    try:
        make()
    except kube_client.ApiError as error:
        return error.message
    return ""


def _wait_for_policies(cluster: Cluster) -> None:
    """Policies act a moment after they are created: wait until the opaque config policy refuses a bad claim."""
    bad = _claim(_gpu_config({"strategy": "Sometimes"}))
    controlplane.wait_until(
        lambda: (
            "denied request" in _refusal(lambda: cluster.admin.create(kube_client.RESOURCE_CLAIMS, bad, dry_run=True))
        ),
        what="the chart's ValidatingAdmissionPolicies act",
    )


def _agent_message(parameters: Any) -> str:
    """What the node agent says of `parameters` at prepare time, after `status.allocation.devices.config[i] (...)`."""
    with pytest.raises(opaque.ConfigError) as caught:
        opaque.decode(parameters)
    field = f".{caught.value.field}" if caught.value.field else ""
    return f"opaque.parameters{field}: {caught.value.message}"


# (parameters that are not a JSON object the API server refuses itself, before any policy.)
BAD_CONFIGS = {
    "no-api-version": {"kind": "GpuConfig"},
    "api-version": {"apiVersion": "resource.nvidia.com/v1", "kind": "GpuConfig"},
    "kind": {"apiVersion": API, "kind": "VfioDeviceConfig"},
    "unknown-top": {"apiVersion": API, "kind": "GpuConfig", "zeta": 1, "extra": True},
    "sharing-not-object": _gpu_config("MPS"),
    "unknown-sharing": _gpu_config({"strategy": "MPS", "extra": 1}),
    "no-strategy": _gpu_config({}),
    "strategy-case": _gpu_config({"strategy": "mps"}),
    "strategy-number": _gpu_config({"strategy": 3}),
    "interval": _gpu_config({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Fast"}}),
    "interval-number": _gpu_config({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": 5}}),
    "interval-null": _gpu_config({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": None}}),
    "ts-not-object": _gpu_config({"strategy": "TimeSlicing", "timeSlicingConfig": "Long"}),
    "ts-unknown": _gpu_config({"strategy": "TimeSlicing", "timeSlicingConfig": {"length": "Long"}}),
    "ts-with-mps": _gpu_config({"strategy": "TimeSlicing", "mpsConfig": {}}),
    "mps-with-ts": _gpu_config({"strategy": "MPS", "timeSlicingConfig": {}}),
    "mps-unknown": _gpu_config({"strategy": "MPS", "mpsConfig": {"threads": 5}}),
    "percentage-high": _gpu_config({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 101}}),
    "percentage-text": _gpu_config({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": "50"}}),
    "percentage-bool": _gpu_config({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": True}}),
    "limit-small": _gpu_config({"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "512Ki"}}),
    "limit-text": _gpu_config({"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "lots"}}),
    "limit-long-text": _gpu_config({"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "x" * 80}}),
    "limit-number-small": _gpu_config({"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": 1024}}),
    "limit-list": _gpu_config({"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": ["1Gi"]}}),
    "per-device-key": _gpu_config(
        {"strategy": "MPS", "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {"gpu0": "1Gi"}}}
    ),
    "per-device-value": _gpu_config(
        {"strategy": "MPS", "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {"0": "1Gi", "GPU-a": "100Ki"}}}
    ),
    "per-device-list": _gpu_config({"strategy": "MPS", "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": ["1Gi"]}}),
    "multi-user": _gpu_config({"strategy": "MPS", "mpsConfig": {"multiUser": "yes"}}),
    "order-percentage-before-limit": _gpu_config(
        {
            "strategy": "MPS",
            "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "lots", "defaultActiveThreadPercentage": -1},
        }
    ),
    "order-multi-user-before-default-limit": _gpu_config(
        {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "lots", "multiUser": 1}}
    ),
    "mig-ts-config": {
        "apiVersion": API,
        "kind": "MigDeviceConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {}},
    },
    "mig-mps-percentage": {
        "apiVersion": API,
        "kind": "MigDeviceConfig",
        "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 200}},
    },
}

GOOD_CONFIGS = {
    "no-sharing": {"apiVersion": API, "kind": "GpuConfig"},
    "time-slicing-long": _gpu_config({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}),
    "time-slicing-default": _gpu_config({"strategy": "TimeSlicing"}),
    "mps-everything": _gpu_config(
        {
            "strategy": "MPS",
            "mpsConfig": {
                "defaultActiveThreadPercentage": 50,
                "defaultPinnedDeviceMemoryLimit": "10Gi",
                "defaultPerDevicePinnedMemoryLimit": {"0": "1Gi", "GPU-0a1b": 2147483648},
                "multiUser": True,
            },
        }
    ),
    "mig-time-slicing": {"apiVersion": API, "kind": "MigDeviceConfig", "sharing": {"strategy": "TimeSlicing"}},
    "mig-mps": {"apiVersion": API, "kind": "MigDeviceConfig", "sharing": {"strategy": "MPS", "mpsConfig": {}}},
}


@pytest.mark.parametrize("name", sorted(BAD_CONFIGS))
def test_a_bad_opaque_config_is_refused_at_apply_time_with_the_agents_message(cluster: Cluster, name: str) -> None:
    """Guards: a claim whose GpuConfig/MigDeviceConfig the agent would refuse when the pod starts is refused when it
    is created, naming the config's position and field with exactly the agent's message."""
    parameters = BAD_CONFIGS[name]
    expected = f"denied request: spec.devices.config[1].{_agent_message(parameters)}"
    message = _refusal(lambda: cluster.admin.create(kube_client.RESOURCE_CLAIMS, _claim(parameters), dry_run=True))
    assert message.endswith(expected), message


@pytest.mark.parametrize("name", sorted(GOOD_CONFIGS))
def test_a_good_opaque_config_is_accepted(cluster: Cluster, name: str) -> None:
    """Guards: configs the agent accepts (and other drivers' configs, whatever they hold) pass the policy."""
    opaque.decode(GOOD_CONFIGS[name])  # The agent takes it.
    assert (
        _refusal(lambda: cluster.admin.create(kube_client.RESOURCE_CLAIMS, _claim(GOOD_CONFIGS[name]), dry_run=True))
        == ""
    )


def test_templates_classes_and_older_api_versions_are_checked_too(cluster: Cluster) -> None:
    """Guards: the policy covers ResourceClaimTemplates, DeviceClasses and a v1beta2 request, each with its own path."""
    bad = _gpu_config({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Fast"}})
    tail = _agent_message(bad)
    template = kube_objects.template("config", namespace="default", spec=_claim(bad)["spec"])
    message = _refusal(lambda: cluster.admin.create(kube_client.RESOURCE_CLAIM_TEMPLATES, template, dry_run=True))
    assert message.endswith(f"spec.spec.devices.config[1].{tail}"), message
    device_class = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "shared-gpu"},
        "spec": {"config": [{"opaque": {"driver": kube_objects.DRIVER, "parameters": bad}}]},
    }
    message = _refusal(lambda: cluster.admin.create(kube_client.DEVICE_CLASSES, device_class, dry_run=True))
    assert message.endswith(f"spec.config[0].{tail}"), message
    beta = {**_claim(bad), "apiVersion": "resource.k8s.io/v1beta2"}
    message = _refusal(lambda: cluster.admin.create(CLAIMS_V1BETA2, beta, dry_run=True))
    assert message.endswith(f"spec.devices.config[1].{tail}"), message


def _slice(name: str, node: str, *, driver: str = kube_objects.DRIVER) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [],
        },
    }


def test_a_node_agent_writes_only_its_own_nodes_slices(cluster: Cluster) -> None:
    """Guards: with a token bound to its pod on node-a, the node agent's account may create, update and delete node-a's
    slices of its driver, and is refused node-b's (create, update, delete) and another driver's, naming both nodes."""
    token = cluster.token(NODE_AGENT, pod=cluster.agent_pod("node-a"))
    agent = kube_client.connect(cluster.kubeconfig("agent-a", token))
    suffix = uuid.uuid4().hex[:6]
    try:
        own = agent.create(SLICES_V1, _slice(f"own-{suffix}", "node-a"))
        agent.update(SLICES_V1, {**own, "spec": {**own["spec"], "pool": {**own["spec"]["pool"], "generation": 2}}})
        agent.delete(SLICES_V1, own["metadata"]["name"])
        refused = "node agent on node node-a may only write ResourceSlices of node node-a, not of node node-b"
        assert refused in _refusal(lambda: agent.create(SLICES_V1, _slice(f"other-{suffix}", "node-b")))
        theirs = cluster.admin.create(SLICES_V1, _slice(f"theirs-{suffix}", "node-b"))
        bumped = {**theirs, "spec": {**theirs["spec"], "pool": {**theirs["spec"]["pool"], "generation": 2}}}
        assert refused in _refusal(lambda: agent.update(SLICES_V1, bumped))
        assert refused in _refusal(lambda: agent.delete(SLICES_V1, theirs["metadata"]["name"]))
        driver = _refusal(lambda: agent.create(SLICES_V1, _slice(f"net-{suffix}", "node-a", driver="net.example.com")))
        assert "may only write ResourceSlices of driver gpu.nvidia.com" in driver
    finally:
        agent.close()


def test_a_token_without_a_node_may_write_no_slice(cluster: Cluster) -> None:
    """Guards: the node agent's account with a token bound to no pod (hence no node) cannot write any slice."""
    agent = kube_client.connect(cluster.kubeconfig("agent-unbound", cluster.token(NODE_AGENT)))
    try:
        message = _refusal(lambda: agent.create(SLICES_V1, _slice(f"unbound-{uuid.uuid4().hex[:6]}", "node-a")))
        assert "the node agent's token names no node" in message
    finally:
        agent.close()


# --- The processes under the chart's accounts --------------------------------------------------------------------


@dataclasses.dataclass(slots=True)
class Process:
    """A dractl process this test started, its log, and its end (by PID)."""

    popen: subprocess.Popen[bytes]
    log: pathlib.Path

    def entries(self) -> list[dict[str, Any]]:
        return observe.log_entries(self.log)

    def alive(self) -> bool:
        if self.popen.poll() is not None:
            raise AssertionError(f"dractl exited with {self.popen.returncode}:\n{self.log.read_text(errors='replace')}")
        return True

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        controlplane.stop_process(self.popen, grace=20.0)


@contextlib.contextmanager
def _dractl(args: list[str], *, log: pathlib.Path) -> Iterator[Process]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("DRACTL_")}
    with log.open("wb") as out:
        popen = subprocess.Popen(
            [sys.executable, "-m", "dractl", *args], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    process = Process(popen, log)
    try:
        yield process
    finally:
        process.stop()


def _agent_args(
    node: str, *, kubeconfig: pathlib.Path, directory: pathlib.Path, sockets: pathlib.Path, profile: str, mig: str
) -> list[str]:
    return [
        "node-agent",
        f"--node-name={node}",
        "--device-source=fake",
        f"--fake-profile={profile}",
        f"--mig-mode={mig}",
        f"--cdi-root={directory / 'cdi'}",
        f"--kubelet-registrar-dir={sockets / 'reg'}",
        f"--kubelet-plugins-dir={sockets / 'plugins'}",
        f"--state-dir={directory / 'state'}",
        f"--kubeconfig={kubeconfig}",
        "--health-port=-1",
        "--metrics-port=-1",
        "--log-format=json",
    ]


def _used(entries: list[dict[str, Any]]) -> tuple[set[tuple[str, str, str]], list[str]]:
    """(API group, resource[/subresource], verb) of each audited request (with the permissions the API server checked
    beside it when it succeeded, access.IMPLIED), and the requests refused with 403."""
    used, forbidden = set(), []
    for entry in entries:
        url = entry.get("requestURI", "").split("?")[0]
        if "objectRef" not in entry and (url in PUBLIC_URLS or DISCOVERY.fullmatch(url)):
            # A non-resource URL every identity may read (system:public-info-viewer, system:discovery), not the
            # chart's RBAC.
            continue
        ref = entry.get("objectRef") or {}
        resource = ref.get("resource", "") + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        key = (ref.get("apiGroup", ""), resource, entry["verb"])
        used.add(key)
        implied = access.IMPLIED.get(key)
        if implied is not None and entry.get("responseStatus", {}).get("code", 0) < 300:
            used.add((implied.resource.group, implied.name, entry["verb"]))
        if entry.get("responseStatus", {}).get("code") == 403:
            forbidden.append(f"{key}: {entry.get('responseStatus', {}).get('message', '')}")
    return used, forbidden


PUBLIC_URLS = {"/version", "/healthz", "/livez", "/readyz"}
DISCOVERY = re.compile(r"/api(/v1)?|/apis(/[^/]+){0,2}")
"""Discovery documents (`/api/v1`, `/apis/<group>/<version>`): the scheduler asks which PodGroup APIs are served."""


def _granted(components: list[str]) -> set[tuple[str, str, str]]:
    return {
        (rule["apiGroups"][0], rule["resources"][0], verb)
        for scope in access.Scope
        for rule in access.rules(components, scope=scope)
        for verb in rule["verbs"]
    }


# Rules the scenarios below cannot reach, each with the call that needs it (the access test finds the call site).
NODE_AGENT_UNREACHED = {
    ("", "events", "patch"): "the same Event twice in one agent process (a repeated NodeStateReset)",
}
CONTROLLER_UNREACHED = {
    ("", "pods", "get"): "a pod that changed between the scheduler's decision and its Binding (read live only then)",
    ("", "events", "patch"): "the same Event twice in one process (the scheduler warns only when its message changes)",
    ("resource.k8s.io", "resourceclaimtemplates", "get"): "a template the claim controller's cache does not hold yet",
    ("scheduling.k8s.io", "podgroups", "get"): "a live read of a PodGroup before deleting a duplicate of its claim",
    ("scheduling.x-k8s.io", "podgroups", "list"): "scheduler-plugins' PodGroup CRD, not installed in this cluster",
    ("scheduling.x-k8s.io", "podgroups", "watch"): "scheduler-plugins' PodGroup CRD, not installed in this cluster",
}


def _prepare(sockets: pathlib.Path, claim: dict[str, Any]) -> dra_v1_pb2.NodePrepareResourceResponse:
    paths = plugin.socket_paths(
        driver_name=kube_objects.DRIVER, registrar_dir=sockets / "reg", plugins_dir=sockets / "plugins"
    )
    metadata = claim["metadata"]
    ref = state.ClaimRef(namespace=metadata["namespace"], name=metadata["name"], uid=metadata["uid"])
    return kubelet.prepare(paths.dra, ref, timeout=START_TIMEOUT_S)[ref.uid]


def test_the_node_agent_runs_with_its_accounts_rbac_and_needs_all_of_it(
    cluster: Cluster, tmp_path: pathlib.Path, sock_dir: pathlib.Path
) -> None:
    """Guards: `dractl node-agent` under the chart's node agent account (token bound to its pod on node-a) publishes,
    republishes (more and then fewer slices), prepares a claim and reports a reset state with no 403; every
    rule of its ClusterRole is used except the ones NODE_AGENT_UNREACHED names."""
    token = cluster.token(NODE_AGENT, pod=cluster.agent_pod("node-a"))
    kubeconfig = cluster.kubeconfig("agent-run", token)
    admin = cluster.admin
    namespace = f"agent-{uuid.uuid4().hex[:6]}"
    kube_objects.make_namespace(admin, namespace)
    runs = [("a100-80gb-x8", "static"), ("a100-80gb-x8", "dynamic"), ("t4-x2", "static")]
    for number, (profile, mig) in enumerate(runs):
        args = _agent_args(
            "node-a", kubeconfig=kubeconfig, directory=tmp_path, sockets=sock_dir, profile=profile, mig=mig
        )
        with _dractl(args, log=tmp_path / f"agent-{number}.log") as agent:
            controlplane.wait_until(
                lambda agent=agent: (
                    agent.alive() and any(e.get("event") == "node agent started" for e in agent.entries())
                ),
                what=f"the node agent started with {profile} ({agent.log})",
                timeout=START_TIMEOUT_S,
            )
            if number == 0:
                claim = kube_objects.create_allocated_claim(
                    admin,
                    "prepared",
                    namespace=namespace,
                    spec=kube_objects.claim_spec(),
                    allocated=kube_objects.allocation("node-a", ["gpu-0"]),
                )
                answer = _prepare(sock_dir, claim)
                assert answer.error == "" and [d.device_name for d in answer.devices] == ["gpu-0"]
        # A corrupt checkpoint makes the next start reset its state and say so in a Warning Event on the Node;
        # the fake GPUs' state belongs to one profile.
        (tmp_path / "state" / "checkpoint.json").write_text("{not json")
        (tmp_path / "state" / "fake-gpus.json").unlink()
    slices, _ = admin.list_resource_slices(field_selector="spec.nodeName=node-a")
    assert slices and {d.name for s in slices for d in s.devices} == {"gpu-0", "gpu-1"}
    used, forbidden = _used(cluster.audited(token))
    assert forbidden == []
    granted = _granted(["node-agent"])
    assert used - granted == set()
    assert granted - used == set(NODE_AGENT_UNREACHED)


def _publish_fake_node(admin: kube_client.Client, node: str, tmp_path: pathlib.Path) -> None:
    """A Ready node whose slices are what `dractl discover` prints for two fake T4s (the node agent's own slices)."""
    _node(admin, node)
    printed = subprocess.run(
        [
            sys.executable,
            "-m",
            "dractl",
            "discover",
            "--device-source=fake",
            "--fake-profile=t4-x2",
            f"--node-name={node}",
            "-o",
            "json",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    for item in json.loads(printed.stdout)["items"]:
        admin.create(SLICES_V1, item)


def _claims_of(pod: str, admin: kube_client.Client, namespace: str) -> list[dict[str, Any]]:
    """The claims made for `pod` from its template (named after it, as kube-controller-manager names them)."""
    claims = admin.list(kube_client.RESOURCE_CLAIMS, namespace=namespace).items
    return [c for c in claims if c["metadata"]["name"].startswith(f"{pod}-gpu-")]


def _pod(name: str, namespace: str, **spec: Any) -> dict[str, Any]:
    return kube_objects.pod(
        name,
        namespace=namespace,
        claims=[{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
        schedulerName="dractl",
        **spec,
    )


def test_the_controller_runs_with_its_accounts_rbac_and_needs_all_of_it(
    cluster: Cluster, tmp_path: pathlib.Path
) -> None:
    """Guards: `dractl controller --controllers claims,scheduler` under the chart's controller account leads (Lease
    in the release namespace), makes a PodGroup's claim and records it, makes a pod's claim, allocates it, binds the
    pod, reports an unschedulable pod, and deallocates and deletes the claim of a finished pod, with no 403; every
    rule of its ClusterRole and Role is used except the ones CONTROLLER_UNREACHED names."""
    admin = cluster.admin
    _publish_fake_node(admin, "node-c", tmp_path)
    namespace = f"controller-{uuid.uuid4().hex[:6]}"
    kube_objects.make_namespace(admin, namespace)
    admin.create(kube_client.RESOURCE_CLAIM_TEMPLATES, kube_objects.template("one-gpu", namespace=namespace))
    token = cluster.token(CONTROLLER)
    args = [
        "controller",
        "--controllers=claims,scheduler",
        f"--kubeconfig={cluster.kubeconfig('controller', token)}",
        f"--lease-namespace={SYSTEM}",
        "--metrics-port=-1",
        "--health-port=-1",
        "--log-format=json",
    ]
    with _dractl(args, log=tmp_path / "controller.log") as controller:
        group = {
            "apiVersion": "scheduling.k8s.io/v1alpha2",
            "kind": "PodGroup",
            "metadata": {"name": "train", "namespace": namespace},
            "spec": {
                "schedulingPolicy": {"gang": {"minCount": 2}},
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
            },
        }
        admin.create(kube_client.POD_GROUPS, group)
        controlplane.wait_until(
            lambda: (admin.get(kube_client.POD_GROUPS, "train", namespace=namespace).get("status") or {}).get(
                "resourceClaimStatuses"
            ),
            what=f"dractl made PodGroup {namespace}/train's claim and recorded it ({controller.log})",
        )
        bound = admin.create(kube_client.PODS, _pod("bound", namespace))
        admin.create(kube_client.PODS, _pod("nowhere", namespace, nodeSelector={"gpu": "none"}))

        def placed() -> str:
            controller.alive()
            return str(admin.get(kube_client.PODS, "bound", namespace=namespace)["spec"].get("nodeName") or "")

        node = controlplane.wait_until(placed, what=f"dractl bound pod {namespace}/bound ({controller.log})")
        (claim,) = _claims_of("bound", admin, namespace)
        assert claim["status"]["allocation"]["devices"]["results"][0]["pool"] == node
        controlplane.wait_until(
            lambda: any(
                e["reason"] == "FailedScheduling" for e in admin.list(kube_client.EVENTS, namespace=namespace).items
            ),
            what="dractl reported the unschedulable pod in an Event",
        )
        admin.patch(
            kube_client.PODS,
            "bound",
            namespace=namespace,
            subresource="status",
            patch={"status": {"phase": "Succeeded"}},
        )
        controlplane.wait_until(
            lambda: not _claims_of("bound", admin, namespace),
            what=f"dractl deallocated and deleted the claim of finished pod {bound['metadata']['name']}",
        )
    used, forbidden = _used(cluster.audited(token))
    assert forbidden == []
    granted = _granted(["controller", "claims", "scheduler"])
    assert used - granted == set()
    assert granted - used == set(CONTROLLER_UNREACHED)


def test_the_controller_leads_at_once_where_an_uninstalled_releases_pod_holds_the_lease(
    cluster: Cluster, tmp_path: pathlib.Path
) -> None:
    """Guards the install after `helm uninstall`: the last leader's pod could not release the Lease (its Role was
    deleted before the pod ended) and named itself in it; `dractl controller` under the chart's account sees that pod
    is gone and leads at once, with no 403, where it would otherwise wait out the lease (an hour here)."""
    admin = cluster.admin
    with contextlib.suppress(kube_client.NotFound):
        admin.delete(kube_client.LEASES, "dractl-controller", namespace=SYSTEM)
    gone = "dractl-controller-5d8f9-old"
    renewed = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    admin.create(
        kube_client.LEASES,
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": "dractl-controller",
                "namespace": SYSTEM,
                "annotations": {
                    leader.HOLDER_POD: json.dumps({"identity": f"{gone}_1", "pod": gone, "uid": str(uuid.uuid4())})
                },
            },
            "spec": {"holderIdentity": f"{gone}_1", "leaseDurationSeconds": 3600, "renewTime": renewed},
        },
    )
    token = cluster.token(CONTROLLER)
    args = [
        "controller",
        "--controllers=scheduler",
        f"--kubeconfig={cluster.kubeconfig('controller-after-uninstall', token)}",
        f"--lease-namespace={SYSTEM}",
        "--metrics-port=-1",
        "--health-port=-1",
        "--log-format=json",
    ]
    with _dractl(args, log=tmp_path / "controller.log") as controller:

        def holder() -> str:
            controller.alive()
            lease = admin.get(kube_client.LEASES, "dractl-controller", namespace=SYSTEM)
            return str(lease["spec"].get("holderIdentity") or "")

        controlplane.wait_until(
            lambda: holder() not in ("", f"{gone}_1"),
            what=f"dractl took over the Lease of the gone pod {gone} ({controller.log})",
            timeout=START_TIMEOUT_S,
        )
    used, forbidden = _used(cluster.audited(token))
    assert forbidden == []
    assert ("", "pods", "get") in used
