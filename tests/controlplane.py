"""A real Kubernetes control plane for tests: etcd, kube-apiserver, optionally controller manager and scheduler.

What it does: finds the binaries the way controller-runtime's envtest does (`$KUBEBUILDER_ASSETS`,
else the xz archives in `../shared/k8s/` or `$DRACTL_K8S_ARCHIVES`, unpacked once into a cache
directory after checking their sha256), generates certificates with the openssl CLI, starts the
processes on free 127.0.0.1 ports, waits for `/readyz` with a bounded deadline and writes a
kubeconfig. Processes are remembered by PID and stopped exactly; temp dirs are removed.

What it must not do: download anything, bind to anything but 127.0.0.1, or stop processes it did
not start. When the binaries cannot be found, `find_binaries` raises `Unavailable` whose message
is one line saying how to get them (the fixtures turn it into a skip).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import http.client
import json
import lzma
import os
import pathlib
import random
import re
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TypeVar

K8S_VERSION = "1.36.2"
ROOT = pathlib.Path(__file__).resolve().parent.parent
DEFAULT_ARCHIVES = ROOT.parent / "shared" / "k8s"
REQUIRED = ("etcd", "kube-apiserver")
OPTIONAL = ("kube-controller-manager", "kube-scheduler")
# A real node (../shared/k8s/REAL-NODE.md): the kubelet, containerd with its runc shim and CLI, and runc.
NODE = ("kubelet", "containerd", "containerd-shim-runc-v2", "ctr", "runc")

# The pins of ../shared/k8s/README.md and REAL-NODE.md, used when the archive directory has no README to read them from.
_PINNED_SHA256 = {
    "kube-apiserver": "a3adacf3d5a9ec1e83974a9c86c4e59dfef72e06004ca7161854d6fe003a41e4",
    "kube-controller-manager": "b2484ca1f7933aea42903a3ffe15cdb9fd4a483d6a054246c95a1c138b739289",
    "kube-scheduler": "f0800a6fe8df0e0c005fcd72c130f35980abbebb95d97e4b688a50c8c7b51d89",
    "etcd": "c395ce223b4cc8a85642fcf3b4935903966a52826ca1a0f317d5978dfb8951ca",
    "kubelet": "1c5f01e8a992d2ff1cf1a7728bb88830a857a2505806382a8ba9eb9a47434438",
    "containerd": "589a73d2025ea6f04f3a592d3e5c1db9f3be0600cedf45d313de9dc6a7c845a0",
    "containerd-shim-runc-v2": "ae68c02eed01aac748467a9fbb3018e4437d3ae5a4fe68aec22c17681e9dee31",
    "ctr": "a5fd6c32aa24bbcd132d1b8f6e40c4156837a058723e2fffb5c282c5d0a35d1c",
    "runc": "9a87d5bcdd630ec420ec56a6c21b70aa6960edcefe1cf4bb181cee290bdd6b98",
}

_GATES = (
    "DRAAdminAccess",
    "DRAConsumableCapacity",
    "DRADeviceBindingConditions",
    "DRADeviceTaints",
    "DRADeviceTaintRules",
    "DRAExtendedResource",
    "DRAPartitionableDevices",
    "DRAPrioritizedList",
    "DRAResourceClaimDeviceStatus",
    # Gang scheduling and topology-aware workload scheduling (alpha in 1.36): the PodGroup API
    # (scheduling.k8s.io/v1alpha2), its topology and gang cycles in kube-scheduler, and claims of a PodGroup.
    "GenericWorkload",
    "GangScheduling",
    "TopologyAwareWorkloadScheduling",
    "DRAWorkloadResourceClaims",
)
_APIS = ("resource.k8s.io/v1", "resource.k8s.io/v1beta2", "scheduling.k8s.io/v1alpha2")
# What a server emulating an older Kubernetes (`--emulated-version`) is not given: gates it does not know (it
# refuses to start with such a gate named at all, on or off), APIs it does not serve, and the workload gates a
# cluster of that version had off (1.35's, on without their v1alpha1 API, leave the server's informers unsynced).
_NEWER = {
    (1, 36): (
        "GenericWorkload",
        "GangScheduling",
        "TopologyAwareWorkloadScheduling",
        "DRAWorkloadResourceClaims",
        "scheduling.k8s.io/v1alpha2",
    )
}


def _known(names: Sequence[str], emulated: tuple[int, ...] | None) -> list[str]:
    """`names` without those newer than the emulated version (all of them without one). Pure."""
    newer = {name for since, added in _NEWER.items() if emulated is not None and emulated < since for name in added}
    return [name for name in names if name not in newer]


def feature_gates(emulated: tuple[int, ...] | None = None) -> str:
    """The `--feature-gates` value: every gate the tests need on, that the (emulated) version knows."""
    return ",".join(f"{gate}=true" for gate in _known(_GATES, emulated))


def runtime_config(emulated: tuple[int, ...] | None = None) -> str:
    """The `--runtime-config` value: every API version the tests need served, that the (emulated) version knows."""
    return ",".join(f"{api}=true" for api in _known(_APIS, emulated))


def _emulated(apiserver_args: Sequence[str]) -> tuple[int, ...] | None:
    """The version of `--emulated-version=X.Y` among the arguments, if any. Pure."""
    for arg in apiserver_args:
        if arg.startswith("--emulated-version="):
            return tuple(int(part) for part in arg.split("=", 1)[1].split("."))
    return None


FEATURE_GATES = feature_gates()
RUNTIME_CONFIG = runtime_config()
HOW_TO_GET = (
    "needs kube-apiserver and etcd: set KUBEBUILDER_ASSETS to a directory holding them, "
    "or DRACTL_K8S_ARCHIVES to a directory of *.xz archives (see DEVELOPERS.md)"
)
READY_DEADLINE = 60.0

_T = TypeVar("_T")
# A generator of its own, seeded by the OS: a test that seeds `random` must not make ports repeat.
_PORT_CHOICE = random.SystemRandom()


class Unavailable(Exception):
    """The control plane binaries cannot be found; str() is one line saying how to get them."""


class StartFailed(Exception):
    """A process did not come up; the message holds the tail of its stderr."""


# --- Binaries ------------------------------------------------------------------------------


def cache_dir() -> pathlib.Path:
    """`$XDG_CACHE_HOME/dractl/k8s-<version>`, else `~/.cache/dractl/k8s-<version>`."""
    base = os.environ.get("XDG_CACHE_HOME") or str(pathlib.Path.home() / ".cache")
    return pathlib.Path(base) / "dractl" / f"k8s-{K8S_VERSION}"


def archive_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("DRACTL_K8S_ARCHIVES") or DEFAULT_ARCHIVES)


def pinned_sha256(archives: pathlib.Path) -> dict[str, str]:
    """The sha256 of each unpacked binary, from the tables of README.md and REAL-NODE.md beside the archives (else
    the built-in pins). A row names one or more `<name>.xz` in its first cell and as many sha256s in its third."""
    tables = [archives / name for name in ("README.md", "REAL-NODE.md") if (archives / name).is_file()]
    if not tables:
        return dict(_PINNED_SHA256)
    pins = {}
    for table in tables:
        for line in table.read_text().splitlines():
            cells = line.split("|")
            if not line.startswith("|") or len(cells) < 5:
                continue
            names = re.findall(r"`([a-z0-9-]+)\.xz`", cells[1])
            digests = re.findall(r"\b[0-9a-f]{64}\b", cells[3])
            if names and len(names) == len(digests):
                pins.update(zip(names, digests, strict=True))
    return pins


def _unpack(archive: pathlib.Path, target: pathlib.Path, sha256: str | None) -> None:
    """Unpack `archive` to `target` atomically: write a temp name in the same directory, check, rename.

    Two processes racing both write complete, identical files and the last rename wins, so a
    reader never sees a partial binary.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    temp = target.with_name(f".{target.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}")
    digest = hashlib.sha256()
    try:
        with lzma.open(archive) as source, open(temp, "wb") as sink:
            while chunk := source.read(1 << 20):
                digest.update(chunk)
                sink.write(chunk)
        if sha256 is not None and digest.hexdigest() != sha256:
            raise Unavailable(
                f"{archive}: sha256 {digest.hexdigest()} does not match the pinned {sha256}; fetch the archive again"
            )
        temp.chmod(0o755)
        os.replace(temp, target)
    finally:
        temp.unlink(missing_ok=True)


