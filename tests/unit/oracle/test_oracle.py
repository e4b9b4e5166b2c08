"""The brute-force oracle itself, on small hand-checked instances.

The property tests trust the oracle; these cases pin each rule it implements (by the API and by
DESIGN.md's six deliberate differences from upstream) so that it cannot silently agree with a
buggy allocator. Each case states the expected answer worked out by hand.
"""

from __future__ import annotations

import dataclasses

import pytest
from support import devices, oracle

from dractl import alloc, model

GPU = "gpu.nvidia.com"
NIC = "nic.example.com"
Q = model.quantity.parse


def rslice(
    name: str,
    *devs: model.Device,
    driver: str = GPU,
    pool: str = "pool",
    generation: int = 1,
    count: int = 1,
    **kw: object,
) -> model.ResourceSlice:
    """A slice named `name` of pool `pool` on node-0 unless `kw` binds it otherwise."""
    node = kw.pop("node_name", None)
    if node is None and not any(k in kw for k in ("node_selector", "all_nodes", "per_device_node_selection")):
        node = "node-0"
    return devices.rslice(
        *devs, name=name, node=node, driver=driver, pool=pool, generation=generation, count=count, **kw
    )


def request(
    name: str = "r0",
    *,
    cls: str = "any",
    count: int = 1,
    all_mode: bool = False,
    admin: bool = False,
    selectors: tuple[str, ...] = (),
    **kw: object,
) -> model.DeviceRequest:
    return model.DeviceRequest(
        name=name,
        exactly=model.ExactDeviceRequest(
            device_class_name=cls,
            selectors=selectors,
            allocation_mode=model.AllocationMode.ALL if all_mode else model.AllocationMode.EXACT_COUNT,
            count=0 if all_mode else count,
            admin_access=True if admin else None,
            **kw,  # type: ignore[arg-type]
        ),
    )


def sub(
    name: str, *, cls: str = "any", count: int = 1, all_mode: bool = False, selectors: tuple[str, ...] = ()
) -> model.DeviceSubRequest:
    return model.DeviceSubRequest(
        name=name,
        device_class_name=cls,
        selectors=selectors,
        allocation_mode=model.AllocationMode.ALL if all_mode else model.AllocationMode.EXACT_COUNT,
        count=0 if all_mode else count,
    )


def claim(
    name: str, *requests: model.DeviceRequest, constraints: tuple[model.DeviceConstraint, ...] = ()
) -> model.ResourceClaim:
    return model.ResourceClaim(
        meta=model.ObjectMeta(name=name, namespace="ns"),
        spec=model.ResourceClaimSpec(requests=requests or (request(),), constraints=constraints),
    )


def held(name: str, *results: model.DeviceRequestAllocationResult) -> model.ResourceClaim:
    return dataclasses.replace(claim(name), allocation=model.AllocationResult(results=results))


def result(
    device: str, *, req: str = "r0", driver: str = GPU, pool: str = "pool", **kw: object
) -> model.DeviceRequestAllocationResult:
    # type: ignore[arg-type]
    return model.DeviceRequestAllocationResult(request=req, driver=driver, pool=pool, device=device, **kw)


CLASSES = (
    devices.device_class("any", driver=None),
    devices.device_class("gpu", driver=GPU),
    devices.device_class("nic", driver=NIC),
)
NODES = (
    model.Node(meta=model.ObjectMeta(name="node-0", labels={"zone": "a"})),
    model.Node(meta=model.ObjectMeta(name="node-1", labels={"zone": "b"})),
)


def snap(*slices: model.ResourceSlice, allocated: tuple[model.ResourceClaim, ...] = ()) -> alloc.Snapshot:
    return alloc.Snapshot(device_classes=CLASSES, resource_slices=slices, nodes=NODES, allocated_claims=allocated)


def one_attribute(name: str, **values: object) -> alloc.Snapshot:
    """One slice of devices named by the keywords, in order, each with attribute `name` set to its value."""
    return snap(rslice("s", *(devices.device(d, attributes={name: v}) for d, v in values.items())))


def devices_of(found: tuple[model.AllocationResult, ...] | None) -> list[list[str]]:
    assert found is not None
    return [[f"{r.request}={r.device}" for r in a.results] for a in found]


# --- Visibility, counts, shape ------------------------------------------------------------------


def test_single_local_device_is_allocated_with_the_api_shape() -> None:
    """A node-local device is found, with request name, driver, pool and a metadata.name selector."""
    s = snap(rslice("s", devices.device("d0")))
    found = oracle.find_allocation(s, [claim("c")], "node-0")
    assert found is not None
    (a,) = found
    assert a.results == (result("d0"),)
    assert a.node_selector == model.NodeSelector(
        terms=(
            model.NodeSelectorTerm(
                match_fields=(model.NodeSelectorRequirement(key="metadata.name", operator="In", values=("node-0",)),)
            ),
        )
    )
    assert oracle.check(s, [claim("c")], "node-0", found) == []


