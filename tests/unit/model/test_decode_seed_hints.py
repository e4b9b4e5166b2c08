"""The invalid patterns of the seed articles: each gets a message naming file and field and saying what to write
instead.

The fixtures reproduce the manifests of /work/shared/seeds/ (000 to 004) as users paste them.
"""

from __future__ import annotations

from collections.abc import Callable

from dractl.model import decode

SEED_000_V1_REQUEST_INLINE = """\
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: training-gpu
spec:
  spec:
    devices:
      requests:
      - name: gpu
        deviceClassName: high-memory-gpu
        selectors:
        - cel:
            expression: >
              device.attributes["gpu.nvidia.com"].productName == "NVIDIA A100-SXM4-80GB"
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: shared-inference-gpu
spec:
  devices:
    requests:
    - name: gpu
      deviceClassName: any-nvidia-gpu
"""


def test_seed_000_v1_request_fields_must_move_under_exactly(problems: Callable[..., list[str]]) -> None:
    """Guards: seed 000's v1 requests with deviceClassName/selectors on the request say "move them under `exactly:`"."""
    assert problems(SEED_000_V1_REQUEST_INLINE, file="seed000.yaml") == [
        "seed000.yaml: ResourceClaimTemplate default/training-gpu: spec.spec.devices.requests[0]: deviceClassName, "
        "selectors are not fields "
        "of a resource.k8s.io/v1 request: move them under `exactly:`",
        "seed000.yaml: ResourceClaim default/shared-inference-gpu: spec.devices.requests[0]: "
        "deviceClassName is not a field "
        "of a resource.k8s.io/v1 request: move it under `exactly:`",
    ]


def test_seed_000_workloads_decode_once_fixed() -> None:
    """Guards: seed 000's Job and Deployment (with requests under `exactly:`) decode into pods with their claims."""
    text = """\
apiVersion: batch/v1
kind: Job
metadata: {name: finetune-qwen}
spec:
  template:
    spec:
      restartPolicy: Never
      resourceClaims: [{name: training-gpu, resourceClaimTemplateName: training-gpu}]
      containers:
      - {name: trainer, image: vllm/vllm-openai:latest, resources: {claims: [{name: training-gpu}]}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: mig-inference}
spec:
  replicas: 2
  selector: {matchLabels: {app: mig-inference}}
  template:
    metadata: {labels: {app: mig-inference}}
    spec:
      resourceClaims: [{name: mig-devices, resourceClaimTemplateName: mig-mixed-workload}]
      containers:
      - {name: primary-model, resources: {claims: [{name: mig-devices, request: large-slice}]}}
      - {name: embedding-model, resources: {claims: [{name: mig-devices, request: small-slice}]}}
"""
    pods = decode.load_text(text).pods
    assert [p.meta.name for p in pods] == ["finetune-qwen-0", "mig-inference-0", "mig-inference-1"]
    assert [(c.container, c.request) for c in pods[1].container_claims] == [
        ("primary-model", "large-slice"),
        ("embedding-model", "small-slice"),
    ]


SEED_001_V1ALPHA3 = """\
apiVersion: resource.k8s.io/v1alpha3
kind: ResourceClaim
metadata:
  name: shared-gpu-claim
spec:
  devices:
    requests:
      - deviceClassName: gpu.nvidia.com
        selectors:
          - key: memory
            operator: Gt
            values: ["16000"]   # Request GPU with >16GB memory
---
apiVersion: v1
kind: Pod
metadata:
  name: inference-pod
spec:
  resourceClaims:
    - name: gpu
      source:
        resourceClaimName: shared-gpu-claim
  containers:
    - name: app
      image: my-inference-image
      resources:
        claims:
          - name: gpu
"""


