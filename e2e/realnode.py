"""A real Kubernetes node on this machine: containerd 2.1 + runc + kubelet 1.36, joined to a test control plane.

What it does: runs containerd and the kubelet as ../shared/k8s/REAL-NODE.md says, each workaround
there being a failure seen on these machines: both inside one private mount namespace (held by a
`sleep` started with `unshare --mount --propagation private`; the daemons join it with `nsenter -m`)
where `/run` is a tmpfs, `/var/lib` and `/var/log` are directories of the node's own, and the
`/proc/sys` files the kubelet writes at start are bind-mounted stand-ins, so the host's sysctls
never change; the CRI with CDI on, `restrict_oom_score_adj`, a no-op CNI plugin (pods get an
isolated network namespace with only `lo`), the pause image as sandbox image; the kubelet on
cgroup v1 with the cgroupfs driver under a cgroup root of its own in every hierarchy, serving on
free 127.0.0.1 ports with anonymous auth, its DRA feature gates. The kubelet refuses a loopback
`--node-ip` and would otherwise publish this machine's interface address, so it runs with
`--cloud-provider external` (it then sets no address itself) and the Node's address is patched to
InternalIP 127.0.0.1, which `kubectl logs` then reaches. Images come as OCI archives
(e2e/node_images.py, dractl's own image) imported with `ctr`. The kubelet can be restarted; other
processes (a node agent on the host) can be started inside the namespace.

What it must not do: change the host. Nothing outlives `stop()`: the containers (every PID in the
node's cgroups) and the shims and daemons (every PID in its mount namespace) are killed by PID, the
namespace and so all its mounts go with its last process, the cgroup root is removed in every
hierarchy, the directory is deleted. It never binds outside 127.0.0.1 and creates no network
interface, route or iptables rule. When a binary or the namespaces are not available, `start`
raises `Unavailable` with one line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence

import controlplane
import node_images

from dractl.kube import client

# The host files the kubelet writes at start (setupKernelTunables) and the values it writes there;
# each is a stand-in inside the node's namespace. Host sysctls the suite checks stay unchanged.
KUBELET_SYSCTLS = {
    "vm/overcommit_memory": "1",
    "vm/panic_on_oom": "0",
    "kernel/panic": "10",
    "kernel/panic_on_oops": "1",
    "kernel/keys/root_maxkeys": "1000000",
    "kernel/keys/root_maxbytes": "25000000",
}
CONTAINERD_SOCKET = "/run/containerd/containerd.sock"
UNINITIALIZED_TAINT = "node.cloudprovider.kubernetes.io/uninitialized"
READY_DEADLINE = 120.0
# The node agent's paths (the chart's hostPath mounts) as they are inside the node's namespace.
KUBELET_DIR = pathlib.PurePosixPath("/var/lib/kubelet")
CDI_DIR = pathlib.PurePosixPath("/var/run/cdi")

_NOOP_CNI = """#!/bin/sh
# A CNI plugin that configures nothing: containerd brings up the pod's own loopback
# (use_internal_loopback) and the pod reports 127.0.0.1. No interface, route or rule is made.
cat >/dev/null
case "$CNI_COMMAND" in
ADD) printf '{"cniVersion":"1.0.0","interfaces":[],"ips":[{"address":"127.0.0.1/8"}],"dns":{}}' ;;
VERSION) printf '{"cniVersion":"1.0.0","supportedVersions":["0.4.0","1.0.0","1.1.0"]}' ;;
esac
exit 0
"""


class Unavailable(Exception):
    """A real node cannot start on this machine; str() is one line saying why."""


def host_sysctls() -> dict[str, str]:
    """The host's current values of the sysctls a kubelet would write, plus the two containerd sets in pods."""
    names = [*KUBELET_SYSCTLS, "net/ipv4/ip_unprivileged_port_start", "net/ipv4/ping_group_range"]
    values = {}
    for name in names:
        with contextlib.suppress(OSError):
            values[name] = pathlib.Path("/proc/sys", name).read_text().strip()
    return values


