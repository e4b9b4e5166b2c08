"""Compile selectors once and evaluate them on devices.

What it does: `compile` checks an expression in the DRA environment (cached by its text),
refuses what Kubernetes refuses (too long, not a bool, does not type-check) with the fix where
one is known, and refuses expressions whose estimated cost is over the bound (`cost`);
`device_input` converts a device once; `Program.matches` evaluates, turning every library error
into `EvalError`. A device whose values exceed the API's validation limits gets its own cost
estimate before it is evaluated.

What it must not do: know about claims, classes, pools or the allocator's caches, or do I/O.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import threading
import typing

from dractl import model
from dractl.cel import checked, cost, environment, lexer

MAX_EXPRESSION_BYTES = 10 * 1024
"""Kubernetes' `CELSelectorExpressionMaxLength`."""


class CompileError(ValueError):
    """The expression does not compile, is too long, too costly, or does not yield a bool."""

    def __init__(self, expression: str, message: str) -> None:
        super().__init__(f"CEL expression {environment.quote(expression)} is invalid: {message}")
        self.expression = expression
        self.message = message


class EvalError(ValueError):
    """Evaluation failed at run time, was refused as too costly, or did not yield a bool."""

    def __init__(self, expression: str, message: str) -> None:
        super().__init__(f"CEL expression {environment.quote(expression)} failed: {message}")
        self.expression = expression
        self.message = message


class DeviceInput:
    """The `device` variable of one device, converted once per thread and reused for every program.

    The library converts the maps lazily on first use and keeps them, so the first evaluation
    on an input costs more than the next ones. It also ties what it converts to the thread that
    converted it: evaluated in another thread, an expression calling a function defined here
    (`quantity()`, `semver()`) fails with "No PyCelArena found for google::protobuf::Arena", and
    so does an input evaluated from two threads at once. So each thread gets its own conversion
    (the scheduler's workers take turns deciding). `bounds` is None when the device is within the
    API's validation limits.
    """

    __slots__ = ("_device", "_local", "bounds", "driver", "name")

    def __init__(self, *, driver: str, device: model.Device, bounds: cost.Bounds | None = None) -> None:
        self.driver = driver
        self.name = device.name
        self.bounds = bounds
        self._device = device
        self._local = threading.local()

    def activation(self) -> typing.Any:
        """The library's activation of this device for the calling thread (made on its first call there)."""
        found = getattr(self._local, "activation", None)
        if found is None:
            found = self._local.activation = environment.activation(self.driver, self._device)
        return found

    def __repr__(self) -> str:
        return f"DeviceInput({self.driver}/{self.name})"


def device_input(driver: str, device: model.Device) -> DeviceInput:
    """The input of one device for evaluation: pure; its conversion (about 20 µs) is made per thread on first use, so
    build it once per device."""
    bounds = _bounds(driver, device)
    return DeviceInput(
        driver=driver,
        device=device,
        bounds=None if cost.DEFAULT.covers(bounds) else bounds.widened(cost.DEFAULT),
    )


def _bounds(driver: str, device: model.Device) -> cost.Bounds:
    """The sizes of this device's inputs, in `cost.Bounds` terms."""
    attribute_value = 1
    values = 0
    attributes = 0
    string = 0
    for name, attribute in device.attributes.items():
        texts = [len(v) for v in attribute.values if isinstance(v, str)]
        string = max([string, *texts])
        weight = sum(texts) + len(attribute.values) * 2
        attribute_value = max(attribute_value, weight)
        values += len(attribute.values)
        attributes += len(name) + 1 + weight
    capacity = sum(len(name) + 1 + 64 for name in device.capacity)
    names = [*device.attributes, *device.capacity]
    return cost.Bounds(
        driver=len(driver),
        attribute_value=attribute_value,
        attributes=attributes + len(driver),
        capacity_value=64,
        capacity=capacity + len(driver),
        entries=len(names),
        values=values,
        key=max([len(driver), *(len(part) for name in names for part in name.split("/", 1))]),
        string=string,
    )


_MISSING_KEY = re.compile(r'Key not found in map\s*:\s*"?(?P<key>.*?)"?$')


def _runtime_message(raw: str) -> str:
    missing = _MISSING_KEY.search(raw)
    if missing is not None:
        key = missing.group("key")
        return (
            f"no such key: {key} (the device has no attribute or capacity {key!r} in that domain; "
            f"guard the lookup with has(...) or write .?{key}.orValue(<default>))"
        )
    return environment.STATUS.sub("", raw)


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class Program:
    """A compiled selector. Evaluate it with `matches`; it is immutable and shareable.

    `ast` is the checked AST of the text as written.
    """

    expression: str
    _compiled: typing.Any
    ast: checked.Node

    def matches(self, device: DeviceInput) -> bool:
        """True if the selector accepts the device. Pure. Raises `EvalError`."""
        if device.bounds is not None:
            # The compile-time estimate assumed validated inputs; this device is larger.
            verdict = cost.cached(self.ast, device.bounds)
            if isinstance(verdict, str):
                raise EvalError(
                    self.expression, f"refused on this device, whose values exceed the API's limits: {verdict}"
                )
        try:
            result = self._compiled.eval(device.activation())
        except RuntimeError as error:
            # The library raises (rather than returning an error value) when its
            # comprehension iteration budget runs out.
            raise EvalError(self.expression, _runtime_message(str(error))) from None
        value = result.value()
        if value is True or value is False:
            return value
        if result.type() == environment.ERROR:
            raise EvalError(self.expression, _runtime_message(str(value)))
        raise EvalError(self.expression, f"must evaluate to bool, but evaluated to {_describe(result)}")


def _describe(result: typing.Any) -> str:
    return f"{str(result.type().name()).lower()} {result.value()!r}"


@functools.lru_cache(maxsize=4096)
def compile(expression: str) -> Program:
    """Compile a selector once; cached by its text (failures are not cached). Raises `CompileError`."""
    size = len(expression.encode())
    if size > MAX_EXPRESSION_BYTES:
        raise CompileError(expression, f"it is {size} bytes long; the limit is {MAX_EXPRESSION_BYTES} bytes (10 KiB)")
    # Compile the text as written first, so that positions in messages are the user's.
    try:
        written = environment.ENV.compile(expression)
        compiled = environment.ENV.compile(lexer.optional_domains(expression))
    except RuntimeError as error:
        # Imported here: the "write instead" fixes (and difflib) serve only expressions that fail.
        from dractl.cel import fixes

        raise CompileError(expression, fixes.compile_message(expression, str(error))) from None
    if compiled.return_type() != environment.BOOL and compiled.return_type() != environment.DYN:
        kind = str(compiled.return_type().name()).lower()
        raise CompileError(expression, f"it must evaluate to bool, but evaluates to {kind}")
    try:
        ast = checked.decode(written.serialize())
    except checked.Unreadable as unreadable:
        # Without the AST nothing bounds what the evaluation may allocate.
        raise CompileError(expression, f"its cost cannot be bounded ({unreadable})") from None
    verdict = cost.cached(ast, cost.DEFAULT)
    if isinstance(verdict, str):
        raise CompileError(expression, verdict)
    return Program(expression, compiled, ast)
