"""`dractl simulate` places the pods of a PodGroup (both APIs) as one gang: all or nothing, in one topology domain."""

from __future__ import annotations

import pathlib
import textwrap
from typing import Any

import pytest
from click.testing import CliRunner
from support import gang_manifests

from dractl import alloc, cli, config, model
from dractl.model import decode
from dractl.simulate import engine

EXAMPLE = pathlib.Path(__file__).parent / "manifests" / "gang-rack.yaml"
# Racks of 3 and 4 nodes, and one of 2, each node with 8 GPUs.
RACKS = gang_manifests.racks(
    {
        "r1": [("a1", 8), ("a2", 8), ("a3", 8)],
        "r2": [("b1", 8), ("b2", 8), ("b3", 8), ("b4", 8)],
        "r3": [("c1", 8), ("c2", 8)],
    }
)


def _simulate(*documents: str, levels: tuple[str, ...] = ()) -> engine.Result:
    objects = decode.load_text("\n---\n".join(documents), file="m.yaml")
    return engine.simulate(objects, policy=alloc.Policy.BINPACK, search_limit=100_000, topology_levels=levels)


def _by_pod(result: engine.Result) -> dict[str, engine.ClaimOutcome]:
    """Each claim by the pod it was made for (its name up to the template's claim name)."""
    return {outcome.name.rsplit("-gpus-", 1)[0]: outcome for outcome in result.claims}


def _racks_of(result: engine.Result, prefix: str) -> set[str]:
    return {o.node[0] for o in result.claims if o.name.startswith(prefix) and o.node is not None}


def test_a_gang_of_four_where_three_fit_places_none_and_says_why() -> None:
    """Guards: a 4-pod gang of 8-GPU pods, rack key, racks of at most 3 free nodes: no claim allocated, every claim
    of the gang gives the gang's line first."""
    cluster = gang_manifests.racks({"r1": [("a1", 8), ("a2", 8), ("a3", 8)], "r2": [("b1", 8)]})
    result = _simulate(
        cluster,
        gang_manifests.template(8),
        gang_manifests.gang("train", 4, topology="rack"),
        gang_manifests.job("train", 4, group="train"),
    )
    line = (
        "gang ml/train (minCount 4, topology rack): no rack fits 4 pods; best r1 fits 3: 1 pod short, "
        "8 GPUs of class gpu.example.com"
    )
    assert [(o.status, o.reasons[0]) for o in result.claims] == [(engine.Status.NOT_ALLOCATED, line)] * 4
    assert result.attempted == 4


def test_two_gangs_competing_place_exactly_one_whole() -> None:
    """Guards: two 3-pod gangs for 4 nodes: the first in the input is placed whole, the other holds nothing."""
    cluster = gang_manifests.racks({"r1": [("a1", 8), ("a2", 8), ("a3", 8), ("a4", 8)]})
    result = _simulate(
        cluster,
        gang_manifests.template(8),
        gang_manifests.gang("first", 3),
        gang_manifests.gang("second", 3),
        gang_manifests.job("first", 3, group="first"),
        gang_manifests.job("second", 3, group="second"),
    )
    placed = {o.name.split("-")[0]: 0 for o in result.claims}
    for outcome in result.claims:
        placed[outcome.name.split("-")[0]] += outcome.allocated
    assert placed == {"first": 3, "second": 0}
    assert all(
        o.reasons[0].startswith("gang ml/second (minCount 3): the cluster fits 1 of 3 pods")
        for o in result.claims
        if o.name.startswith("second")
    )


def test_the_smallest_rack_that_fits_is_chosen() -> None:
    """Guards: a 2-pod gang with a rack key goes to the 2-node rack r3, a 3-pod one to r1 (3 nodes), a 4-pod one to
    r2: each the smallest rack that holds it."""
    result = _simulate(
        RACKS,
        gang_manifests.template(8),
        *(gang_manifests.gang(name, size, topology="rack") for name, size in (("p", 2), ("q", 3), ("s", 4))),
        *(gang_manifests.job(name, size, group=name) for name, size in (("p", 2), ("q", 3), ("s", 4))),
    )
    assert all(o.allocated for o in result.claims)
    assert (_racks_of(result, "p-"), _racks_of(result, "q-"), _racks_of(result, "s-")) == ({"c"}, {"a"}, {"b"})


def test_topology_levels_prefer_the_smallest_domain_without_a_required_key() -> None:
    """Guards: a 2-pod gang without a key goes where binpack puts it (r1's first nodes); with --topology-levels rack
    it goes to the smallest rack that holds it, r3, keeping r1 whole."""
    documents = (RACKS, gang_manifests.template(8), gang_manifests.gang("p", 2), gang_manifests.job("p", 2, group="p"))
    assert _racks_of(_simulate(*documents), "p-") == {"a"}
    assert _racks_of(_simulate(*documents, levels=("rack",)), "p-") == {"c"}


