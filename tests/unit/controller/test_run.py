"""`dractl controller`'s process: flags and settings, one-line errors, and the supervisor's lifecycle.

The supervisor runs with a fake elector and fake controllers that record what happens to them in
one shared log, so the tests can assert the order: built, started, stopped, lease released.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import io
import json
import logging
import pathlib
import queue
import re
import socket
import threading
from typing import Any

import controlplane
import prometheus_client
import pytest
from click.testing import CliRunner
from support import observe

from dractl import cli, config, daemon
from dractl.controller import run
from dractl.kube import client as kube_client
from dractl.kube import leader

FLAGS = {
    "--kubeconfig": "DRACTL_KUBECONFIG",
    "--kube-api-qps": "DRACTL_KUBE_API_QPS",
    "--kube-api-burst": "DRACTL_KUBE_API_BURST",
    "--controllers": "DRACTL_CONTROLLERS",
    "--scheduler-name": "DRACTL_SCHEDULER_NAME",
    "--policy": "DRACTL_POLICY",
    "--workers": "DRACTL_WORKERS",
    "--namespace": "DRACTL_NAMESPACE",
    "--leader-elect": "DRACTL_LEADER_ELECT",
    "--lease-name": "DRACTL_LEASE_NAME",
    "--lease-namespace": "DRACTL_LEASE_NAMESPACE",
    "--lease-duration": "DRACTL_LEASE_DURATION",
    "--renew-deadline": "DRACTL_RENEW_DEADLINE",
    "--retry-period": "DRACTL_RETRY_PERIOD",
    "--metrics-port": "DRACTL_METRICS_PORT",
    "--health-port": "DRACTL_HEALTH_PORT",
    "--log-format": "DRACTL_LOG_FORMAT",
}


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> list[config.ControllerConfig]:
    """The settings the CLI hands to `run.run` (which is replaced: nothing connects to a cluster)."""
    seen: list[config.ControllerConfig] = []

    def fake_run(settings: config.ControllerConfig, **_: Any) -> int:
        seen.append(settings)
        return 0

    monkeypatch.setattr(run, "run", fake_run)
    return seen


def _invoke(*args: str, env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(cli.main, ["controller", *args], env=env, catch_exceptions=False)


# --- Flags ---------------------------------------------------------------------------------------


def test_every_flag_states_its_default_and_env_var() -> None:
    """Guards: each controller flag is listed with its DRACTL_ variable and a stated default."""
    result = CliRunner().invoke(cli.main, ["controller", "--help"], terminal_width=200)
    assert result.exit_code == 0
    text = " ".join(result.stdout.split())
    # "--leader-elect / --no-leader-elect" is one flag pair: split only where a flag starts a new entry.
    blocks = re.split(r"(?<!/)\s(?=--[a-z])", text.split("Options:", 1)[1])
    described = {block.split(" ", 1)[0]: block for block in blocks}
    for flag, env in FLAGS.items():
        assert flag in described, flag
        assert f"env var: {env}" in described[flag] and "(default:" in described[flag], flag


def test_defaults_reach_the_settings(captured: list[config.ControllerConfig]) -> None:
    """Guards: with no flag and no env var the settings are ControllerConfig's defaults."""
    result = _invoke(env={name: "" for name in FLAGS.values()} | {"DRACTL_LEADER_ELECT": ""})
    assert result.exit_code == 0, result.stderr
    assert captured == [config.ControllerConfig()]
    assert captured[0].controllers == ("scheduler",) and captured[0].leader_elect