def test_other_nodes_devices_are_invisible() -> None:
    """A slice bound to node-0 offers nothing on node-1, and `check` says why."""
    s = snap(rslice("s", devices.device("d0")))
    assert oracle.find_allocation(s, [claim("c")], "node-1") is None
    bad = (model.AllocationResult(results=(result("d0"),)),)
    assert any("visible" in v for v in oracle.check(s, [claim("c")], "node-1", bad))


def test_node_selector_and_all_nodes_slices_use_node_labels() -> None:
    """nodeSelector slices match Node labels; allNodes slices contribute no selector."""
    zone_a = model.NodeSelector(
        terms=(
            model.NodeSelectorTerm(
                match_expressions=(model.NodeSelectorRequirement(key="zone", operator="In", values=("a",)),)
            ),
        )
    )
    s = snap(
        rslice("s", devices.device("d0"), node_selector=zone_a, pool="p1"),
        rslice("t", devices.device("d1"), all_nodes=True, pool="p2"),
    )
    both = claim("c", request(count=2))
    found = oracle.find_allocation(s, [both], "node-0")
    assert devices_of(found) == [["r0=d0", "r0=d1"]]
    assert found is not None and found[0].node_selector == zone_a
    assert oracle.find_allocation(s, [both], "node-1") is None
    one = oracle.find_allocation(s, [claim("c")], "node-1")
    assert devices_of(one) == [["r0=d1"]] and one is not None and one[0].node_selector is None


def test_per_device_node_selection_uses_each_devices_node() -> None:
    """With perDeviceNodeSelection, each device's own nodeName decides where it is visible."""
    s = snap(
        rslice(
            "s",
            devices.device("d0", node_name="node-1"),
            devices.device("d1", node_name="node-0"),
            per_device_node_selection=True,
        )
    )
    assert devices_of(oracle.find_allocation(s, [claim("c")], "node-0")) == [["r0=d1"]]
    assert oracle.find_allocation(s, [claim("c", request(count=2))], "node-0") is None


def test_count_larger_than_the_devices_fails() -> None:
    """Exactly count 3 of two devices has no allocation; count 2 has one."""
    s = snap(rslice("s", devices.device("d0"), devices.device("d1")))
    assert oracle.find_allocation(s, [claim("c", request(count=3))], "node-0") is None
    assert devices_of(oracle.find_allocation(s, [claim("c", request(count=2))], "node-0")) == [["r0=d0", "r0=d1"]]


def test_check_reports_shape_errors() -> None:
    """`check` rejects a wrong count, an unknown request, a stray adminAccess and a wrong selector."""
    s = snap(rslice("s", devices.device("d0"), devices.device("d1")))
    c = claim("c", request(count=2))
    sel = oracle.Oracle(s, "node-0").expected_node_selector

    def alloc_of(*results: model.DeviceRequestAllocationResult) -> tuple[model.AllocationResult, ...]:
        o = oracle.Oracle(s, "node-0")
        return (
            model.AllocationResult(
                results=results, node_selector=sel([o.visible[oracle.Ref(GPU, "pool", r.device)] for r in results])
            ),
        )

    assert oracle.check(s, [c], "node-0", alloc_of(result("d0"), result("d1"))) == []
    assert any("count is 2" in v for v in oracle.check(s, [c], "node-0", alloc_of(result("d0"))))
    assert any(
        "no request" in v for v in oracle.check(s, [c], "node-0", alloc_of(result("d0"), result("d1", req="r9")))
    )
    assert any(
        "adminAccess" in v
        for v in oracle.check(s, [c], "node-0", alloc_of(result("d0"), result("d1", admin_access=True)))
    )
    assert any("twice" in v for v in oracle.check(s, [c], "node-0", alloc_of(result("d0"), result("d0"))))
    no_selector = (model.AllocationResult(results=(result("d0"), result("d1"))),)
    assert any("nodeSelector" in v for v in oracle.check(s, [c], "node-0", no_selector))
    assert any("2 allocation results for 1" in v for v in oracle.check(s, [c], "node-0", alloc_of() * 2))


def test_selectors_of_class_and_request_both_apply() -> None:
    """A device must match the class selectors and the request selectors."""
    s = snap(
        rslice("s", devices.device("d0", attributes={"numa": 1})),
        rslice("t", devices.device("n0", attributes={"numa": 0}), driver=NIC),
    )
    numa0 = ("device.attributes[device.driver].?numa.orValue(-1) == 0",)
    assert oracle.find_allocation(s, [claim("c", request(cls="gpu", selectors=numa0))], "node-0") is None
    assert devices_of(oracle.find_allocation(s, [claim("c", request(cls="nic", selectors=numa0))], "node-0")) == [
        ["r0=n0"]
    ]


