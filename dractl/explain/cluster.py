"""What `dractl explain` reads from the cluster, decoded into model values.

What it does: through an injected `Reader` (a `dractl.kube.client.Client` in the CLI), lists
the DeviceClasses, ResourceSlices, Nodes and every ResourceClaim (all namespaces: claims of
other namespaces hold devices too), gets the claim or pod named on the command line and the
ResourceClaimTemplates a pod uses, and for a pod that joins a PodGroup the group (of the API the
pod joins through, where the server serves it: a 404 on its collection says it does not) and
the other pods of its namespace that join it, and decodes one object at a time: an object dractl
cannot decode becomes a warning naming it and is skipped, so one bad slice does not hide the rest.
Failures become `ReadError` with one line for a person: a missing target names it, an
unreachable or refusing server names the server and the resource.

What it must not do: write anything, hold a cache, decide anything (that is `reasoning`), or
import the `kubernetes` package (only `dractl.kube` does).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from dractl import model
from dractl.kube import client as kube_client
from dractl.model import decode

# The resource of each PodGroup API.
POD_GROUPS = {
    model.PodGroupApi.WORKLOAD: kube_client.POD_GROUPS,
    model.PodGroupApi.COSCHEDULING: kube_client.COSCHEDULING_POD_GROUPS,
}


class Reader(Protocol):
    """The reads `dractl explain` makes; `kube_client.Client` provides them. Objects come back
    with their `apiVersion` and `kind` (as the client fills them in), so they decode alone."""

    @property
    def host(self) -> str: ...

    def get(self, resource: kube_client.Resource, name: str, *, namespace: str = "") -> dict[str, Any]: ...

    def list(
        self, resource: kube_client.Resource, *, namespace: str = "", label_selector: str = "", field_selector: str = ""
    ) -> kube_client.ListResult: ...

    def close(self) -> None: ...


class ReadError(Exception):
    """A read that cannot give what `explain` needs; str() is one line for a person."""


class NotFound(ReadError):
    """The claim or pod named on the command line does not exist."""


@dataclasses.dataclass(frozen=True, slots=True)
class Cluster:
    """The cluster's allocation state: classes, slices, nodes and every claim, as model values,
    and one warning per object that was skipped because dractl cannot decode it."""

    objects: model.Objects
    warnings: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class PodInput:
    """A pod with what `reasoning.resolve_pod_claims` needs beyond the cluster: its recorded
    `status.resourceClaimStatuses` (pod claim -> claim name, None for "no claim needed") and
    the templates its claims name (by name), with a warning per template that was skipped."""

    pod: model.Pod
    claim_statuses: Mapping[str, str | None]
    templates: Mapping[str, model.ResourceClaimTemplate]
    warnings: tuple[str, ...] = ()


def _name(raw: Mapping[str, Any]) -> str:
    meta = raw.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    name = str(meta.get("name") or "(unnamed)")
    return f"{meta['namespace']}/{name}" if meta.get("namespace") else name


def _failure(reader: Reader, *, verb: str, what: str, error: kube_client.ApiError) -> ReadError:
    """One line for a request the server refused or could not answer, naming the server and what was read."""
    if isinstance(error, kube_client.BadAnswer):
        return ReadError(
            f"the API server {reader.host} gave an answer dractl cannot read to {verb} {what}: {error.message}"
        )
    if isinstance(error, kube_client.Transient) and error.status == 0:
        return ReadError(f"cannot reach the API server {reader.host} to {verb} {what}: {error.message}")
    if error.status in (401, 403):
        return ReadError(f"the API server {reader.host} refuses to {verb} {what}: {error}")
    return ReadError(f"cannot {verb} {what} on the API server {reader.host}: {error}")


def _list(
    reader: Reader, resource: kube_client.Resource, *, namespace: str = "", label_selector: str = ""
) -> Sequence[dict[str, Any]]:
    try:
        return reader.list(resource, namespace=namespace, label_selector=label_selector).items
    except kube_client.ApiError as error:
        raise _failure(reader, verb="list", what=resource.plural, error=error) from error


def _get(reader: Reader, resource: kube_client.Resource, name: str, *, namespace: str = "") -> dict[str, Any] | None:
    """The raw object, or None when it does not exist (or its namespace does not)."""
    try:
        return reader.get(resource, name, namespace=namespace)
    except kube_client.NotFound:
        return None
    except kube_client.ApiError as error:
        what = f"{resource.kind} {namespace}/{name}" if namespace else f"{resource.kind} {name}"
        raise _failure(reader, verb="get", what=what, error=error) from error


def _decoded(raws: Iterable[Mapping[str, Any]], kind: type[Any], warnings: list[str]) -> list[Any]:
    """The raw objects that decode into `kind`; each one that does not is a warning naming it."""
    values = []
    for raw in raws:
        try:
            value = kube_client.decode(raw, strict=True)
        except kube_client.BadObject as bad:
            warnings.append(f"skipping {raw.get('kind')} {_name(raw)}: dractl cannot decode it: {bad}")
            continue
        if isinstance(value, kind):
            values.append(value)
    return values


def _target(reader: Reader, resource: kube_client.Resource, namespace: str, name: str) -> tuple[dict[str, Any], Any]:
    """The claim or pod named on the command line, raw and decoded. Raises `NotFound`, or
    `ReadError` when it does not decode (it cannot be skipped: it is what was asked about)."""
    raw = _get(reader, resource, name, namespace=namespace)
    if raw is None:
        raise NotFound(f"{resource.kind} {namespace}/{name} not found on the API server {reader.host}")
    try:
        return raw, kube_client.decode(raw, strict=True)
    except kube_client.BadObject as bad:
        raise ReadError(
            f"{resource.kind} {namespace}/{name} cannot be explained: dractl cannot decode it: {bad}"
        ) from bad


def read_claim(reader: Reader, namespace: str, name: str) -> model.ResourceClaim:
    """The named claim. Raises `NotFound` or `ReadError`. Read-only."""
    _, claim = _target(reader, kube_client.RESOURCE_CLAIMS, namespace, name)
    assert isinstance(claim, model.ResourceClaim)
    return claim


def read_cluster(reader: Reader) -> Cluster:
    """Every DeviceClass, ResourceSlice, Node and ResourceClaim. Raises `ReadError`. Read-only."""
    warnings: list[str] = []
    classes = _decoded(_list(reader, kube_client.DEVICE_CLASSES), model.DeviceClass, warnings)
    slices = _decoded(_list(reader, kube_client.RESOURCE_SLICES), model.ResourceSlice, warnings)
    nodes = _decoded(_list(reader, kube_client.NODES), model.Node, warnings)
    claims = _decoded(_list(reader, kube_client.RESOURCE_CLAIMS), model.ResourceClaim, warnings)
    objects = model.Objects(
        device_classes=tuple(classes), resource_slices=tuple(slices), resource_claims=tuple(claims), nodes=tuple(nodes)
    )
    return Cluster(objects=objects, warnings=tuple(warnings))


def claim_statuses(raw: Mapping[str, Any]) -> dict[str, str | None]:
    """A raw pod's `status.resourceClaimStatuses` as pod claim -> claim name (None when the
    entry records that no claim is needed); entries without a name are ignored. Pure."""
    status = raw.get("status")
    entries = status.get("resourceClaimStatuses") if isinstance(status, Mapping) else None
    recorded: dict[str, str | None] = {}
    for entry in entries if isinstance(entries, list) else ():
        if isinstance(entry, Mapping) and isinstance(entry.get("name"), str):
            claim_name = entry.get("resourceClaimName")
            recorded[entry["name"]] = claim_name if isinstance(claim_name, str) and claim_name else None
    return recorded


def read_pod(reader: Reader, namespace: str, name: str) -> PodInput:
    """The named pod, its recorded claims and the templates it names that exist. Raises
    `NotFound` or `ReadError`. Read-only."""
    raw, pod = _target(reader, kube_client.PODS, namespace, name)
    assert isinstance(pod, model.Pod)
    return _pod_input(reader, raw, pod)


def _pod_input(reader: Reader, raw: Mapping[str, Any], pod: model.Pod) -> PodInput:
    warnings: list[str] = []
    templates: dict[str, model.ResourceClaimTemplate] = {}
    for template_name in sorted({e.resource_claim_template_name or "" for e in pod.resource_claims} - {""}):
        found = _get(reader, kube_client.RESOURCE_CLAIM_TEMPLATES, template_name, namespace=pod.meta.namespace)
        for template in _decoded((found,) if found is not None else (), model.ResourceClaimTemplate, warnings):
            templates[template_name] = template
    return PodInput(pod=pod, claim_statuses=claim_statuses(raw), templates=templates, warnings=tuple(warnings))


@dataclasses.dataclass(frozen=True, slots=True)
class GangInput:
    """The PodGroup a pod joins and its member pods (the pod itself included, in name order), or, when the group
    cannot be read, `problem`: why (it does not exist, the server does not serve its API, it does not decode)."""

    group: model.PodGroup | None
    members: tuple[PodInput, ...] = ()
    problem: str | None = None
    warnings: tuple[str, ...] = ()


def read_gang(reader: Reader, pod: model.Pod) -> GangInput | None:
    """The PodGroup `pod` joins (None when it joins none), read through the API it joins by, and the pods of its
    namespace that join it, each with its recorded claims and templates. Whether the server serves the API is
    discovered, not assumed: listing the group's collection (by name) answers 404 where it does not. Raises
    `ReadError`. Read-only."""
    ref = pod.pod_group
    if ref is None:
        return None
    namespace, resource = pod.meta.namespace, POD_GROUPS[ref.api]
    what = f"PodGroup {namespace}/{ref.name} ({ref.api.value})"
    try:
        found = reader.list(resource, namespace=namespace, field_selector=f"metadata.name={ref.name}").items
    except kube_client.NotFound:
        how = (
            "its API is alpha: kube-apiserver needs --runtime-config=scheduling.k8s.io/v1alpha2=true and the "
            "GenericWorkload feature gate"
            if ref.api is model.PodGroupApi.WORKLOAD
            else "its CustomResourceDefinition (scheduler-plugins' coscheduling) is not installed"
        )
        return GangInput(group=None, problem=f"{what}: the API server {reader.host} does not serve it ({how})")
    except kube_client.ApiError as error:
        raise _failure(reader, verb="list", what=f"{resource.plural}.{resource.group}", error=error) from error
    raws = [raw for raw in found if (raw.get("metadata") or {}).get("name") == ref.name]
    if not raws:
        return GangInput(group=None, problem=f"{what} does not exist: a scheduler keeps the pod pending until it does")
    try:
        groups = decode.load_documents([resource.with_kind(dict(raws[0]))], file="api").pod_groups
    except decode.DecodeError as error:
        problems = "; ".join(error.problems)
        return GangInput(group=None, problem=f"{what} cannot be explained: dractl cannot decode it: {problems}")
    warnings: list[str] = []
    members: list[PodInput] = []
    selector = f"{model.POD_GROUP_LABEL}={ref.name}" if ref.api is model.PodGroupApi.COSCHEDULING else ""
    pods = _list(reader, kube_client.PODS, namespace=namespace, label_selector=selector)
    for raw in sorted(pods, key=_name):
        for member in _decoded((raw,), model.Pod, warnings):
            if member.pod_group == ref:
                members.append(_pod_input(reader, raw, member))
    return GangInput(group=groups[0], members=tuple(members), warnings=tuple(warnings))
