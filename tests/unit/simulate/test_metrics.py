"""Placement-quality metrics on hand-built cluster states where the right numbers are known."""

from __future__ import annotations

import functools
import io
import json

import hypothesis
import pytest
import rich.console
from hypothesis import strategies as st
from support import devices

from dractl import model, simulate
from dractl.model import decode
from dractl.simulate import metrics

MI = 2**20
A100_MEMORY = 81152 * MI
A100_POOL = "dgx-a100-01"


@functools.cache
def _example(name: str) -> tuple[model.ResourceSlice, ...]:
    return decode.load_paths([simulate.EXAMPLES / name]).resource_slices


def a100() -> tuple[model.ResourceSlice, ...]:
    return _example("20-dgx-a100-01.yaml")


def claim(name: str, *device_names: str, pool: str = A100_POOL) -> model.ResourceClaim:
    """A claim allocated the named devices of one pool."""
    results = tuple(
        model.DeviceRequestAllocationResult(request=f"r{i}", driver="gpu.nvidia.com", pool=pool, device=d)
        for i, d in enumerate(device_names)
    )
    return model.ResourceClaim(
        meta=model.ObjectMeta(name=name, namespace="default"),
        spec=model.ResourceClaimSpec(),
        allocation=model.AllocationResult(results=results),
    )


def gpu0(claims: list[model.ResourceClaim], shapes: tuple[metrics.RequestShape, ...] = ()) -> metrics.Gpu:
    found = metrics.measure(a100(), claims, shapes=shapes).gpus
    return next(g for g in found if g.device == "gpu-0")


def test_free_a100_offers_the_whole_gpu_as_its_largest_mig_profile() -> None:
    """A free A100 has 8 memory slices, 18 MIG placements and 7g.80gb at 0 as its largest placeable profile."""
    gpu = gpu0([])
    assert (gpu.state, gpu.slices, len(gpu.placements)) == (metrics.State.FREE, 8, 18)
    assert gpu.largest is not None and (gpu.largest.profile, gpu.largest.start) == ("7g.80gb", 0)
    assert gpu.uuid.startswith("GPU-") and gpu.memory == A100_MEMORY


def test_mig_placements_are_read_from_the_memory_slices_they_consume() -> None:
    """A 3g.40gb at start 4 covers memory slices 4..7; a 1g.10gb at 6 covers slice 6 alone."""
    by_device = {p.device: p for p in gpu0([]).placements}
    assert (by_device["gpu-0-mig-3g40gb-9-4"].start, by_device["gpu-0-mig-3g40gb-9-4"].size) == (4, 4)
    assert (by_device["gpu-0-mig-1g10gb-19-6"].start, by_device["gpu-0-mig-1g10gb-19-6"].size) == (6, 1)
    assert by_device["gpu-0-mig-1g10gb-19-6"].profile == "1g.10gb"


def test_largest_placeable_after_a_3g_at_4() -> None:
    """With a 3g.40gb at 4 held, 4g.40gb at 0 (the counters allow 4g+3g) and 3g.40gb at 0 stay placeable, 7g not."""
    gpu = gpu0([claim("c", "gpu-0-mig-3g40gb-9-4")])
    placeable = {p.device for p in gpu.placements if p.placeable}
    assert {"gpu-0-mig-3g40gb-9-0", "gpu-0-mig-4g40gb-5-0"} <= placeable
    assert "gpu-0-mig-7g80gb-0-0" not in placeable and "gpu-0-mig-3g40gb-9-4" not in placeable
    assert gpu.largest is not None and (gpu.largest.profile, gpu.largest.start) == ("4g.40gb", 0)
    assert gpu.state is metrics.State.PARTITIONED and gpu.allocated_memory == 40192 * MI


def test_largest_placeable_after_two_1g_slices_in_the_first_half() -> None:
    """With 1g.10gb at 0 and at 3 held, 3g.40gb at 4 is the largest placeable profile and 4g.40gb is not placeable."""
    gpu = gpu0([claim("a", "gpu-0-mig-1g10gb-19-0"), claim("b", "gpu-0-mig-1g10gb-19-3")])
    assert gpu.largest is not None and (gpu.largest.profile, gpu.largest.start) == ("3g.40gb", 4)
    placeable = {p.device for p in gpu.placements if p.placeable}
    assert "gpu-0-mig-4g40gb-5-0" not in placeable and "gpu-0-mig-3g40gb-9-0" not in placeable


