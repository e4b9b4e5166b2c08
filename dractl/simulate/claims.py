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
    """

    pod_claim_name: str
    namespace: str
    name: str
    claim: model.ResourceClaim | None
    problem: str | None = None

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
    """Standalone claims (used by no pod) in input order, then the pods with claims in input order."""

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


def plan(objects: model.Objects) -> Plan:
    """Resolve every pod's claims and split off the claims no pod uses. Pure and deterministic:
    the same objects always give the same plan, claim names included."""
    claims = {claim.key: claim for claim in objects.resource_claims}
    owned = _owned_claims(objects.resource_claims)
    templates = {f"{t.meta.namespace}/{t.meta.name}": t for t in objects.resource_claim_templates}
    pods: list[PodWork] = []
    used: set[str] = set()
    for pod in objects.pods:
        if not pod.resource_claims:
            continue
        uid = pod_uid(pod)
        resolved = tuple(
            _resolve(pod, uid=uid, index=index, entry=entry, claims=claims, owned=owned, templates=templates)
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