def test_coscheduling_pod_group_with_labelled_job() -> None:
    """Guards: a scheduling.x-k8s.io/v1alpha1 PodGroup and a Job whose template carries the pod-group label form a
    gang: with minMember above what fits, nothing is allocated."""
    group = "apiVersion: scheduling.x-k8s.io/v1alpha1\nkind: PodGroup\nmetadata: {name: train, namespace: ml}\n"
    job = (
        gang_manifests.job("train", 10, group="train")
        .replace("      schedulingGroup: {podGroupName: train}\n", "")
        .replace("  template:\n", f"  template:\n    metadata:\n      labels: {{{model.POD_GROUP_LABEL}: train}}\n")
    )
    fits = _simulate(RACKS, gang_manifests.template(8), group + "spec: {minMember: 9}", job)
    assert sum(o.allocated for o in fits.claims) == 9
    refused = _simulate(RACKS, gang_manifests.template(8), group + "spec: {minMember: 10}", job)
    assert not any(o.allocated for o in refused.claims)
    assert refused.claims[0].reasons[0] == (
        "gang ml/train (minCount 10): the cluster fits 9 of 10 pods: 1 pod short, 8 GPUs of class gpu.example.com"
    )


# The seed article's PodGroup, as written (seed 004), and 8 pods that join it by its label.
SEED_004 = """
apiVersion: scheduling.x-k8s.io/v1alpha1
kind: PodGroup
metadata:
  name: distributed-training
spec:
  minMember: 8
  scheduleTimeoutSeconds: 300
"""


def _seed_pods(count: int) -> str:
    pods = []
    for i in range(count):
        pods.append(
            textwrap.dedent(
                f"""
                apiVersion: v1
                kind: Pod
                metadata:
                  name: worker-{i}
                  labels: {{{model.POD_GROUP_LABEL}: distributed-training}}
                spec:
                  resourceClaims: [{{name: gpus, resourceClaimTemplateName: gpus}}]
                  containers: [{{name: trainer, image: trainer, resources: {{claims: [{{name: gpus}}]}}}}]
                """
            )
        )
    return "\n---\n".join(pods)


@pytest.mark.parametrize(("pods", "allocated"), [(8, 8), (7, 0)], ids=["eight-pods", "seven-pods"])
def test_seed_004_pod_group_works_as_written(pods: int, allocated: int) -> None:
    """Guards: the seed's v1alpha1 PodGroup (minMember 8) with 8 labelled pods places all 8; with 7 it places
    none, each claim saying the gang lacks members."""
    result = _simulate(RACKS, gang_manifests.template(4, namespace="default"), SEED_004, _seed_pods(pods))
    assert sum(o.allocated for o in result.claims) == allocated
    if not allocated:
        assert {o.reasons[0] for o in result.claims} == {
            "gang default/distributed-training (minCount 8): 7 member pods, fewer than its minCount"
        }


def test_a_pod_naming_a_group_not_in_the_input_stays_pending() -> None:
    """Guards: a pod joining a PodGroup the input lacks is not scheduled, and says so."""
    result = _simulate(RACKS, gang_manifests.template(8), gang_manifests.job("train", 1, group="missing"))
    (outcome,) = result.claims
    assert not outcome.allocated
    assert outcome.reasons == (
        "not allocated: pod ml/train-0 joins PodGroup ml/missing (scheduling.k8s.io/v1alpha2), which is not in the "
        "input: a scheduler keeps the pod pending until its PodGroup exists",
    )


def test_a_pod_group_claim_is_allocated_once_shared_and_reserved_for_the_group() -> None:
    """Guards: a v1alpha2 PodGroup's own claim (from a template) is made once, allocated on one node, and pins
    every member there; it is reserved for the PodGroup, each member's own claim for its pod; it is owned by the
    PodGroup as kube-controller-manager makes it (no blockOwnerDeletion)."""
    group = gang_manifests.gang("train", 2) + "  resourceClaims:\n  - {name: shared, resourceClaimTemplateName: one}\n"
    own = "      - {name: gpus, resourceClaimTemplateName: two}\n"
    job = gang_manifests.job("train", 2, group="train", template_name="two").replace(
        own, own + "      - {name: shared, resourceClaimTemplateName: one}\n"
    )
    result = _simulate(
        RACKS,
        gang_manifests.template(1, name="one"),
        gang_manifests.template(2, name="two"),
        group,
        job,
    )
    assert all(o.allocated for o in result.claims)
    shared = [o for o in result.claims if o.name.startswith("train-shared-")]
    assert len(shared) == 1 and len(result.claims) == 3
    assert {o.node for o in result.claims} == {shared[0].node}
    assert shared[0].claim is not None
    (consumer,) = shared[0].claim.reserved_for
    assert (consumer.resource, consumer.name, consumer.api_group) == ("podgroups", "train", "scheduling.k8s.io")
    (owner,) = shared[0].claim.meta.owner_references
    assert {key: owner[key] for key in ("apiVersion", "kind", "name", "controller")} == {
        "apiVersion": "scheduling.k8s.io/v1alpha2",
        "kind": "PodGroup",
        "name": "train",
        "controller": True,
    }
    assert "blockOwnerDeletion" not in owner, "kube-controller-manager 1.36 leaves it out for a PodGroup's claim"