def find_binaries(names: tuple[str, ...] = REQUIRED) -> pathlib.Path:
    """A directory holding every binary in `names`. Raises `Unavailable` (one line) when there is none.

    Order: `$KUBEBUILDER_ASSETS`, then the cache directory, filled from the archives when needed.
    Idempotent; safe when several test processes call it at once.
    """
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if assets:
        directory = pathlib.Path(assets)
        missing = [name for name in names if not (directory / name).is_file()]
        if not missing:
            return directory
        if not any((archive_dir() / f"{name}.xz").is_file() for name in missing):
            raise Unavailable(f"KUBEBUILDER_ASSETS={assets} lacks {', '.join(missing)}; {HOW_TO_GET}")
    cache = cache_dir()
    archives = archive_dir()
    pins: dict[str, str] | None = None
    for name in names:
        if (cache / name).is_file():
            continue
        archive = archives / f"{name}.xz"
        if not archive.is_file():
            raise Unavailable(f"{name} not in {cache} nor {archives}; {HOW_TO_GET}")
        if pins is None:
            pins = pinned_sha256(archives)
        _unpack(archive, cache / name, pins.get(name))
    return cache


# --- Certificates and ports ----------------------------------------------------------------


def _ephemeral_ports() -> tuple[int, int]:
    """The kernel's range of local ports for outgoing connections (Linux's default when it cannot be read)."""
    try:
        low, high = pathlib.Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_ports(count: int) -> list[int]:
    """`count` different TCP ports on 127.0.0.1 that were free a moment ago, chosen at random below the ephemeral
    range. Raises StartFailed when there is no room below it or no free port is found.

    Not ones the kernel picks (bind to port 0): those come from the ephemeral range, where every
    outgoing connection of the test session (clients, the fault proxy, the API server's own) also
    takes its local port, so one of them could hold a port by the time the child process binds it.
    Each chosen port stays bound until all are chosen, so none is chosen twice.
    """
    low, _ = _ephemeral_ports()
    first = max(1024, low - 16384)
    if first >= low:
        raise StartFailed(f"the ephemeral port range starts at {low}: no unprivileged port below it to choose")
    with contextlib.ExitStack() as held:
        ports: list[int] = []
        for _ in range(100 * count):
            port = _PORT_CHOICE.randrange(first, low)
            sock = held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue  # In use (or in TIME_WAIT, or chosen already): try another.
            ports.append(port)
            if len(ports) == count:
                return ports
    raise StartFailed(f"no {count} free ports on 127.0.0.1 below {low} after {100 * count} tries")


