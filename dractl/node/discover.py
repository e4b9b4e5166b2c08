"""`dractl discover`: the ResourceSlices this node would publish, printed, without an API server.

What it does: opens the configured backend (real NVML, or the fake with a profile), reads
the inventory, builds the slices and prints them as YAML documents or a JSON `List`. The
built-in example cluster's node files (`dractl/examples/2*.yaml`) are this output for the
fake profiles listed in `EXAMPLES`, behind a header comment (see `example_text`).

What it must not do: talk to the API server, change anything on the GPUs, or print a
traceback for a missing driver or a bad profile: those are one line on stderr and exit 1.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

import yaml

from dractl import config
from dractl.model import encode, types
from dractl.node import backend, fakegpu, inventory, slices

__all__ = ["open_backend", "build", "render", "run", "Example", "EXAMPLES", "EXAMPLES_DIR", "example_text"]

EXAMPLES_DIR = pathlib.Path(__file__).resolve().parent.parent / "examples"


def open_backend(settings: config.Discover, *, state_file: pathlib.Path | None = None) -> backend.NvmlBackend:
    """The backend `settings` name. Raises `fakegpu.ProfileError`, `fakegpu.StateFileError`
    or `backend.NvmlError` (no driver, no library) with a one-line message."""
    if settings.device_source is config.DeviceSource.FAKE:
        profile = fakegpu.load_profile(settings.fake_profile)
        return fakegpu.FakeGpus(profile, node_name=settings.node_name, state_file=state_file)
    # Imported here so that `dractl discover --device-source fake` never loads libnvidia-ml.
    from dractl.node import nvml

    return nvml.NvmlBackend()


def build(
    settings: config.Discover,
    nvml: backend.NvmlBackend,
    *,
    node_uid: str | None = None,
    generation: int = 1,
    taints: Mapping[str, Sequence[types.DeviceTaint]] | None = None,
) -> tuple[types.ResourceSlice, ...]:
    """Read the inventory from `nvml` and build the slices. Only reads the backend."""
    options = slices.Options(
        node_name=settings.node_name,
        driver_name=settings.driver_name,
        node_uid=node_uid,
        generation=generation,
        mig_mode=settings.mig_mode,
        consumable_memory=settings.consumable_memory,
        taints=dict(taints or {}),
    )
    return slices.build(inventory.read(nvml), options=options)


def render(resource_slices: Sequence[types.ResourceSlice], output: config.OutputFormat) -> str:
    """YAML documents (each starting with `---`) or a JSON `List`. Pure and deterministic."""
    documents = [encode.resource_slice(s) for s in resource_slices]
    if output is config.OutputFormat.JSON:
        return json.dumps({"apiVersion": "v1", "kind": "List", "items": documents}, indent=2) + "\n"
    return "".join("---\n" + _yaml(document) for document in documents)


def _yaml(document: Any) -> str:
    # Flow style for the innermost maps ({string: gpu}, {value: 80Gi}) keeps a device on a
    # screen; block style for the rest keeps diffs line by line.
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    return yaml.dump(document, Dumper=dumper, sort_keys=False, default_flow_style=None, width=120)


def run(settings: config.Discover, *, out: TextIO, err: TextIO) -> int:
    """Print the slices; 0 on success, 1 with one line on `err` when the GPUs cannot be read."""
    try:
        nvml = open_backend(settings)
    except (fakegpu.ProfileError, fakegpu.StateFileError) as error:
        print(f"error: {error}", file=err)
        return 1
    except backend.NvmlError as error:
        print(
            f"error: cannot read GPUs through NVML ({error}); is the NVIDIA driver installed? "
            "Use --device-source fake to try dractl without a GPU.",
            file=err,
        )
        return 1
    try:
        result = build(settings, nvml)
    except backend.NvmlError as error:
        print(f"error: reading GPUs through NVML failed: {error}", file=err)
        return 1
    except slices.SliceError as error:
        print(f"error: {error}", file=err)
        return 1
    finally:
        nvml.close()
    out.write(render(result, settings.output))
    return 0


# --- The example cluster -----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Example:
    """One node file of the built-in example cluster and the discover flags that make it (always
    the fake backend, which is what the file's header says it was generated with)."""

    file: str
    node_name: str
    fake_profile: str
    mig_mode: config.MigMode
    description: str

    @property
    def settings(self) -> config.Discover:
        """`dractl discover`'s settings for this file. Pure."""
        return config.Discover(
            node_name=self.node_name,
            device_source=config.DeviceSource.FAKE,
            fake_profile=self.fake_profile,
            mig_mode=self.mig_mode,
        )


EXAMPLES = (
    Example(
        file="20-dgx-a100-01.yaml",
        node_name="dgx-a100-01",
        fake_profile="a100-80gb-x8",
        mig_mode=config.MigMode.DYNAMIC,
        description="""\
Node dgx-a100-01: 8x NVIDIA A100-SXM4-80GB on one NVSwitch fabric, published as the NVIDIA
DRA driver does with DynamicMIG on Kubernetes >= 1.35: one pool named after the node with 9
slices. The first slice holds only sharedCounters, one counter set per GPU
(gpu-<minor>-counter-set: the per-profile maxima of every engine and of memory, plus
memory-slice-0..7). Then one slice per GPU with the full GPU gpu-<minor> (it consumes the
whole counter set, so it excludes every MIG device of that GPU) and every MIG profile x
placement as gpu-<minor>-mig-<profile without dots>-<GI profile id>-<placement start>, each
consuming its profile's engines, memory and the memory slices its placement covers.
Profiles (A100-SXM4-80GB, GI profile id, placements): 1g.10gb 19 0-6, 1g.20gb 15 0/2/4/6,
2g.20gb 14 0/2/4, 3g.40gb 9 0/4, 4g.40gb 5 0, 7g.80gb 0 0. Dynamic MIG devices have no
uuid until they are created; they carry their parent's uuid as parentUUID. gpuModuleID and
partition8/4/2/1 are the Fabric Manager's NVLink partitions (as on dgx-h100-01).""",
    ),
    Example(
        file="21-dgx-h100-01.yaml",
        node_name="dgx-h100-01",
        fake_profile="h100-80gb-x8",
        mig_mode=config.MigMode.STATIC,
        description="""\
Node dgx-h100-01: 8x NVIDIA H100 80GB HBM3 on one NVSwitch fabric, published with the
driver's FabricManagerPartitioning feature and without DynamicMIG (MIG mode is off): one
slice with every GPU. gpuModuleID is the HGX module (1-8); partition8/4/2/1 are the Fabric
Manager's shared NVLink partition ids that contain the GPU (8 GPUs: 0; 4 GPUs: 1-2; 2 GPUs:
3-6; 1 GPU: 7-14), so matchAttribute on gpu.nvidia.com/partition4 asks for four GPUs of one
NVLink partition.""",
    ),
    Example(
        file="22-t4-node-01.yaml",
        node_name="t4-node-01",
        fake_profile="t4-x2",
        mig_mode=config.MigMode.STATIC,
        description="Node t4-node-01: 2x Tesla T4 (16 GB, Turing, no MIG), one slice with both GPUs.",
    ),
)


def example_text(example: Example) -> str:
    """The full text of an example file: header comment, then `dractl discover`'s output."""
    s = example.settings
    command = (
        f"dractl discover --device-source fake --fake-profile {s.fake_profile} "
        f"--node-name {s.node_name} --mig-mode {s.mig_mode.value}"
    )
    header = [f"# {line}" if line else "#" for line in example.description.splitlines()]
    header += [
        "#",
        "# Generated by the fake GPU backend, do not edit:",
        f"#   {command}",
        "# Regenerate every example node with",
        "#   DRACTL_REGENERATE_EXAMPLES=1 pytest tests/unit/node/test_examples.py",
    ]
    nvml = open_backend(s)
    try:
        body = render(build(s, nvml), config.OutputFormat.YAML)
    finally:
        nvml.close()
    return "\n".join(header) + "\n" + body
