"""What each dractl component asks of the Kubernetes API: the one table the Helm chart's RBAC comes from.

What it does: `COMPONENTS` names, for every part of dractl that talks to the API server, the
modules whose code makes the calls, the helper classes it builds (an Event `Recorder`, a Lease
`Elector`, a claim reader), and the rules its own calls need: resource (with subresource) and
verbs, for the whole cluster or only for the component's own namespace. `rules(names)` merges
the rules of a set of components and of the helpers they use into sorted RBAC rules;
`chart_rbac()` is what `tools/gen_rbac.py` writes for the chart (`charts/dractl/files/rbac.yaml`):
the node agent's rules, and the controller's for every set of `--controllers`.
`IMPLIED` adds what the API server checks beyond a request's own resource and verb.
`tests/unit/kube/test_access.py` reads every call site in dractl and fails when a call is not in
this table or a rule is one no call needs, so the chart's RBAC follows the code.

What it must not do: import the controller or node packages (modules are named as strings),
or grant more than a call site needs.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
from collections.abc import Iterable
from typing import Any

from dractl.kube import client as kube_client

VERBS = ("get", "list", "watch", "create", "update", "patch", "delete")
"""The RBAC verbs, in the order rules list them."""


class Scope(enum.Enum):
    """Where a rule applies: every namespace (a ClusterRole) or only the component's own (a Role)."""

    CLUSTER = "cluster"
    OWN_NAMESPACE = "namespace"


@dataclasses.dataclass(frozen=True, slots=True)
class Rule:
    """Verbs on one resource (and subresource)."""

    resource: kube_client.Resource
    verbs: tuple[str, ...]
    subresource: str = ""
    scope: Scope = Scope.CLUSTER

    def __post_init__(self) -> None:
        unknown = [verb for verb in self.verbs if verb not in VERBS]
        if unknown or len(set(self.verbs)) != len(self.verbs):
            raise ValueError(f"rule on {self.name}: verbs must be distinct RBAC verbs, got {list(self.verbs)}")

    @property
    def name(self) -> str:
        """The resource as RBAC names it: `pods`, `pods/status`."""
        return f"{self.resource.plural}/{self.subresource}" if self.subresource else self.resource.plural


@dataclasses.dataclass(frozen=True, slots=True)
class Component:
    """A part of dractl that talks to the API: its modules, the helpers it builds and its own calls' rules.

    `builds` names helper classes; a component whose modules construct one needs that helper's
    component (the one whose `provides` names it) as well.
    """

    name: str
    modules: tuple[str, ...]
    rules: tuple[Rule, ...] = ()
    builds: tuple[str, ...] = ()
    provides: tuple[str, ...] = ()


COMPONENTS: tuple[Component, ...] = (
    Component(
        "leader-election",
        modules=("dractl.kube.leader",),
        provides=("Elector",),
        rules=(
            Rule(kube_client.LEASES, ("get", "create", "update"), scope=Scope.OWN_NAMESPACE),
            # The holder's own pod (its UID, named in the Lease) and a holder's pod (gone: take over at once).
            Rule(kube_client.PODS, ("get",), scope=Scope.OWN_NAMESPACE),
        ),
    ),
    Component(
        "events",
        modules=("dractl.kube.events",),
        provides=("Recorder",),
        rules=(Rule(kube_client.EVENTS, ("create", "patch")),),
    ),
    Component(
        "claim-reader",
        modules=("dractl.kube.claims",),
        provides=("ApiClaimSource",),
        rules=(Rule(kube_client.RESOURCE_CLAIMS, ("get", "list")),),
    ),
    Component("controller", modules=("dractl.controller.run",), builds=("Elector", "Recorder")),
    Component(
        "claims",
        modules=("dractl.controller.claims",),
        builds=("Recorder",),
        rules=(
            Rule(kube_client.PODS, ("get", "list", "watch")),
            Rule(kube_client.PODS, ("patch",), subresource="status"),
            Rule(kube_client.RESOURCE_CLAIMS, ("get", "list", "watch", "create", "update", "delete")),
            Rule(kube_client.RESOURCE_CLAIMS, ("patch",), subresource="status"),
            Rule(kube_client.RESOURCE_CLAIMS, ("patch",), subresource="binding"),
            Rule(kube_client.RESOURCE_CLAIM_TEMPLATES, ("get", "list", "watch")),
            Rule(kube_client.POD_GROUPS, ("get", "list", "watch")),
            Rule(kube_client.POD_GROUPS, ("patch",), subresource="status"),
        ),
    ),
    Component(
        "scheduler",
        modules=("dractl.controller.scheduler", "dractl.controller.schedcommit"),
        builds=("Recorder",),
        rules=(
            Rule(kube_client.PODS, ("get", "list", "watch")),
            Rule(kube_client.PODS, ("patch",), subresource="status"),
            Rule(kube_client.PODS, ("create",), subresource="binding"),
            Rule(kube_client.NODES, ("list", "watch")),
            Rule(kube_client.RESOURCE_CLAIMS, ("get", "list", "watch", "update", "patch")),
            Rule(kube_client.RESOURCE_CLAIMS, ("patch",), subresource="status"),
            Rule(kube_client.RESOURCE_CLAIMS, ("patch",), subresource="binding"),
            Rule(kube_client.RESOURCE_SLICES, ("list", "watch")),
            Rule(kube_client.DEVICE_CLASSES, ("list", "watch")),
            # PodGroups of both APIs, watched where the server serves them (gangs).
            Rule(kube_client.POD_GROUPS, ("list", "watch")),
            Rule(kube_client.COSCHEDULING_POD_GROUPS, ("list", "watch")),
        ),
    ),
    Component(
        "node-agent",
        modules=("dractl.node.agent", "dractl.node.publish"),
        builds=("ApiClaimSource", "Recorder"),
        rules=(
            Rule(kube_client.NODES, ("get", "list", "watch")),
            Rule(kube_client.RESOURCE_SLICES, ("list", "watch", "create", "update", "delete")),
        ),
    ),
)

