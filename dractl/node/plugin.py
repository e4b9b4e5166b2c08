"""The kubelet-facing gRPC side of the node agent: registration, DRA v1/v1beta1, health stream.

What it does: serves the kubelet's plugin APIs over two unix sockets. The DRA socket
(`<plugins-dir>/<driver>/dra.sock`) carries `k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin`, its
`v1beta1` twin and, when a health source is given, the `v1` and `v1alpha1` DRAResourceHealth
stream. The registration socket (`<registrar-dir>/<driver>-reg.sock`) carries
`pluginregistration.Registration`, advertising type DRAPlugin, the driver name, the DRA socket
and exactly the services served. With a pod UID (rolling updates, as upstream's kubeletplugin
helper names them) the sockets are `<driver>-<podUID>-reg.sock` and `dra-<podUID>.sock`, so two
agents serve side by side and the kubelet sends its calls to the newest registration. The DRA
socket is up before the registration socket appears. A socket left at our path by an earlier
run (it refuses connections) is removed before binding; one that answers belongs to a running
agent, and starting is refused with one line instead of taking it over. Both sockets are removed
on stop, each only if it is still the socket this plugin bound (a second agent may have bound
its own at the path after ours was removed). `probe()` is the liveness check: one gRPC call over each socket.

Calls for one claim are serialized here, per claim rather than per plugin as the upstream
kubeletplugin helper's `Serialize` option does: before handling the first claim of a prepare
or unprepare request, the handler takes the lock of every claim UID in the request (in sorted
UID order, so two requests never deadlock) and releases them after the last. An unprepare of
a claim therefore never runs while a prepare of a request naming it is still working on an
earlier claim or reading it, and what that prepare makes is undone. With a claim lock file
(the agent's `<state-dir>/claims.lock`) each claim's lock is also a byte-range lock in that file
(an open file description lock, which a dying process releases), so the same holds between two
agents of a rolling update. Requests sharing no claim run concurrently, so one pod's slow claim
read does not hold up another pod's prepare, and an empty request (the liveness probe) takes no
lock. A lock still busy after `claim_lock_timeout_s` (a claim read can hang for minutes) answers
every claim of the waiting request with an error naming the busy claim, so kubelet retries
cannot pile up on the gRPC workers. Each claim's outcome is logged: a failure as a warning with
the claim and the reason, a success at info with the devices prepared.

What it must not do: any other work of its own. Handlers only translate protobuf <-> `state`
values and call the injected `Preparer` once per claim, the claims of one request one after
another, turning `state.PrepareError` (and anything unexpected) into that claim's `error`
string so every claim of a request gets exactly one entry. It is the only module besides
`dractl._proto` that imports grpc; it does not talk to the Kubernetes API or NVML.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import errno
import fcntl
import hashlib
import os
import pathlib
import re
import secrets
import socket
import stat
import struct
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from types import ModuleType
from typing import Any, Protocol

import grpc
import structlog

from dractl._proto import (
    dra_v1_pb2,
    dra_v1beta1_pb2,
    health_v1_pb2,
    health_v1alpha1_pb2,
    pluginregistration_pb2,
)
from dractl.node import health, state

_log = structlog.get_logger(__name__)

PLUGIN_TYPE = "DRAPlugin"
DRA_SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
HEALTH_SERVICES = ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")

# AF_UNIX paths are limited to 108 bytes including the terminating NUL on Linux.
_MAX_SOCKET_PATH = 107
# The kubelet marks a device Unknown 30 s after its last report; re-send well within that.
DEFAULT_HEALTH_RESEND_S = 10.0
_HEALTH_MESSAGE_LIMIT = 1024
# How long a call waits for another call of one of its claims before answering "still running":
# below the kubelet's 45 s call timeout, so the answer reaches it, and short enough that retries
# behind a hanging claim read (up to 5 attempts of 30 s) do not hold every gRPC worker.
CLAIM_LOCK_TIMEOUT_S = 30.0
# A pod UID becomes part of socket file names.
_POD_UID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*\Z")
# struct flock on Linux (x86_64 and arm64): l_type, l_whence, l_start, l_len, l_pid, padding to 32 bytes.
_FLOCK = "@hhqqi4x"
# The longest a busy claim's file lock is polled between two attempts.
_FILE_LOCK_POLL_S = 0.02


class PluginError(Exception):
    """The plugin cannot start: a socket path is unusable. str() names the path and the flag."""


class Preparer(Protocol):
    """What the handlers call per claim: `state.State` in production, a fake in tests.

    Thread-safe for different claims: concurrent requests call it from several gRPC threads at
    once. Calls for one claim UID never overlap: the plugin holds the claim's lock around them.
    `prepare` is idempotent and raises `state.PrepareError` with the message for the kubelet;
    `unprepare` succeeds for unknown claims.
    """

    def prepare(self, claim: state.ClaimRef) -> tuple[state.PreparedDevice, ...]: ...

    def unprepare(self, claim: state.ClaimRef) -> None: ...


class HealthSource(Protocol):
    """The device health list the stream sends: `health.Monitor` in production."""

    def wait_report(self, *, after: int, timeout_s: float) -> tuple[int, tuple[health.DeviceHealth, ...]]: ...


@dataclasses.dataclass(frozen=True, slots=True)
class Call:
    """One handled NodePrepare/NodeUnprepare call, for metrics: `api` is "v1" or "v1beta1"."""

    operation: str  # "prepare" | "unprepare"
    api: str
    claims: int
    errors: int
    seconds: float


@dataclasses.dataclass(frozen=True, slots=True)
class RegistrationStatus:
    """The kubelet's last NotifyRegistrationStatus; `registered` is None before the first one."""

    registered: bool | None = None
    error: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class Sockets:
    """The two socket paths; `dra` is also what GetInfo sends as the endpoint."""

    registration: pathlib.Path
    dra: pathlib.Path