def test_flags_reach_the_settings(captured: list[config.ControllerConfig], tmp_path: pathlib.Path) -> None:
    """Guards: every flag lands in its ControllerConfig field; --controllers drops blanks and repeats, keeps order."""
    kubeconfig = tmp_path / "kubeconfig"
    result = _invoke(
        "--kubeconfig",
        str(kubeconfig),
        "--kube-api-qps",
        "12.5",
        "--kube-api-burst",
        "30",
        "--controllers",
        " claims, ,claims",
        "--scheduler-name",
        "gpu-sched",
        "--policy",
        "first-fit",
        "--topology-levels",
        " block, rack,,kubernetes.io/hostname",
        "--workers",
        "7",
        "--namespace",
        "team-a",
        "--no-leader-elect",
        "--lease-name",
        "lease-x",
        "--lease-namespace",
        "ops",
        "--lease-duration",
        "6",
        "--renew-deadline",
        "4",
        "--retry-period",
        "0.5",
        "--metrics-port",
        "9100",
        "--health-port",
        "-1",
        "--log-format",
        "console",
    )
    assert result.exit_code == 0, result.stderr
    assert captured == [
        config.ControllerConfig(
            kubeconfig=kubeconfig,
            kube_api_qps=12.5,
            kube_api_burst=30,
            controllers=("claims",),
            scheduler_name="gpu-sched",
            policy=config.Policy.FIRST_FIT,
            topology_levels=("block", "rack", "kubernetes.io/hostname"),
            workers=7,
            namespace="team-a",
            leader_elect=False,
            lease_name="lease-x",
            lease_namespace="ops",
            lease_duration=6.0,
            renew_deadline=4.0,
            retry_period=0.5,
            metrics_port=9100,
            health_port=-1,
            log_format=config.LogFormat.CONSOLE,
        )
    ]


def test_env_vars_set_the_flags(captured: list[config.ControllerConfig]) -> None:
    """Guards: each DRACTL_ variable acts like its flag (booleans included)."""
    env = {
        "DRACTL_KUBE_API_QPS": "200",
        "DRACTL_KUBE_API_BURST": "400",
        "DRACTL_CONTROLLERS": "claims",
        "DRACTL_SCHEDULER_NAME": "other",
        "DRACTL_POLICY": "first-fit",
        "DRACTL_TOPOLOGY_LEVELS": "rack",
        "DRACTL_WORKERS": "3",
        "DRACTL_NAMESPACE": "ns1",
        "DRACTL_LEADER_ELECT": "false",
        "DRACTL_LEASE_NAME": "l1",
        "DRACTL_LEASE_NAMESPACE": "ns2",
        "DRACTL_LEASE_DURATION": "30",
        "DRACTL_RENEW_DEADLINE": "20",
        "DRACTL_RETRY_PERIOD": "5",
        "DRACTL_METRICS_PORT": "0",
        "DRACTL_HEALTH_PORT": "0",
        "DRACTL_LOG_FORMAT": "json",
    }
    result = _invoke(env=env)
    assert result.exit_code == 0, result.stderr
    (settings,) = captured
    assert (settings.scheduler_name, settings.policy, settings.workers, settings.namespace) == (
        "other",
        config.Policy.FIRST_FIT,
        3,
        "ns1",
    )
    assert (settings.leader_elect, settings.lease_name, settings.lease_namespace) == (False, "l1", "ns2")
    assert (settings.lease_duration, settings.renew_deadline, settings.retry_period) == (30.0, 20.0, 5.0)
    assert (settings.metrics_port, settings.health_port, settings.log_format) == (0, 0, config.LogFormat.JSON)
    assert (settings.kube_api_qps, settings.kube_api_burst) == (200.0, 400)
    assert settings.topology_levels == ("rack",)


BAD = {
    "workers-zero": (["--workers", "0"], "--workers"),
    "workers-text": (["--workers", "many"], "--workers"),
    "kube-api-qps-negative": (["--kube-api-qps", "-1"], "--kube-api-qps"),
    "kube-api-qps-text": (["--kube-api-qps", "fast"], "--kube-api-qps"),
    "kube-api-burst-zero": (["--kube-api-burst", "0"], "--kube-api-burst"),
    "policy": (["--policy", "best"], "--policy"),
    "unknown-option": (["--frobnicate"], "--frobnicate"),
    "lease-duration-negative": (["--lease-duration", "-1"], "--lease-duration"),
    "retry-period-zero": (["--retry-period", "0"], "--retry-period"),
    "lease-duration-infinite": (["--lease-duration", "inf"], "--lease-duration"),
    "lease-duration-above-int32": (["--lease-duration", "2147483648", "--renew-deadline", "1e9"], "--lease-duration"),
    "port-range": (["--metrics-port", "70000"], "--metrics-port"),
    "log-format": (["--log-format", "xml"], "--log-format"),
    "unknown-controller": (["--controllers", "claims,sched"], "--controllers"),
    "no-controller": (["--controllers", " , "], "--controllers"),
    "renew-not-below-lease": (["--lease-duration", "5", "--renew-deadline", "5"], "--renew-deadline"),
    "retry-too-long": (["--renew-deadline", "3", "--retry-period", "2.5"], "--retry-period"),
    "scheduler-name": (["--scheduler-name", "Not A Name"], "--scheduler-name"),
    "lease-name": (["--lease-name", "bad/name"], "--lease-name"),
    "lease-namespace": (["--lease-namespace", "Bad"], "--lease-namespace"),
    "namespace": (["--namespace", "a.b"], "--namespace"),
    "topology-levels": (["--topology-levels", "rack,not a key"], "--topology-levels"),
}


