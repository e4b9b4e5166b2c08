"""String extensions, regular expressions, cel.bind and optional syntax in selectors."""

from __future__ import annotations

from collections.abc import Callable

import pytest


@pytest.mark.parametrize(
    "expression",
    [
        pytest.param(
            'device.attributes["gpu.nvidia.com"].productName.lowerAscii() == "nvidia a100-sxm4-80gb"', id="lowerAscii"
        ),
        pytest.param('device.attributes["gpu.nvidia.com"].architecture.upperAscii() == "AMPERE"', id="upperAscii"),
        pytest.param('device.attributes["gpu.nvidia.com"].productName.split("-")[1] == "SXM4"', id="split"),
        pytest.param(
            'device.attributes["gpu.nvidia.com"].productName.replace("NVIDIA ", "") == "A100-SXM4-80GB"', id="replace"
        ),
        pytest.param('"  x ".trim() == "x"', id="trim"),
        pytest.param('device.attributes["gpu.nvidia.com"].productName.substring(7, 11) == "A100"', id="substring"),
        pytest.param('device.attributes["gpu.nvidia.com"].productName.indexOf("A100") == 7', id="indexOf"),
        pytest.param('device.attributes["gpu.nvidia.com"].productName.lastIndexOf("0") == 18', id="lastIndexOf"),
        pytest.param('device.attributes["gpu.nvidia.com"].productName.charAt(0) == "N"', id="charAt"),
        pytest.param('["a", "b"].join("-") == "a-b"', id="join"),
        pytest.param('"%s has %d SMs".format(["gpu-0", 108]) == "gpu-0 has 108 SMs"', id="format"),
        pytest.param('device.attributes["gpu.nvidia.com"].productName.startsWith("NVIDIA")', id="startsWith"),
        pytest.param('device.attributes["gpu.nvidia.com"].productName.contains("80GB")', id="contains"),
        pytest.param(
            'device.attributes["gpu.nvidia.com"].productName.matches("A100.*80GB$")', id="matches-unanchored-start"
        ),
        pytest.param('!device.attributes["gpu.nvidia.com"].productName.matches("^A100")', id="matches-anchored"),
        pytest.param('device.attributes["example.com"].tags.exists(t, t == "fast")', id="exists"),
        pytest.param('device.attributes["example.com"].tags.all(t, t.size() > 2)', id="all"),
        pytest.param('device.attributes.exists(d, d == "resource.kubernetes.io")', id="exists-over-domains"),
    ],
)
def test_strings_and_macros(check: Callable[[str], bool], expression: str) -> None:
    """The Kubernetes base environment's string extensions and macros are available."""
    assert check(expression) is True


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        pytest.param(
            'cel.bind(gpu, device.attributes["gpu.nvidia.com"], gpu.type == "gpu" && gpu.architecture == "Ampere")',
            True,
            id="bind-domain",
        ),
        pytest.param(
            'cel.bind(mem, device.capacity["gpu.nvidia.com"].memory, mem.compareTo(quantity("40Gi")) >= 0 && '
            'mem.isLessThan(quantity("100Gi")))',
            True,
            id="bind-quantity",
        ),
        pytest.param(
            'device.attributes["gpu.nvidia.com"].?profile.orValue("none") == "none"', True, id="optional-field-missing"
        ),
        pytest.param(
            'device.attributes["gpu.nvidia.com"].?type.orValue("none") == "gpu"', True, id="optional-field-present"
        ),
        pytest.param('device.attributes["gpu.nvidia.com"][?"profile"].orValue("") == ""', True, id="optional-index"),
        pytest.param('device.attributes[?"gpu.nvidia.com"].?type.orValue("") == "gpu"', True, id="optional-domain"),
        pytest.param('device.attributes["unknown.example.com"].?x.hasValue()', False, id="optional-on-unknown-domain"),
        pytest.param(
            'device.capacity["gpu.nvidia.com"].?memory.orValue(quantity("0")).isGreaterThan(quantity("1Gi"))',
            True,
            id="optional-capacity",
        ),
    ],
)
def test_bind_and_optionals(check: Callable[[str], bool], expression: str, expected: bool) -> None:
    """cel.bind and `.?x.orValue(y)` / `[?"k"]` work as the Kubernetes API docs recommend."""
    assert check(expression) is expected


def test_errors_absorbed_by_logical_operators(check: Callable[[str], bool]) -> None:
    """A missing key on one side of || or && does not fail when the other side decides."""
    assert check('device.attributes["gpu.nvidia.com"].profile == "x" || device.driver == "gpu.nvidia.com"') is True
    assert check('device.driver == "x" && device.attributes["gpu.nvidia.com"].profile == "x"') is False