@dataclasses.dataclass(slots=True)
class _ClaimLock:
    """The lock of one claim UID and how many calls hold it or wait for it."""

    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    users: int = 0


class _ClaimLocks:
    """One lock per claim UID. An entry lives while a call holds or waits for it, so the map holds
    only the claims being worked on. With `lock_file`, each held UID is also locked in that file for
    other processes (`_file_lock`). Thread-safe."""

    def __init__(self, lock_file: pathlib.Path | None = None) -> None:
        self._guard = threading.Lock()
        self._entries: dict[str, _ClaimLock] = {}
        self._lock_file = lock_file

    @contextlib.contextmanager
    def held(self, uids: Collection[str], *, timeout_s: float) -> Iterator[str | None]:
        """Take the lock of each distinct UID in sorted order (so two calls, in one process or two, never
        deadlock), waiting at most `timeout_s` in all, and hold them until the block ends. Yields None when
        all are held; otherwise the UID whose lock stayed busy, with none held."""
        held: list[tuple[str, _ClaimLock]] = []
        busy: str | None = None
        deadline = time.monotonic() + timeout_s
        # One open file per call: its byte-range locks are its own, apart from every other call's, and
        # closing it releases them all.
        fd = os.open(self._lock_file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600) if self._lock_file else None
        try:
            for uid in sorted(set(uids)):
                entry = self._join(uid)
                if not entry.lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
                    self._leave(uid)
                    busy = uid
                    break
                held.append((uid, entry))
                if fd is not None and not _file_lock(fd, uid, deadline=deadline):
                    busy = uid
                    break
            if busy is not None:
                self._release(held)
                held = []
            yield busy
        finally:
            if fd is not None:
                os.close(fd)
            self._release(held)

    def _join(self, uid: str) -> _ClaimLock:
        with self._guard:
            entry = self._entries.setdefault(uid, _ClaimLock())
            entry.users += 1
            return entry

    def _leave(self, uid: str) -> None:
        with self._guard:
            entry = self._entries[uid]
            entry.users -= 1
            if not entry.users:
                del self._entries[uid]

    def _release(self, held: Sequence[tuple[str, _ClaimLock]]) -> None:
        for uid, entry in reversed(held):
            entry.lock.release()
            self._leave(uid)


