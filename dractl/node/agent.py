"""`dractl node-agent`: the kubelet DRA plugin's process, wiring every node piece together.

What it does: opens the GPU backend (NVML or the fake), computes the node's ResourceSlices
(`inventory`, `slices`) in the layout the API server's version takes, checks that the server
keeps every field the flags need, and publishes them (`publish`, over `dractl.kube`); watches
this node's slices and its Node, so a slice deleted or edited by someone else (or a Node
registered again) is republished within seconds; builds the claim state (`state`), starts the
health monitor (`health`; its taints republish the slices), the kubelet plugin (`plugin`),
Prometheus metrics and a liveness endpoint (`liveness`: one gRPC call over each socket, no
call stuck, the Node exists, the API holds the node's slices), both bound before anything is
published or served so a taken port is one line naming its flag. An API server it cannot reach
at start is waited for in the process (with a back-off, /healthz answering 200 meanwhile, a
SIGTERM ending the wait). Then it waits for SIGTERM/SIGINT and shuts down:
sockets removed, slices left in place (the kubelet wipes them 30 s after the driver is gone,
and a restart within that window keeps them).

It refuses to start, with one line on stderr, when a running agent serves its sockets (two
agents on one node need `--pod-uid`, which gives each its own sockets: a rolling update) or a
newer agent wrote the checkpoint (then also with a Warning Event on the Node); two agents with
their own sockets share the state directory, its checkpoint and its locks.

What it must not do: prepare anything itself, import grpc (the plugin does) or the Kubernetes
client (dractl.kube does), or let a missing GPU driver end in a traceback: that is one line
on stderr and exit code 1.
"""

from __future__ import annotations

import dataclasses
import enum
import ipaddress
import pathlib
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Protocol, TextIO

import prometheus_client
import structlog

from dractl import config, daemon, model
from dractl.kube import claims as kube_claims
from dractl.kube import client as kube_client
from dractl.kube import events as kube_events
from dractl.kube import ratelimit
from dractl.node import (
    backend,
    cdi,
    checkpoint,
    discover,
    driverfiles,
    fakegpu,
    health,
    inventory,
    liveness,
    plugin,
    publish,
    sharing,
    slices,
    state,
)

_log = structlog.get_logger(__name__)

EXIT_OK = 0
EXIT_FAILED = 1

# A sweep at start-up catches what a crash left behind; the periodic one catches claims deleted
# while their pods were gone from the kubelet's view (the NVIDIA driver sweeps every 10 min).
SWEEP_INTERVAL_S = 600.0
# The claim locks the plugins of every agent on the node share (two during a rolling update).
CLAIM_LOCK_FILE = "claims.lock"
# How long stop() waits for the publisher thread: a publish hanging on the API server must not
# hold up the shutdown (the thread is a daemon, and ends when that publish returns).
PUBLISHER_JOIN_S = 5.0
# /healthz fails when the API has not held this node's slices for this long: a repair takes seconds,
# so this long means publishing keeps failing.
SLICES_DIFFER_GRACE_S = 60.0
# Repairs in a row back off from this, doubling, to REPAIR_BACKOFF_MAX_S: a server that keeps changing what the
# agent writes must not turn every write into the next one. A change of the node's own slices (a health taint)
# never waits for it.
REPAIR_BACKOFF_FIRST_S = 0.5
REPAIR_BACKOFF_MAX_S = 300.0
# A repair this long after the one before starts a new row; longer than the longest backoff, so a fight that the
# backoff slows down stays one row.
REPAIR_ROW_S = 2 * REPAIR_BACKOFF_MAX_S
# From this many repairs in a row the log says another writer is the likely cause.
REPAIRS_BEFORE_HINT = 3
# /healthz fails when a prepare or unprepare has run this long (the kubelet gave up on it long before).
STUCK_CALL_S = 120.0
# The oldest Kubernetes whose API server serves resource.k8s.io/v1, the only version dractl writes.
MIN_KUBERNETES = (1, 34)
# An API server the agent cannot reach at start is tried again in the process after 1 s, doubling to 30 s: the agent is
# up within seconds of the server's return (an agent that exited would wait out the kubelet's restart back-off, up to
# 5 min), and a fleet of nodes waiting for one control plane does not press it harder than every 30 s each.
API_WAIT_FIRST_S = 1.0
API_WAIT_MAX_S = 30.0
# Each try while waiting is one attempt per request, bounded by this, rather than the client's 5 attempts of 30 s: the
# wait is the retry, and a SIGTERM must not wait minutes for a try sent to a server that drops packets.
API_TRY_TIMEOUT_S = 10.0


