"""The fake GPU backend: built-in profiles, the profile file format, stable UUIDs, faults, events, persistence."""

from __future__ import annotations

import json
import pathlib
import threading
import time
from typing import Any

import pytest
import yaml

from dractl.node import backend, fakegpu, inventory


def _fake(name: str = "a100-80gb-x8", node: str = "node-a", state_file: pathlib.Path | None = None) -> fakegpu.FakeGpus:
    return fakegpu.FakeGpus(fakegpu.load_profile(name), node_name=node, state_file=state_file)


def test_builtin_profiles_are_listed() -> None:
    """Guards the profiles the brief promises ship with dractl."""
    assert {"a100-80gb-x8", "h100-80gb-x8", "t4-x2", "l4-x4", "a100-mig-mixed"} <= set(fakegpu.builtin_profiles())


@pytest.mark.parametrize("name", fakegpu.builtin_profiles())
def test_every_builtin_profile_loads(name: str) -> None:
    """Guards that every shipped profile file is valid and makes a backend with GPUs."""
    fake = _fake(name)
    assert fake.gpus()
    assert inventory.read(fake).gpus


def test_a100_placements_are_nvmls() -> None:
    """Guards the A100-80GB GPU-instance profiles and placements NVML reports."""
    profiles = {p.name: p for p in _fake().gpu_instance_profiles(0)}
    got = {
        name: (p.id, [pl.start for pl in p.placements], {pl.size for pl in p.placements})
        for name, p in profiles.items()
    }
    assert got == {
        "1g.10gb": (19, [0, 1, 2, 3, 4, 5, 6], {1}),
        "1g.20gb": (15, [0, 2, 4, 6], {2}),
        "2g.20gb": (14, [0, 2, 4], {2}),
        "3g.40gb": (9, [0, 4], {4}),
        "4g.40gb": (5, [0], {4}),
        "7g.80gb": (0, [0], {8}),
    }


def test_h100_has_the_same_placement_grid() -> None:
    """Guards the H100 profile set: same names and placements as A100-80GB, Hopper figures."""
    h100 = {p.name: [pl.start for pl in p.placements] for p in _fake("h100-80gb-x8").gpu_instance_profiles(0)}
    a100 = {p.name: [pl.start for pl in p.placements] for p in _fake().gpu_instance_profiles(0)}
    assert h100 == a100


def test_uuids_are_stable_per_node_and_differ_between_nodes() -> None:
    """Guards UUIDv5 identity: same node -> same UUIDs, another node -> other UUIDs."""
    a, again, b = _fake(node="node-a"), _fake(node="node-a"), _fake(node="node-b")
    assert [g.uuid for g in a.gpus()] == [g.uuid for g in again.gpus()]
    assert not {g.uuid for g in a.gpus()} & {g.uuid for g in b.gpus()}
    assert a.gpus()[3].uuid == fakegpu.gpu_uuid("node-a", 3)


def test_mig_uuids_are_stable_across_instances() -> None:
    """Guards deterministic MIG UUIDs: the same sequence of creations gives the same devices."""
    made = []
    for _ in range(2):
        fake = _fake()
        fake.set_mig_mode(2, backend.MigMode.ENABLED)
        gi = fake.create_gpu_instance(2, profile_id=9, placement=backend.Placement(4, 4))
        made.append(fake.create_compute_instance(2, gi_id=gi.gi_id))
    assert made[0] == made[1]


def test_mixed_profile_starts_partitioned() -> None:
    """Guards a100-mig-mixed: MIG devices exist from the start on GPUs 0-2, GPU 3 is whole."""
    fake = _fake("a100-mig-mixed")
    layout = {g.minor: [(d.profile_name, d.placement.start) for d in fake.mig_devices(g.minor)] for g in fake.gpus()}
    assert layout[0] == [("3g.40gb", 0), ("2g.20gb", 4), ("1g.10gb", 6)]
    assert layout[1] == [("1g.10gb", s) for s in range(7)]
    assert layout[2] == [("3g.40gb", 0), ("3g.40gb", 4)]
    assert layout[3] == [] and fake.gpus()[3].mig_mode is backend.MigMode.DISABLED


