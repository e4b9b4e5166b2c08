"""A real kubelet and containerd on this machine with `dractl node-agent --device-source fake` run as a host process.

The first real-node scenario, before any image or chart: the kubelet registers the agent's plugin,
the agent's slices are published, kube-scheduler allocates a template claim on them, the kubelet
prepares it through the agent and containerd injects the CDI devices (the GPU UUIDs in the
container's environment); deleting the pod unprepares it. And the harness itself: a node leaves
nothing behind on this machine.
"""

from __future__ import annotations

import http.client
import json
import pathlib
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import controlplane
import node_images
import pytest
import realcluster
import realnode
import scenarios
import yaml
from support import kube_objects

from dractl.kube import client

pytestmark = [pytest.mark.realnode, pytest.mark.timeout(600)]

NODE = "gpu-a100"
DRACTL = pathlib.Path(sys.executable).parent / "dractl"
DEVICE_CLASSES = scenarios.HERE.parent / "dractl" / "examples" / "00-deviceclasses.yaml"


def _registered(port: int) -> bool:
    """The agent's `dractl_node_registered` metric says the kubelet accepted its registration."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        connection.request("GET", "/metrics")
        return "dractl_node_registered 1.0" in connection.getresponse().read().decode()
    except OSError:
        return False
    finally:
        connection.close()


@pytest.fixture(scope="module")
def cluster(start_cluster: Callable[..., realcluster.RealCluster]) -> realcluster.RealCluster:
    return start_cluster({NODE: {}})


@pytest.fixture(scope="module")
def agent(cluster: realcluster.RealCluster) -> Iterator[controlplane.Process]:
    """`dractl node-agent` (a100-80gb-x8, dynamic MIG) inside the node's namespace, registered with its kubelet."""
    scenarios.apply(cluster.api, scenarios.load(DEVICE_CLASSES))
    (metrics_port,) = controlplane.free_ports(1)
    node = cluster.node(NODE)
    process = node.spawn(
        "node-agent",
        [
            str(DRACTL),
            "node-agent",
            *("--device-source", "fake", "--fake-profile", "a100-80gb-x8", "--mig-mode", "dynamic"),
            *("--node-name", NODE, "--kubeconfig", str(cluster.plane.kubeconfig)),
            *("--health-port", "-1", "--metrics-port", str(metrics_port), "--log-format", "console"),
        ],
    )
    try:
        controlplane.wait_until(
            lambda: _registered(metrics_port), what="the kubelet registered the host's node agent", timeout=120
        )
        yield process
    finally:
        process.stop()


def test_the_host_agent_publishes_the_nodes_gpus_as_slices(
    cluster: realcluster.RealCluster, agent: controlplane.Process
) -> None:
    """Guards: the agent run on the host beside a real kubelet publishes the 8 fake A100s (and their MIG
    placements, dynamic mode) as slices of the pool named after the node, owned by its Node."""
    devices = scenarios.devices(cluster.api, NODE)
    gpus = sorted(name for name, device in devices.items() if device.attributes["type"] == "gpu")
    assert gpus == [f"gpu-{minor}" for minor in range(8)]
    assert any(device.attributes["type"] == "mig" for device in devices.values())
    slices = cluster.api.list(client.RESOURCE_SLICES).items
    owners = {ref["name"] for item in slices for ref in item["metadata"].get("ownerReferences") or ()}
    assert owners == {NODE}