# --- metrics ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Metrics:
    """The agent's Prometheus metrics, in their own registry (so tests can run several agents)."""

    registry: prometheus_client.CollectorRegistry
    requests: prometheus_client.Counter
    claims: prometheus_client.Counter
    claim_errors: prometheus_client.Counter
    duration: prometheus_client.Histogram
    published_devices: prometheus_client.Gauge
    unhealthy_devices: prometheus_client.Gauge
    registered: prometheus_client.Gauge
    publish_failures: prometheus_client.Counter
    slice_repairs: prometheus_client.Counter
    slices_in_sync: prometheus_client.Gauge

    @classmethod
    def create(cls) -> Metrics:
        registry = prometheus_client.CollectorRegistry()
        daemon.standard_collectors(registry)
        return cls(
            registry=registry,
            requests=prometheus_client.Counter(
                "dractl_node_requests",
                "NodePrepareResources/NodeUnprepareResources calls handled, by operation and API version.",
                ["operation", "api"],
                registry=registry,
            ),
            claims=prometheus_client.Counter(
                "dractl_node_claims",
                "Claims prepared or unprepared (attempts), by operation.",
                ["operation"],
                registry=registry,
            ),
            claim_errors=prometheus_client.Counter(
                "dractl_node_claim_errors",
                "Claims whose prepare or unprepare failed, by operation.",
                ["operation"],
                registry=registry,
            ),
            duration=prometheus_client.Histogram(
                "dractl_node_request_duration_seconds",
                "Time to handle one NodePrepareResources/NodeUnprepareResources call.",
                ["operation"],
                buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 45),
                registry=registry,
            ),
            published_devices=prometheus_client.Gauge(
                "dractl_node_published_devices",
                "Devices in the ResourceSlices this node publishes.",
                registry=registry,
            ),
            unhealthy_devices=prometheus_client.Gauge(
                "dractl_node_unhealthy_devices", "Devices with a NoSchedule health taint.", registry=registry
            ),
            registered=prometheus_client.Gauge(
                "dractl_node_registered", "1 when the kubelet accepted the plugin's registration.", registry=registry
            ),
            publish_failures=prometheus_client.Counter(
                "dractl_node_publish_failures",
                "Attempts to publish the node's ResourceSlices that failed (the API server refused or did not answer).",
                registry=registry,
            ),
            slice_repairs=prometheus_client.Counter(
                "dractl_node_slice_repairs",
                "Publishes that rewrote slices someone else had deleted or changed in the API.",
                registry=registry,
            ),
            slices_in_sync=prometheus_client.Gauge(
                "dractl_node_slices_in_sync",
                "1 while the API holds exactly the ResourceSlices this node publishes, 0 while they differ.",
                registry=registry,
            ),
        )

    def observe(self, call: plugin.Call) -> None:
        """Record one plugin call (the plugin's `on_call` observer)."""
        self.requests.labels(call.operation, call.api).inc()
        self.claims.labels(call.operation).inc(call.claims)
        if call.errors:
            self.claim_errors.labels(call.operation).inc(call.errors)
        self.duration.labels(call.operation).observe(call.seconds)


# --- HTTP endpoints -----------------------------------------------------------------------------------


def health_answer(problems: Sequence[str]) -> daemon.Answer:
    """200 "ok" when there is no problem, else 503 with one line per problem (each logged)."""
    if problems:
        _log.warning("liveness: unhealthy", problems=list(problems))
        return 503, daemon.TEXT, "".join(f"{p}\n" for p in problems)
    return 200, daemon.TEXT, "ok\n"


# --- the agent ---------------------------------------------------------------------------------------


class _Outcome(enum.Enum):
    """What one publish did: failed, published (nothing to repair), or repaired slices someone else changed."""

    FAILED = "failed"
    PUBLISHED = "published"
    REPAIRED = "repaired"


@dataclasses.dataclass
class _Repairs:
    """Repairs in a row, and the wait they earn before the next publish.

    The publishes between two repairs do not end a row: a second writer of this node's slices (another agent for the
    same node and driver) makes every write of ours the next repair of its, and the echo of our own write in between
    writes nothing. Only a quiet `REPAIR_ROW_S` ends the row. Pure: the caller gives the time.
    """

    first: float = REPAIR_BACKOFF_FIRST_S
    count: int = 0
    last: float = float("-inf")

    def record(self, outcome: _Outcome, now: float) -> None:
        if outcome is _Outcome.REPAIRED:
            self.count = self.count + 1 if now - self.last < REPAIR_ROW_S else 1
            self.last = now

    def delay(self, now: float) -> float:
        """Seconds to wait before the next publish: 0 until two repairs in a row, then `first` doubling per repair,
        at most `REPAIR_BACKOFF_MAX_S`."""
        if self.count < 2 or now - self.last >= REPAIR_ROW_S:
            return 0.0
        return min(REPAIR_BACKOFF_MAX_S, self.first * 2.0 ** (self.count - 2))


class AgentError(Exception):
    """The agent cannot start; str() is the one line printed before exiting 1."""


class SlicePublisher(Protocol):
    """`publish.Publisher` in production: make the API hold exactly these slices. Tests inject their own; then the
    agent neither reads the server's version nor watches the API (both need `publish.Publisher`)."""

    def publish(self, desired: Sequence[model.ResourceSlice]) -> object: ...


