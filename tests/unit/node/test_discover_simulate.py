"""The two halves agree: what `dractl discover` publishes is what `dractl simulate` can allocate.

Each built-in fake profile, in both MIG modes, is offered the seed article's patterns (the
example cluster's 30-33 files are their valid v1 versions; here as standalone claims without
product names so they apply to every profile): a GPU with at least 40Gi (pattern 1), any
whole GPU (pattern 2), a 3g.40gb and a 1g.10gb MIG device of one parent GPU (pattern 3), and
four GPUs of one NVLink partition. Each claim must allocate exactly where the hardware allows.
"""

from __future__ import annotations

import pytest
import yaml

from dractl import alloc, config
from dractl.model import decode, encode
from dractl.node import discover, fakegpu
from dractl.simulate import engine

_REQUEST = "{{name: {name}, exactly: {{deviceClassName: {cls}{extra}}}}}"

CLAIMS = {
    "pattern1-40gi-gpu": [_REQUEST.format(name="gpu", cls="high-memory-gpu", extra="")],
    "pattern2-any-gpu": [_REQUEST.format(name="gpu", cls="any-nvidia-gpu", extra="")],
    "pattern3-mig-pair": [
        _REQUEST.format(
            name="large-slice",
            cls="mig.nvidia.com",
            extra=', selectors: [{cel: {expression: \'device.attributes["gpu.nvidia.com"].profile == "3g.40gb"\'}}]',
        ),
        _REQUEST.format(
            name="small-slice",
            cls="mig.nvidia.com",
            extra=', selectors: [{cel: {expression: \'device.attributes["gpu.nvidia.com"].profile == "1g.10gb"\'}}]',
        ),
    ],
    "nvlink-4-gpus": [_REQUEST.format(name="gpus", cls="gpu.nvidia.com", extra=", count: 4")],
}
CONSTRAINTS = {
    "pattern3-mig-pair": "[{requests: [large-slice, small-slice], matchAttribute: gpu.nvidia.com/parentUUID}]",
    "nvlink-4-gpus": "[{requests: [gpus], matchAttribute: gpu.nvidia.com/partition4}]",
}

# What each profile's hardware allows: (whole GPU >= 40Gi, MIG capable, existing 3g.40gb +
# 1g.10gb on one GPU, NVLink partitions of 4).
HARDWARE = {
    "a100-80gb-x8": (True, True, False, True),
    "h100-80gb-x8": (True, True, False, True),
    "a100-mig-mixed": (True, True, True, False),
    "t4-x2": (False, False, False, False),
    "l4-x4": (False, False, False, False),
}


def _expected(profile: str, mode: config.MigMode, claim: str) -> bool:
    big, mig_capable, static_pair, nvlink = HARDWARE[profile]
    return {
        "pattern1-40gi-gpu": big,
        "pattern2-any-gpu": True,
        "pattern3-mig-pair": mig_capable if mode is config.MigMode.DYNAMIC else static_pair,
        "nvlink-4-gpus": nvlink,
    }[claim]


def _claim(name: str) -> str:
    constraints = f"\n    constraints: {CONSTRAINTS[name]}" if name in CONSTRAINTS else ""
    return (
        f"apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {{name: {name}, namespace: default}}\n"
        f"spec:\n  devices:\n    requests: [{', '.join(CLAIMS[name])}]{constraints}\n"
    )


def test_every_builtin_profile_has_expectations() -> None:
    """Guards that a new built-in profile cannot skip this agreement test."""
    assert set(HARDWARE) == set(fakegpu.builtin_profiles())


@pytest.mark.parametrize("claim", sorted(CLAIMS))
@pytest.mark.parametrize("mode", [config.MigMode.STATIC, config.MigMode.DYNAMIC], ids=lambda m: m.value)
@pytest.mark.parametrize("profile", sorted(HARDWARE))
def test_discovered_slices_allocate_where_the_hardware_allows(profile: str, mode: config.MigMode, claim: str) -> None:
    """Guards that discover's slices and the allocator agree for every profile, MIG mode and seed pattern."""
    settings = config.Discover(
        node_name="node-1", device_source=config.DeviceSource.FAKE, fake_profile=profile, mig_mode=mode
    )
    nvml = discover.open_backend(settings)
    documents = [encode.resource_slice(s) for s in discover.build(settings, nvml)]
    documents += list(yaml.safe_load_all((discover.EXAMPLES_DIR / "00-deviceclasses.yaml").read_text()))
    documents.append(yaml.safe_load(_claim(claim)))
    objects = decode.load_documents([d for d in documents if d], file=f"{profile}-{mode.value}")
    result = engine.simulate(objects, policy=alloc.Policy.BINPACK, search_limit=config.DEFAULT_SEARCH_LIMIT)
    (outcome,) = result.claims
    assert outcome.allocated == _expected(profile, mode, claim), outcome.reasons
    if outcome.allocated:
        assert outcome.node == "node-1"
