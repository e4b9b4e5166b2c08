"""The `device` variable: driver, attribute and capacity lookup by domain, and their types."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from dractl import cel, model

Attr = model.DeviceAttribute
Kind = model.AttributeKind


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        pytest.param('device.driver == "gpu.nvidia.com"', True, id="driver"),
        pytest.param('device.driver == "other.example.com"', False, id="driver-mismatch"),
        pytest.param(
            'device.attributes["gpu.nvidia.com"].productName == "NVIDIA A100-SXM4-80GB"',
            True,
            id="unqualified-in-driver-domain",
        ),
        pytest.param(
            'device.attributes["resource.kubernetes.io"].pcieRoot == "pci0000:64"', True, id="qualified-in-own-domain"
        ),
        pytest.param('"pcieRoot" in device.attributes["gpu.nvidia.com"]', False, id="qualified-not-in-driver-domain"),
        pytest.param('device.attributes["gpu.nvidia.com"].index == 3', True, id="int"),
        pytest.param('device.attributes["gpu.nvidia.com"].index > 2.5', True, id="int-vs-double"),
        pytest.param('device.attributes["gpu.nvidia.com"].migCapable', True, id="bool"),
        pytest.param('device.attributes["resource.kubernetes.io"].numaNode == [0, 1]', True, id="int-list"),
        pytest.param('device.attributes["example.com"].tags.size() == 2', True, id="string-list"),
        pytest.param(
            'device.attributes["example.com"].versions[1].compareTo(semver("2.0.0-rc.1")) == 0', True, id="version-list"
        ),
        pytest.param(
            'device.attributes["gpu.nvidia.com"].cudaComputeCapability.major() == 8', True, id="version-is-semver"
        ),
        pytest.param('device.capacity["gpu.nvidia.com"].memory == quantity("80Gi")', True, id="capacity"),
        pytest.param(
            'device.capacity["example.com"].power.compareTo(quantity("400.5")) == 0', True, id="qualified-capacity"
        ),
        pytest.param("device.allowMultipleAllocations", False, id="allowMultipleAllocations"),
    ],
)
def test_lookup(check: Callable[[str], bool], expression: str, expected: bool) -> None:
    """Each field of `device` reads what the device publishes, under the Kubernetes domain rules."""
    assert check(expression) is expected


@pytest.mark.parametrize(
    "expression",
    [
        pytest.param('!has(device.attributes["unknown.example.com"].x)', id="has"),
        pytest.param('!("x" in device.attributes["unknown.example.com"])', id="in"),
        pytest.param('device.attributes["unknown.example.com"].size() == 0', id="attributes-size"),
        pytest.param('device.capacity["unknown.example.com"].size() == 0', id="capacity-size"),
        pytest.param('!("unknown.example.com" in device.attributes)', id="domain-not-listed"),
        pytest.param('device.attributes["unknown" + ".example.com"].size() == 0', id="computed-domain"),
        pytest.param('device.attributes[device.attributes["gpu.nvidia.com"].type].size() == 0', id="nested-lookup"),
    ],
)
def test_unknown_domain_is_empty_map(check: Callable[[str], bool], expression: str) -> None:
    """An unknown domain is an empty map, so has(), `in` and size() work on it without errors."""
    assert check(expression) is True


def test_unknown_attribute_in_known_domain_is_runtime_error(gpu: cel.DeviceInput) -> None:
    """A missing id in a known domain fails with Kubernetes' "no such key" and a guard hint."""
    program = cel.compile('device.attributes["gpu.nvidia.com"].profile == "1g.10gb"')
    with pytest.raises(cel.EvalError) as caught:
        program.matches(gpu)
    assert caught.value.message.startswith("no such key: profile")
    assert "has(" in caught.value.message and ".?profile.orValue(" in caught.value.message
    assert caught.value.expression == program.expression
    assert "device.attributes" in str(caught.value)


def test_unknown_capacity_in_known_domain_is_runtime_error(gpu: cel.DeviceInput) -> None:
    """A missing capacity name in a known domain is the same runtime error."""
    with pytest.raises(cel.EvalError, match="no such key: shares"):
        cel.compile('device.capacity["gpu.nvidia.com"].shares.sign() == 1').matches(gpu)


def test_has_guards_missing_attribute(gpu: cel.DeviceInput) -> None:
    """has() on a missing id is false and short-circuits the lookup, as the API docs advise."""
    program = cel.compile(
        'has(device.attributes["gpu.nvidia.com"].profile) && device.attributes["gpu.nvidia.com"].profile == "x"'
    )
    assert program.matches(gpu) is False


