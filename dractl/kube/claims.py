"""The node agent's `ClaimSource` over the API: read one ResourceClaim, decoded into the model.

What it does: `ApiClaimSource.get_claim(namespace, name)` reads the claim with a live GET (the
kubelet asks for claims it is about to prepare, so a cache could be behind) and returns a
`model.ResourceClaim`, or None when the claim does not exist. `claims_on_node(driver=, node=)`
finds the claims the kubelet of a node has prepared or is about to (allocated in the node's pool,
reserved for a pod) from one list of the cluster's claims, which the agent reads to rebuild a
lost checkpoint. It reads no pod: pod specs hold secrets in their environment, and the node
agent needs none of them.

What it must not do: cache, write, read pods, or hide a claim it cannot decode: that raises
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
        """The claims with a result of `driver` in pool `node` and a non-empty `status.reservedFor`, from one LIST of
        every namespace's claims (paged). A device in a node's own pool reaches only pods on that node, so a claim
        reserved for any pod is one the kubelet there has prepared or is about to. Raises `ApiError`, or `BadObject`
        for such a claim that does not decode: a claim skipped here would lose what the agent prepared for it. Claims
        of other pools are not decoded, so a bad one elsewhere cannot stop this node's rebuild."""
        found = []
        for raw in self._client.list(kube_client.RESOURCE_CLAIMS).items:
            if not (_reserved(raw) and _allocated_in(raw, driver=driver, pool=node)):
                continue
            claim = kube_client.decode(raw, strict=True)
            assert isinstance(claim, model.ResourceClaim)
            found.append(claim)
        return tuple(sorted(found, key=lambda c: (c.meta.namespace, c.meta.name)))


def _reserved(raw: Mapping[str, Any]) -> bool:
    """Whether the raw claim's status.reservedFor names anything. Pure."""
    status = raw.get("status")
    return isinstance(status, Mapping) and bool(status.get("reservedFor"))


def _allocated_in(raw: Mapping[str, Any], *, driver: str, pool: str) -> bool:
    """Whether the raw claim's allocation has a result of `driver` in `pool`. Pure; tolerates any shape."""
    status = raw.get("status")
    allocation = status.get("allocation") if isinstance(status, Mapping) else None
    devices = allocation.get("devices") if isinstance(allocation, Mapping) else None
    results = devices.get("results") if isinstance(devices, Mapping) else None
    return isinstance(results, list) and any(
        isinstance(result, Mapping) and result.get("driver") == driver and result.get("pool") == pool
        for result in results
    )
