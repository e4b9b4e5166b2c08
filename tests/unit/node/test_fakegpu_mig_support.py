"""The fake GPU backend answers MIG questions on a GPU whose model has no MIG as NVML does."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from dractl.node import backend, fakegpu

QUESTIONS: dict[str, Callable[[fakegpu.FakeGpus], object]] = {
    "gpu_instance_profiles": lambda fake: fake.gpu_instance_profiles(0),
    "set_mig_mode": lambda fake: fake.set_mig_mode(0, backend.MigMode.ENABLED),
}


@pytest.mark.parametrize("question", list(QUESTIONS), ids=list(QUESTIONS))
def test_a_gpu_without_mig_answers_not_supported(question: str) -> None:
    """Guards: asking a T4 (no MIG) for its MIG profiles or to turn MIG on raises NOT_SUPPORTED naming the GPU,
    and leaves its MIG mode as it was."""
    fake = fakegpu.FakeGpus(fakegpu.load_profile("t4-x2"), node_name="node-a")
    before = fake.gpus()[0]
    with pytest.raises(backend.NvmlError, match=r"GPU 0 \(.*T4.*\) has no MIG") as caught:
        QUESTIONS[question](fake)
    assert caught.value.code == backend.Return.NOT_SUPPORTED
    assert fake.gpus()[0] == before


def test_an_injected_fault_comes_before_the_mig_check() -> None:
    """Guards: a fault injected for set_mig_mode fires on a GPU without MIG too (the check does not hide it)."""
    fake = fakegpu.FakeGpus(fakegpu.load_profile("t4-x2"), node_name="node-a")
    fake.fail("set_mig_mode", backend.Return.TIMEOUT, minor=0)
    with pytest.raises(backend.NvmlError, match="injected fault") as caught:
        fake.set_mig_mode(0, backend.MigMode.ENABLED)
    assert caught.value.code == backend.Return.TIMEOUT
