"""Allocations given in the input are checked: the first claim keeps a device, later conflicting or
invalid allocations hold nothing and are reported in every output format."""

from __future__ import annotations

import io
import json
import pathlib
import textwrap

import pytest
import yaml
from support.simulate_manifests import CLUSTER, claim, load, partitioned, pod

from dractl import alloc, config, simulate
from dractl.simulate import engine, report

ON_A = "nodeSelector: {nodeSelectorTerms: [{matchFields: [{key: metadata.name, operator: In, values: [node-a]}]}]}"
ON_B = "nodeSelector: {nodeSelectorTerms: [{matchFields: [{key: metadata.name, operator: In, values: [node-b]}]}]}"


def held(name: str, *devices: str, pool: str = "node-a", where: str = ON_A, extra: str = "") -> str:
    """A claim allocated in the input on `devices` of `pool` (`extra` is more of each result, as flow entries)."""
    results = ", ".join(f"{{request: gpu, driver: gpu.example.com, pool: {pool}, device: {d}{extra}}}" for d in devices)
    return claim(name, count=len(devices)) + textwrap.dedent(
        f"""
        status:
          allocation:
            devices:
              results: [{results}]
            {where}
        """
    )


# One GPU whole (gpu-0) or as MIG slices (gpu-0-mig-0, gpu-0-mig-1), all charging gpu-0's counter set,
# and a second GPU that is a shared (multi-allocatable) device with 80Gi of memory.
PARTITIONED = partitioned(
    counters="- {name: gpu-0-set, counters: {memory: {value: 80Gi}}}",
    devices="""
    - name: gpu-0
      consumesCounters: [{counterSet: gpu-0-set, counters: {memory: {value: 80Gi}}}]
    - name: gpu-0-mig-0
      consumesCounters: [{counterSet: gpu-0-set, counters: {memory: {value: 40Gi}}}]
    - name: gpu-0-mig-1
      consumesCounters: [{counterSet: gpu-0-set, counters: {memory: {value: 40Gi}}}]
    - name: gpu-1
      allowMultipleAllocations: true
      capacity: {memory: {value: 80Gi}}
    """,
)


# A pool whose slice selects nodes by a label no Node has: it exists, but no node can use it.
FLOATING = """
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {name: floating}
spec:
  driver: gpu.example.com
  pool: {name: floating, generation: 1, resourceSliceCount: 1}
  nodeSelector: {nodeSelectorTerms: [{matchExpressions: [{key: zone, operator: In, values: [mars]}]}]}
  devices:
  - {name: gpu-0}
"""


def _simulate(*documents: str) -> engine.Result:
    return engine.simulate(load(*documents), policy=alloc.Policy.FIRST_FIT, search_limit=100_000)


def _by_name(result: engine.Result) -> dict[str, engine.ClaimOutcome]:
    return {o.name: o for o in result.claims}


def _devices(outcome: engine.ClaimOutcome) -> list[str]:
    assert outcome.claim is not None and outcome.claim.allocation is not None
    return [r.device for r in outcome.claim.allocation.results]


def test_second_claim_on_one_device_is_a_conflict_naming_both_claims() -> None:
    """Guards: two input claims on one device: the first keeps it, the second is `conflict` with a warning naming both
    claims and the device."""
    result = _simulate(CLUSTER, held("first", "gpu-0"), held("second", "gpu-0"))
    outcomes = _by_name(result)
    assert outcomes["first"].status is engine.Status.ALLOCATED and outcomes["first"].node == "node-a"
    second = outcomes["second"]
    assert (second.status, second.allocated, second.node) == (engine.Status.CONFLICT, False, None)
    message = (
        "ResourceClaim default/second: status.allocation.devices.results[0]: device gpu.example.com/node-a/gpu-0 "
        "is already allocated to ResourceClaim default/first, which comes first in the input"
    )
    assert second.reasons == (message,)
    assert result.warnings == (message,)


def test_conflicting_claim_holds_none_of_its_devices() -> None:
    """Guards: a conflicting allocation holds nothing, not even its devices nobody else holds;
    devices are not counted twice."""
    result = _simulate(
        CLUSTER,
        held("first", "gpu-0"),
        held("second", "gpu-0", "gpu-1"),
        claim("fresh", selector='device.attributes["gpu.example.com"].model == "small"'),
    )
    outcomes = _by_name(result)
    assert outcomes["second"].status is engine.Status.CONFLICT
    assert _devices(outcomes["fresh"]) == ["gpu-1"]
    node_a = report.usage(load(CLUSTER).resource_slices, result.claims)[0]
    assert (node_a.node, node_a.devices_used, node_a.devices_total) == ("node-a", 2, 2)