def _openssl(*args: str, cwd: pathlib.Path) -> None:
    completed = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=30, check=False)
    if completed.returncode != 0:
        raise StartFailed(f"openssl {' '.join(args)}: {completed.stderr.strip()}")


def _certificate(name: str, *, subject: str, cwd: pathlib.Path, issuer: Sequence[str] = ()) -> None:
    """`<name>.key` (a new P-256 key) and `<name>.crt` in `cwd`, valid 2 days: self-signed, or as `issuer` (more
    `openssl req` arguments: the CA to sign with, extensions) says."""
    _openssl(
        "req",
        "-x509",
        *("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"),
        *("-keyout", f"{name}.key", "-out", f"{name}.crt", "-days", "2", "-subj", subject),
        *issuer,
        cwd=cwd,
    )


@dataclasses.dataclass(frozen=True, slots=True)
class CertificateAuthority:
    """A throwaway CA in `directory` (`ca.crt`, `ca.key`) that issues serving and client certificates."""

    directory: pathlib.Path

    @property
    def cert(self) -> pathlib.Path:
        return self.directory / "ca.crt"

    @classmethod
    def create(cls, directory: pathlib.Path) -> CertificateAuthority:
        _certificate("ca", subject="/CN=dractl-test-ca", cwd=directory)
        return cls(directory)

    def issue(self, name: str, *, subject: str, server: bool = False) -> tuple[pathlib.Path, pathlib.Path]:
        """A key and certificate `<name>.crt`/`.key` signed by this CA; `server` adds 127.0.0.1/localhost SANs."""
        extensions = ["-addext", "basicConstraints=critical,CA:FALSE"]
        if server:
            extensions += [
                "-addext",
                "subjectAltName=IP:127.0.0.1,DNS:localhost",
                "-addext",
                "extendedKeyUsage=serverAuth",
            ]
        else:
            extensions += ["-addext", "extendedKeyUsage=clientAuth"]
        _certificate(
            name, subject=subject, cwd=self.directory, issuer=("-CA", "ca.crt", "-CAkey", "ca.key", *extensions)
        )
        return self.directory / f"{name}.crt", self.directory / f"{name}.key"


