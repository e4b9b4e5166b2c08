"""Which claims a simulation allocates, in which order, and the claims pods get from templates.

Pure: no I/O and no allocation. It does offline what kube-controller-manager's resourceclaim
controller does for pods: a ResourceClaim per `resourceClaimTemplateName` entry (named like
upstream, with a deterministic suffix where the API server would pick a random one), and a
lookup in the pod's namespace per `resourceClaimName` entry.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Container, Mapping, Sequence

from dractl import model
from dractl.model import podclaims

# The naming rule lives in `model.podclaims`, shared with the claim lifecycle controller.
POD_CLAIM_NAME_ANNOTATION = podclaims.POD_CLAIM_NAME_ANNOTATION
generate_name = podclaims.generate_name

# The API server's random suffix alphabet (k8s.io/apimachinery/pkg/util/rand): no vowels, so
# generated names never spell words.
_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_SUFFIX_LEN = 5
_UID_NAMESPACE = uuid.UUID("6f1c3a52-3f5e-4c1e-9d43-5b0c2f3a8e17")


@dataclasses.dataclass(frozen=True, slots=True)
class PodClaim:
    """One `spec.resourceClaims[]` entry of a pod, resolved to the claim it stands for.

    `claim` is None when the claim cannot exist (its template or the named claim is missing);
    then `problem` says why and `key`/`name` are what the claim would have been called.
    `pod_group` is set for a claim of the pod's PodGroup (`spec.resourceClaims` of a v1alpha2
    PodGroup, which the pod's entry repeats): one claim for the group, shared by its pods.
    """

    pod_claim_name: str
    namespace: str
    name: str
    claim: model.ResourceClaim | None
    problem: str | None = None
    pod_group: model.PodGroup | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclasses.dataclass(frozen=True, slots=True)
class PodWork:
    """A pod with claims, its UID (given or derived) and its resolved claims in spec order."""

    pod: model.Pod
    uid: str
    claims: tuple[PodClaim, ...]

    @property
    def key(self) -> str:
        return f"{self.pod.meta.namespace}/{self.pod.meta.name}"


@dataclasses.dataclass(frozen=True, slots=True)
class Plan:
    """Standalone claims (used by no pod) in input order, then the pods with claims, and the pods of
    PodGroups with or without claims, in input order."""

    standalone: tuple[model.ResourceClaim, ...]
    pods: tuple[PodWork, ...]


def generated_claim_name(pod_name: str, pod_claim_name: str, *, namespace: str, attempt: int = 0) -> str:
    """`generate_name(...)` plus five characters from the API server's alphabet, derived
    from a hash of namespace, pod and pod claim so that every run names claims alike. Pure.
    `attempt` > 0 gives another name, as the API server's next try does when a name is taken."""
    import hashlib  # imported here: loading OpenSSL takes milliseconds that runs without pods do not need

    seed = f"{namespace}/{pod_name}/{pod_claim_name}" + (f"/{attempt}" if attempt else "")
    digest = hashlib.sha256(seed.encode()).digest()
    suffix = "".join(_SUFFIX_ALPHABET[byte % len(_SUFFIX_ALPHABET)] for byte in digest[:_SUFFIX_LEN])
    return generate_name(pod_name, pod_claim_name) + suffix


def free_claim_name(pod: model.Pod, pod_claim_name: str, *, taken: Container[str]) -> str:
    """The name the pod's claim gets from its template: `generated_claim_name`, or where another claim holds it
    (`taken` holds `namespace/name` keys) the next attempt's, as the API server tries another name. Pure."""
    namespace, attempt = pod.meta.namespace, 0
    name = generated_claim_name(pod.meta.name, pod_claim_name, namespace=namespace)
    while f"{namespace}/{name}" in taken:
        attempt += 1
        name = generated_claim_name(pod.meta.name, pod_claim_name, namespace=namespace, attempt=attempt)
    return name


def pod_uid(pod: model.Pod) -> str:
    """The pod's UID, or a UUID derived from its namespace and name when the input has none. Pure."""
    return pod.meta.uid or str(uuid.uuid5(_UID_NAMESPACE, f"pods/{pod.meta.namespace}/{pod.meta.name}"))


