"""Compilation is done once per expression text; failures are not remembered."""

from __future__ import annotations

import pytest

from dractl import cel


def test_same_text_same_program() -> None:
    """Compiling the same text twice returns the very same Program."""
    expression = 'device.attributes["gpu.nvidia.com"].type == "mig"'
    assert cel.compile(expression) is cel.compile(expression)
    assert cel.compile(expression).expression == expression


def test_different_text_different_program() -> None:
    """Texts that differ (even only in spacing) are compiled separately and keep their text."""
    first = cel.compile('device.driver == "a"')
    second = cel.compile('device.driver  == "a"')
    assert first is not second
    assert (first.expression, second.expression) == ('device.driver == "a"', 'device.driver  == "a"')


def test_failures_are_not_cached() -> None:
    """A failing expression is compiled (and fails) afresh each time, like upstream's cache."""
    errors = []
    for _ in range(2):
        with pytest.raises(cel.CompileError) as caught:
            cel.compile("device.driver ==")
        errors.append(caught.value)
    assert errors[0] is not errors[1]
    assert str(errors[0]) == str(errors[1])
