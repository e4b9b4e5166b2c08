"""The Kubernetes Semver library in CEL: semver(), isSemver() and the Semver members."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from dractl import cel


@pytest.mark.parametrize(
    "expression",
    [
        pytest.param(
            'semver("1.2.3").major() == 1 && semver("1.2.3").minor() == 2 && semver("1.2.3").patch() == 3', id="parts"
        ),
        pytest.param('semver("1.10.0").isGreaterThan(semver("1.9.0"))', id="numeric-not-textual"),
        pytest.param('semver("1.0.0-rc.1").isLessThan(semver("1.0.0"))', id="prerelease-first"),
        pytest.param('semver("1.0.0-alpha").compareTo(semver("1.0.0-alpha.1")) == -1', id="prerelease-order"),
        pytest.param('semver("2.0.0").compareTo(semver("2.0.0")) == 0', id="compareTo-equal"),
        pytest.param('semver("1.0.0+build.1") == semver("1.0.0+build.2")', id="build-metadata-ignored"),
        pytest.param('semver("v1.2", true) == semver("1.2.0")', id="normalize"),
        pytest.param('semver("01.02.03", true).minor() == 2', id="normalize-leading-zeros"),
        pytest.param('isSemver("1.2.3") && !isSemver("1.2") && isSemver("1.2", true)', id="isSemver"),
        pytest.param('!isSemver("v1.2.3") && isSemver("v1.2.3", true)', id="isSemver-v-prefix"),
        pytest.param(
            'device.attributes["gpu.nvidia.com"].cudaComputeCapability.compareTo(semver("8.0.0")) >= 0',
            id="attribute-compareTo",
        ),
        pytest.param(
            'device.attributes["gpu.nvidia.com"].driverVersion.isGreaterThan(semver("550.0.0"))',
            id="attribute-isGreaterThan",
        ),
        pytest.param(
            'device.attributes["gpu.nvidia.com"].cudaComputeCapability == semver("8.0.0")', id="attribute-equality"
        ),
    ],
)
def test_semver_functions(check: Callable[[str], bool], expression: str) -> None:
    """Each Semver function follows semver 2.0.0 precedence, as Kubernetes' library does."""
    assert check(expression) is True


@pytest.mark.parametrize(
    "expression",
    [
        pytest.param('semver("1.0") == semver("1.0.0")', id="not-normalized"),
        pytest.param('semver("8.x.0", true).major() == 8', id="normalize-garbage"),
    ],
)
def test_invalid_version_is_runtime_error(gpu: cel.DeviceInput, expression: str) -> None:
    """semver() of text that is not a version fails evaluation with the parser's reason."""
    with pytest.raises(cel.EvalError, match="is not a semantic version"):
        cel.compile(expression).matches(gpu)
