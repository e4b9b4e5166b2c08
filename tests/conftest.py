"""Fixtures shared by the whole suite: a real control plane for the session, clients, namespaces, the fault proxy.

One kube-apiserver serves the whole test session (it starts in about 4 s); tests isolate
themselves by namespace and object names. A test that needs the control plane skips with one
line saying how to get the binaries when they are absent.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import controlplane
import faultproxy
import pytest

from dractl.kube import client


@pytest.fixture(scope="session")
def control_plane() -> Iterator[controlplane.ControlPlane]:
    """etcd + kube-apiserver for the whole session; skips with one line when the binaries are absent."""
    try:
        plane = controlplane.ControlPlane.start()
    except controlplane.Unavailable as missing:
        pytest.skip(str(missing))
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def components(control_plane: controlplane.ControlPlane) -> Iterator[controlplane.Components]:
    """kube-controller-manager and kube-scheduler beside the session's API server (for coexistence tests).

    Session-scoped and started only by the tests that ask for it; they act on every namespace,
    so such tests must not depend on objects being left alone by upstream controllers.
    """
    try:
        started = control_plane.start_components()
    except controlplane.Unavailable as missing:
        pytest.skip(str(missing))
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="session")
def kube_client(control_plane: controlplane.ControlPlane) -> Iterator[client.Client]:
    """A `dractl.kube.client.Client` with the admin identity, talking to the server directly."""
    connected = client.connect(control_plane.kubeconfig)
    try:
        yield connected
    finally:
        connected.close()


@pytest.fixture
def namespace(kube_client: client.Client) -> str:
    """A fresh namespace (with its `default` ServiceAccount, since no controller manager may run) for one test."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    kube_client.create(client.NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    service_accounts = client.Resource("", "v1", "serviceaccounts", "ServiceAccount", namespaced=True)
    try:
        kube_client.create(service_accounts, {"metadata": {"name": "default", "namespace": name}})
    except client.AlreadyExists:
        pass  # The controller manager's service account controller was faster.
    return name


@pytest.fixture
def fault_proxy(control_plane: controlplane.ControlPlane) -> Iterator[faultproxy.FaultProxy]:
    """A fault-injecting HTTPS proxy in front of the session's API server, with its own kubeconfig."""
    proxy = faultproxy.FaultProxy.start(control_plane)
    try:
        yield proxy
    finally:
        proxy.stop()


@pytest.fixture
def proxied_client(fault_proxy: faultproxy.FaultProxy) -> Iterator[client.Client]:
    """A `dractl.kube.client.Client` whose every request goes through `fault_proxy`."""
    connected = client.connect(fault_proxy.kubeconfig)
    try:
        yield connected
    finally:
        connected.close()