def test_the_example_places_its_gang_in_the_rack_that_holds_it() -> None:
    """Guards: tests/unit/simulate/manifests/gang-rack.yaml places the Job's 4 pods in r2, the only rack of 4 nodes;
    at 5 pods it says which rack came closest."""
    text = EXAMPLE.read_text(encoding="utf-8")
    result = _simulate(text)
    assert [(o.status, o.node) for o in result.claims] == [
        (engine.Status.ALLOCATED, f"gpu-r2-0{i}") for i in range(1, 5)
    ]
    bigger = _simulate(text.replace("minCount: 4", "minCount: 5").replace("parallelism: 4", "parallelism: 5"))
    assert bigger.claims[0].reasons[0] == (
        "gang ml/train (minCount 5, topology rack): no rack fits 5 pods; best r2 fits 4: 1 pod short, "
        "8 GPUs of class gpu.nvidia.com"
    )


def test_topology_levels_flag_and_variable_reach_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Guards: --topology-levels (and DRACTL_TOPOLOGY_LEVELS) is split at commas into the settings; unset, empty."""
    seen: list[config.Simulate] = []

    def run(settings: config.Simulate, **_: Any) -> int:
        seen.append(settings)
        return 0

    monkeypatch.setattr(cli.simulate, "run", run)
    runner = CliRunner()
    runner.invoke(cli.main, ["simulate", "--topology-levels", "block, rack,kubernetes.io/hostname"])
    runner.invoke(cli.main, ["simulate"], env={"DRACTL_TOPOLOGY_LEVELS": "rack"})
    runner.invoke(cli.main, ["simulate"])
    assert [s.topology_levels for s in seen] == [("block", "rack", "kubernetes.io/hostname"), ("rack",), ()]


def test_a_large_gang_that_does_not_fit_tries_each_shape_once_per_domain(monkeypatch: pytest.MonkeyPatch) -> None:
    """Guards: bounded work for a large gang: 200 one-GPU pods of one Job over 20 one-node racks ask the allocator
    9 times per rack (8 fit, then the first that does not), not once per pod and rack."""
    calls: list[int] = []
    allocate = alloc.Allocator.allocate

    def counting(self: alloc.Allocator, claims: Any, *, nodes: Any = None) -> alloc.Outcome:
        calls.append(len(claims))
        return allocate(self, claims, nodes=nodes)

    monkeypatch.setattr(alloc.Allocator, "allocate", counting)
    cluster = gang_manifests.racks({f"r{i:02}": [(f"n{i:02}", 8)] for i in range(20)})
    result = _simulate(
        cluster,
        gang_manifests.template(1),
        gang_manifests.gang("train", 200, topology="rack"),
        gang_manifests.job("train", 200, group="train"),
    )
    assert not any(o.allocated for o in result.claims)
    assert result.claims[0].reasons[0] == (
        "gang ml/train (minCount 200, topology rack): no rack fits 200 pods; best r00 fits 8: 192 pods short, "
        "192 GPUs of class gpu.example.com"
    )
    assert len(calls) == 20 * 9


def test_pod_groups_of_both_apis_with_one_name_are_two_gangs() -> None:
    """Guards: a v1alpha2 and a v1alpha1 PodGroup named alike gather only the pods that join through their API."""
    coscheduling = "apiVersion: scheduling.x-k8s.io/v1alpha1\nkind: PodGroup\nmetadata: {name: train, namespace: ml}\n"
    labelled = (
        gang_manifests.job("other", 1, group="train")
        .replace("      schedulingGroup: {podGroupName: train}\n", "")
        .replace("  template:\n", f"  template:\n    metadata:\n      labels: {{{model.POD_GROUP_LABEL}: train}}\n")
    )
    result = _simulate(
        RACKS,
        gang_manifests.template(8),
        gang_manifests.gang("train", 2),
        coscheduling + "spec: {minMember: 3}",
        gang_manifests.job("train", 2, group="train"),
        labelled,
    )
    assert [(o.name.rsplit("-gpus-", 1)[0], o.allocated) for o in result.claims] == [
        ("train-0", True),
        ("train-1", True),
        ("other-0", False),
    ]
    assert result.claims[2].reasons == ("gang ml/train (minCount 3): 1 member pod, fewer than its minCount",)
