"""What `dractl explain` prints: indented text for people, or the same content as JSON or YAML.

What it does: `claim_data`/`pod_data` turn an explanation into plain data (camelCase keys,
devices as the API spells allocation results), `write` prints text or that data. The text and
the data carry the same facts: state, nodes, who reserves the claim, per request the class,
selectors, count, devices held or that would be taken, and the reasons.

What it must not do: read the cluster, allocate, or decide anything: it only formats.
Pure apart from writing to the stream it is given.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TextIO

import msgspec
import yaml

from dractl import config, model
from dractl.explain import reasoning

_INDENT = "  "


# --- Data ----------------------------------------------------------------------------------


def _device(result: model.DeviceRequestAllocationResult) -> dict[str, str]:
    entry = {"driver": result.driver, "pool": result.pool, "device": result.device}
    if result.share_id:
        entry["shareID"] = result.share_id
    return entry


def _request_data(request: reasoning.Request) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": request.name,
        "deviceClassName": request.device_class,
        "allocationMode": "All" if request.count is None else "ExactCount",
        "count": request.count,
        "selectors": list(request.selectors),
    }
    if request.admin_access:
        data["adminAccess"] = True
    if request.capacity:
        data["capacity"] = dict(request.capacity)
    data["devices"] = [_device(result) for result in request.devices]
    data["reasons"] = list(request.reasons)
    return data


def claim_data(claim: reasoning.Claim) -> dict[str, Any]:
    """One claim as plain data. `nodes` null means every node. Pure."""
    data: dict[str, Any] = {"namespace": claim.namespace, "name": claim.name, "status": claim.state.value}
    data["created"] = claim.created
    if claim.template is not None:
        data["template"] = claim.template
    if claim.pod_claim is not None:
        data["podClaim"] = claim.pod_claim
    data["nodes"] = None if claim.nodes is None else list(claim.nodes)
    data["reservedFor"] = list(claim.reserved_for)
    data["requests"] = [_request_data(request) for request in claim.requests]
    data["constraints"] = list(claim.constraints)
    data["reasons"] = list(claim.reasons)
    return data


def pod_data(pod: reasoning.Pod) -> dict[str, Any]:
    """A pod and its claims as plain data. `candidateNodes` null means any node; `gang` is there only for a pod
    that joins a PodGroup (`fits` null: the group cannot be read). Pure."""
    data: dict[str, Any] = {
        "namespace": pod.namespace,
        "name": pod.name,
        "status": pod.state.value,
        "node": pod.node,
        "nodeName": pod.node_name,
        "nodeSelector": dict(pod.node_selector),
        "candidateNodes": None if pod.candidates is None else list(pod.candidates),
        "reasons": list(pod.reasons),
    }
    if pod.gang is not None:
        g = pod.gang
        data["gang"] = {
            "podGroup": g.name,
            "apiVersion": g.api,
            "members": list(g.members),
            "bound": list(g.bound),
            "fits": g.fits,
            "left": list(g.left),
            "reason": g.line,
        }
    data["claims"] = [claim_data(claim) for claim in pod.claims]
    return data


# --- Text ----------------------------------------------------------------------------------


def _where(nodes: tuple[str, ...] | None) -> str:
    if nodes is None:
        return " (usable on every node)"
    if not nodes:
        return ""
    return f" on node {nodes[0]}" if len(nodes) == 1 else f" on nodes {', '.join(nodes)}"


def _item(label: str, text: str, *, depth: int) -> list[str]:
    """`label: text` at `depth`, a multi-line text (a CEL message with its "write instead")
    continuing under the label, indented one level further."""
    first, *rest = text.split("\n")
    pad = _INDENT * depth
    return [f"{pad}{label}: {first}", *(f"{pad}{_INDENT}{line}" for line in rest)]


def _request_lines(request: reasoning.Request, *, state: reasoning.State, depth: int) -> list[str]:
    amount = "all devices" if request.count is None else f"{request.count} device{'' if request.count == 1 else 's'}"
    head = f"{amount} of class {request.device_class or '(none)'}"
    if request.admin_access:
        head += ", admin access"
    lines = _item(f"request {request.name}", head, depth=depth)
    inner = depth + 1
    for selector in request.selectors:
        lines += _item("selector", selector, depth=inner)
    for name, amount_text in request.capacity.items():
        lines += _item("capacity", f"{name} {amount_text}", depth=inner)
    if request.devices:
        label = "would get" if state is reasoning.State.FITS else "devices"
        lines += _item(label, ", ".join(f"{r.driver}/{r.pool}/{r.device}" for r in request.devices), depth=inner)
    for reason in request.reasons:
        lines += _item("why", reason, depth=inner)
    return lines


def claim_lines(claim: reasoning.Claim, *, depth: int = 0) -> list[str]:
    """The claim as indented lines. Pure."""
    head = claim.state.value
    if claim.state in (reasoning.State.ALLOCATED, reasoning.State.FITS):
        head += _where(claim.nodes)
    if claim.state is reasoning.State.FITS:
        head += " (nothing is written: a scheduler allocates it)"
    name = claim.name if claim.created else f"{claim.name}<suffix>"
    lines = _item(f"ResourceClaim {claim.namespace}/{name}", head, depth=depth)
    inner = depth + 1
    if not claim.created and claim.state is not reasoning.State.MISSING:
        lines += _item("not created yet", f"explained from ResourceClaimTemplate {claim.template}", depth=inner)
    if claim.reserved_for:
        lines += _item("reserved for", ", ".join(claim.reserved_for), depth=inner)
    for request in claim.requests:
        lines += _request_lines(request, state=claim.state, depth=inner)
    for constraint in claim.constraints:
        lines += _item("constraint", constraint, depth=inner)
    for reason in claim.reasons:
        lines += _item("why", reason, depth=inner)
    return lines


def pod_lines(pod: reasoning.Pod) -> list[str]:
    """The pod, its node constraints and its claims as indented lines. Pure."""
    head = pod.state.value
    if pod.state is not reasoning.PodState.BLOCKED and pod.node is not None:
        head += f" on node {pod.node}"
    lines = _item(f"Pod {pod.namespace}/{pod.name}", head, depth=0)
    if pod.node_name:
        lines += _item("spec.nodeName", pod.node_name, depth=1)
    if pod.node_selector:
        lines += _item("spec.nodeSelector", ", ".join(f"{k}={v}" for k, v in pod.node_selector.items()), depth=1)
    nodes = "any node" if pod.candidates is None else ", ".join(pod.candidates) or "none"
    lines += _item("nodes it may use", nodes, depth=1)
    if pod.gang is not None:
        lines += _item("gang", pod.gang.line, depth=1)
        if pod.gang.members:
            bound = f" ({len(pod.gang.bound)} bound)" if pod.gang.bound else ""
            lines += _item("gang members", ", ".join(pod.gang.members) + bound, depth=2)
    for reason in pod.reasons:
        lines += _item("why", reason, depth=1)
    for claim in pod.claims:
        source = f"template {claim.template}" if claim.template is not None else "named claim"
        lines += _item(f"pod claim {claim.pod_claim}", source, depth=1)
        lines += claim_lines(claim, depth=2)
    return lines


# --- Writing -------------------------------------------------------------------------------


def write(
    explained: reasoning.Claim | reasoning.Pod,
    *,
    output: config.ExplainOutput,
    warnings: Sequence[str] = (),
    out: TextIO,
) -> None:
    """Print the explanation in `output`'s format. The data formats carry `warnings` (objects
    skipped while reading) in a `warnings` list; text leaves them to the caller, which prints
    them on stderr whatever the format."""
    if output is config.ExplainOutput.TEXT:
        lines = pod_lines(explained) if isinstance(explained, reasoning.Pod) else claim_lines(explained)
        out.write("\n".join(lines) + "\n")
        return
    key = "pod" if isinstance(explained, reasoning.Pod) else "claim"
    body = pod_data(explained) if isinstance(explained, reasoning.Pod) else claim_data(explained)
    document: Mapping[str, Any] = {key: body, "warnings": list(warnings)}
    if output is config.ExplainOutput.JSON:
        out.write(msgspec.json.format(msgspec.json.encode(document), indent=2).decode() + "\n")
    else:
        out.write(yaml.dump(document, Dumper=yaml.CSafeDumper, sort_keys=False, allow_unicode=True, width=1 << 16))