@pytest.mark.parametrize(("args", "flag"), list(BAD.values()), ids=list(BAD))
def test_a_bad_value_is_one_line_naming_the_flag_and_exit_2(args: list[str], flag: str) -> None:
    """Guards: every bad flag value is refused before anything starts: one stderr line naming the flag, exit 2."""
    result = _invoke(*args, "--kubeconfig", "/nonexistent/kubeconfig")
    assert result.exit_code == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("dractl controller: error: ") and flag in lines[0]
    assert result.stdout == "" and "Traceback" not in result.stderr


def test_a_bad_env_var_is_reported_like_its_flag() -> None:
    """Guards: a bad value from DRACTL_RENEW_DEADLINE is one line naming --renew-deadline, exit 2."""
    result = _invoke(env={"DRACTL_RENEW_DEADLINE": "99"})
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and "--renew-deadline" in result.stderr


def test_a_missing_kubeconfig_is_one_line_naming_it_and_exit_1(tmp_path: pathlib.Path) -> None:
    """Guards: a --kubeconfig that does not exist is one error line naming the file, exit 1, nothing served."""
    missing = tmp_path / "no-such-kubeconfig"
    result = _invoke("--kubeconfig", str(missing), "--metrics-port", "-1", "--health-port", "-1")
    assert result.exit_code == 1
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("dractl controller: error: cannot build a Kubernetes client")
    assert str(missing) in lines[0]


# --- Pure helpers ------------------------------------------------------------------------------


def test_check_accepts_the_defaults_and_names_registered_by_others() -> None:
    """Guards: the defaults pass; a name is accepted exactly when the factory mapping has it."""
    assert run.check(config.ControllerConfig()) is None
    both = config.ControllerConfig(controllers=("claims", "scheduler"))
    assert run.check(both) is None
    assert run.check(both, {"claims": run.CONTROLLERS["claims"]}) == (
        "--controllers: unknown controller 'scheduler' (known: claims)"
    )
    assert run.check(both, {}) == "--controllers: unknown controller 'claims' (known: none)"


def test_check_refuses_a_rate_limit_that_would_never_send() -> None:
    """Guards: settings built without the CLI get the same one-line answer for a negative QPS or a burst below 1;
    QPS 0 (no limit, the default) passes."""
    assert run.check(config.ControllerConfig(kube_api_qps=-1)) == (
        "--kube-api-qps: must be 0 (no limit) or more requests per second, got -1"
    )
    assert run.check(config.ControllerConfig(kube_api_qps=0)) is None
    assert run.check(config.ControllerConfig(kube_api_burst=0)) == "--kube-api-burst: must be at least 1 request, got 0"


def test_parse_names_keeps_order_and_drops_blanks_and_repeats() -> None:
    """Guards: "b, a,,b " is ("b", "a"): the start order is the order given."""
    assert run.parse_names("b, a,,b ") == ("b", "a")
    assert run.parse_names(" , ") == ()


def test_lease_namespace_comes_from_the_flag_then_the_service_account_then_default(tmp_path: pathlib.Path) -> None:
    """Guards: --lease-namespace wins; else the pod's service account namespace; else `default`."""
    account = tmp_path / "namespace"
    assert run.lease_namespace(config.ControllerConfig(), account_namespace=account) == "default"
    account.write_text("dractl-system\n")
    assert run.lease_namespace(config.ControllerConfig(), account_namespace=account) == "dractl-system"
    flagged = config.ControllerConfig(lease_namespace="ops")
    assert run.lease_namespace(flagged, account_namespace=account) == "ops"