class Agent:
    """One node agent: `start()` brings everything up in order, `stop()` takes it down.

    Collaborators may be injected (tests); otherwise they are built from the settings: the
    backend from `--device-source`, the claim source and publisher from `--kubeconfig`.
    Invariants: slices are published before the plugin registers, so the scheduler can see the
    devices the kubelet will be asked to prepare; after that only the publisher thread publishes,
    so a slow API server never holds up NVML event delivery; taint changes wake it at once and a
    failed publish is retried when `tick()` wakes it, and any change to this node's slices or Node
    in the API wakes it too; a publisher thread left running by `stop()` never publishes again once
    its publish returns; `stop()` is idempotent and never deletes slices. `stuck_after_s` and
    `differ_grace_s` are /healthz's bounds (STUCK_CALL_S, SLICES_DIFFER_GRACE_S); `repair_backoff_s`
    is the first wait after repairs in a row (REPAIR_BACKOFF_FIRST_S).
    """

    def __init__(
        self,
        settings: config.NodeAgent,
        *,
        gpus: backend.NvmlBackend | None = None,
        claims: state.ClaimSource | None = None,
        publisher: SlicePublisher | None = None,
        health_poll_s: float = 1.0,
        stuck_after_s: float = STUCK_CALL_S,
        differ_grace_s: float = SLICES_DIFFER_GRACE_S,
        repair_backoff_s: float = REPAIR_BACKOFF_FIRST_S,
    ) -> None:
        self.settings = settings
        self.metrics = Metrics.create()
        self._gpus = gpus
        self._claims = claims
        self._publisher = publisher
        self._api: publish.Publisher | None = None
        self._server = "(injected client)"  # The API server's URL once `_start` connects, for start-up errors.
        self._client: kube_client.Client | None = None  # The client `_start` built (closed by `stop()`), if any.
        # While the start waits for the API server: what /healthz answers (200), naming the server and the last error.
        self._waiting: str | None = None
        self._watch: publish.Watch | None = None
        self._layout = slices.Layout.SPLIT
        self._publish_taints = True
        self._published: tuple[model.ResourceSlice, ...] | None = None
        self._health_poll_s = health_poll_s
        self._stuck_after_s = stuck_after_s
        self._differ_grace_s = differ_grace_s
        self._repair_backoff_s = repair_backoff_s
        self.synced = liveness.Slices(node_name=settings.node_name)
        self.calls: liveness.Calls | None = None
        self._inventory: inventory.Inventory | None = None
        self._publish_pending = False
        self._publish_wanted = threading.Event()
        self._publish_changed = threading.Event()
        self._publishing: threading.Thread | None = None
        self._stop_publishing = threading.Event()
        self._last_sweep = 0.0
        self._restore_failures: set[str] = set()
        self._recorder: kube_events.Recorder | None = None
        self.state: state.State | None = None
        self.monitor: health.Monitor | None = None
        self.plugin: plugin.Plugin | None = None
        self.slices: tuple[model.ResourceSlice, ...] = ()
        self._endpoints: list[daemon.HttpEndpoint] = []
        self._addresses: dict[int, str] = {}
        self.health_port: int | None = None
        self.metrics_port: int | None = None

    @property
    def sockets(self) -> plugin.Sockets:
        return plugin.socket_paths(
            driver_name=self.settings.driver_name,
            registrar_dir=self.settings.kubelet_registrar_dir,
            plugins_dir=self.settings.kubelet_plugins_dir,
            pod_uid=self.settings.pod_uid,
        )

    def start(self, stopping: threading.Event | None = None) -> bool:
        """Bring the agent up; True once it serves. Raises AgentError with one line when something cannot start
        (the caller exits 1); what was started is stopped again first.

        With `stopping`, an API server that cannot be reached (`kube_client.Transient`: no connection, 5xx, 429) is
        waited for, tried again from `API_WAIT_FIRST_S` doubling to `API_WAIT_MAX_S`, while /healthz answers 200
        naming the wait; `stopping` set during the wait ends it (at once, or once a try already sent ends, within
        `API_TRY_TIMEOUT_S`), and start returns False with nothing left running. Without `stopping` an unreachable
        server is an AgentError at once, as a refusal or a too-old server always is.
        """
        try:
            started = self._start(stopping)
        except AgentError:
            self.stop()
            raise
        except backend.NvmlError as err:
            self.stop()
            raise AgentError(
                f"cannot read GPUs through NVML ({err}); is the NVIDIA driver installed? "
                "Use --device-source fake to run without a GPU."
            ) from err
        except (
            fakegpu.ProfileError,
            fakegpu.StateFileError,
            slices.SliceError,
            plugin.PluginError,
            driverfiles.DriverFilesError,
        ) as err:
            self.stop()
            raise AgentError(str(err)) from err
        except kube_client.ApiError as err:
            self.stop()
            raise AgentError(_api_failure(self._server, err)) from err
        except kube_client.BadObject as err:
            self.stop()
            raise AgentError(
                f"cannot start: the API server {self._server} answered what dractl cannot read: {err}"
            ) from err
        except OSError as err:
            self.stop()
            raise AgentError(f"cannot start: {err}") from err
        if not started:
            _log.info("node agent stopped while waiting for the API server", server=self._server)
            self.stop()
        return started

    def _start(self, stopping: threading.Event | None) -> bool:
        """`start`'s work: False when `stopping` was set while it waited for the API server."""
        s = self.settings
        # Before anything is touched: a running agent serving these sockets (a second agent without
        # --pod-uid) makes this one refuse to start.
        plugin.check_sockets(self.sockets)
        # Names before any state is written: fake GPUs keep their state for the node they were made for.
        slices.check_names(s.node_name, s.driver_name)
        state_dir = s.plugin_state_dir
        _writable_dir(
            state_dir, what="the state directory", flag="--state-dir; default: --kubelet-plugins-dir/<driver name>"
        )
        # Checked here rather than at the first prepare, which would fail, as every later one, with the same message.
        _writable_dir(s.cdi_root, what="the CDI directory", flag="--cdi-root")
        fake = s.device_source is config.DeviceSource.FAKE
        if self._gpus is None:
            # The fake keeps its MIG instances in the state dir, so a restarted agent finds the
            # instances it created before, as it would on real GPUs.
            self._gpus = discover.open_backend(
                _discover_settings(s), state_file=state_dir / "fake-gpus.json" if fake else None
            )
        gpus = self._gpus
        self._inventory = inventory.read(gpus)
        client = _connect(s) if self._claims is None or self._publisher is None else None
        self._client = client
        # The ports before anything is published or served: a taken one stops the start with one line. /healthz
        # first, so it answers while the start waits for the API server; /metrics once its address is known (by
        # default the Node's, read through the API).
        self._listen_health()
        if s.metrics_address is not None or client is None:
            self._listen_metrics(s.metrics_address if s.metrics_address is not None else _LOOPBACK)
        if client is not None:
            self._server = client.host
            if not self._reach_api(client, stopping):
                return False
            if self._claims is None:
                self._claims = kube_claims.ApiClaimSource(client)
            if self._publisher is None:
                self._api = publish.Publisher(client, driver=s.driver_name, node_name=s.node_name)
                self._publisher = self._api
            self._recorder = kube_events.Recorder(client, host=s.node_name)
        assert self._claims is not None  # Injected, or made above from the client built when it was not.
        untainted = self._build({})
        self.metrics.published_devices.set(sum(len(sl.devices) for sl in untainted))
        self._publish({})
        try:
            self.state = state.State(
                driver_name=s.driver_name,
                node_name=s.node_name,
                backend=gpus,
                claims=self._claims,
                cdi_root=s.cdi_root,
                state_dir=state_dir,
                mps=sharing.FakeMps(root=state_dir / "mps") if fake else None,
                common_edits=self._common_edits(state_dir),
                dynamic_mig=s.mig_mode is config.MigMode.DYNAMIC,
                device_nodes=not fake,
                on_warning=self._warn,
            )
        except checkpoint.NewerVersion as err:
            message = (
                f"{err}, so it does not start: run the newer agent again, or move the file away to have this one "
                "rebuild the node's state from the API and the devices (the file is left as it is)"
            )
            self._warn(state.Notice(reason="CheckpointTooNew", message=message))
            raise AgentError(message) from err
        # The first sweep also rebuilds the state when the checkpoint was missing or corrupt.
        self.sweep()
        self.monitor = health.Monitor(
            backend=gpus,
            driver_name=s.driver_name,
            pool=s.node_name,
            devices=health.devices_from_slices(untainted),
            lost=[gpu.info.minor for gpu in self._inventory.gpus if gpu.lost],
            poll_s=self._health_poll_s,
        )
        self.monitor.subscribe(self._on_taints)
        # Each thread has its own events: one that outlived an earlier stop()'s join (a publish
        # hanging on the API server) finds its stop event set when the publish returns, and ends;
        # wake-ups meant for the new thread never reach it.
        self._stop_publishing = threading.Event()
        self._publish_wanted = threading.Event()
        self._publish_changed = threading.Event()
        self._publishing = threading.Thread(
            target=self._publish_loop,
            args=(self.monitor, self._publish_wanted, self._publish_changed, self._stop_publishing),
            name="dractl-publish",
            daemon=True,
        )
        self._publishing.start()
        if self._api is not None:
            # Started after the first publish, so its first list finds our own slices (one no-op publish).
            self._watch = self._api.watch(self._on_api_change)
        self.monitor.start()
        self.calls = liveness.Calls(self.state)
        self.plugin = plugin.Plugin(
            driver_name=s.driver_name,
            sockets=self.sockets,
            preparer=self.calls,
            health_source=self.monitor,
            on_call=self.metrics.observe,
            claim_lock_file=state_dir / CLAIM_LOCK_FILE,
        )
        self.metrics.registered.set_function(lambda: 1.0 if self._registered() else 0.0)
        self.plugin.start()
        _log.info(
            "node agent started",
            node=s.node_name,
            driver=s.driver_name,
            devices=sum(len(sl.devices) for sl in self.slices),
            layout=self._layout.value,
            health=self._address(self.health_port),
            metrics=self._address(self.metrics_port),
        )
        return True

    def _common_edits(self, state_dir: pathlib.Path) -> cdi.CommonEdits:
        """Where the driver's files in every claim spec come from, checked now so that a wrong
        driver root stops the start with one line instead of failing every prepare.

        Fake GPUs get a fake driver root in the state directory (which the agent sees at its host
        path), so their specs mount files that exist and the same discovery runs as on a GPU node.
        """
        s = self.settings
        assert self._inventory is not None
        version = self._inventory.driver.driver_version
        if s.device_source is config.DeviceSource.FAKE:
            infos = [gpu.info for gpu in self._inventory.gpus]
            root = fakegpu.write_driver_root(state_dir / "fake-driver-root", driver=self._inventory.driver, gpus=infos)
            native = driverfiles.NativeEdits(root=root, host_root=root, driver_version=version)
        elif s.cdi_generator is config.CdiGenerator.NVIDIA_CTK:
            if shutil.which("nvidia-ctk") is None:
                raise AgentError("--cdi-generator nvidia-ctk: nvidia-ctk is not on PATH (else use native)")
            if s.agent_driver_root != s.driver_root:
                # nvidia-ctk writes the paths it reads, so they would not be the host's.
                raise AgentError(
                    "--cdi-generator nvidia-ctk cannot rewrite paths: --container-driver-root must be --driver-root"
                )
            return cdi.NvidiaCtk(extra_args=[f"--driver-root={s.driver_root}"])
        else:
            native = driverfiles.NativeEdits(root=s.agent_driver_root, host_root=s.driver_root, driver_version=version)
        files = native.check()
        # The fake root's binaries are scripts of its own; on a GPU node one is a wrapper around the driver's program
        # elsewhere (seen on a GKE-style host: /usr/bin/nvidia-smi execs /usr/local/nvidia/bin/nvidia-smi).
        fake = s.device_source is config.DeviceSource.FAKE
        wrappers = () if fake else driverfiles.scripts(s.agent_driver_root, files)
        if wrappers:
            _log.warning(
                "driver binaries in the driver root are scripts, not the driver's programs: containers get the"
                " scripts, which may run files they do not have; set --driver-root to where the driver is"
                " installed (e.g. /usr/local/nvidia, /home/kubernetes/bin/nvidia on GKE)",
                driver_root=str(s.driver_root),
                scripts=list(wrappers),
            )
        return native

    def _reach_api(self, client: kube_client.Client, stopping: threading.Event | None) -> bool:
        """Ask the API server what the start needs from it until it answers: its version and the fields it keeps
        (`_check_server`, unless a publisher was injected) and, without --metrics-address, the Node's address, on
        which /metrics is then bound. True once it answered; False when `stopping` was set while waiting.

        Only `kube_client.Transient` is waited for (and only with `stopping`): each failed try is one warning naming
        the server, the error and the delay before the next, and /healthz answers 200 saying so, since restarting
        the agent cannot bring an API server back. Every other error (a refusal, a too-old server, a taken port)
        goes up at once. Each try sends every request again, which is safe: all are reads or dry runs.
        """
        # While waiting, one attempt per request, bounded: a try must not outlast a SIGTERM by minutes (same pool
        # and limiter). Without a wait, the client's own retries are the only ones.
        trying = client
        if stopping is not None:
            trying = kube_client.Client(
                client.api_client,
                field_manager=client.field_manager,
                attempts=1,
                timeout=API_TRY_TIMEOUT_S,
                limiter=client.limiter,
            )
        s = self.settings
        delay = API_WAIT_FIRST_S
        self._waiting = f"waiting for the API server {client.host}"
        while True:
            try:
                if self._publisher is None:
                    self._check_server(publish.Publisher(trying, driver=s.driver_name, node_name=s.node_name))
                if s.metrics_address is None and s.metrics_port >= 0:
                    self._listen_metrics(_node_address(trying, s.node_name))
            except kube_client.Transient as err:
                if stopping is None:
                    raise
                error = _reason(err)
                self._waiting = f"waiting for the API server {client.host}: {error}"
                _log.warning(
                    "cannot reach the API server; trying again", server=client.host, error=error, retry_in_s=delay
                )
                if stopping.wait(delay):
                    return False
                delay = min(delay * 2, API_WAIT_MAX_S)
            else:
                self._waiting = None
                return True

    def _listen_health(self) -> None:
        """Bind /healthz (unless off). A port that is taken or an address that is not this host's is an AgentError
        naming the flags."""
        s = self.settings
        if s.health_port >= 0:
            self.health_port = self._bind(
                host=s.health_address,
                port=s.health_port,
                route=("/healthz", self.healthz),
                flags=("--health-address", "--health-port"),
            )

    def _listen_metrics(self, host: str) -> None:
        """Bind /metrics on `host` (unless off), as `_listen_health` binds /healthz."""
        s = self.settings
        if s.metrics_port >= 0:
            registry = self.metrics.registry
            self.metrics_port = self._bind(
                host=host,
                port=s.metrics_port,
                route=("/metrics", lambda: daemon.metrics_page(registry)),
                flags=("--metrics-address", "--metrics-port"),
            )

    def _bind(self, *, host: str, port: int, route: tuple[str, daemon.Route], flags: tuple[str, str]) -> int:
        address_flag, port_flag = flags
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise AgentError(f"{address_flag} {host!r} is not an IP address") from None
        try:
            endpoint = daemon.HttpEndpoint(port=port, routes=dict([route]), name=route[0].strip("/"), host=host)
        except OSError as err:
            raise AgentError(
                f"cannot serve {route[0]} on {host}:{port} ({address_flag} {host}, {port_flag} {port}): "
                f"{err.strerror or err}; choose another with {port_flag} or {address_flag}, or -1 to turn it off"
            ) from err
        self._endpoints.append(endpoint)
        self._addresses[endpoint.port] = host
        return endpoint.port

    def _address(self, port: int | None) -> str | None:
        return None if port is None else f"{self._addresses[port]}:{port}"

    def _check_server(self, api: publish.Publisher) -> None:
        """Pick the slice layout from the server's version and make sure it keeps every field the flags need.

        A server older than 1.34, or one whose feature gates drop a field dynamic MIG or consumable memory
        needs, is an AgentError saying what to change; dropped device taints only mean health is reported
        through the kubelet's health stream alone (a warning)."""
        s = self.settings
        version = api.server_version()
        served = f"Kubernetes {version}" + (f" ({version.git_version})" if version.git_version else "")
        if (version.major, version.minor) < MIN_KUBERNETES:
            raise AgentError(
                f"the API server serves {served}; dractl publishes resource.k8s.io/v1 ResourceSlices, "
                f"which need Kubernetes {'.'.join(map(str, MIN_KUBERNETES))} or later"
            )
        self._layout = slices.layout_for(version.major, version.minor)
        needed = {}
        if s.mig_mode is config.MigMode.DYNAMIC:
            needed[publish.Feature.PARTITIONABLE_DEVICES] = "--mig-mode dynamic"
        if s.consumable_memory:
            needed[publish.Feature.CONSUMABLE_CAPACITY] = "--consumable-memory"
        for dropped in api.dropped_fields(self._build({})):
            if dropped.feature is publish.Feature.DEVICE_TAINTS:
                self._publish_taints = False
                _log.warning(
                    "the API server drops device taints (the DRADeviceTaints feature gate is off): unhealthy "
                    "devices are reported through the kubelet's health stream only, not as taints in the slices",
                    server=served,
                )
            elif dropped.feature in needed:
                gate = dropped.feature.value
                default = ".".join(map(str, publish.ON_BY_DEFAULT_FROM))
                raise AgentError(
                    f"{needed[dropped.feature]} needs the {gate} feature gate, which is off on this API server "
                    f"({served}: it dropped {dropped.path} from a dry-run ResourceSlice); turn it on for "
                    f"kube-apiserver and kube-scheduler (--feature-gates={gate}=true; on by default from "
                    f"Kubernetes {default}), or run without {needed[dropped.feature]}"
                )
            else:
                raise AgentError(
                    f"the API server ({served}) did not keep {dropped.path} of a dry-run ResourceSlice, so the "
                    "slices it would hold are not the ones this node publishes"
                )

    def stop(self) -> None:
        """Stop serving and remove the sockets; slices stay. Idempotent."""
        if self.plugin is not None:
            self.plugin.stop()
            self.plugin = None
        if self._watch is not None:
            self._watch.stop()
            self._watch = None
        for endpoint in self._endpoints:
            endpoint.stop()
        self._endpoints.clear()
        if self.monitor is not None:
            self.monitor.stop()
            self.monitor = None
        if self._publishing is not None:
            self._stop_publishing.set()
            self._publish_changed.set()
            self._publish_wanted.set()
            self._publishing.join(timeout=PUBLISHER_JOIN_S)
            self._publishing = None
        if self._gpus is not None:
            self._gpus.close()
            self._gpus = None
        if self._client is not None:
            self._client.close()
            self._client = None
        self._waiting = None

    def tick(self) -> None:
        """Periodic work from the main loop: have a failed publish retried (by the current
        publisher thread), write again a prepared claim's CDI spec that is gone (a container of
        it restarting needs it), sweep every SWEEP_INTERVAL_S."""
        if self._publish_pending:
            self._publish_wanted.set()
        if time.monotonic() - self._last_sweep >= SWEEP_INTERVAL_S:
            self.sweep()
        elif self.state is not None:
            # Each failure is logged once, not every tick; the sweep logs what still fails every SWEEP_INTERVAL_S.
            for error in set(self.state.restore_specs().errors) - self._restore_failures:
                _log.warning("cannot write a prepared claim's CDI spec again", error=error)
                self._restore_failures.add(error)

    def sweep(self) -> None:
        if self.state is None:
            return
        self._last_sweep = time.monotonic()
        result = self.state.sweep()
        for error in result.errors:
            _log.warning("sweep: could not clean up", error=error)

    def _publish_loop(
        self, monitor: health.Monitor, wanted: threading.Event, changed: threading.Event, stopping: threading.Event
    ) -> None:
        """The publisher thread: publish the monitor's current taints whenever `wanted` is set,
        until `stopping` is set; `changed` says the taints changed since the last publish read them. All three
        events are this thread's own.

        The taints are read here, at publish time, by the only thread that publishes, so each
        publish carries a state at least as new as the one before: an older health state never
        overwrites a newer one, whatever order the monitor's observers ran in. A change made
        during a publish sets `wanted` again, so the newest state is always published. `stopping`
        is checked after each publish too, so a thread that outlived `stop()` ends as soon as its
        publish returns. Nothing else ends the thread: a failure is logged and retried at the next
        tick, with its traceback the first time it is seen and one line while it recurs, until a
        publish succeeds. Repairs in a row (a server or a second agent that keeps changing what we
        write would otherwise make every write wake the next) wait longer and longer before the next
        publish (`_Repairs`), and from the third the log names the likely cause; a change of the taints
        cuts that wait short, since a health change is news, not an echo of a fight.
        """
        seen: set[str] = set()
        repairs = _Repairs(first=self._repair_backoff_s)
        while not stopping.is_set():
            wanted.wait()
            if stopping.is_set():
                return
            delay = repairs.delay(time.monotonic())
            if delay and not changed.is_set():
                changed.wait(delay)  # stop() sets it too
            if stopping.is_set():
                return
            changed.clear()
            wanted.clear()
            try:
                outcome = self._publish(monitor.taints())
                if outcome is not _Outcome.FAILED:
                    seen.clear()
                repairs.record(outcome, time.monotonic())
                if outcome is _Outcome.REPAIRED and repairs.count >= REPAIRS_BEFORE_HINT:
                    _log.warning(
                        "another writer keeps changing this node's ResourceSlices: is a second node agent running for"
                        " this node and driver (another release, or another plugin directory)?",
                        node=self.settings.node_name,
                        driver=self.settings.driver_name,
                        repairs_in_a_row=repairs.count,
                        next_publish_after_s=repairs.delay(time.monotonic()),
                    )
            except Exception as err:  # noqa: BLE001 - a bug in building the slices must not stop every later publish
                self._publish_pending = True
                failure = f"{type(err).__qualname__}: {err}"
                if failure in seen:
                    _log.warning("publishing ResourceSlices failed again; retrying at the next tick", error=failure)
                else:
                    seen.add(failure)
                    _log.exception("publishing ResourceSlices failed; retrying at the next tick", error=failure)

    def _publish(self, taints: Mapping[str, tuple[model.DeviceTaint, ...]]) -> _Outcome:
        """Build the slices with these taints and publish them; return whether the API took them, and whether
        it had to repair what someone else changed. When it did not take them, a later `tick()` retries.

        Called by `_start` before the publisher thread exists, then only by that thread.
        """
        self.slices = self._build(taints)
        assert self._publisher is not None
        try:
            result = self._publisher.publish(self.slices)
        except Exception as err:  # noqa: BLE001 - the API being away must not stop the node agent
            self._publish_pending = True
            self.metrics.publish_failures.inc()
            self.metrics.slices_in_sync.set(0)
            self.synced.failed(f"publishing failed: {err}", node_missing=isinstance(err, publish.NodeMissing))
            _log.warning("publishing ResourceSlices failed; retrying", error=str(err))
            return _Outcome.FAILED
        self._publish_pending = False
        outcome = _Outcome.PUBLISHED
        if isinstance(result, publish.Result) and result.writes and self.slices == self._published:
            # The same slices as last time needed writes: someone deleted or changed ours in the API.
            outcome = _Outcome.REPAIRED
            self.metrics.slice_repairs.inc()
            _log.warning(
                "ResourceSlices in the API differed from this node's; repaired",
                created=result.created,
                updated=result.updated,
                deleted=result.deleted,
                generation=result.generation,
            )
        self._published = self.slices
        self.synced.published()
        self.metrics.slices_in_sync.set(1)
        unhealthy = sum(
            1
            for sl in self.slices
            for d in sl.devices
            if any(t.effect != model.TaintEffect.NONE.value for t in d.taints)
        )
        self.metrics.unhealthy_devices.set(unhealthy)
        return outcome

    def _build(self, taints: Mapping[str, tuple[model.DeviceTaint, ...]]) -> tuple[model.ResourceSlice, ...]:
        assert self._inventory is not None
        s = self.settings
        options = slices.Options(
            node_name=s.node_name,
            driver_name=s.driver_name,
            mig_mode=s.mig_mode,
            consumable_memory=s.consumable_memory,
            taints={name: found for name, found in taints.items() if found} if self._publish_taints else {},
            layout=self._layout,
        )
        return slices.build(self._inventory, options=options)

    def _on_taints(self, taints: Mapping[str, tuple[model.DeviceTaint, ...]]) -> None:
        # Called on the monitor's NVML event thread: only wake the current publisher thread, which
        # reads the newest taints itself, so a slow API server cannot delay the next event; a repair
        # back-off does not either (`changed`).
        self._publish_changed.set()
        self._publish_wanted.set()

    def _on_api_change(self) -> None:
        # Called on an informer thread for every event on this node's slices or Node (our own writes too):
        # the publisher thread lists again and writes only what differs, so our own echo costs one list.
        self.synced.differ("a change in the API is being compared")
        self.metrics.slices_in_sync.set(0)
        self._publish_wanted.set()

    def healthz(self) -> daemon.Answer:
        """/healthz: 200 when both sockets answer, no call is stuck, the Node exists and the API has held this
        node's slices within the grace; else 503 with one line per problem. While the start waits for the API
        server, 200 with one line saying so: a restart cannot bring the server back, so it is not a liveness
        failure (the chart's probe would otherwise restart the agent into the kubelet's back-off)."""
        waiting = self._waiting
        if waiting is not None:
            return 200, daemon.TEXT, f"{waiting}\n"
        problems = []
        current = self.plugin
        problems.extend(plugin.probe(current.sockets) if current is not None else ["the plugin is not serving yet"])
        if self.calls is not None:
            problems.extend(self.calls.stuck(after_s=self._stuck_after_s))
        problems.extend(self.synced.problems(grace_s=self._differ_grace_s))
        return health_answer(problems)

    def _warn(self, notice: state.Notice) -> None:
        # The state logged it (or start() prints it); a Warning Event on the Node shows it to `kubectl describe node`.
        if self._recorder is not None:
            node = kube_events.ObjectRef(api_version="v1", kind="Node", name=self.settings.node_name)
            self._recorder.event(node, type=kube_events.WARNING, reason=notice.reason, message=notice.message)

    def _registered(self) -> bool:
        return self.plugin is not None and self.plugin.registration_status.registered is True