def test_mig_slice_of_a_gpu_allocated_whole_overdraws_its_counter_set() -> None:
    """Guards: a MIG slice allocated in the input on a GPU another claim holds whole is a conflict naming the counter,
    both claims and both devices."""
    outcomes = _by_name(_simulate(PARTITIONED, held("whole", "gpu-0"), held("slice", "gpu-0-mig-1")))
    assert outcomes["whole"].status is engine.Status.ALLOCATED
    assert outcomes["slice"].status is engine.Status.CONFLICT
    assert outcomes["slice"].reasons == (
        "ResourceClaim default/slice: status.allocation.devices.results[0]: "
        "device gpu.example.com/node-a/gpu-0-mig-1: counter memory "
        "of counter set gpu-0-set in pool gpu.example.com/node-a would be overdrawn: 40Gi needed, 0 of 80Gi left: "
        "ResourceClaim default/whole, first in the input, "
        "holds device gpu.example.com/node-a/gpu-0 of that counter set",
    )


def test_two_mig_slices_of_one_gpu_fit_its_counter_set() -> None:
    """Guards: allocations that together stay within a counter set are all kept (no false conflict)."""
    outcomes = _by_name(
        _simulate(
            PARTITIONED,
            held("one", "gpu-0-mig-0"),
            held("two", "gpu-0-mig-1"),
            claim("whole", selector='device.attributes["gpu.example.com"].model == "x" || true'),
        )
    )
    assert [outcomes[n].status for n in ("one", "two")] == [engine.Status.ALLOCATED, engine.Status.ALLOCATED]
    assert _devices(outcomes["whole"]) == ["gpu-1"]


def test_shared_device_capacity_overdrawn_is_a_conflict() -> None:
    """Guards: shares of a multi-allocatable device whose consumed capacity adds up past its value: the later claim is a
    conflict naming the earlier one."""
    outcomes = _by_name(
        _simulate(
            PARTITIONED,
            held(
                "big",
                "gpu-1",
                extra=", shareID: 6c1b2f57-2f0a-4b5e-9b1e-0d5a1c3d7e21, consumedCapacity: {memory: 60Gi}",
            ),
            held(
                "small",
                "gpu-1",
                extra=", shareID: 7c1b2f57-2f0a-4b5e-9b1e-0d5a1c3d7e21, consumedCapacity: {memory: 10Gi}",
            ),
            held(
                "late",
                "gpu-1",
                extra=", shareID: 8c1b2f57-2f0a-4b5e-9b1e-0d5a1c3d7e21, consumedCapacity: {memory: 30Gi}",
            ),
        )
    )
    assert [outcomes[n].status for n in ("big", "small", "late")] == [
        engine.Status.ALLOCATED,
        engine.Status.ALLOCATED,
        engine.Status.CONFLICT,
    ]
    assert outcomes["late"].reasons == (
        "ResourceClaim default/late: status.allocation.devices.results[0]: device gpu.example.com/node-a/gpu-1: "
        "capacity memory would be "
        "overdrawn: 30Gi more with 70Gi of 80Gi already consumed, by ResourceClaim default/big first in the input",
    )


@pytest.mark.parametrize(
    ("allocation", "reason"),
    [
        (
            held("ghost", "gpu-7"),
            "ResourceClaim default/ghost: status.allocation.devices.results[0]: "
            "device gpu.example.com/node-a/gpu-7 does not exist: "
            "resource pool gpu.example.com/node-a generation 1 has no such device",
        ),
        (
            held("ghost", "gpu-0", pool="node-z"),
            "ResourceClaim default/ghost: status.allocation.devices.results[0]: "
            "device gpu.example.com/node-z/gpu-0 does not exist: "
            "no ResourceSlice publishes resource pool gpu.example.com/node-z",
        ),
        (
            held("ghost", "gpu-0", where=ON_B),
            "ResourceClaim default/ghost: status.allocation.nodeSelector: no known node matches it and can use every "
            "allocated device "
            "(gpu.example.com/node-a/gpu-0)",
        ),
        (
            held("ghost", "gpu-0", pool="floating", where=""),
            "ResourceClaim default/ghost: status.allocation.devices.results[0]: device gpu.example.com/floating/gpu-0 "
            "is not usable on any known node",
        ),
    ],
    ids=["no-such-device", "no-such-pool", "node-selector-elsewhere", "device-on-no-known-node"],
)
def test_allocation_that_cannot_be_valid_is_invalid(allocation: str, reason: str) -> None:
    """Guards: a device that does not exist, a pool nobody publishes, or a node selector where the device is not usable:
    status invalid, the reason names claim and device, nothing is held."""
    result = _simulate(
        CLUSTER,
        FLOATING,
        allocation,
        claim("fresh", count=2, selector='device.attributes["gpu.example.com"].model == "small"'),
    )
    outcomes = _by_name(result)
    assert (outcomes["ghost"].status, outcomes["ghost"].reasons, result.warnings) == (
        engine.Status.INVALID,
        (reason,),
        (reason,),
    )
    assert _devices(outcomes["fresh"]) == ["gpu-0", "gpu-1"]


