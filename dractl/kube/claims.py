"""The node agent's `ClaimSource` over the API: read one ResourceClaim, decoded into the model.

What it does: `ApiClaimSource.get_claim(namespace, name)` reads the claim with a live GET (the
kubelet asks for claims it is about to prepare, so a cache could be behind) and returns a
`model.ResourceClaim`, or None when the claim does not exist. `claims_on_node(driver=, node=)`
finds the claims the kubelet of a node has prepared or is about to (allocated in the node's pool,
reserved for a pod bound to the node) from the pods on that node, which the agent reads to rebuild
a lost checkpoint.

What it must not do: cache, write, or hide a claim it cannot decode: that raises
`client.BadObject` whose message names the claim and the fields, so the caller can report it
per claim instead of treating the claim as deleted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dractl import model
from dractl.kube import client as kube_client


class ApiClaimSource:
    """Implements `dractl.node.state.ClaimSource` over a `client.Client`. Thread-safe; read-only."""

    def __init__(self, client: kube_client.Client) -> None:
        self._client = client

    def get_claim(self, namespace: str, name: str) -> model.ResourceClaim | None:
        """The current claim, or None if it is gone. Raises `BadObject`, or `ApiError` when the server fails."""
        try:
            return self._client.get_resource_claim(namespace, name)
        except kube_client.NotFound:
            return None

    def claims_on_node(self, *, driver: str, node: str) -> tuple[model.ResourceClaim, ...]:
        """The claims with a result of `driver` in pool `node` and reserved for a pod bound to node `node`: one LIST of
        the pods on the node (field selector), then a live GET of each claim they name (`spec.resourceClaims`,
        `status.resourceClaimStatuses`, `status.extendedResourceClaimStatus`), so the cost is the node's, not the
        cluster's. Raises `ApiError`, or `BadObject` for such a claim that does not decode: a claim skipped here would
        lose what the agent prepared for it."""
        pods = self._client.list(kube_client.PODS, field_selector=f"spec.nodeName={node}").items
        on_node = {str((pod.get("metadata") or {}).get("uid")) for pod in pods}
        found = []
        for namespace, name in sorted({key for pod in pods for key in _claims_named_by(pod)}):
            try:
                raw = self._client.get(kube_client.RESOURCE_CLAIMS, name, namespace=namespace)
            except kube_client.NotFound:
                continue
            if not _reserved_for_one_of(raw, on_node):
                continue
            claim = kube_client.decode(raw, strict=True)
            assert isinstance(claim, model.ResourceClaim)
            if claim.allocation is not None and any(
                r.driver == driver and r.pool == node for r in claim.allocation.results
            ):
                found.append(claim)
        return tuple(found)


def _claims_named_by(pod: Mapping[str, Any]) -> set[tuple[str, str]]:
    """(namespace, name) of every ResourceClaim a raw pod names: by `resourceClaimName` in its spec, and the claims
    made for it from templates or for extended resources, as its status records them. Pure."""
    namespace = str((pod.get("metadata") or {}).get("namespace") or "")
    status = pod.get("status") or {}
    entries = [
        *((pod.get("spec") or {}).get("resourceClaims") or ()),
        *(status.get("resourceClaimStatuses") or ()),
        status.get("extendedResourceClaimStatus") or {},
    ]
    return {
        (namespace, str(entry["resourceClaimName"]))
        for entry in entries
        if isinstance(entry, Mapping) and entry.get("resourceClaimName")
    }


def _reserved_for_one_of(raw: Mapping[str, Any], pod_uids: set[str]) -> bool:
    """Whether the raw claim's status.reservedFor names one of these pods. Pure."""
    reserved = (raw.get("status") or {}).get("reservedFor") or ()
    return any(
        isinstance(ref, Mapping)
        and ref.get("resource") == "pods"
        and not ref.get("apiGroup")
        and str(ref.get("uid")) in pod_uids
        for ref in reserved
    )