def test_full_gpu_leaves_no_mig_profile_placeable() -> None:
    """A GPU whose full-GPU device is allocated is full: all its memory allocated, no MIG device placeable."""
    gpu = gpu0([claim("whole", "gpu-0")])
    assert (gpu.state, gpu.allocated_memory, gpu.largest, gpu.holders) == (
        metrics.State.FULL,
        A100_MEMORY,
        None,
        ("default/whole",),
    )


def test_partitioned_and_full_gpus_are_counted_apart() -> None:
    """One full GPU, one with two MIG devices, six free; memory sums the full GPU and the two MIG devices."""
    claims = [claim("whole", "gpu-0"), claim("pair", "gpu-1-mig-1g10gb-19-0", "gpu-1-mig-1g10gb-19-1")]
    result = metrics.measure(a100(), claims, label="first-fit")
    (node,) = result.nodes
    assert (node.node, node.gpus, node.full, node.partitioned, node.free) == (A100_POOL, 8, 1, 1, 6)
    assert node.memory_allocated == A100_MEMORY + 2 * 9728 * MI
    assert node.memory == 8 * A100_MEMORY
    assert result.cluster.node == metrics.CLUSTER and result.cluster.full == 1
    assert dict(node.largest) == {"7g.80gb": 6, "3g.40gb": 1, "none": 1}


@pytest.mark.parametrize(
    ("shapes", "stranded"),
    [
        pytest.param((), 40960 * MI, id="no-pending-shape-strands-all-free-memory"),
        pytest.param(("mig:7g.80gb",), 40960 * MI, id="7g-cannot-fit"),
        pytest.param(("gpu",), 40960 * MI, id="full-gpu-cannot-use-a-partitioned-gpu"),
        pytest.param(("mig:3g.40gb",), 0, id="3g-at-4-uses-every-free-slice"),
        pytest.param(("mig:2g.20gb",), 20480 * MI, id="2g-at-4-uses-half-the-free-slices"),
        pytest.param(("mig:2g.20gb", "mig:1g.20gb"), 0, id="2g-at-4-and-1g20-at-6-cover-the-rest"),
        pytest.param(("mig@30Gi",), 0, id="a-memory-floor-any-profile"),
        pytest.param(("mig@50Gi",), 40960 * MI, id="a-memory-floor-nothing-fits"),
    ],
)
def test_stranded_memory_after_a_4g_at_0(shapes: tuple[str, ...], stranded: int) -> None:
    """Free memory beside a 4g.40gb at 0 is stranded exactly where no placeable device of a pending shape covers it."""
    wanted = tuple(metrics.parse_shape(s) for s in shapes)
    result = metrics.measure(a100(), [claim("big", "gpu-0-mig-4g40gb-5-0")], shapes=wanted)
    gpu = next(g for g in result.gpus if g.device == "gpu-0")
    assert gpu.free_memory == 40960 * MI
    assert gpu.stranded == stranded
    assert result.cluster.memory_stranded == stranded


def test_free_and_full_gpus_strand_nothing() -> None:
    """Stranded memory counts only partly used GPUs: free and fully allocated GPUs strand nothing."""
    result = metrics.measure(a100(), [claim("whole", "gpu-0")], shapes=(metrics.parse_shape("mig:7g.80gb"),))
    assert result.cluster.memory_stranded == 0


def test_gpus_without_mig_are_full_or_free() -> None:
    """On the H100 and T4 nodes a GPU is full or free, and has no MIG fragmentation entry."""
    slices = _example("21-dgx-h100-01.yaml") + _example("22-t4-node-01.yaml")
    result = metrics.measure(slices, [claim("t4", "gpu-1", pool="t4-node-01")])
    by_node = {n.node: n for n in result.nodes}
    assert (by_node["t4-node-01"].full, by_node["t4-node-01"].free, by_node["t4-node-01"].largest) == (1, 1, ())
    assert (by_node["dgx-h100-01"].gpus, by_node["dgx-h100-01"].free) == (8, 8)
    h100 = next(g for g in result.gpus if g.node == "dgx-h100-01" and g.device == "gpu-2")
    assert h100.attributes["partition4"] == "1" and h100.attributes["partition2"] == "4"