def _file_lock(fd: int, uid: str, *, deadline: float) -> bool:
    """Lock the byte of `uid` in the open lock file `fd` (an open file description lock: it belongs to this
    open file, so two calls exclude each other even within one process), polling until `deadline`; return
    whether it is held. Two UIDs may share a byte (a hash of the UID), which only serializes them."""
    offset = int.from_bytes(hashlib.sha256(uid.encode()).digest()[:7], "big")
    request = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, offset, 1, 0)
    pause = 0.001
    while True:
        try:
            fcntl.fcntl(fd, fcntl.F_OFD_SETLK, request)
            return True
        except OSError as err:
            if err.errno not in (errno.EAGAIN, errno.EACCES):
                raise
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(pause, left))
        pause = min(pause * 2, _FILE_LOCK_POLL_S)


def socket_paths(
    *, driver_name: str, registrar_dir: pathlib.Path, plugins_dir: pathlib.Path, pod_uid: str = ""
) -> Sockets:
    """`<registrar_dir>/<driver>-reg.sock` and `<plugins_dir>/<driver>/dra.sock`, absolute; with a pod UID
    `<driver>-<podUID>-reg.sock` and `dra-<podUID>.sock` (upstream's rolling-update names).

    Pure. Raises PluginError when the pod UID cannot be part of a file name or a path would exceed
    the AF_UNIX limit (108 bytes).
    """
    if pod_uid and not _POD_UID.match(pod_uid):
        raise PluginError(f"--pod-uid {pod_uid!r} must be letters, digits, '.', '_' and '-' (the pod's metadata.uid)")
    infix = f"-{pod_uid}" if pod_uid else ""
    sockets = Sockets(
        registration=registrar_dir.absolute() / f"{driver_name}{infix}-reg.sock",
        dra=plugins_dir.absolute() / driver_name / (f"dra-{pod_uid}.sock" if pod_uid else "dra.sock"),
    )
    for path, flag in ((sockets.registration, "--kubelet-registrar-dir"), (sockets.dra, "--kubelet-plugins-dir")):
        if len(os.fsencode(path)) > _MAX_SOCKET_PATH:
            raise PluginError(f"socket path {path} is longer than {_MAX_SOCKET_PATH} bytes: shorten {flag}")
    return sockets


def _identity(path: pathlib.Path) -> tuple[int, int]:
    """The (device, inode) of the file at `path`: which socket it is, whatever its name."""
    found = path.lstat()
    return found.st_dev, found.st_ino


def _unlink_own_socket(path: pathlib.Path, identity: tuple[int, int]) -> None:
    """Remove the socket at `path` only if it is the one we bound (`identity`): after ours was removed, a second
    agent may have bound its own there, and that one is not ours to remove."""
    try:
        found = path.lstat()
    except FileNotFoundError:
        return
    if stat.S_ISSOCK(found.st_mode) and (found.st_dev, found.st_ino) == identity:
        path.unlink(missing_ok=True)


def _answers(path: pathlib.Path) -> bool:
    """Whether a process accepts connections on the unix socket at `path` (a full backlog counts as one)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe_socket:
        probe_socket.settimeout(1.0)
        try:
            probe_socket.connect(str(path))
        except (ConnectionRefusedError, FileNotFoundError):
            return False
        except TimeoutError:
            return True
        return True


def _stale(path: pathlib.Path, flag: str) -> bool:
    """Whether a socket an earlier run left is at `path` (False when nothing is). Raises PluginError
    when something else is there: not a socket, or a socket a running agent serves."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return False
    if not stat.S_ISSOCK(mode):
        raise PluginError(f"{path} exists and is not a socket: remove it or change {flag}")
    if _answers(path):
        raise PluginError(
            f"another node agent is serving {path}: stop it first, or give each agent its own sockets with "
            "--pod-uid (rolling updates)"
        )
    return True


def check_sockets(sockets: Sockets) -> None:
    """Raise PluginError (one line naming the path) unless both socket paths are free or hold only
    sockets nobody serves. Changes nothing; `Plugin.start` checks again when it binds."""
    _stale(sockets.dra, "--kubelet-plugins-dir")
    _stale(sockets.registration, "--kubelet-registrar-dir")


def _remove_stale(path: pathlib.Path, flag: str) -> None:
    """Remove a socket left at our own path by an earlier run; refuse to touch anything else."""
    if _stale(path, flag):
        path.unlink(missing_ok=True)
        _log.info("plugin: removed stale socket", path=str(path))


