"""CEL selectors over one build's devices: each (expression, device) evaluated once.

Part of the allocator (`dractl.alloc`). Evaluates class and request selectors into a byte per
device, with the runtime error of every device where one failed; results are cached per
(expression, device) for the allocator's life, and shared between devices that the
expression cannot tell apart (`cel.sharing`). A new build keeps the CEL inputs and results of
every device that is unchanged (`Selectors(..., previous=...)`). No search, no I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Mapping, Sequence

from dractl import cel, model
from dractl.alloc import index as allocindex

# Per (expression, device) evaluation states.
_UNKNOWN, _NO_MATCH, _MATCH, _FAILED = 0, 1, 2, 3


@dataclasses.dataclass(frozen=True, slots=True)
class ClassMask:
    """A class's selectors over every device: matches, runtime failures, compile error."""

    mask: bytearray
    failed: dict[int, str]
    error: str | None
    matches: int


class Selectors:
    """The selector results of one build's devices (`index`) under the classes `classes`.

    Not thread-safe: the allocator calls it under its lock. `previous` is the selectors of the
    build this one replaces: the per-device caches of devices that are the same object or
    equal carry over to the new numbering.
    """

    def __init__(
        self,
        *,
        index: allocindex.Index,
        classes: Mapping[str, model.DeviceClass],
        previous: Selectors | None,
    ) -> None:
        self._index = index
        self._classes = classes
        self._class_masks: dict[str, ClassMask] = {}
        self._expr_keys: dict[str, dict[Hashable, int]] = {}
        self._groups: dict[cel.sharing.Footprint, list[Hashable]] = {}
        self._inputs: list[cel.DeviceInput | None] = [None] * len(index.devices)
        self._expr_results: dict[str, tuple[bytearray, dict[int, str]]] = {}
        if previous is not None:
            self._carry_over(previous)

    def _carry_over(self, previous: Selectors) -> None:
        """Move the per-device caches (CEL inputs, selector results and errors) to this build's
        numbering, keeping only devices that are the same object or equal."""
        old, index = previous._index, self._index
        pairs: list[tuple[int, int]] = []
        where = {old.identity(i): i for i in range(len(old.devices))}
        for i, ref in enumerate(index.devices):
            j = where.get(index.identity(i))
            if j is not None and (old.devices[j].device is ref.device or old.devices[j].device == ref.device):
                pairs.append((i, j))
                self._inputs[i] = previous._inputs[j]
        for expression, (states, errors) in previous._expr_results.items():
            moved, moved_errors = bytearray(len(index.devices)), {}
            for i, j in pairs:
                moved[i] = states[j]
                if j in errors:
                    moved_errors[i] = errors[j]
            self._expr_results[expression] = (moved, moved_errors)

    def class_mask(self, class_name: str) -> ClassMask:
        """The devices the class's selectors match (the class exists)."""
        found = self._class_masks.get(class_name)
        if found is None:
            mask, failed, error = self.evaluate(
                self._classes[class_name].selectors,
                bytearray(b"\x01" * len(self._inputs)),
                where=f"device class {class_name}: ",
            )
            found = self._class_masks[class_name] = ClassMask(mask, failed, error, sum(mask))
        return found

    def evaluate(
        self, selectors: Sequence[str], mask: bytearray, *, where: str
    ) -> tuple[bytearray, dict[int, str], str | None]:
        """Evaluate selectors in order, each where the previous ones held (upstream
        short-circuits the same way). Returns the mask, a message per device whose
        evaluation failed (naming `where`, the selector and the device), and the compile
        error that stops the request anywhere."""
        failed: dict[int, str] = {}
        devices = self._index.devices
        for k, expression in enumerate(selectors):
            try:
                mask, errors = self._expression(expression, mask)
            except cel.CompileError as bad:
                return mask, failed, f"{where}selectors[{k}]: {bad}"
            for i, message in errors.items():
                failed[i] = (
                    f"{where}selectors[{k}]: CEL expression {cel.quote(expression)} failed on device "
                    f"{devices[i].path}: {message}"
                )
        return mask, failed, None

    def _input(self, index: int) -> cel.DeviceInput:
        found = self._inputs[index]
        if found is None:
            ref = self._index.devices[index]
            found = self._inputs[index] = cel.device_input(ref.driver, ref.device)
        return found

    def _expression(self, expression: str, mask: bytearray) -> tuple[bytearray, dict[int, str]]:
        """`mask` AND the expression, evaluated where `mask` is set, and the runtime error
        of every device where it failed (those are not in the result). Results are cached
        per (expression, device) and shared between devices the expression cannot tell
        apart (`cel.sharing`); every device still gets its own result or error."""
        program = cel.compile(expression)
        results, errors = self._expr_results.setdefault(expression, (bytearray(len(self._inputs)), {}))
        representatives = self._expr_keys.setdefault(expression, {})
        footprint = cel.sharing.footprint(program.expression)
        keys = None if footprint is None else self._sharing_keys(footprint)
        out = bytearray(len(mask))
        failed: dict[int, str] = {}
        for i, wanted in enumerate(mask):
            if not wanted:
                continue
            state = results[i]
            if state == _UNKNOWN:
                source = -1 if keys is None else representatives.setdefault(keys[i], i)
                if source >= 0 and source != i and results[source] != _UNKNOWN:
                    state = results[source]
                    if state == _FAILED:
                        errors[i] = errors[source]
                else:
                    try:
                        state = _MATCH if program.matches(self._input(i)) else _NO_MATCH
                    except cel.EvalError as failure:
                        state = _FAILED
                        errors[i] = failure.message
                results[i] = state
            if state == _MATCH:
                out[i] = 1
            elif state == _FAILED:
                failed[i] = errors[i]
        return out, failed

    def _sharing_keys(self, footprint: cel.sharing.Footprint) -> list[Hashable]:
        """Per device, its key under `footprint`: equal keys, equal results."""
        found = self._groups.get(footprint)
        if found is None:
            found = self._groups[footprint] = footprint.keys((ref.driver, ref.device) for ref in self._index.devices)
        return found
