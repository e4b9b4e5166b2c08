"""One device input evaluated from several threads: the scheduler's workers take turns deciding, so an input is
built in one thread and evaluated in others."""

from __future__ import annotations

import concurrent.futures
import threading

from dractl import cel

EXPRESSIONS = (
    'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0',
    'device.attributes["gpu.nvidia.com"].cudaComputeCapability.isGreaterThan(semver("7.0.0"))',
)


def _evaluate(device: cel.DeviceInput) -> list[bool]:
    return [cel.compile(expression).matches(device) for expression in EXPRESSIONS]


def test_an_input_built_in_one_thread_is_evaluated_in_another(gpu: cel.DeviceInput) -> None:
    """Guards: expressions calling quantity() and semver() evaluate in a thread other than the one that built (and
    first evaluated) the input; the library fails them there with 'No PyCelArena found' on a shared conversion."""
    assert _evaluate(gpu) == [True, True]
    found: list[list[bool]] = []
    worker = threading.Thread(target=lambda: found.append(_evaluate(gpu)))
    worker.start()
    worker.join()
    assert found == [[True, True]]


def test_an_input_is_evaluated_from_several_threads_at_once(gpu: cel.DeviceInput) -> None:
    """Guards: four threads evaluating the same input at the same time all get the answer, none an error."""
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda _: [_evaluate(gpu) for _ in range(200)][-1], range(8)))
    assert answers == [[True, True]] * 8
