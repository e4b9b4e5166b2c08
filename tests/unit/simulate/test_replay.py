"""Trace replay: departures release exactly, retries after departures, --retry never, pods, metrics over time."""

from __future__ import annotations

import copy
import textwrap
from typing import Any

import pytest
import yaml
from support.simulate_manifests import CLASS, SLICES

from dractl import config, model
from dractl.simulate import claims, replay, trace

# The simulate tests' two nodes, with the `type: gpu` attribute the metrics count GPUs by.
GPU_SLICES = SLICES.replace("attributes: {model:", "attributes: {type: {string: gpu}, model:")
assert GPU_SLICES != SLICES

POLICIES = pytest.mark.parametrize("policy", list(config.Policy), ids=[p.value for p in config.Policy])


def _claim(name: str, *, count: int = 1, departs_after: float | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "default"}
    if departs_after is not None:
        meta["annotations"] = {trace.DEPARTS_AFTER: f"{departs_after:g}"}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": meta,
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com", "count": count}}]
            }
        },
    }


def _small(events: list[dict[str, Any]], *, extra: list[dict[str, Any]] = ()) -> trace.Trace:  # type: ignore[assignment]
    """The two-node test cluster (node-a: two 40Gi GPUs, node-b: two 80Gi GPUs) and `events`."""
    objects = [yaml.safe_load(CLASS), *yaml.safe_load_all(GPU_SLICES), *extra]
    document = {
        "apiVersion": trace.API_VERSION,
        "kind": trace.KIND,
        "metadata": {"name": "small"},
        "spec": {"cluster": {"objects": objects}, "events": events},
    }
    return trace.parse(document, file="small.yaml")


def _allocations(
    result: replay.Result, *, since: float = 0.0, until: float = float("inf")
) -> list[tuple[str, str | None, tuple[str, ...]]]:
    return [
        (a.work, a.node, tuple(f"{r.pool}/{r.device}" for c in a.claims for r in c.allocation.results))  # type: ignore[union-attr]
        for a in result.actions
        if a.kind is replay.ActionKind.ALLOCATE and since <= a.at < until
    ]


@POLICIES
def test_allocate_release_everything_allocate_again_gives_the_first_allocation_back(policy: config.Policy) -> None:
    """After every claim departed, the same claims arriving again get exactly the devices they had.
    The claims come three times: binpack's choices depend on the request shapes known, which the
    first round makes known one by one, so the second and third rounds are compared."""
    generated = trace.generate(mix="reference", seed=4, claims=24, nodes={"a100": 1, "h100": 1, "t4": 1}, departures=0)
    arrivals = [e for e in generated.document["spec"]["events"] if "arrive" in e]
    names = [e["arrive"]["metadata"]["name"] for e in arrivals]
    events: list[dict[str, object]] = []
    for start in (0, 200, 400):
        events += [{"at": start + i, "arrive": copy.deepcopy(e["arrive"])} for i, e in enumerate(arrivals)]
        if start < 400:
            events += [{"at": start + 100, "depart": {"kind": "ResourceClaim", "name": n}} for n in names]
    document = copy.deepcopy(dict(generated.document))
    document["spec"]["events"] = events
    result = replay.replay(trace.parse(document), policy=policy, retry=config.Retry.NEVER)

    rounds = [_allocations(result, since=start, until=start + 200) for start in (0, 200, 400)]
    assert rounds[1] and rounds[1] == rounds[2]
    releases = [a for a in result.actions if a.kind is replay.ActionKind.RELEASE]
    assert len(releases) == len(rounds[0]) + len(rounds[1])
    # Everything given back: the cluster is empty after each round's departures.
    assert result.metrics.time is not None
    points = dict(result.metrics.time.points)
    assert points[100.0] == 0.0 and points[300.0] == 0.0
    assert points[float(200 + len(arrivals) - 1)] == points[float(len(arrivals) - 1)] > 0


@POLICIES
def test_a_rejected_claim_is_retried_after_a_departure(policy: config.Policy) -> None:
    """A claim that does not fit waits and gets the devices a departing claim gives back."""
    events = [
        {"at": 0, "arrive": _claim("big", count=2)},
        {"at": 1, "arrive": _claim("also-big", count=2)},
        {"at": 2, "arrive": _claim("too-big", count=2)},
        {"at": 5, "depart": {"kind": "ResourceClaim", "name": "big"}},
    ]
    result = replay.replay(_small(events), policy=policy)
    kinds = [(a.kind, a.work, a.at, a.retry) for a in result.actions]
    assert kinds == [
        (replay.ActionKind.ALLOCATE, "ResourceClaim default/big", 0.0, False),
        (replay.ActionKind.ALLOCATE, "ResourceClaim default/also-big", 1.0, False),
        (replay.ActionKind.REJECT, "ResourceClaim default/too-big", 2.0, False),
        (replay.ActionKind.RELEASE, "ResourceClaim default/big", 5.0, False),
        (replay.ActionKind.ALLOCATE, "ResourceClaim default/too-big", 5.0, True),
    ]
    # It took exactly what "big" gave back.
    released = {r.device for r in result.actions[3].claims[0].allocation.results}  # type: ignore[union-attr]
    taken = {r.device for r in result.actions[4].claims[0].allocation.results}  # type: ignore[union-attr]
    assert released == taken and result.actions[3].claims[0].allocation.results[0].pool == (  # type: ignore[union-attr]
        result.actions[4].claims[0].allocation.results[0].pool  # type: ignore[union-attr]
    )
    time = result.metrics.time
    assert time is not None
    assert (time.admitted_before_first_rejection, time.admitted, time.rejections) == (2, 3, 1)
    assert [o.name for o in result.pending] == []


