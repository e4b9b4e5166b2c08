"""`dractl controller`: the control-plane process, running the selected controllers while it leads.

What it does: checks the settings (one line naming the flag, exit 2), builds the API client
(`--kubeconfig`, else in-cluster, else the default kubeconfig), a Prometheus registry with the
process-level metrics, an Event recorder, and then campaigns for a Lease (`dractl.kube.leader`).
While it leads, the controllers named by `--controllers` run (`CONTROLLERS` maps each name to
a factory). Their API client is fenced by the elector (`leader.Fence`): no write is sent once
the renew deadline has passed without a successful renewal, nor after another holder was seen
on the Lease, even in the moment before the process notices. Losing the lease
ends the process at once with exit 1, as kube-scheduler and kube-controller-manager do (the
controllers get `LOST_STOP_TIMEOUT_S` to stop; their writes are refused meanwhile, and what
they had in hand is taken over by the next leader's resync, as after a crash), so the
Deployment restarts the replica as a clean candidate; SIGTERM/SIGINT stops them (bounded),
releases the lease so a standby takes over at once, and exits 0. The controllers' requests
are paced by a token bucket (`--kube-api-qps`, `--kube-api-burst`; by default none: the API
server's priority and fairness paces them); the elector has a bucket of its own, so a busy
controller never delays a renewal. Two HTTP endpoints serve `/metrics`, and
`/healthz` + `/readyz` (one listener when both ports are equal).

Process-level metrics (the controllers add their own): `dractl_controller_leader` (1 while
this replica leads), `dractl_controller_api_errors_total{verb,resource,code}` (every request
the API server refused or did not answer, retries included; code 0 is no answer),
`dractl_controller_api_throttle_seconds_total` (seconds the controllers' requests waited for
the client-side rate limit), `dractl_controller_queue_depth{controller}` (keys waiting in each
running controller's work queue), and the standard `process_*` and `python_*` collectors.

What it must not do: decide anything about claims, pods or devices (the controllers do), talk
to the API except through `dractl.kube`, import `dractl.node`, or start a controller while
another replica leads.
"""

from __future__ import annotations

import dataclasses
import pathlib
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence, Sized
from typing import Protocol, TextIO, runtime_checkable

import prometheus_client
import prometheus_client.core
import prometheus_client.registry
import structlog

from dractl import config, daemon
from dractl.kube import client as kube_client
from dractl.kube import events, leader, ratelimit
from dractl.model.decode import common as model_names

_log = structlog.get_logger(__name__)

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

STOP_TIMEOUT_S = 10.0
"""How long the controllers get to finish the keys in hand at shutdown (all of them together)."""
LOST_STOP_TIMEOUT_S = 1.0
"""How long the controllers get to stop once the lease is lost (their writes are fenced: nothing is left to finish)."""
SERVICE_ACCOUNT_NAMESPACE = pathlib.Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
JITTER_FACTOR = 1.2
"""client-go's leader election jitter: the renew deadline must exceed retry period x 1.2."""
MAX_LEASE_DURATION_S = 2**31 - 1
"""The longest lease: the Lease's spec.leaseDurationSeconds is an int32 (and the renew deadline and retry period,
below it, stay within what thread waits accept)."""


# --- What a controller is ----------------------------------------------------------------------


class Controller(Protocol):
    """What the process runs: `ClaimController` and the scheduler have this shape.

    `start()` starts its threads and returns once its caches are synced (raising, e.g.
    TimeoutError, when they do not sync); `wait_synced(0)` answers readiness probes without
    blocking; `stop(timeout)` ends it within about `timeout` seconds and is idempotent. A stopped
    controller is never started again.
    """

    def start(self) -> None: ...

    def wait_synced(self, timeout: float | None = None) -> bool: ...

    def stop(self, timeout: float = 10.0) -> None: ...


@runtime_checkable
class _Queued(Protocol):
    """A controller with a work queue whose length is its depth (optional: it feeds the queue depth metric)."""

    @property
    def queue(self) -> Sized: ...


