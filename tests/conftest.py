"""Fixtures shared by the whole suite: a real control plane for the session, clients, namespaces, the fault proxy,
short directories for unix sockets, and structlog's defaults back after every test.

One kube-apiserver serves the whole test session (it starts in about 4 s); tests isolate
themselves by namespace and object names. A test that needs the control plane skips with one
line saying how to get the binaries when they are absent.
"""

from __future__ import annotations

import contextlib
import pathlib
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from typing import Protocol, TypeVar

import controlplane
import faultproxy
import pytest
import structlog
from support import kube_objects, prebuild

from dractl.kube import client


class _Stoppable(Protocol):
    def stop(self) -> None: ...


_S = TypeVar("_S", bound=_Stoppable)


@contextlib.contextmanager
def _running(start: Callable[[], _S]) -> Iterator[_S]:
    """What `start()` started, stopped on exit; the test skips (one line) when the binaries are absent."""
    try:
        started = start()
    except controlplane.Unavailable as missing:
        pytest.skip(str(missing))
    try:
        yield started
    finally:
        started.stop()


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests that need dractl's image run last, while it builds in the background (`support.prebuild`)."""
    prebuild.image_last(items)


def pytest_collection_finish(session: pytest.Session) -> None:
    if not session.config.option.collectonly:
        prebuild.start(session.items)


def pytest_sessionfinish() -> None:
    prebuild.stop()


@pytest.fixture(scope="session")
def control_plane() -> Iterator[controlplane.ControlPlane]:
    """etcd + kube-apiserver for the whole session; skips with one line when the binaries are absent."""
    with _running(controlplane.ControlPlane.start) as plane:
        yield plane


@pytest.fixture
def upstream(control_plane: controlplane.ControlPlane) -> Iterator[controlplane.Components]:
    """kube-controller-manager and kube-scheduler beside the session's API server for one test, stopped after it.

    Per test, not per session: left running, they would act on every later test's namespace (their
    garbage collector deletes objects those tests own, the node agent's slices of a re-registered
    Node for one, and their claim controller races dractl's).
    """
    with _running(control_plane.start_components) as started:
        yield started


@pytest.fixture
def upstream_without_claims(control_plane: controlplane.ControlPlane) -> Iterator[controlplane.Components]:
    """kube-controller-manager with its resourceclaim controller off (a cluster where dractl's claim controller makes
    the claims) and kube-scheduler, beside the session's API server for one test, stopped after it."""
    with _running(lambda: control_plane.start_components(resource_claim_controller=False)) as started:
        yield started


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
    kube_objects.make_namespace(kube_client, name)
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


@pytest.fixture
def sock_dir() -> Iterator[pathlib.Path]:
    """A fresh directory under /tmp for a test's unix sockets, removed after it: a socket's path is limited to 107
    bytes, which pytest's tmp_path and the socket names (`<driver>/dra-<pod uid>.sock`) together can exceed."""
    path = pathlib.Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(autouse=True)
def _structlog_defaults() -> Iterator[None]:
    """structlog's defaults again after every test: a test that runs a process's `run()` configures logging for the
    whole interpreter, and the next test must not write in its format or to its stream."""
    yield
    structlog.reset_defaults()