# --- In use, admin access --------------------------------------------------------------------


def test_allocated_devices_are_taken_unless_admin_access() -> None:
    """A device held by an allocated claim is refused, except to an adminAccess request."""
    s = snap(rslice("s", devices.device("d0")), allocated=(held("h", result("d0")),))
    assert oracle.find_allocation(s, [claim("c")], "node-0") is None
    found = oracle.find_allocation(s, [claim("c", request(admin=True))], "node-0")
    assert found is not None and found[0].results[0].admin_access is True


def test_admin_held_devices_do_not_block() -> None:
    """An allocated claim's admin-access result does not make the device in use."""
    s = snap(rslice("s", devices.device("d0")), allocated=(held("h", result("d0", admin_access=True)),))
    assert devices_of(oracle.find_allocation(s, [claim("c")], "node-0")) == [["r0=d0"]]


def test_admin_access_never_takes_one_device_twice_in_a_claim() -> None:
    """Admin count 2 on one device fails; two admin claims may share it."""
    s = snap(rslice("s", devices.device("d0")))
    assert oracle.find_allocation(s, [claim("c", request(count=2, admin=True))], "node-0") is None
    two = [claim("a", request(admin=True)), claim("b", request(admin=True))]
    assert devices_of(oracle.find_allocation(s, two, "node-0")) == [["r0=d0"], ["r0=d0"]]


def test_admin_after_normal_claim_shares_but_normal_after_admin_does_not() -> None:
    """In one call an admin claim may reuse a device an earlier claim took, not the reverse."""
    s = snap(rslice("s", devices.device("d0")))
    assert oracle.find_allocation(s, [claim("a"), claim("b", request(admin=True))], "node-0") is not None
    assert oracle.find_allocation(s, [claim("b", request(admin=True)), claim("a")], "node-0") is None


def test_joint_claims_never_share_a_dedicated_device() -> None:
    """Two claims allocated together need two devices."""
    s = snap(rslice("s", devices.device("d0"), devices.device("d1")))
    assert devices_of(oracle.find_allocation(s, [claim("a"), claim("b")], "node-0")) == [["r0=d0"], ["r0=d1"]]
    assert oracle.find_allocation(s, [claim("a"), claim("b"), claim("c")], "node-0") is None


# --- Taints ------------------------------------------------------------------------------------


def test_taints_need_tolerations_except_effect_none() -> None:
    """NoSchedule needs a toleration (copied into the result); effect None is ignored."""
    taint = model.DeviceTaint(key="maint", value="x", effect="NoSchedule")
    s = snap(
        rslice(
            "s",
            devices.device("d0", taints=(taint,)),
            devices.device("d1", taints=(model.DeviceTaint(key="info", effect="None"),)),
        )
    )
    assert devices_of(oracle.find_allocation(s, [claim("c")], "node-0")) == [["r0=d1"]]
    assert oracle.find_allocation(s, [claim("c", request(count=2))], "node-0") is None
    tol = (model.DeviceToleration(key="maint", operator="Exists"),)
    found = oracle.find_allocation(s, [claim("c", request(count=2, tolerations=tol))], "node-0")
    assert found is not None and all(r.tolerations == tol for r in found[0].results)
    wrong_value = (model.DeviceToleration(key="maint", value="y"),)
    assert oracle.find_allocation(s, [claim("c", request(count=2, tolerations=wrong_value))], "node-0") is None


def test_admin_access_does_not_bypass_taints() -> None:
    """An adminAccess request still needs tolerations."""
    s = snap(rslice("s", devices.device("d0", taints=(model.DeviceTaint(key="k", effect="NoExecute"),))))
    assert oracle.find_allocation(s, [claim("c", request(admin=True))], "node-0") is None


# --- Counters (partitionable devices) ------------------------------------------------------------


def mig_pool(
    *, pool: str = "pool", driver: str = GPU, allocated: tuple[model.ResourceClaim, ...] = ()
) -> alloc.Snapshot:
    return snap(
        rslice(
            "a-counters",
            driver=driver,
            pool=pool,
            count=2,
            shared_counters=(devices.counter_set("gpu-0", mem=8, sm=7), devices.counter_set("gpu-1", mem=8, sm=7)),
        ),
        rslice(
            "b-devices",
            devices.device("gpu-0", consumes_counters=(devices.consumes("gpu-0", mem=8, sm=7),)),
            devices.device("gpu-0-a", consumes_counters=(devices.consumes("gpu-0", mem=4, sm=3),)),
            devices.device("gpu-0-b", consumes_counters=(devices.consumes("gpu-0", mem=4, sm=4),)),
            devices.device("gpu-1-a", consumes_counters=(devices.consumes("gpu-1", mem=4, sm=3),)),
            driver=driver,
            pool=pool,
            count=2,
        ),
        allocated=allocated,
    )