@dataclasses.dataclass(frozen=True, slots=True)
class Context:
    """What a controller factory gets: the process's API client, metrics registry, Event recorder and settings."""

    client: kube_client.Client
    registry: prometheus_client.CollectorRegistry
    recorder: events.Recorder
    settings: config.ControllerConfig


Factory = Callable[[Context], Controller]


def _claims(context: Context) -> Controller:
    from dractl.controller import claims

    return claims.ClaimController(
        context.client,
        registry=context.registry,
        recorder=context.recorder,
        namespace=context.settings.namespace,
        workers=context.settings.workers,
    )


def _scheduler(context: Context) -> Controller:
    from dractl.controller import scheduler

    settings = context.settings
    return scheduler.Scheduler(
        context.client,
        registry=context.registry,
        recorder=context.recorder,
        scheduler_name=settings.scheduler_name,
        policy=settings.policy,
        workers=settings.workers,
        namespace=settings.namespace,
        pod_group_apis=scheduler.served_pod_group_apis(context.client),
        topology_levels=settings.topology_levels,
    )


CONTROLLERS: dict[str, Factory] = {"claims": _claims, "scheduler": _scheduler}
"""`--controllers` names, in the order they start. Each factory builds a fresh, unstarted controller."""


# --- Settings ----------------------------------------------------------------------------------


def parse_names(text: str) -> tuple[str, ...]:
    """`--controllers` as names: comma-separated, blanks dropped, duplicates once, order kept. Pure."""
    return tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))


def check(settings: config.ControllerConfig, known: Mapping[str, Factory] | None = None) -> str | None:
    """The first problem with `settings` as one line naming the flag, or None. Pure.

    Checks what the CLI's types cannot: controller names against `known` (default `CONTROLLERS`),
    Kubernetes names and label keys, and the lease timings client-go requires (lease duration > renew deadline >
    1.2 x retry period, all positive, the lease duration an int32).
    """
    registry = CONTROLLERS if known is None else known
    listing = ", ".join(registry) or "none"
    if not settings.controllers:
        return f"--controllers: name at least one controller (known: {listing})"
    unknown = [name for name in settings.controllers if name not in registry]
    if unknown:
        return f"--controllers: unknown controller {unknown[0]!r} (known: {listing})"
    if settings.workers < 1:
        return f"--workers: must be at least 1, got {settings.workers}"
    if not settings.kube_api_qps >= 0:
        return f"--kube-api-qps: must be 0 (no limit) or more requests per second, got {settings.kube_api_qps:g}"
    if settings.kube_api_burst < 1:
        return f"--kube-api-burst: must be at least 1 request, got {settings.kube_api_burst}"
    for flag, value, rule in (
        ("--scheduler-name", settings.scheduler_name, model_names.dns_subdomain),
        ("--lease-name", settings.lease_name, model_names.dns_subdomain),
        ("--lease-namespace", settings.lease_namespace, model_names.dns_label),
        ("--namespace", settings.namespace, model_names.dns_label),
    ):
        if flag in ("--lease-namespace", "--namespace") and not value:
            continue  # Empty means "the pod's namespace" and "every namespace".
        problem = rule(value)
        if problem is not None:
            return f"{flag}: {problem}"
    for key in settings.topology_levels:
        problem = model_names.label_key(key)
        if problem is not None:
            return f"--topology-levels: {key!r} is not a node label key: {problem}"
    for flag, seconds in (
        ("--lease-duration", settings.lease_duration),
        ("--renew-deadline", settings.renew_deadline),
        ("--retry-period", settings.retry_period),
    ):
        if not seconds > 0:
            return f"{flag}: must be more than 0 seconds, got {seconds:g}"
    if settings.lease_duration > MAX_LEASE_DURATION_S:
        return (
            f"--lease-duration: at most {MAX_LEASE_DURATION_S} seconds (the Lease's spec.leaseDurationSeconds "
            f"is an int32), got {settings.lease_duration:g}"
        )
    if settings.renew_deadline >= settings.lease_duration:
        return (
            f"--renew-deadline: {settings.renew_deadline:g}s must be less than "
            f"--lease-duration ({settings.lease_duration:g}s)"
        )
    if settings.renew_deadline <= JITTER_FACTOR * settings.retry_period:
        return (
            f"--retry-period: {settings.retry_period:g}s is too long for --renew-deadline "
            f"({settings.renew_deadline:g}s): the deadline must exceed {JITTER_FACTOR:g} x the retry period"
        )
    for flag, port in (("--metrics-port", settings.metrics_port), ("--health-port", settings.health_port)):
        if not -1 <= port <= 65535:
            return f"{flag}: must be -1 (off) or a port from 0 to 65535, got {port}"
    return None


