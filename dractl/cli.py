"""The `dractl` command: one click group, one subcommand per mode.

What it does: turns flags (each mirrored by a `DRACTL_<FLAG>` environment variable) into a
frozen settings value from `config` and hands it to the mode's `run()`. What it must not
do: hold any logic of a mode (settings are checked by the mode; parse errors of a long-running
mode's flags are one line naming the flag, exit 2).
"""

from __future__ import annotations

import dataclasses
import enum
import io
import os
import pathlib
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NoReturn, TypeVar

import click

import dractl
from dractl import config, simulate
from dractl.model import decode


class _Program:
    """The context object of `dractl` run as a program: the process ends with the command."""


class _Group(click.Group):
    """The `dractl` group. Called with no arguments, as `python -m dractl` and the console script
    call it, it reads the process's own and runs as the program (`_Program`); a test runner or
    another caller passes arguments, and gets `SystemExit` as from any click command."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        if args is None:
            extra.setdefault("obj", _Program())
        return super().main(
            args,
            prog_name,
            complete_var,
            standalone_mode=standalone_mode,
            windows_expand_args=windows_expand_args,
            **extra,
        )


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 120})
@click.version_option(dractl.__version__, "--version", prog_name="dractl", message="%(prog)s %(version)s")
def main() -> None:
    """dractl: Dynamic Resource Allocation for NVIDIA GPUs on Kubernetes."""


# --- Shared flags: one decorator per kind, so a flag reads (and is mirrored) the same in every mode ---------

_F = TypeVar("_F", bound=Callable[..., Any])


def _option(*decls: str, more_envvars: Sequence[str] = (), **attrs: Any) -> Callable[[_F], _F]:
    """`click.option` mirrored by the environment variable `DRACTL_<FLAG>` of its long flag (then `more_envvars`),
    which `--help` shows."""
    flag = next(decl for decl in decls if decl.startswith("--"))
    envvar = "DRACTL_" + flag.removeprefix("--").partition("/")[0].upper().replace("-", "_")
    return click.option(*decls, envvar=[envvar, *more_envvars] if more_envvars else envvar, show_envvar=True, **attrs)


_topology_levels = _option(
    "--topology-levels",
    default="",
    metavar="KEYS",
    help="Node label keys, widest first and comma-separated (e.g. block,rack,kubernetes.io/hostname): a gang "
    "(PodGroup) goes to the smallest domain of these that holds it whole (default: none, only its own key).",
)


def _levels(text: str) -> tuple[str, ...]:
    """`--topology-levels` as label keys, blanks dropped. Pure."""
    return tuple(key.strip() for key in text.split(",") if key.strip())


def _choice(members: Iterable[enum.Enum]) -> click.Choice[str]:
    """The values of enum members, in their order, as a flag's choices."""
    return click.Choice([member.value for member in members])


def _together(*decorators: Callable[[_F], _F]) -> Callable[[_F], _F]:
    """The decorators as one; `--help` lists their options in the order given."""

    def apply(command: _F) -> _F:
        for decorator in reversed(decorators):
            command = decorator(command)
        return command

    return apply


def _kube_client(command: _F) -> _F:
    """The flags of every mode that talks to the API server: `--kubeconfig` (how it finds the server),
    `--kube-api-qps` and `--kube-api-burst` (its client-side rate limit, as kube's components have)."""
    return _together(
        _option(
            "--kubeconfig",
            type=click.Path(dir_okay=False, path_type=pathlib.Path),
            default=None,
            help="Kubeconfig file (default: the in-cluster config, else $KUBECONFIG or ~/.kube/config).",
        ),
        _option(
            "--kube-api-qps",
            type=click.FloatRange(min=0),
            default=config.DEFAULT_KUBE_API_QPS,
            help=f"Client-side limit: requests per second to the API server on average; 0: no limit, the API "
            f"server's priority and fairness paces the client (default: {config.DEFAULT_KUBE_API_QPS:g}).",
        ),
        _option(
            "--kube-api-burst",
            type=click.IntRange(min=1),
            default=config.DEFAULT_KUBE_API_BURST,
            help=f"Client-side limit: requests sent at once after a quiet spell, above the average, where the QPS "
            f"limit is on (default: {config.DEFAULT_KUBE_API_BURST}).",
        ),
    )(command)


