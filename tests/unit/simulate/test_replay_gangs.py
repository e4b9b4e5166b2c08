"""Traces with gangs: PodGroups arriving (or in the cluster) and their pods over time, placed all or nothing."""

from __future__ import annotations

import io
import json
from typing import Any

import yaml
from support import gang_manifests

from dractl import config, model
from dractl import gang as gang_module
from dractl.simulate import metrics, replay, trace

# Rack r1 of two 8-GPU nodes and rack r2 of three.
RACKS = gang_manifests.racks({"r1": [("a1", 8), ("a2", 8)], "r2": [("b1", 8), ("b2", 8), ("b3", 8)]})


def _objects(*manifests: str) -> list[dict[str, Any]]:
    return [d for text in manifests for d in yaml.safe_load_all(text) if d]


def _group(name: str, min_count: int, *, topology: str | None = "rack", claims: bool = False) -> dict[str, Any]:
    (group,) = _objects(gang_manifests.gang(name, min_count, topology=topology))
    if claims:
        group["spec"]["resourceClaims"] = [{"name": "shared", "resourceClaimTemplateName": "one"}]
    return group


def _pod(name: str, *, group: str, gpus: str = "gpus", shared: bool = False) -> dict[str, Any]:
    entries = [{"name": "gpus", "resourceClaimTemplateName": gpus}]
    if shared:
        entries.append({"name": "shared", "resourceClaimTemplateName": "one"})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {
            "schedulingGroup": {"podGroupName": group},
            "resourceClaims": entries,
            "containers": [{"name": "c", "image": "i"}],
        },
    }


def _rack_blocker() -> dict[str, Any]:
    """A pod `s0` of no gang, pinned to rack r2."""
    blocker = _pod("s0", group="none")
    del blocker["spec"]["schedulingGroup"]
    blocker["spec"]["nodeSelector"] = {"rack": "r2"}
    return blocker


def _depart(kind: str, name: str) -> dict[str, Any]:
    return {"kind": kind, "name": name, "namespace": "ml"}


def _trace(events: list[dict[str, Any]], *, gpus: int = 8, cluster: list[dict[str, Any]] = ()) -> trace.Trace:  # type: ignore[assignment]
    objects = _objects(RACKS, gang_manifests.template(gpus), gang_manifests.template(1, name="one"))
    document = {
        "apiVersion": trace.API_VERSION,
        "kind": trace.KIND,
        "metadata": {"name": "gangs"},
        "spec": {"cluster": {"objects": [*objects, *cluster]}, "events": events},
    }
    return trace.parse(document, file="gangs.yaml")


def _placed(result: replay.Result) -> dict[str, str | None]:
    """Pod -> node of its allocations, in the order they were made."""
    return {a.work.removeprefix("Pod ml/"): a.node for a in result.actions if a.kind is replay.ActionKind.ALLOCATE}


def _rack(node: str | None) -> str:
    return "r1" if node is not None and node.startswith("a") else "r2"


def test_a_gang_is_placed_once_its_minimum_has_arrived_all_in_one_rack() -> None:
    """Guards: pods of a gang that arrive one at a time wait without being refused until minCount are there, then
    all are placed at once, in one rack; the gang counts as admitted."""
    tr = _trace(
        [
            {"at": 0, "arrive": _group("train", 3)},
            {"at": 1, "arrive": _pod("p0", group="train")},
            {"at": 2, "arrive": _pod("p1", group="train")},
            {"at": 3, "arrive": _pod("p2", group="train")},
        ]
    )
    result = replay.replay(tr, frames=4)
    placed = _placed(result)
    assert list(placed) == ["p0", "p1", "p2"]
    assert {a.at for a in result.actions if a.kind is replay.ActionKind.ALLOCATE} == {3.0}
    assert {_rack(node) for node in placed.values()} == {"r2"}
    time = result.metrics.time
    assert time is not None and time.gangs == metrics.GangCounts(admitted=1, refused=0)
    assert time.rejections == 0
    # The moment after the second pod: both wait for the third, and say so.
    waiting = dict(result.frames[2].waiting)
    assert len(waiting) == 2
    assert all(
        reasons == ("not allocated: gang ml/train (minCount 3, topology rack): 2 of 3 member pods have arrived",)
        for reasons in waiting.values()
    )
    assert {gang for _, gang in result.frames[-1].gangs} == {"ml/train"}