def lease_namespace(settings: config.ControllerConfig, *, account_namespace: pathlib.Path | None = None) -> str:
    """The Lease's namespace: the flag, else the pod's namespace (its service account's), else `default`."""
    if settings.lease_namespace:
        return settings.lease_namespace
    path = SERVICE_ACCOUNT_NAMESPACE if account_namespace is None else account_namespace
    try:
        found = path.read_text(encoding="utf-8").strip()
    except OSError:
        return "default"
    return found or "default"


def identity() -> str:
    """This replica's holder identity, unique per process start as client-go's (`<hostname>_<uuid>`)."""
    return f"{socket.gethostname()}_{uuid.uuid4()}"


# --- Metrics -----------------------------------------------------------------------------------


class _QueueDepth(prometheus_client.registry.Collector):
    """`dractl_controller_queue_depth{controller}`, read from the running controllers at scrape time."""

    def __init__(self, source: Callable[[], Sequence[tuple[str, Controller]]]) -> None:
        self._source = source

    def collect(self) -> Iterator[prometheus_client.core.Metric]:
        family = prometheus_client.core.GaugeMetricFamily(
            "dractl_controller_queue_depth",
            "Keys waiting in each running controller's work queue.",
            labels=["controller"],
        )
        for name, controller in self._source():
            if isinstance(controller, _Queued):
                family.add_metric([name], float(len(controller.queue)))
        yield family


@dataclasses.dataclass(frozen=True, slots=True)
class ProcessMetrics:
    """The process-level metrics, in `registry` (which the controllers share)."""

    registry: prometheus_client.CollectorRegistry
    leader: prometheus_client.Gauge
    api_errors: prometheus_client.Counter
    api_throttle: prometheus_client.Counter

    @classmethod
    def create(
        cls,
        registry: prometheus_client.CollectorRegistry | None = None,
        *,
        running: Callable[[], Sequence[tuple[str, Controller]]] = lambda: (),
        standard: bool = True,
    ) -> ProcessMetrics:
        """Register the metrics in `registry` (a new one when None); `running` lists the running controllers for
        the queue depth; `standard` adds the `process_*`, `python_gc_*` and `python_info` collectors."""
        registry = prometheus_client.CollectorRegistry() if registry is None else registry
        if standard:
            daemon.standard_collectors(registry)
        registry.register(_QueueDepth(running))
        return cls(
            registry=registry,
            leader=prometheus_client.Gauge(
                "dractl_controller_leader",
                "1 while this replica leads (runs the controllers), else 0.",
                registry=registry,
            ),
            api_errors=prometheus_client.Counter(
                "dractl_controller_api_errors",
                "Requests the API server refused or did not answer, by verb, resource and HTTP code (0: no answer).",
                ["verb", "resource", "code"],
                registry=registry,
            ),
            api_throttle=prometheus_client.Counter(
                "dractl_controller_api_throttle_seconds",
                "Seconds the controllers' requests waited for the client-side rate limit (--kube-api-qps, "
                "--kube-api-burst); steady growth means the limit holds them back.",
                registry=registry,
            ),
        )