def test_a_pod_gets_its_claims_gpu_from_containerd_and_deleting_it_unprepares_it(
    cluster: realcluster.RealCluster,
    agent: controlplane.Process,
    timings: Callable[[str, float], None],
) -> None:
    """Guards: a pod with a template claim runs on the real node; containerd injected the agent's CDI edits
    (NVIDIA_VISIBLE_DEVICES = CUDA_VISIBLE_DEVICES = the allocated GPU's UUID, read with `kubectl logs`); the
    claim's CDI spec names no device node (containerd would fail on /dev/nvidia* missing here) and is gone once
    the pod is deleted."""
    api = cluster.api
    namespace = "agent"
    kube_objects.make_namespace(api, namespace)
    api.create(client.RESOURCE_CLAIM_TEMPLATES, kube_objects.template("one-gpu", namespace=namespace))
    pod = scenarios.workload_pod("trainer", namespace=namespace, claims={"gpu": kube_objects.from_template("one-gpu")})
    created = time.monotonic()
    api.create(client.PODS, pod)
    scenarios.wait_running(api, namespace, count=1)
    timings("host agent: pod with a claim created -> Running", time.monotonic() - created)
    timings("host agent: cluster start -> first claim pod Running", time.monotonic() - cluster.began)
    env = scenarios.wait_environment(api, namespace, "trainer")
    claim = scenarios.claim_of(api, api.get(client.PODS, "trainer", namespace=namespace), "gpu")
    found = scenarios.allocated(api, claim)
    assert [device.pool for device in found] == [NODE]
    assert scenarios.visible_devices(env) == scenarios.uuids(found)
    (spec_file,) = cluster.cdi_files(NODE)
    assert spec_file == f"k8s.gpu.nvidia.com-claim_{claim['metadata']['uid']}.yaml"
    # containerd stats every device node a spec names: fake GPUs must name none (no /dev/nvidia* here).
    spec = yaml.safe_load(cluster.read(NODE, f"{scenarios.CDI_DIR}/{spec_file}"))
    assert "deviceNodes" not in json.dumps(spec), spec
    api.delete(client.PODS, "trainer", namespace=namespace)
    controlplane.wait_until(lambda: not cluster.cdi_files(NODE), what="the claim's CDI spec is removed", timeout=90)


def test_each_container_of_a_two_request_claim_sees_its_requests_gpus_also_after_the_cdi_dir_was_emptied(
    cluster: realcluster.RealCluster, agent: controlplane.Process
) -> None:
    """Guards: what containers see on a real node (containerd's CDI injection): for a claim of two requests, the
    container that names neither sees both GPUs and each container that names one sees only that one's; and with
    the CDI directory emptied while the pod runs, a container of it that exits is restarted by the kubelet with the
    same GPUs (the agent writes the spec again from its checkpoint; the kubelet does not prepare again)."""
    api = cluster.api
    namespace = "two-requests"
    node = cluster.node(NODE)
    kube_objects.make_namespace(api, namespace)
    requests = [{"name": name, "exactly": {"deviceClassName": "gpu.nvidia.com"}} for name in ("first", "second")]
    template = kube_objects.template("two", namespace=namespace, spec={"devices": {"requests": requests}})
    api.create(client.RESOURCE_CLAIM_TEMPLATES, template)
    pod = scenarios.workload_pod("trainer", namespace=namespace, claims={"gpu": kube_objects.from_template("two")})
    (main,) = pod["spec"]["containers"]
    named = [
        {**main, "name": name, "resources": {"claims": [{"name": "gpu", "request": name}]}}
        for name in ("first", "second")
    ]
    # Exits once the test creates /trigger/go on the node, which it removes first, so it runs on after its restart.
    wait_then_exit = "while [ ! -e /trigger/go ]; do sleep 0.2; done; rm -f /trigger/go; exit 1"
    restarting = {
        **main,
        "name": "restarting",
        "command": ["sh", "-c", scenarios.WORKLOAD_SCRIPT.replace("trap", f"{wait_then_exit}; trap", 1)],
        "volumeMounts": [{"name": "trigger", "mountPath": "/trigger"}],
    }
    pod["spec"]["containers"] = [main, *named, restarting]
    pod["spec"]["volumes"] = [
        {"name": "trigger", "hostPath": {"path": "/var/lib/dractl-e2e-trigger", "type": "DirectoryOrCreate"}}
    ]
    api.create(client.PODS, pod)
    scenarios.wait_running(api, namespace, count=1)
    claim = scenarios.claim_of(api, api.get(client.PODS, "trainer", namespace=namespace), "gpu")
    first, second = (scenarios.uuids(scenarios.allocated(api, claim, request)) for request in ("first", "second"))
    assert len(first) == len(second) == 1 and first != second
    seen = {
        container: scenarios.visible_devices(scenarios.wait_environment(api, namespace, "trainer", container))
        for container in ("main", "first", "second", "restarting")
    }
    assert seen == {"main": first + second, "first": first, "second": second, "restarting": first + second}

    (spec_file,) = cluster.cdi_files(NODE)
    assert node.run(["rm", f"{scenarios.CDI_DIR}/{spec_file}"]).returncode == 0
    node.host_path("/var/lib/dractl-e2e-trigger/go").write_text("")

    def restarted() -> dict[str, Any] | None:
        statuses = api.get(client.PODS, "trainer", namespace=namespace)["status"].get("containerStatuses") or ()
        status = next(s for s in statuses if s["name"] == "restarting")
        return status if status.get("restartCount", 0) >= 1 and "running" in (status.get("state") or {}) else None

    scenarios.wait(
        restarted,
        what=lambda: (
            "the container restarted with its devices: "
            f"{api.get(client.PODS, 'trainer', namespace=namespace)['status'].get('containerStatuses')}"
        ),
        timeout=120,
    )
    assert cluster.cdi_files(NODE) == [spec_file]
    env = scenarios.wait_environment(api, namespace, "trainer", "restarting")
    assert scenarios.visible_devices(env) == first + second
    scenarios.remove_namespace(api, namespace)


