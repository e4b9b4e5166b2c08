"""The test control plane: binaries found as envtest finds them, unpacked safely, processes stopped exactly."""

from __future__ import annotations

import hashlib
import lzma
import pathlib
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import uuid

import controlplane
import pytest
from support import kube_objects

from dractl.kube import client

pytestmark = pytest.mark.timeout(180)


def _archives(directory: pathlib.Path, contents: dict[str, bytes], *, pins: dict[str, str] | None = None) -> None:
    """xz archives of fake binaries plus a README table of their sha256, like ../shared/k8s/."""
    directory.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, data in contents.items():
        (directory / f"{name}.xz").write_bytes(lzma.compress(data))
        sha = (pins or {}).get(name) or hashlib.sha256(data).hexdigest()
        rows.append(f"| `{name}.xz` | test | {sha} |")
    (directory / "README.md").write_text("| file | version | sha256 |\n|---|---|---|\n" + "\n".join(rows) + "\n")


@pytest.fixture
def isolated(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    """No KUBEBUILDER_ASSETS, an empty cache and an archive directory of our own under tmp_path."""
    monkeypatch.delenv("KUBEBUILDER_ASSETS", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("DRACTL_K8S_ARCHIVES", str(tmp_path / "archives"))
    return tmp_path


def test_kubebuilder_assets_come_first(isolated: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Guards: a KUBEBUILDER_ASSETS directory holding kube-apiserver and etcd is used as it is."""
    assets = isolated / "assets"
    assets.mkdir()
    for name in controlplane.REQUIRED:
        (assets / name).write_bytes(b"#!/bin/true\n")
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(assets))
    assert controlplane.find_binaries() == assets


def test_archives_are_unpacked_once_into_the_cache_after_their_sha256_is_checked(isolated: pathlib.Path) -> None:
    """Guards: archives are unpacked into $XDG_CACHE_HOME/dractl/k8s-<version>, executable, no temp files left."""
    contents = {"etcd": b"etcd binary", "kube-apiserver": b"apiserver binary"}
    _archives(isolated / "archives", contents)
    found = controlplane.find_binaries()
    assert found == isolated / "cache" / "dractl" / f"k8s-{controlplane.K8S_VERSION}"
    assert {p.name: p.read_bytes() for p in found.iterdir()} == contents
    assert all(p.stat().st_mode & 0o111 for p in found.iterdir())
    (isolated / "archives" / "etcd.xz").unlink()  # a second call needs no archive: the cache is used
    assert controlplane.find_binaries() == found


def test_a_wrong_sha256_is_refused_and_leaves_nothing_behind(isolated: pathlib.Path) -> None:
    """Guards: an archive whose content does not match the README's sha256 is not used, and no partial file remains."""
    _archives(isolated / "archives", {"etcd": b"tampered", "kube-apiserver": b"ok"}, pins={"etcd": "0" * 64})
    with pytest.raises(controlplane.Unavailable, match="etcd.xz: sha256 .* does not match"):
        controlplane.find_binaries()
    cache = isolated / "cache" / "dractl" / f"k8s-{controlplane.K8S_VERSION}"
    assert not (cache / "etcd").exists()
    assert [p.name for p in cache.iterdir() if p.name.startswith(".")] == []


def test_racing_unpacks_both_succeed_with_complete_files(isolated: pathlib.Path) -> None:
    """Guards: two test processes unpacking at once both end with the complete binaries (temp name, then rename)."""
    contents = {"etcd": b"e" * 3_000_000, "kube-apiserver": b"a" * 3_000_000}
    _archives(isolated / "archives", contents)
    barrier = threading.Barrier(4)
    found: list[pathlib.Path] = []

    def race() -> None:
        barrier.wait()
        found.append(controlplane.find_binaries())

    threads = [threading.Thread(target=race) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(found) == 4 and len(set(found)) == 1
    assert {p.name: p.read_bytes() for p in found[0].iterdir()} == contents


def test_without_binaries_the_reason_is_one_line_saying_how_to_get_them(isolated: pathlib.Path) -> None:
    """Guards: nothing found gives Unavailable with a single line naming KUBEBUILDER_ASSETS and DRACTL_K8S_ARCHIVES."""
    with pytest.raises(controlplane.Unavailable) as raised:
        controlplane.find_binaries()
    message = str(raised.value)
    assert "\n" not in message
    assert "KUBEBUILDER_ASSETS" in message and "DRACTL_K8S_ARCHIVES" in message


def test_pins_come_from_both_tables_beside_the_archives(tmp_path: pathlib.Path) -> None:
    """Guards: README.md rows and REAL-NODE.md rows naming several archives in one cell (containerd, its shim and
    ctr) all give their sha256 pins, in order; a row whose names and digests do not pair up gives none."""
    (tmp_path / "README.md").write_text("| `etcd.xz` | etcd | " + "a" * 64 + " |\n")
    (tmp_path / "REAL-NODE.md").write_text(
        "| file | what | sha256 |\n|---|---|---|\n"
        f"| `containerd.xz`, `ctr.xz` | containerd 2.1.9 | {'b' * 64}, {'c' * 64} |\n"
        f"| `runc.xz`, `kubelet.xz` | two names, one digest | {'d' * 64} |\n"
    )
    assert controlplane.pinned_sha256(tmp_path) == {"etcd": "a" * 64, "containerd": "b" * 64, "ctr": "c" * 64}


@pytest.fixture
def isolated_tmp(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    """TMPDIR pointed at an empty directory, to see what a start leaves behind."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def _binaries_or_skip() -> None:
    try:
        controlplane.find_binaries()
    except controlplane.Unavailable as missing:
        pytest.skip(str(missing))


def test_stop_ends_exactly_its_processes_and_removes_its_directory() -> None:
    """Guards: a started plane answers through its kubeconfig; stop() ends its own PIDs and removes its dir."""
    _binaries_or_skip()
    plane = controlplane.ControlPlane.start()
    print(f"control plane ready in {plane.startup_seconds:.1f}s")
    processes = list(plane.processes)
    try:
        assert [p.name for p in processes] == ["etcd", "kube-apiserver"]
        api = client.connect(plane.kubeconfig)
        try:
            assert api.list(client.NAMESPACES).items
        finally:
            api.close()
    finally:
        plane.stop()
    assert all(p.popen.poll() is not None for p in processes)
    assert not plane.directory.exists()
    plane.stop()  # idempotent


def test_free_ports_lie_below_the_ephemeral_range_differ_and_are_free() -> None:
    """Guards: the ports given to etcd, the API server and the components come from below the kernel's range for
    outgoing connections (where any connection of the session could take one before the process binds it), are
    all different, and can be bound."""
    low, _ = controlplane._ephemeral_ports()
    ports = controlplane.free_ports(20)
    assert all(1024 <= port < low for port in ports), ports
    assert len(set(ports)) == len(ports), ports
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))


def test_free_ports_fail_clearly_when_no_port_lies_below_the_ephemeral_range(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Guards: an ephemeral range starting at or below 1024 leaves nothing to choose from: StartFailed says so (not
    random.randrange's ValueError about an empty range)."""
    monkeypatch.setattr(controlplane, "_ephemeral_ports", lambda: (1024, 65535))
    with pytest.raises(controlplane.StartFailed, match="ephemeral port range starts at 1024"):
        controlplane.free_ports(1)


def test_a_stopped_process_is_reaped_and_stopping_it_again_does_nothing() -> None:
    """Guards: stop_process ends a running child with SIGTERM and reaps it; on a child already stopped or exited
    it does nothing (no signal to a PID that may have been reused)."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    controlplane.stop_process(sleeper, grace=10.0)
    assert sleeper.returncode == -signal.SIGTERM
    controlplane.stop_process(sleeper, grace=10.0)
    quick = subprocess.Popen([sys.executable, "-c", "pass"])
    quick.wait(timeout=30)
    controlplane.stop_process(quick, grace=10.0)
    assert quick.returncode == 0


def test_a_failed_start_shows_the_process_output(isolated_tmp: pathlib.Path) -> None:
    """Guards: when kube-apiserver refuses to start, the failure shows its output and the temp dir is removed."""
    _binaries_or_skip()
    before = set(isolated_tmp.iterdir())
    with pytest.raises(controlplane.StartFailed, match="no-such-flag-for-dractl-tests"):
        controlplane.ControlPlane.start(apiserver_args=["--no-such-flag-for-dractl-tests"])
    assert set(isolated_tmp.iterdir()) == before


def test_the_controller_manager_and_scheduler_run_beside_the_api_server(
    control_plane: controlplane.ControlPlane, kube_client: client.Client
) -> None:
    """Guards: start_components runs kube-controller-manager (makes ServiceAccounts) and kube-scheduler (binds)."""
    components = control_plane.start_components()
    processes = list(components.processes)
    try:
        assert [p.name for p in processes] == ["kube-controller-manager", "kube-scheduler"]
        namespace = f"t-{uuid.uuid4().hex[:10]}"
        kube_client.create(client.NAMESPACES, {"metadata": {"name": namespace}})

        def has_default_service_account() -> bool:
            try:
                kube_client.get(kube_objects.SERVICE_ACCOUNTS, "default", namespace=namespace)
            except client.NotFound:
                return False
            return True

        controlplane.wait_until(
            has_default_service_account, what="the controller manager created ServiceAccount default"
        )
        node = f"node-{uuid.uuid4().hex[:8]}"
        kube_client.create(client.NODES, {"metadata": {"name": node}})
        kube_objects.make_ready(kube_client, node)
        kube_client.create(
            client.PODS,
            {
                "metadata": {"name": "p", "namespace": namespace},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]},
            },
        )
        controlplane.wait_until(
            lambda: kube_client.get(client.PODS, "p", namespace=namespace)["spec"].get("nodeName") == node,
            what="the scheduler bound the pod to the node",
            timeout=60,
        )
    finally:
        components.stop()
    assert all(p.popen.poll() is not None for p in processes)