def test_partitions_share_their_parents_counters() -> None:
    """Two halves of gpu-0 fit together; the whole GPU and a half do not."""
    s = mig_pool()
    o = oracle.Oracle(s, "node-0")
    halves = (model.AllocationResult(results=(result("gpu-0-a"), result("gpu-0-b"))),)
    whole_and_half = (model.AllocationResult(results=(result("gpu-0"), result("gpu-0-a"))),)
    c = claim("c", request(count=2))
    assert o.check([c], halves, complete=False) == []
    assert any("counter set gpu-0: mem 12 > 8" in v for v in o.check([c], whole_and_half, complete=False))
    three = claim("c", request(count=3))
    assert devices_of(oracle.find_allocation(s, [three], "node-0")) == [["r0=gpu-0-a", "r0=gpu-0-b", "r0=gpu-1-a"]]


def test_allocated_partitions_consume_counters() -> None:
    """With gpu-0-a held, the whole gpu-0 is unavailable but gpu-0-b still fits."""
    s = mig_pool(allocated=(held("h", result("gpu-0-a")),))
    o = oracle.Oracle(s, "node-0")
    assert devices_of(o.find([claim("c", request(count=2))])) == [["r0=gpu-0-b", "r0=gpu-1-a"]]
    assert o.check([claim("c")], (model.AllocationResult(results=(result("gpu-0"),)),), complete=False)
    assert o.check([claim("c")], (model.AllocationResult(results=(result("gpu-0-b"),)),), complete=False) == []


def test_overcommitted_counter_set_does_not_block_another_set() -> None:
    """DESIGN (3): gpu-0 over-committed by allocated claims leaves gpu-1's partitions usable."""
    s = mig_pool(allocated=(held("h", result("gpu-0"), result("gpu-0-a")),))
    o = oracle.Oracle(s, "node-0")
    assert devices_of(o.find([claim("c")])) == [["r0=gpu-1-a"]]
    assert o.find([claim("c", request(count=2))]) is None


def test_counters_are_per_driver_and_pool() -> None:
    """DESIGN (5): two drivers' pools named alike keep separate counters.

    The GPU driver's gpu-0 is held, which exhausts its gpu-0 set; the NIC driver's whole gpu-0
    is still free, and the GPU driver's gpu-1 set is untouched.
    """
    gpu = mig_pool(pool="node-0", allocated=(held("h", result("gpu-0", pool="node-0")),))
    nic = mig_pool(pool="node-0", driver=NIC)
    s = dataclasses.replace(gpu, resource_slices=(*gpu.resource_slices, *nic.resource_slices))
    found = oracle.find_allocation(s, [claim("c", request(cls="nic", count=2), request("r1", cls="gpu"))], "node-0")
    assert devices_of(found) == [["r0=gpu-0", "r0=gpu-1-a", "r1=gpu-1-a"]]
    assert found is not None and [r.driver for r in found[0].results] == [NIC, NIC, GPU]


def test_admin_access_needs_and_consumes_no_counters() -> None:
    """DESIGN (6): admin reaches a partition of an exhausted GPU and leaves counters for others."""
    s = mig_pool(allocated=(held("h", result("gpu-0")),))
    o = oracle.Oracle(s, "node-0")
    admin_a = claim("m", request(admin=True))
    assert (
        o.check([admin_a], (model.AllocationResult(results=(result("gpu-0-a", admin_access=True),)),), complete=False)
        == []
    )
    fresh = oracle.Oracle(mig_pool(), "node-0")
    admin_then_whole = [claim("m", request(admin=True)), claim("w")]
    allocation = (
        model.AllocationResult(results=(result("gpu-0-a", admin_access=True),)),
        model.AllocationResult(results=(result("gpu-0"),)),
    )
    assert fresh.check(admin_then_whole, allocation, complete=False) == []


def test_search_backtracks_past_counters_of_a_refused_device() -> None:
    """DESIGN (1): gpu-0 is the first candidate but its counters must not stay charged."""
    s = mig_pool(allocated=(held("h", result("gpu-1-a")),))
    two_halves = claim("c", request(count=2))
    assert devices_of(oracle.find_allocation(s, [two_halves], "node-0")) == [["r0=gpu-0-a", "r0=gpu-0-b"]]