def test_seed_001_v1alpha3_claim_label_selectors_and_pod_source(problems: Callable[..., list[str]]) -> None:
    """Guards: seed 001's v1alpha3 claim, unnamed request, key/operator/values selector and Pod `source:` each say what
    to write."""
    claim = "seed001.yaml: ResourceClaim default/shared-gpu-claim: "
    assert problems(SEED_001_V1ALPHA3, file="seed001.yaml") == [
        claim + "apiVersion: resource.k8s.io/v1alpha3 is no longer served: write apiVersion: resource.k8s.io/v1, "
        "where each request's deviceClassName, selectors, count and allocationMode move under `exactly:`",
        claim + 'spec.devices.requests[0].name: required (a DNS label such as "gpu")',
        claim
        + "spec.devices.requests[0]: deviceClassName, selectors are not fields of a resource.k8s.io/v1 request: move "
        "them under `exactly:`",
        claim + "spec.devices.requests[0].selectors[0]: selectors take CEL, not key/operator/values: write - cel: "
        '{expression: \'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("16000Mi")) > 0\'}',
        "seed001.yaml: Pod default/inference-pod: spec.resourceClaims[0].source: source: was removed from the Pod API: "
        "write resourceClaimName: shared-gpu-claim directly on the entry",
    ]


SEED_002_V1ALPHA2 = """\
apiVersion: resource.k8s.io/v1alpha2
kind: ResourceClass
metadata:
  name: gpu-class
driverName: gpu.resource.example.com
---
apiVersion: resource.k8s.io/v1alpha2
kind: ResourceClaim
metadata:
  name: gpu-claim
  namespace: default
spec:
  resourceClassName: gpu-class
  parametersRef:
    apiGroup: gpu.resource.example.com/v1alpha1
    kind: GpuClaimParameters
    name: high-memory-gpu
---
apiVersion: resource.k8s.io/v1alpha2
kind: ResourceClaimTemplate
metadata:
  name: gpu-template
spec:
  spec:
    resourceClassName: gpu-class
    parametersRef:
      apiGroup: gpu.resource.example.com/v1alpha1
      kind: GpuClaimParameters
      name: high-memory-gpu
---
apiVersion: resource.k8s.io/v1alpha2
kind: ResourceClass
metadata:
  name: shared-gpu-class
driverName: gpu.resource.example.com
suitableNodes:
  nodeSelectorTerms:
  - matchExpressions:
    - key: gpu.present
      operator: Exists
"""

PARAMETERS_GONE = (
    "claim parameters objects are gone from DRA: express the requirements as CEL in "
    "{path}.devices.requests[].exactly.selectors[].cel.expression, "
    'e.g. device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("16Gi")) >= 0'
)


def test_seed_002_v1alpha2_resource_class_and_claim_parameters(problems: Callable[..., list[str]]) -> None:
    """Guards: seed 002's ResourceClass (DeviceClass with a CEL driver selector) and resourceClassName/parametersRef
    claims say what replaces them."""
    cls = "seed002.yaml: ResourceClass gpu-class: "
    claim = "seed002.yaml: ResourceClaim default/gpu-claim: "
    template = "seed002.yaml: ResourceClaimTemplate default/gpu-template: "
    shared = "seed002.yaml: ResourceClass shared-gpu-class: "
    class_gone = (
        "apiVersion: ResourceClass was removed from Kubernetes together with resource.k8s.io/v1alpha2: write a "
        "resource.k8s.io/v1 DeviceClass "
        'with spec.selectors[].cel.expression, e.g. `device.driver == "gpu.resource.example.com"`'
    )
    driver = (
        "driverName: DeviceClass has no driverName: select the driver in CEL: spec.selectors: [{cel: {expression: "
        "'device.driver == \"gpu.resource.example.com\"'}}]"
    )
    assert problems(SEED_002_V1ALPHA2, file="seed002.yaml") == [
        cls + class_gone,
        cls + driver,
        claim + "apiVersion: resource.k8s.io/v1alpha2 is no longer served: write apiVersion: resource.k8s.io/v1 with "
        "spec.devices.requests[].exactly.deviceClassName and CEL selectors",
        claim + "spec.resourceClassName: removed: write spec.devices.requests: [{name: gpu, exactly: {deviceClassName: "
        "gpu-class}}] naming a DeviceClass",
        claim + "spec.parametersRef: " + PARAMETERS_GONE.format(path="spec"),
        template
        + "apiVersion: resource.k8s.io/v1alpha2 is no longer served: write apiVersion: resource.k8s.io/v1 with "
        "spec.spec.devices.requests[].exactly.deviceClassName and CEL selectors",
        template + "spec.spec.resourceClassName: removed: write spec.spec.devices.requests: [{name: gpu, exactly: "
        "{deviceClassName: gpu-class}}] naming a DeviceClass",
        template + "spec.spec.parametersRef: " + PARAMETERS_GONE.format(path="spec.spec"),
        shared + class_gone,
        shared + driver,
        shared + "suitableNodes: removed: nodes come from the driver's ResourceSlices; select devices with "
        "spec.selectors[].cel.expression",
    ]


