"""The simulation order, pods' claims, shared claims, pinning and the reasons of claims that fail."""

from __future__ import annotations

import pytest
from support.simulate_manifests import CLUSTER, LARGE, claim, load, pod, template

from dractl import alloc, model
from dractl.model import decode
from dractl.simulate import EXAMPLES, claims, engine

POLICIES = [pytest.param(p, id=p.value) for p in alloc.Policy]


def _run(objects: model.Objects, policy: alloc.Policy = alloc.Policy.FIRST_FIT) -> dict[str, engine.ClaimOutcome]:
    result = engine.simulate(objects, policy=policy, search_limit=100_000)
    return {f"{o.namespace}/{o.name}": o for o in result.claims}


def _devices(outcome: engine.ClaimOutcome) -> list[tuple[str, str]]:
    assert outcome.claim is not None and outcome.claim.allocation is not None, outcome.reasons
    return [(r.pool, r.device) for r in outcome.claim.allocation.results]


def test_standalone_claims_go_first_in_input_order() -> None:
    """Guards: claims no pod uses are allocated before any pod's claims, in input order, and reported in that order."""
    objects = load(
        CLUSTER,
        template("large", selector=LARGE),
        pod("early-pod", templates={"gpu": "large"}),
        claim("first", selector=LARGE),
        claim("second", selector=LARGE),
    )
    result = engine.simulate(objects, policy=alloc.Policy.FIRST_FIT, search_limit=100_000)
    names = [o.name for o in result.claims]
    pod_claim = claims.generated_claim_name("early-pod", "gpu", namespace="default")
    assert names == ["first", "second", pod_claim]
    by_name = {o.name: o for o in result.claims}
    assert _devices(by_name["first"]) == [("node-b", "gpu-0")]
    assert _devices(by_name["second"]) == [("node-b", "gpu-1")]
    assert not by_name[pod_claim].allocated
    assert by_name[pod_claim].reasons == (
        "gpu: device class gpu.example.com matches 4 devices; 2 pass the request's selectors; 0 of those are free on "
        "the candidate nodes (1 needed)",
    )
    assert result.attempted == 3


def test_template_claim_is_generated_allocated_and_reserved() -> None:
    """Guards: a pod's template claim gets upstream's name, the pod-claim-name annotation, an allocation and reservedFor
    the pod."""
    objects = load(CLUSTER, template("tmpl"), pod("trainer", templates={"gpu": "tmpl"}))
    outcome = _run(objects)[f"default/{claims.generated_claim_name('trainer', 'gpu', namespace='default')}"]
    assert outcome.allocated and outcome.node == "node-a"
    assert outcome.claim is not None
    assert outcome.claim.meta.annotations["resource.kubernetes.io/pod-claim-name"] == "gpu"
    assert outcome.claim.reserved_for == (
        model.ResourceClaimConsumerReference(resource="pods", name="trainer", uid=claims.pod_uid(objects.pods[0])),
    )


def test_shared_claim_is_allocated_once_and_reserved_for_every_pod() -> None:
    """Guards: a named claim used by two pods is allocated once, listed once, and reserved for both pods."""
    objects = load(CLUSTER, claim("shared"), pod("one", claims={"gpu": "shared"}), pod("two", claims={"gpu": "shared"}))
    result = engine.simulate(objects, policy=alloc.Policy.BINPACK, search_limit=100_000)
    assert [o.name for o in result.claims] == ["shared"]
    assert result.attempted == 1
    shared = result.claims[0].claim
    assert shared is not None and shared.allocation is not None
    assert [(r.name, r.uid) for r in shared.reserved_for] == [(p.meta.name, claims.pod_uid(p)) for p in objects.pods]


def test_allocated_shared_claim_pins_the_next_pod_to_its_node() -> None:
    """Guards: a pod using a claim already allocated on node-b gets its other claims on node-b,
    not first-fit's node-a."""
    objects = load(
        CLUSTER,
        claim("shared", selector=LARGE),
        template("any"),
        pod("first", claims={"gpu": "shared"}),
        pod("second", claims={"gpu": "shared"}, templates={"own": "any"}),
    )
    outcome = _run(objects)[f"default/{claims.generated_claim_name('second', 'own', namespace='default')}"]
    assert outcome.node == "node-b" and _devices(outcome) == [("node-b", "gpu-1")]


def test_claim_allocated_in_the_input_keeps_its_devices_and_pins_pods() -> None:
    """Guards: an input claim with status.allocation is reported allocated, holds its device, and pins its pods."""
    allocated = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: done}
spec:
  devices:
    requests:
    - {name: gpu, exactly: {deviceClassName: gpu.example.com}}
status:
  allocation:
    devices:
      results:
      - {request: gpu, driver: gpu.example.com, pool: node-b, device: gpu-0}
    nodeSelector:
      nodeSelectorTerms:
      - matchFields: [{key: metadata.name, operator: In, values: [node-b]}]