def test_counter_sets_on_another_nodes_slice_still_count() -> None:
    """A complete pool whose counter slice targets another node still supplies the counters."""
    s = snap(
        rslice("a", pool="p", count=2, node_name="node-1", shared_counters=(devices.counter_set("cs", mem=4),)),
        rslice(
            "b",
            devices.device("x", consumes_counters=(devices.consumes("cs", mem=3),)),
            devices.device("y", consumes_counters=(devices.consumes("cs", mem=2),)),
            pool="p",
            count=2,
        ),
    )
    assert devices_of(oracle.find_allocation(s, [claim("c")], "node-0")) == [["r0=x"]]
    assert oracle.find_allocation(s, [claim("c", request(count=2))], "node-0") is None


# --- Constraints ----------------------------------------------------------------------------------


def test_match_attribute_needs_equal_values_and_backtracks() -> None:
    """matchAttribute over two requests picks d1+d2 (numa 1) after d0 (numa 0) fails."""
    s = one_attribute("numa", d0=0, d1=1, d2=1)
    c = claim("c", request("r0"), request("r1"), constraints=(model.DeviceConstraint(match_attribute=f"{GPU}/numa"),))
    assert devices_of(oracle.find_allocation(s, [c], "node-0")) == [["r0=d1", "r1=d2"]]


def test_match_attribute_refuses_devices_without_it() -> None:
    """A device lacking the attribute cannot join a matchAttribute constraint."""
    s = snap(rslice("s", devices.device("d0", attributes={"numa": 0}), devices.device("d1")))
    c = claim("c", request(count=2), constraints=(model.DeviceConstraint(match_attribute=f"{GPU}/numa"),))
    assert oracle.find_allocation(s, [c], "node-0") is None


def test_match_attribute_scoped_to_one_request() -> None:
    """A constraint naming r0 leaves r1 free to take a different value."""
    s = one_attribute("numa", d0=0, d1=1)
    c = claim(
        "c",
        request("r0"),
        request("r1"),
        constraints=(model.DeviceConstraint(requests=("r0",), match_attribute=f"{GPU}/numa"),),
    )
    assert devices_of(oracle.find_allocation(s, [c], "node-0")) == [["r0=d0", "r1=d1"]]


def test_match_attribute_types_must_agree() -> None:
    """int 1, bool true and string "1" are three different values."""
    s = one_attribute("v", d0=1, d1=True, d2="1")
    for pair in (("d0", "d1"), ("d0", "d2"), ("d1", "d2")):
        c = claim("c", request(count=2), constraints=(model.DeviceConstraint(match_attribute=f"{GPU}/v"),))
        allocation = (model.AllocationResult(results=tuple(result(d) for d in pair)),)
        assert any("no common value" in v for v in oracle.check(s, [c], "node-0", allocation)), pair


def test_versions_compare_as_strings_in_constraints() -> None:
    """1.2.0 and 1.2.0+b7 are equal versions but different strings: no match (upstream rule)."""
    v = model.AttributeKind.VERSION
    s = one_attribute("ver", d0=devices.attr("1.2.0", kind=v), d1=devices.attr("1.2.0+b7", kind=v))
    c = claim("c", request(count=2), constraints=(model.DeviceConstraint(match_attribute=f"{GPU}/ver"),))
    assert oracle.find_allocation(s, [c], "node-0") is None


def test_list_match_attribute_needs_a_common_element_of_all() -> None:
    """DESIGN (4): [p0,p1], [p1,p2], [p0,p2] overlap pairwise but share nothing all three."""
    s = one_attribute("roots", a=["p0", "p1"], b=["p1", "p2"], c=["p0", "p2"])
    match = (model.DeviceConstraint(match_attribute=f"{GPU}/roots"),)
    assert oracle.find_allocation(s, [claim("c", request(count=3), constraints=match)], "node-0") is None
    assert devices_of(oracle.find_allocation(s, [claim("c", request(count=2), constraints=match)], "node-0")) == [
        ["r0=a", "r0=b"]
    ]


def test_list_match_recomputes_intersection_on_backtracking() -> None:
    """DESIGN (4): after a,b (common p1) fail on the third request, a,c (common p0) must work."""
    s = one_attribute("roots", a=["p0", "p1"], b=["p1"], c=["p0"], d=["p0", "p2"])
    c = claim(
        "c",
        request("r0"),
        request("r1"),
        request("r2", selectors=('device.attributes[device.driver].roots.includes("p2")',)),
        constraints=(model.DeviceConstraint(match_attribute=f"{GPU}/roots"),),
    )
    assert devices_of(oracle.find_allocation(s, [c], "node-0")) == [["r0=a", "r1=c", "r2=d"]]