def _discover_settings(settings: config.NodeAgent) -> config.Discover:
    return config.Discover(
        node_name=settings.node_name,
        driver_name=settings.driver_name,
        device_source=settings.device_source,
        fake_profile=settings.fake_profile,
        mig_mode=settings.mig_mode,
        consumable_memory=settings.consumable_memory,
    )


def _node_address(client: kube_client.Client, node_name: str) -> str:
    """The Node's first InternalIP, or loopback when there is no such Node or no such address. Raises
    `kube_client.Transient` when the API server does not answer (the start waits for it: an address read later is
    the Node's, where loopback would stay for good)."""
    try:
        node = client.get(kube_client.NODES, node_name)
    except kube_client.Transient:
        raise
    except kube_client.ApiError as err:
        _log.warning("cannot read the Node's address; /metrics listens on loopback", node=node_name, error=str(err))
        return _LOOPBACK
    for address in (node.get("status") or {}).get("addresses") or ():
        if isinstance(address, dict) and address.get("type") == "InternalIP" and address.get("address"):
            return str(address["address"])
    _log.info("the Node has no InternalIP; /metrics listens on loopback", node=node_name)
    return _LOOPBACK


_LOOPBACK = "127.0.0.1"


def _api_failure(server: str, err: kube_client.ApiError) -> str:
    """One line for an API request that stopped the start, naming the server, as `dractl explain` does. Pure."""
    if isinstance(err, kube_client.Transient) and err.status == 0:
        return f"cannot start: cannot reach the API server {server}: {err.message}"
    return f"cannot start: the API server {server} answered: {err}"


