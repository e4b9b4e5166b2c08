"""How kube-controller-manager names and marks the ResourceClaims it makes from templates for pods.

What it does: the one implementation, shared by `dractl simulate` and the claim lifecycle
controller, of the claim's `metadata.generateName` (with upstream's proportional truncation)
and the annotation that ties a generated claim to its pod claim. What it must not do: add the
API server's random suffix (callers that need a concrete name do that), or do I/O.
"""

from __future__ import annotations

POD_CLAIM_NAME_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
"""On a generated claim: the `spec.resourceClaims[].name` of the pod it was made for."""

MAX_BASE_LEN = 57
"""The longest generateName: the API server appends five random characters to a 63-character name at most."""


def generate_name(pod_name: str, pod_claim_name: str) -> str:
    """The `metadata.generateName` upstream gives a claim made from a template for a pod.

    `<pod>-<podClaim>-`; when that exceeds 57 characters both parts are cut in proportion to
    their length (each to `len(part) * 57 // len(whole)`, the whole counting both hyphens) and
    joined with one hyphen, with no trailing hyphen, exactly as kube-controller-manager does so
    that a long pod name does not swallow the pod claim name. Pure.
    """
    base = f"{pod_name}-{pod_claim_name}-"
    if len(base) <= MAX_BASE_LEN:
        return base
    pod_part = pod_name[: len(pod_name) * MAX_BASE_LEN // len(base)]
    claim_part = pod_claim_name[: len(pod_claim_name) * MAX_BASE_LEN // len(base)]
    return f"{pod_part}-{claim_part}"