def test_distinct_attribute_is_pairwise_even_within_one_request() -> None:
    """DESIGN (2): numa 0,1,0 with count 3 is refused; 0,1,2 is fine."""
    distinct = (model.DeviceConstraint(distinct_attribute=f"{GPU}/numa"),)
    bad = one_attribute("numa", d0=0, d1=1, d2=0)
    good = one_attribute("numa", d0=0, d1=1, d2=2)
    c = claim("c", request(count=3), constraints=distinct)
    assert oracle.find_allocation(bad, [c], "node-0") is None
    assert oracle.find_allocation(good, [c], "node-0") is not None


def test_distinct_list_attributes_must_be_disjoint() -> None:
    """distinctAttribute over lists: [p0,p1] and [p1] collide; [p0,p1] and [p2] do not."""
    s = one_attribute("roots", a=["p0", "p1"], b=["p1"], c=["p2"])
    c = claim("c", request(count=2), constraints=(model.DeviceConstraint(distinct_attribute=f"{GPU}/roots"),))
    assert devices_of(oracle.find_allocation(s, [c], "node-0")) == [["r0=a", "r0=c"]]


# --- All mode, firstAvailable, pools ----------------------------------------------------------------


def test_all_mode_takes_every_match_and_needs_them_free() -> None:
    """All takes both devices; with one held it fails unless admin, which takes both."""
    s = snap(rslice("s", devices.device("d0"), devices.device("d1")))
    assert devices_of(oracle.find_allocation(s, [claim("c", request(all_mode=True))], "node-0")) == [["r0=d0", "r0=d1"]]
    busy = snap(rslice("s", devices.device("d0"), devices.device("d1")), allocated=(held("h", result("d1")),))
    assert oracle.find_allocation(busy, [claim("c", request(all_mode=True))], "node-0") is None
    assert devices_of(oracle.find_allocation(busy, [claim("c", request(all_mode=True, admin=True))], "node-0")) == [
        ["r0=d0", "r0=d1"]
    ]


def test_all_mode_with_no_match_fails() -> None:
    """All over a class that matches nothing is not an empty success."""
    s = snap(rslice("s", devices.device("d0")))
    assert oracle.find_allocation(s, [claim("c", request(cls="nic", all_mode=True))], "node-0") is None


def test_all_mode_fails_on_a_node_with_an_incomplete_pool() -> None:
    """All cannot be satisfied while a pool on the node is incomplete; firstAvailable moves on."""
    s = snap(rslice("s", devices.device("d0")), rslice("t", devices.device("x"), pool="other", count=2))
    assert oracle.find_allocation(s, [claim("c", request(all_mode=True))], "node-0") is None
    all_first = claim("c", model.DeviceRequest(name="r0", first_available=(sub("s0", all_mode=True), sub("s1"))))
    assert devices_of(oracle.find_allocation(s, [all_first], "node-0")) == [["r0/s1=d0"]]
    nothing_else = claim(
        "c", model.DeviceRequest(name="r0", first_available=(sub("s0", cls="nic"), sub("s1", all_mode=True)))
    )
    assert oracle.find_allocation(s, [nothing_else], "node-0") is None
    forced = (model.AllocationResult(results=(result("d0", req="r0/s1"),)),)
    assert any("unusable pools" in v for v in oracle.check(s, [nothing_else], "node-0", forced))


def test_first_available_falls_back_to_the_next_subrequest() -> None:
    """The first subrequest needs a NIC that is not there, so results name r0/s1."""
    s = snap(rslice("s", devices.device("d0")))
    c = claim("c", model.DeviceRequest(name="r0", first_available=(sub("s0", cls="nic"), sub("s1", cls="gpu"))))
    assert devices_of(oracle.find_allocation(s, [c], "node-0")) == [["r0/s1=d0"]]
    mixed = (model.AllocationResult(results=(result("d0", req="r0/s0"),)),)
    assert oracle.check(s, [c], "node-0", mixed)


def test_incomplete_pools_are_never_used() -> None:
    """A pool missing one of its two slices offers no devices."""
    s = snap(rslice("s", devices.device("d0"), count=2))
    assert oracle.find_allocation(s, [claim("c")], "node-0") is None


def test_only_the_newest_generation_counts() -> None:
    """An older generation's slice is ignored; the newer one is used."""
    s = snap(rslice("old", devices.device("stale"), generation=1), rslice("new", devices.device("fresh"), generation=2))
    assert devices_of(oracle.find_allocation(s, [claim("c", request(all_mode=True))], "node-0")) == [["r0=fresh"]]


def test_newer_generation_elsewhere_makes_a_pool_obsolete() -> None:
    """A half-published newer generation on another node hides this node's old slice."""
    s = snap(
        rslice("old", devices.device("d0"), generation=1, count=2),
        rslice("new", devices.device("d1"), generation=2, count=2, node_name="node-1"),
    )
    assert oracle.find_allocation(s, [claim("c")], "node-0") is None