def test_seed_002_claim_parameters_objects_are_skipped_with_a_hint() -> None:
    """Guards: seed 002's GpuClaimParameters custom resources are skipped, with the hint that CEL replaces them."""
    text = (
        "apiVersion: gpu.resource.example.com/v1alpha1\nkind: GpuClaimParameters\nmetadata: {name: "
        "high-memory-gpu}\nspec: {memory: 16Gi}\n"
    )
    assert decode.load_text(text, file="seed002.yaml").warnings == (
        "seed002.yaml: GpuClaimParameters default/high-memory-gpu: skipped (not used by allocation); "
        + PARAMETERS_GONE.format(path="the claim's spec"),
    )


SEED_003_V1ALPHA3 = """\
apiVersion: resource.k8s.io/v1alpha3
kind: DeviceClass
metadata:
  name: high-memory-gpu
spec:
  selectors:
  - cel:
      expression: |
        device.driver == "nvidia.com/gpu" &&
        device.attributes["memory"].quantity().value() >= 24000000000
---
apiVersion: resource.k8s.io/v1alpha3
kind: ResourceClaim
metadata:
  name: transformer-training-gpu
  namespace: ml-research
spec:
  devices:
    requests:
    - name: primary-gpu
      deviceClassName: high-memory-gpu
      count: 1
    constraints:
    - cel:
        expression: 'device.attributes["cuda-version"].string() >= "12.0"'
---
apiVersion: resource.k8s.io/v1alpha3
kind: ResourceSlice
metadata:
  name: node-gpu-worker-01
spec:
  nodeName: gpu-worker-01
  pool:
    name: nvidia-driver-pool
    resourceSliceCount: 1
  devices:
  - name: gpu-0
    basic:
      attributes:
        memory: "24GB"
        cuda-version: "12.2"
        pcie-generation: "4"
      capacity:
        nvidia.com/gpu: "1"
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: research-training
  namespace: research
spec:
  template:
    spec:
      resourceClaimTemplates:
      - metadata:
          name: research-gpu-claim
        spec:
          devices:
            requests:
            - name: gpu
              deviceClassName: research-gpu
              count: 2
      containers:
      - name: trainer
        image: pytorch/pytorch:nightly
        resources:
          claims:
          - name: research-gpu-claim
"""