def test_identity_is_unique_per_process_start() -> None:
    """Guards: two identities differ (a restarted replica is a new candidate, as in client-go)."""
    assert run.identity() != run.identity()


def test_api_errors_are_counted_by_verb_resource_and_code(tmp_path: pathlib.Path) -> None:
    """Guards: a request that gets no answer is counted once per call in api_errors{verb, resource, code="0"}."""
    metrics = run.ProcessMetrics.create(standard=False)
    base = kube_client.connect(controlplane.unreachable_kubeconfig(tmp_path / "kubeconfig"), attempts=1)
    api = run.CountingClient(base, errors=metrics.api_errors, timeout=2)
    try:
        for _ in range(2):
            with pytest.raises(kube_client.Transient):
                api.get(kube_client.PODS, "p", namespace="ns")
        with pytest.raises(kube_client.Transient):
            api.patch(kube_client.RESOURCE_CLAIMS, "c", {"status": {}}, namespace="ns", subresource="status")
    finally:
        base.close()
    sample = metrics.registry.get_sample_value
    assert sample("dractl_controller_api_errors_total", {"verb": "get", "resource": "pods", "code": "0"}) == 2
    assert (
        sample("dractl_controller_api_errors_total", {"verb": "patch", "resource": "resourceclaims", "code": "0"}) == 1
    )


# --- The supervisor ----------------------------------------------------------------------------


class FakeController:
    """Records start/stop in the shared log; `start()` may fail; `synced` answers wait_synced."""

    def __init__(self, name: str, log: list[str], *, fail: Exception | None = None) -> None:
        self.name = name
        self.log = log
        self.fail = fail
        self.synced = True
        self.queue: list[str] = []
        self.stop_timeouts: list[float] = []

    def start(self) -> None:
        self.log.append(f"start {self.name}")
        if self.fail is not None:
            raise self.fail

    def wait_synced(self, timeout: float | None = None) -> bool:
        return self.synced

    def stop(self, timeout: float = 10.0) -> None:
        assert timeout > 0
        self.log.append(f"stop {self.name}")
        self.stop_timeouts.append(timeout)


class FakeElector:
    """Leads, loses or crashes when the test says so; releases on stop when leading, as `leader.Elector.run`."""

    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.commands: queue.Queue[str] = queue.Queue()
        self.steps = True
        self.lock = threading.Lock()  # held while stepping, so turning `steps` off takes effect at once

    def run(
        self,
        stop: threading.Event,
        *,
        on_started: collections.abc.Callable[[], None],
        on_stopped: collections.abc.Callable[[], None],
        on_step: collections.abc.Callable[[bool], None] | None = None,
    ) -> None:
        leading = False
        try:
            while not stop.is_set():
                try:
                    command = self.commands.get(timeout=0.01)
                except queue.Empty:
                    with self.lock:
                        if on_step is not None and self.steps:
                            on_step(leading)
                    continue
                if command == "lead":
                    leading = True
                    on_started()
                elif command == "lose":
                    leading = False
                    on_stopped()
                elif command == "crash":
                    raise RuntimeError("the elector broke")
        finally:
            if leading:
                self.log.append("release")
                on_stopped()


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@dataclasses.dataclass
class Harness:
    """A supervisor running in a thread with fakes around it."""

    supervisor: run.Supervisor
    log: list[str]
    controllers: dict[str, FakeController]
    metrics: run.ProcessMetrics
    thread: threading.Thread
    result: list[int]

    def wait(self, predicate: collections.abc.Callable[[], bool], what: str) -> None:
        controlplane.wait_until(predicate, what=what, timeout=20)

    def finish(self) -> int:
        self.thread.join(timeout=20)
        assert not self.thread.is_alive(), "the supervisor did not return"
        return self.result[0]

    @property
    def leader_gauge(self) -> float | None:
        return self.metrics.registry.get_sample_value("dractl_controller_leader")