class CountingClient(kube_client.Client):
    """A `kube.client.Client` that counts every failed request in `api_errors{verb, resource, code}`.

    It shares `base`'s connection pool, auth, field manager and (unless given `limiter`) rate
    limiter; `attempts` and `timeout` may differ (the leader elector's requests are short and not
    retried, so a renewal cannot outlive its deadline), and `fence` guards its writes (None:
    unguarded). Errors raised while a watch streams are the informers' business and not counted.
    Its `on_error` is the counter alone: a hook `base` has is not called.
    """

    def __init__(
        self,
        base: kube_client.Client,
        *,
        errors: prometheus_client.Counter,
        attempts: int | None = None,
        timeout: float | None = None,
        limiter: kube_client.RateLimiter | None = None,
        fence: kube_client.WriteFence | None = None,
    ) -> None:
        def count(verb: str, resource: kube_client.Resource, error: kube_client.ApiError) -> None:
            errors.labels(verb=verb, resource=resource.plural, code=str(error.status)).inc()

        super().__init__(
            base.api_client,
            field_manager=base.field_manager,
            attempts=base.attempts if attempts is None else attempts,
            timeout=base.timeout if timeout is None else timeout,
            on_error=count,
            limiter=base.limiter if limiter is None else limiter,
            fence=fence,
            sleep=base.sleep,
        )


# --- The supervisor ----------------------------------------------------------------------------


class Campaign(Protocol):
    """`leader.Elector` in production: campaign until `stop`, calling back on gaining and losing the lease."""

    def run(
        self,
        stop: threading.Event,
        *,
        on_started: Callable[[], None],
        on_stopped: Callable[[], None],
        on_step: Callable[[bool], None] | None = None,
    ) -> None: ...


