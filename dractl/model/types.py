"""`resource.k8s.io/v1` objects and the Pod/Node fields the allocator needs, as plain values.

Every type is a frozen, slotted dataclass with the API's defaults already applied (the
decoder applies them). Mappings are plain dicts that nobody mutates after decoding.
Field names are the API's, in snake_case. Pure: no I/O, no validation (see `decode`).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any

from dractl.model import quantity, semver

__all__ = [
    "Source",
    "ObjectMeta",
    "NodeSelectorRequirement",
    "NodeSelectorTerm",
    "NodeSelector",
    "AttributeKind",
    "AttributeScalar",
    "DeviceAttribute",
    "CapacityRequestPolicyRange",
    "CapacityRequestPolicy",
    "DeviceCapacity",
    "DeviceCounterConsumption",
    "CounterSet",
    "TaintEffect",
    "DeviceTaint",
    "Device",
    "ResourcePool",
    "ResourceSlice",
    "OpaqueDeviceConfiguration",
    "DeviceClass",
    "AllocationMode",
    "DeviceToleration",
    "ExactDeviceRequest",
    "DeviceSubRequest",
    "DeviceRequest",
    "DeviceConstraint",
    "DeviceClaimConfiguration",
    "ResourceClaimSpec",
    "DeviceRequestAllocationResult",
    "DeviceAllocationConfiguration",
    "AllocationResult",
    "ResourceClaimConsumerReference",
    "ResourceClaim",
    "ResourceClaimTemplate",
    "PodResourceClaim",
    "ContainerClaim",
    "POD_GROUP_LABEL",
    "PodGroupApi",
    "PodGroupRef",
    "PodGroup",
    "Pod",
    "Node",
    "Objects",
    "Decoded",
]


@dataclasses.dataclass(frozen=True, slots=True)
class Source:
    """Where an object came from, for messages: `claims.yaml` and the document index."""

    file: str = "<input>"
    document: int = 0

    def __str__(self) -> str:
        return self.file


@dataclasses.dataclass(frozen=True, slots=True)
class ObjectMeta:
    """The metadata fields dractl reads and writes back; `namespace` is "" for cluster-scoped objects."""

    name: str
    namespace: str = ""
    uid: str = ""
    generate_name: str = ""
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    annotations: Mapping[str, str] = dataclasses.field(default_factory=dict)
    resource_version: str = ""
    generation: int = 0
    finalizers: tuple[str, ...] = ()
    owner_references: tuple[Mapping[str, Any], ...] = ()
    deletion_timestamp: str | None = None


# --- Node selection (core/v1 NodeSelector) -------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class NodeSelectorRequirement:
    """One core/v1 node selector requirement: a label (or field) key, an operator and its values."""

    key: str
    operator: str  # In, NotIn, Exists, DoesNotExist, Gt, Lt
    values: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class NodeSelectorTerm:
    """One core/v1 node selector term: its label and field requirements, all of which must match."""

    match_expressions: tuple[NodeSelectorRequirement, ...] = ()
    match_fields: tuple[NodeSelectorRequirement, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class NodeSelector:
    """Terms are ORed; requirements inside a term are ANDed."""

    terms: tuple[NodeSelectorTerm, ...]


# --- Device attributes and capacity --------------------------------------------------------


class AttributeKind(enum.Enum):
    INT = "int"
    BOOL = "bool"
    STRING = "string"
    VERSION = "version"


AttributeScalar = int | bool | str | semver.Semver


@dataclasses.dataclass(frozen=True, slots=True)
class DeviceAttribute:
    """Exactly one typed value. `is_list` marks the list-typed variants (`ints`, `strings`, ...).

    For a scalar, `values` holds one element. Versions are parsed `Semver` values and
    `text` keeps the spelling (upstream compares versions in constraints as strings).
    """

    kind: AttributeKind
    values: tuple[AttributeScalar, ...]
    is_list: bool = False
    texts: tuple[str, ...] = ()

    @property
    def scalar(self) -> AttributeScalar:
        return self.values[0]


@dataclasses.dataclass(frozen=True, slots=True)
class CapacityRequestPolicyRange:
    """The amounts a request may take from a shared capacity: from `min`, up to `max`, in `step`s."""

    min: quantity.Quantity
    max: quantity.Quantity | None = None
    step: quantity.Quantity | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class CapacityRequestPolicy:
    """How much of a shared capacity a request takes by default and which amounts it may ask for."""

    default: quantity.Quantity | None = None
    valid_values: tuple[quantity.Quantity, ...] = ()
    valid_range: CapacityRequestPolicyRange | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class DeviceCapacity:
    """One capacity of a device, e.g. its memory, and how requests may share it."""

    value: quantity.Quantity
    request_policy: CapacityRequestPolicy | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class DeviceCounterConsumption:
    """The counters a device uses up, by name, from one counter set of its pool."""

    counter_set: str
    counters: Mapping[str, quantity.Quantity]


@dataclasses.dataclass(frozen=True, slots=True)
class CounterSet:
    """A named set of counters a slice shares between the devices of its pool."""

    name: str
    counters: Mapping[str, quantity.Quantity]


class TaintEffect(enum.Enum):
    NONE = "None"
    NO_SCHEDULE = "NoSchedule"
    NO_EXECUTE = "NoExecute"


@dataclasses.dataclass(frozen=True, slots=True)
class DeviceTaint:
    """A taint on a device: claims that do not tolerate it do not get the device."""

    key: str
    value: str = ""
    effect: str = "NoSchedule"  # kept as text: unknown effects are treated like None
    time_added: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Device:
    """One device of a slice. Attribute and capacity keys are as published: a bare C
    identifier belongs to the slice's driver domain, `domain/id` to its own domain."""

    name: str
    attributes: Mapping[str, DeviceAttribute] = dataclasses.field(default_factory=dict)
    capacity: Mapping[str, DeviceCapacity] = dataclasses.field(default_factory=dict)
    consumes_counters: tuple[DeviceCounterConsumption, ...] = ()
    node_name: str | None = None
    node_selector: NodeSelector | None = None
    all_nodes: bool = False
    taints: tuple[DeviceTaint, ...] = ()
    binds_to_node: bool = False
    binding_conditions: tuple[str, ...] = ()
    binding_failure_conditions: tuple[str, ...] = ()
    allow_multiple_allocations: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class ResourcePool:
    """The pool a slice belongs to, with its generation and how many slices it has."""

    name: str
    generation: int = 0
    resource_slice_count: int = 1


