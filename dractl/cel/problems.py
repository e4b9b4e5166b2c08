"""Every selector in a set of manifests that the API server would reject, with the fix.

What it does: `problems(objects)` compiles each selector of DeviceClasses, ResourceClaims and
ResourceClaimTemplates and names the file, object and field of each failure. What it must not
do: evaluate selectors or allocate.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from dractl import model
from dractl.cel import program


def _selector_problems(prefix: str, path: str, expressions: Sequence[str]) -> Iterator[str]:
    for index, expression in enumerate(expressions):
        try:
            program.compile(expression)
        except program.CompileError as error:
            yield f"{prefix}: {path}[{index}].cel.expression: {error}"


def _claim_spec_problems(prefix: str, path: str, spec: model.ResourceClaimSpec) -> Iterator[str]:
    for r, request in enumerate(spec.requests):
        if request.exactly is not None:
            yield from _selector_problems(prefix, f"{path}.requests[{r}].exactly.selectors", request.exactly.selectors)
        for s, sub in enumerate(request.first_available):
            yield from _selector_problems(prefix, f"{path}.requests[{r}].firstAvailable[{s}].selectors", sub.selectors)


def problems(objects: model.Objects) -> tuple[str, ...]:
    """Every selector in `objects` that does not program.compile, as the API server would reject it:
    `<file>: <Kind> <name>: <field path>: <message with the fix>`. Pure apart from the
    program.compile cache; an empty result means every expression compiles."""
    found: list[str] = []
    for device_class in objects.device_classes:
        prefix = f"{device_class.source}: DeviceClass {device_class.meta.name}"
        found.extend(_selector_problems(prefix, "spec.selectors", device_class.selectors))
    # Decoding shares one spec value between equal claims: a spec found clean once is clean again.
    clean: set[int] = set()  # ids of specs alive in `objects`
    for claim in objects.resource_claims:
        if id(claim.spec) in clean:
            continue
        prefix = f"{claim.source}: ResourceClaim {claim.meta.namespace}/{claim.meta.name}"
        spec_problems = list(_claim_spec_problems(prefix, "spec.devices", claim.spec))
        if spec_problems:
            found.extend(spec_problems)
        else:
            clean.add(id(claim.spec))
    for template in objects.resource_claim_templates:
        prefix = f"{template.source}: ResourceClaimTemplate {template.meta.namespace}/{template.meta.name}"
        found.extend(_claim_spec_problems(prefix, "spec.spec.devices", template.spec))
    return tuple(found)
