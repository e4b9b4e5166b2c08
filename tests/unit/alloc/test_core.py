"""The Cython core on its own: tables handed in directly, without the allocator around it."""

from __future__ import annotations

import array
import gc
import tracemalloc

import pytest

from dractl import _alloc


def _core(*, policy: int) -> _alloc.Core:
    """One node seeing two plain devices: no counters, no capacity, no groups."""

    def ints(*values: int) -> array.array[int]:
        return array.array("i", values)

    def longs(*values: int) -> array.array[int]:
        return array.array("q", values)

    return _alloc.Core(
        node_off=ints(0, 2),
        node_dev=ints(0, 1),
        node_bad=bytes(1),
        cons_off=ints(0, 0, 0),
        cons_id=ints(),
        cons_amt=longs(),
        chk_off=ints(0, 0, 0),
        chk_id=ints(),
        cnt_avail=longs(),
        cnt_total=longs(),
        cnt_set=ints(),
        set_off=ints(0),
        set_dev=ints(),
        in_use=bytes(2),
        multi=bytes(2),
        shares=ints(0, 0),
        slot_value=longs(),
        slot_used=longs(),
        dev_group=ints(-1, -1),
        n_groups=0,
        max_results=32,
        policy=policy,
    )


@pytest.mark.parametrize("policy", [_alloc.POLICY_FIRST_FIT, _alloc.POLICY_BINPACK], ids=["first-fit", "binpack"])
def test_a_refused_shape_leaves_no_memory_behind(policy: int) -> None:
    """Guards: `add_shape` refused part-way (a table of the wrong item size) frees what it had copied."""
    core = _core(policy=policy)
    wide = array.array("i", [1, 1])  # one int32 per device where one byte per device is expected

    def refused() -> bool:
        try:
            core.add_shape(bytes([1, 1]), wide)
        except ValueError as error:
            return "malformed plan" in str(error)
        return False

    assert all(refused() for _ in range(10))  # warms up the interpreter's own caches
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        assert all(refused() for _ in range(2000))
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # Each leaked candidate table is 3 bytes (two devices and the spare): 6,000 for the 2,000 refusals.
    assert grown < 2000


@pytest.mark.parametrize("policy", [_alloc.POLICY_FIRST_FIT, _alloc.POLICY_BINPACK], ids=["first-fit", "binpack"])
def test_a_registered_shape_is_searched_under_either_policy(policy: int) -> None:
    """Guards: a shape registered after a refused one is whole: a one-device request finds the first free device."""
    core = _core(policy=policy)
    with pytest.raises(ValueError, match="malformed plan"):
        core.add_shape(bytes([1, 1]), array.array("i", [1, 1]))
    shape = core.add_shape(bytes([1, 1]), bytes([1, 1]))
    core.set_demand(shape, 2, -1)
    core.add_held(shape, 1.0)
    # One claim, one request, one ExactCount alternative of one device, no constraints.
    plan = array.array("i", [1, 1, 1, 0, 0, 0, 1, 0, 1, shape, _alloc.MODE_EXACT, 1, 0, 0, 0])
    status, node, alts, devices, requests, stats = core.search(plan, None, limit=1000, commit=True)
    assert (status, node, alts, devices, requests, stats) == (_alloc.OK, 0, [0], [0], [0], [])
    assert core.usage()[0] == bytes([1, 0])