def test_a_gpu_allocated_to_two_claims_is_refused_to_the_second_and_its_pod_says_which(
    cluster: realcluster.RealCluster, agent: controlplane.Process
) -> None:
    """Guards: one GPU allocated to two claims (as two schedulers on shared nodes could): the first claim's pod runs,
    the second's is refused at prepare, and what its user sees, the kubelet's Event on the refused pod, names both
    claims and both pods."""
    api = cluster.api
    namespace = "held-twice"
    kube_objects.make_namespace(api, namespace)
    for claim_name, pod_name in (("first", "p1"), ("second", "p2")):
        created = api.create(client.RESOURCE_CLAIMS, kube_objects.claim(claim_name, namespace=namespace))
        pod = scenarios.workload_pod(pod_name, namespace=namespace, claims={"gpu": kube_objects.of_claim(claim_name)})
        pod["spec"]["nodeName"] = NODE
        pod = api.create(client.PODS, pod)
        status = {
            "allocation": kube_objects.allocation(NODE, ["gpu-7"], node=NODE),
            "reservedFor": kube_objects.reserved_for([pod]),
        }
        api.update_status(client.RESOURCE_CLAIMS, {**created, "status": status})
        if pod_name == "p1":
            scenarios.wait_running(api, namespace, count=1)

    def refused() -> str | None:
        events = api.list(client.EVENTS, namespace=namespace).items
        messages = [
            e.get("message") or ""
            for e in events
            if (e.get("involvedObject") or {}).get("name") == "p2" and "already prepared" in (e.get("message") or "")
        ]
        return messages[0] if messages else None

    message = scenarios.wait(
        refused,
        what=lambda: f"an Event on p2 says why: {api.list(client.EVENTS, namespace=namespace).items}",
        timeout=120,
    )
    assert (
        f"claim {namespace}/second (pod {namespace}/p2): device gpu-7 is already prepared for claim {namespace}/first"
        in message
    ), message
    assert f"(pod {namespace}/p1); it cannot be used by two claims at once" in message, message
    assert scenarios.phase(api.get(client.PODS, "p2", namespace=namespace)) == "Pending"
    scenarios.remove_namespace(api, namespace)