def test_retry_never_drops_a_rejected_claim() -> None:
    """With --retry never the rejected claim stays unallocated after the departure, with its reasons."""
    events = [
        {"at": 0, "arrive": _claim("big", count=2)},
        {"at": 1, "arrive": _claim("also-big", count=2)},
        {"at": 2, "arrive": _claim("too-big", count=2)},
        {"at": 5, "depart": {"kind": "ResourceClaim", "name": "big"}},
    ]
    result = replay.replay(_small(events), retry=config.Retry.NEVER)
    assert [a.kind for a in result.actions][-2:] == [replay.ActionKind.DROP, replay.ActionKind.RELEASE]
    assert [o.name for o in result.pending] == ["too-big"]
    assert "2 needed" in result.pending[0].reasons[0]
    assert result.metrics.time is not None and result.metrics.time.admitted == 2
    assert [c.meta.name for c in result.held] == ["also-big"]


def test_frames_keep_the_moments_of_the_trace_and_the_first_rejection() -> None:
    """`frames=N` keeps the state after N evenly spaced events (the last included) and right after the first
    rejection: what was held, the claims waiting with their reasons, the claims refused since the last moment."""
    events = [
        {"at": 0, "arrive": _claim("big", count=2)},
        {"at": 1, "arrive": _claim("also-big", count=2)},
        {"at": 2, "arrive": _claim("too-big", count=2)},
        {"at": 5, "depart": {"kind": "ResourceClaim", "name": "big"}},
        {"at": 6, "arrive": _claim("small")},
    ]
    result = replay.replay(_small(events), frames=3)
    moments = [(f.at, f.event, f.events, f.first_rejection) for f in result.frames]
    assert moments == [(0.0, 1, 5, False), (2.0, 3, 5, True), (2.0, 3, 5, False), (6.0, 5, 5, False)]
    rejected = result.frames[1]
    assert [c.meta.name for c in rejected.claims] == ["big", "also-big"]
    assert [key for key, _ in rejected.refused] == ["default/too-big"] and "2 needed" in rejected.refused[0][1][0]
    assert [key for key, _ in rejected.waiting] == ["default/too-big"]
    assert result.frames[2].refused == () and [key for key, _ in result.frames[2].waiting] == ["default/too-big"]
    last = result.frames[3]
    assert [c.meta.name for c in last.claims] == ["also-big", "too-big"]
    assert [key for key, _ in last.refused] == [key for key, _ in last.waiting] == ["default/small"]
    assert replay.replay(_small(events)).frames == ()


def test_departs_after_annotation_releases_the_claim() -> None:
    """A claim annotated dractl.io/departs-after leaves that many seconds after it arrived."""
    events = [
        {"at": 0, "arrive": _claim("short", count=2, departs_after=30)},
        {"at": 1, "arrive": _claim("filler", count=2)},
        {"at": 10, "arrive": _claim("waits", count=2)},
    ]
    result = replay.replay(_small(events))
    assert [(a.kind.value, a.work, a.at) for a in result.actions] == [
        ("allocate", "ResourceClaim default/short", 0.0),
        ("allocate", "ResourceClaim default/filler", 1.0),
        ("reject", "ResourceClaim default/waits", 10.0),
        ("release", "ResourceClaim default/short", 30.0),
        ("allocate", "ResourceClaim default/waits", 30.0),
    ]


def test_utilisation_is_weighted_by_time() -> None:
    """One of 240Gi allocated for 10 s out of 20 s: each 40Gi GPU of node-a is 1/6 of the memory."""
    events = [
        {"at": 0, "arrive": _claim("one", departs_after=10)},
        {"at": 20, "arrive": _claim("two")},
    ]
    result = replay.replay(_small(events), policy=config.Policy.FIRST_FIT)
    assert result.metrics.time is not None
    # first-fit puts both on node-a's first GPU (40Gi of 240Gi): 1/6 for 10 s of 20 s.
    assert result.metrics.time.utilisation == pytest.approx((40 / 240) * 10 / 20)
    assert result.metrics.cluster.memory_allocated == 40 * 2**30


