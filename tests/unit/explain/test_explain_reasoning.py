"""What `dractl explain` concludes about claims and pods, on hand-built cluster states (no API server)."""

from __future__ import annotations

import textwrap

from support import devices as d
from support.simulate_manifests import CLUSTER, LARGE, claim, load, pod, template

from dractl import config, model
from dractl.explain import output, reasoning

# Claim "held" holds both GPUs of node-a, reserved for the pod "trainer".
HELD = textwrap.dedent(
    """
    apiVersion: resource.k8s.io/v1
    kind: ResourceClaim
    metadata: {name: held, uid: u-held}
    spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: gpu.example.com, count: 2}}]}}
    status:
      allocation:
        devices:
          results:
          - {request: gpu, driver: gpu.example.com, pool: node-a, device: gpu-0}
          - {request: gpu, driver: gpu.example.com, pool: node-a, device: gpu-1}
        nodeSelector:
          nodeSelectorTerms:
          - matchFields: [{key: metadata.name, operator: In, values: [node-a]}]
      reservedFor:
      - {resource: pods, name: trainer, uid: u-pod}
    """
)
SMALL = 'device.attributes["gpu.example.com"].model == "small"'


def _claim(objects: model.Objects, name: str) -> model.ResourceClaim:
    return next(c for c in objects.resource_claims if c.meta.name == name)


def _explain_pod(objects: model.Objects, *, statuses: dict[str, str | None] | None = None) -> reasoning.Pod:
    target = objects.pods[0]
    pod_claims = reasoning.resolve_pod_claims(
        target,
        claim_statuses=statuses or {},
        claims={c.key: c for c in objects.resource_claims},
        templates={t.meta.name: t for t in objects.resource_claim_templates},
    )
    return reasoning.explain_pod(target, pod_claims=pod_claims, cluster=objects)


def test_an_allocated_claim_shows_its_node_devices_and_consumers() -> None:
    """Guards: an allocated claim is explained where it is: node, devices under their request, who reserves it."""
    objects = load(CLUSTER, HELD)
    explained = reasoning.explain_claim(_claim(objects, "held"), cluster=objects)
    assert explained.state is reasoning.State.ALLOCATED
    assert explained.nodes == ("node-a",)
    assert explained.reserved_for == ("pods/trainer",)
    [request] = explained.requests
    assert (request.name, request.device_class, request.count) == ("gpu", "gpu.example.com", 2)
    assert [(r.pool, r.device) for r in request.devices] == [("node-a", "gpu-0"), ("node-a", "gpu-1")]
    assert request.reasons == ()


def test_a_pending_claim_that_fits_gets_the_devices_it_would_take() -> None:
    """Guards: a pending claim is tried against the current state; when it fits, the node and devices are shown."""
    objects = load(CLUSTER, claim("want", count=2, selector=LARGE))
    explained = reasoning.explain_claim(_claim(objects, "want"), cluster=objects)
    assert explained.state is reasoning.State.FITS
    assert explained.nodes == ("node-b",)
    assert [(r.pool, r.device) for r in explained.requests[0].devices] == [("node-b", "gpu-0"), ("node-b", "gpu-1")]


def test_allocated_claims_hold_their_devices() -> None:
    """Guards: the snapshot counts the cluster's allocations as used, so a claim for node-a's held GPUs does not fit."""
    objects = load(CLUSTER, HELD, claim("want", selector=SMALL))
    explained = reasoning.explain_claim(_claim(objects, "want"), cluster=objects)
    assert explained.state is reasoning.State.DOES_NOT_FIT
    [request] = explained.requests
    assert request.selectors == (SMALL,)
    assert request.reasons == (
        "device class gpu.example.com matches 4 devices; 2 pass the request's selectors; "
        "0 of those are free on the candidate nodes (1 needed)",
    )