def test_a_gang_that_does_not_fit_is_refused_as_one_and_admitted_after_a_departure() -> None:
    """Guards: a 3-pod gang of 8-GPU pods where no rack has 3 free nodes holds nothing, is refused once with the
    gang's line (one REJECT for the gang, its 3 claims counted), and is placed whole in one rack once a pod there
    departs."""
    blocker = _rack_blocker()
    tr = _trace(
        [
            {"at": 0, "arrive": blocker},
            {"at": 1, "arrive": _group("big", 3)},
            *({"at": 1, "arrive": _pod(f"b{i}", group="big")} for i in range(3)),
            {"at": 5, "depart": _depart("Pod", "s0")},
        ]
    )
    result = replay.replay(tr)
    placed = _placed(result)
    assert _rack(placed["s0"]) == "r2"
    refused = [a for a in result.actions if a.kind is replay.ActionKind.REJECT]
    assert [(a.at, a.work) for a in refused] == [(1.0, "PodGroup ml/big")]
    assert refused[0].reasons == (
        "gang ml/big (minCount 3, topology rack): no rack fits 3 pods; best r1 fits 2: 1 pod short, "
        "8 GPUs of class gpu.example.com",
    )
    assert [pod for pod in placed if pod.startswith("b")] == ["b0", "b1", "b2"]
    assert {_rack(placed[f"b{i}"]) for i in range(3)} == {"r2"}
    assert {a.at for a in result.actions if a.work.startswith("Pod ml/b")} == {5.0}
    time = result.metrics.time
    assert time is not None and time.gangs == metrics.GangCounts(admitted=1, refused=1)
    assert time.rejections == 3


def test_a_pod_joining_a_gang_that_runs_goes_to_its_rack() -> None:
    """Guards: a pod that joins a gang already placed is placed in the gang's rack, though the other rack has room,
    and waits (refused) when that rack is full rather than going elsewhere."""
    tr = _trace(
        [
            {"at": 0, "arrive": _group("train", 2)},
            {"at": 0, "arrive": _pod("p0", group="train")},
            {"at": 0, "arrive": _pod("p1", group="train")},
            {"at": 1, "arrive": _pod("p2", group="train")},
        ]
    )
    result = replay.replay(tr)
    placed = _placed(result)
    assert _rack(placed["p0"]) == _rack(placed["p1"]) == "r1"
    assert placed.keys() == {"p0", "p1"}
    (outcome,) = result.pending
    assert outcome.reasons == (
        "gpus: device class gpu.example.com matches 40 devices; 40 pass the request's selectors; 0 of those are "
        "free on the candidate nodes (8 needed)",
        # The allocator's what-if knows no gangs: its hint would move the other member out of the rack.
        "a repack would admit it: move ml/p0-gpus-kx9nx (gpu-0, gpu-1, gpu-2, gpu-3, gpu-4, gpu-5, gpu-6, gpu-7 on a1 "
        "-> gpu-0, gpu-1, gpu-2, gpu-3, gpu-4, gpu-5, gpu-6, gpu-7 on b1)",
    )


def test_pods_that_come_before_their_pod_group_wait_for_it_without_a_rejection() -> None:
    """Guards: member pods that arrive before their PodGroup wait for it (saying so), are not counted as rejected,
    and are placed when it arrives."""
    tr = _trace(
        [
            {"at": 0, "arrive": _pod("p0", group="train")},
            {"at": 0, "arrive": _pod("p1", group="train")},
            {"at": 2, "arrive": _group("train", 2)},
        ],
        gpus=1,
    )
    before = replay.replay(_trace(tr.document["spec"]["events"][:2], gpus=1))
    assert [o.reasons for o in before.pending] == [
        (
            "not allocated: pod ml/p0 joins PodGroup ml/train (scheduling.k8s.io/v1alpha2), which has not arrived: "
            "it waits for its PodGroup",
        ),
        (
            "not allocated: pod ml/p1 joins PodGroup ml/train (scheduling.k8s.io/v1alpha2), which has not arrived: "
            "it waits for its PodGroup",
        ),
    ]
    assert before.metrics.time is not None and before.metrics.time.rejections == 0
    result = replay.replay(tr)
    assert {a.at for a in result.actions if a.kind is replay.ActionKind.ALLOCATE} == {2.0}
    assert _placed(result).keys() == {"p0", "p1"} and not result.pending