def _log_format(command: _F) -> _F:
    """`--log-format` of the long-running modes."""
    return _option(
        "--log-format",
        type=_choice(config.LogFormat),
        default=None,
        help="Log lines as json or console (default: console on a terminal, json otherwise).",
    )(command)


def _policy(
    what: str = "Allocation policy: first-fit reproduces upstream, binpack scores placements",
) -> Callable[[_F], _F]:
    """`--policy`, the allocation policy (default binpack); `what` is its help before the default."""
    default = config.Policy.BINPACK.value
    return _option("--policy", type=_choice(config.Policy), default=default, help=f"{what} (default: {default}).")


def _output(formats: Iterable[enum.Enum], *, default: enum.Enum, what: str) -> Callable[[_F], _F]:
    """`-o/--output`, one of `formats`; `what` says what each gives."""
    return _option(
        "-o",
        "--output",
        type=_choice(formats),
        default=default.value,
        help=f"Output format: {what} (default: {default.value}).",
    )


def _port(flag: str, *, default: int, what: str) -> Callable[[_F], _F]:
    """A TCP port flag, -1 for off; `what` is its help before the default."""
    return _option(flag, type=click.IntRange(min=-1, max=65535), default=default, help=f"{what} (default: {default}).")


def _seconds(flag: str, *, default: float, what: str) -> Callable[[_F], _F]:
    """A duration flag, in seconds above 0; `what` is its help before the default."""
    return _option(
        flag,
        type=click.FloatRange(min=0, min_open=True),
        default=default,
        help=f"{what} (default: {default:g} seconds).",
    )


@main.command("simulate", short_help="Allocate claims offline over manifests: who gets which device, or why not.")
@_option(
    "-f",
    "--file",
    "files",
    multiple=True,
    type=click.Path(exists=True, allow_dash=True, path_type=pathlib.Path),
    callback=lambda _context, _param, files: _stdin_once(files),
    help="Manifest file or directory ('-' reads stdin, once), repeatable; DRACTL_FILE takes a ':'-separated list "
    "(default: the built-in example cluster).",
)
@_policy()
@_output(
    config.OutputFormat,
    default=config.OutputFormat.TABLE,
    what="table for people, json, or yaml ResourceClaims as the API holds them",
)
@_option(
    "--timing",
    is_flag=True,
    help="Print one 'timing: phase=... seconds=...' line per phase on stderr, claims_per_s on allocate (default: off).",
)
@_option(
    "--search-limit",
    type=click.IntRange(min=1, max=config.MAX_SEARCH_LIMIT),
    default=config.DEFAULT_SEARCH_LIMIT,
    help=f"Search steps per allocation before giving up with a reason (default: {config.DEFAULT_SEARCH_LIMIT}).",
)
@_option(
    "--trace",
    "trace_file",
    type=click.Path(exists=True, dir_okay=False, allow_dash=True, path_type=pathlib.Path),
    default=None,
    help="Replay a trace file (kind: Trace; '-' reads stdin) of claims and pods arriving and departing, "
    "instead of -f (default: none).",
)
@_option(
    "--retry",
    type=_choice(config.Retry),
    default=config.Retry.ON_DEPARTURE.value,
    help="With --trace: retry claims that could not be allocated after every departure, or drop them "
    "(default: on-departure).",
)
@_option(
    "--generate",
    default=None,
    metavar="SPEC",
    help="Print a generated trace instead of simulating: mix=reference|h100-nvlink,seed=N,claims=N"
    "[,a100=8,h100=8,t4=4][,round=10][,departures=0.3]; YAML, or JSON with -o json (default: none).",
)
@_option(
    "--compare",
    default=None,
    metavar="POLICIES",
    help="With --trace: replay once per policy (comma-separated, e.g. first-fit,binpack) and show the metrics "
    "side by side (default: --policy alone).",
)
@_option(
    "--html",
    type=click.Path(dir_okay=False, path_type=pathlib.Path),
    default=None,
    help="With --trace: write one self-contained HTML file: an overview of the cluster over the trace (opening "
    "at the first rejection), the allocation map at the end and utilisation over time; with --compare, of the "
    "--policy run (default: none).",
)
@_topology_levels
def simulate_command(
    files: tuple[pathlib.Path, ...],
    policy: str,
    output: str,
    timing: bool,
    search_limit: int,
    trace_file: pathlib.Path | None,
    retry: str,
    generate: str | None,
    compare: str | None,
    html: pathlib.Path | None,
    topology_levels: str,
) -> None:
    """Allocate claims offline over manifests and show who gets which device, or why not.

    Exits 0 even when some claims cannot be allocated: their reasons are the output.
    Exits 1 when the input is invalid, printing every problem to stderr.
    """
    policies: tuple[config.Policy, ...] = ()
    if compare is not None:
        known = {p.value: p for p in config.Policy}
        names = [name.strip() for name in compare.split(",") if name.strip()]
        unknown = [name for name in names if name not in known]
        if unknown or not names:
            raise click.BadParameter(
                f"{compare!r}: name policies from {', '.join(known)}, comma-separated", param_hint="--compare"
            )
        policies = tuple(dict.fromkeys(known[name] for name in names))
    settings = config.Simulate(
        paths=files,
        policy=config.Policy(policy),
        output=config.OutputFormat(output),
        timing=timing,
        search_limit=search_limit,
        trace=trace_file,
        retry=config.Retry(retry),
        generate=generate,
        compare=policies,
        html=html,
        topology_levels=_levels(topology_levels),
    )
    if trace_file is not None or generate is not None or compare is not None or html is not None:
        from dractl.simulate import replay  # imported here: plain simulate runs do not need it

        _exit_writing(lambda: replay.run(settings, out=sys.stdout, err=sys.stderr))
    _exit_writing(lambda: simulate.run(settings, out=sys.stdout, err=sys.stderr), quick=True)