def test_injected_fault_fails_the_next_call_only() -> None:
    """Guards fault injection: the chosen operation fails with the given NVML code, once, then works."""
    fake = _fake()
    fake.set_mig_mode(0, backend.MigMode.ENABLED)
    fake.fail("create_gpu_instance", backend.Return.INSUFFICIENT_RESOURCES, minor=0)
    with pytest.raises(backend.NvmlError) as caught:
        fake.create_gpu_instance(0, profile_id=19, placement=backend.Placement(0, 1))
    assert caught.value.code == backend.Return.INSUFFICIENT_RESOURCES
    assert fake.gpu_instances(0) == ()
    assert fake.create_gpu_instance(0, profile_id=19, placement=backend.Placement(0, 1)).gi_id == 1


def test_fault_on_unknown_operation_is_refused() -> None:
    """Guards that a misspelt operation name in a test fails loudly instead of never firing."""
    with pytest.raises(ValueError, match="unknown operation 'create_gi'"):
        _fake().fail("create_gi", backend.Return.UNKNOWN)


def test_lost_gpu_fails_calls_and_reports_an_event() -> None:
    """Guards mark_lost: GPU_IS_LOST on the GPU's calls, one GPU_LOST event, inventory keeps it as lost."""
    fake = _fake("a100-mig-mixed")
    fake.mark_lost(1)
    with pytest.raises(backend.NvmlError) as caught:
        fake.mig_devices(1)
    assert caught.value.code == backend.Return.GPU_IS_LOST
    events = fake.wait_events(timeout_s=1.0)
    assert [(e.kind, e.minor) for e in events] == [(backend.EventKind.GPU_LOST, 1)]
    inv = inventory.read(fake)
    assert [g.lost for g in inv.gpus] == [False, True, False, False]


def test_xid_event_wakes_a_waiting_thread() -> None:
    """Guards that wait_events returns as soon as an event arrives from another thread (bounded wait)."""
    fake = _fake()
    received: list[tuple[backend.Event, ...]] = []
    waiter = threading.Thread(target=lambda: received.append(fake.wait_events(timeout_s=30.0)))
    waiter.start()
    deadline = time.monotonic() + 10.0
    while waiter.is_alive() and time.monotonic() < deadline:
        fake.inject_xid(5, 79)
        waiter.join(timeout=0.05)
    assert not waiter.is_alive()
    assert received and received[0][0].kind is backend.EventKind.XID
    assert (received[0][0].minor, received[0][0].xid) == (5, 79)


def test_close_wakes_event_waiters() -> None:
    """Guards prompt shutdown: close() ends a blocked wait_events with no events."""
    fake = _fake()
    received: list[tuple[backend.Event, ...]] = []
    waiter = threading.Thread(target=lambda: received.append(fake.wait_events(timeout_s=30.0)))
    waiter.start()
    deadline = time.monotonic() + 10.0
    while waiter.is_alive() and time.monotonic() < deadline:
        fake.close()
        waiter.join(timeout=0.05)
    assert not waiter.is_alive() and received == [()]


def test_state_file_survives_a_restart(tmp_path: pathlib.Path) -> None:
    """Guards persistence: a new fake on the same state file sees the MIG devices and modes made before."""
    state = tmp_path / "fake-gpus.json"
    first = _fake(state_file=state)
    first.set_mig_mode(1, backend.MigMode.ENABLED)
    gi = first.create_gpu_instance(1, profile_id=14, placement=backend.Placement(2, 2))
    device = first.create_compute_instance(1, gi_id=gi.gi_id)
    first.set_compute_mode(4, backend.ComputeMode.EXCLUSIVE_PROCESS)
    first.set_time_slice(4, backend.TimeSlice.LONG)
    restarted = _fake(state_file=state)
    assert restarted.mig_devices(1) == (device,)
    assert restarted.gpus()[1].mig_mode is backend.MigMode.ENABLED
    assert restarted.compute_mode(4) is backend.ComputeMode.EXCLUSIVE_PROCESS
    assert restarted.time_slice(4) is backend.TimeSlice.LONG
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        pytest.param("{not json", "cannot read", id="corrupt"),
        pytest.param(
            json.dumps({"version": 1, "node": "other", "profile": "a100-80gb-x8", "gpus": {}}),
            "node 'other'",
            id="other-node",
        ),
        pytest.param(
            json.dumps(
                {"version": 1, "node": "node-a", "profile": "a100-80gb-x8", "gpus": {"0": {"migMode": "enabled"}}}
            ),
            "does not match profile",
            id="missing-keys",
        ),
    ],
)
def test_bad_state_file_is_one_clear_error(tmp_path: pathlib.Path, content: str, problem: str) -> None:
    """Guards that a corrupt or foreign state file is a StateFileError naming the file, not a crash."""
    state = tmp_path / "fake-gpus.json"
    state.write_text(content)
    with pytest.raises(fakegpu.StateFileError) as caught:
        _fake(state_file=state)
    assert str(state) in str(caught.value) and problem in str(caught.value)