def test_a_claim_too_big_for_any_node_names_the_request_and_the_counts() -> None:
    """Guards: a claim that cannot fit is explained per request: class, selector stage and free devices."""
    objects = load(CLUSTER, claim("big", count=3, selector=LARGE))
    explained = reasoning.explain_claim(_claim(objects, "big"), cluster=objects)
    assert explained.state is reasoning.State.DOES_NOT_FIT
    assert explained.nodes == ()
    assert explained.requests[0].reasons == (
        "device class gpu.example.com matches 4 devices; 2 pass the request's selectors; "
        "2 of those are free on the candidate nodes (3 needed)",
    )


def test_a_selector_kubernetes_rejects_gets_write_instead() -> None:
    """Guards: a seed-style selector (`>=` on a quantity) is explained with the expression to write instead."""
    bad = 'device.capacity["gpu.example.com"].memory >= quantity("40Gi")'
    objects = load(CLUSTER)
    spec = model.ResourceClaimSpec(
        requests=(
            model.DeviceRequest(
                name="gpu", exactly=model.ExactDeviceRequest(device_class_name="gpu.example.com", selectors=(bad,))
            ),
        )
    )
    target = model.ResourceClaim(meta=model.ObjectMeta(name="seed", namespace="default"), spec=spec)
    explained = reasoning.explain_claim(target, cluster=objects)
    assert explained.state is reasoning.State.DOES_NOT_FIT
    [reason] = explained.requests[0].reasons
    assert reason.startswith("selectors[0]: ")
    assert 'write instead: device.capacity["gpu.example.com"].memory.compareTo(quantity("40Gi")) >= 0' in reason, reason


def test_a_counter_that_ran_out_is_named() -> None:
    """Guards: when a shared counter stops the claim, the explanation names the counter, its set and the pool."""
    parts = [d.device(f"part-{i}", consumes={"gpu-0": {"memory": "40Gi"}}) for i in range(3)]
    objects = model.Objects(
        device_classes=(d.device_class("parts"),),
        resource_slices=(d.rslice(*parts, counters=[d.counter_set("gpu-0", memory="80Gi")]),),
    )
    spec = model.ResourceClaimSpec(
        requests=(
            model.DeviceRequest(name="mig", exactly=model.ExactDeviceRequest(device_class_name="parts", count=3)),
        )
    )
    target = model.ResourceClaim(meta=model.ObjectMeta(name="three", namespace="ns"), spec=spec)
    explained = reasoning.explain_claim(target, cluster=objects)
    assert explained.state is reasoning.State.DOES_NOT_FIT
    [reason] = explained.requests[0].reasons
    assert "counter memory of counter set gpu-0 in pool driver-a/node-1 ran out" in reason


def test_first_available_subrequests_are_explained_one_by_one() -> None:
    """Guards: a firstAvailable request shows each subrequest ("req/sub"), and the chosen one's devices."""
    objects = load(CLUSTER)
    spec = model.ResourceClaimSpec(
        requests=(
            model.DeviceRequest(
                name="gpu",
                first_available=(
                    model.DeviceSubRequest(name="big", device_class_name="gpu.example.com", count=3),
                    model.DeviceSubRequest(name="one", device_class_name="gpu.example.com", selectors=(LARGE,)),
                ),
            ),
        )
    )
    target = model.ResourceClaim(meta=model.ObjectMeta(name="either", namespace="default"), spec=spec)
    explained = reasoning.explain_claim(target, cluster=objects)
    assert explained.state is reasoning.State.FITS
    assert [(r.name, r.count, len(r.devices)) for r in explained.requests] == [("gpu/big", 3, 0), ("gpu/one", 1, 1)]


def test_a_template_claim_not_created_yet_is_explained_from_the_template() -> None:
    """Guards: a template's pod claim with no recorded claim is explained from the template, marked not created."""
    objects = load(CLUSTER, template("t", count=2), pod("p", templates={"g": "t"}))
    explained = _explain_pod(objects)
    assert explained.state is reasoning.PodState.FITS
    [item] = explained.claims
    assert (item.created, item.template, item.name, item.pod_claim) == (False, "t", "p-g-", "g")
    assert item.state is reasoning.State.FITS
    assert len(item.requests[0].devices) == 2