# --- Consumable capacity -------------------------------------------------------------------------------


def shared_dev(name: str, memory: str | model.DeviceCapacity) -> model.Device:
    return devices.device(name, multi=True, capacity={"memory": memory})


@pytest.mark.parametrize(
    ("memory", "requested", "consumed", "violation"),
    [
        pytest.param(devices.capacity("40Gi"), None, "40Gi", False, id="no-policy-no-request-takes-all"),
        pytest.param(devices.capacity("40Gi"), "10Gi", "10Gi", False, id="no-policy-request-as-is"),
        pytest.param(devices.capacity("40Gi", default="8Gi"), None, "8Gi", False, id="default"),
        pytest.param(
            devices.capacity("40Gi", default="8Gi", min="4Gi", step="4Gi"),
            "10Gi",
            "12Gi",
            False,
            id="range-step-rounds-up",
        ),
        pytest.param(devices.capacity("40Gi", default="8Gi", min="4Gi"), "1Gi", "4Gi", False, id="range-below-min"),
        pytest.param(
            devices.capacity("40Gi", default="8Gi", min="4Gi", max="32Gi"), "33Gi", "33Gi", True, id="range-over-max"
        ),
        pytest.param(
            devices.capacity("40Gi", default="8Gi", values=("8Gi", "16Gi")), "10Gi", "16Gi", False, id="values-round-up"
        ),
        pytest.param(
            devices.capacity("40Gi", default="8Gi", values=("8Gi", "16Gi")),
            "20Gi",
            "20Gi",
            True,
            id="values-none-big-enough",
        ),
    ],
)
def test_consumed_capacity_follows_the_request_policy(
    memory: model.DeviceCapacity, requested: str | None, consumed: str, violation: bool
) -> None:
    """Rounding and policy violations of one share of a 40Gi capacity (k8s-dra-core.md 3.7)."""
    amount, problem = oracle.consumed_amount(memory, None if requested is None else Q(requested))
    assert amount == Q(consumed).value
    assert bool(problem) is violation


def test_shared_device_serves_several_claims_until_capacity_runs_out() -> None:
    """Two 16Gi shares fit a 40Gi device, three do not; each result has a shareID and consumedCapacity."""
    s = snap(rslice("s", shared_dev("d0", "40Gi")))
    mem = {"memory": Q("16Gi")}
    two = [claim(n, request(capacity_requests=mem)) for n in ("a", "b")]
    found = oracle.find_allocation(s, two, "node-0")
    assert found is not None
    assert [a.results[0].consumed_capacity for a in found] == [mem, mem]
    assert all(a.results[0].share_id for a in found)
    three = [claim(n, request(capacity_requests=mem)) for n in ("a", "b", "c")]
    assert oracle.find_allocation(s, three, "node-0") is None


def test_existing_shares_reduce_free_capacity() -> None:
    """With 32Gi of 40Gi held by a share, a 16Gi request fails and an 8Gi one fits."""
    holder = held("h", result("d0", share_id="x", consumed_capacity={"memory": Q("32Gi")}))
    s = snap(rslice("s", shared_dev("d0", "40Gi")), allocated=(holder,))
    assert oracle.find_allocation(s, [claim("c", request(capacity_requests={"memory": Q("16Gi")}))], "node-0") is None
    assert (
        oracle.find_allocation(s, [claim("c", request(capacity_requests={"memory": Q("8Gi")}))], "node-0") is not None
    )


def test_dedicated_holder_blocks_sharing() -> None:
    """A result without shareID holds a shareable device exclusively."""
    s = snap(rslice("s", shared_dev("d0", "40Gi")), allocated=(held("h", result("d0")),))
    assert oracle.find_allocation(s, [claim("c", request(capacity_requests={"memory": Q("8Gi")}))], "node-0") is None


def test_capacity_request_filters_dedicated_devices() -> None:
    """On a dedicated device a capacity request is a filter: the key must exist and fit."""
    s = snap(
        rslice(
            "s",
            devices.device("small", capacity={"memory": "16Gi"}),
            devices.device("none"),
            devices.device("big", capacity={"memory": "80Gi"}),
        )
    )
    found = oracle.find_allocation(s, [claim("c", request(capacity_requests={"memory": Q("40Gi")}))], "node-0")
    assert devices_of(found) == [["r0=big"]]
    assert found is not None and found[0].results[0].share_id is None and not found[0].results[0].consumed_capacity


