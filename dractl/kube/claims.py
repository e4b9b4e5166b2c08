"""The node agent's `ClaimSource` over the API: read one ResourceClaim, decoded into the model.

What it does: `ApiClaimSource.get_claim(namespace, name)` reads the claim with a live GET (the
kubelet asks for claims it is about to prepare, so a cache could be behind) and returns a
`model.ResourceClaim`, or None when the claim does not exist.

What it must not do: cache, write, or hide a claim it cannot decode: that raises
`client.BadObject` whose message names the claim and the fields, so the caller can report it
per claim instead of treating the claim as deleted.
"""

from __future__ import annotations

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
