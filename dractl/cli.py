"""The `dractl` command: one click group, one subcommand per mode.

What it does: turns flags (each mirrored by a `DRACTL_<FLAG>` environment variable) into a
frozen settings value from `config` and hands it to the mode's `run()`. What it must not
do: hold any logic of a mode; modes owned by later releases say so and exit 2.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import socket
import sys
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

import click

import dractl
from dractl import config, simulate
from dractl.node import fakegpu

_NOT_YET_AVAILABLE = 2


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 120})
@click.version_option(dractl.__version__, "--version", prog_name="dractl", message="%(prog)s %(version)s")
def main() -> None:
    """dractl: Dynamic Resource Allocation for NVIDIA GPUs on Kubernetes."""


@main.command("simulate", short_help="Allocate claims offline over manifests: who gets which device, or why not.")
@click.option(
    "-f",
    "--file",
    "files",
    multiple=True,
    type=click.Path(exists=True, path_type=pathlib.Path),
    envvar="DRACTL_FILE",
    show_envvar=True,
    help="Manifest file or directory, repeatable; DRACTL_FILE takes a ':'-separated list (default: the built-in "
    "example cluster).",
)
@click.option(
    "--policy",
    type=click.Choice([p.value for p in config.Policy]),
    default=config.Policy.BINPACK.value,
    envvar="DRACTL_POLICY",
    show_envvar=True,
    help="Allocation policy: first-fit reproduces upstream, binpack scores placements (default: binpack).",
)
@click.option(
    "-o",
    "--output",
    type=click.Choice([f.value for f in config.OutputFormat]),
    default=config.OutputFormat.TABLE.value,
    envvar="DRACTL_OUTPUT",
    show_envvar=True,
    help="Output format: table for people, json, or yaml ResourceClaims as the API holds them (default: table).",
)
@click.option(
    "--timing",
    is_flag=True,
    envvar="DRACTL_TIMING",
    show_envvar=True,
    help="Print one 'timing: phase=... seconds=...' line per phase on stderr, claims_per_s on allocate (default: off).",
)
@click.option(
    "--search-limit",
    type=click.IntRange(min=1, max=config.MAX_SEARCH_LIMIT),
    default=config.DEFAULT_SEARCH_LIMIT,
    envvar="DRACTL_SEARCH_LIMIT",
    show_envvar=True,
    help=f"Search steps per allocation before giving up with a reason (default: {config.DEFAULT_SEARCH_LIMIT}).",
)
def simulate_command(
    files: tuple[pathlib.Path, ...], policy: str, output: str, timing: bool, search_limit: int
) -> None:
    """Allocate claims offline over manifests and show who gets which device, or why not.

    Exits 0 even when some claims cannot be allocated: their reasons are the output.
    Exits 1 when the input is invalid, printing every problem to stderr.
    """
    settings = config.Simulate(
        paths=files,
        policy=config.Policy(policy),
        output=config.OutputFormat(output),
        timing=timing,
        search_limit=search_limit,
    )
    _exit_writing(lambda: simulate.run(settings, out=sys.stdout, err=sys.stderr))


def _exit_writing(run: Callable[[], int]) -> NoReturn:
    """Run a mode that prints to stdout and exit with its code; never a traceback for the output.

    A reader that went away (`dractl simulate | head -1`) ends the command quietly with 141,
    as a filter killed by SIGPIPE would; a full or failing stdout (`> /dev/full`) prints one
    line and exits 1. Either way stdout is pointed at /dev/null so the interpreter's final
    flush cannot fail a second time.
    """
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
    sys.exit(code)


def _discard_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass  # stdout is not a file descriptor (a test runner's buffer): nothing will flush it


_F = TypeVar("_F", bound=Callable[..., Any])


def _device_options(command: _F) -> _F:
    """The device flags shared by `discover` and `node-agent`.

    Adds the keyword arguments `node_name`, `driver_name`, `device_source`, `fake_profile`,
    `mig_mode` and `consumable_memory`; `_device_settings` turns them into `config.Discover`.
    """
    options = [
        click.option(
            "--node-name",
            envvar=["DRACTL_NODE_NAME", "NODE_NAME"],
            show_envvar=True,
            default=lambda: socket.gethostname().lower(),
            help="Node whose GPUs these are; names the pool (default: $NODE_NAME, else this host's name).",
        ),
        click.option(
            "--driver-name",
            envvar="DRACTL_DRIVER_NAME",
            show_envvar=True,
            default=config.DEFAULT_DRIVER_NAME,
            help=f"DRA driver name the slices are published for (default: {config.DEFAULT_DRIVER_NAME}).",
        ),
        click.option(
            "--device-source",
            type=click.Choice([s.value for s in config.DeviceSource]),
            envvar="DRACTL_DEVICE_SOURCE",
            show_envvar=True,
            default=config.DeviceSource.NVML.value,
            help="Where GPUs come from: the NVIDIA driver's NVML, or the deterministic fake (default: nvml).",
        ),
        click.option(
            "--fake-profile",
            envvar="DRACTL_FAKE_PROFILE",
            show_envvar=True,
            default=config.DEFAULT_FAKE_PROFILE,
            help=f"Fake GPUs: a built-in profile ({', '.join(fakegpu.builtin_profiles())}) "
            f"or a profile YAML file (default: {config.DEFAULT_FAKE_PROFILE}).",
        ),
        click.option(
            "--mig-mode",
            type=click.Choice([m.value for m in config.MigMode]),
            envvar="DRACTL_MIG_MODE",
            show_envvar=True,
            default=config.MigMode.STATIC.value,
            help="static publishes the MIG devices that exist; dynamic every profile x placement (default: static).",
        ),
        click.option(
            "--consumable-memory",
            is_flag=True,
            envvar="DRACTL_CONSUMABLE_MEMORY",
            show_envvar=True,
            help="Let several claims share a GPU, each taking part of its memory (default: off).",
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


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
@click.option(
    "-o",
    "--output",
    type=click.Choice([config.OutputFormat.YAML.value, config.OutputFormat.JSON.value]),
    default=config.OutputFormat.YAML.value,
    envvar="DRACTL_OUTPUT",
    show_envvar=True,
    help="Output format: YAML documents or a JSON List (default: yaml).",
)
def discover_command(output: str, **device: Any) -> None:
    """Print the ResourceSlices the node agent would publish on this node, without an API server.

    Exits 1 with one line on stderr when the GPUs cannot be read (no NVIDIA driver, a bad
    fake profile) or a flag is invalid.
    """
    settings = dataclasses.replace(_device_settings(**device), output=config.OutputFormat(output))
    from dractl.node import discover  # imported here: `dractl simulate` should not pay for it

    _exit_writing(lambda: discover.run(settings, out=sys.stdout, err=sys.stderr))


_DIR = click.Path(file_okay=False, path_type=pathlib.Path)


@main.command("node-agent", short_help="Run the kubelet DRA plugin for the node's GPUs.")
@_device_options
@click.option(
    "--cdi-root",
    type=_DIR,
    default=config.DEFAULT_CDI_ROOT,
    envvar="DRACTL_CDI_ROOT",
    show_envvar=True,
    help=f"Directory the per-claim CDI specs are written to (default: {config.DEFAULT_CDI_ROOT}).",
)
@click.option(
    "--kubelet-registrar-dir",
    type=_DIR,
    default=config.DEFAULT_KUBELET_REGISTRAR_DIR,
    envvar="DRACTL_KUBELET_REGISTRAR_DIR",
    show_envvar=True,
    help=f"The kubelet's plugin registration directory (default: {config.DEFAULT_KUBELET_REGISTRAR_DIR}).",
)
@click.option(
    "--kubelet-plugins-dir",
    type=_DIR,
    default=config.DEFAULT_KUBELET_PLUGINS_DIR,
    envvar="DRACTL_KUBELET_PLUGINS_DIR",
    show_envvar=True,
    help=f"The kubelet's plugins directory; the DRA socket is <dir>/<driver>/dra.sock "
    f"(default: {config.DEFAULT_KUBELET_PLUGINS_DIR}).",
)
@click.option(
    "--state-dir",
    type=_DIR,
    default=None,
    envvar="DRACTL_STATE_DIR",
    show_envvar=True,
    help="Directory of the checkpoint and MPS state (default: <kubelet-plugins-dir>/<driver-name>).",
)
@click.option(
    "--kubeconfig",
    type=click.Path(dir_okay=False, path_type=pathlib.Path),
    default=None,
    envvar="DRACTL_KUBECONFIG",
    show_envvar=True,
    help="Kubeconfig file (default: the in-cluster config, else $KUBECONFIG or ~/.kube/config).",
)
@click.option(
    "--health-port",
    type=click.IntRange(min=-1, max=65535),
    default=config.DEFAULT_HEALTH_PORT,
    envvar="DRACTL_HEALTH_PORT",
    show_envvar=True,
    help=f"TCP port of the liveness endpoint GET /healthz; -1 turns it off (default: {config.DEFAULT_HEALTH_PORT}).",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(min=-1, max=65535),
    default=config.DEFAULT_METRICS_PORT,
    envvar="DRACTL_METRICS_PORT",
    show_envvar=True,
    help=f"TCP port of the Prometheus endpoint GET /metrics; -1 turns it off (default: {config.DEFAULT_METRICS_PORT}).",
)
@click.option(
    "--log-format",
    type=click.Choice([f.value for f in config.LogFormat]),
    default=None,
    envvar="DRACTL_LOG_FORMAT",
    show_envvar=True,
    help="Log lines as json or console (default: console on a terminal, json otherwise).",
)
def node_agent_command(
    cdi_root: pathlib.Path,
    kubelet_registrar_dir: pathlib.Path,
    kubelet_plugins_dir: pathlib.Path,
    state_dir: pathlib.Path | None,
    kubeconfig: pathlib.Path | None,
    health_port: int,
    metrics_port: int,
    log_format: str | None,
    **device: Any,
) -> None:
    """Run the kubelet DRA plugin: publish this node's GPUs, prepare claims, report device health.

    Runs until SIGTERM or SIGINT, then removes its sockets and leaves the slices published.
    Exits 1 with one line on stderr when it cannot start (no NVIDIA driver, a bad flag).
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
        kubelet_registrar_dir=kubelet_registrar_dir,
        kubelet_plugins_dir=kubelet_plugins_dir,
        state_dir=state_dir,
        kubeconfig=kubeconfig,
        health_port=health_port,
        metrics_port=metrics_port,
        log_format=config.LogFormat(log_format) if log_format is not None else None,
    )
    from dractl.node import agent  # imported here: it brings gRPC and the Kubernetes client

    sys.exit(agent.run(settings, err=sys.stderr))


def _not_yet_available(name: str, summary: str) -> click.Command:
    """A mode that a later release provides: it says so on stderr and exits 2."""

    def callback(args: tuple[str, ...]) -> None:
        click.echo(f"dractl {name}: not yet available in this release", err=True)
        sys.exit(_NOT_YET_AVAILABLE)

    return click.Command(
        name,
        callback=callback,
        params=[click.Argument(["args"], nargs=-1, type=click.UNPROCESSED)],
        context_settings={"ignore_unknown_options": True},
        help=f"{summary} (not yet available in this release).",
        short_help=f"{summary} (not yet available).",
    )


main.add_command(_not_yet_available("controller", "Run the claim lifecycle controller and the GPU-aware allocator"))
main.add_command(_not_yet_available("explain", "Explain a claim's allocation against a live cluster"))