def _harness(
    *,
    elector: FakeElector | None,
    log: list[str],
    fail: dict[str, Exception] | None = None,
    clock: FakeClock | None = None,
) -> Harness:
    controllers: dict[str, FakeController] = {}
    holder: list[run.Supervisor] = []
    metrics = run.ProcessMetrics.create(standard=False, running=lambda: holder[0].running())

    def builder(name: str) -> collections.abc.Callable[[], run.Controller]:
        def build() -> run.Controller:
            log.append(f"build {name}")
            controllers[name] = FakeController(name, log, fail=(fail or {}).get(name))
            return controllers[name]

        return build

    supervisor = run.Supervisor(
        controllers=[(name, builder(name)) for name in ("claims", "scheduler")],
        elector=elector,
        metrics=metrics,
        liveness_window=25.0,
        poll=0.05,
        clock=clock or FakeClock(),
    )
    holder.append(supervisor)
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(supervisor.run()), daemon=True)
    thread.start()
    return Harness(supervisor, log, controllers, metrics, thread, result)


def test_without_leader_election_the_controllers_run_at_once_and_stop_in_reverse() -> None:
    """Guards: --no-leader-elect starts every controller in order, is ready once synced, and a stop request
    stops them last-started first and exits 0."""
    log: list[str] = []
    h = _harness(elector=None, log=log)
    h.wait(lambda: h.supervisor.readyz()[0] == 200, "the controllers are started and synced")
    assert log == ["build claims", "start claims", "build scheduler", "start scheduler"]
    assert h.leader_gauge == 1
    h.supervisor.request_stop()
    assert h.finish() == run.EXIT_OK
    assert log[4:] == ["stop scheduler", "stop claims"]
    assert h.leader_gauge == 0


def test_a_standby_builds_nothing_is_ready_and_starts_the_controllers_once_it_leads() -> None:
    """Guards: no controller exists before the lease is held; a standby is ready; leading starts them all."""
    log: list[str] = []
    elector = FakeElector(log)
    h = _harness(elector=elector, log=log)
    assert h.supervisor.readyz() == (200, "text/plain; charset=utf-8", "standby: another replica leads\n")
    assert log == [] and h.leader_gauge == 0
    elector.commands.put("lead")
    h.wait(lambda: h.supervisor.readyz()[0] == 200 and "leader" in h.supervisor.readyz()[2], "it leads, synced")
    assert log == ["build claims", "start claims", "build scheduler", "start scheduler"]
    assert h.leader_gauge == 1 and h.supervisor.leading
    h.controllers["claims"].synced = False
    assert h.supervisor.readyz()[:2] == (503, "text/plain; charset=utf-8")
    assert "not synced: claims" in h.supervisor.readyz()[2]
    h.supervisor.request_stop()
    assert h.finish() == run.EXIT_OK


def test_stopping_stops_the_controllers_before_the_lease_is_released() -> None:
    """Guards: on SIGTERM the controllers are stopped first and the lease released after, then exit 0,
    so a successor never runs beside this replica's controllers."""
    log: list[str] = []
    elector = FakeElector(log)
    h = _harness(elector=elector, log=log)
    elector.commands.put("lead")
    h.wait(lambda: "start scheduler" in log, "the controllers started")
    h.supervisor.request_stop()
    assert h.finish() == run.EXIT_OK
    assert log[-3:] == ["stop scheduler", "stop claims", "release"]
    assert h.leader_gauge == 0


def test_losing_the_lease_stops_the_controllers_and_exits_1() -> None:
    """Guards: a lost lease (not asked to stop) exits 1 at once, so the pod restarts: every controller is told to
    stop but given only the short lost-lease bound (the fence refuses their writes already), not the drain of a
    clean stop."""
    log: list[str] = []
    elector = FakeElector(log)
    h = _harness(elector=elector, log=log)
    elector.commands.put("lead")
    h.wait(lambda: "start scheduler" in log, "the controllers started")
    elector.commands.put("lose")
    assert h.finish() == run.EXIT_FAILED
    assert log[-2:] == ["stop scheduler", "stop claims"] and "release" not in log
    assert h.leader_gauge == 0
    timeouts = [*h.controllers["scheduler"].stop_timeouts, *h.controllers["claims"].stop_timeouts]
    assert len(timeouts) == 2 and sum(timeouts) <= run.LOST_STOP_TIMEOUT_S + 0.1