@dataclasses.dataclass(frozen=True, slots=True)
class ResourceSlice:
    """A ResourceSlice: devices of one driver's pool, and the nodes that can use them."""

    meta: ObjectMeta
    driver: str
    pool: ResourcePool
    node_name: str | None = None
    node_selector: NodeSelector | None = None
    all_nodes: bool = False
    per_device_node_selection: bool = False
    devices: tuple[Device, ...] = ()
    shared_counters: tuple[CounterSet, ...] = ()
    source: Source = Source()


# --- DeviceClass -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class OpaqueDeviceConfiguration:
    """Driver-specific configuration, passed to the driver as written."""

    driver: str
    parameters: Any  # a JSON object, kept as decoded


@dataclasses.dataclass(frozen=True, slots=True)
class DeviceClass:
    """A DeviceClass: selectors every device of the class matches, and configuration for its devices."""

    meta: ObjectMeta
    selectors: tuple[str, ...] = ()  # CEL expressions, in order
    config: tuple[OpaqueDeviceConfiguration, ...] = ()
    extended_resource_name: str | None = None
    source: Source = Source()


# --- ResourceClaim -------------------------------------------------------------------------


class AllocationMode(enum.Enum):
    EXACT_COUNT = "ExactCount"
    ALL = "All"


@dataclasses.dataclass(frozen=True, slots=True)
class DeviceToleration:
    """A toleration of device taints, as in a request."""

    key: str = ""
    operator: str = "Equal"  # Equal or Exists
    value: str = ""
    effect: str = ""  # empty matches every effect
    toleration_seconds: int | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class ExactDeviceRequest:
    """A request for devices of one class: how many, which (selectors), and with what capacity."""

    device_class_name: str
    selectors: tuple[str, ...] = ()
    allocation_mode: AllocationMode = AllocationMode.EXACT_COUNT
    count: int = 1  # 0 in All mode
    admin_access: bool | None = None
    tolerations: tuple[DeviceToleration, ...] = ()
    capacity_requests: Mapping[str, quantity.Quantity] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, slots=True)