def test_a_recorded_generated_claim_is_the_one_explained() -> None:
    """Guards: pod.status.resourceClaimStatuses names the generated claim that is explained, not the template."""
    generated = HELD.replace("name: held", "name: p-g-abcde")
    objects = load(CLUSTER, template("t", count=2), generated, pod("p", templates={"g": "t"}))
    explained = _explain_pod(objects, statuses={"g": "p-g-abcde"})
    [item] = explained.claims
    assert (item.name, item.created, item.state) == ("p-g-abcde", True, reasoning.State.ALLOCATED)
    assert (explained.state, explained.node) == (reasoning.PodState.ALLOCATED, "node-a")


def test_a_pod_claim_recorded_as_not_needed_is_left_out() -> None:
    """Guards: a resourceClaimStatuses entry without a claim name means no claim: nothing is explained for it."""
    objects = load(CLUSTER, template("t"), pod("p", templates={"g": "t"}))
    explained = _explain_pod(objects, statuses={"g": None})
    assert (explained.claims, explained.state, explained.node) == ((), reasoning.PodState.NO_CLAIMS, None)


def test_a_pod_without_claims_says_so_instead_of_all_claims_allocated() -> None:
    """Guards: a pod with no spec.resourceClaims is "no claims to allocate", with no node, not "all claims allocated
    on node <its node>" (a placement it does not have)."""
    objects = load(CLUSTER, pod("p", extra="nodeName: node-a"))
    explained = _explain_pod(objects)
    assert (explained.state, explained.node, explained.claims) == (reasoning.PodState.NO_CLAIMS, None, ())
    assert output.pod_lines(explained) == [
        "Pod default/p: no claims to allocate",
        "  spec.nodeName: node-a",
        "  nodes it may use: node-a",
    ]


def test_the_pod_node_selector_limits_the_nodes() -> None:
    """Guards: spec.nodeSelector narrows the nodes the pod's claims are tried on; the pod names them."""
    objects = load(
        CLUSTER, claim("c", count=2, selector=SMALL), pod("p", claims={"c": "c"}, extra="nodeSelector: {pool: large}")
    )
    explained = _explain_pod(objects)
    assert explained.state is reasoning.PodState.BLOCKED
    assert explained.candidates == ("node-b",)
    assert explained.node_selector == {"pool": "large"}
    assert explained.claims[0].state is reasoning.State.DOES_NOT_FIT
    assert "0 of those are free on the candidate nodes (2 needed)" in explained.claims[0].requests[0].reasons[0]


def test_a_node_selector_matching_no_node_blocks_the_pod() -> None:
    """Guards: a nodeSelector that matches no Node is the pod's reason, and its pending claims are not tried."""
    objects = load(CLUSTER, claim("c"), pod("p", claims={"c": "c"}, extra="nodeSelector: {pool: huge}"))
    explained = _explain_pod(objects)
    assert explained.state is reasoning.PodState.BLOCKED
    assert explained.reasons == ("pod default/p: spec.nodeSelector (pool=huge) does not match any Node",)
    assert explained.claims[0].reasons == ("not tried: the pod cannot be scheduled (see the pod's reasons)",)


def test_an_allocated_claim_pins_the_pods_other_claims_to_its_node() -> None:
    """Guards: all claims of a pod share a node: a claim allocated on node-a puts the pending one on node-a too."""
    objects = load(
        CLUSTER,
        HELD.replace("count: 2", "count: 1").replace(
            "      - {request: gpu, driver: gpu.example.com, pool: node-a, device: gpu-1}\n", ""
        ),
        claim("more"),
        pod("p", claims={"a": "held", "b": "more"}),
    )
    explained = _explain_pod(objects)
    assert explained.candidates == ("node-a",)
    assert (explained.state, explained.node) == (reasoning.PodState.FITS, "node-a")
    held, more = explained.claims
    assert held.state is reasoning.State.ALLOCATED
    assert [(r.pool, r.device) for r in more.requests[0].devices] == [("node-a", "gpu-1")]