GOOD: dict[str, Any] = {
    "driverVersion": "580.126.20",
    "cudaDriverVersion": "13.0",
    "gpus": [{"model": "a100-sxm4-80gb", "pciBusID": "0000:07:00.0"}],
}


def _with(path: str, value: object) -> dict[str, Any]:
    """GOOD with one field replaced; path like "gpus.0.pciBusID"."""
    document = json.loads(json.dumps(GOOD))
    target: Any = document
    *parents, last = path.split(".")
    for part in parents:
        target = target[int(part)] if isinstance(target, list) else target[part]
    if isinstance(target, list):
        target[int(last)] = value
    else:
        target[last] = value
    return document


def test_custom_profile_file_loads(tmp_path: pathlib.Path) -> None:
    """Guards the documented custom profile format, including an inline model and fabric info."""
    document = {
        **GOOD,
        "models": {
            "tiny": {
                "productName": "Tiny GPU",
                "architecture": "Ampere",
                "cudaComputeCapability": "8.6",
                "memory": "8Gi",
                "multiprocessors": 10,
            }
        },
        "gpus": [
            {
                "model": "tiny",
                "pciBusID": "0000:0A:00.0",
                "numaNode": 1,
                "minor": 3,
                "fabric": {"cliqueID": 2, "moduleID": 1, "partitions": {"2": 0, "1": 3}},
            },
            {
                "model": "a100-sxm4-80gb",
                "pciBusID": "0000:0b:00.0",
                "migMode": "enabled",
                "migDevices": [{"profile": "7g.80gb", "start": 0}],
            },
        ],
    }
    path = tmp_path / "lab.yaml"
    path.write_text(yaml.safe_dump(document))
    fake = fakegpu.FakeGpus(fakegpu.load_profile(str(path)), node_name="lab")
    tiny, a100 = fake.gpus()[1], fake.gpus()[0]
    assert (tiny.minor, tiny.name, tiny.pci_bus_id, tiny.numa_node) == (3, "Tiny GPU", "0000:0a:00.0", 1)
    assert tiny.fabric == backend.FabricInfo(clique_id=2, module_id=1, partitions=((2, 0), (1, 3)))
    assert [d.profile_name for d in fake.mig_devices(a100.minor)] == ["7g.80gb"]