def _reason(err: kube_client.Transient) -> str:
    """Why a try to reach the API server failed, for the wait's warning and /healthz: the connection's error, or the
    answer (`503 ServiceUnavailable: ...`). Pure."""
    return err.message if err.status == 0 else str(err)


def _writable_dir(path: pathlib.Path, *, what: str, flag: str) -> None:
    """Create `path` when missing and prove it writable by creating and removing a temporary file there (named as
    `checkpoint.write_atomically` names its temporary files, which CDI runtimes ignore). Raises OSError with one line
    naming `what`, the directory, `flag` and the OS error. Idempotent."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OSError(f"cannot create {what} {path} ({flag}): {err.strerror or err}") from err
    try:
        with tempfile.NamedTemporaryFile(dir=path, prefix=".dractl-write-check.", suffix=".tmp"):
            pass
    except OSError as err:
        raise OSError(f"cannot write to {what} {path} ({flag}): {err.strerror or err}") from err


def _connect(settings: config.NodeAgent) -> kube_client.Client:
    kubeconfig = settings.kubeconfig
    try:
        return kube_client.connect(
            kubeconfig, limiter=ratelimit.TokenBucket(settings.kube_api_qps, settings.kube_api_burst)
        )
    except Exception as err:
        where = f"kubeconfig {kubeconfig}" if kubeconfig is not None else "the in-cluster config or $KUBECONFIG"
        raise AgentError(f"cannot build a Kubernetes client from {where}: {err}") from err


def run(
    settings: config.NodeAgent,
    *,
    err: TextIO | None = None,
    stop: threading.Event | None = None,
    agent: Agent | None = None,
) -> int:
    """Run the node agent until SIGTERM/SIGINT (or `stop` is set); return the exit code.

    0 after a clean shutdown, also one while the start waits for the API server; 1 with one line on `err` (stderr)
    when the agent cannot start. `agent` replaces the one built from `settings` (tests inject collaborators that way).
    """
    out = err if err is not None else sys.stderr
    daemon.configure_logging(settings.log_format, stream=out)
    stopping = stop if stop is not None else threading.Event()
    if agent is None:
        agent = Agent(settings)
    # Installed before the start, so a SIGTERM while it waits for the API server ends the wait (exit 0).
    previous = daemon.install_signal_handlers(stopping.set)
    try:
        try:
            if not agent.start(stopping):
                return EXIT_OK
        except AgentError as error:
            print(f"dractl node-agent: error: {error}", file=out)
            return EXIT_FAILED
        try:
            while not stopping.wait(timeout=5.0):
                try:
                    agent.tick()
                except Exception:  # noqa: BLE001 - periodic housekeeping must never take the plugin down
                    _log.exception("node agent: periodic work failed; retrying at the next tick")
        finally:
            _log.info("node agent stopping")
            agent.stop()
    finally:
        daemon.restore_signal_handlers(previous)
    return EXIT_OK
