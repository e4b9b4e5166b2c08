"""The Kubernetes Quantity library in CEL: quantity(), isQuantity() and the Quantity members."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from dractl import cel


@pytest.mark.parametrize(
    "expression",
    [
        pytest.param('quantity("1Gi").compareTo(quantity("1024Mi")) == 0', id="compareTo-equal"),
        pytest.param('quantity("1G").compareTo(quantity("1Gi")) == -1', id="compareTo-less"),
        pytest.param('quantity("2").compareTo(quantity("1500m")) == 1', id="compareTo-greater"),
        pytest.param('quantity("1Gi") == quantity("1024Mi")', id="equality-is-by-value"),
        pytest.param('quantity("1Gi") != quantity("1G")', id="inequality"),
        pytest.param('quantity("80Gi").isGreaterThan(quantity("40Gi"))', id="isGreaterThan"),
        pytest.param('!quantity("40Gi").isGreaterThan(quantity("40Gi"))', id="isGreaterThan-strict"),
        pytest.param('quantity("100m").isLessThan(quantity("1"))', id="isLessThan"),
        pytest.param('quantity("1Ki").add(quantity("1Ki")) == quantity("2Ki")', id="add-quantity"),
        pytest.param('quantity("1Ki").add(1) == quantity("1025")', id="add-int"),
        pytest.param('quantity("1").sub(quantity("1500m")) == quantity("-500m")', id="sub-quantity"),
        pytest.param('quantity("10").sub(3).asInteger() == 7', id="sub-int"),
        pytest.param(
            'quantity("-5").sign() == -1 && quantity("0").sign() == 0 && quantity("5m").sign() == 1', id="sign"
        ),
        pytest.param('quantity("1Gi").isInteger() && !quantity("1500m").isInteger()', id="isInteger"),
        pytest.param('quantity("1Gi").asInteger() == 1073741824', id="asInteger"),
        pytest.param('!quantity("10E").isInteger()', id="isInteger-beyond-int64"),
        pytest.param('quantity("1500m").asApproximateFloat() == 1.5', id="asApproximateFloat"),
        pytest.param('quantity("1e3").asInteger() == 1000', id="exponent"),
        pytest.param('isQuantity("40Gi") && !isQuantity("40 GiB")', id="isQuantity"),
        pytest.param(
            'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0', id="capacity-compareTo"
        ),
        pytest.param('device.capacity["gpu.nvidia.com"].multiprocessors.asInteger() == 108', id="capacity-asInteger"),
        pytest.param(
            'device.capacity["gpu.nvidia.com"].memory.sub(quantity("60Gi")).isLessThan(quantity("40Gi"))',
            id="capacity-arithmetic",
        ),
    ],
)
def test_quantity_functions(check: Callable[[str], bool], expression: str) -> None:
    """Each Quantity function gives Kubernetes' answer on exact values."""
    assert check(expression) is True


def test_capacity_text_does_not_matter(make_input: Callable[..., cel.DeviceInput]) -> None:
    """Capacities spelled differently but equal in value compare and test equal."""
    program = cel.compile('device.capacity["gpu.nvidia.com"].memory == quantity("80Gi")')
    assert program.matches(make_input(capacity={"memory": "85899345920"})) is True
    assert program.matches(make_input(capacity={"memory": "81920Mi"})) is True
    assert program.matches(make_input(capacity={"memory": "80G"})) is False


def test_invalid_quantity_is_runtime_error(gpu: cel.DeviceInput) -> None:
    """quantity() of text that is not a quantity fails evaluation with the parser's reason."""
    with pytest.raises(cel.EvalError, match="'40 GiB' is not a quantity"):
        cel.compile('device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40 GiB")) >= 0').matches(gpu)


def test_asInteger_of_fraction_is_runtime_error(gpu: cel.DeviceInput) -> None:
    """asInteger() on a value with a fractional part fails instead of rounding."""
    with pytest.raises(cel.EvalError, match="cannot be converted to an int64"):
        cel.compile('quantity("1500m").asInteger() == 1').matches(gpu)


def test_compare_quantity_with_version_is_runtime_error(gpu: cel.DeviceInput) -> None:
    """compareTo() between a version attribute (dyn) and a quantity fails at run time."""
    with pytest.raises(cel.EvalError, match="cannot compare a semver with a quantity"):
        cel.compile('device.attributes["gpu.nvidia.com"].cudaComputeCapability.compareTo(quantity("8")) == 0').matches(
            gpu
        )