@pytest.mark.parametrize(
    ("document", "field", "problem"),
    [
        pytest.param(_with("driverVersion", None), "driverVersion", "required", id="no-driver"),
        pytest.param(_with("cudaDriverVersion", 13.0), "cudaDriverVersion", "non-empty string", id="cuda-number"),
        pytest.param(_with("gpus", []), "gpus", "at least one GPU", id="no-gpus"),
        pytest.param(_with("gpus.0.model", "b200"), "gpus[0].model", "unknown model 'b200'", id="unknown-model"),
        pytest.param(_with("gpus.0.pciBusID", "7:0.0"), "gpus[0].pciBusID", "not a PCI address", id="bad-bus"),
        pytest.param(_with("gpus.0.migMode", "on"), "gpus[0].migMode", "enabled or disabled", id="bad-mig-mode"),
        pytest.param(_with("gpus.0.colour", "red"), "gpus[0].colour", "unknown field", id="unknown-field"),
        pytest.param(
            _with(
                "gpus.0",
                {
                    "model": "a100-sxm4-80gb",
                    "pciBusID": "0000:07:00.0",
                    "migMode": "enabled",
                    "migDevices": [{"profile": "1g.10gb", "start": 7}],
                },
            ),
            "gpus[0].migDevices[0].start",
            "cannot start at slice 7",
            id="bad-placement",
        ),
        pytest.param(
            _with(
                "gpus.0",
                {
                    "model": "a100-sxm4-80gb",
                    "pciBusID": "0000:07:00.0",
                    "migMode": "enabled",
                    "migDevices": [{"profile": "4g.40gb", "start": 0}, {"profile": "3g.40gb", "start": 0}],
                },
            ),
            "gpus[0].migDevices[1]",
            "overlaps",
            id="overlap",
        ),
        pytest.param(
            _with(
                "gpus.0",
                {
                    "model": "a100-sxm4-80gb",
                    "pciBusID": "0000:07:00.0",
                    "migDevices": [{"profile": "7g.80gb", "start": 0}],
                },
            ),
            "gpus[0].migDevices",
            "need migMode: enabled",
            id="mig-off",
        ),
        pytest.param(
            _with("gpus.0", {"model": "tesla-t4", "pciBusID": "0000:07:00.0", "migMode": "enabled"}),
            "gpus[0].migMode",
            "cannot enable MIG",
            id="t4-mig",
        ),
        pytest.param({**GOOD, "gpus": GOOD["gpus"] * 2}, "gpus[1].pciBusID", "repeats gpus[0]", id="same-gpu-twice"),
        pytest.param(
            {
                **GOOD,
                "models": {
                    "x": {
                        "productName": "X",
                        "architecture": "Ampere",
                        "cudaComputeCapability": "8.0",
                        "memory": "lots",
                        "multiprocessors": 1,
                    }
                },
            },
            "models.x.memory",
            "not a quantity",
            id="bad-memory",
        ),
        pytest.param(["not", "a", "mapping"], "(top level)", "must be a mapping", id="list"),
        pytest.param(_with("faults", {"operation": "gpus"}), "faults", "must be a list", id="faults-not-list"),
        pytest.param(
            _with("faults", [{"operation": "create_gi", "action": "hang"}]),
            "faults[0].operation",
            "unknown operation 'create_gi' (known: compute_instances, ",
            id="fault-unknown-operation",
        ),
        pytest.param(_with("faults", [{"action": "hang"}]), "faults[0].operation", "required", id="fault-no-operation"),
        pytest.param(
            _with("faults", [{"operation": "gpus", "action": "crash"}]),
            "faults[0].action",
            "must be fail or hang, got 'crash'",
            id="fault-bad-action",
        ),
        pytest.param(
            _with("faults", [{"operation": "gpus", "action": "hang", "code": "TIMEOUT"}]),
            "faults[0].code",
            "only for action: fail",
            id="fault-hang-with-code",
        ),
        pytest.param(
            _with("faults", [{"operation": "gpus"}]), "faults[0].code", "required", id="fault-fail-without-code"
        ),
        pytest.param(
            _with("faults", [{"operation": "gpus", "code": "OUT_OF_CHEESE"}]),
            "faults[0].code",
            "'OUT_OF_CHEESE' is not an NVML error code name",
            id="fault-bad-code",
        ),
        pytest.param(
            _with("faults", [{"operation": "gpus", "code": "SUCCESS"}]),
            "faults[0].code",
            "not an NVML error code name",
            id="fault-success-code",
        ),
        pytest.param(
            _with("faults", [{"operation": "gpus", "code": "TIMEOUT", "minor": 0}]),
            "faults[0].minor",
            "would never fire",
            id="fault-minor-on-gpus",
        ),
        pytest.param(
            _with("faults", [{"operation": "set_mig_mode", "code": "TIMEOUT", "minor": 5}]),
            "faults[0].minor",
            "no GPU in this profile has minor 5 (minors: 0)",
            id="fault-unknown-minor",
        ),
        pytest.param(
            _with("faults", [{"operation": "gpus", "code": "TIMEOUT", "times": 0}]),
            "faults[0].times",
            "must be >= 1",
            id="fault-zero-times",
        ),
        pytest.param(
            _with("faults", [{"operation": "gpus", "code": "TIMEOUT", "when": "later"}]),
            "faults[0].when",
            "unknown field",
            id="fault-unknown-field",
        ),
    ],
)
def test_bad_profile_names_file_and_field(tmp_path: pathlib.Path, document: object, field: str, problem: str) -> None:
    """Guards the profile validation: one ProfileError naming the file, the field and the problem."""
    path = tmp_path / "custom.yaml"
    path.write_text(yaml.safe_dump(document))
    with pytest.raises(fakegpu.ProfileError) as caught:
        fakegpu.load_profile(str(path))
    message = str(caught.value)
    assert message.startswith(f"{path}: {field}: "), message
    assert problem in message