def write_kubeconfig(
    path: pathlib.Path,
    *,
    server: str,
    ca: pathlib.Path | None = None,
    cert: pathlib.Path | None = None,
    key: pathlib.Path | None = None,
    token: str = "",
) -> pathlib.Path:
    """A kubeconfig with one cluster, user and context (`test`): the server's CA, the user's client certificate and
    key by path, or its bearer `token` (none of them: an anonymous user, e.g. of a closed port). JSON is valid
    YAML."""
    cluster: dict[str, str] = {"server": server}
    if ca is not None:
        cluster["certificate-authority"] = str(ca)
    user: dict[str, str] = {}
    if cert is not None and key is not None:
        user = {"client-certificate": str(cert), "client-key": str(key)}
    if token:
        user["token"] = token
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "test",
        "clusters": [{"name": "test", "cluster": cluster}],
        "users": [{"name": "test", "user": user}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
    }
    path.write_text(json.dumps(config, indent=2))
    return path


def unreachable_kubeconfig(path: pathlib.Path) -> pathlib.Path:
    """A kubeconfig naming a local port nothing listens on: a client builds from it, and every connection it makes
    is refused."""
    return write_kubeconfig(path, server=f"http://127.0.0.1:{free_ports(1)[0]}")


# --- Processes -----------------------------------------------------------------------------


@dataclasses.dataclass(slots=True)
class Process:
    """One started binary: its Popen (hence PID) and the file its stderr goes to."""

    name: str
    popen: subprocess.Popen[bytes]
    log: pathlib.Path

    def tail(self, lines: int = 25) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """Stop exactly this PID: SIGTERM, then SIGKILL after 10 s. Idempotent."""
        stop_process(self.popen, grace=10.0)


def stop_process(popen: subprocess.Popen[bytes], *, grace: float) -> None:
    """Stop exactly this child and reap it: SIGTERM, then SIGKILL after `grace` seconds.

    Idempotent, and safe when the child has exited on its own meanwhile: `Popen` signals the PID
    only while it has not reaped it, so a recycled PID is never hit.
    """
    if popen.poll() is not None:
        return
    popen.terminate()
    try:
        popen.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        popen.kill()
        popen.wait(timeout=grace)