def test_same_shared_device_twice_breaks_distinct_attribute() -> None:
    """Two requests may share one shareable device, but not under distinctAttribute on it."""
    d = dataclasses.replace(shared_dev("d0", "40Gi"), attributes={"numa": devices.attr(0)})
    s = snap(rslice("s", d))
    mem = {"memory": Q("8Gi")}
    c = claim("c", request("r0", capacity_requests=mem), request("r1", capacity_requests=mem))
    assert devices_of(oracle.find_allocation(s, [c], "node-0")) == [["r0=d0", "r1=d0"]]
    distinct = claim(
        "c",
        request("r0", capacity_requests=mem),
        request("r1", capacity_requests=mem),
        constraints=(model.DeviceConstraint(distinct_attribute=f"{GPU}/numa"),),
    )
    assert oracle.find_allocation(s, [distinct], "node-0") is None


def test_shared_device_counters_are_charged_once() -> None:
    """Every share of a counter-consuming shareable device charges its counters only once."""
    d = dataclasses.replace(shared_dev("d0", "40Gi"), consumes_counters=(devices.consumes("cs", mem=5),))
    s = snap(
        rslice("a", pool="p", count=2, shared_counters=(devices.counter_set("cs", mem=8),)),
        rslice("b", d, pool="p", count=2),
    )
    mem = {"memory": Q("8Gi")}
    assert (
        oracle.find_allocation(s, [claim(n, request(capacity_requests=mem)) for n in ("a", "b", "c")], "node-0")
        is not None
    )


# --- Ledger ------------------------------------------------------------------------------------------------


def test_ledger_catches_double_allocation_and_overdraw() -> None:
    """`ledger_violations` flags a device held twice and a counter set overdrawn across claims."""
    s = mig_pool(allocated=(held("h", result("gpu-0-a")),))
    again = held("n", result("gpu-0-a"))
    assert any("already held" in v for v in oracle.ledger_violations(s, [again]))
    over = held("n", result("gpu-0"))
    assert any("counter mem consumed 12 of 8" in v for v in oracle.ledger_violations(s, [over]))
    assert oracle.ledger_violations(s, [held("n", result("gpu-0-b"))]) == []


def test_node_selectors_of_network_slices_are_united() -> None:
    """Devices from two selector slices give one term holding both requirements."""
    zone = model.NodeSelectorRequirement(key="zone", operator="In", values=("a",))
    tier = model.NodeSelectorRequirement(key="tier", operator="DoesNotExist")
    s = snap(
        rslice(
            "s",
            devices.device("d0"),
            pool="p1",
            node_selector=model.NodeSelector(terms=(model.NodeSelectorTerm(match_expressions=(zone,)),)),
        ),
        rslice(
            "t",
            devices.device("d1"),
            pool="p2",
            node_selector=model.NodeSelector(terms=(model.NodeSelectorTerm(match_expressions=(tier,)),)),
        ),
    )
    found = oracle.find_allocation(s, [claim("c", request(count=2))], "node-0")
    assert found is not None and found[0].node_selector is not None
    (term,) = found[0].node_selector.terms
    assert set(term.match_expressions) == {zone, tier} and not term.match_fields


def test_check_reports_wrong_share_fields() -> None:
    """A share without shareID, or with consumedCapacity that ignores the policy, is rejected."""
    s = snap(rslice("s", shared_dev("d0", devices.capacity("40Gi", default="8Gi", min="4Gi", step="4Gi"))))
    c = claim("c", request(capacity_requests={"memory": Q("10Gi")}))
    o = oracle.Oracle(s, "node-0")
    good = o.find([c])
    assert good is not None and good[0].results[0].consumed_capacity == {"memory": Q("12Gi")}
    unrounded = (
        dataclasses.replace(
            good[0], results=(dataclasses.replace(good[0].results[0], consumed_capacity={"memory": Q("10Gi")}),)
        ),
    )
    assert any("consumedCapacity" in v for v in o.check([c], unrounded))
    no_share = (dataclasses.replace(good[0], results=(dataclasses.replace(good[0].results[0], share_id=None),)),)
    assert any("shareID" in v for v in o.check([c], no_share))


def test_search_backtracks_across_claims() -> None:
    """The first claim's first choice starves the second; the search must move it."""
    s = one_attribute("numa", d0=0, d1=1)
    numa0 = ("device.attributes[device.driver].?numa.orValue(-1) == 0",)
    found = oracle.find_allocation(s, [claim("a"), claim("b", request(selectors=numa0))], "node-0")
    assert devices_of(found) == [["r0=d1"], ["r0=d0"]]


def test_ledger_catches_shared_capacity_overdraw() -> None:
    """Shares committed one by one may not sum to more than the device's capacity."""
    s = snap(rslice("s", shared_dev("d0", "40Gi")))
    shares = [held(n, result("d0", share_id=n, consumed_capacity={"memory": Q("24Gi")})) for n in ("a", "b")]
    assert any("capacity memory consumed" in v for v in oracle.ledger_violations(s, shares))
    assert oracle.ledger_violations(s, shares[:1]) == []