def test_rewrite_leaves_string_literals_alone(check: Callable[[str], bool]) -> None:
    """Text that looks like a domain lookup inside a string literal is not rewritten."""
    assert check('\'device.attributes["x"]\'.size() == 22 && "device.capacity[\\"y\\"]".endsWith("]")') is True


def test_explicit_optional_index_is_kept(check: Callable[[str], bool]) -> None:
    """A lookup the user already wrote as `[?d]` keeps its optional semantics."""
    assert check('!device.attributes[?"unknown.example.com"].hasValue()') is True


def test_allow_multiple_allocations(make_input: Callable[..., cel.DeviceInput]) -> None:
    """device.allowMultipleAllocations mirrors the device field."""
    program = cel.compile("device.allowMultipleAllocations")
    assert program.matches(make_input(multiple=True)) is True
    assert program.matches(make_input(multiple=False)) is False


def test_driver_decides_domain_of_unqualified_names(make_input: Callable[..., cel.DeviceInput]) -> None:
    """Unqualified names belong to the publishing driver's domain, whatever that driver is."""
    device = make_input({"model": Attr(Kind.STRING, ("x",))}, {"slots": "4"}, driver="fpga.example.com")
    assert cel.compile('device.attributes["fpga.example.com"].model == "x"').matches(device) is True
    assert cel.compile('device.capacity["fpga.example.com"].slots.asInteger() == 4').matches(device) is True
    assert cel.compile('device.attributes["gpu.nvidia.com"].size() == 0').matches(device) is True


def test_device_without_attributes(make_input: Callable[..., cel.DeviceInput]) -> None:
    """A device with no attributes or capacity still evaluates; its driver domain is unknown."""
    device = make_input()
    assert (
        cel.compile('device.attributes["gpu.nvidia.com"].size() == 0 && device.capacity.size() == 0').matches(device)
        is True
    )


def test_one_input_serves_many_programs(gpu: cel.DeviceInput) -> None:
    """A DeviceInput is reused across programs and evaluations without changing results."""
    first = cel.compile('device.attributes["gpu.nvidia.com"].type == "gpu"')
    second = cel.compile('device.capacity["gpu.nvidia.com"].memory.isGreaterThan(quantity("40Gi"))')
    third = cel.compile('device.attributes["gpu.nvidia.com"].type == "mig"')
    assert [first.matches(gpu), second.matches(gpu), third.matches(gpu), first.matches(gpu)] == [
        True,
        True,
        False,
        True,
    ]


def test_device_input_names_device() -> None:
    """DeviceInput keeps driver and device name so callers can name the device in messages."""
    device = cel.device_input("gpu.nvidia.com", model.Device(name="gpu-7"))
    assert (device.driver, device.name) == ("gpu.nvidia.com", "gpu-7")
    assert "gpu.nvidia.com/gpu-7" in repr(device)


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        pytest.param('device.attributes["resource.kubernetes.io"].numaNode.includes(1)', True, id="int-list"),
        pytest.param('device.attributes["resource.kubernetes.io"].numaNode.includes(7)', False, id="int-list-absent"),
        pytest.param('device.attributes["example.com"].tags.includes("big")', True, id="string-list"),
        pytest.param('device.attributes["example.com"].versions.includes(semver("1.2.3"))', True, id="version-list"),
        pytest.param('device.attributes["gpu.nvidia.com"].type.includes("gpu")', True, id="string-scalar"),
        pytest.param('device.attributes["gpu.nvidia.com"].index.includes(3)', True, id="int-scalar"),
        pytest.param('device.attributes["gpu.nvidia.com"].migCapable.includes(false)', False, id="bool-scalar"),
        pytest.param(
            'device.attributes["gpu.nvidia.com"].cudaComputeCapability.includes(semver("8.0.0"))',
            True,
            id="version-scalar",
        ),
    ],
)
def test_includes(check: Callable[[str], bool], expression: str, expected: bool) -> None:
    """includes() tests membership in list attributes and equality on scalar ones."""
    assert check(expression) is expected


def test_includes_refuses_long_lists(make_input: Callable[..., cel.DeviceInput]) -> None:
    """includes() on a list longer than 48 entries is a runtime error, as in Kubernetes."""
    device = make_input({"ids": Attr(Kind.INT, tuple(range(cel.LIST_INCLUDES_LIMIT + 1)), is_list=True)})
    with pytest.raises(cel.EvalError, match="at most 48"):
        cel.compile('device.attributes["gpu.nvidia.com"].ids.includes(1)').matches(device)