def test_a_controller_that_cannot_start_ends_the_process_with_1_and_stops_the_others() -> None:
    """Guards: a start failure (informers not synced) stops what was built, releases the lease and exits 1."""
    log: list[str] = []
    elector = FakeElector(log)
    h = _harness(elector=elector, log=log, fail={"scheduler": TimeoutError("not synced within 60s")})
    elector.commands.put("lead")
    assert h.finish() == run.EXIT_FAILED
    assert log == [
        "build claims",
        "start claims",
        "build scheduler",
        "start scheduler",
        "stop scheduler",
        "stop claims",
        "release",
    ]


def test_an_elector_that_dies_ends_the_process_with_1() -> None:
    """Guards: an exception out of the leader election loop is not a silent standby forever: exit 1."""
    log: list[str] = []
    elector = FakeElector(log)
    h = _harness(elector=elector, log=log)
    elector.commands.put("crash")
    assert h.finish() == run.EXIT_FAILED
    assert log == []


def test_healthz_fails_when_the_leader_election_loop_stops_stepping() -> None:
    """Guards: /healthz is 200 while the elector steps, 503 naming the loop once it has not for the window."""
    log: list[str] = []
    clock = FakeClock()
    elector = FakeElector(log)
    h = _harness(elector=elector, log=log, clock=clock)
    h.wait(lambda: h.supervisor.healthz()[0] == 200, "healthy")
    with elector.lock:
        elector.steps = False
    clock.now += 26.0
    status, _, body = h.supervisor.healthz()
    assert status == 503 and "has not run for 26s" in body
    elector.steps = True
    h.wait(lambda: h.supervisor.healthz()[0] == 200, "healthy again once it steps")
    h.supervisor.request_stop()
    assert h.finish() == run.EXIT_OK


def test_the_queue_depth_metric_reads_each_running_controller() -> None:
    """Guards: dractl_controller_queue_depth{controller} is the length of each running controller's queue."""
    log: list[str] = []
    h = _harness(elector=None, log=log)
    h.wait(lambda: "start scheduler" in log, "the controllers started")
    h.controllers["claims"].queue.extend(["pod:a/b", "claim:a/c"])
    sample = h.metrics.registry.get_sample_value
    assert sample("dractl_controller_queue_depth", {"controller": "claims"}) == 2
    assert sample("dractl_controller_queue_depth", {"controller": "scheduler"}) == 0
    h.supervisor.request_stop()
    assert h.finish() == run.EXIT_OK


def test_the_metrics_are_registered_once_per_registry() -> None:
    """Guards: the process metrics share a registry with a controller's own without a name clash."""
    registry = prometheus_client.CollectorRegistry()
    metrics = run.ProcessMetrics.create(registry)
    metrics.leader.set(1)
    text = prometheus_client.generate_latest(registry).decode()
    assert "dractl_controller_leader 1.0" in text and "process_cpu_seconds_total" in text


def test_stdlib_logs_come_out_in_the_same_json_lines_and_undo_removes_the_handler() -> None:
    """Guards: the controller's and kube layer's `logging` records become JSON lines (event, level, logger,
    timestamp, exception) on the process's stream, and undoing the capture stops that exactly."""
    out = io.StringIO()
    undo = daemon.capture_stdlib_logging(config.LogFormat.JSON, stream=out)
    try:
        logging.getLogger("dractl.controller.claims").info("created ResourceClaim %s/%s", "ns", "c")
        try:
            raise ValueError("bad")
        except ValueError:
            logging.getLogger("dractl.kube.informer").exception("a handler failed")
        logging.getLogger("dractl.kube.client").debug("below INFO: not written")
    finally:
        undo()
    undo()  # a second undo is harmless
    logging.getLogger("dractl.controller.claims").warning("after undo: not written")
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert first["event"] == "created ResourceClaim ns/c" and first["level"] == "info"
    assert first["logger"] == "dractl.controller.claims" and "timestamp" in first
    assert second["level"] == "error" and "ValueError: bad" in second["exception"]


