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
pod does not exist, the server cannot be reached, refuses or answers what dractl cannot read,
the kubeconfig is unusable, or the run takes longer than `--timeout` (one line on `err`). A
malformed target name is the CLI's exit 2 (`parse_target`).
"""

from __future__ import annotations

import dataclasses
import re
import threading
from collections.abc import Callable
from typing import Any, TextIO

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
Explained = tuple[reasoning.Claim | reasoning.Pod, tuple[str, ...]]
"""An explanation and its warnings (objects skipped because dractl cannot decode them)."""


def _connect(settings: config.Explain) -> cluster.Reader:
    return kube_client.connect(
        settings.kubeconfig,
        attempts=3,
        limiter=ratelimit.TokenBucket(settings.kube_api_qps, settings.kube_api_burst),
    )


def explain(settings: config.Explain, reader: cluster.Reader) -> Explained:
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


class _Progress:
    """What the explain thread is doing, for the line printed when `--timeout` passes: the server once connected, and
    the request in flight (None between requests). Written by that thread, read by the waiting one."""

    def __init__(self) -> None:
        self.host: str | None = None
        self.doing: str | None = None

    def late(self, timeout: float) -> str:
        """The one line for a run that did not end within `timeout` seconds."""
        bound = f"--timeout {timeout:g} s"
        if self.host is None:
            return f"the kubeconfig was not read, nor a client made from it, within {bound}"
        if self.doing is not None:
            return f"no complete answer from the API server {self.host} to {self.doing} within {bound}"
        return f"the explanation did not end within {bound}"


class _Watched:
    """A `cluster.Reader` that records each request in flight in a `_Progress`."""

    def __init__(self, reader: cluster.Reader, progress: _Progress) -> None:
        self._reader = reader
        self._progress = progress
        progress.host = reader.host

    @property
    def host(self) -> str:
        return self._reader.host

    def get(self, resource: kube_client.Resource, name: str, *, namespace: str = "") -> dict[str, Any]:
        self._progress.doing = f"get {resource.kind} {namespace + '/' if namespace else ''}{name}"
        try:
            return self._reader.get(resource, name, namespace=namespace)
        finally:
            self._progress.doing = None

    def list(
        self, resource: kube_client.Resource, *, namespace: str = "", label_selector: str = "", field_selector: str = ""
    ) -> kube_client.ListResult:
        self._progress.doing = f"list {resource.plural}"
        try:
            return self._reader.list(
                resource, namespace=namespace, label_selector=label_selector, field_selector=field_selector
            )
        finally:
            self._progress.doing = None

    def close(self) -> None:
        self._reader.close()


def _connect_and_explain(settings: config.Explain, connect: Connect, progress: _Progress) -> Explained | str:
    """Read the kubeconfig, read the cluster and explain: the explanation and its warnings, or the one line (without
    the `dractl explain: ` prefix) of why not."""
    try:
        reader = connect(settings)
    # The kubeconfig loader raises its own exception types (and OSError, ValueError, ...) for a
    # missing or broken file; none may become a traceback, and only dractl.kube may name them.
    except Exception as error:  # noqa: BLE001
        where = settings.kubeconfig or "the in-cluster config, $KUBECONFIG or ~/.kube/config"
        return f"cannot use the kubeconfig ({where}): {error}"
    try:
        return explain(settings, _Watched(reader, progress))
    except cluster.ReadError as error:
        return str(error)
    finally:
        reader.close()


def run(settings: config.Explain, *, out: TextIO, err: TextIO, connect: Connect = _connect) -> int:
    """Explain and print; returns the exit code (see the module's docstring). Warnings go to
    `err` as `warning:` lines whatever the format.

    The work runs on a thread of its own that `settings.timeout` bounds as a whole: a server
    that trickles its answer a byte at a time, or stays silent through every retry, ends the run
    with one line naming the server and what was being read once the time is up (the thread is a
    daemon, left to end with its connection or the process).
    """
    progress = _Progress()
    outcome: list[Explained | str] = []
    failure: list[BaseException] = []

    def work() -> None:
        try:
            outcome.append(_connect_and_explain(settings, connect, progress))
        except BaseException as error:  # noqa: BLE001 - raised again on the caller's thread
            failure.append(error)

    worker = threading.Thread(target=work, name="dractl-explain", daemon=True)
    worker.start()
    worker.join(settings.timeout)
    if failure:
        raise failure[0]
    if not outcome:
        print(f"dractl explain: {progress.late(settings.timeout)}", file=err)
        return 1
    result = outcome[0]
    if isinstance(result, str):
        print(f"dractl explain: {result}", file=err)
        return 1
    explained, warnings = result
    for warning in warnings:
        print(f"warning: {warning}", file=err)
    output.write(explained, output=settings.output, warnings=warnings, out=out)
    return 0
