"""Every selector of decoded objects is compiled up front, and each one that does not compile is named by file, object
and field."""

from dractl import cel, model
from dractl.model import decode

MANIFESTS = """
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: big}
spec:
  selectors:
  - cel: {expression: 'device.driver == "gpu.nvidia.com"'}
  - cel: {expression: 'device.capacity["gpu.nvidia.com"].memory >= quantity("40Gi")'}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: train, namespace: ml}
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: big
        selectors:
        - cel: {expression: 'device.attributes["gpu.nvidia.com"].productName == "A100"'}
    - name: any
      firstAvailable:
      - name: small
        deviceClassName: big
        selectors:
        - cel: {expression: 'device.attributes["gpu.nvidia.com"].nope +'}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: tmpl}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: big
          selectors:
          - cel: {expression: 'undeclared == 1'}
"""


def test_problems_name_file_object_and_field() -> None:
    """Guards: class, claim and template selectors (exactly and firstAvailable) are all checked, each problem with its
    full path and the fix."""
    objects = decode.load_text(MANIFESTS, file="cluster.yaml")
    found = cel.problems(objects)
    assert len(found) == 3
    assert found[0].startswith("cluster.yaml: DeviceClass big: spec.selectors[1].cel.expression: CEL expression")
    assert 'write instead: device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0' in found[0]
    assert found[1].startswith(
        "cluster.yaml: ResourceClaim ml/train: spec.devices.requests[1].firstAvailable[0].selectors[0].cel.expression:"
    )
    assert found[2].startswith(
        "cluster.yaml: ResourceClaimTemplate default/tmpl: "
        "spec.spec.devices.requests[0].exactly.selectors[0].cel.expression:"
    )
    assert "undeclared" in found[2]


def test_no_problems_for_valid_selectors() -> None:
    """Guards: valid selectors produce no problem at all."""
    objects = model.Objects(
        device_classes=(
            model.DeviceClass(meta=model.ObjectMeta(name="ok"), selectors=('device.driver == "gpu.nvidia.com"',)),
        )
    )
    assert cel.problems(objects) == ()