def test_mig_device_without_parent_uuid_belongs_to_the_gpu_of_its_counter_set() -> None:
    """A MIG device with no parentUUID is matched to its GPU through the counter set both consume."""
    stripped = []
    for s in a100():
        stripped_devices = tuple(
            model.Device(
                name=d.name,
                capacity=d.capacity,
                consumes_counters=d.consumes_counters,
                attributes={k: v for k, v in d.attributes.items() if k != "parentUUID"},
            )
            for d in s.devices
        )
        stripped.append(
            model.ResourceSlice(
                meta=s.meta,
                driver=s.driver,
                pool=s.pool,
                node_name=s.node_name,
                devices=stripped_devices,
                shared_counters=s.shared_counters,
            )
        )
    gpus = metrics.measure(stripped, []).gpus
    assert [len(g.placements) for g in gpus] == [18] * 8


def _static_mig_device(name: str, profile: str, memory: str, slices: range) -> model.Device:
    return devices.device(
        name,
        attributes={"type": "mig", "profile": profile, "parentUUID": "GPU-static"},
        capacity={"memory": memory} | {f"memorySlice{i}": "1" for i in slices},
    )


def test_static_mig_devices_form_their_gpu() -> None:
    """Static MIG devices without a published full GPU are one GPU, placed by their memorySlice capacities."""
    static = devices.rslice(
        _static_mig_device("gpu-0-mig-1g10gb-19-0", "1g.10gb", "9728Mi", range(1)),
        _static_mig_device("gpu-0-mig-3g40gb-9-4", "3g.40gb", "40192Mi", range(4, 8)),
        name="s",
        node="n1",
        driver="gpu.nvidia.com",
        generation=0,
    )
    (gpu,) = metrics.measure([static], [claim("small", "gpu-0-mig-1g10gb-19-0", pool="n1")]).gpus
    assert (gpu.device, gpu.uuid, gpu.state, gpu.slices) == ("gpu-0", "GPU-static", metrics.State.PARTITIONED, 8)
    assert [(p.start, p.size) for p in gpu.placements] == [(0, 1), (4, 4)]
    assert gpu.memory == (9728 + 40192) * MI and gpu.allocated_memory == 9728 * MI
    assert gpu.largest is not None and gpu.largest.profile == "3g.40gb"


def test_device_memory_sums_to_what_measure_reports() -> None:
    """The replay's per-device memory table gives the same allocated memory as measuring the cluster."""
    claims = [claim("whole", "gpu-0"), claim("pair", "gpu-1-mig-1g10gb-19-0", "gpu-1-mig-3g40gb-9-4")]
    table = metrics.device_memory(a100())
    held = sum(table[(r.driver, r.pool, r.device)] for c in claims if c.allocation for r in c.allocation.results)
    assert held == metrics.measure(a100(), claims).cluster.memory_allocated == A100_MEMORY + (9728 + 40192) * MI
    assert len(table) == 8 * 19


def test_series_accumulates_admissions_rejections_and_time_weighted_utilisation() -> None:
    """Admitted before the first rejection, rejections, and utilisation weighted by how long each level held."""
    series = metrics.Series()
    series.sample(0.0, used=1, total=2)
    series.admitted(1.0, count=3)
    series.rejected(2.0)
    series.admitted(5.0, count=2)
    series.sample(10.0, used=2, total=2)
    series.rejected(12.0)
    series.sample(20.0, used=0, total=2)
    result = series.result()
    assert (result.admitted_before_first_rejection, result.admitted, result.rejections) == (3, 5, 2)
    assert result.utilisation == pytest.approx(0.75)
    assert result.points == ((0.0, 0.5), (10.0, 1.0), (20.0, 0.0))


def test_series_without_rejection_counts_every_admission_before_it() -> None:
    """With no rejection, "admitted before the first rejection" is every admitted claim."""
    series = metrics.Series()
    series.admitted(0.0, count=4)
    assert series.result().admitted_before_first_rejection == 4


def test_series_refuses_time_going_backwards() -> None:
    """An event earlier than the previous one is refused with both times named."""
    series = metrics.Series()
    series.admitted(5.0)
    with pytest.raises(ValueError, match=r"event at 4.0s comes after one at 5.0s"):
        series.rejected(4.0)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("tpu", "kind must be gpu or mig", id="unknown-kind"),
        pytest.param("gpu:1g.10gb", "only a mig shape names a profile", id="profile-on-gpu"),
        pytest.param("mig@lots", "memory 'lots' is not a quantity", id="bad-memory"),
    ],
)
def test_bad_request_shapes_get_one_message(text: str, message: str) -> None:
    """A malformed request shape names itself and what is wrong."""
    with pytest.raises(ValueError, match=message):
        metrics.parse_shape(text)


