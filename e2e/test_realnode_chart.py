"""dractl installed for real on this machine: its image in containerd, its chart installed by Helm, every seed pattern.

Two real nodes (kubelet + containerd, e2e/realnode.py) beside the control plane: `gpu-a100` with
fake a100-80gb-x8 GPUs in dynamic MIG mode and `gpu-t4` with fake t4-x2 GPUs. dractl's image
(tools/build_image.py) is imported into both containerds; the chart is installed by Helm's engine
as two releases, as one would install it for two kinds of GPU node: `dractl` (the controller, the
classes and policies, the node agent on nodes labelled a100-80gb-x8) and `dractl-t4` (only a node
agent, on nodes labelled t4-x2). Every dractl process runs in a pod with the chart's
ServiceAccount, with RBAC authorization on. Pods of the release namespace run on the host network
(this machine allows only loopback traffic: release.loopback_network), which is also why the
controller runs 1 replica and each release has ports of its own.

The seed patterns run in two waves: the ones kube-scheduler places, then (once those are deleted)
the ones dractl's scheduler places. Long scenarios (`-m long`): a kubelet restart, a node agent
pod deleted mid-run, `helm upgrade` to a new image tag.
"""

from __future__ import annotations

import pathlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import controlplane
import node_images
import pytest
import realcluster
import release
import scenarios

from dractl.kube import client

pytestmark = [pytest.mark.realnode, pytest.mark.timeout(900)]

A100, T4 = "gpu-a100", "gpu-t4"


# A new node agent cannot start beside the old one here: both would publish the same host ports (the
# pods share the host network), so the scheduler keeps the new one Pending. Replace, don't surge.
_ONE_AT_A_TIME = {"maxSurge": 0, "maxUnavailable": 1}


def _values(image: node_images.Image, ports: list[int]) -> dict[str, dict[str, Any]]:
    """The two releases' values (e2e/values/), with what this machine needs: the image as imported (never pulled),
    one controller replica and ports of each release's own (dractl's pods share the host network here)."""
    repository, tag = image.name.rsplit(":", 1)
    common = {"image": {"repository": repository, "tag": tag, "pullPolicy": "Never"}}
    controller_metrics, controller_health, a100_metrics, a100_health, t4_metrics, t4_health = ports
    return {
        "dractl": release.values(
            "dractl",
            {
                **common,
                "controller": {"replicas": 1, "metricsPort": controller_metrics, "healthPort": controller_health},
                "nodeAgent": {"metricsPort": a100_metrics, "healthPort": a100_health, **_ONE_AT_A_TIME},
            },
        ),
        "dractl-t4": release.values(
            "dractl-t4", {**common, "nodeAgent": {"metricsPort": t4_metrics, "healthPort": t4_health, **_ONE_AT_A_TIME}}
        ),
    }


class Install:
    """The installed releases: the image they run and their values (ports included)."""

    def __init__(self, cluster: realcluster.RealCluster, image: node_images.Image) -> None:
        self.cluster = cluster
        self.image = image
        self.values = _values(image, controlplane.free_ports(6))

    def wait_ready(self, *, image: str) -> None:
        scenarios.wait_dractl(self.cluster.api, nodes={A100, T4}, image=image, controllers=1)


@pytest.fixture(scope="module")
def cluster(
    start_cluster: Callable[..., realcluster.RealCluster], dractl_image: node_images.Image
) -> realcluster.RealCluster:
    labels = {A100: "a100-80gb-x8", T4: "t4-x2"}
    return start_cluster(
        {node: {release.GPU_LABEL: "true", release.PROFILE_LABEL: profile} for node, profile in labels.items()},
        preload=[dractl_image],
    )