def test_unknown_profile_lists_the_builtins() -> None:
    """Guards the message for a profile that is neither built in nor a file."""
    with pytest.raises(
        fakegpu.ProfileError, match=r"'b200-x8': neither a built-in profile \(a100-80gb-x8, .*\) nor a readable file"
    ):
        fakegpu.load_profile("b200-x8")


def test_invalid_yaml_names_the_file(tmp_path: pathlib.Path) -> None:
    """Guards a YAML syntax error in a profile file: one line naming the file."""
    path = tmp_path / "broken.yaml"
    path.write_text("gpus: [\n")
    with pytest.raises(fakegpu.ProfileError) as caught:
        fakegpu.load_profile(str(path))
    assert str(caught.value).startswith(f"{path}: line 2, column 1: YAML syntax error: ") and "\n" not in str(
        caught.value
    )


def _profile_with_faults(tmp_path: pathlib.Path, faults: list[dict[str, Any]]) -> fakegpu.Profile:
    path = tmp_path / "faulty.yaml"
    path.write_text(
        yaml.safe_dump(
            {**GOOD, "gpus": [*GOOD["gpus"], {"model": "a100-sxm4-80gb", "pciBusID": "0000:0f:00.0"}], "faults": faults}
        )
    )
    return fakegpu.load_profile(str(path))


def test_profile_fail_fault_hits_the_named_gpu_the_given_number_of_times(tmp_path: pathlib.Path) -> None:
    """Guards the file-level fail fault: the code, the minor filter and `times`, then the call works."""
    profile = _profile_with_faults(
        tmp_path, [{"operation": "create_gpu_instance", "code": "INSUFFICIENT_RESOURCES", "minor": 0, "times": 2}]
    )
    assert profile.faults == (
        fakegpu.FaultSpec(
            operation="create_gpu_instance", code=backend.Return.INSUFFICIENT_RESOURCES, minor=0, times=2
        ),
    )
    fake = fakegpu.FakeGpus(profile, node_name="node-a")
    for minor in (0, 1):
        fake.set_mig_mode(minor, backend.MigMode.ENABLED)
    codes = []
    for _ in range(2):
        with pytest.raises(backend.NvmlError) as caught:
            fake.create_gpu_instance(0, profile_id=19, placement=backend.Placement(0, 1))
        codes.append(caught.value.code)
    assert codes == [backend.Return.INSUFFICIENT_RESOURCES] * 2
    assert fake.create_gpu_instance(1, profile_id=19, placement=backend.Placement(0, 1)).gi_id == 1
    assert fake.create_gpu_instance(0, profile_id=19, placement=backend.Placement(0, 1)).gi_id == 1


def test_profile_hang_fault_blocks_after_the_gpu_instance_until_close(tmp_path: pathlib.Path) -> None:
    """Guards the hang fault: the compute-instance call blocks with the GPU instance saved, other threads
    keep using the fake, and close() ends the hung call with an NVML error."""
    profile = _profile_with_faults(tmp_path, [{"operation": "create_compute_instance", "action": "hang"}])
    state = tmp_path / "fake-gpus.json"
    fake = fakegpu.FakeGpus(profile, node_name="node-a", state_file=state)
    fake.set_mig_mode(0, backend.MigMode.ENABLED)
    gi = fake.create_gpu_instance(0, profile_id=9, placement=backend.Placement(4, 4))
    errors: list[BaseException] = []

    def make_ci() -> None:
        try:
            fake.create_compute_instance(0, gi_id=gi.gi_id)
        except BaseException as error:  # noqa: BLE001 - the test inspects whatever ended the call
            errors.append(error)

    worker = threading.Thread(target=make_ci, daemon=True)
    worker.start()
    deadline = time.monotonic() + 10.0
    while fake.hung() != ("create_compute_instance",) and time.monotonic() < deadline:
        worker.join(timeout=0.01)
    assert fake.hung() == ("create_compute_instance",) and worker.is_alive()
    # The lock is free while the call hangs: reads and changes on other GPUs go through.
    assert [g.gi_id for g in fake.gpu_instances(0)] == [gi.gi_id] and fake.mig_devices(0) == ()
    fake.set_mig_mode(1, backend.MigMode.ENABLED)
    saved = json.loads(state.read_text())["gpus"]["0"]["gpuInstances"]
    assert saved == [{"computeInstances": [], "giId": gi.gi_id, "profileId": 9, "start": 4}]
    fake.close()
    worker.join(timeout=10.0)
    assert not worker.is_alive() and fake.hung() == ()
    assert len(errors) == 1 and isinstance(errors[0], backend.NvmlError)
    assert errors[0].code == backend.Return.UNINITIALIZED and "injected hang" in str(errors[0])