def test_a_pod_group_in_the_cluster_is_there_from_the_start() -> None:
    """Guards: a PodGroup in spec.cluster.objects (of either API) gathers the pods that arrive."""
    coscheduling = {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": "seed", "namespace": "ml"},
        "spec": {"minMember": 2},
    }
    pods = []
    for i in range(2):
        pod = _pod(f"p{i}", group="unused")
        del pod["spec"]["schedulingGroup"]
        pod["metadata"]["labels"] = {"scheduling.x-k8s.io/pod-group": "seed"}
        pods.append({"at": i, "arrive": pod})
    result = replay.replay(_trace(pods, cluster=[coscheduling]))
    assert _placed(result).keys() == {"p0", "p1"}
    assert {a.at for a in result.actions if a.kind is replay.ActionKind.ALLOCATE} == {1.0}


def test_the_claims_of_a_pod_group_are_shared_and_go_when_the_group_departs() -> None:
    """Guards: a v1alpha2 PodGroup's claim from a template is made once, allocated with the first member, used by
    both members, kept while the pods depart, and released when the PodGroup departs."""
    tr = _trace(
        [
            {"at": 0, "arrive": _group("train", 2, claims=True)},
            {"at": 0, "arrive": _pod("p0", group="train", shared=True)},
            {"at": 0, "arrive": _pod("p1", group="train", shared=True)},
            {"at": 5, "depart": _depart("Pod", "p0")},
            {"at": 5, "depart": _depart("Pod", "p1")},
            {"at": 9, "depart": _depart("PodGroup", "train")},
        ],
        gpus=1,
    )
    result = replay.replay(tr)
    made = [c.meta.name for a in result.actions if a.kind is replay.ActionKind.ALLOCATE for c in a.claims]
    shared = [name for name in made if name.startswith("train-shared-")]
    assert len(shared) == 1 and len(made) == 3
    released = [(a.at, a.work) for a in result.actions if a.kind is replay.ActionKind.RELEASE]
    assert released[-1] == (9.0, f"ResourceClaim ml/{shared[0]}")
    assert [at for at, _ in released] == [5.0, 5.0, 9.0]


def test_trace_events_of_pod_groups_are_validated_naming_the_event_and_field() -> None:
    """Guards: a PodGroup arriving with a bad field, or departing before it arrived, is one line naming the event."""
    group = _group("train", 2)
    group["spec"]["schedulingPolicy"]["gang"]["minCount"] = 0
    document = _trace([]).document
    document = {**document, "spec": {**document["spec"], "events": [{"at": 0, "arrive": group}]}}
    document["spec"]["events"].append({"at": 1, "depart": _depart("PodGroup", "other")})
    try:
        trace.parse(document, file="t.yaml")
    except trace.TraceError as error:
        problems = error.problems
    else:
        raise AssertionError("the trace was accepted")
    assert problems == (
        "t.yaml: events[0].arrive: PodGroup ml/train: spec.schedulingPolicy.gang.minCount: must be a positive "
        "integer (at most 2147483647), got a number",
        "t.yaml: events[1].depart: PodGroup ml/other departs at 1s but is not present then (it never arrived, has "
        "departed already, or arrives later)",
    )