def _stdin_once(files: tuple[pathlib.Path, ...]) -> tuple[pathlib.Path, ...]:
    """The -f paths, refused (exit 2, naming the flag) when they name standard input twice: the
    first `-` reads it to its end, so a second would find it empty."""
    if sum(str(file) == decode.STDIN for file in files) > 1:
        raise click.BadParameter(f"{decode.STDIN!r} is given more than once: standard input can be read once")
    return files


def _exit_writing(run: Callable[[], int], *, quick: bool = False) -> NoReturn:
    """Run a mode that prints to stdout and exit with its code; never a traceback for the output.

    A reader that went away (`dractl simulate | head -1`) ends the command quietly with 141,
    as a filter killed by SIGPIPE would; a full or failing stdout (`> /dev/full`) prints one
    line and exits 1. Either way stdout is pointed at /dev/null so the interpreter's final
    flush cannot fail a second time.

    With `quick`, a run of the program (`_Group.main`) that wrote its output ends at once, without
    tearing down the interpreter: freeing every decoded object one by one took about a tenth
    of a 7,000-claim `simulate`. Only for modes that leave nothing open (files, threads,
    atexit handlers) once `run` returns.

    A character the streams' encoding cannot hold (a non-ASCII reason under
    `PYTHONIOENCODING=ascii` or the C locale) is written as a backslash escape, not a traceback.
    """
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="backslashreplace")
    try:
        code = run()
        sys.stdout.flush()
    except BrokenPipeError:
        _discard_stdout()
        sys.exit(141)
    except OSError as error:
        _discard_stdout()
        click.echo(f"dractl: cannot write the output: {error.strerror or error}", err=True)
        sys.exit(1)
    if quick and isinstance(click.get_current_context().obj, _Program):
        try:
            sys.stderr.flush()
        finally:
            os._exit(code)
    sys.exit(code)


def _discard_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass  # stdout is not a file descriptor (a test runner's buffer): nothing will flush it


def _host_name() -> str:
    """This host's name in lower case, the default node name."""
    import socket  # imported here: only the node modes need it, not `dractl simulate`

    return socket.gethostname().lower()