@pytest.fixture(scope="module")
def installed(
    cluster: realcluster.RealCluster, dractl_image: node_images.Image, timings: Callable[[str, float], None]
) -> Iterator[Install]:
    """Both releases installed by Helm, their pods running with the chart's ServiceAccounts, slices published."""
    api = cluster.api
    install = Install(cluster, dractl_image)
    scenarios.apply(api, [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": release.NAMESPACE}}])
    scenarios.apply(api, release.loopback_network(port=cluster.plane.port))
    probe = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe", "namespace": release.NAMESPACE}}
    probe["spec"] = {"containers": [{"name": "probe", "image": node_images.PAUSE}]}

    def mutated() -> bool:
        try:
            return bool(api.create(client.PODS, probe, dry_run=True)["spec"].get("hostNetwork"))
        except client.ApiError:  # The namespace's default ServiceAccount may not exist yet.
            return False

    controlplane.wait_until(
        mutated, what="the loopback network policy applies to new pods of the release namespace", timeout=60
    )
    began = time.monotonic()
    try:
        for name, values in install.values.items():
            release.install(cluster.plane.kubeconfig, name, values)
        install.wait_ready(image=dractl_image.name)
        timings("chart: helm install -> agents and controller running, slices published", time.monotonic() - began)
        yield install
    finally:
        for name in reversed(install.values):
            release.uninstall(cluster.plane.kubeconfig, name)


@pytest.fixture(scope="module")
def kube_scheduler_seeds(
    cluster: realcluster.RealCluster, installed: Install, timings: Callable[[str, float], None]
) -> Iterator[scenarios.Wave]:
    """The seed patterns kube-scheduler places, all running."""
    wave = scenarios.kube_scheduler_wave(cluster.api)
    scenarios.apply(cluster.api, scenarios.load(scenarios.SEEDS / scenarios.CLASSES))
    began = time.monotonic()
    wave.apply()
    wave.wait_running()
    timings(f"seeds placed by kube-scheduler: applied -> all {wave.pods} pods Running", time.monotonic() - began)
    timings("from nothing (no process) to all kube-scheduler seed pods Running", time.monotonic() - cluster.began)
    yield wave
    wave.remove()


@pytest.fixture(scope="module")
def dractl_seeds(
    cluster: realcluster.RealCluster, kube_scheduler_seeds: scenarios.Wave, timings: Callable[[str, float], None]
) -> Iterator[scenarios.Wave]:
    """The seed patterns dractl places, all running, once the kube-scheduler wave is gone (they share the GPUs)."""
    kube_scheduler_seeds.remove()
    wave = scenarios.dractl_wave(cluster.api)
    began = time.monotonic()
    wave.apply()
    wave.wait_running()
    timings(f"seeds placed by dractl: applied -> all {wave.pods} pods Running", time.monotonic() - began)
    yield wave
    wave.remove()


def test_helm_installs_dractl_as_pods_with_the_charts_service_accounts(
    cluster: realcluster.RealCluster, installed: Install
) -> None:
    """Guards: the chart installed by Helm runs one node agent pod per GPU node and the controller, from dractl's
    image imported into containerd, each under its release's ServiceAccount; both nodes' GPUs are published
    (8 A100s with their MIG placements, 2 T4s); the chart's DeviceClasses exist."""
    api = cluster.api
    agents = scenarios.agents(cluster.api)
    assert {node: pod["spec"]["serviceAccountName"] for node, pod in agents.items()} == {
        A100: "dractl-node-agent",
        T4: "dractl-t4-node-agent",
    }
    (controller,) = scenarios.pods(api, release.NAMESPACE, selector=scenarios.CONTROLLER_PODS)
    assert controller["spec"]["serviceAccountName"] == "dractl-controller" and scenarios.ready(controller)
    assert {scenarios.image_of(pod) for pod in [controller, *agents.values()]} == {installed.image.name}
    a100 = scenarios.devices(api, A100)
    assert sorted(n for n, d in a100.items() if d.attributes["type"] == "gpu") == [f"gpu-{i}" for i in range(8)]
    assert any(d.attributes["type"] == "mig" for d in a100.values())
    assert sorted(scenarios.devices(api, T4)) == ["gpu-0", "gpu-1"]
    classes = {item["metadata"]["name"] for item in api.list(client.DEVICE_CLASSES).items}
    assert {"gpu.nvidia.com", "mig.nvidia.com"} <= classes


def test_the_seed_patterns_kube_scheduler_places_run_as_their_articles_say(
    cluster: realcluster.RealCluster, kube_scheduler_seeds: scenarios.Wave
) -> None:
    """Guards: seed 000 patterns 1-3 and seed 001 on real containers: each container's NVIDIA_VISIBLE_DEVICES and
    CUDA_VISIBLE_DEVICES name exactly its claim's devices (read with `kubectl logs`), a named claim's two pods see
    one GPU, each template replica its own, a MIG pair shares one parent whose two instances the agent created."""
    scenarios.check_kube_scheduler_wave(cluster.api, cluster)


def test_deleting_the_seed_pods_unprepares_every_claim(
    cluster: realcluster.RealCluster, kube_scheduler_seeds: scenarios.Wave
) -> None:
    """Guards: once the kube-scheduler wave's pods and claims are deleted, no CDI spec is left on either node and
    every MIG instance the agent created for them is destroyed."""
    kube_scheduler_seeds.remove()
    for node in (A100, T4):
        controlplane.wait_until(
            lambda node=node: not cluster.cdi_files(node), what=f"node {node} has no CDI spec left", timeout=90
        )
    controlplane.wait_until(
        lambda: not any(gpu["gpuInstances"] for gpu in scenarios.fake_state(cluster, A100)["gpus"].values()),
        what="every MIG instance on gpu-a100 is destroyed",
        timeout=90,
    )


def test_the_seed_patterns_dractl_places_run_as_their_articles_say(
    cluster: realcluster.RealCluster, dractl_seeds: scenarios.Wave
) -> None:
    """Guards: pods with spec.schedulerName dractl are placed by dractl: a 4-GPU claim in one NVLink partition
    (seed 004), MPS and time-slicing configs applied on shared T4s (seed 002), a single MIG instance (seed 002),
    two GPUs chosen by compute capability and CUDA driver version (seed 003)."""
    scenarios.check_dractl_wave(cluster.api, cluster)
    bindings = [
        e
        for e in cluster.audit()
        if e.get("objectRef", {}).get("subresource") == "binding"
        and e.get("objectRef", {}).get("namespace") == dractl_seeds.namespace
        and e.get("stage") == "ResponseComplete"
    ]
    binders = {e["user"]["username"] for e in bindings if e["responseStatus"]["code"] == 201}
    assert binders == {"system:serviceaccount:dractl:dractl-controller"}, binders
    dractl_seeds.remove()  # The GPUs are free again for the scenarios after this one.


@pytest.mark.long
def test_a_kubelet_restart_deletes_the_nodes_slices_and_the_agent_publishes_them_again(
    cluster: realcluster.RealCluster, installed: Install
) -> None:
    """Guards: the kubelet deletes its node's ResourceSlices when it starts; the A100 node agent, still running,
    registers again and publishes them again, and a claim's pod then runs on that node."""
    api = cluster.api
    before = {s["metadata"]["uid"] for s in api.list(client.RESOURCE_SLICES).items if s["spec"]["nodeName"] == A100}
    node = cluster.node(A100)
    node.restart_kubelet()
    node.wait_ready()

    def republished() -> bool:
        now = {s["metadata"]["uid"] for s in api.list(client.RESOURCE_SLICES).items if s["spec"]["nodeName"] == A100}
        return bool(now) and not now & before

    controlplane.wait_until(republished, what="the A100 node's slices are published again", timeout=180)
    scenarios.claim_pod(api, "kubelet-restart", "after-restart", node=A100)
    assert scenarios.visible_devices(scenarios.wait_environment(api, "kubelet-restart", "after-restart"))
    scenarios.remove_namespace(api, "kubelet-restart")


@pytest.mark.long
def test_a_node_agent_pod_deleted_mid_run_leaves_its_claims_working(
    cluster: realcluster.RealCluster, installed: Install
) -> None:
    """Guards: deleting the A100 node agent's pod while a claim's pod runs: the DaemonSet's new agent runs, the
    pod keeps its GPU, a new pod gets one, and deleting the first pod unprepares its claim (its CDI spec is gone)."""
    scenarios.mid_run_agent_restart(cluster.api, cluster, node=A100)


@pytest.mark.long
def test_helm_upgrade_to_a_new_image_tag_rolls_the_pods_and_keeps_prepared_claims(
    cluster: realcluster.RealCluster, installed: Install
) -> None:
    """Guards: `helm upgrade` of both releases to another tag of the image (tagged in containerd) replaces every
    dractl pod with one of the new tag; a claim prepared by the old agent is unprepared by the new one, and a new
    claim's pod runs."""
    api = cluster.api
    before = scenarios.claim_pod(api, "upgrade", "before", node=A100)
    spec_file = scenarios.claim_spec_file(api, before)
    repository, tag = installed.image.name.rsplit(":", 1)
    upgraded = f"{repository}:{tag}-e2e-upgrade"
    for node in cluster.nodes.values():
        node.ctr("images", "tag", "--force", installed.image.name, upgraded)
    for name, values in installed.values.items():
        new_tag = {**values, "image": {**values["image"], "tag": f"{tag}-e2e-upgrade"}}
        release.upgrade(cluster.plane.kubeconfig, name, new_tag)
    installed.wait_ready(image=upgraded)
    api.delete(client.PODS, "before", namespace="upgrade")
    controlplane.wait_until(
        lambda: spec_file not in cluster.cdi_files(A100),
        what="the upgraded agent unprepared the claim the old one prepared",
        timeout=120,
    )
    scenarios.claim_pod(api, "upgrade", "after", node=A100)
    assert scenarios.visible_devices(scenarios.wait_environment(api, "upgrade", "after"))
    scenarios.remove_namespace(api, "upgrade")


def test_no_request_of_dractl_was_forbidden(cluster: realcluster.RealCluster, installed: Install) -> None:
    """Guards: RBAC proven, not assumed: in every scenario so far no request of the controller's or the node
    agents' ServiceAccounts was answered 403 (the API server's audit log)."""
    forbidden = [
        f"{e['user']['username']} {e['verb']} {e['requestURI']}"
        for e in cluster.audit()
        if e.get("user", {}).get("username", "").startswith("system:serviceaccount:dractl:")
        and e.get("responseStatus", {}).get("code") == 403
    ]
    requests = [
        e for e in cluster.audit() if e.get("user", {}).get("username", "").startswith("system:serviceaccount:")
    ]
    assert requests, "the audit log holds no request of a ServiceAccount"
    assert forbidden == []


def test_a_node_agent_cannot_write_another_nodes_slices(cluster: realcluster.RealCluster, installed: Install) -> None:
    """Guards: the chart's policy refuses the A100 node agent's own token (from its pod's projected volume on the
    node) a ResourceSlice of node gpu-t4, naming both nodes, and allows one of its own node."""
    uid = scenarios.agents(cluster.api)[A100]["metadata"]["uid"]
    # The kubelet mounts the projected volume (a tmpfs) inside the node's mount namespace: read it there.
    token = cluster.node(A100).run(
        ["sh", "-c", f"cat /var/lib/kubelet/pods/{uid}/volumes/kubernetes.io~projected/kube-api-access-*/token"]
    )
    assert token.returncode == 0 and token.stdout, token.stderr
    kubeconfig = _token_kubeconfig(cluster, token.stdout)
    api = client.connect(kubeconfig)
    try:
        foreign = _slice("e2e-foreign", node=T4)
        with pytest.raises(client.ApiError) as refused:
            api.create(client.RESOURCE_SLICES, foreign)
        assert refused.value.status == 403
        assert f"node agent on node {A100} may only write ResourceSlices of node {A100}, not of node {T4}" in str(
            refused.value
        )
        own = api.create(client.RESOURCE_SLICES, _slice("e2e-own", node=A100))
        api.delete(client.RESOURCE_SLICES, own["metadata"]["name"])
    finally:
        api.close()


def _slice(name: str, *, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": scenarios.GPU_DRIVER,
            "nodeName": node,
            "pool": {"name": f"{name}-pool", "generation": 1, "resourceSliceCount": 1},
            "devices": [],
        },
    }


def _token_kubeconfig(cluster: realcluster.RealCluster, token: str) -> pathlib.Path:
    return controlplane.write_kubeconfig(
        cluster.audit_log.parent / "agent-token.kubeconfig",
        server=cluster.plane.url,
        ca=cluster.plane.ca.cert,
        token=token.strip(),
    )


def test_uninstall_leaves_no_slices_claims_or_cdi_files(cluster: realcluster.RealCluster, installed: Install) -> None:
    """Guards: with the workloads deleted, `helm uninstall` of both releases removes dractl's pods, classes and
    policies; the kubelets then remove both nodes' ResourceSlices; no ResourceClaim and no CDI spec is left."""
    scenarios.uninstall_and_check(cluster.api, cluster, kubeconfig=cluster.plane.kubeconfig, node_names=[A100, T4])