class Plugin:
    """Both gRPC servers of one driver on one node.

    Invariants: `start()` binds the DRA socket, waits until it exists, then binds the
    registration socket; `stop()` removes the registration socket first (the kubelet then
    deregisters the plugin) and the DRA socket last; each is idempotent. The claims of a prepare
    or unprepare request are handled in request order, holding the lock of every claim UID in
    the request from before the first to after the last; requests with no claim in common run
    concurrently, and an empty one (the liveness probe) takes no lock, so it answers at once. A
    request that cannot take a lock within `claim_lock_timeout_s` answers each of its claims
    "another call for claim <ns>/<name> (uid <uid>) is still running; the kubelet retries",
    naming the busy claim, without calling the preparer. With `claim_lock_file` the claim locks
    also hold against the plugins of other processes that use the same file.
    """

    def __init__(
        self,
        *,
        driver_name: str,
        sockets: Sockets,
        preparer: Preparer,
        health_source: HealthSource | None = None,
        on_call: Callable[[Call], None] | None = None,
        health_resend_s: float = DEFAULT_HEALTH_RESEND_S,
        workers: int = 8,
        claim_lock_timeout_s: float = CLAIM_LOCK_TIMEOUT_S,
        claim_lock_file: pathlib.Path | None = None,
    ) -> None:
        self.driver_name = driver_name
        self.sockets = sockets
        self._preparer = preparer
        self._health = health_source
        self._on_call = on_call
        self._health_resend_s = health_resend_s
        self._workers = workers
        self._claim_lock_timeout_s = claim_lock_timeout_s
        self._claim_locks = _ClaimLocks(claim_lock_file)
        self._stopping = threading.Event()
        self._status = RegistrationStatus()
        self._dra_server: Any = None
        self._registration_server: Any = None
        self._bound: dict[pathlib.Path, tuple[int, int]] = {}  # (device, inode) of each socket we serve, by path

    @property
    def supported_versions(self) -> tuple[str, ...]:
        """What GetInfo advertises: the DRA services, plus the health services when served."""
        return DRA_SERVICES + (HEALTH_SERVICES if self._health is not None else ())

    @property
    def registration_status(self) -> RegistrationStatus:
        return self._status

    # --- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        """Serve the DRA socket, then the registration socket. Raises PluginError on a bad path."""
        self.sockets.dra.parent.mkdir(parents=True, exist_ok=True)
        self.sockets.registration.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale(self.sockets.dra, "--kubelet-plugins-dir")
        _remove_stale(self.sockets.registration, "--kubelet-registrar-dir")
        self._stopping.clear()
        self._dra_server = self._serve(self.sockets.dra, self._dra_handlers())
        # The kubelet calls GetInfo and connects to the endpoint as soon as the registration
        # socket appears, so the DRA socket must already accept connections by then.
        _wait_for_socket(self.sockets.dra)
        self._registration_server = self._serve(self.sockets.registration, [self._registration_handler()])
        _log.info(
            "plugin: serving",
            driver=self.driver_name,
            dra_socket=str(self.sockets.dra),
            registration_socket=str(self.sockets.registration),
            supported_versions=list(self.supported_versions),
        )

    def stop(self, *, grace_s: float = 2.0) -> None:
        """Stop both servers and remove both sockets. Idempotent."""
        self._stopping.set()
        for attr, path in (("_registration_server", self.sockets.registration), ("_dra_server", self.sockets.dra)):
            server = getattr(self, attr)
            if server is None:
                continue  # never bound: whatever is at the path is not ours to remove
            server.stop(grace_s).wait()
            setattr(self, attr, None)
            _unlink_own_socket(path, self._bound.pop(path))
        _log.info("plugin: stopped; sockets removed", driver=self.driver_name)

    def _serve(self, path: pathlib.Path, handlers: list[Any]) -> Any:
        """A started server whose socket is at `path`, remembered as ours by its inode.

        gRPC removes whatever sits at the path it bound when it stops, which must never be `path`: a second
        agent may have bound its own socket there since. So gRPC binds a private name in the same directory
        (a dot name, which the kubelet's plugin watcher ignores, no longer than `path`'s, so within the
        AF_UNIX limit) and the socket is renamed to `path`; the kubelet sees it appear at once, whole."""
        private = path.with_name(f".{secrets.token_hex(3)}s")
        server = grpc.server(
            concurrent.futures.ThreadPoolExecutor(max_workers=self._workers, thread_name_prefix="dractl-grpc")
        )
        server.add_generic_rpc_handlers(tuple(handlers))
        try:
            server.add_insecure_port(f"unix:{private}")
            server.start()
            os.rename(private, path)
            self._bound[path] = _identity(path)
        except (RuntimeError, OSError) as err:
            server.stop(0).wait()
            private.unlink(missing_ok=True)
            raise PluginError(f"cannot listen on {path}: {err}") from err
        return server

    # --- handlers ------------------------------------------------------------------------------

    def _registration_handler(self) -> Any:
        service = pluginregistration_pb2.DESCRIPTOR.services_by_name["Registration"].full_name
        return grpc.method_handlers_generic_handler(
            service,
            {
                "GetInfo": _unary(
                    self._get_info, pluginregistration_pb2.InfoRequest, pluginregistration_pb2.PluginInfo
                ),
                "NotifyRegistrationStatus": _unary(
                    self._notify_registration_status,
                    pluginregistration_pb2.RegistrationStatus,
                    pluginregistration_pb2.RegistrationStatusResponse,
                ),
            },
        )

    def _dra_handlers(self) -> list[Any]:
        handlers = []
        for api, pb2 in (("v1", dra_v1_pb2), ("v1beta1", dra_v1beta1_pb2)):
            handlers.append(
                grpc.method_handlers_generic_handler(
                    pb2.DESCRIPTOR.services_by_name["DRAPlugin"].full_name,
                    {
                        "NodePrepareResources": _unary(
                            _bind(self._prepare, pb2, api),
                            pb2.NodePrepareResourcesRequest,
                            pb2.NodePrepareResourcesResponse,
                        ),
                        "NodeUnprepareResources": _unary(
                            _bind(self._unprepare, pb2, api),
                            pb2.NodeUnprepareResourcesRequest,
                            pb2.NodeUnprepareResourcesResponse,
                        ),
                    },
                )
            )
        if self._health is not None:
            for hpb2 in (health_v1_pb2, health_v1alpha1_pb2):
                handlers.append(
                    grpc.method_handlers_generic_handler(
                        hpb2.DESCRIPTOR.services_by_name["DRAResourceHealth"].full_name,
                        {
                            "NodeWatchResources": grpc.unary_stream_rpc_method_handler(
                                _bind_stream(self._watch_resources, hpb2),
                                request_deserializer=hpb2.NodeWatchResourcesRequest.FromString,
                                response_serializer=hpb2.NodeWatchResourcesResponse.SerializeToString,
                            )
                        },
                    )
                )
        return handlers

    def _get_info(self, request: Any, context: Any) -> Any:
        return pluginregistration_pb2.PluginInfo(
            type=PLUGIN_TYPE,
            name=self.driver_name,
            endpoint=str(self.sockets.dra),
            supported_versions=list(self.supported_versions),
        )

    def _notify_registration_status(self, request: Any, context: Any) -> Any:
        self._status = RegistrationStatus(registered=bool(request.plugin_registered), error=str(request.error))
        if request.plugin_registered:
            _log.info("plugin: registered with the kubelet", driver=self.driver_name)
        else:
            # Not fatal: the kubelet retries registration from GetInfo, and the error says why.
            _log.error("plugin: the kubelet refused registration", driver=self.driver_name, error=request.error)
        return pluginregistration_pb2.RegistrationStatusResponse()

    def _prepare(self, request: Any, context: Any, pb2: ModuleType, api: str) -> Any:
        def prepare(claim: Any, entry: Any) -> Mapping[str, object]:
            del entry.devices[:]  # a claim listed twice answers from its last attempt only
            devices = self._preparer.prepare(_claim_ref(claim))
            for device in devices:
                entry.devices.append(_device_message(pb2, device, share_id=api == "v1"))
            return {"devices": [device.device for device in devices]}

        response = pb2.NodePrepareResourcesResponse()
        self._each_claim(request.claims, prepare, response=response, operation="prepare", api=api)
        return response

    def _unprepare(self, request: Any, context: Any, pb2: ModuleType, api: str) -> Any:
        def unprepare(claim: Any, entry: Any) -> Mapping[str, object]:
            self._preparer.unprepare(_claim_ref(claim))
            return {}

        response = pb2.NodeUnprepareResourcesResponse()
        self._each_claim(request.claims, unprepare, response=response, operation="unprepare", api=api)
        return response

    def _each_claim(
        self,
        claims: Sequence[Any],
        handle: Callable[[Any, Any], Mapping[str, object]],
        *,
        response: Any,
        operation: str,
        api: str,
    ) -> None:
        """Holding the lock of every claim UID in the request, call `handle(claim, entry)` for each
        claim in request order, `entry` being the claim's entry in `response`; set the entry's
        error from what it raised, or to "" when it did not, and log the outcome (a failure as a
        warning with the reason, a success at info with the fields `handle` returned). When a lock
        stays busy, set every entry's error to say so and call nothing. Records the call for
        metrics unless the request is empty (the liveness probe, which takes no lock)."""
        if not claims:
            return
        started = time.perf_counter()
        errors = 0
        with self._claim_locks.held([claim.uid for claim in claims], timeout_s=self._claim_lock_timeout_s) as busy:
            refused = None if busy is None else _busy_text(operation, next(c for c in claims if c.uid == busy))
            for claim in claims:
                entry = response.claims[claim.uid]
                if refused is not None:
                    entry.error = refused
                    errors += 1
                    continue
                who = {"claim": f"{claim.namespace}/{claim.name}", "uid": claim.uid}
                try:
                    done = handle(claim, entry)
                except Exception as err:  # noqa: BLE001 - every failure becomes this claim's error
                    entry.error = _error_text(operation, claim, err)
                    errors += 1
                    _log.warning(f"plugin: {operation} failed", **who, api=api, error=entry.error)
                else:
                    entry.error = ""
                    _log.info(f"plugin: {operation} done", **who, api=api, **done)
        self._record(Call(operation=operation, api=api, claims=len(claims), errors=errors, seconds=_since(started)))

    def _watch_resources(self, request: Any, context: Any, hpb2: ModuleType) -> Iterator[Any]:
        assert self._health is not None  # only registered when a source exists
        version = -1
        last_sent = 0.0
        # Each wait is short so a cancelled stream or a stopping server ends the generator
        # promptly; a report is sent on every change and re-sent every health_resend_s.
        while context.is_active() and not self._stopping.is_set():
            new_version, report = self._health.wait_report(after=version, timeout_s=0.5)
            now = time.monotonic()
            if new_version == version and now - last_sent < self._health_resend_s:
                continue
            version, last_sent = new_version, now
            yield _health_message(hpb2, report)

    def _record(self, call: Call) -> None:
        # Each claim's outcome is logged already; the call as a whole only for debugging.
        _log.debug(f"plugin: {call.operation} call handled", **dataclasses.asdict(call))
        if self._on_call is not None:
            try:
                self._on_call(call)
            except Exception:  # noqa: BLE001 - metrics must never fail a kubelet call
                _log.exception("plugin: call observer failed")


