"""Per-claim CDI specs: names, minimum version, atomic files, nvidia-ctk edits, and the rule checker."""

from __future__ import annotations

import os
import pathlib
import subprocess
from collections.abc import Sequence

import pytest
import structlog
from support import cdi_rules

from dractl.node import cdi

UID = "7f0e4a1c-1b2d-4c3e-9f00-0123456789ab"


def _spec() -> dict:  # type: ignore[type-arg]
    edits = cdi.ContainerEdits(env=("NVIDIA_VISIBLE_DEVICES=GPU-1",), device_nodes=(cdi.device_node("/dev/nvidia0"),))
    return cdi.build_spec(
        claim_uid=UID, devices=[("gpu-0", edits)], common=cdi.ContainerEdits(mounts=(cdi.mount("/a", "/b"),))
    )


def test_names_follow_the_nvidia_driver() -> None:
    """Guards: kind, device name <uid>-<device>, CDI id and file name are the NVIDIA driver's."""
    assert cdi.KIND == "k8s.gpu.nvidia.com/claim"
    assert cdi.qualified_name(UID, "gpu-1-mig-1g10gb-19-0") == f"k8s.gpu.nvidia.com/claim={UID}-gpu-1-mig-1g10gb-19-0"
    assert cdi.spec_path(pathlib.Path("/var/run/cdi"), UID) == pathlib.Path(
        f"/var/run/cdi/k8s.gpu.nvidia.com-claim_{UID}.yaml"
    )


@pytest.mark.parametrize("device", ["gpu 0", "gpu/0", "gpu-0-", "gpü"])
def test_a_device_name_breaking_cdi_rules_is_refused(device: str) -> None:
    """Guards: a CDI name outside [A-Za-z0-9_.:-] or with a non-alphanumeric end is refused."""
    with pytest.raises(ValueError, match="CDI device name"):
        cdi.device_name(UID, device)


def test_built_spec_passes_the_cdi_rules_with_minimum_version() -> None:
    """Guards: the spec is valid CDI at 0.5.0, the version device names starting with a digit need."""
    spec = _spec()
    assert cdi_rules.problems(spec) == []
    assert spec["cdiVersion"] == "0.5.0"


@pytest.mark.parametrize(
    ("extra", "version"),
    [
        pytest.param({"annotations": {"a": "b"}}, "0.6.0", id="annotations"),
        pytest.param({"containerEdits": {"additionalGids": [44]}}, "0.7.0", id="gids"),
        pytest.param(
            {"containerEdits": {"netDevices": [{"hostInterfaceName": "eth1", "name": "net1"}]}}, "1.1.0", id="net"
        ),
    ],
)
def test_minimum_version_follows_the_features_used(extra: dict, version: str) -> None:  # type: ignore[type-arg]
    """Guards: cdiVersion rises with annotations (0.6.0), additionalGids (0.7.0) and netDevices (1.1.0)."""
    assert cdi.minimum_version({**_spec(), **extra}) == version


def test_write_is_atomic_listed_and_removed(tmp_path: pathlib.Path) -> None:
    """Guards: the spec is written whole (no temp left), listed by claim UID, removed idempotently."""
    root = tmp_path / "cdi"
    path = cdi.write_spec(root, UID, _spec())
    cdi.write_spec(root, UID, _spec())
    (root / "nvidia.com-gpu.yaml").write_text("x")
    assert sorted(os.listdir(root)) == sorted([path.name, "nvidia.com-gpu.yaml"])
    assert cdi_rules.check_file(path) == _spec()
    assert cdi.claim_specs(root) == {UID: path}
    cdi.remove_spec(path)
    cdi.remove_spec(path)
    assert cdi.claim_specs(root) == {}
    assert cdi.claim_specs(tmp_path / "absent") == {}


def test_merge_lets_later_edits_win_per_key() -> None:
    """Guards: merged edits keep one env per key, node per path, mount per container path (later wins)."""
    a = cdi.ContainerEdits(
        env=("A=1", "B=1"), device_nodes=(cdi.device_node("/dev/x"),), mounts=(cdi.mount("/h1", "/c"),)
    )
    b = cdi.ContainerEdits(
        env=("A=2",), device_nodes=({"path": "/dev/x", "permissions": "rw"},), mounts=(cdi.mount("/h2", "/c"),)
    )
    merged = a.merged(b)
    assert merged.env == ("A=2", "B=1")
    assert merged.device_nodes == ({"path": "/dev/x", "permissions": "rw"},)
    assert [m["hostPath"] for m in merged.mounts] == ["/h2"]