"""
    objects = load(CLUSTER, allocated, template("any"), pod("user", claims={"gpu": "done"}, templates={"own": "any"}))
    outcomes = _run(objects)
    done = outcomes["default/done"]
    assert done.allocated and done.node == "node-b" and _devices(done) == [("node-b", "gpu-0")]
    assert done.claim is not None and [r.name for r in done.claim.reserved_for] == ["user"]
    own = outcomes[f"default/{claims.generated_claim_name('user', 'own', namespace='default')}"]
    assert _devices(own) == [("node-b", "gpu-1")]


def test_missing_template_and_claim_are_reasons_on_the_pods_claims() -> None:
    """Guards: a missing template or named claim is a reason on that claim,
    and the pod's other claims are not allocated."""
    objects = load(
        CLUSTER, template("tmpl"), pod("broken", claims={"shared": "nope"}, templates={"own": "tmpl", "gone": "absent"})
    )
    outcomes = _run(objects)
    assert outcomes["default/nope"].reasons == (
        "ResourceClaim default/nope does not exist (used by pod default/broken spec.resourceClaims[0] (shared))",
    )
    gone = outcomes[f"default/{claims.generated_claim_name('broken', 'gone', namespace='default')}"]
    assert gone.claim is None and not gone.allocated
    assert gone.reasons == (
        "ResourceClaimTemplate default/absent does not exist "
        "(used by pod default/broken spec.resourceClaims[2] (gone))",
    )
    own = outcomes[f"default/{claims.generated_claim_name('broken', 'own', namespace='default')}"]
    assert not own.allocated
    assert own.reasons[0].startswith(
        "not allocated: pod default/broken cannot be scheduled: ResourceClaim default/nope does not exist"
    )


def test_a_claim_serves_at_most_256_pods() -> None:
    """Guards: a pod that would be the 257th consumer of a shared claim is not placed (status.reservedFor holds 256)."""
    pods = [pod(f"p{i:03d}", claims={"gpu": "shared"}) for i in range(256)]
    objects = load(
        CLUSTER,
        claim("shared"),
        template("tmpl"),
        *pods,
        pod("late", claims={"gpu": "shared"}, templates={"own": "tmpl"}),
    )
    outcomes = _run(objects)
    shared = outcomes["default/shared"].claim
    assert shared is not None and len(shared.reserved_for) == 256
    late = outcomes[f"default/{claims.generated_claim_name('late', 'own', namespace='default')}"]
    assert late.reasons == (
        "not allocated: default/shared already has 256 consumers in status.reservedFor, the most the API allows",
    )


def test_pod_claims_are_allocated_jointly_on_one_node() -> None:
    """Guards: a pod's claims share one node: two 2-GPU claims cannot fit on one node, so neither is allocated."""
    objects = load(CLUSTER, template("two", count=2), pod("greedy", templates={"a": "two", "b": "two"}))
    outcomes = _run(objects)
    a = outcomes[f"default/{claims.generated_claim_name('greedy', 'a', namespace='default')}"]
    b = outcomes[f"default/{claims.generated_claim_name('greedy', 'b', namespace='default')}"]
    assert not a.allocated and not b.allocated
    each = (
        "gpu: device class gpu.example.com matches 4 devices; 4 pass the request's selectors; 4 of those are free "
        "on the candidate nodes (2 needed)"
    )
    assert a.reasons == (
        each,
        "every request has devices on its own, but none of the 2 candidate nodes has devices for all requests together",
    )
    assert b.reasons == (each,)


def test_pod_node_selector_is_respected() -> None:
    """Guards: spec.nodeSelector against Node labels steers the pod's claims to the matching node."""
    objects = load(
        CLUSTER, template("any"), pod("picky", templates={"gpu": "any"}, extra="nodeSelector: {pool: large}")
    )
    outcome = _run(objects)[f"default/{claims.generated_claim_name('picky', 'gpu', namespace='default')}"]
    assert outcome.node == "node-b"


def test_unknown_class_is_a_reason_not_an_error() -> None:
    """Guards: a claim naming a DeviceClass that does not exist is reported with a reason; the simulation still runs."""
    unknown = claim("lost").replace("deviceClassName: gpu.example.com", "deviceClassName: no-such-class")
    outcome = _run(load(CLUSTER, unknown))["default/lost"]
    assert not outcome.allocated
    assert outcome.reasons == (
        "gpu: device class no-such-class does not exist; create it or name one of: gpu.example.com",
    )


@pytest.mark.parametrize("policy", POLICIES)
def test_example_cluster_allocates_every_claim(policy: alloc.Policy) -> None:
    """Guards: the built-in example decodes and every claim in it is allocated,
    the MIG pair on one parent GPU per replica."""
    objects = decode.load_paths([EXAMPLES])
    outcomes = engine.simulate(objects, policy=policy, search_limit=1_000_000).claims
    assert [o.name for o in outcomes if not o.allocated] == []
    assert len(outcomes) == 5  # nvlink, training, shared, and one MIG claim per replica
    attributes = {(s.pool.name, d.name): d.attributes for s in objects.resource_slices for d in s.devices}
    mig = [o for o in outcomes if o.name.startswith("mig-inference-")]
    assert len(mig) == 2
    for outcome in mig:
        parents = {attributes[device]["parentUUID"].scalar for device in _devices(outcome)}
        assert len(parents) == 1
    shared = next(o for o in outcomes if o.name == "shared-inference-gpu")
    assert shared.claim is not None and [r.name for r in shared.claim.reserved_for] == [
        "qwen-inference",
        "embedding-service",
    ]
    nvlink = next(o for o in outcomes if o.name == "nvlink-4x-h100")
    assert len({attributes[device]["partition4"].scalar for device in _devices(nvlink)}) == 1


def test_engine_copies_every_field_of_an_allocated_claim() -> None:
    """Guards: the engine builds allocated ResourceClaims field by field (faster than dataclasses.replace): a new field
    must be copied there too."""
    import dataclasses

    assert [f.name for f in dataclasses.fields(model.ResourceClaim)] == [
        "meta",
        "spec",
        "allocation",
        "reserved_for",
        "source",
    ]
    objects = load(CLUSTER, claim("one"))
    (outcome,) = engine.simulate(objects, policy=alloc.Policy.FIRST_FIT, search_limit=1000).claims
    assert outcome.claim is not None and outcome.claim.allocation is not None
    assert outcome.claim == dataclasses.replace(objects.resource_claims[0], allocation=outcome.claim.allocation)