class Supervisor:
    """Runs the controllers while this replica leads; `run(stop)` returns the process's exit code.

    Collaborators: `controllers` are (name, builder) pairs, built and started in order once this
    replica leads (at once when `elector` is None: no leader election); `elector` campaigns on its
    own thread, and its callbacks only record what happened and wake the main loop, so a slow
    controller start never delays a renewal. Invariants: controllers are built at most once per
    process (losing the lease ends the process); they are stopped before the lease is released,
    so a successor never runs beside them; `stop` (or `request_stop`) stops them within about
    `stop_timeout` seconds and exits 0; losing the lease (the controllers get `LOST_STOP_TIMEOUT_S`
    then: the fence refuses their writes already), a controller that cannot start, or an
    elector that dies exits 1. `healthz` and `readyz` may be called from any thread.
    """

    def __init__(
        self,
        *,
        controllers: Sequence[tuple[str, Callable[[], Controller]]],
        elector: Campaign | None,
        metrics: ProcessMetrics,
        liveness_window: float,
        stop_timeout: float = STOP_TIMEOUT_S,
        poll: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._builders = tuple(controllers)
        self._elector = elector
        self._metrics = metrics
        self._liveness_window = liveness_window
        self._stop_timeout = stop_timeout
        self._poll = poll
        self._clock = clock
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._external = threading.Event()
        self._elector_stop = threading.Event()
        self._elector_thread: threading.Thread | None = None
        self._leading = elector is None
        self._lost = False
        self._phase = "waiting"  # waiting -> starting -> running -> stopping
        self._running: list[tuple[str, Controller]] = []
        self._beat = clock()

    # --- What probes and metrics read ------------------------------------------------------------

    def running(self) -> list[tuple[str, Controller]]:
        """The controllers built so far, by name (a snapshot)."""
        with self._lock:
            return list(self._running)

    @property
    def leading(self) -> bool:
        with self._lock:
            return self._leading and not self._lost

    def healthz(self) -> daemon.Answer:
        """200 while the process's loops run: the leader election loop has stepped within the liveness window."""
        problems: list[str] = []
        if self._elector is not None:
            with self._lock:
                age = self._clock() - self._beat
                thread = self._elector_thread
                stopping = self._phase == "stopping"
            if age > self._liveness_window:
                problems.append(f"the leader election loop has not run for {age:.0f}s")
            if thread is not None and not thread.is_alive() and not stopping:
                problems.append("the leader election loop has ended")
        if problems:
            _log.warning("liveness: the process is wedged", problems=problems)
            return 503, daemon.TEXT, "".join(f"{problem}\n" for problem in problems)
        return 200, daemon.TEXT, "ok\n"

    def readyz(self) -> daemon.Answer:
        """200 for a standby replica and for the leader once every controller is synced; 503 otherwise."""
        with self._lock:
            phase, leading, running = self._phase, self._leading and not self._lost, list(self._running)
        if phase == "stopping":
            return 503, daemon.TEXT, "shutting down\n"
        if not leading:
            return 200, daemon.TEXT, "standby: another replica leads\n"
        if phase != "running":
            return 503, daemon.TEXT, "leading, starting the controllers\n"
        unsynced = [name for name, controller in running if not controller.wait_synced(0)]
        if unsynced:
            return 503, daemon.TEXT, f"not synced: {', '.join(unsynced)}\n"
        return 200, daemon.TEXT, f"{'leader' if self._elector is not None else 'running'}: {self._names()} synced\n"

    def _names(self) -> str:
        return ", ".join(name for name, _ in self._builders)

    # --- Elector callbacks (its thread): record and wake, nothing more ----------------------------

    def _on_started(self) -> None:
        _log.info("became the leader; starting the controllers", controllers=self._names())
        self._metrics.leader.set(1)
        with self._lock:
            self._leading = True
        self._wake.set()

    def _on_stopped(self) -> None:
        self._metrics.leader.set(0)
        with self._lock:
            self._leading = False
            if not self._elector_stop.is_set():
                self._lost = True  # Not asked to stop: the lease was lost.
        self._wake.set()

    def _on_step(self, leading: bool) -> None:
        with self._lock:
            self._beat = self._clock()

    def _campaign(self) -> None:
        assert self._elector is not None
        try:
            self._elector.run(
                self._elector_stop, on_started=self._on_started, on_stopped=self._on_stopped, on_step=self._on_step
            )
        except Exception:  # noqa: BLE001 (a dead elector must end the process, not leave it leading blindly)
            _log.exception("leader election failed")
            self._metrics.leader.set(0)
            with self._lock:
                self._lost = True
            self._wake.set()

    # --- The main loop --------------------------------------------------------------------------

    def _stopping(self) -> bool:
        return self._stop.is_set() or self._external.is_set()

    def request_stop(self) -> None:
        """Ask `run` to stop the controllers, release the lease and return 0. Safe from a signal handler."""
        self._stop.set()
        self._wake.set()

    def run(self, stop: threading.Event | None = None) -> int:
        """Campaign and run the controllers while leading, until stopped or the lease is lost; the exit code."""
        if stop is not None:
            self._external = stop
        if self._elector is None:
            self._metrics.leader.set(1)
        else:
            with self._lock:
                self._beat = self._clock()
            self._elector_thread = threading.Thread(target=self._campaign, name="leader-election", daemon=True)
            self._elector_thread.start()
        code = EXIT_OK
        stop_timeout = self._stop_timeout
        try:
            while True:
                self._wake.clear()  # Cleared before reading the state: a wake-up after this is never missed.
                if self._stopping():
                    _log.info("stopping: asked to")
                    break
                with self._lock:
                    leading, lost, phase = self._leading, self._lost, self._phase
                if lost:
                    _log.error("leader election lost; stopping the controllers and exiting so the replica restarts")
                    code = EXIT_FAILED
                    stop_timeout = LOST_STOP_TIMEOUT_S
                    break
                if leading and phase == "waiting":
                    if not self._start_all():
                        code = EXIT_FAILED
                        break
                    continue
                self._wake.wait(self._poll)
        finally:
            self._shutdown(stop_timeout)
        return code

    def _start_all(self) -> bool:
        with self._lock:
            self._phase = "starting"
        for name, build in self._builders:
            try:
                controller = build()
                with self._lock:
                    self._running.append((name, controller))
                controller.start()
            except Exception as error:  # noqa: BLE001 (any failure to start is reported in one line and exits 1)
                _log.error("a controller did not start", controller=name, error=" ".join(str(error).split()))
                return False
            if self._stopping():
                return True  # The main loop stops what started.
        with self._lock:
            self._phase = "running"
        _log.info("controllers started", controllers=self._names())
        return True

    def _shutdown(self, timeout: float) -> None:
        """Stop the controllers (within about `timeout` seconds, last started first), then the elector, which
        releases the lease if it still holds it."""
        with self._lock:
            self._phase = "stopping"
            running = list(self._running)
        deadline = self._clock() + timeout
        for name, controller in reversed(running):
            remaining = max(0.1, (deadline - self._clock()) / max(1, len(running)))
            try:
                controller.stop(remaining)
            except Exception:  # noqa: BLE001 (one controller failing to stop must not keep the lease held)
                _log.exception("a controller did not stop cleanly", controller=name)
        if running:
            _log.info("controllers stopped", controllers=self._names())
        if self._elector_thread is not None:
            self._elector_stop.set()
            self._elector_thread.join(self._liveness_window)
            if self._elector_thread.is_alive():
                _log.warning("the leader election loop did not end in time; the lease expires on its own")
        self._metrics.leader.set(0)


# --- The process -------------------------------------------------------------------------------


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def run(
    settings: config.ControllerConfig,
    *,
    err: TextIO | None = None,
    stop: threading.Event | None = None,
    factories: Mapping[str, Factory] | None = None,
) -> int:
    """Run `dractl controller` until SIGTERM/SIGINT (or `stop`), or until the lease is lost; the exit code.

    0 after a clean stop (controllers stopped, lease released); 1 when the lease is lost, the
    client cannot be built, a port cannot be bound or a controller cannot start (one line on
    `err`, stderr, for the last three); 2 with one line naming the flag when a setting is bad.
    `factories` replaces `CONTROLLERS` (tests).
    """
    out = err if err is not None else sys.stderr
    known = CONTROLLERS if factories is None else factories
    problem = check(settings, known)
    if problem is not None:
        print(f"dractl controller: error: {problem}", file=out)
        return EXIT_USAGE
    daemon.configure_logging(settings.log_format, stream=out)
    undo_logging = daemon.capture_stdlib_logging(settings.log_format, stream=out)
    try:
        return _run(settings, known=known, out=out, stop=stop)
    finally:
        undo_logging()


def _run(
    settings: config.ControllerConfig, *, known: Mapping[str, Factory], out: TextIO, stop: threading.Event | None
) -> int:
    me = identity()
    holder: list[Supervisor] = []
    metrics = ProcessMetrics.create(running=lambda: holder[0].running() if holder else [])
    try:
        base = kube_client.connect(
            settings.kubeconfig,
            limiter=ratelimit.TokenBucket(
                settings.kube_api_qps, settings.kube_api_burst, on_wait=metrics.api_throttle.inc
            ),
        )
    except Exception as error:  # noqa: BLE001 (whatever the kubeconfig's problem, it is one line)
        where = (
            f"kubeconfig {settings.kubeconfig}"
            if settings.kubeconfig is not None
            else "the in-cluster config or $KUBECONFIG"
        )
        print(f"dractl controller: error: cannot build a Kubernetes client from {where}: {_one_line(error)}", file=out)
        return EXIT_FAILED
    elector: leader.Elector | None = None
    lease = ""
    if settings.leader_elect:
        namespace = lease_namespace(settings)
        lease = f"{namespace}/{settings.lease_name}"
        # Short, unretried requests: a renewal that hangs must not outlive the renew deadline (client-go
        # bounds it the same way), or this replica would go on leading after a successor took over. Its own
        # bucket, as client-go's leader election has its own client: the controllers' requests never delay it.
        elector_client = CountingClient(
            base,
            errors=metrics.api_errors,
            attempts=1,
            timeout=max(0.5, settings.renew_deadline / 2),
            limiter=ratelimit.TokenBucket(settings.kube_api_qps, settings.kube_api_burst),
        )
        elector = leader.Elector(
            elector_client,
            leader.Config(
                namespace=namespace,
                name=settings.lease_name,
                identity=me,
                # In a pod the hostname is the pod's name: the Lease then names the pod, so a successor takes over
                # at once once it is gone (the Elector checks that such a pod exists in the Lease's namespace).
                pod=socket.gethostname() if SERVICE_ACCOUNT_NAMESPACE.exists() else "",
                lease_duration=settings.lease_duration,
                renew_deadline=settings.renew_deadline,
                retry_period=settings.retry_period,
            ),
        )
    # Every write of the controllers (Events included) is checked against the lease just before it is sent.
    api = CountingClient(base, errors=metrics.api_errors, fence=elector.fence if elector is not None else None)
    context = Context(
        client=api,
        registry=metrics.registry,
        recorder=events.Recorder(api, host=socket.gethostname()),
        settings=settings,
    )
    supervisor = Supervisor(
        controllers=[(name, _bind(known[name], context)) for name in settings.controllers],
        elector=elector,
        metrics=metrics,
        liveness_window=settings.lease_duration + settings.renew_deadline,
    )
    holder.append(supervisor)
    try:
        endpoints = _serve(settings, metrics=metrics, supervisor=supervisor)
    except OSError as error:
        print(f"dractl controller: error: {_one_line(error)}", file=out)
        base.close()
        return EXIT_FAILED
    stopping = stop if stop is not None else threading.Event()

    def on_signal() -> None:
        stopping.set()
        supervisor.request_stop()

    previous = daemon.install_signal_handlers(on_signal)
    _log.info(
        "controller started",
        identity=me,
        controllers=",".join(settings.controllers),
        lease=lease or None,
        namespace=settings.namespace or None,
        metrics_port=endpoints.metrics_port,
        health_port=endpoints.health_port,
    )
    try:
        code = supervisor.run(stopping)
    finally:
        endpoints.stop()
        daemon.restore_signal_handlers(previous)
        base.close()
    _log.info("controller stopped", exit_code=code)
    return code


def _bind(factory: Factory, context: Context) -> Callable[[], Controller]:
    return lambda: factory(context)


@dataclasses.dataclass(slots=True)
class _Endpoints:
    servers: list[daemon.HttpEndpoint]
    metrics_port: int | None = None
    health_port: int | None = None

    def stop(self) -> None:
        for server in self.servers:
            server.stop()
        self.servers.clear()


def _endpoint(*, port: int, routes: dict[str, daemon.Route], name: str, flag: str) -> daemon.HttpEndpoint:
    """Listen on `port`; a port that cannot be had raises OSError whose message names the paths, the port and the
    flag that set it, as the node agent's does."""
    try:
        return daemon.HttpEndpoint(port=port, routes=routes, name=name)
    except OSError as error:
        raise OSError(
            f"cannot serve {', '.join(routes)} on port {port} ({flag} {port}): {error.strerror or error}; "
            f"choose another with {flag}, or -1 to turn it off"
        ) from error


def _serve(settings: config.ControllerConfig, *, metrics: ProcessMetrics, supervisor: Supervisor) -> _Endpoints:
    """Start the endpoints: /metrics on the metrics port, /healthz and /readyz on the health port (one listener
    when the ports are equal and not 0; -1 turns one off). Raises OSError, with nothing left running."""
    registry = metrics.registry
    metric_routes: dict[str, daemon.Route] = {"/metrics": lambda: daemon.metrics_page(registry)}
    health_routes: dict[str, daemon.Route] = {"/healthz": supervisor.healthz, "/readyz": supervisor.readyz}
    found = _Endpoints(servers=[])
    try:
        if settings.metrics_port == settings.health_port and settings.metrics_port > 0:
            shared = {**metric_routes, **health_routes}
            server = _endpoint(port=settings.metrics_port, routes=shared, name="http", flag="--metrics-port")
            found.servers.append(server)
            found.metrics_port = found.health_port = server.port
            return found
        if settings.metrics_port >= 0:
            server = _endpoint(port=settings.metrics_port, routes=metric_routes, name="metrics", flag="--metrics-port")
            found.servers.append(server)
            found.metrics_port = server.port
        if settings.health_port >= 0:
            server = _endpoint(port=settings.health_port, routes=health_routes, name="health", flag="--health-port")
            found.servers.append(server)
            found.health_port = server.port
    except OSError:
        found.stop()
        raise
    return found
