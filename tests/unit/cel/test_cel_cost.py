"""The static cost bound: selectors that could build huge values or run long are refused.

cel-expr-python has no cost limit (only 10,000 comprehension iterations per evaluation), so
without the bound these expressions would allocate gigabytes. Every test runs under a short
pytest-timeout: a regression shows as a timeout or a memory error, not a hang.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from dractl import cel, model

pytestmark = pytest.mark.timeout(20)


def _bind_chain(seed: str, step: str, depth: int, test: str) -> str:
    return f"cel.bind(s, {seed}, " + f"cel.bind(s, {step}, " * depth + test + ")" * (depth + 1)


HUGE = {
    "string-doubling-in-bind": _bind_chain('"xxxxxxxx"', "s + s + s + s + s + s + s + s", 10, "s.size() > 0"),
    "list-doubling-in-bind": _bind_chain(
        "[1, 2, 3, 4, 5, 6, 7, 8]", "s + s + s + s + s + s + s + s", 10, "s.size() > 0"
    ),
    "replace-squares": '"x"' + '.replace("x", "xxxxxxxxxxxxxxxx")' * 6 + ".size() > 0",
    "nested-map": "[1, 2, 3]"
    + "".join(f".map({v}, [1, 2, 3]" for v in "abcdefg")
    + ".map(h, [a, b, c, d, e, f, g, h])"
    + ")" * 7
    + ".size() > 0",
}


@pytest.mark.parametrize("expression", list(HUGE.values()), ids=list(HUGE))
def test_expressions_that_could_build_huge_values_are_refused_at_compile_time(expression: str) -> None:
    """Doubling strings or lists in cel.bind, replace() with long text and nested map() are
    refused when compiled, with a message that says why."""
    with pytest.raises(cel.CompileError) as refused:
        cel.compile(expression)
    message = refused.value.message
    assert "estimated" in message and "over the limit" in message


def test_the_refusal_names_the_object_and_field() -> None:
    """`cel.problems` reports a too-costly selector with file, object and field path."""
    bad = model.DeviceClass(
        meta=model.ObjectMeta(name="greedy"), selectors=(HUGE["string-doubling-in-bind"],), source="classes.yaml"
    )
    found = cel.problems(model.Objects(device_classes=(bad,)))
    assert len(found) == 1
    assert found[0].startswith("classes.yaml: DeviceClass greedy: spec.selectors[0].cel.expression: CEL expression `")
    assert "over the limit of 1,048,576" in found[0]


@pytest.mark.parametrize(
    "expression",
    [
        _bind_chain('"xxxxxxxx"', "s + s", 5, "s.size() == 256"),
        'device.attributes["gpu.nvidia.com"].exists(k, device.attributes["gpu.nvidia.com"].exists(j, k == j))',
        "[0, 1, 2, 3, 4, 5, 6, 7, 8, 9].all(a, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9].all(b, a + b >= 0))",
        'device.attributes["gpu.nvidia.com"].productName.lowerAscii().replace("nvidia ", "").startsWith("a100")',
        'device.attributes["example.com"].tags.map(t, t + "-x").exists(t, t == "fast-x")',
    ],
    ids=[
        "small-doubling",
        "nested-exists-over-attributes",
        "nested-all",
        "string-functions",
        "map-over-list-attribute",
    ],
)
def test_ordinary_expressions_pass_the_bound(expression: str, check: Callable[[str], bool]) -> None:
    """Selectors of realistic size (comprehensions over a device's attributes, small
    doubling, string functions) compile and evaluate."""
    assert check(expression) is True


def test_a_device_beyond_the_api_limits_gets_its_own_bound(make_input: Callable[..., cel.DeviceInput]) -> None:
    """A device whose values exceed the API's validation limits (possible only for devices
    not read from manifests) is estimated again at run time: the same selector that passes
    on a valid device is refused on it, naming the reason, without evaluating."""
    expression = _bind_chain('device.attributes["gpu.nvidia.com"].name', "s + s", 8, "s.size() > 0")
    program = cel.compile(expression)
    small = make_input({"name": model.DeviceAttribute(model.AttributeKind.STRING, ("a" * 64,))})
    assert program.matches(small) is True
    large = make_input({"name": model.DeviceAttribute(model.AttributeKind.STRING, ("a" * 100_000,))})
    with pytest.raises(cel.EvalError) as refused:
        program.matches(large)
    assert "exceed the API's limits" in refused.value.message and "over the limit" in refused.value.message


def test_iteration_budget_still_applies() -> None:
    """Work the bound admits is still stopped by the library's iteration budget at run time."""
    numbers = "[" + ", ".join(str(i) for i in range(30)) + "]"
    program = cel.compile(f"{numbers}.all(a, {numbers}.all(b, {numbers}.all(c, a + b + c >= 0)))")
    with pytest.raises(cel.EvalError, match="Iteration budget exceeded"):
        program.matches(cel.device_input("gpu.nvidia.com", model.Device(name="gpu-0")))
