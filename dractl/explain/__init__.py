"""`dractl explain claim|pod NS/NAME`: the allocator's reasoning against a live cluster.

What it does: reads the cluster's DeviceClasses, ResourceSlices, Nodes and ResourceClaims (and
for a pod, the pod and its ResourceClaimTemplates, and for a member of a gang its PodGroup and the
other member pods) through `dractl.kube` (`cluster`), builds the
snapshot `dractl simulate` builds for the API's state, and explains the named claim or the
pod's claims by actually trying to allocate them against it (`reasoning`): where an allocated
claim is and who reserves it, the node and devices a pending claim would get now, or the
allocator's reasons per request. Prints text, JSON or YAML (`output`).

What it must not do: write to the cluster (the allocation it tries is never committed
anywhere), import `dractl.simulate` or `dractl.controller` (sibling modes: what they share
lives in `model` and `alloc`), or parse flags (the CLI does).

Exit codes of `run`: 0 when the explanation was printed, whatever it says; 1 when the claim or
pod does not exist, the server cannot be reached or refuses, or the kubeconfig is unusable
(one line on `err`). A malformed target name is the CLI's exit 2 (`parse_target`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import TextIO

from dractl import config
from dractl.explain import cluster, output, reasoning
from dractl.kube import client as kube_client
from dractl.kube import ratelimit

# Namespaces are DNS-1123 labels; pod and claim names DNS-1123 subdomains (as the API server checks).
_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_NAMESPACE = re.compile(_LABEL)
_NAME = re.compile(rf"{_LABEL}(\.{_LABEL})*")


def parse_target(text: str) -> tuple[str, str]:
    """`NS/NAME` as (namespace, name). Raises ValueError with a one-line message saying what
    is wrong. Pure."""
    namespace, slash, name = text.partition("/")
    if not slash or not namespace or not name:
        raise ValueError(f"{text!r} is not NAMESPACE/NAME")
    if len(namespace) > 63 or not _NAMESPACE.fullmatch(namespace):
        raise ValueError(f"{namespace!r} is not a namespace name (lowercase letters, digits and '-', at most 63)")
    if len(name) > 253 or not _NAME.fullmatch(name):
        raise ValueError(f"{name!r} is not an object name (lowercase letters, digits, '-' and '.', at most 253)")
    return namespace, name


Connect = Callable[[config.Explain], cluster.Reader]


def _connect(settings: config.Explain) -> cluster.Reader:
    return kube_client.connect(
        settings.kubeconfig,
        attempts=3,
        limiter=ratelimit.TokenBucket(settings.kube_api_qps, settings.kube_api_burst),
    )


def explain(
    settings: config.Explain, reader: cluster.Reader
) -> tuple[reasoning.Claim | reasoning.Pod, tuple[str, ...]]:
    """Read what the target needs and explain it; returns the explanation and the warnings
    (objects skipped because dractl cannot decode them). Raises `cluster.ReadError`. Read-only."""
    if settings.kind is config.ExplainKind.CLAIM:
        claim = cluster.read_claim(reader, settings.namespace, settings.name)
        state = cluster.read_cluster(reader)
        explained: reasoning.Claim | reasoning.Pod = reasoning.explain_claim(
            claim, cluster=state.objects, policy=settings.policy, search_limit=settings.search_limit
        )
        return explained, state.warnings
    pod = cluster.read_pod(reader, settings.namespace, settings.name)
    gang = cluster.read_gang(reader, pod.pod)
    state = cluster.read_cluster(reader)
    claims = {claim.key: claim for claim in state.objects.resource_claims}

    def resolved(member: cluster.PodInput) -> tuple[reasoning.PodClaim, ...]:
        return reasoning.resolve_pod_claims(
            member.pod, claim_statuses=member.claim_statuses, claims=claims, templates=member.templates
        )

    explained = reasoning.explain_pod(
        pod.pod,
        pod_claims=resolved(pod),
        cluster=state.objects,
        policy=settings.policy,
        search_limit=settings.search_limit,
    )
    if gang is None:
        return explained, (*pod.warnings, *state.warnings)
    explained_gang = reasoning.explain_gang(
        pod.pod,
        group=gang.group,
        problem=gang.problem,
        members=[(member.pod, resolved(member)) for member in gang.members],
        cluster=state.objects,
        policy=settings.policy,
        search_limit=settings.search_limit,
    )
    explained = dataclasses.replace(explained, gang=explained_gang)
    refused = explained_gang.fits is False or explained.name in explained_gang.left
    if refused and explained.state is not reasoning.PodState.BLOCKED:
        # A member of a gang is placed with its gang (in its domain) or not at all, whatever its claims do alone.
        explained = dataclasses.replace(
            explained, state=reasoning.PodState.BLOCKED, node=None, reasons=(explained_gang.line, *explained.reasons)
        )
    member_warnings = (w for member in gang.members for w in member.warnings)
    return explained, (*pod.warnings, *gang.warnings, *dict.fromkeys(member_warnings), *state.warnings)


def run(settings: config.Explain, *, out: TextIO, err: TextIO, connect: Connect = _connect) -> int:
    """Explain and print; returns the exit code (see the module's docstring). Warnings go to
    `err` as `warning:` lines whatever the format."""
    try:
        reader = connect(settings)
    # The kubeconfig loader raises its own exception types (and OSError, ValueError, ...) for a
    # missing or broken file; none may become a traceback, and only dractl.kube may name them.
    except Exception as error:  # noqa: BLE001
        where = settings.kubeconfig or "the in-cluster config, $KUBECONFIG or ~/.kube/config"
        print(f"dractl explain: cannot use the kubeconfig ({where}): {error}", file=err)
        return 1
    try:
        explained, warnings = explain(settings, reader)
    except cluster.ReadError as error:
        print(f"dractl explain: {error}", file=err)
        return 1
    finally:
        reader.close()
    for warning in warnings:
        print(f"warning: {warning}", file=err)
    output.write(explained, output=settings.output, warnings=warnings, out=out)
    return 0