def test_a_pod_gets_its_template_claims_and_gives_them_back_when_it_departs() -> None:
    """A pod's template claims are made, allocated on one node and released when the pod departs;
    a claim it names stays allocated."""
    template = yaml.safe_load(
        textwrap.dedent(
            """
            apiVersion: resource.k8s.io/v1
            kind: ResourceClaimTemplate
            metadata: {name: one-gpu, namespace: default}
            spec:
              spec:
                devices:
                  requests:
                  - {name: gpu, exactly: {deviceClassName: gpu.example.com}}
            """
        )
    )
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "trainer", "namespace": "default"},
        "spec": {
            "resourceClaims": [
                {"name": "own", "resourceClaimTemplateName": "one-gpu"},
                {"name": "shared", "resourceClaimName": "named"},
            ],
            "containers": [{"name": "main", "image": "busybox"}],
        },
    }
    events = [
        {"at": 0, "arrive": _claim("named")},
        {"at": 1, "arrive": pod},
        {"at": 9, "depart": {"kind": "Pod", "name": "trainer"}},
    ]
    result = replay.replay(_small(events, extra=[template]), policy=config.Policy.FIRST_FIT)
    allocate = [a for a in result.actions if a.kind is replay.ActionKind.ALLOCATE]
    assert [a.work for a in allocate] == ["ResourceClaim default/named", "Pod default/trainer"]
    # The pod runs where its named claim is allocated.
    assert allocate[0].node == allocate[1].node == "node-a"
    own = allocate[1].claims[0]
    assert own.meta.name.startswith("trainer-own-")
    released = [a.claims[0].meta.name for a in result.actions if a.kind is replay.ActionKind.RELEASE]
    assert released == [own.meta.name]
    assert [c.meta.name for c in result.held] == ["named"]


def test_a_claim_holding_the_name_of_a_pods_template_claim_keeps_its_devices() -> None:
    """A present claim named as the pod's template claim would be is not replaced by it: the pod's claim gets the
    next name, both are held, and the pod's departure releases only its own."""
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "one-gpu", "namespace": "default"},
        "spec": {
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com"}}]}}
        },
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "trainer", "namespace": "default"},
        "spec": {
            "resourceClaims": [{"name": "own", "resourceClaimTemplateName": "one-gpu"}],
            "containers": [{"name": "main", "image": "busybox"}],
        },
    }
    taken = claims.generated_claim_name("trainer", "own", namespace="default")
    events = [
        {"at": 0, "arrive": _claim(taken)},
        {"at": 1, "arrive": pod},
        {"at": 9, "depart": {"kind": "Pod", "name": "trainer"}},
    ]
    result = replay.replay(_small(events, extra=[template]), policy=config.Policy.FIRST_FIT)
    allocated = [a.claims[0].meta.name for a in result.actions if a.kind is replay.ActionKind.ALLOCATE]
    second = claims.generated_claim_name("trainer", "own", namespace="default", attempt=1)
    assert allocated == [taken, second]
    released = [a.claims[0].meta.name for a in result.actions if a.kind is replay.ActionKind.RELEASE]
    assert released == [second]
    assert [c.meta.name for c in result.held] == [taken]


def test_replay_is_deterministic_with_a_fresh_allocator() -> None:
    """Two replays of the same generated trace make the same allocations under binpack."""
    generated = trace.generate("mix=reference,seed=2,claims=120,round=20")
    first = replay.replay(generated, policy=config.Policy.BINPACK)
    second = replay.replay(trace.parse(copy.deepcopy(dict(generated.document))), policy=config.Policy.BINPACK)
    assert _allocations(first) == _allocations(second)
    assert first.metrics.time == second.metrics.time


def test_first_rejection_is_measured_before_the_rejected_claim() -> None:
    """The cluster at the first rejection is measured; with no rejection there is none."""
    events = [
        {"at": 0, "arrive": _claim("a", count=2)},
        {"at": 0, "arrive": _claim("b", count=2)},
        {"at": 1, "arrive": _claim("more")},
    ]
    result = replay.replay(_small(events))
    assert result.at_first_rejection is not None
    assert result.at_first_rejection.cluster.full == 4
    calm = replay.replay(_small(events[:1]))
    assert calm.at_first_rejection is None
    assert isinstance(calm.held[0], model.ResourceClaim)


def test_claims_in_the_cluster_are_held_or_allocated_at_the_start() -> None:
    """A cluster claim with an allocation holds it from time 0; one without is allocated before the first event."""
    held = _claim("held")
    held["status"] = {
        "allocation": {
            "devices": {
                "results": [{"request": "gpu", "driver": "gpu.example.com", "pool": "node-a", "device": "gpu-0"}]
            }
        }
    }
    events = [{"at": 5, "arrive": _claim("later", count=2)}]
    result = replay.replay(_small(events, extra=[held, _claim("early")]), policy=config.Policy.FIRST_FIT)
    assert [(a.kind.value, a.work, a.at) for a in result.actions] == [
        ("allocate", "ResourceClaim default/early", 5.0),
        ("allocate", "ResourceClaim default/later", 5.0),
    ]
    devices = {c.meta.name: sorted(f"{r.pool}/{r.device}" for r in c.allocation.results) for c in result.held}  # type: ignore[union-attr]
    assert devices == {"held": ["node-a/gpu-0"], "early": ["node-a/gpu-1"], "later": ["node-b/gpu-0", "node-b/gpu-1"]}
