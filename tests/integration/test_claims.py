"""The node agent's ClaimSource over the real API: the live claim decoded, None when gone, errors raised."""

from __future__ import annotations

import faultproxy
import pytest
from support import kube_objects

from dractl import model
from dractl.kube import claims, client

pytestmark = pytest.mark.timeout(120)


def test_get_claim_returns_the_allocated_claim_as_a_model_value(kube_client: client.Client, namespace: str) -> None:
    """Guards: get_claim reads the live claim, status.allocation included, and decodes it into model.ResourceClaim."""
    created = kube_objects.create_allocated_claim(
        kube_client,
        "c",
        namespace=namespace,
        spec=kube_objects.ONE_GPU,
        allocated=kube_objects.allocation("node-a", ["gpu-1"]),
    )
    claim = claims.ApiClaimSource(kube_client).get_claim(namespace, "c")
    assert isinstance(claim, model.ResourceClaim)
    assert claim.meta.uid == created["metadata"]["uid"]
    assert claim.allocation is not None
    assert [(r.request, r.pool, r.device) for r in claim.allocation.results] == [("gpu", "node-a", "gpu-1")]


def test_get_claim_of_a_deleted_claim_is_none(kube_client: client.Client, namespace: str) -> None:
    """Guards: a claim that does not exist (deleted meanwhile) gives None, not an exception."""
    assert claims.ApiClaimSource(kube_client).get_claim(namespace, "never-created") is None


def test_a_server_failure_is_raised_not_mistaken_for_a_deleted_claim(
    proxied_client: client.Client, fault_proxy: faultproxy.FaultProxy, namespace: str
) -> None:
    """Guards: when the API keeps failing, get_claim raises (naming the status) instead of returning None."""
    fault_proxy.add(faultproxy.respond(503, path="/resourceclaims/c", count=None))
    with pytest.raises(client.Transient, match="503"):
        claims.ApiClaimSource(proxied_client).get_claim(namespace, "c")