# --- translation (pure) ------------------------------------------------------------------------


def _claim_ref(claim: Any) -> state.ClaimRef:
    """The kubelet's Claim as a ClaimRef; a claim missing a field is a PrepareError naming it."""
    missing = [field for field in ("namespace", "name", "uid") if not getattr(claim, field)]
    if missing:
        raise state.PrepareError(
            f"ResourceClaim {claim.namespace or '?'}/{claim.name or '?'} (uid {claim.uid or '?'}): "
            f"the kubelet's request has no {', '.join(missing)}"
        )
    return state.ClaimRef(namespace=claim.namespace, name=claim.name, uid=claim.uid)


def _error_text(operation: str, claim: Any, err: Exception) -> str:
    if isinstance(err, state.PrepareError):
        return str(err)
    # A bug or an unexpected failure below: log it in full here, give the kubelet one line.
    _log.exception(
        f"plugin: unexpected error in {operation}", namespace=claim.namespace, name=claim.name, uid=claim.uid
    )
    who = f"ResourceClaim {claim.namespace}/{claim.name} (uid {claim.uid})"
    return f"{who}: {operation} failed: {type(err).__name__}: {err}"


def _busy_text(operation: str, claim: Any) -> str:
    """The error for each claim of a call that could not take `claim`'s lock in time."""
    _log.warning(
        f"plugin: {operation} refused: another call for a claim is still running",
        namespace=claim.namespace,
        name=claim.name,
        uid=claim.uid,
    )
    return (
        f"another call for claim {claim.namespace}/{claim.name} (uid {claim.uid}) is still running; the kubelet retries"
    )