def test_equal_ports_serve_metrics_and_probes_on_one_listener_and_stop_returns_0(tmp_path: pathlib.Path) -> None:
    """Guards: run() wires factories, metrics and probes: with --metrics-port equal to --health-port one listener
    answers /metrics, /healthz and /readyz; the controllers get the settings; setting `stop` exits 0."""
    log: list[str] = []
    seen: list[run.Context] = []

    def factory(context: run.Context) -> run.Controller:
        seen.append(context)
        return FakeController("claims", log)

    [port] = controlplane.free_ports(1)
    settings = config.ControllerConfig(
        kubeconfig=controlplane.unreachable_kubeconfig(tmp_path / "kubeconfig"),
        leader_elect=False,
        metrics_port=port,
        health_port=port,
        log_format=config.LogFormat.JSON,
        namespace="team-a",
        controllers=("claims",),
    )
    err = io.StringIO()
    stop = threading.Event()
    result: list[int] = []
    thread = threading.Thread(
        target=lambda: result.append(run.run(settings, err=err, stop=stop, factories={"claims": factory})), daemon=True
    )
    thread.start()
    try:
        controlplane.wait_until(lambda: "start claims" in log, what="the controller started", timeout=20)
        controlplane.wait_until(lambda: observe.get(port, "/readyz")[0] == 200, what="ready", timeout=20)
        assert observe.get(port, "/readyz") == (200, "running: claims synced\n")
        assert observe.get(port, "/healthz") == (200, "ok\n")
        status, text = observe.get(port, "/metrics")
        assert status == 200 and "dractl_controller_leader 1.0" in text
        assert observe.get(port, "/nothing")[0] == 404
        assert seen[0].settings is settings and seen[0].registry is not None
    finally:
        stop.set()
        thread.join(timeout=30)
    assert result == [run.EXIT_OK]
    assert log == ["start claims", "stop claims"]
    events = [json.loads(line)["event"] for line in err.getvalue().splitlines()]
    assert events[0] == "controller started" and events[-1] == "controller stopped"


def test_a_port_in_use_is_one_line_and_exit_1(tmp_path: pathlib.Path) -> None:
    """Guards: a metrics or health port that is taken ends the process with one line naming the paths, the port and
    the flag to change, exit 1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        settings = config.ControllerConfig(
            kubeconfig=controlplane.unreachable_kubeconfig(tmp_path / "kubeconfig"),
            metrics_port=-1,
            health_port=port,
            log_format=config.LogFormat.JSON,
        )
        err = io.StringIO()
        assert run.run(settings, err=err) == run.EXIT_FAILED
    lines = [line for line in err.getvalue().splitlines() if not line.startswith("{")]
    assert lines == [
        f"dractl controller: error: cannot serve /healthz, /readyz on port {port} (--health-port {port}): "
        "Address already in use; choose another with --health-port, or -1 to turn it off"
    ]


def test_the_real_elector_steps_its_heartbeat_even_while_the_api_is_away(tmp_path: pathlib.Path) -> None:
    """Guards: leader.Elector.run calls on_step(leading=False) after each failed attempt, so /healthz sees a live
    loop (not a wedged one) while the API server is unreachable, and the elector never claims to lead."""
    base = kube_client.connect(controlplane.unreachable_kubeconfig(tmp_path / "kubeconfig"), attempts=1)
    elector = leader.Elector(
        base,
        leader.Config(
            namespace="ns", name="lease", identity="me", lease_duration=3, renew_deadline=2, retry_period=0.01
        ),
    )
    steps: list[bool] = []
    calls: list[str] = []
    stop = threading.Event()
    thread = threading.Thread(
        target=elector.run,
        args=(stop,),
        kwargs={
            "on_started": lambda: calls.append("started"),
            "on_stopped": lambda: calls.append("stopped"),
            "on_step": steps.append,
        },
        daemon=True,
    )
    thread.start()
    try:
        controlplane.wait_until(lambda: len(steps) >= 3, what="three heartbeats", timeout=20)
    finally:
        stop.set()
        thread.join(timeout=20)
        base.close()
    assert set(steps) == {False} and calls == []