IMPLIED: dict[tuple[str, str, str], Rule] = {
    (kube_client.RESOURCE_CLAIMS.group, f"{kube_client.RESOURCE_CLAIMS.plural}/status", verb): Rule(
        kube_client.RESOURCE_CLAIMS, (verb,), subresource="binding"
    )
    for verb in ("update", "patch")
}
"""Permissions the API server checks beyond a request's own, keyed by (group, resource, verb) of the request:
since Kubernetes 1.36 a write of a claim's status.allocation or status.reservedFor also needs the same verb on
the synthetic subresource resourceclaims/binding (a status write that changes neither does not, but every
status write dractl makes does)."""

CONTROLLERS = ("claims", "scheduler")
"""The components `dractl controller --controllers` chooses from (the keys of `dractl.controller.run.CONTROLLERS`)."""

UNCHECKED = {
    "dractl.explain.cluster": "`dractl explain` runs with its user's own credentials; the chart deploys none",
}
"""Modules that read the API but belong to no deployed component, and why."""


def component(name: str) -> Component:
    """The component called `name`. Raises KeyError naming the known ones."""
    for candidate in COMPONENTS:
        if candidate.name == name:
            return candidate
    raise KeyError(f"no component {name!r} (known: {', '.join(c.name for c in COMPONENTS)})")


def closure(names: Iterable[str]) -> tuple[Component, ...]:
    """The named components and every helper component they build, in table order. Pure."""
    wanted = {component(name).name for name in names}
    providers = {cls: c.name for c in COMPONENTS for cls in c.provides}
    pending = list(wanted)
    while pending:
        for built in component(pending.pop()).builds:
            helper = providers[built]
            if helper not in wanted:
                wanted.add(helper)
                pending.append(helper)
    return tuple(c for c in COMPONENTS if c.name in wanted)


def rules(names: Iterable[str], *, scope: Scope) -> list[dict[str, Any]]:
    """The merged RBAC rules of `names` (helpers included) for one scope, as PolicyRule dicts. Pure.

    One rule per API group and resource, verbs in `VERBS` order, sorted by group then resource,
    so the same components always give the same text.
    """
    merged: dict[tuple[str, str], set[str]] = {}
    for part in closure(names):
        for rule in part.rules:
            if rule.scope is scope:
                merged.setdefault((rule.resource.group, rule.name), set()).update(rule.verbs)
    return [
        {"apiGroups": [group], "resources": [resource], "verbs": [verb for verb in VERBS if verb in verbs]}
        for (group, resource), verbs in sorted(merged.items())
    ]


def _role(names: Iterable[str]) -> dict[str, list[dict[str, Any]]]:
    parts = tuple(names)
    return {
        "clusterRules": rules(parts, scope=Scope.CLUSTER),
        "namespaceRules": rules(parts, scope=Scope.OWN_NAMESPACE),
    }


def chart_rbac() -> dict[str, Any]:
    """What `charts/dractl/files/rbac.yaml` holds: the node agent's rules, and the controller's keyed by
    every non-empty set of controllers (names sorted and comma-joined, as the chart looks them up). Pure."""
    controller: dict[str, Any] = {}
    for size in range(1, len(CONTROLLERS) + 1):
        for chosen in itertools.combinations(sorted(CONTROLLERS), size):
            controller[",".join(chosen)] = _role(("controller", *chosen))
    return {"nodeAgent": _role(("node-agent",)), "controller": controller}