def test_a_restart_without_the_fault_finds_the_gpu_instance_the_hang_left(tmp_path: pathlib.Path) -> None:
    """Guards what the crash test relies on: faults are not persisted, the leaked GPU instance is."""
    state = tmp_path / "fake-gpus.json"
    hanging = fakegpu.FakeGpus(
        _profile_with_faults(tmp_path, [{"operation": "create_compute_instance", "action": "hang"}]),
        node_name="node-a",
        state_file=state,
    )
    hanging.set_mig_mode(0, backend.MigMode.ENABLED)
    gi = hanging.create_gpu_instance(0, profile_id=9, placement=backend.Placement(0, 4))
    restarted = fakegpu.FakeGpus(_profile_with_faults(tmp_path, []), node_name="node-a", state_file=state)
    assert restarted.gpu_instances(0) == (gi,)
    assert restarted.create_compute_instance(0, gi_id=gi.gi_id).gi_id == gi.gi_id


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        pytest.param({"operation": "gpus", "minor": 0}, "would never fire", id="minor-on-gpus"),
        pytest.param({"operation": "set_mig_mode", "times": 0}, "times must be >= 1", id="zero-times"),
    ],
)
def test_fail_refuses_a_fault_that_cannot_fire(kwargs: dict[str, Any], problem: str) -> None:
    """Guards the in-process API: a fault that would never fire is a ValueError, not a silent no-op."""
    with pytest.raises(ValueError, match=problem):
        _fake().fail(code=backend.Return.TIMEOUT, **kwargs)


@pytest.mark.parametrize(
    ("profile", "refused"),
    [("a100-80gb-x8", True), ("h100-80gb-x8", False)],
    ids=["ampere-needs-a-reset", "hopper-toggles-in-place"],
)
def test_a_mig_mode_change_needing_a_reset_is_refused_while_another_client_holds_the_gpu(
    profile: str, refused: bool
) -> None:
    """Guards NVML's activation rule: on Ampere a MIG mode change resets the GPU, which fails with IN_USE (mode
    unchanged) while DCGM or a process holds it, and works once it is released; Hopper changes it in place."""
    fake = fakegpu.FakeGpus(fakegpu.load_profile(profile), node_name="n")
    fake.hold(0, "dcgm-exporter")
    if refused:
        with pytest.raises(backend.NvmlError, match="needs a reset.*dcgm-exporter") as caught:
            fake.set_mig_mode(0, backend.MigMode.ENABLED)
        assert caught.value.code == backend.Return.IN_USE
        assert fake.gpus()[0].mig_mode is backend.MigMode.DISABLED
        fake.release(0, "dcgm-exporter")
    fake.set_mig_mode(0, backend.MigMode.ENABLED)
    assert fake.gpus()[0].mig_mode is backend.MigMode.ENABLED


def test_turning_mig_off_with_gpu_instances_is_refused_and_setting_the_same_mode_is_harmless() -> None:
    """Guards: MIG off while a GPU instance exists is IN_USE on any GPU; setting the mode a GPU is in succeeds
    without a change, even while a client holds it (NVML has nothing to activate)."""
    fake = fakegpu.FakeGpus(fakegpu.load_profile("h100-80gb-x8"), node_name="n")
    fake.set_mig_mode(0, backend.MigMode.ENABLED)
    fake.create_gpu_instance(0, profile_id=19, placement=backend.Placement(start=0, size=1))
    with pytest.raises(backend.NvmlError, match="GPU instance") as caught:
        fake.set_mig_mode(0, backend.MigMode.DISABLED)
    assert caught.value.code == backend.Return.IN_USE
    ampere = fakegpu.FakeGpus(fakegpu.load_profile("a100-80gb-x8"), node_name="n")
    ampere.hold(1, "a CUDA process")
    ampere.set_mig_mode(1, backend.MigMode.DISABLED)
    assert ampere.gpus()[1].mig_mode is backend.MigMode.DISABLED