def test_nvidia_ctk_output_gives_the_common_edits_once() -> None:
    """Guards: nvidia-ctk cdi generate --format=json: its spec-level edits are used and cached."""
    calls: list[Sequence[str]] = []

    def runner(argv: Sequence[str]) -> str:
        calls.append(argv)
        return (
            '{"containerEdits": {"env": ["NVIDIA_CTK_LIBCUDA_DIR=/lib"],'
            ' "deviceNodes": [{"path": "/dev/nvidia-modeset"}]}}'
        )

    ctk = cdi.NvidiaCtk(
        runner=runner, which=lambda name: f"/usr/bin/{name}", extra_args=["--driver-root=/run/nvidia/driver"]
    )
    edits = ctk.common_edits()
    assert ctk.common_edits() is edits
    assert calls == [["/usr/bin/nvidia-ctk", "cdi", "generate", "--format=json", "--driver-root=/run/nvidia/driver"]]
    assert edits == cdi.ContainerEdits(
        env=("NVIDIA_CTK_LIBCUDA_DIR=/lib",), device_nodes=({"path": "/dev/nvidia-modeset"},)
    )


def test_nvidia_ctk_absent_gives_no_common_edits_and_failing_fails_until_it_works() -> None:
    """Guards: without nvidia-ctk the edits are skipped with one log line; a failing run raises OSError, retried."""
    with structlog.testing.capture_logs() as logs:
        absent = cdi.NvidiaCtk(which=lambda name: None)
        assert absent.common_edits() == cdi.ContainerEdits()
        assert absent.common_edits() == cdi.ContainerEdits()
    assert [entry["event"] for entry in logs] == [
        "nvidia-ctk not on PATH: CDI specs carry no driver library mounts or hooks"
    ]
    outcomes = iter([subprocess.CalledProcessError(1, "nvidia-ctk"), '{"containerEdits": {"env": ["A=1"]}}'])

    def runner(argv: Sequence[str]) -> str:
        outcome = next(outcomes)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    flaky = cdi.NvidiaCtk(runner=runner, which=lambda name: "/bin/nvidia-ctk")
    with pytest.raises(OSError, match="cdi generate failed"):
        flaky.common_edits()
    assert flaky.common_edits().env == ("A=1",)


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        pytest.param(lambda s: s.update(cdiVersion="0.9.0"), "cdiVersion '0.9.0' is not one of", id="version-unknown"),
        pytest.param(lambda s: s.update(cdiVersion="0.4.0"), "below 0.5.0", id="version-too-low"),
        pytest.param(lambda s: s.update(kind="nvidia.com/gpu/device"), "must be vendor/class", id="kind-slash"),
        pytest.param(lambda s: s.update(kind="gpu"), "must be vendor/class", id="kind-no-class"),
        pytest.param(lambda s: s["devices"][0].update(name="-bad"), "name '-bad'", id="device-name"),
        pytest.param(lambda s: s["devices"].append(dict(s["devices"][0])), "duplicate device name", id="duplicate"),
        pytest.param(lambda s: s["devices"][0]["containerEdits"].update(env=["NOVALUE"]), "not KEY=VALUE", id="env"),
        pytest.param(
            lambda s: s["devices"][0]["containerEdits"].update(deviceNodes=[{"path": "dev/x"}]),
            "absolute path",
            id="node-path",
        ),
        pytest.param(
            lambda s: s["devices"][0]["containerEdits"].update(deviceNodes=[{"path": "/dev/x", "permissions": "rx"}]),
            "subset of rwm",
            id="node-perm",
        ),
        pytest.param(
            lambda s: s["devices"][0]["containerEdits"].update(hooks=[{"hookName": "preStart", "path": "/x"}]),
            "hookName 'preStart'",
            id="hook-name",
        ),
        pytest.param(lambda s: s["devices"][0].update(containerEdits={}), "non-empty containerEdits", id="empty-edits"),
        pytest.param(lambda s: s.update(extra=1), "unknown top-level field 'extra'", id="strict"),
        pytest.param(lambda s: s.update(devices=[]), "non-empty list", id="no-devices"),
    ],
)
def test_the_cdi_rule_checker_catches_each_violation(change, problem: str) -> None:  # type: ignore[no-untyped-def]
    """Guards: the reusable checker is not vacuous: each broken rule is reported."""
    spec = _spec()
    change(spec)
    assert any(problem in p for p in cdi_rules.problems(spec)), cdi_rules.problems(spec)