def _cgroup_hierarchies() -> list[pathlib.Path]:
    """The mount points of the cgroup v1 hierarchies (cpu, memory, ..., name=systemd)."""
    found = []
    for line in pathlib.Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) > 2 and fields[2] == "cgroup":
            found.append(pathlib.Path(fields[1]))
    return found


def _mount_namespace(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/mnt")


def _pids_in_namespace(namespace: str) -> list[int]:
    """Every process whose mount namespace is `namespace` (a readlink of /proc/<pid>/ns/mnt)."""
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(entry / "ns" / "mnt") == namespace:
                    found.append(int(entry.name))
    return found


def _pids_in_cgroups(roots: Sequence[pathlib.Path]) -> set[int]:
    pids: set[int] = set()
    for root in roots:
        for procs in root.rglob("cgroup.procs") if root.is_dir() else ():
            with contextlib.suppress(OSError):
                pids.update(int(pid) for pid in procs.read_text().split())
    return pids


def _kill(pids: Sequence[int] | set[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, killed and waiting for its parent to reap it, does not count)."""
    try:
        state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _describe(pid: int) -> str:
    """`<pid> (<state>) <command line>` for a failure message."""
    try:
        state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        command = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (OSError, IndexError):
        return f"{pid} (gone)"
    return f"{pid} ({state}) {command.strip()[:120]}"


def _wait_gone(pids: Sequence[int] | set[int], *, timeout: float) -> list[int]:
    """The PIDs still alive after `timeout` s."""
    deadline = time.monotonic() + timeout
    left = [pid for pid in pids if alive(pid)]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [pid for pid in left if alive(pid)]
    return left


@dataclasses.dataclass(slots=True)
class RealNode:
    """One real node: its directory, namespace holder, containerd and kubelet processes and cgroup root.

    `start` returns a Ready node; `stop` removes every trace of it. Not thread-safe.
    """

    name: str
    directory: pathlib.Path
    binaries: pathlib.Path
    cgroup_root: str
    kubelet_port: int
    healthz_port: int
    api: client.Client
    holder: controlplane.Process | None = None
    containerd: controlplane.Process | None = None
    kubelet: controlplane.Process | None = None
    namespace: str = ""
    started: list[controlplane.Process] = dataclasses.field(default_factory=list)
    startup_seconds: float = 0.0

    # --- Start -------------------------------------------------------------------------

    @classmethod
    def start(
        cls,
        plane: controlplane.ControlPlane,
        *,
        name: str,
        api: client.Client,
        preload: Sequence[node_images.Image] = (),
        labels: Mapping[str, str] | None = None,
    ) -> RealNode:
        """Start containerd and the kubelet for Node `name`, import `preload`, wait until the Node is Ready with
        address 127.0.0.1 and `labels`. Raises `Unavailable` (one line) or `controlplane.StartFailed`."""
        if os.geteuid() != 0:
            raise Unavailable("a real node needs root (mount namespaces, cgroups, containerd)")
        for tool in ("unshare", "nsenter", "mount"):
            if shutil.which(tool) is None:
                raise Unavailable(f"a real node needs {tool} (util-linux)")
        if not _cgroup_hierarchies():
            raise Unavailable("a real node needs cgroup v1 hierarchies under /sys/fs/cgroup (none mounted)")
        try:
            binaries = controlplane.find_binaries(controlplane.NODE)
        except controlplane.Unavailable as missing:
            raise Unavailable(f"no kubelet/containerd/runc: {missing}") from None
        began = time.monotonic()
        kubelet_port, healthz_port = controlplane.free_ports(2)
        node = cls(
            name=name,
            directory=pathlib.Path(tempfile.mkdtemp(prefix=f"dractl-node-{name}-")),
            binaries=binaries,
            cgroup_root=f"/dractl-e2e-{uuid.uuid4().hex[:10]}",
            kubelet_port=kubelet_port,
            healthz_port=healthz_port,
            api=api,
        )
        try:
            node._prepare(plane)
            node._enter_namespace()
            node.containerd = node._spawn(
                "containerd", [str(binaries / "containerd"), "--config", str(node.directory / "containerd.toml")]
            )
            controlplane.wait_until(
                node._containerd_answers, what=f"containerd of node {name} answers on {CONTAINERD_SOCKET}", timeout=60
            )
            for image in preload:
                node.import_image(image)
            node.start_kubelet()
            node.wait_ready(labels=labels or {})
            node.startup_seconds = time.monotonic() - began
            return node
        except BaseException:
            node.stop()
            raise

    def _prepare(self, plane: controlplane.ControlPlane) -> None:
        """Write the node's directories, configs, CNI plugin, kubelet identity, and create its cgroup root."""
        d = self.directory
        for sub in ("var-lib/kubelet", "var-lib/containerd", "var-log", "cni/bin", "cni/net.d", "sysctl", "opt"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        for sysctl in KUBELET_SYSCTLS:
            source = pathlib.Path("/proc/sys", sysctl)
            (d / "sysctl" / sysctl.replace("/", ".")).write_text(source.read_text() if source.exists() else "0\n")
        plugin = d / "cni" / "bin" / "dractl-noop"
        plugin.write_text(_NOOP_CNI)
        plugin.chmod(0o755)
        (d / "cni" / "net.d" / "10-dractl-noop.conflist").write_text(
            json.dumps({"cniVersion": "1.0.0", "name": "dractl-noop", "plugins": [{"type": "dractl-noop"}]})
        )
        (d / "resolv.conf").write_text("nameserver 127.0.0.1\n")
        (d / "containerd.toml").write_text(self._containerd_config())
        cert, key = plane.ca.issue(f"kubelet-{self.name}", subject=f"/O=system:nodes/CN=system:node:{self.name}")
        controlplane.write_kubeconfig(d / "kubelet.kubeconfig", server=plane.url, ca=plane.ca.cert, cert=cert, key=key)
        (d / "kubelet.yaml").write_text(json.dumps(self._kubelet_config(), indent=2))
        for hierarchy in _cgroup_hierarchies():
            group = hierarchy / self.cgroup_root.lstrip("/")
            group.mkdir(exist_ok=True)
            if (hierarchy / "cpuset.cpus").exists():
                for name in ("cpuset.cpus", "cpuset.mems"):
                    (group / name).write_text((hierarchy / name).read_text())

    def _containerd_config(self) -> str:
        d = self.directory
        cdi = json.dumps(str(CDI_DIR))
        return f"""version = 3
root = "/var/lib/containerd"
state = "/run/containerd"

[grpc]
  address = "{CONTAINERD_SOCKET}"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{node_images.PAUSE}"

[plugins."io.containerd.cri.v1.runtime"]
  enable_cdi = true
  cdi_spec_dirs = [{cdi}]
  restrict_oom_score_adj = true
  enable_unprivileged_ports = false
  enable_unprivileged_icmp = false
  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
    BinaryName = "{self.binaries / "runc"}"
    SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{d / "cni" / "bin"}"]
    conf_dir = "{d / "cni" / "net.d"}"
    use_internal_loopback = true

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

# Both default to directories under /opt on the host: the node's own instead.
[plugins."io.containerd.internal.v1.opt"]
  path = "{d / "opt"}"
[plugins."io.containerd.image-verifier.v1.bindir"]
  bin_dir = "{d / "opt" / "image-verifier"}"
"""

    def _kubelet_config(self) -> dict[str, object]:
        gates = dict(gate.split("=") for gate in controlplane.FEATURE_GATES.split(","))
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": self.cgroup_root,
            "oomScoreAdj": 0,
            "address": "127.0.0.1",
            "port": self.kubelet_port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": self.healthz_port,
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "containerRuntimeEndpoint": f"unix://{CONTAINERD_SOCKET}",
            "failSwapOn": False,
            "resolvConf": str(self.directory / "resolv.conf"),
            # No eviction and no image garbage collection: the disk is shared with other work.
            "evictionHard": {"memory.available": "0%", "nodefs.available": "0%", "imagefs.available": "0%"},
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "featureGates": {name: value == "true" for name, value in gates.items()},
            "syncFrequency": "10s",
            "fileCheckFrequency": "10s",
            "shutdownGracePeriod": "0s",
            "serializeImagePulls": False,
        }

    def _enter_namespace(self) -> None:
        """Start the namespace holder: a `sleep` in a new private mount namespace with the node's mounts."""
        d = self.directory
        steps = [
            "set -e",
            # Shared within this namespace only (unshare made every mount a private copy): a pod's
            # HostToContainer mount (the node agent's /dev) needs a shared or slave source.
            "mount --make-rshared /",
            "mount -t tmpfs -o mode=755 dractl-run /run",
            f"mkdir -p /run/containerd {CDI_DIR}",
            f"mount --bind {shlex.quote(str(d / 'var-lib'))} /var/lib",
            f"mount --bind {shlex.quote(str(d / 'var-log'))} /var/log",
        ]
        for sysctl in KUBELET_SYSCTLS:
            standin = shlex.quote(str(d / "sysctl" / sysctl.replace("/", ".")))
            steps.append(f"mount --bind {standin} /proc/sys/{sysctl}")
        steps += [f"touch {shlex.quote(str(d / 'namespace-ready'))}", "exec sleep infinity"]
        self.holder = controlplane.start_process(
            "namespace",
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", "\n".join(steps)],
            directory=d,
        )
        holder = self.holder

        def ready() -> bool:
            if holder.popen.poll() is not None:
                raise Unavailable(f"cannot make the node's mount namespace: {holder.tail(3)!r}")
            return (d / "namespace-ready").exists()

        controlplane.wait_until(ready, what=f"the mount namespace of node {self.name} is set up", timeout=30)
        self.namespace = _mount_namespace(holder.popen.pid)
        if self.namespace == _mount_namespace(os.getpid()):
            raise Unavailable("unshare --mount left the node in the host's mount namespace")

    def _spawn(self, name: str, argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> controlplane.Process:
        """Start `argv` inside the node's mount namespace (nsenter execs it: the PID is the program's)."""
        assert self.holder is not None, "the namespace holder runs"
        environment = {
            **(env if env is not None else os.environ),
            "PATH": f"{self.binaries}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}",
        }
        process = controlplane.start_process(
            name,
            ["nsenter", "--target", str(self.holder.popen.pid), "--mount", "--", *argv],
            directory=self.directory,
            env=environment,
        )
        self.started.append(process)
        return process

    def run(self, argv: Sequence[str], *, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run a command inside the node's mount namespace and wait for it; never raises on its exit code."""
        assert self.holder is not None, "the namespace holder runs"
        return subprocess.run(
            ["nsenter", "--target", str(self.holder.popen.pid), "--mount", "--", *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env={**os.environ, "PATH": f"{self.binaries}:{os.environ.get('PATH', '/usr/bin:/bin')}"},
        )

    def spawn(self, name: str, argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> controlplane.Process:
        """A process of the test's (a node agent on the host) inside the node's namespace; stopped by `stop()`."""
        return self._spawn(name, argv, env=env)

    def ctr(self, *args: str, timeout: float = 300) -> str:
        """`ctr -n k8s.io <args>` against this node's containerd; its stdout. Raises StartFailed on failure."""
        done = self.run(["ctr", "--address", CONTAINERD_SOCKET, "-n", "k8s.io", *args], timeout=timeout)
        if done.returncode != 0:
            raise controlplane.StartFailed(f"ctr {' '.join(args)} on node {self.name}: {done.stderr.strip()[-500:]}")
        return done.stdout

    def _containerd_answers(self) -> bool:
        if self.containerd is not None and self.containerd.popen.poll() is not None:
            raise controlplane.StartFailed(f"containerd of node {self.name} exited:\n{self.containerd.tail()}")
        return self.run(["ctr", "--address", CONTAINERD_SOCKET, "version"], timeout=30).returncode == 0

    def import_image(self, image: node_images.Image) -> None:
        """Import an OCI archive into containerd's k8s.io namespace (unpacked for the overlayfs snapshotter)."""
        self.ctr("images", "import", "--no-unpack=false", str(image.archive))
        listed = self.ctr("images", "list", "--quiet")
        if image.name not in listed.split():
            raise controlplane.StartFailed(f"{image.archive} imported on node {self.name} but {image.name} is absent")

    def images(self) -> list[str]:
        """The image names containerd holds in the k8s.io namespace."""
        return self.ctr("images", "list", "--quiet").split()

    # --- The kubelet -------------------------------------------------------------------

    def start_kubelet(self) -> None:
        """Start (or start again) the kubelet; returns at once (`wait_ready` waits)."""
        d = self.directory
        self.kubelet = self._spawn(
            "kubelet",
            [
                str(self.binaries / "kubelet"),
                "--config",
                str(d / "kubelet.yaml"),
                "--kubeconfig",
                str(d / "kubelet.kubeconfig"),
                "--hostname-override",
                self.name,
                # With an external cloud provider the kubelet sets no address of its own (it would pick
                # this machine's interface address) and keeps the one `wait_ready` patches in.
                "--cloud-provider",
                "external",
                "--v",
                "2",
            ],
        )

    def stop_kubelet(self) -> None:
        """Stop the kubelet process (SIGTERM, then SIGKILL after 10 s); containers keep running."""
        if self.kubelet is not None:
            self.kubelet.stop()

    def restart_kubelet(self) -> None:
        """Stop the kubelet and start it again; the caller waits for what it expects to come back."""
        self.stop_kubelet()
        self.start_kubelet()

    def wait_ready(self, *, labels: Mapping[str, str] | None = None, timeout: float = READY_DEADLINE) -> None:
        """Wait until the Node exists, patch its address to 127.0.0.1 (and `labels`), and wait until it is Ready."""
        kubelet = self.kubelet
        assert kubelet is not None, "the kubelet was started"

        def registered() -> bool:
            if kubelet.popen.poll() is not None:
                raise controlplane.StartFailed(f"the kubelet of node {self.name} exited:\n{kubelet.tail(40)}")
            try:
                self.api.get(client.NODES, self.name)
            except client.NotFound:
                return False
            return True

        controlplane.wait_until(registered, what=f"the kubelet registers Node {self.name}", timeout=timeout)
        address = {"status": {"addresses": [{"type": "InternalIP", "address": "127.0.0.1"}]}}
        self.api.patch(client.NODES, self.name, address, subresource="status")
        # No cloud controller manager runs: take off the taint it would remove once it knows the node.
        node = self.api.get(client.NODES, self.name)
        taints = [t for t in (node.get("spec") or {}).get("taints") or () if t.get("key") != UNINITIALIZED_TAINT]
        metadata: dict[str, object] = {"labels": dict(labels)} if labels else {}
        self.api.patch(client.NODES, self.name, {"metadata": metadata, "spec": {"taints": taints}})

        def ready() -> bool:
            if kubelet.popen.poll() is not None:
                raise controlplane.StartFailed(f"the kubelet of node {self.name} exited:\n{kubelet.tail(40)}")
            node = self.api.get(client.NODES, self.name)
            conditions = {c.get("type"): c.get("status") for c in (node.get("status") or {}).get("conditions") or ()}
            return conditions.get("Ready") == "True"

        controlplane.wait_until(ready, what=f"Node {self.name} is Ready", timeout=timeout)

    # --- Paths as the node sees them ---------------------------------------------------

    def host_path(self, path: str | pathlib.PurePosixPath) -> pathlib.Path:
        """Where a path inside the node's namespace (`/var/lib/...`, `/var/log/...`) lies on the host.

        `/run` is a tmpfs only the namespace sees: use `run` to read there.
        """
        inside = pathlib.PurePosixPath(path)
        for mounted, local in (("/var/lib", "var-lib"), ("/var/log", "var-log")):
            if inside.is_relative_to(mounted):
                return self.directory / local / inside.relative_to(mounted)
        raise ValueError(f"{path} is not under a directory the node keeps on the host (/var/lib, /var/log)")

    def cdi_files(self) -> list[str]:
        """The file names in the node's CDI directory (`/var/run/cdi`, on the namespace's tmpfs)."""
        done = self.run(["ls", "-1", str(CDI_DIR)], timeout=30)
        if done.returncode != 0:
            raise controlplane.StartFailed(f"cannot list {CDI_DIR} on node {self.name}: {done.stderr.strip()}")
        return sorted(done.stdout.split())

    def exists(self, path: str | pathlib.PurePosixPath) -> bool:
        """Whether a path exists as the node's namespace sees it."""
        return self.run(["test", "-e", str(path)], timeout=30).returncode == 0

    def read(self, path: str | pathlib.PurePosixPath) -> str:
        """A file's text as the node's namespace sees it."""
        done = self.run(["cat", str(path)], timeout=30)
        if done.returncode != 0:
            raise FileNotFoundError(f"{path} on node {self.name}: {done.stderr.strip()}")
        return done.stdout

    # --- Stop --------------------------------------------------------------------------

    def processes(self) -> set[int]:
        """Every PID of this node: in its mount namespace (daemons, shims) or in its cgroups (containers)."""
        pids = set(_pids_in_namespace(self.namespace)) if self.namespace else set()
        return pids | _pids_in_cgroups(self.cgroups)

    @property
    def cgroups(self) -> list[pathlib.Path]:
        """The node's cgroup root in every hierarchy."""
        return [hierarchy / self.cgroup_root.lstrip("/") for hierarchy in _cgroup_hierarchies()]

    def stop(self) -> None:
        """Remove every trace of the node: kubelet, containers, shims, containerd, namespace, cgroups, directory.

        Idempotent. Raises RuntimeError naming what could not be removed (after trying everything else).
        """
        problems: list[str] = []
        if self.kubelet is not None:
            self.kubelet.stop()
        # Containers first (their shims then see them exit), then whatever runs in the namespace.
        _kill(_pids_in_cgroups(self.cgroups))
        for process in reversed(self.started):
            controlplane.stop_process(process.popen, grace=5.0)
        holder = self.holder.popen.pid if self.holder is not None else None
        for _ in range(3):
            found = (self.processes() - {holder}) if self.namespace else _pids_in_cgroups(self.cgroups)
            # A zombie is dead already; its parent (or init, once the parent is gone) reaps it.
            left = {pid for pid in found if alive(pid) and pid != os.getpid()}
            if not left:
                break
            _kill(left)
            _wait_gone(left, timeout=10.0)
        else:
            problems.append(f"processes still running: {', '.join(_describe(pid) for pid in sorted(left))}")
        if self.holder is not None:
            self.holder.stop()  # The namespace, and every mount in it, ends with its last process.
        self.started.clear()
        for group in self.cgroups:
            if group.is_dir():
                for path in sorted(group.rglob("*"), key=lambda p: len(p.parts), reverse=True):
                    if path.is_dir():
                        with contextlib.suppress(OSError):
                            path.rmdir()
                try:
                    group.rmdir()
                except OSError as error:
                    problems.append(f"cgroup {group}: {error}")
        shutil.rmtree(self.directory, ignore_errors=True)
        if problems:
            raise RuntimeError(f"node {self.name} left behind: {'; '.join(problems)}")

    def logs(self, lines: int = 60) -> str:
        """The tails of the logs of every process started on the node (daemons, agents), for a failure report."""
        # A restarted kubelet appends to its predecessor's log: show each log once.
        by_log = {process.log: process for process in self.started}
        return "\n".join(f"--- {p.name} of node {self.name}:\n{p.tail(lines)}" for p in by_log.values())


@contextlib.contextmanager
def running(
    plane: controlplane.ControlPlane,
    *,
    name: str,
    api: client.Client,
    preload: Sequence[node_images.Image] = (),
    labels: Mapping[str, str] | None = None,
) -> Iterator[RealNode]:
    """`with running(plane, name=..., api=...) as node:` a Ready real node, removed on exit."""
    node = RealNode.start(plane, name=name, api=api, preload=preload, labels=labels)
    try:
        yield node
    finally:
        node.stop()