class DeviceSubRequest:
    """One alternative of a `firstAvailable` request, tried in order."""

    name: str
    device_class_name: str
    selectors: tuple[str, ...] = ()
    allocation_mode: AllocationMode = AllocationMode.EXACT_COUNT
    count: int = 1
    tolerations: tuple[DeviceToleration, ...] = ()
    capacity_requests: Mapping[str, quantity.Quantity] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, slots=True)
class DeviceRequest:
    """Exactly one of `exactly` and `first_available` is set."""

    name: str
    exactly: ExactDeviceRequest | None = None
    first_available: tuple[DeviceSubRequest, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class DeviceConstraint:
    """Exactly one of `match_attribute` and `distinct_attribute` is set (fully qualified)."""

    requests: tuple[str, ...] = ()  # empty: every request
    match_attribute: str | None = None
    distinct_attribute: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class DeviceClaimConfiguration:
    """Configuration a claim gives the drivers for some (or all) of its requests."""

    requests: tuple[str, ...]
    opaque: OpaqueDeviceConfiguration


@dataclasses.dataclass(frozen=True, slots=True)
class ResourceClaimSpec:
    """What a claim asks for: its requests, the constraints between them, and their configuration."""

    requests: tuple[DeviceRequest, ...] = ()
    constraints: tuple[DeviceConstraint, ...] = ()
    config: tuple[DeviceClaimConfiguration, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class DeviceRequestAllocationResult:
    """One device allocated to a request, as `status.allocation.devices.results` holds it."""

    request: str  # "req" or "req/sub"
    driver: str
    pool: str
    device: str
    admin_access: bool | None = None  # only True is ever recorded
    tolerations: tuple[DeviceToleration, ...] = ()
    binding_conditions: tuple[str, ...] = ()
    binding_failure_conditions: tuple[str, ...] = ()
    share_id: str | None = None
    consumed_capacity: Mapping[str, quantity.Quantity] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, slots=True)
class DeviceAllocationConfiguration:
    """Configuration recorded with an allocation, from the device class or from the claim."""

    source: str  # FromClass or FromClaim
    requests: tuple[str, ...]  # empty: every request
    opaque: OpaqueDeviceConfiguration


@dataclasses.dataclass(frozen=True, slots=True)
class AllocationResult:
    """A claim's `status.allocation`: its devices, their configuration, and the nodes that can use them."""

    results: tuple[DeviceRequestAllocationResult, ...] = ()
    config: tuple[DeviceAllocationConfiguration, ...] = ()
    node_selector: NodeSelector | None = None
    allocation_timestamp: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class ResourceClaimConsumerReference:
    """A consumer in a claim's `status.reservedFor`, usually a pod."""

    resource: str
    name: str
    uid: str
    api_group: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class ResourceClaim:
    """A ResourceClaim: its spec, and its allocation and consumers when it has them."""

    meta: ObjectMeta
    spec: ResourceClaimSpec
    allocation: AllocationResult | None = None
    reserved_for: tuple[ResourceClaimConsumerReference, ...] = ()
    source: Source = Source()

    @property
    def key(self) -> str:
        return f"{self.meta.namespace}/{self.meta.name}"


@dataclasses.dataclass(frozen=True, slots=True)
class ResourceClaimTemplate:
    """A ResourceClaimTemplate: the spec, labels and annotations of the claims made from it."""

    meta: ObjectMeta
    spec: ResourceClaimSpec
    claim_labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    claim_annotations: Mapping[str, str] = dataclasses.field(default_factory=dict)
    source: Source = Source()


# --- core/v1 Pod and Node (only what allocation needs) ---------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class PodResourceClaim:
    """Exactly one of the two names is set."""

    name: str
    resource_claim_name: str | None = None
    resource_claim_template_name: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class ContainerClaim:
    """A container's use of a pod claim (`resources.claims`), optionally of one request of it."""

    container: str
    name: str
    request: str = ""


POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
"""The label by which a pod joins a `scheduling.x-k8s.io/v1alpha1` PodGroup."""


class PodGroupApi(enum.Enum):
    """The two PodGroup APIs; the value is the apiVersion."""

    # Kubernetes 1.36's own (alpha): pods join with `spec.schedulingGroup.podGroupName`.
    WORKLOAD = "scheduling.k8s.io/v1alpha2"
    # scheduler-plugins' coscheduling CRD: pods join with the label `scheduling.x-k8s.io/pod-group`.
    COSCHEDULING = "scheduling.x-k8s.io/v1alpha1"


@dataclasses.dataclass(frozen=True, slots=True)
class PodGroupRef:
    """The PodGroup a pod joins, in its namespace, and the API of the field that names it."""

    name: str
    api: PodGroupApi


@dataclasses.dataclass(frozen=True, slots=True)
class PodGroup:
    """A PodGroup of either API: pods scheduled as one decision.

    `min_count` is the gang's minimum (v1alpha2 `schedulingPolicy.gang.minCount`, v1alpha1
    `minMember`); None for v1alpha2's `basic` policy, whose pods need no minimum. `topology_key`
    is the node label all its pods share a value of (v1alpha2 only; at most one in 1.36).
    `resource_claims` are the claims of the group itself (v1alpha2), shared by its pods.
    """

    meta: ObjectMeta
    api: PodGroupApi
    min_count: int | None = None
    topology_key: str | None = None
    resource_claims: tuple[PodResourceClaim, ...] = ()
    schedule_timeout_seconds: int | None = None
    min_resources: Mapping[str, quantity.Quantity] = dataclasses.field(default_factory=dict)
    source: Source = Source()

    @property
    def key(self) -> str:
        return f"{self.meta.namespace}/{self.meta.name}"


@dataclasses.dataclass(frozen=True, slots=True)
class Pod:
    """The fields of a Pod that allocation needs: its claims, its node, its scheduler and its PodGroup."""

    meta: ObjectMeta
    resource_claims: tuple[PodResourceClaim, ...] = ()
    container_claims: tuple[ContainerClaim, ...] = ()
    node_name: str = ""  # spec.nodeName
    node_selector: Mapping[str, str] = dataclasses.field(default_factory=dict)  # spec.nodeSelector
    scheduler_name: str = "default-scheduler"
    pod_group: PodGroupRef | None = None
    source: Source = Source()


@dataclasses.dataclass(frozen=True, slots=True)
class Node:
    """A Node: its name and labels, which node selectors match."""

    meta: ObjectMeta
    source: Source = Source()


Decoded = DeviceClass | ResourceSlice | ResourceClaim | ResourceClaimTemplate | Pod | Node
"""Any one object of the kinds the model decodes."""


@dataclasses.dataclass(frozen=True, slots=True)
class Objects:
    """Everything decoded from a set of manifests, each kind in input order."""

    device_classes: tuple[DeviceClass, ...] = ()
    resource_slices: tuple[ResourceSlice, ...] = ()
    resource_claims: tuple[ResourceClaim, ...] = ()
    resource_claim_templates: tuple[ResourceClaimTemplate, ...] = ()
    pods: tuple[Pod, ...] = ()
    nodes: tuple[Node, ...] = ()
    pod_groups: tuple[PodGroup, ...] = ()
    warnings: tuple[str, ...] = ()  # e.g. kinds that were skipped, with file and name