class _FakeProfileOption(click.Option):
    """`--fake-profile`, whose help lists the built-in profiles only when it is read: listing
    them imports the fake GPU backend (tens of milliseconds), which `dractl simulate` does not
    otherwise import."""

    @property
    def help(self) -> str:
        from dractl.node import fakegpu

        return (
            f"Fake GPUs: a built-in profile ({', '.join(fakegpu.builtin_profiles())}) "
            f"or a profile YAML file (default: {config.DEFAULT_FAKE_PROFILE})."
        )

    @help.setter
    def help(self, value: str | None) -> None:
        """Ignored: click sets the help it was given, and this option computes its own."""


def _device_options(command: _F) -> _F:
    """The device flags shared by `discover` and `node-agent`.

    Adds the keyword arguments `node_name`, `driver_name`, `device_source`, `fake_profile`,
    `mig_mode` and `consumable_memory`; `_device_settings` turns them into `config.Discover`.
    """
    return _together(
        _option(
            "--node-name",
            more_envvars=["NODE_NAME"],
            default=_host_name,
            help="Node whose GPUs these are; names the pool (default: $NODE_NAME, else this host's name).",
        ),
        _option(
            "--driver-name",
            default=config.DEFAULT_DRIVER_NAME,
            help=f"DRA driver name the slices are published for (default: {config.DEFAULT_DRIVER_NAME}).",
        ),
        _option(
            "--device-source",
            type=_choice(config.DeviceSource),
            default=config.DeviceSource.NVML.value,
            help="Where GPUs come from: the NVIDIA driver's NVML, or the deterministic fake (default: nvml).",
        ),
        _option("--fake-profile", default=config.DEFAULT_FAKE_PROFILE, cls=_FakeProfileOption),
        _option(
            "--mig-mode",
            type=_choice(config.MigMode),
            default=config.MigMode.STATIC.value,
            help="static publishes the MIG devices that exist; dynamic every profile x placement (default: static).",
        ),
        _option(
            "--consumable-memory",
            is_flag=True,
            help="Let several claims share a GPU, each taking part of its memory (default: off).",
        ),
    )(command)


def _device_settings(
    *, node_name: str, driver_name: str, device_source: str, fake_profile: str, mig_mode: str, consumable_memory: bool
) -> config.Discover:
    """`config.Discover` from the `_device_options` keyword arguments."""
    return config.Discover(
        node_name=node_name,
        driver_name=driver_name,
        device_source=config.DeviceSource(device_source),
        fake_profile=fake_profile,
        mig_mode=config.MigMode(mig_mode),
        consumable_memory=consumable_memory,
    )


@main.command("discover", short_help="Print the ResourceSlices the node agent would publish here.")
@_device_options
@_output(
    (config.OutputFormat.YAML, config.OutputFormat.JSON),
    default=config.OutputFormat.YAML,
    what="YAML documents or a JSON List",
)
def discover_command(output: str, **device: Any) -> None:
    """Print the ResourceSlices the node agent would publish on this node, without an API server.

    Exits 1 with one line on stderr when the GPUs cannot be read (no NVIDIA driver, a bad
    fake profile) or a flag is invalid.
    """
    settings = dataclasses.replace(_device_settings(**device), output=config.OutputFormat(output))
    from dractl.node import discover  # imported here: `dractl simulate` should not pay for it

    _exit_writing(lambda: discover.run(settings, out=sys.stdout, err=sys.stderr))