def test_seed_003_v1alpha3_shapes_constraint_cel_plain_attributes_and_inline_templates(
    problems: Callable[..., list[str]],
) -> None:
    """Guards: seed 003's v1alpha3 objects, `cel:` constraint, `basic:` wrapper, plain attribute/capacity values and
    pod-level templates each say what to write."""
    gone = "apiVersion: resource.k8s.io/v1alpha3 is no longer served: write apiVersion: resource.k8s.io/v1"
    claim = "seed003.yaml: ResourceClaim ml-research/transformer-training-gpu: "
    rslice = "seed003.yaml: ResourceSlice node-gpu-worker-01: "
    attrs = "spec.devices[0].basic.attributes"
    deploy = "seed003.yaml: Deployment research/research-training: "
    assert problems(SEED_003_V1ALPHA3, file="seed003.yaml") == [
        "seed003.yaml: DeviceClass high-memory-gpu: " + gone + " (spec.selectors[].cel.expression keeps its shape)",
        claim
        + gone
        + ", where each request's deviceClassName, selectors, count and allocationMode move under `exactly:`",
        claim + "spec.devices.requests[0]: deviceClassName, "
        "count are not fields of a resource.k8s.io/v1 request: move them under `exactly:`",
        claim
        + "spec.devices.constraints[0].cel: constraints only support matchAttribute and distinctAttribute: put the "
        "expression under "
        "the request's selectors, spec.devices.requests[0].exactly.selectors: [{cel: {expression: ...}}]",
        rslice
        + gone
        + ", where the `basic:` wrapper of devices is gone (attributes and capacity sit on the device), attributes "
        "take typed values "
        'such as {string: "..."}, {int: ...}, {version: "..."}, and capacity entries are {value: <quantity>}',
        rslice + "spec.driver: required (the DRA driver's name, e.g. gpu.nvidia.com)",
        rslice
        + "spec.devices[0].basic: the basic: wrapper is gone in resource.k8s.io/v1: move its attributes and capacity "
        "up into the device",
        rslice
        + f'{attrs}[memory]: "24GB" is a plain value; a size belongs in the device\'s capacity: memory: {{value: 24G}} '
        '(or write memory: {string: "24GB"})',
        rslice
        + f"{attrs}[cuda-version]: \"cuda-version\" is not a C identifier: at most 32 letters, digits and '_', not "
        "starting with a digit (e.g. cudaVersion)",
        rslice + f'{attrs}[cuda-version]: "12.2" is a plain value; attributes are typed: write cudaVersion: {{version: '
        '"12.2.0"} '
        "({string: ...}, {int: ...}, {bool: ...} or {version: ...})",
        rslice
        + f"{attrs}[pcie-generation]: \"pcie-generation\" is not a C identifier: at most 32 letters, digits and '_', "
        "not starting with a digit (e.g. pcieGeneration)",
        rslice
        + f'{attrs}[pcie-generation]: "4" is a plain value; attributes are typed: write pcieGeneration: {{int: 4}} '
        "({string: ...}, {int: ...}, {bool: ...} or {version: ...})",
        rslice
        + "spec.devices[0].basic.capacity[nvidia.com/gpu]: capacity entries are objects: write nvidia.com/gpu: {value: "
        '"1"}',
        deploy + "spec.template.spec.resourceClaimTemplates: not a Pod field: create a resource.k8s.io/v1 "
        "ResourceClaimTemplate object named "
        "research-gpu-claim and reference it with spec.template.spec.resourceClaims: [{name: research-gpu-claim, "
        "resourceClaimTemplateName: research-gpu-claim}]",
        deploy + 'spec.template.spec.containers[0].resources.claims[0].name: "research-gpu-claim" is not in '
        "spec.template.spec.resourceClaims: "
        "add {name: research-gpu-claim, resourceClaimTemplateName: <template>} (or resourceClaimName) there",
    ]


SEED_004_V1ALPHA2 = """\
apiVersion: resource.k8s.io/v1alpha2
kind: ResourceClass
metadata:
  name: gpu.nvidia.com
structuredParameters: true
driverName: gpu.nvidia.com
---
apiVersion: resource.k8s.io/v1alpha2
kind: ResourceClaim
metadata:
  name: training-gpus
spec:
  resourceClassName: gpu.nvidia.com
  parameters:
    apiVersion: gpu.resource.nvidia.com/v1alpha1
    kind: GpuClaimParameters
    count: 4
---
apiVersion: scheduling.x-k8s.io/v1alpha1
kind: PodGroup
metadata:
  name: distributed-training
spec:
  minMember: 8
"""


def test_seed_004_structured_parameters_driver_name_and_inline_parameters(problems: Callable[..., list[str]]) -> None:
    """Guards: seed 004's driverName/structuredParameters ResourceClass and inline claim parameters
    say what replaces them."""
    cls = "seed004.yaml: ResourceClass gpu.nvidia.com: "
    claim = "seed004.yaml: ResourceClaim default/training-gpus: "
    assert problems(SEED_004_V1ALPHA2, file="seed004.yaml") == [
        cls + "apiVersion: ResourceClass was removed from Kubernetes together with resource.k8s.io/v1alpha2: write a "
        "resource.k8s.io/v1 DeviceClass "
        'with spec.selectors[].cel.expression, e.g. `device.driver == "gpu.nvidia.com"`',
        cls
        + "driverName: DeviceClass has no driverName: select the driver in CEL: spec.selectors: [{cel: {expression: "
        "'device.driver == \"gpu.nvidia.com\"'}}]",
        cls
        + "structuredParameters: removed: every v1 driver publishes its devices in ResourceSlices; delete this field",
        claim + "apiVersion: resource.k8s.io/v1alpha2 is no longer served: write apiVersion: resource.k8s.io/v1 with "
        "spec.devices.requests[].exactly.deviceClassName and CEL selectors",
        claim + "spec.resourceClassName: removed: write spec.devices.requests: [{name: gpu, exactly: {deviceClassName: "
        "gpu.nvidia.com}}] naming a DeviceClass",
        claim + "spec.parameters: " + PARAMETERS_GONE.format(path="spec"),
    ]