def test_generated_gangs_are_deterministic_and_keep_the_claim_stream() -> None:
    """Guards: `gangs=N` adds N gangs (a PodGroup and its pods) in racked example nodes, the same for a seed, written
    alike streamed or whole; the claims are those of the same spec without gangs, whose trace is unchanged."""
    plain = trace.generate("mix=reference,seed=3,claims=60")
    with_gangs = trace.generate("mix=reference,seed=3,claims=60,gangs=4")
    assert with_gangs.document == trace.generate("mix=reference,seed=3,claims=60,gangs=4").document
    assert (
        plain.document["spec"]["generator"]
        == "mix=reference,seed=3,claims=60,a100=8,h100=8,t4=4,round=10,departures=0.3"
    )
    assert with_gangs.document["spec"]["generator"].endswith(",gangs=4")

    def claims_of(t: trace.Trace) -> list[Any]:
        return [e for e in t.document["spec"]["events"] if "depart" in e or e["arrive"]["kind"] == "ResourceClaim"]

    assert claims_of(with_gangs) == claims_of(plain)
    groups = [e.object for e in trace.arrivals(with_gangs) if isinstance(e.object, model.PodGroup)]
    assert len(groups) == 4 and all(g.topology_key == trace.RACK_LABEL for g in groups)
    racks = {n.meta.labels[trace.RACK_LABEL] for n in with_gangs.cluster.nodes}
    assert racks == {"r01", "r02", "r03", "r04", "r05"}
    for as_json in (False, True):
        out = io.StringIO()
        trace.write_generated(trace.parse_spec("mix=reference,seed=3,claims=60,gangs=4"), out, as_json=as_json)
        assert out.getvalue() == trace.dumps(with_gangs, as_json=as_json)


def test_a_gang_count_out_of_bounds_is_one_line() -> None:
    """Guards: gangs must be an integer from 0 to MAX_GENERATED_GANGS."""
    for text, message in (
        ("mix=reference,gangs=-1", "gangs must be an integer >= 0, got '-1'"),
        ("mix=reference,gangs=2001", f"gangs must be at most {trace.MAX_GENERATED_GANGS}, got 2001"),
    ):
        try:
            trace.parse_spec(text)
        except ValueError as error:
            assert str(error) == f"--generate {text!r}: {message}"
        else:
            raise AssertionError(f"{text} was accepted")


def test_json_and_table_count_gangs_admitted_and_refused(tmp_path: Any) -> None:
    """Guards: the replay's JSON has time.gangs and its table the rows `gangs admitted` and `gangs refused` for a
    trace with PodGroups, and neither for a trace without."""
    path = tmp_path / "t.yaml"
    path.write_text(trace.dumps(trace.generate("mix=reference,seed=1,claims=100,gangs=3")), encoding="utf-8")
    out, err = io.StringIO(), io.StringIO()
    settings = config.Simulate(trace=path, output=config.OutputFormat.JSON)
    assert replay.run(settings, out=out, err=err) == 0, err.getvalue()
    gangs = json.loads(out.getvalue())["runs"][0]["metrics"]["time"]["gangs"]
    assert gangs == {"admitted": 3, "refused": 0}
    table = io.StringIO()
    assert replay.run(config.Simulate(trace=path), out=table, err=err) == 0
    assert "gangs admitted" in table.getvalue() and "gangs refused" in table.getvalue()
    path.write_text(trace.dumps(trace.generate("mix=reference,seed=1,claims=100")), encoding="utf-8")
    out = io.StringIO()
    assert replay.run(settings, out=out, err=err) == 0
    assert "gangs" not in json.loads(out.getvalue())["runs"][0]["metrics"]["time"]