def claim_from_template(
    template: model.ResourceClaimTemplate, *, pod: model.Pod, uid: str, pod_claim_name: str, name: str
) -> model.ResourceClaim:
    """The claim the resourceclaim controller creates for `pod` from `template`, named `name` (`free_claim_name`):
    its labels and annotations plus the pod-claim-name annotation, a controller owner reference to the pod, and the
    template's spec verbatim. Pure."""
    namespace = pod.meta.namespace
    return model.ResourceClaim(
        meta=model.ObjectMeta(
            name=name,
            namespace=namespace,
            generate_name=generate_name(pod.meta.name, pod_claim_name),
            labels=dict(template.claim_labels),
            annotations={**template.claim_annotations, POD_CLAIM_NAME_ANNOTATION: pod_claim_name},
            owner_references=(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": pod.meta.name,
                    "uid": uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                },
            ),
        ),
        spec=template.spec,
        source=template.source,
    )


def _owned_claims(claims: Sequence[model.ResourceClaim]) -> dict[tuple[str, str, str], model.ResourceClaim]:
    """Claims already made for a pod claim, by (namespace, owner pod's uid, pod claim) and by (namespace, owner
    pod's name, pod claim): upstream looks for them before creating one, so feeding `-o yaml` output back in
    reuses them."""
    owned: dict[tuple[str, str, str], model.ResourceClaim] = {}
    for claim in claims:
        pod_claim_name = claim.meta.annotations.get(POD_CLAIM_NAME_ANNOTATION)
        if pod_claim_name is None:
            continue
        for ref in claim.meta.owner_references:
            if ref.get("kind") == "Pod" and ref.get("controller") is True:
                owned[(claim.meta.namespace, f"uid:{ref.get('uid')}", pod_claim_name)] = claim
                owned[(claim.meta.namespace, f"name:{ref.get('name')}", pod_claim_name)] = claim
    return owned


def _resolve(
    pod: model.Pod,
    *,
    uid: str,
    index: int,
    entry: model.PodResourceClaim,
    claims: Mapping[str, model.ResourceClaim],
    owned: Mapping[tuple[str, str, str], model.ResourceClaim],
    templates: Mapping[str, model.ResourceClaimTemplate],
) -> PodClaim:
    namespace = pod.meta.namespace
    where = f"pod {namespace}/{pod.meta.name} spec.resourceClaims[{index}] ({entry.name})"
    if entry.resource_claim_name is not None:
        claim = claims.get(f"{namespace}/{entry.resource_claim_name}")
        problem = (
            None
            if claim is not None
            else f"ResourceClaim {namespace}/{entry.resource_claim_name} does not exist (used by {where})"
        )
        return PodClaim(
            pod_claim_name=entry.name, namespace=namespace, name=entry.resource_claim_name, claim=claim, problem=problem
        )
    template_name = entry.resource_claim_template_name or ""
    # Upstream's orphan lookup: a claim this pod controls (by uid; by name for a pod the input gives no uid).
    owner = f"uid:{pod.meta.uid}" if pod.meta.uid else f"name:{pod.meta.name}"
    existing = owned.get((namespace, owner, entry.name))
    if existing is not None:
        return PodClaim(pod_claim_name=entry.name, namespace=namespace, name=existing.meta.name, claim=existing)
    name = free_claim_name(pod, entry.name, taken=claims)
    template = templates.get(f"{namespace}/{template_name}")
    if template is None:
        problem = f"ResourceClaimTemplate {namespace}/{template_name} does not exist (used by {where})"
        return PodClaim(pod_claim_name=entry.name, namespace=namespace, name=name, claim=None, problem=problem)
    claim = claim_from_template(template, pod=pod, uid=uid, pod_claim_name=entry.name, name=name)
    return PodClaim(pod_claim_name=entry.name, namespace=namespace, name=name, claim=claim)


