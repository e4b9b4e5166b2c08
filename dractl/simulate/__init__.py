"""`dractl simulate`: the allocator offline over manifests.

What it does: decodes the manifests (or the built-in example cluster), makes the claims pods
get from templates, allocates standalone claims and then pods' claims like a cluster would,
and prints who gets which device on which node, or why not. What it must not do: talk to a
cluster, import the Cython core (only `alloc` does), or parse flags (the CLI does).
"""

from __future__ import annotations

import gc
import pathlib
from typing import TextIO

from dractl import config
from dractl.model import decode
from dractl.simulate import engine, report, timing

# The built-in example cluster, shipped as package data.
EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"

# Allocations between collections of the youngest generation while simulating (default 700).
# At 200,000 a 7,000-claim run from JSON is decoded and frozen before the first collection
# (50,000 spent about 4% of the run collecting), with the same peak memory.
_GC_GEN0 = 200_000


def run(settings: config.Simulate, *, out: TextIO, err: TextIO) -> int:
    """Simulate and print; returns the exit code.

    0 when the simulation ran, even if some claims could not be allocated (their reasons are
    the output); 1 when the input is invalid (every problem is printed to `err`). Allocations
    given in the input that hold nothing (conflicting or invalid), and opaque configs the node
    agent would refuse (`engine.unpreparable`; the claims are marked in the output too), are a
    `warning:` line each on `err`. With `settings.timing`, `err` ends with the phase lines of `timing`.
    """
    timer = timing.Timer() if settings.timing else None
    # Decoding makes hundreds of thousands of long-lived objects, and the collector's default
    # thresholds would traverse them again and again (about a sixth of a 7,000-claim run): a
    # larger first generation, and the decoded objects frozen out of later collections, cut
    # that to a few percent without changing peak memory. Restored on return.
    thresholds = gc.get_threshold()
    gc.set_threshold(_GC_GEN0, *thresholds[1:])
    try:
        return _run(settings, out=out, err=err, timer=timer)
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)
        if timer is not None:
            timer.close(err)


def _run(settings: config.Simulate, *, out: TextIO, err: TextIO, timer: timing.Timer | None) -> int:
    try:
        objects = decode.load_paths(settings.paths or (EXAMPLES,))
    except decode.DecodeError as error:
        for problem in error.problems:
            print(problem, file=err)
        return 1
    gc.freeze()  # the decoded objects live until the end: later collections skip them
    if timer is not None:
        count = sum(map(len, (objects.device_classes, objects.resource_slices, objects.resource_claims)))
        count += len(objects.resource_claim_templates) + len(objects.pods) + len(objects.nodes)
        timer.phase("decode", objects=count)
    # The API server refuses objects whose selectors do not compile; so does the simulation.
    invalid = engine.refused(objects)
    if invalid:
        for problem in invalid:
            print(problem, file=err)
        return 1
    for warning in (*objects.warnings, *engine.unpreparable(objects)):
        print(f"warning: {warning}", file=err)
    if timer is not None:
        timer.phase("validate")
    result = engine.simulate(
        objects,
        policy=settings.policy,
        search_limit=settings.search_limit,
        topology_levels=settings.topology_levels,
    )
    for warning in result.warnings:
        print(f"warning: {warning}", file=err)
    if timer is not None:
        timer.record("index", result.index_seconds, nodes=len(result.nodes), slices=len(objects.resource_slices))
        rate = f"{result.allocate_claims_per_second:.1f}"
        timer.record("allocate", result.allocate_seconds, claims=result.attempted, claims_per_s=rate)
        timer.restart()
    report.write(result, slices=objects.resource_slices, settings=settings, out=out, err=err)
    out.flush()
    if timer is not None:
        timer.phase("output", format=settings.output.value)
    return 0
