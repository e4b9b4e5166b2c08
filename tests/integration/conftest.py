"""Fixtures of the integration tests: the nodes of `dractl node-agent` processes, and dractl's claim controller and
the scheduler tests' node groups, started on the test's namespace."""

from __future__ import annotations

import collections.abc
import contextlib
import pathlib
import uuid

import controlplane
import prometheus_client
import pytest
from support import agent_process, node_group

from dractl.controller import claims as claims_ctl
from dractl.kube import client, workqueue


@pytest.fixture
def agent_node(
    control_plane: controlplane.ControlPlane,
    kube_client: client.Client,
    namespace: str,
    tmp_path: pathlib.Path,
    sock_dir: pathlib.Path,
) -> collections.abc.Iterator[agent_process.Node]:
    """A Node object, a DeviceClass `mig-<node>` and the directories of one node's agents; every agent started on it
    is stopped at the end."""
    name = f"node-{uuid.uuid4().hex[:8]}"
    kube_client.create(client.NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    kube_client.create(
        client.DEVICE_CLASSES,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": f"mig-{name}"},
            "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{agent_process.DRIVER}'"}}]},
        },
    )
    (tmp_path / "logs").mkdir()
    found = agent_process.Node(
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
        found.stop_all()
        with contextlib.suppress(client.NotFound):
            kube_client.delete(client.DEVICE_CLASSES, f"mig-{name}")


@pytest.fixture
def scheduler_name() -> str:
    return f"dractl-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def group(
    kube_client: client.Client, namespace: str, scheduler_name: str
) -> collections.abc.Iterator[node_group.Group]:
    """The test's namespace and node group (nodes and slices removed at the end), with the example DeviceClasses."""
    node_group.ensure_device_classes(kube_client)
    made = node_group.Group(kube_client, namespace=namespace, scheduler_name=scheduler_name)
    yield made
    made.cleanup()


@pytest.fixture
def make_controller(
    proxied_client: client.Client, namespace: str
) -> collections.abc.Iterator[collections.abc.Callable[[], claims_ctl.ClaimController]]:
    """Starts claim controllers on the test namespace through the fault proxy (fast backoff).

    At the end of the test each is stopped (last started first, each even when stopping another failed), before
    the client it uses is closed; `stop()` joins their threads with a timeout.
    """
    with contextlib.ExitStack() as started:

        def make() -> claims_ctl.ClaimController:
            queue = workqueue.WorkQueue(backoff=workqueue.ExponentialBackoff(base=0.02, cap=0.5))
            made = claims_ctl.ClaimController(
                proxied_client, namespace=namespace, queue=queue, registry=prometheus_client.CollectorRegistry()
            )
            made.start()
            started.callback(made.stop)
            return made

        yield make


@pytest.fixture
def claim_controller(
    kube_client: client.Client, namespace: str
) -> collections.abc.Iterator[claims_ctl.ClaimController]:
    """dractl's claim lifecycle controller on the test namespace (it makes the claims from templates and frees those of
    deleted pods)."""
    queue = workqueue.WorkQueue(backoff=workqueue.ExponentialBackoff(base=0.02, cap=0.5))
    made = claims_ctl.ClaimController(
        kube_client, namespace=namespace, queue=queue, registry=prometheus_client.CollectorRegistry()
    )
    made.start()
    yield made
    made.stop()