def _group_claims(
    objects: model.Objects,
    *,
    claims: dict[str, model.ResourceClaim],
    templates: Mapping[str, model.ResourceClaimTemplate],
) -> dict[tuple[str, str, model.PodResourceClaim], PodClaim]:
    """The claims of v1alpha2 PodGroups, by (namespace, group, entry): a named claim, or one made from the template
    for the group (owned by it, named like a pod's), which joins `claims` so that later names avoid it. Pure but for
    `claims`."""
    resolved: dict[tuple[str, str, model.PodResourceClaim], PodClaim] = {}
    for group in objects.pod_groups:
        namespace = group.meta.namespace
        for index, entry in enumerate(group.resource_claims):
            where = f"PodGroup {group.key} spec.resourceClaims[{index}] ({entry.name})"
            if entry.resource_claim_name is not None:
                name = entry.resource_claim_name
                claim = claims.get(f"{namespace}/{name}")
                problem = (
                    None if claim is not None else f"ResourceClaim {namespace}/{name} does not exist (used by {where})"
                )
            else:
                name = free_claim_name(model.Pod(meta=group.meta), entry.name, taken=claims)
                template = templates.get(f"{namespace}/{entry.resource_claim_template_name}")
                claim, problem = None, None
                if template is None:
                    problem = (
                        f"ResourceClaimTemplate {namespace}/{entry.resource_claim_template_name} does not exist "
                        f"(used by {where})"
                    )
                else:
                    claim = claim_for_group(template, group=group, pod_claim_name=entry.name, name=name)
                    claims[claim.key] = claim
            resolved[(namespace, group.meta.name, entry)] = PodClaim(
                pod_claim_name=entry.name, namespace=namespace, name=name, claim=claim, problem=problem, pod_group=group
            )
    return resolved


def claim_for_group(
    template: model.ResourceClaimTemplate, *, group: model.PodGroup, pod_claim_name: str, name: str
) -> model.ResourceClaim:
    """The claim made from `template` for a PodGroup: as for a pod (`claim_from_template`), but owned by the
    group, with a controller reference without blockOwnerDeletion (as kube-controller-manager 1.36 makes it).
    Pure."""
    as_pod = model.Pod(meta=group.meta)
    claim = claim_from_template(template, pod=as_pod, uid=group_uid(group), pod_claim_name=pod_claim_name, name=name)
    pods_owner = {key: value for key, value in claim.meta.owner_references[0].items() if key != "blockOwnerDeletion"}
    owner = {**pods_owner, "apiVersion": group.api.value, "kind": "PodGroup"}
    return dataclasses.replace(claim, meta=dataclasses.replace(claim.meta, owner_references=(owner,)))


def group_uid(group: model.PodGroup) -> str:
    """The PodGroup's UID, or a UUID derived from its namespace and name when the input has none. Pure."""
    return group.meta.uid or str(uuid.uuid5(_UID_NAMESPACE, f"podgroups/{group.meta.namespace}/{group.meta.name}"))


def plan(objects: model.Objects) -> Plan:
    """Resolve every pod's claims and split off the claims no pod uses. Pure and deterministic:
    the same objects always give the same plan, claim names included. A pod's entry that repeats
    one of its v1alpha2 PodGroup's `spec.resourceClaims` exactly stands for the group's claim."""
    claims = {claim.key: claim for claim in objects.resource_claims}
    owned = _owned_claims(objects.resource_claims)
    templates = {f"{t.meta.namespace}/{t.meta.name}": t for t in objects.resource_claim_templates}
    group_claims = _group_claims(objects, claims=claims, templates=templates)
    pods: list[PodWork] = []
    used: set[str] = set()
    for pod in objects.pods:
        if not pod.resource_claims and pod.pod_group is None:
            continue
        uid = pod_uid(pod)
        # Only v1alpha2 PodGroups have claims of their own.
        ref = pod.pod_group
        group = ref.name if ref is not None and ref.api is model.PodGroupApi.WORKLOAD else ""
        resolved = tuple(
            group_claims.get((pod.meta.namespace, group, entry))
            or _resolve(pod, uid=uid, index=index, entry=entry, claims=claims, owned=owned, templates=templates)
            for index, entry in enumerate(pod.resource_claims)
        )
        used.update(item.key for item in resolved if item.claim is not None)
        pods.append(PodWork(pod=pod, uid=uid, claims=resolved))
    standalone = tuple(claim for claim in objects.resource_claims if claim.key not in used)
    return Plan(standalone=standalone, pods=tuple(pods))


def distinct(claims: Sequence[PodClaim]) -> tuple[PodClaim, ...]:
    """The pod's claims without repeats (a pod may name one claim under two entries). Pure."""
    seen: set[str] = set()
    result: list[PodClaim] = []
    for item in claims:
        if item.key not in seen:
            seen.add(item.key)
            result.append(item)
    return tuple(result)