def test_a_two_pod_gang_sharing_its_pod_groups_claim_runs_and_both_containers_see_its_gpu(
    cluster: realcluster.RealCluster, agent: controlplane.Process
) -> None:
    """Guards a PodGroup's own claim (KEP-5729) on a real node: a 2-pod gang (scheduling.k8s.io/v1alpha2, minCount 2)
    whose pods share the group's claim, made from a template once for the group and reserved for the PodGroup, runs:
    the agent prepares it for both pods and both containers see its one GPU."""
    api = cluster.api
    namespace = "gang-claim"
    kube_objects.make_namespace(api, namespace)
    api.create(client.RESOURCE_CLAIM_TEMPLATES, kube_objects.template("one-gpu", namespace=namespace))
    group = {
        "apiVersion": "scheduling.k8s.io/v1alpha2",
        "kind": "PodGroup",
        "metadata": {"name": "train", "namespace": namespace},
        "spec": {
            "schedulingPolicy": {"gang": {"minCount": 2}},
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
        },
    }
    api.create(client.POD_GROUPS, group)
    for name in ("worker-0", "worker-1"):
        pod = scenarios.workload_pod(name, namespace=namespace, claims={"gpu": kube_objects.from_template("one-gpu")})
        pod["spec"]["schedulingGroup"] = {"podGroupName": "train"}
        api.create(client.PODS, pod)
    scenarios.wait_running(api, namespace, count=2)
    (claim,) = api.list(client.RESOURCE_CLAIMS, namespace=namespace).items
    assert [ref["resource"] for ref in claim["status"]["reservedFor"]] == ["podgroups"], claim["status"]
    gpu = scenarios.uuids(scenarios.allocated(api, claim))
    assert len(gpu) == 1
    for name in ("worker-0", "worker-1"):
        assert scenarios.visible_devices(scenarios.wait_environment(api, namespace, name)) == gpu, name
    scenarios.remove_namespace(api, namespace)


def test_a_stopped_node_leaves_no_process_mount_cgroup_or_sysctl_change(
    cluster: realcluster.RealCluster, real_images: list[node_images.Image]
) -> None:
    """Guards: stopping a real node that ran a pod ends every process of it (daemons, shims, containers), leaves
    no mount of its directory on the host, removes its cgroup root in every hierarchy and its directory, and
    leaves the host's sysctls as they were (the kubelet wrote only the stand-ins)."""
    before = realnode.host_sysctls()
    node = realnode.RealNode.start(cluster.plane, name="scratch", api=cluster.api, preload=real_images)
    try:
        namespace = "scratch"
        kube_objects.make_namespace(cluster.api, namespace)
        pod = kube_objects.pod("sleeper", namespace=namespace, claims=[], nodeName="scratch")
        cluster.api.create(client.PODS, scenarios.as_workload(pod, image=node_images.BUSYBOX))
        scenarios.wait_running(cluster.api, namespace, count=1)
        pids = node.processes()
        assert len(pids) >= 5, f"expected daemons, a shim and the pod's processes, found {sorted(pids)}"
        cgroups = node.cgroups
        directory = node.directory
        changed = {k: v for k, v in realnode.host_sysctls().items() if before.get(k) != v}
        assert changed == {}, f"the kubelet changed host sysctls: {changed}"
    finally:
        node.stop()
    controlplane.wait_until(
        lambda: not [pid for pid in pids if realnode.alive(pid)], what="every process of the node is gone", timeout=30
    )
    assert [group for group in cgroups if group.exists()] == []
    assert not directory.exists()
    mounts = pathlib.Path("/proc/self/mountinfo").read_text()
    assert str(directory) not in mounts and node.cgroup_root not in mounts
    assert realnode.host_sysctls() == before


def test_the_seed_manifests_are_objects_the_api_server_accepts(cluster: realcluster.RealCluster) -> None:
    """Guards: every manifest of e2e/manifests/seeds/ (the suites' waves and the README's tutorial) is accepted by
    kube-apiserver 1.36 as it is (a dry-run create: schemas and CEL compiled), and each of its containers runs the
    workload script the checks read the environment from."""
    api = cluster.api
    kube_objects.make_namespace(api, "seed-manifests")
    documents = [doc for path in sorted(scenarios.SEEDS.glob("*.yaml")) for doc in scenarios.load(path)]
    assert len(documents) > 20
    for document in documents:
        target = scenarios.resource(document)
        body = {**document, "metadata": {**document["metadata"]}}
        if not target.namespaced:  # The agent's fixture created classes of these names: check a copy.
            body["metadata"]["name"] += "-dry-run"
        api.create(target, body, namespace="seed-manifests" if target.namespaced else "", dry_run=True)
        for container in scenarios.containers(document):
            assert container["image"] == "busybox:1.35", document["metadata"]["name"]
            assert container["command"] == ["sh", "-c", scenarios.WORKLOAD_SCRIPT], document["metadata"]["name"]