def start_process(
    name: str, args: Sequence[str], *, directory: pathlib.Path, env: Mapping[str, str] | None = None
) -> Process:
    """Start `args` in `directory` with stdout and stderr in `<directory>/<name>.log` (appended to, so a restarted
    process keeps its predecessor's log); `env` replaces the environment when given. Stop it with `Process.stop()`."""
    log = directory / f"{name}.log"
    with open(log, "ab") as sink:
        popen = subprocess.Popen(
            list(args),
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            cwd=directory,
            env=None if env is None else dict(env),
        )
    return Process(name, popen, log)


def _wait_healthy(process: Process, *, port: int, path: str, context: ssl.SSLContext | None, deadline: float) -> None:
    """Poll `path` until it answers 200, the process exits, or `deadline` (monotonic) passes."""
    last = ""
    while time.monotonic() < deadline:
        if process.popen.poll() is not None:
            raise StartFailed(f"{process.name} exited with {process.popen.returncode}:\n{process.tail()}")
        connection: http.client.HTTPConnection
        if context is None:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        else:
            connection = http.client.HTTPSConnection("127.0.0.1", port, timeout=2, context=context)
        try:
            connection.request("GET", path)
            response = connection.getresponse()
            body = response.read().decode(errors="replace")
            if response.status == 200:
                return
            last = f"{response.status} {body[-300:]}"
        except (OSError, http.client.HTTPException) as error:
            last = str(error)
        finally:
            connection.close()
        time.sleep(0.1)
    raise StartFailed(f"{process.name} not healthy on {path} within the deadline ({last}):\n{process.tail()}")