def _device_message(pb2: ModuleType, device: state.PreparedDevice, *, share_id: bool) -> Any:
    message = pb2.Device(
        request_names=list(device.requests),
        pool_name=device.pool,
        device_name=device.device,
        cdi_device_ids=list(device.cdi_device_ids),
    )
    # v1beta1 has no share_id: its kubelet has no consumable capacity either.
    if share_id and device.share_id is not None:
        message.share_id = device.share_id
    return message


_HEALTH_CODES = {
    health.Status.UNKNOWN: "UNKNOWN",
    health.Status.HEALTHY: "HEALTHY",
    health.Status.UNHEALTHY: "UNHEALTHY",
}


def _health_message(hpb2: ModuleType, report: tuple[health.DeviceHealth, ...]) -> Any:
    response = hpb2.NodeWatchResourcesResponse()
    for line in report:
        message = line.message
        if len(message) > _HEALTH_MESSAGE_LIMIT:
            message = message[: _HEALTH_MESSAGE_LIMIT - 3] + "..."
        response.devices.append(
            hpb2.DeviceHealth(
                device=hpb2.DeviceIdentifier(pool_name=line.pool, device_name=line.device),
                health=hpb2.HealthStatus.Value(_HEALTH_CODES[line.status]),
                last_updated_time=line.last_updated,
                health_check_timeout_seconds=health.HEALTH_CHECK_TIMEOUT_S,
                message=message,
            )
        )
    return response


