"""The gang planner: all or nothing, inside one domain of the required label, smallest preferred domain first."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from support import gang_manifests

from dractl import alloc, gang, model
from dractl.model import decode, placement


def _claim(name: str, gpus: int) -> str:
    return f"""
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {{name: {name}, namespace: ml}}
spec:
  devices:
    requests:
    - name: gpus
      exactly: {{deviceClassName: gpu.example.com, count: {gpus}}}
"""


def _setup(
    cluster: str, *, pods: int, gpus: int, min_count: int | None = None, topology: str | None = None
) -> tuple[alloc.Allocator, model.PodGroup, list[gang.Member], placement.Cluster]:
    claims = "\n---\n".join(_claim(f"w{i}", gpus) for i in range(pods))
    group = gang_manifests.gang("train", pods if min_count is None else min_count, topology=topology)
    objects = decode.load_text("\n---\n".join([cluster, claims, group]))
    snapshot = alloc.Snapshot(
        device_classes=objects.device_classes, resource_slices=objects.resource_slices, nodes=objects.nodes
    )
    members = [gang.Member(key=f"ml/p{i}", claims=(claim,)) for i, claim in enumerate(objects.resource_claims)]
    return alloc.Allocator(snapshot), objects.pod_groups[0], members, placement.known_nodes(objects)


TWO_RACKS = gang_manifests.racks({"r1": [("a1", 8), ("a2", 8)], "r2": [("b1", 8), ("b2", 8), ("b3", 8)]})


def _nodes(plan: gang.Plan) -> list[str | None]:
    return [p.node for p in plan.placed]


def test_a_gang_that_fits_in_no_rack_holds_nothing_and_says_why() -> None:
    """Guards: 4 pods of 8 GPUs with a rack key, racks of 2 and 3 nodes: none placed, the allocator holds nothing,
    and the line names the best rack, the pods short and the GPUs short."""
    allocator, group, members, cluster = _setup(TWO_RACKS, pods=4, gpus=8, topology="rack")
    before = allocator.usage()
    result = gang.plan(allocator, group, members=members, cluster=cluster)
    assert result.placed == () and not result.ok
    assert result.reason == (
        "gang ml/train (minCount 4, topology rack): no rack fits 4 pods; best r2 fits 3: 1 pod short, "
        "8 GPUs of class gpu.example.com"
    )
    assert [left.reasons[0] for left in result.left] == [result.reason] * 4
    assert allocator.usage() == before


def test_without_topology_the_whole_cluster_is_one_domain() -> None:
    """Guards: a gang without a key uses every node: 5 pods over both racks."""
    allocator, group, members, cluster = _setup(TWO_RACKS, pods=5, gpus=8)
    result = gang.plan(allocator, group, members=members, cluster=cluster)
    assert result.ok and result.domain is None
    assert sorted(_nodes(result)) == ["a1", "a2", "b1", "b2", "b3"]


def test_without_topology_a_gang_too_large_says_what_the_cluster_fits() -> None:
    """Guards: the line of a gang without a key counts the whole cluster."""
    allocator, group, members, cluster = _setup(TWO_RACKS, pods=7, gpus=8)
    result = gang.plan(allocator, group, members=members, cluster=cluster)
    assert result.reason == (
        "gang ml/train (minCount 7): the cluster fits 5 of 7 pods: 2 pods short, 16 GPUs of class gpu.example.com"
    )


def test_the_smallest_rack_that_fits_is_chosen() -> None:
    """Guards: 2 pods of 8 GPUs go to the 2-node rack r2, keeping the 3-node rack r1 whole, although r1 sorts
    first."""
    cluster_text = gang_manifests.racks({"r1": [("a1", 8), ("a2", 8), ("a3", 8)], "r2": [("b1", 8), ("b2", 8)]})
    allocator, group, members, cluster = _setup(cluster_text, pods=2, gpus=8, topology="rack")
    result = gang.plan(allocator, group, members=members, cluster=cluster)
    assert result.domain == "rack=r2"
    assert sorted(_nodes(result)) == ["b1", "b2"]


def test_ties_between_equal_racks_go_by_name() -> None:
    """Guards: two racks of equal size: the one whose value sorts first."""
    cluster_text = gang_manifests.racks({"r9": [("z1", 8)], "r3": [("y1", 8)]})
    allocator, group, members, cluster = _setup(cluster_text, pods=1, gpus=8, topology="rack")
    assert gang.plan(allocator, group, members=members, cluster=cluster).domain == "rack=r3"


def test_a_preferred_level_keeps_wider_domains_whole() -> None:
    """Guards: with levels [block, rack] and no required key, a 2-pod gang goes to the smallest rack that holds it
    (r2, 2 nodes, in block b1), not across racks or into the 3-node rack."""
    cluster_text = gang_manifests.racks(
        {"r1": [("a1", 8), ("a2", 8), ("a3", 8)], "r2": [("b1", 8), ("b2", 8)], "r3": [("c1", 8)]},
        block={"r1": "b1", "r2": "b1", "r3": "b2"},
    )
    allocator, group, members, cluster = _setup(cluster_text, pods=2, gpus=8)
    result = gang.plan(allocator, group, members=members, cluster=cluster, levels=("block", "rack"))
    assert result.domain == "rack=r2"
    assert sorted(_nodes(result)) == ["b1", "b2"]


def test_a_preferred_level_falls_back_to_the_required_domain() -> None:
    """Guards: when no rack holds the gang, it is placed across racks of its required block."""
    cluster_text = gang_manifests.racks(
        {"r1": [("a1", 8)], "r2": [("b1", 8)], "r3": [("c1", 8)]}, block={"r1": "b1", "r2": "b1", "r3": "b2"}
    )
    allocator, group, members, cluster = _setup(cluster_text, pods=2, gpus=8, topology="block")
    result = gang.plan(allocator, group, members=members, cluster=cluster, levels=("rack",))
    assert result.domain == "block=b1"
    assert sorted(_nodes(result)) == ["a1", "b1"]


def test_at_least_min_count_is_enough_and_the_rest_say_why() -> None:
    """Guards: 4 pods with minCount 3 in a 3-node rack: 3 placed, the fourth left with its allocator reason."""
    cluster_text = gang_manifests.racks({"r1": [("a1", 8), ("a2", 8), ("a3", 8)]})
    allocator, group, members, cluster = _setup(cluster_text, pods=4, gpus=8, min_count=3, topology="rack")
    result = gang.plan(allocator, group, members=members, cluster=cluster)
    assert result.ok and len(result.placed) == 3
    assert [left.key for left in result.left] == ["ml/p3"]


def test_two_gangs_competing_place_exactly_one_whole() -> None:
    """Guards: two 3-pod gangs over 4 nodes: the first is placed whole, the second holds nothing."""
    cluster_text = gang_manifests.racks({"r1": [("a1", 8), ("a2", 8), ("a3", 8), ("a4", 8)]})
    allocator, group, members, cluster = _setup(cluster_text, pods=6, gpus=8, min_count=3)
    first = gang.plan(allocator, group, members=members[:3], cluster=cluster)
    held = allocator.usage()
    second = gang.plan(allocator, group, members=members[3:], cluster=cluster)
    assert (len(first.placed), len(second.placed)) == (3, 0)
    assert allocator.usage() == held


def test_a_label_no_node_has_is_one_line() -> None:
    """Guards: a key no node carries fails the gang with that fact."""
    allocator, group, members, cluster = _setup(TWO_RACKS, pods=1, gpus=1, topology="zone")
    assert gang.plan(allocator, group, members=members, cluster=cluster).reason == (
        "gang ml/train (minCount 1, topology zone): no node has the label zone"
    )


def test_fewer_members_than_min_count_place_nothing() -> None:
    """Guards: a gang with fewer members than its minimum is not tried."""
    allocator, group, members, cluster = _setup(TWO_RACKS, pods=2, gpus=1, min_count=3)
    result = gang.plan(allocator, group, members=members, cluster=cluster)
    assert result.reason == "gang ml/train (minCount 3): 2 member pods, fewer than its minCount"


@pytest.mark.parametrize("shared", [True, False], ids=["shared-claim", "own-claims"])
def test_a_claim_two_members_share_is_allocated_once_and_pins_both(shared: bool) -> None:
    """Guards: a claim in two members' lists is allocated with the first and pins the second to its node."""
    cluster_text = gang_manifests.racks({"r1": [("a1", 8), ("a2", 8)]})
    allocator, group, members, cluster = _setup(cluster_text, pods=3, gpus=2, min_count=2)
    common = members[2].claims
    pair: Sequence[gang.Member] = [
        gang.Member(key=m.key, claims=(*m.claims, *(common if shared else ()))) for m in members[:2]
    ]
    result = gang.plan(allocator, group, members=pair, cluster=cluster)
    assert result.ok
    allocated = [claim.key for p in result.placed for claim, _ in p.allocations]
    assert allocated == (["ml/w0", "ml/w2", "ml/w1"] if shared else ["ml/w0", "ml/w1"])
    if shared:
        assert _nodes(result)[0] == _nodes(result)[1]


def test_pods_joining_a_running_gang_go_to_its_narrowest_shared_domain_first_and_never_leave_its_key() -> None:
    """Guards: `running_domains`: the preferred levels that hold every node the gang runs on, narrowest first, then
    the required key's domain (the whole cluster without a key); none when the gang is not in one domain of its
    key."""
    labels = {
        "a1": {"block": "b1", "rack": "r1", "kubernetes.io/hostname": "a1"},
        "a2": {"block": "b1", "rack": "r1", "kubernetes.io/hostname": "a2"},
        "c1": {"block": "b1", "rack": "r2", "kubernetes.io/hostname": "c1"},
    }
    cluster = placement.Cluster(names=tuple(labels), labels=labels, has_nodes=True)
    levels = ("block", "rack", "kubernetes.io/hostname")
    assert gang.running_domains(cluster, ["a1", "a2"], key="block", levels=levels) == ("rack=r1", "block=b1")
    assert gang.running_domains(cluster, ["a1"], key=None, levels=("rack",)) == ("rack=r1", None)
    assert gang.running_domains(cluster, ["a1", "c1"], key="block", levels=levels) == ("block=b1",)
    assert gang.running_domains(cluster, ["a1", "c1"], key="rack", levels=()) == ()
