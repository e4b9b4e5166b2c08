"""`dractl node-agent`: the kubelet DRA plugin's process, wiring every node piece together.

What it does: opens the GPU backend (NVML or the fake), computes the node's ResourceSlices
(`inventory`, `slices`) and publishes them (`publish`, over `dractl.kube`), builds the claim
state (`state`), starts the health monitor (`health`; its taints republish the slices), the
kubelet plugin (`plugin`), Prometheus metrics and a liveness endpoint that makes one gRPC
call over each socket, then waits for SIGTERM/SIGINT and shuts down: sockets removed, slices
left in place (the kubelet wipes them 30 s after the driver is gone, and a restart within
that window keeps them).

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
import pathlib
import shutil
import sys
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


# --- logging ---------------------------------------------------------------------------------------


# Shared with `dractl controller`; the node's name for it is kept (its tests and callers use it).
configure_logging = daemon.configure_logging


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

    @classmethod
    def create(cls) -> Metrics:
        registry = prometheus_client.CollectorRegistry()
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
        )

    def observe(self, call: plugin.Call) -> None:
        """Record one plugin call (the plugin's `on_call` observer)."""
        self.requests.labels(call.operation, call.api).inc()
        self.claims.labels(call.operation).inc(call.claims)
        if call.errors:
            self.claim_errors.labels(call.operation).inc(call.errors)
        self.duration.labels(call.operation).observe(call.seconds)


# --- HTTP endpoints -----------------------------------------------------------------------------------


def liveness(sockets: plugin.Sockets) -> tuple[int, str, str]:
    """200 when both sockets answer a gRPC call, else 503 naming each failure."""
    problems = plugin.probe(sockets)
    if problems:
        _log.warning("liveness: a socket does not answer", problems=problems)
        return 503, "text/plain; charset=utf-8", "".join(f"{p}\n" for p in problems)
    return 200, "text/plain; charset=utf-8", "ok\n"


# --- the agent ---------------------------------------------------------------------------------------


class AgentError(Exception):
    """The agent cannot start; str() is the one line printed before exiting 1."""


class SlicePublisher(Protocol):
    """`publish.Publisher` in production: make the API hold exactly these slices."""

    def publish(self, desired: Sequence[model.ResourceSlice]) -> object: ...


class Agent:
    """One node agent: `start()` brings everything up in order, `stop()` takes it down.

    Collaborators may be injected (tests); otherwise they are built from the settings: the
    backend from `--device-source`, the claim source and publisher from `--kubeconfig`.
    Invariants: slices are published before the plugin registers, so the scheduler can see the
    devices the kubelet will be asked to prepare; after that only the publisher thread publishes,
    so a slow API server never holds up NVML event delivery; taint changes wake it at once and a
    failed publish is retried when `tick()` wakes it; a publisher thread left running by `stop()`
    never publishes again once its publish returns; `stop()` is idempotent and never deletes slices.
    """

    def __init__(
        self,
        settings: config.NodeAgent,
        *,
        gpus: backend.NvmlBackend | None = None,
        claims: state.ClaimSource | None = None,
        publisher: SlicePublisher | None = None,
        health_poll_s: float = 1.0,
    ) -> None:
        self.settings = settings
        self.metrics = Metrics.create()
        self._gpus = gpus
        self._claims = claims
        self._publisher = publisher
        self._health_poll_s = health_poll_s
        self._inventory: inventory.Inventory | None = None
        self._publish_pending = False
        self._publish_wanted = threading.Event()
        self._publishing: threading.Thread | None = None
        self._stop_publishing = threading.Event()
        self._last_sweep = 0.0
        self._recorder: kube_events.Recorder | None = None
        self.state: state.State | None = None
        self.monitor: health.Monitor | None = None
        self.plugin: plugin.Plugin | None = None
        self.slices: tuple[model.ResourceSlice, ...] = ()
        self._endpoints: list[daemon.HttpEndpoint] = []
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

    def start(self) -> None:
        """Bring the agent up. Raises AgentError with one line when something cannot start
        (the caller exits 1); what was started is stopped again first."""
        try:
            self._start()
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
        except OSError as err:
            self.stop()
            raise AgentError(f"cannot start: {err}") from err

    def _start(self) -> None:
        s = self.settings
        # Before anything is touched: a running agent serving these sockets (a second agent without
        # --pod-uid) makes this one refuse to start.
        plugin.check_sockets(self.sockets)
        state_dir = s.plugin_state_dir
        state_dir.mkdir(parents=True, exist_ok=True)
        fake = s.device_source is config.DeviceSource.FAKE
        if self._gpus is None:
            # The fake keeps its MIG instances in the state dir, so a restarted agent finds the
            # instances it created before, as it would on real GPUs.
            self._gpus = discover.open_backend(
                _discover_settings(s), state_file=state_dir / "fake-gpus.json" if fake else None
            )
        gpus = self._gpus
        self._inventory = inventory.read(gpus)
        if self._claims is None or self._publisher is None:
            client = _connect(s)
            if self._claims is None:
                self._claims = kube_claims.ApiClaimSource(client)
            if self._publisher is None:
                self._publisher = publish.Publisher(client, driver=s.driver_name, node_name=s.node_name)
            self._recorder = kube_events.Recorder(client, host=s.node_name)
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
        self._publishing = threading.Thread(
            target=self._publish_loop,
            args=(self.monitor, self._publish_wanted, self._stop_publishing),
            name="dractl-publish",
            daemon=True,
        )
        self._publishing.start()
        self.monitor.start()
        self.plugin = plugin.Plugin(
            driver_name=s.driver_name,
            sockets=self.sockets,
            preparer=self.state,
            health_source=self.monitor,
            on_call=self.metrics.observe,
            claim_lock_file=state_dir / CLAIM_LOCK_FILE,
        )
        self.metrics.registered.set_function(lambda: 1.0 if self._registered() else 0.0)
        self.plugin.start()
        sockets = self.plugin.sockets
        if s.health_port >= 0:
            endpoint = daemon.HttpEndpoint(
                port=s.health_port, routes={"/healthz": lambda: liveness(sockets)}, name="liveness"
            )
            self._endpoints.append(endpoint)
            self.health_port = endpoint.port
        if s.metrics_port >= 0:
            registry = self.metrics.registry
            endpoint = daemon.HttpEndpoint(
                port=s.metrics_port, routes={"/metrics": lambda: daemon.metrics_page(registry)}, name="metrics"
            )
            self._endpoints.append(endpoint)
            self.metrics_port = endpoint.port
        _log.info(
            "node agent started",
            node=s.node_name,
            driver=s.driver_name,
            devices=sum(len(sl.devices) for sl in self.slices),
            health_port=self.health_port,
            metrics_port=self.metrics_port,
        )

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
        native.check()
        return native

    def stop(self) -> None:
        """Stop serving and remove the sockets; slices stay. Idempotent."""
        if self.plugin is not None:
            self.plugin.stop()
            self.plugin = None
        for endpoint in self._endpoints:
            endpoint.stop()
        self._endpoints.clear()
        if self.monitor is not None:
            self.monitor.stop()
            self.monitor = None
        if self._publishing is not None:
            self._stop_publishing.set()
            self._publish_wanted.set()
            self._publishing.join(timeout=PUBLISHER_JOIN_S)
            self._publishing = None
        if self._gpus is not None:
            self._gpus.close()
            self._gpus = None

    def tick(self) -> None:
        """Periodic work from the main loop: have a failed publish retried (by the current
        publisher thread), sweep every SWEEP_INTERVAL_S."""
        if self._publish_pending:
            self._publish_wanted.set()
        if time.monotonic() - self._last_sweep >= SWEEP_INTERVAL_S:
            self.sweep()

    def sweep(self) -> None:
        if self.state is None:
            return
        self._last_sweep = time.monotonic()
        result = self.state.sweep()
        for error in result.errors:
            _log.warning("sweep: could not clean up", error=error)

    def _publish_loop(self, monitor: health.Monitor, wanted: threading.Event, stopping: threading.Event) -> None:
        """The publisher thread: publish the monitor's current taints whenever `wanted` is set,
        until `stopping` is set; both events are this thread's own.

        The taints are read here, at publish time, by the only thread that publishes, so each
        publish carries a state at least as new as the one before: an older health state never
        overwrites a newer one, whatever order the monitor's observers ran in. A change made
        during a publish sets `wanted` again, so the newest state is always published. `stopping`
        is checked after each publish too, so a thread that outlived `stop()` ends as soon as its
        publish returns. Nothing else ends the thread: a failure is logged and retried at the next
        tick, with its traceback the first time it is seen and one line while it recurs, until a
        publish succeeds.
        """
        seen: set[str] = set()
        while not stopping.is_set():
            wanted.wait()
            if stopping.is_set():
                return
            wanted.clear()
            try:
                if self._publish(monitor.taints()):
                    seen.clear()
            except Exception as err:  # noqa: BLE001 - a bug in building the slices must not stop every later publish
                self._publish_pending = True
                failure = f"{type(err).__qualname__}: {err}"
                if failure in seen:
                    _log.warning("publishing ResourceSlices failed again; retrying at the next tick", error=failure)
                else:
                    seen.add(failure)
                    _log.exception("publishing ResourceSlices failed; retrying at the next tick", error=failure)

    def _publish(self, taints: Mapping[str, tuple[model.DeviceTaint, ...]]) -> bool:
        """Build the slices with these taints and publish them; return whether the API took them.
        When it did not, a later `tick()` retries.

        Called by `_start` before the publisher thread exists, then only by that thread.
        """
        self.slices = self._build(taints)
        assert self._publisher is not None
        try:
            self._publisher.publish(self.slices)
        except Exception as err:  # noqa: BLE001 - the API being away must not stop the node agent
            self._publish_pending = True
            _log.warning("publishing ResourceSlices failed; retrying", error=str(err))
            return False
        self._publish_pending = False
        unhealthy = sum(
            1
            for sl in self.slices
            for d in sl.devices
            if any(t.effect != model.TaintEffect.NONE.value for t in d.taints)
        )
        self.metrics.unhealthy_devices.set(unhealthy)
        return True

    def _build(self, taints: Mapping[str, tuple[model.DeviceTaint, ...]]) -> tuple[model.ResourceSlice, ...]:
        assert self._inventory is not None
        s = self.settings
        options = slices.Options(
            node_name=s.node_name,
            driver_name=s.driver_name,
            mig_mode=s.mig_mode,
            consumable_memory=s.consumable_memory,
            taints={name: found for name, found in taints.items() if found},
        )
        return slices.build(self._inventory, options=options)

    def _on_taints(self, taints: Mapping[str, tuple[model.DeviceTaint, ...]]) -> None:
        # Called on the monitor's NVML event thread: only wake the current publisher thread, which
        # reads the newest taints itself, so a slow API server cannot delay the next event.
        self._publish_wanted.set()

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

    0 after a clean shutdown; 1 with one line on `err` (stderr) when the agent cannot start.
    `agent` replaces the one built from `settings` (tests inject collaborators that way).
    """
    out = err if err is not None else sys.stderr
    configure_logging(settings.log_format, stream=out)
    stopping = stop if stop is not None else threading.Event()
    if agent is None:
        agent = Agent(settings)
    try:
        agent.start()
    except AgentError as error:
        print(f"dractl node-agent: error: {error}", file=out)
        return EXIT_FAILED
    previous = daemon.install_signal_handlers(stopping.set)
    try:
        while not stopping.wait(timeout=5.0):
            try:
                agent.tick()
            except Exception:  # noqa: BLE001 - periodic housekeeping must never take the plugin down
                _log.exception("node agent: periodic work failed; retrying at the next tick")
    finally:
        _log.info("node agent stopping")
        agent.stop()
        daemon.restore_signal_handlers(previous)
    return EXIT_OK