def test_allocation_on_an_incomplete_pool_is_invalid() -> None:
    """Guards: a device of a pool whose newest generation is incomplete cannot be held: the reason says the pool is
    being updated."""
    incomplete = CLUSTER.replace(
        "pool: {name: node-a, generation: 1, resourceSliceCount: 1}",
        "pool: {name: node-a, generation: 1, resourceSliceCount: 2}",
    )
    outcome = _by_name(_simulate(incomplete, held("ghost", "gpu-0")))["ghost"]
    assert outcome.status is engine.Status.INVALID
    assert outcome.reasons == (
        "ResourceClaim default/ghost: status.allocation.devices.results[0]: "
        "device gpu.example.com/node-a/gpu-0 cannot be used: "
        "resource pool gpu.example.com/node-a is currently being updated: 1 of 2 slices of generation 1 are published",
    )


def test_pod_using_a_conflicting_claim_is_not_scheduled_nor_reserved() -> None:
    """Guards: a pod whose claim is in conflict cannot run: its other claims are not allocated and the conflicting claim
    gets no reservedFor."""
    objects = load(
        CLUSTER,
        held("first", "gpu-0"),
        held("second", "gpu-0"),
        claim("own"),
        pod("user", claims={"a": "second", "b": "own"}),
    )
    outcomes = _by_name(engine.simulate(objects, policy=alloc.Policy.FIRST_FIT, search_limit=100_000))
    assert outcomes["second"].claim is not None and outcomes["second"].claim.reserved_for == ()
    assert outcomes["own"].status is engine.Status.NOT_ALLOCATED
    assert outcomes["own"].reasons == (
        "not allocated: pod default/user cannot be scheduled: ResourceClaim default/second is in conflict status: its "
        "status.allocation holds no devices",
    )


def _run(tmp_path: pathlib.Path, output: config.OutputFormat, *documents: str) -> tuple[str, str]:
    path = tmp_path / "cluster.yaml"
    path.write_text("\n---\n".join(documents))
    out, err = io.StringIO(), io.StringIO()
    assert (
        simulate.run(config.Simulate(paths=(path,), output=output, policy=config.Policy.FIRST_FIT), out=out, err=err)
        == 0
    )
    return out.getvalue(), err.getvalue()


CONFLICT = (
    "ResourceClaim default/second: status.allocation.devices.results[0]: device gpu.example.com/node-a/gpu-0 "
    "is already allocated to ResourceClaim default/first, which comes first in the input"
)
INVALID = (
    "ResourceClaim default/ghost: status.allocation.devices.results[0]: "
    "device gpu.example.com/node-a/gpu-7 does not exist: "
    "resource pool gpu.example.com/node-a generation 1 has no such device"
)
INPUT = (CLUSTER, held("first", "gpu-0"), held("second", "gpu-0"), held("ghost", "gpu-7"))


@pytest.mark.parametrize("output", list(config.OutputFormat), ids=[f.value for f in config.OutputFormat])
def test_every_format_warns_on_stderr(tmp_path: pathlib.Path, output: config.OutputFormat) -> None:
    """Guards: in every output format each allocation that holds nothing is one `warning:` line on stderr."""
    _, err = _run(tmp_path, output, *INPUT)
    assert [line for line in err.splitlines() if line.startswith("warning:")] == [
        f"warning: {CONFLICT}",
        f"warning: {INVALID}",
    ]


def test_table_marks_conflict_and_invalid(tmp_path: pathlib.Path) -> None:
    """Guards: the table shows status conflict and invalid with the reasons, and counts them under the claims."""
    out, _ = _run(tmp_path, config.OutputFormat.TABLE, *INPUT)
    flat = " ".join(out.split())
    assert "default/second │ - │ conflict │ - ResourceClaim default/second:" in flat
    assert "default/ghost │ - │ invalid │ - ResourceClaim default/ghost:" in flat
    assert "1 of 3 claims allocated. 1 conflict, 1 invalid." in flat


def test_json_marks_conflict_and_invalid(tmp_path: pathlib.Path) -> None:
    """Guards: -o json gives each claim's status and reasons, keeps the input allocation of a conflicting claim, and
    counts them in the summary."""
    out, _ = _run(tmp_path, config.OutputFormat.JSON, *INPUT)
    document = json.loads(out)
    claims = {c["name"]: c for c in document["claims"]}
    assert [(c["status"], c["allocated"], c["reasons"]) for c in claims.values()] == [
        ("allocated", True, []),
        ("conflict", False, [CONFLICT]),
        ("invalid", False, [INVALID]),
    ]
    assert claims["second"]["allocation"]["devices"]["results"] == [
        {"request": "gpu", "driver": "gpu.example.com", "pool": "node-a", "device": "gpu-0"}
    ]
    summary = document["summary"]
    assert (
        summary["claims"],
        summary["allocated"],
        summary["unallocated"],
        summary["conflict"],
        summary["invalid"],
    ) == (3, 1, 0, 1, 1)
    assert [(n["name"], n["devices_used"]) for n in summary["nodes"]] == [("node-a", 1), ("node-b", 0)]


