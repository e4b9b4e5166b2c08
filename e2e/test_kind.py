"""The kind suite: dractl on a kind cluster, installed and checked as a user would, with the real-node suite's checks.

e2e/kind/ creates the cluster (Kubernetes 1.36 with DRA and CDI, a worker of fake a100-80gb-x8
GPUs in dynamic MIG mode and one of fake t4-x2 GPUs), builds dractl's image with Docker and loads
it; the chart is installed by Helm's engine as the releases of e2e/values/; then the seed patterns
run in the same two waves as on the real node, checked by the same code (e2e/scenarios.py), plus
a node agent pod deleted mid-run and the uninstall. Runs where a Docker engine and kind exist
(`pytest -m e2e e2e/test_kind.py`); elsewhere it skips with one line. Set DRACTL_E2E_KEEP_CLUSTER=1
to keep the cluster afterwards; `kind export logs` is written next to a failure's report.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator

import pytest
import release
import scenarios

from dractl.kube import client

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

KIND = pathlib.Path(__file__).resolve().parent / "kind"
CLUSTER = os.environ.get("KIND_CLUSTER_NAME", "dractl-e2e")
A100, T4 = f"{CLUSTER}-worker", f"{CLUSTER}-worker2"


def _run(argv: list[str], *, timeout: float) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, f"{' '.join(argv)} exited with {done.returncode}:\n{done.stderr[-3000:]}"
    return done.stdout


def _skip_without_docker_and_kind() -> None:
    """Skip (one line) unless kind is on PATH and a Docker engine answers."""
    if shutil.which("kind") is None or shutil.which("docker") is None:
        pytest.skip("the kind suite needs kind and a Docker engine: kind or docker is not on PATH")
    engine = subprocess.run(
        ["docker", "version", "--format", "{{.Server.Version}}"], capture_output=True, text=True, timeout=60
    )
    if engine.returncode != 0:
        reason = (engine.stderr.strip().splitlines() or ["no answer"])[-1]
        pytest.skip(f"the kind suite needs a Docker engine: {reason}")


class KindNodes:
    """What the checks see on a kind node: its container's files, through `docker exec`."""

    def cdi_files(self, node: str) -> list[str]:
        return sorted(_run(["docker", "exec", node, "ls", "-1", scenarios.CDI_DIR], timeout=60).split())

    def read(self, node: str, path: str) -> str:
        done = subprocess.run(["docker", "exec", node, "cat", path], capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise FileNotFoundError(f"{path} on node {node}: {done.stderr.strip()}")
        return done.stdout

    def exists(self, node: str, path: str) -> bool:
        return subprocess.run(["docker", "exec", node, "test", "-e", path], timeout=60).returncode == 0


@pytest.fixture(scope="module")
def kubeconfig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[pathlib.Path]:
    """The kind cluster, created by e2e/kind/create-cluster.sh with dractl's image and busybox loaded."""
    _skip_without_docker_and_kind()
    if CLUSTER not in _run(["kind", "get", "clusters"], timeout=60).split():
        _run(["bash", str(KIND / "create-cluster.sh")], timeout=900)
    try:
        _run(["bash", str(KIND / "load-images.sh")], timeout=1800)
        path = tmp_path_factory.mktemp("kind") / "kubeconfig"
        path.write_text(_run(["kind", "get", "kubeconfig", "--name", CLUSTER], timeout=60))
        yield path
    finally:
        if not os.environ.get("DRACTL_E2E_KEEP_CLUSTER"):
            _run(["bash", str(KIND / "delete-cluster.sh")], timeout=600)


class KindCluster:
    """The kind cluster as the checks use it: an admin client, and its logs for a failure report."""

    def __init__(self, api: client.Client, logs: pathlib.Path) -> None:
        self.api = api
        self.logs = logs

    def failure_report(self) -> str:
        subprocess.run(["kind", "export", "logs", str(self.logs), "--name", CLUSTER], capture_output=True, timeout=300)
        return f"kind export logs: {self.logs}\n{scenarios.pod_logs(self.api)}"


@pytest.fixture(scope="module")
def kind(kubeconfig: pathlib.Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KindCluster]:
    connected = client.connect(kubeconfig)
    try:
        yield KindCluster(connected, tmp_path_factory.mktemp("kind-logs"))
    finally:
        connected.close()


@pytest.fixture(scope="module")
def installed(kubeconfig: pathlib.Path, kind: KindCluster, timings: Callable[[str, float], None]) -> Iterator[str]:
    """Both releases installed by Helm with e2e/values/ as they are; their pods running, slices published. Yields
    the image the pods run (the chart's default, `dractl:<appVersion>`, which load-images.sh built and loaded)."""
    image = f"dractl:{release.app_version()}"
    began = time.monotonic()
    try:
        for name in release.RELEASES:
            release.install(kubeconfig, name, release.values(name))
        scenarios.wait_dractl(kind.api, nodes={A100, T4}, image=image, controllers=2)
        timings("kind: helm install -> agents and controllers running, slices published", time.monotonic() - began)
        yield image
    finally:
        for name in reversed(release.RELEASES):
            release.uninstall(kubeconfig, name)


def test_helm_installs_dractl_on_both_gpu_workers(kind: KindCluster, installed: str) -> None:
    """Guards: one node agent per GPU worker and two controller replicas (one leader), from the image kind loaded."""
    assert sorted(scenarios.agents(kind.api)) == [A100, T4]
    controllers = scenarios.pods(kind.api, release.NAMESPACE, selector=scenarios.CONTROLLER_PODS)
    assert len(controllers) == 2 and all(scenarios.image_of(pod) == installed for pod in controllers)
    lease = kind.api.get(client.LEASES, "dractl-controller", namespace=release.NAMESPACE)
    assert lease["spec"]["holderIdentity"]


def test_the_seed_patterns_run_as_their_articles_say(kind: KindCluster, installed: str) -> None:
    """Guards: every seed pattern, kube-scheduler's wave then dractl's, checked as on the real node."""
    api = kind.api
    scenarios.apply(api, scenarios.load(scenarios.SEEDS / scenarios.CLASSES))
    for wave, check in (
        (scenarios.kube_scheduler_wave(api), scenarios.check_kube_scheduler_wave),
        (scenarios.dractl_wave(api), scenarios.check_dractl_wave),
    ):
        wave.apply()
        try:
            wave.wait_running()
            check(api, KindNodes())
        finally:
            wave.remove()


def test_a_node_agent_pod_deleted_mid_run_leaves_its_claims_working(kind: KindCluster, installed: str) -> None:
    """Guards: deleting the A100 node agent's pod while a claim's pod runs: the DaemonSet's new agent runs, the
    pod keeps its GPU, a new pod gets one, and deleting the first pod unprepares its claim (its CDI spec is gone)."""
    scenarios.mid_run_agent_restart(kind.api, KindNodes(), node=A100)


def test_uninstall_leaves_no_slices_claims_or_cdi_files(
    kubeconfig: pathlib.Path, kind: KindCluster, installed: str
) -> None:
    """Guards: with the workloads deleted, uninstalling both releases leaves no slice, claim or CDI spec."""
    scenarios.uninstall_and_check(kind.api, KindNodes(), kubeconfig=kubeconfig, node_names=[A100, T4])
