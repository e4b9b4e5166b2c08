"""The `dractl` command: one click group, one subcommand per mode.

What it does: turns flags (each mirrored by a `DRACTL_<FLAG>` environment variable) into a
frozen settings value from `config` and hands it to the mode's `run()`. What it must not
do: hold any logic of a mode; modes owned by later releases say so and exit 2.
"""

from __future__ import annotations

import pathlib
import sys

import click

import dractl
from dractl import config, simulate

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
    help="Manifest file or directory, repeatable; DRACTL_FILE takes a ':'-separated list (default: the built-in example cluster).",
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
    help="Print the allocation phase's claims_per_s on stderr (default: off).",
)
@click.option(
    "--search-limit",
    type=click.IntRange(min=1),
    default=config.DEFAULT_SEARCH_LIMIT,
    envvar="DRACTL_SEARCH_LIMIT",
    show_envvar=True,
    help=f"Search steps per allocation before giving up with a reason (default: {config.DEFAULT_SEARCH_LIMIT}).",
)
def simulate_command(files: tuple[pathlib.Path, ...], policy: str, output: str, timing: bool, search_limit: int) -> None:
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
    sys.exit(simulate.run(settings, out=sys.stdout, err=sys.stderr))


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


main.add_command(_not_yet_available("node-agent", "Run the kubelet DRA plugin for gpu.nvidia.com on this node"))
main.add_command(_not_yet_available("controller", "Run the claim lifecycle controller and the GPU-aware allocator"))
main.add_command(_not_yet_available("explain", "Explain a claim's allocation against a live cluster"))
main.add_command(_not_yet_available("discover", "Print the ResourceSlices the node agent would publish here"))