def test_yaml_marks_conflict_and_invalid_with_a_comment(tmp_path: pathlib.Path) -> None:
    """Guards: -o yaml keeps every claim as the API holds it and puts a `# dractl: <status>: <reason>` comment before a
    claim that holds nothing."""
    out, _ = _run(tmp_path, config.OutputFormat.YAML, *INPUT)
    assert (
        f"# dractl: conflict: {CONFLICT}\n---\napiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata:\n  name: "
        "second\n" in out
    )
    assert (
        f"# dractl: invalid: {INVALID}\n---\napiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata:\n  name: "
        "ghost\n" in out
    )
    documents = list(yaml.safe_load_all(out))
    assert [d["metadata"]["name"] for d in documents] == ["first", "second", "ghost"]
    assert all("allocation" in d["status"] for d in documents)


def test_yaml_fed_back_in_reports_the_same_conflict(tmp_path: pathlib.Path) -> None:
    """Guards: the -o yaml output with its comments decodes again and gives the same conflict."""
    out, _ = _run(tmp_path, config.OutputFormat.YAML, *INPUT)
    again, err = _run(tmp_path, config.OutputFormat.JSON, CLUSTER, out)
    assert [c["status"] for c in json.loads(again)["claims"]] == ["allocated", "conflict", "invalid"]
    assert f"warning: {CONFLICT}" in err


def test_claims_allocated_in_the_input_without_conflict_are_untouched() -> None:
    """Guards: valid input allocations on different devices are all kept, with their node, and no warning."""
    result = _simulate(CLUSTER, held("first", "gpu-0"), held("other", "gpu-0", pool="node-b", where=ON_B))
    assert [(o.name, o.status, o.node) for o in result.claims] == [
        ("first", engine.Status.ALLOCATED, "node-a"),
        ("other", engine.Status.ALLOCATED, "node-b"),
    ]
    assert result.warnings == ()


def test_admin_access_result_holds_nothing_and_does_not_conflict() -> None:
    """Guards: an adminAccess result on a device another claim holds is no conflict
    (admin access ignores allocations)."""
    admin = held("monitor", "gpu-0", extra=", adminAccess: true")
    outcomes = _by_name(_simulate(CLUSTER, held("first", "gpu-0"), admin))
    assert outcomes["monitor"].status is engine.Status.ALLOCATED


def test_rejections_reach_the_allocator_facade() -> None:
    """Guards: Allocator.rejected maps the claim key to its rejections, kind and the other claim included."""
    objects = load(CLUSTER, held("first", "gpu-0"), held("second", "gpu-0"))
    allocator = alloc.Allocator(
        alloc.Snapshot(
            device_classes=objects.device_classes,
            resource_slices=objects.resource_slices,
            nodes=objects.nodes,
            allocated_claims=objects.resource_claims,
            check_allocated=True,
        )
    )
    (rejection,) = allocator.rejected["default/second"]
    assert (rejection.kind, rejection.other, rejection.device) == (
        "conflict",
        "default/first",
        "gpu.example.com/node-a/gpu-0",
    )
    assert list(allocator.rejected) == ["default/second"]


def test_the_api_state_is_trusted_unless_checking_is_asked_for() -> None:
    """Guards: without check_allocated (the controller's view of the API) every allocation holds what it names: nothing
    is rejected and both holders block the device."""
    objects = load(CLUSTER, held("first", "gpu-0"), held("second", "gpu-0", "gpu-1"), claim("fresh", count=1))
    snapshot = alloc.Snapshot(
        device_classes=objects.device_classes,
        resource_slices=objects.resource_slices,
        nodes=objects.nodes,
        allocated_claims=objects.resource_claims[:2],
    )
    allocator = alloc.Allocator(snapshot, policy=alloc.Policy.FIRST_FIT)
    assert allocator.rejected == {}
    outcome = allocator.allocate([objects.resource_claims[2]], nodes=["node-a"])
    assert outcome.reasons == (
        alloc.Reason(
            "default/fresh",
            "gpu",
            "device class gpu.example.com matches 4 devices; 4 pass the request's selectors; 0 of those are free "
            "on the candidate nodes (1 needed)",
        ),
        alloc.Reason(
            "default/fresh",
            None,
            "a repack would admit it: move default/second (gpu-0, gpu-1 on node-a -> gpu-0, gpu-1 on node-b)",
        ),
    )