class _Directory(click.Path):
    """A directory flag. An empty value is refused: as a path it would mean the working directory, which no
    directory flag means (a variable expanded to nothing, `--state-dir "$UNSET"`, is the usual cause)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not value:
            self.fail("must not be empty (an empty path would mean the working directory)", param, ctx)
        return super().convert(value, param, ctx)


_DIR = _Directory(file_okay=False, path_type=pathlib.Path)


class _FlagError(click.ClickException):
    """A bad flag value as one line, `dractl <mode>: error: <message>`, exit 2 (no usage block)."""

    exit_code = 2

    def show(self, file: Any = None) -> None:
        click.echo(self.message, err=True)


class _OneLineErrorsCommand(click.Command):
    """A command whose flag parsing errors (bad value, unknown option) are one line naming the flag, exit 2."""

    def make_context(
        self, info_name: str | None, args: list[str], parent: click.Context | None = None, **extra: Any
    ) -> click.Context:
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.UsageError as error:
            raise _FlagError(f"dractl {info_name}: error: {error.format_message()}") from None


@main.command("node-agent", cls=_OneLineErrorsCommand, short_help="Run the kubelet DRA plugin for the node's GPUs.")
@_device_options
@_option(
    "--cdi-root",
    type=_DIR,
    default=config.DEFAULT_CDI_ROOT,
    help=f"Directory the per-claim CDI specs are written to (default: {config.DEFAULT_CDI_ROOT}).",
)
@_option(
    "--cdi-generator",
    type=_choice(config.CdiGenerator),
    default=config.CdiGenerator.NATIVE.value,
    help="Where the driver's files in CDI specs come from: native (read from --driver-root) or nvidia-ctk "
    "(nvidia-ctk cdi generate, must be on PATH) (default: native).",
)
@_option(
    "--driver-root",
    type=_DIR,
    default=config.DEFAULT_DRIVER_ROOT,
    help="Where the host has the NVIDIA driver's files, e.g. /run/nvidia/driver under a driver container "
    f"(default: {config.DEFAULT_DRIVER_ROOT}).",
)
@_option(
    "--container-driver-root",
    type=_DIR,
    default=None,
    help="Where this agent sees --driver-root when it is mounted elsewhere in its container "
    "(default: the --driver-root path).",
)
@_option(
    "--kubelet-registrar-dir",
    type=_DIR,
    default=config.DEFAULT_KUBELET_REGISTRAR_DIR,
    help=f"The kubelet's plugin registration directory (default: {config.DEFAULT_KUBELET_REGISTRAR_DIR}).",
)
@_option(
    "--kubelet-plugins-dir",
    type=_DIR,
    default=config.DEFAULT_KUBELET_PLUGINS_DIR,
    help=f"The kubelet's plugins directory; the DRA socket is <dir>/<driver>/dra.sock "
    f"(default: {config.DEFAULT_KUBELET_PLUGINS_DIR}).",
)
@_option(
    "--state-dir",
    type=_DIR,
    default=None,
    help="Directory of the checkpoint and MPS state (default: <kubelet-plugins-dir>/<driver-name>).",
)
@_option(
    "--pod-uid",
    more_envvars=["POD_UID"],
    default="",
    help="This pod's UID (downward API): the sockets get names of their own, so a new agent can start beside this "
    "one in a rolling update (default: none: fixed names, one agent per node).",
)
@_kube_client
@_port(
    "--health-port",
    default=config.DEFAULT_HEALTH_PORT,
    what="TCP port of the liveness endpoint GET /healthz; -1 turns it off",
)
@_port(
    "--metrics-port",
    default=config.DEFAULT_METRICS_PORT,
    what="TCP port of the Prometheus endpoint GET /metrics; -1 turns it off",
)
@_option(
    "--health-address",
    default=config.DEFAULT_HEALTH_ADDRESS,
    help=f"IP address /healthz listens on; 0.0.0.0 for all (default: {config.DEFAULT_HEALTH_ADDRESS}).",
)
@_option(
    "--metrics-address",
    default=None,
    help="IP address /metrics listens on; 0.0.0.0 for all (default: the Node's InternalIP, else 127.0.0.1).",
)
@_log_format
def node_agent_command(
    cdi_root: pathlib.Path,
    cdi_generator: str,
    driver_root: pathlib.Path,
    container_driver_root: pathlib.Path | None,
    kubelet_registrar_dir: pathlib.Path,
    kubelet_plugins_dir: pathlib.Path,
    state_dir: pathlib.Path | None,
    pod_uid: str,
    kubeconfig: pathlib.Path | None,
    kube_api_qps: float,
    kube_api_burst: int,
    health_port: int,
    metrics_port: int,
    health_address: str,
    metrics_address: str | None,
    log_format: str | None,
    **device: Any,
) -> None:
    """Run the kubelet DRA plugin: publish this node's GPUs, prepare claims, report device health.

    Runs until SIGTERM or SIGINT, then removes its sockets and leaves the slices published.
    Exits 1 with one line on stderr when it cannot start (no NVIDIA driver, a flag value the agent
    refuses), 2 with one line for a flag value of the wrong type or range.
    """
    devices = _device_settings(**device)
    settings = config.NodeAgent(
        node_name=devices.node_name,
        driver_name=devices.driver_name,
        device_source=devices.device_source,
        fake_profile=devices.fake_profile,
        mig_mode=devices.mig_mode,
        consumable_memory=devices.consumable_memory,
        cdi_root=cdi_root,
        cdi_generator=config.CdiGenerator(cdi_generator),
        driver_root=driver_root,
        container_driver_root=container_driver_root,
        kubelet_registrar_dir=kubelet_registrar_dir,
        kubelet_plugins_dir=kubelet_plugins_dir,
        state_dir=state_dir,
        kubeconfig=kubeconfig,
        kube_api_qps=kube_api_qps,
        kube_api_burst=kube_api_burst,
        health_port=health_port,
        metrics_port=metrics_port,
        health_address=health_address,
        metrics_address=metrics_address,
        log_format=config.LogFormat(log_format) if log_format is not None else None,
        pod_uid=pod_uid,
    )
    from dractl.node import agent  # imported here: it brings gRPC and the Kubernetes client

    sys.exit(agent.run(settings, err=sys.stderr))


@main.command(
    "controller",
    cls=_OneLineErrorsCommand,
    short_help="Run the claim lifecycle controller and the GPU-aware allocator (leader-elected).",
)
@_kube_client
@_option(
    "--controllers",
    default=",".join(config.DEFAULT_CONTROLLERS),
    help=(
        "Comma-separated controllers to run: scheduler, claims (only where kube-controller-manager's "
        f"resource-claim-controller is off) (default: {','.join(config.DEFAULT_CONTROLLERS)})."
    ),
)
@_option(
    "--scheduler-name",
    default=config.DEFAULT_SCHEDULER_NAME,
    help=f"Pods with this spec.schedulerName are scheduled by dractl (default: {config.DEFAULT_SCHEDULER_NAME}).",
)
@_policy()
@_topology_levels
@_option(
    "--workers",
    type=click.IntRange(min=1, max=256),
    default=config.DEFAULT_CONTROLLER_WORKERS,
    help=f"Worker threads per controller, 1 to 256 (default: {config.DEFAULT_CONTROLLER_WORKERS}).",
)
@_option(
    "--namespace",
    default="",
    help="Watch only this namespace's pods, claims and templates (default: every namespace).",
)
@_option(
    "--leader-elect/--no-leader-elect",
    default=True,
    help="Run the controllers only while holding the Lease, for several replicas (default: on).",
)
@_option(
    "--lease-name",
    default=config.DEFAULT_LEASE_NAME,
    help=f"Name of the leader election Lease (default: {config.DEFAULT_LEASE_NAME}).",
)
@_option(
    "--lease-namespace",
    default="",
    help="Namespace of the Lease (default: the pod's own namespace in a cluster, else default).",
)
@_seconds(
    "--lease-duration", default=config.DEFAULT_LEASE_DURATION, what="How long a standby waits after the last renewal"
)
@_seconds("--renew-deadline", default=config.DEFAULT_RENEW_DEADLINE, what="How long the leader keeps trying to renew")
@_seconds("--retry-period", default=config.DEFAULT_RETRY_PERIOD, what="Time between leader election attempts")
@_port(
    "--metrics-port",
    default=config.DEFAULT_CONTROLLER_METRICS_PORT,
    what="TCP port of GET /metrics; -1 turns it off, the health port's number shares one listener",
)
@_port(
    "--health-port",
    default=config.DEFAULT_CONTROLLER_HEALTH_PORT,
    what="TCP port of GET /healthz (liveness) and /readyz (readiness); -1 turns them off",
)
@_log_format
def controller_command(
    kubeconfig: pathlib.Path | None,
    kube_api_qps: float,
    kube_api_burst: int,
    controllers: str,
    scheduler_name: str,
    policy: str,
    topology_levels: str,
    workers: int,
    namespace: str,
    leader_elect: bool,
    lease_name: str,
    lease_namespace: str,
    lease_duration: float,
    renew_deadline: float,
    retry_period: float,
    metrics_port: int,
    health_port: int,
    log_format: str | None,
) -> None:
    """Run the control-plane controllers (claim lifecycle, GPU-aware scheduler) while this replica holds the Lease.

    Runs until SIGTERM or SIGINT, then stops the controllers, releases the Lease and exits 0.
    Exits 1 when the Lease is lost (so the Deployment restarts the replica) or it cannot start
    (one line on stderr), 2 with one line naming the flag when a value is bad.
    """
    from dractl.controller import run  # imported here: it brings the Kubernetes client

    settings = config.ControllerConfig(
        kubeconfig=kubeconfig,
        kube_api_qps=kube_api_qps,
        kube_api_burst=kube_api_burst,
        controllers=run.parse_names(controllers),
        scheduler_name=scheduler_name,
        policy=config.Policy(policy),
        topology_levels=_levels(topology_levels),
        workers=workers,
        namespace=namespace,
        leader_elect=leader_elect,
        lease_name=lease_name,
        lease_namespace=lease_namespace,
        lease_duration=lease_duration,
        renew_deadline=renew_deadline,
        retry_period=retry_period,
        metrics_port=metrics_port,
        health_port=health_port,
        log_format=config.LogFormat(log_format) if log_format is not None else None,
    )
    sys.exit(run.run(settings, err=sys.stderr))


@main.group("explain", short_help="Explain a claim's or a pod's allocation against a live cluster.")
def explain_group() -> None:
    """Explain where a claim's devices are, or why it cannot get any, against a live cluster.

    Reads DeviceClasses, ResourceSlices, Nodes and ResourceClaims and tries the allocation the
    way `dractl simulate` does; writes nothing. Exits 1 with one line on stderr when the object
    does not exist, the API server cannot be reached, refuses or answers what dractl cannot read,
    or the whole run takes longer than --timeout; 2 for a malformed NS/NAME.
    """


def _explain_options(command: _F) -> _F:
    """The flags shared by `explain claim` and `explain pod`: the target and how to read and print it."""
    return _together(
        click.argument("target", metavar="NS/NAME"),
        _kube_client,
        _policy("Allocation policy for pending claims: first-fit as upstream, or binpack"),
        _output(
            config.ExplainOutput,
            default=config.ExplainOutput.TEXT,
            what="text for people, or the same content as json or yaml",
        ),
        _seconds(
            "--timeout",
            default=config.DEFAULT_EXPLAIN_TIMEOUT,
            what="Give up, with one line, when reading the kubeconfig, every request to the API server (retries "
            "included) and the explanation take longer than this in all",
        ),
    )(command)


def _explain(kind: config.ExplainKind, *, target: str, policy: str, output: str, **kube: Any) -> None:
    from dractl import explain  # imported here: it brings the Kubernetes client

    try:
        namespace, name = explain.parse_target(target)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="NS/NAME") from error
    settings = config.Explain(
        kind=kind,
        namespace=namespace,
        name=name,
        policy=config.Policy(policy),
        output=config.ExplainOutput(output),
        **kube,
    )
    _exit_writing(lambda: explain.run(settings, out=sys.stdout, err=sys.stderr))


@explain_group.command("claim", short_help="Explain one ResourceClaim: where it is allocated, or why not.")
@_explain_options
def explain_claim_command(target: str, policy: str, output: str, **kube: Any) -> None:
    """Explain ResourceClaim NS/NAME: its node, devices per request and consumers when allocated;
    otherwise whether it fits now, and if not, per request what stopped it."""
    _explain(config.ExplainKind.CLAIM, target=target, policy=policy, output=output, **kube)


@explain_group.command("pod", short_help="Explain a pod's claims together on one node, as a scheduler would.")
@_explain_options
def explain_pod_command(target: str, policy: str, output: str, **kube: Any) -> None:
    """Explain the claims of Pod NS/NAME together: all on one node the pod may use (its
    spec.nodeName and spec.nodeSelector, the nodes its allocated claims pin); a claim still to
    be made from a template is explained from the template."""
    _explain(config.ExplainKind.POD, target=target, policy=policy, output=output, **kube)
