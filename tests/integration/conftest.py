"""Fixtures of the integration tests that run `dractl node-agent` processes."""

from __future__ import annotations

import collections.abc
import contextlib
import pathlib
import uuid

import controlplane
import pytest
from support import agent_process

from dractl.kube import client


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