def test_v1alpha2_fields_in_a_v1_claim_are_explained(problems: Callable[..., list[str]]) -> None:
    """Guards: resourceClassName/parametersRef pasted into a v1 claim get the same replacement hints as in v1alpha2."""
    text = (
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: c}\nspec:\n  resourceClassName: "
        "gpu\n  parametersRef: {name: p}\n"
    )
    assert problems(text) == [
        "m.yaml: ResourceClaim default/c: spec.resourceClassName: removed with resource.k8s.io/v1alpha2: name a "
        "DeviceClass in spec.devices.requests[].exactly.deviceClassName",
        "m.yaml: ResourceClaim default/c: spec.parametersRef: " + PARAMETERS_GONE.format(path="spec"),
    ]


def test_plain_attribute_values_get_typed_suggestions(problems: Callable[..., list[str]]) -> None:
    """Guards: plain bool, int, string and version attribute values each get the matching typed spelling."""
    text = """\
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {name: s}
spec:
  driver: gpu.nvidia.com
  nodeName: n1
  pool: {name: n1, resourceSliceCount: 1}
  devices:
  - name: gpu-0
    attributes:
      mig: true
      index: 3
      productName: Tesla T4
      driverVersion: v550.54
"""
    prefix = "m.yaml: ResourceSlice s: spec.devices[0].attributes"
    kinds = "({string: ...}, {int: ...}, {bool: ...} or {version: ...})"
    assert problems(text) == [
        f"{prefix}[mig]: true is a plain value; attributes are typed: write mig: {{bool: true}} {kinds}",
        f"{prefix}[index]: 3 is a plain value; attributes are typed: write index: {{int: 3}} {kinds}",
        f'{prefix}[productName]: "Tesla T4" is a plain value; attributes are typed: write productName: {{string: '
        f'"Tesla T4"}} {kinds}',
        f'{prefix}[driverVersion]: "v550.54" is a plain value; attributes are typed: write driverVersion: {{version: '
        f'"550.54.0"}} {kinds}',
    ]


def test_device_plugin_limits_are_warned_about() -> None:
    """Guards: seeds 000/003's "old way" `nvidia.com/gpu` limits decode,
    with a warning saying how DRA requests a GPU."""
    text = """\
apiVersion: v1
kind: Pod
metadata: {name: old-way}
spec:
  nodeSelector: {accelerator: nvidia-tesla-k80}
  containers:
  - name: training
    resources:
      limits: {nvidia.com/gpu: 1}
"""
    objects = decode.load_text(text, file="seed003.yaml")
    assert objects.pods[0].resource_claims == ()
    assert objects.warnings == (
        "seed003.yaml: Pod default/old-way: spec.containers[0].resources.limits[nvidia.com/gpu]: a device-plugin "
        "resource, not allocated by DRA: "
        "request the GPU with a ResourceClaimTemplate (exactly: {deviceClassName: gpu.nvidia.com}), reference it in "
        "spec.resourceClaims "
        "and list it in resources.claims",
    )


def test_claim_devices_in_resource_field_ref_are_refused(problems: Callable[..., list[str]]) -> None:
    """Guards: seed 003's `resourceFieldRef: {resource: claims/<claim>/devices}` env says the driver injects devices
    through CDI."""
    text = """\
apiVersion: v1
kind: Pod
metadata: {name: trainer}
spec:
  resourceClaims: [{name: research-gpu-claim, resourceClaimTemplateName: research-gpu}]
  containers:
  - name: trainer
    resources: {claims: [{name: research-gpu-claim}]}
    env:
    - name: CUDA_VISIBLE_DEVICES
      valueFrom: {resourceFieldRef: {resource: claims/research-gpu-claim/devices}}
"""
    assert problems(text, file="seed003.yaml") == [
        "seed003.yaml: Pod default/trainer: spec.containers[0].env[0].valueFrom.resourceFieldRef.resource: "
        '"claims/research-gpu-claim/devices" '
        "is not a container resource: the DRA driver injects the allocated devices (and NVIDIA_VISIBLE_DEVICES) "
        "through CDI; delete this env entry",
    ]