def test_claims_that_fit_alone_but_not_together_are_explained_jointly() -> None:
    """Guards: two claims that each fit but not on one node together: the pod names both pod claims."""
    objects = load(CLUSTER, claim("x1", count=2), claim("x2", count=2), pod("p", claims={"a": "x1", "b": "x2"}))
    explained = _explain_pod(objects)
    assert explained.state is reasoning.PodState.BLOCKED
    assert any("pod claims a, b cannot be allocated on any node the pod may use" in r for r in explained.reasons)
    assert all(c.state is reasoning.State.DOES_NOT_FIT for c in explained.claims)


def test_a_missing_claim_or_template_blocks_the_pod_and_is_named() -> None:
    """Guards: a named claim or a template that does not exist is shown as missing and named in the pod's reasons."""
    objects = load(CLUSTER, pod("p", claims={"a": "nope"}, templates={"b": "gone"}))
    explained = _explain_pod(objects)
    assert explained.state is reasoning.PodState.BLOCKED
    assert [(c.name, c.state) for c in explained.claims] == [
        ("nope", reasoning.State.MISSING),
        ("p-b-", reasoning.State.MISSING),
    ]
    assert explained.reasons == (
        "ResourceClaim default/nope does not exist (pod default/p spec.resourceClaims[0] (a))",
        "ResourceClaimTemplate default/gone does not exist (pod default/p spec.resourceClaims[1] (b))",
    )


def test_a_claim_with_a_full_reserved_for_blocks_the_pod() -> None:
    """Guards: a shared claim already reserved by 256 other pods cannot take this pod: the pod's reason says so."""
    objects = load(CLUSTER, HELD, pod("p", claims={"a": "held"}))
    held = _claim(objects, "held")
    full = tuple(
        model.ResourceClaimConsumerReference(resource="pods", name=f"p{i}", uid=f"u{i}")
        for i in range(model.limits.MAX_RESERVED_FOR)
    )
    crowded = model.ResourceClaim(meta=held.meta, spec=held.spec, allocation=held.allocation, reserved_for=full)
    objects = model.Objects(
        device_classes=objects.device_classes,
        resource_slices=objects.resource_slices,
        nodes=objects.nodes,
        resource_claims=(crowded,),
        pods=objects.pods,
    )
    explained = _explain_pod(objects)
    assert explained.state is reasoning.PodState.BLOCKED
    assert explained.reasons == (
        "ResourceClaim default/held already has 256 consumers in status.reservedFor, the most the API allows",
    )


def test_the_policy_decides_where_a_pending_claim_would_go() -> None:
    """Guards: the policy reaches the allocator: first-fit takes the first node by name, binpack the node in use."""
    on_b = HELD.replace("count: 2", "count: 1").replace("node-a", "node-b")
    on_b = on_b.replace("      - {request: gpu, driver: gpu.example.com, pool: node-b, device: gpu-1}\n", "")
    objects = load(CLUSTER, on_b, claim("want"))
    nodes = {
        policy: reasoning.explain_claim(_claim(objects, "want"), cluster=objects, policy=policy).nodes
        for policy in config.Policy
    }
    assert nodes == {config.Policy.FIRST_FIT: ("node-a",), config.Policy.BINPACK: ("node-b",)}


def test_a_constraint_that_cannot_be_met_is_listed_and_named_in_the_reason() -> None:
    """Guards: the claim's constraints are shown, and the one that stopped a request is named in its reason."""
    exact = model.ExactDeviceRequest(device_class_name="gpu.example.com", count=3)
    spec = model.ResourceClaimSpec(
        requests=(model.DeviceRequest(name="gpus", exactly=exact),),
        constraints=(model.DeviceConstraint(requests=("gpus",), match_attribute="gpu.example.com/model"),),
    )
    target = model.ResourceClaim(meta=model.ObjectMeta(name="same", namespace="default"), spec=spec)
    objects = load(CLUSTER.replace("nodeName: node-b", "nodeName: node-a"))
    explained = reasoning.explain_claim(target, cluster=objects)
    assert explained.constraints == ("matchAttribute gpu.example.com/model over gpus",)
    assert explained.state is reasoning.State.DOES_NOT_FIT
    [reason] = explained.requests[0].reasons
    assert reason.endswith("constraint matchAttribute gpu.example.com/model over gpus could not be met"), reason
