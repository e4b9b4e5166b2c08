"""Accumulated decode results and problems: every problem of every object is collected and raised once.

What it does: holds the values decoded so far (`Results`) and one object's problem reporter (`Report`), whose
messages read `<file>: <Kind> <ns>/<name>: <field.path>: <message>`. What it must not do: validate anything itself.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from dractl.model import types


class DecodeError(ValueError):
    """Manifests that the API server would reject. `problems` holds one message per problem."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = tuple(problems)
        super().__init__("\n".join(self.problems))


@dataclasses.dataclass(frozen=True, slots=True)
class Joined:
    """A pod, or a workload's pod template, that joins a PodGroup: the object's message prefix
    (`Report.prefix`), the field that names the group, and the group."""

    prefix: str
    field: str
    namespace: str
    ref: types.PodGroupRef


class Results:
    """Everything decoded so far, in input order, plus problems and warnings."""

    __slots__ = (
        "classes",
        "slices",
        "claims",
        "templates",
        "pods",
        "nodes",
        "pod_groups",
        "joined",
        "warnings",
        "problems",
    )

    def __init__(self) -> None:
        self.classes: list[types.DeviceClass] = []
        self.slices: list[types.ResourceSlice] = []
        self.claims: list[types.ResourceClaim] = []
        self.templates: list[types.ResourceClaimTemplate] = []
        self.pods: list[types.Pod] = []
        self.nodes: list[types.Node] = []
        self.pod_groups: list[types.PodGroup] = []
        self.joined: list[Joined] = []
        self.warnings: list[str] = []
        self.problems: list[str] = []

    def finish(self) -> types.Objects:
        self._duplicates()
        self._joined_across_apis()
        if self.problems:
            raise DecodeError(self.problems)
        return types.Objects(
            device_classes=tuple(self.classes),
            resource_slices=tuple(self.slices),
            resource_claims=tuple(self.claims),
            resource_claim_templates=tuple(self.templates),
            pods=tuple(self.pods),
            nodes=tuple(self.nodes),
            pod_groups=tuple(self.pod_groups),
            warnings=tuple(self.warnings),
        )

    def _duplicates(self) -> None:
        """One problem per object whose kind, namespace and name an earlier object has: the API
        holds one object per name, where the simulation would count a slice twice or use one of
        two claims silently."""
        kinds: tuple[tuple[str, Sequence[types.Decoded | types.PodGroup]], ...] = (
            ("DeviceClass", self.classes),
            ("ResourceSlice", self.slices),
            ("ResourceClaim", self.claims),
            ("ResourceClaimTemplate", self.templates),
            ("Pod", self.pods),
            ("Node", self.nodes),
            # The two APIs' PodGroups are different resources: one of each may share a name.
            *(("PodGroup", [g for g in self.pod_groups if g.api is api]) for api in types.PodGroupApi),
        )
        for kind, values in kinds:
            seen: dict[tuple[str, str], types.Source] = {}
            for value in values:
                meta = value.meta
                key = (meta.namespace, meta.name)
                first = seen.get(key)
                if first is None or not meta.name:  # a missing name is a problem of its own
                    seen[key] = value.source
                    continue
                shown = f"{meta.namespace}/{meta.name}" if meta.namespace else meta.name
                self.problems.append(
                    f"{value.source.file}: {kind} {shown}: metadata.name: given twice, first in {first.file} "
                    f"(document {first.document + 1}); the API holds one object per name: remove one or rename it"
                )

    def _joined_across_apis(self) -> None:
        """One problem per pod (or workload) that names a PodGroup of the other API: the group exists,
        but the pod joins it through the other API's field, which no scheduler of the group reads."""
        apis: dict[tuple[str, str], set[types.PodGroupApi]] = {}
        for group in self.pod_groups:
            apis.setdefault((group.meta.namespace, group.meta.name), set()).add(group.api)
        for joined in self.joined:
            found = apis.get((joined.namespace, joined.ref.name), set())
            if not found or joined.ref.api in found:
                continue
            (api,) = found
            name = joined.ref.name
            instead = (
                f"spec.schedulingGroup: {{podGroupName: {name}}}"
                if api is types.PodGroupApi.WORKLOAD
                else f"the label {types.POD_GROUP_LABEL}: {name}"
            )
            self.problems.append(
                f"{joined.prefix}{joined.field}: PodGroup {joined.namespace}/{name} is a {api.value} PodGroup, "
                f"which pods join with {instead}; this field is for {joined.ref.api.value} PodGroups"
            )


class Report:
    """The problems and warnings of one object; each starts with `<file>: <Kind> <ns>/<name>: `.

    `beta1` is set for resource.k8s.io/v1beta1 objects, whose older shapes (request fields
    inline, devices wrapped in `basic`) are converted silently instead of reported.
    """

    __slots__ = ("prefix", "problems", "warnings", "beta1")

    def __init__(self, prefix: str, out: Results) -> None:
        self.prefix = prefix
        self.problems = out.problems
        self.warnings = out.warnings
        self.beta1 = False

    def error(self, path: str, message: str) -> None:
        self.problems.append(f"{self.prefix}{path}: {message}")

    def warn(self, path: str, message: str) -> None:
        """Legal input that will not do what the author probably expects."""
        self.warnings.append(f"{self.prefix}{path}: {message}")