@dataclasses.dataclass(slots=True)
class ControlPlane:
    """etcd + kube-apiserver on 127.0.0.1, with an admin kubeconfig (client cert in `system:masters`).

    `start` returns a running plane; `stop` stops exactly its processes and removes its directory.
    """

    directory: pathlib.Path
    binaries: pathlib.Path
    ca: CertificateAuthority
    port: int
    kubeconfig: pathlib.Path
    processes: list[Process] = dataclasses.field(default_factory=list)
    startup_seconds: float = 0.0

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @classmethod
    def start(cls, *, authorization: str = "AlwaysAllow", apiserver_args: Sequence[str] = ()) -> ControlPlane:
        """Start etcd and kube-apiserver and wait for `/readyz`. Raises `Unavailable` or `StartFailed`.

        `authorization` is `AlwaysAllow` or `RBAC` (or `Node,RBAC`); `apiserver_args` are added last.
        """
        binaries = find_binaries(REQUIRED)
        began = time.monotonic()
        directory = pathlib.Path(tempfile.mkdtemp(prefix="dractl-k8s-"))
        plane: ControlPlane | None = None
        try:
            ca = CertificateAuthority.create(directory)
            serving_cert, serving_key = ca.issue("apiserver", subject="/CN=kube-apiserver", server=True)
            admin_cert, admin_key = ca.issue("admin", subject="/O=system:masters/CN=dractl-test-admin")
            _openssl(
                "genpkey",
                "-algorithm",
                "EC",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-out",
                "sa.key",
                cwd=directory,
            )
            _openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=directory)
            port, etcd_client, etcd_peer = free_ports(3)
            plane = cls(
                directory=directory,
                binaries=binaries,
                ca=ca,
                port=port,
                kubeconfig=write_kubeconfig(
                    directory / "admin.kubeconfig",
                    server=f"https://127.0.0.1:{port}",
                    ca=ca.cert,
                    cert=admin_cert,
                    key=admin_key,
                ),
            )
            etcd = start_process(
                "etcd",
                [
                    str(binaries / "etcd"),
                    "--data-dir",
                    str(directory / "etcd"),
                    "--name",
                    "default",
                    "--listen-client-urls",
                    f"http://127.0.0.1:{etcd_client}",
                    "--advertise-client-urls",
                    f"http://127.0.0.1:{etcd_client}",
                    "--listen-peer-urls",
                    f"http://127.0.0.1:{etcd_peer}",
                    "--initial-advertise-peer-urls",
                    f"http://127.0.0.1:{etcd_peer}",
                    "--initial-cluster",
                    f"default=http://127.0.0.1:{etcd_peer}",
                    "--unsafe-no-fsync",
                    "--log-level",
                    "warn",
                ],
                directory=directory,
            )
            plane.processes.append(etcd)
            deadline = time.monotonic() + READY_DEADLINE
            _wait_healthy(etcd, port=etcd_client, path="/health", context=None, deadline=deadline)
            apiserver = start_process(
                "kube-apiserver",
                [
                    str(binaries / "kube-apiserver"),
                    "--etcd-servers",
                    f"http://127.0.0.1:{etcd_client}",
                    "--bind-address",
                    "127.0.0.1",
                    "--secure-port",
                    str(port),
                    "--cert-dir",
                    str(directory),
                    "--tls-cert-file",
                    str(serving_cert),
                    "--tls-private-key-file",
                    str(serving_key),
                    "--client-ca-file",
                    str(ca.cert),
                    "--service-account-issuer",
                    "https://kubernetes.default.svc.cluster.local",
                    "--service-account-key-file",
                    str(directory / "sa.pub"),
                    "--service-account-signing-key-file",
                    str(directory / "sa.key"),
                    "--service-cluster-ip-range",
                    "10.0.0.0/24",
                    "--authorization-mode",
                    authorization,
                    "--endpoint-reconciler-type",
                    "none",
                    "--runtime-config",
                    runtime_config(_emulated(apiserver_args)),
                    "--feature-gates",
                    feature_gates(_emulated(apiserver_args)),
                    "--disable-admission-plugins",
                    "TaintNodesByCondition",
                    *apiserver_args,
                ],
                directory=directory,
            )
            plane.processes.append(apiserver)
            _wait_healthy(apiserver, port=port, path="/readyz", context=plane.ssl_context(), deadline=deadline)
            plane.startup_seconds = time.monotonic() - began
            return plane
        except BaseException:
            if plane is not None:
                plane.stop()
            else:
                shutil.rmtree(directory, ignore_errors=True)
            raise

    def ssl_context(self) -> ssl.SSLContext:
        """A client TLS context trusting the test CA and presenting the admin certificate."""
        context = ssl.create_default_context(cafile=str(self.ca.cert))
        context.load_cert_chain(str(self.directory / "admin.crt"), str(self.directory / "admin.key"))
        return context

    def stop(self) -> None:
        """Stop this plane's processes (last started first) and remove its directory. Idempotent."""
        for process in reversed(self.processes):
            process.stop()
        self.processes.clear()
        shutil.rmtree(self.directory, ignore_errors=True)

    def start_components(
        self, *, resource_claim_controller: bool = True, api_qps: int = 0, only_controllers: Sequence[str] = ()
    ) -> Components:
        """Start kube-controller-manager and kube-scheduler against this plane; wait until both are healthy.

        Each has its own identity (`system:kube-controller-manager`, `system:kube-scheduler`), the
        DRA feature gates, `--leader-elect=false`; the node lifecycle controller is off since no
        kubelet runs, and the resourceclaim controller too without `resource_claim_controller` (as in
        a cluster where dractl's claim controller makes the claims). `api_qps` > 0 raises both
        clients' limits (`--kube-api-qps`, burst twice that) from their defaults (20 and 50 QPS).
        `only_controllers` runs just those kube-controller-manager controllers (e.g. to tell what one
        of them does from what the garbage collector does). Stop them with `Components.stop()`.
        """
        binaries = find_binaries(OPTIONAL)
        controllers = ",".join(only_controllers) or "*,-node-lifecycle-controller" + (
            "" if resource_claim_controller else ",-resource-claim-controller"
        )
        limits = ["--kube-api-qps", str(api_qps), "--kube-api-burst", str(2 * api_qps)] if api_qps > 0 else []
        components = Components()
        try:
            deadline = time.monotonic() + READY_DEADLINE
            kcm_cert, kcm_key = self.ca.issue("kcm", subject="/CN=system:kube-controller-manager")
            kcm_config = write_kubeconfig(
                self.directory / "kcm.kubeconfig", server=self.url, ca=self.ca.cert, cert=kcm_cert, key=kcm_key
            )
            kcm_port, scheduler_port = free_ports(2)
            kcm = start_process(
                "kube-controller-manager",
                [
                    str(binaries / "kube-controller-manager"),
                    "--kubeconfig",
                    str(kcm_config),
                    "--authentication-kubeconfig",
                    str(kcm_config),
                    "--authorization-kubeconfig",
                    str(kcm_config),
                    "--bind-address",
                    "127.0.0.1",
                    "--secure-port",
                    str(kcm_port),
                    "--leader-elect=false",
                    "--controllers",
                    controllers,
                    *limits,
                    "--use-service-account-credentials",
                    "--service-account-private-key-file",
                    str(self.directory / "sa.key"),
                    "--root-ca-file",
                    str(self.ca.cert),
                    "--feature-gates",
                    FEATURE_GATES,
                    "--cert-dir",
                    str(self.directory / "kcm-certs"),
                ],
                directory=self.directory,
            )
            components.processes.append(kcm)
            scheduler_cert, scheduler_key = self.ca.issue("scheduler", subject="/CN=system:kube-scheduler")
            scheduler_config = write_kubeconfig(
                self.directory / "scheduler.kubeconfig",
                server=self.url,
                ca=self.ca.cert,
                cert=scheduler_cert,
                key=scheduler_key,
            )
            scheduler = start_process(
                "kube-scheduler",
                [
                    str(binaries / "kube-scheduler"),
                    "--kubeconfig",
                    str(scheduler_config),
                    "--authentication-kubeconfig",
                    str(scheduler_config),
                    "--authorization-kubeconfig",
                    str(scheduler_config),
                    "--bind-address",
                    "127.0.0.1",
                    "--secure-port",
                    str(scheduler_port),
                    "--leader-elect=false",
                    *limits,
                    "--feature-gates",
                    FEATURE_GATES,
                    "--cert-dir",
                    str(self.directory / "scheduler-certs"),
                ],
                directory=self.directory,
            )
            components.processes.append(scheduler)
            insecure = ssl.create_default_context()
            insecure.check_hostname = False
            insecure.verify_mode = ssl.CERT_NONE  # their serving certs are self-signed; only /healthz is read
            _wait_healthy(kcm, port=kcm_port, path="/healthz", context=insecure, deadline=deadline)
            _wait_healthy(scheduler, port=scheduler_port, path="/healthz", context=insecure, deadline=deadline)
        except BaseException:
            components.stop()
            raise
        return components


@dataclasses.dataclass(slots=True)
class Components:
    """kube-controller-manager and kube-scheduler started by `ControlPlane.start_components`."""

    processes: list[Process] = dataclasses.field(default_factory=list)

    def stop(self) -> None:
        """Stop exactly these processes. Idempotent."""
        for process in reversed(self.processes):
            process.stop()
        self.processes.clear()


@contextlib.contextmanager
def running(*, authorization: str = "AlwaysAllow", apiserver_args: Sequence[str] = ()) -> Iterator[ControlPlane]:
    """`with running() as plane:` a control plane stopped on exit."""
    plane = ControlPlane.start(authorization=authorization, apiserver_args=apiserver_args)
    try:
        yield plane
    finally:
        plane.stop()


def wait_until(predicate: Callable[[], _T], *, what: str, timeout: float = 60.0, interval: float = 0.05) -> _T:
    """Poll `predicate` until it returns something truthy, and return that; fail naming `what` after `timeout` s.

    A bounded wait, not a sleep-and-hope: it ends as soon as the condition holds. `what` is a
    clause ("the pod is bound"); the failure reads "timed out after 60s waiting until <what>".
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting until {what}")
        time.sleep(interval)
