"""`dractl simulate`: the allocator offline over manifests.

What it does: decodes the manifests (or the built-in example cluster), makes the claims pods
get from templates, allocates standalone claims and then pods' claims like a cluster would,
and prints who gets which device on which node, or why not. What it must not do: talk to a
cluster, import the Cython core (only `alloc` does), or parse flags (the CLI does).
"""

from __future__ import annotations

import pathlib
from typing import TextIO

from dractl import alloc, cel, config
from dractl.model import decode
from dractl.simulate import engine, report

# The built-in example cluster, shipped as package data.
EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


def run(settings: config.Simulate, *, out: TextIO, err: TextIO) -> int:
    """Simulate and print; returns the exit code.

    0 when the simulation ran, even if some claims could not be allocated (their reasons are
    the output); 1 when the input is invalid (every problem is printed to `err`).
    """
    try:
        objects = decode.load_paths(settings.paths or (EXAMPLES,))
    except decode.DecodeError as error:
        for problem in error.problems:
            print(problem, file=err)
        return 1
    # The API server refuses objects whose selectors do not compile; so does the simulation.
    invalid = cel.problems(objects)
    if invalid:
        for problem in invalid:
            print(problem, file=err)
        return 1
    for warning in objects.warnings:
        print(f"warning: {warning}", file=err)
    try:
        result = engine.simulate(objects, policy=settings.policy, search_limit=settings.search_limit)
    except alloc.AllocationError as error:
        print(f"error: {error}", file=err)
        return 1
    if settings.timing:
        print(f"timing: {result.attempted} claims in {result.seconds:.6f} s, claims_per_s={result.claims_per_second:.1f}", file=err)
    report.write(result, slices=objects.resource_slices, settings=settings, out=out, err=err)
    return 0