def test_shape_spelling_round_trips() -> None:
    """A parsed shape prints as it is spelled."""
    for text in ("gpu", "mig:1g.10gb", "gpu@40Gi", "mig:3g.40gb@20Gi"):
        assert str(metrics.parse_shape(text)) == text


def _render(renderable: object) -> str:
    console = rich.console.Console(file=io.StringIO(), width=160, color_system=None)
    console.print(renderable)
    assert isinstance(console.file, io.StringIO)
    return console.file.getvalue()


def _cells(text: str, row: str) -> list[str]:
    line = next(line for line in text.splitlines() if row in line)
    return [cell for cell in line.split() if cell not in ("│", "┃")]


def test_compare_table_shows_metric_sets_side_by_side() -> None:
    """Two metric sets render as two columns headed by their labels; time rows show `-` where a set lacks them."""
    series = metrics.Series()
    series.admitted(0.0, count=7)
    left = metrics.measure(a100(), [claim("whole", "gpu-0")], label="first-fit", time=series.result())
    right = metrics.measure(a100(), [claim("slice", "gpu-0-mig-1g10gb-19-0")], label="binpack")
    text = _render(metrics.compare_table([left, right]))
    assert "first-fit" in text and "binpack" in text
    assert _cells(text, "GPUs full")[-2:] == ["1", "0"]
    assert _cells(text, "admitted before first rejection")[-2:] == ["7", "-"]


def test_node_table_and_dict_carry_the_same_numbers() -> None:
    """The per-node table and the JSON-able dict report the same counts, and the dict survives json.dumps."""
    result = metrics.measure(a100(), [claim("whole", "gpu-0")], label="binpack")
    text = _render(metrics.node_table(result))
    assert A100_POOL in text and metrics.CLUSTER in text
    data = json.loads(json.dumps(metrics.as_dict(result)))
    assert data["cluster"]["gpus"] == {"total": 8, "full": 1, "partitioned": 0, "free": 7}
    assert data["gpus"][0]["holders"] == ["default/whole"]


def test_compare_table_needs_a_metric_set() -> None:
    """Comparing nothing is refused with a message rather than an empty table."""
    with pytest.raises(ValueError, match="at least one metric set"):
        metrics.compare_table([])


@hypothesis.settings(max_examples=40, deadline=None)
@hypothesis.given(
    picks=st.lists(st.integers(min_value=0, max_value=17), max_size=10),
    shapes=st.lists(
        st.sampled_from(["gpu", "mig:1g.10gb", "mig:2g.20gb", "mig:3g.40gb", "mig:7g.80gb", "mig@20Gi"]), max_size=3
    ),
)
def test_layouts_built_from_placeable_devices_keep_the_invariants(picks: list[int], shapes: list[str]) -> None:
    """Allocating only what metrics call placeable never overlaps memory slices, and the sums stay within bounds."""
    names = [p.device for p in gpu0([]).placements]
    claims: list[model.ResourceClaim] = []
    for i, pick in enumerate(picks):
        if next(p for p in gpu0(claims).placements if p.device == names[pick]).placeable:
            claims.append(claim(f"c{i}", names[pick]))
    gpu = gpu0(claims, tuple(metrics.parse_shape(s) for s in shapes))
    covered = [i for p in gpu.placements if p.holders for i in range(p.start, p.start + p.size)]
    assert len(covered) == len(set(covered)) == sum(p.size for p in gpu.placements if p.holders)
    assert gpu.allocated_memory <= gpu.memory and 0 <= gpu.stranded <= gpu.free_memory
    assert gpu.state is (metrics.State.PARTITIONED if claims else metrics.State.FREE)
    if gpu.largest is not None:
        assert gpu.largest.placeable and not set(range(gpu.largest.start, gpu.largest.start + gpu.largest.size)) & set(
            covered
        )
    whole = metrics.measure(a100(), claims).cluster
    assert whole.full + whole.partitioned + whole.free == whole.gpus == 8