# --- plumbing ----------------------------------------------------------------------------------


def _unary(handler: Callable[[Any, Any], Any], request: Any, response: Any) -> Any:
    return grpc.unary_unary_rpc_method_handler(
        handler, request_deserializer=request.FromString, response_serializer=response.SerializeToString
    )


def _bind(method: Callable[[Any, Any, ModuleType, str], Any], pb2: ModuleType, api: str) -> Callable[[Any, Any], Any]:
    return lambda request, context: method(request, context, pb2, api)


def _bind_stream(method: Callable[[Any, Any, ModuleType], Iterator[Any]], pb2: ModuleType) -> Callable[[Any, Any], Any]:
    return lambda request, context: method(request, context, pb2)


def _since(started: float) -> float:
    return time.perf_counter() - started


def _wait_for_socket(path: pathlib.Path, *, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise PluginError(f"the DRA socket {path} did not appear within {timeout_s} s")
        time.sleep(0.005)


# --- liveness ----------------------------------------------------------------------------------


def probe(sockets: Sockets, *, timeout_s: float = 2.0) -> list[str]:
    """Call GetInfo on the registration socket and an empty v1 NodePrepareResources on the DRA
    socket; return one line per failure (empty when both answer). Never raises."""
    problems = []
    checks = (
        (
            sockets.registration,
            "/pluginregistration.Registration/GetInfo",
            pluginregistration_pb2.InfoRequest(),
            pluginregistration_pb2.PluginInfo,
        ),
        (
            sockets.dra,
            "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
            dra_v1_pb2.NodePrepareResourcesRequest(),
            dra_v1_pb2.NodePrepareResourcesResponse,
        ),
    )
    for path, method, request, response in checks:
        try:
            with grpc.insecure_channel(f"unix:{path}") as channel:
                call = channel.unary_unary(
                    method,
                    request_serializer=type(request).SerializeToString,
                    response_deserializer=response.FromString,
                )
                call(request, timeout=timeout_s)
        except grpc.RpcError as err:
            problems.append(f"{method} on {path}: {err.code().name}: {err.details()}")
    return problems