def test_a_pod_group_that_departs_and_comes_back_keeps_its_running_pods_and_domain() -> None:
    """Guards: when a PodGroup departs while its pods run, a pod that joins then waits for the group (saying so);
    when the group comes back, its running pods keep their places and the new pod goes to their rack."""
    tr = _trace(
        [
            {"at": 0, "arrive": _group("train", 2)},
            {"at": 0, "arrive": _pod("p0", group="train")},
            {"at": 0, "arrive": _pod("p1", group="train")},
            {"at": 1, "depart": _depart("PodGroup", "train")},
            {"at": 2, "arrive": _pod("p2", group="train")},
            {"at": 3, "arrive": _group("train", 2)},
        ],
        gpus=1,
    )
    before = replay.replay(_trace(tr.document["spec"]["events"][:5], gpus=1))
    (waiting,) = before.pending
    assert waiting.reasons[0].startswith("not allocated: pod ml/p2 joins PodGroup ml/train")
    result = replay.replay(tr)
    placed = _placed(result)
    assert list(placed) == ["p0", "p1", "p2"]
    assert _rack(placed["p2"]) == _rack(placed["p0"]) == _rack(placed["p1"])
    assert [a.at for a in result.actions if a.kind is replay.ActionKind.ALLOCATE] == [0.0, 0.0, 3.0]
    assert not [a for a in result.actions if a.kind is replay.ActionKind.RELEASE]


def test_a_gang_is_planned_once_it_gathers_and_again_only_after_departures(monkeypatch: Any) -> None:
    """Guards: bounded work for a large gang: while it gathers no plan is made, a refused gang is not planned again
    when more of its pods arrive (only after a departure), so a gang of many pods arriving one by one costs a plan
    per departure batch, not per pod."""
    calls: list[int] = []
    original = gang_module.plan

    def counting(*args: Any, **kwargs: Any) -> gang_module.Plan:
        calls.append(len(kwargs["members"]))
        return original(*args, **kwargs)

    monkeypatch.setattr(gang_module, "plan", counting)
    blocker = _rack_blocker()
    tr = _trace(
        [
            {"at": 0, "arrive": blocker},
            {"at": 1, "arrive": _group("big", 3)},
            *({"at": 1 + i, "arrive": _pod(f"b{i}", group="big")} for i in range(6)),
            {"at": 10, "depart": _depart("Pod", "s0")},
        ]
    )
    result = replay.replay(tr)
    assert calls == [3, 6]
    assert [a.work for a in result.actions if a.kind is replay.ActionKind.REJECT] == ["PodGroup ml/big"]
    assert len([pod for pod in _placed(result) if pod.startswith("b")]) == 3


def test_a_pod_group_naming_a_template_the_cluster_lacks_is_refused_naming_it() -> None:
    """Guards: a PodGroup's spec.resourceClaims entry naming a template not in spec.cluster is one line naming the
    event (or the cluster's objects) and the field, as for a pod."""
    group = _group("train", 2)
    group["spec"]["resourceClaims"] = [{"name": "shared", "resourceClaimTemplateName": "nowhere"}]
    document = _trace([]).document
    document["spec"]["events"] = [{"at": 0, "arrive": group}]
    document["spec"]["cluster"]["objects"].append({**group, "metadata": {"name": "early", "namespace": "ml"}})
    try:
        trace.parse(document, file="t.yaml")
    except trace.TraceError as error:
        problems = error.problems
    else:
        raise AssertionError("the trace was accepted")
    assert problems == (
        "t.yaml: spec.cluster.objects: PodGroup ml/early: spec.resourceClaims[0].resourceClaimTemplateName: no "
        "ResourceClaimTemplate ml/nowhere in spec.cluster",
        "t.yaml: events[0].arrive: PodGroup ml/train: spec.resourceClaims[0].resourceClaimTemplateName: no "
        "ResourceClaimTemplate ml/nowhere in spec.cluster",
    )


def test_topology_levels_place_a_gang_in_the_smallest_rack_that_holds_it() -> None:
    """Guards: the replay takes --topology-levels: a 3-pod gang without a topology key goes to the one rack that
    holds all its pods (r2) rather than across racks (a1, a2 and b1 come first in node order)."""
    events = [
        {"at": 0, "arrive": _group("train", 3, topology=None)},
        *({"at": 0, "arrive": _pod(f"p{i}", group="train")} for i in range(3)),
    ]
    for policy in config.Policy:
        across = _placed(replay.replay(_trace(events), policy=policy))
        assert {_rack(node) for node in across.values()} == {"r1", "r2"}, policy
        placed = _placed(replay.replay(_trace(events), policy=policy, topology_levels=("rack",)))
        assert {_rack(node) for node in placed.values()} == {"r2"}, policy
