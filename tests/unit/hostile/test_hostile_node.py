"""Hostile input to the node modes (`dractl discover`, `dractl node-agent`): fake GPU profiles, names and directories.

Each gets one line naming the file and field (or the flag), exit 1 or 2, in bounded time and memory, never a
traceback. Big inputs (thousands of digits, an alias bomb) are generated at test time.
"""

from __future__ import annotations

import dataclasses
import pathlib

import pytest
from click.testing import CliRunner, Result

from dractl import cli
from dractl.model import semver
from dractl.node import cdi, fakegpu, health, inventory, mig, slices
from dractl.simulate import trace

pytestmark = pytest.mark.timeout(60)

PROFILE = """\
driverVersion: {driver}
cudaDriverVersion: "13.0"
gpus:
- {{model: tesla-t4, pciBusID: "0000:07:00.0", numaNode: {numa}}}
"""

MIG_PROFILE = """\
driverVersion: 580.126.20
cudaDriverVersion: "13.0"
models:
  odd:
    productName: Odd
    architecture: Ampere
    cudaComputeCapability: "8.0"
    memory: 81920Mi
    multiprocessors: 108
    migProfiles:
    - {{id: 19, name: 1g.10gb, slices: 1, memory: 9728Mi, multiprocessors: 14, placementSize: {size},
       placements: [{start}]}}
gpus:
- {{model: odd, pciBusID: "0000:07:00.0", migMode: enabled}}
"""


def _alias_bomb() -> str:
    """A profile whose aliases expand to 10^9 values (a "billion laughs") in a field nobody reads before the parse."""
    lines = ["l0: &l0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, 9)]
    return "\n".join(lines) + "\n" + PROFILE.format(driver="580.126.20", numa=0)


def _discover(profile: pathlib.Path, *args: str) -> Result:
    return CliRunner().invoke(
        cli.main,
        ["discover", "--device-source", "fake", "--fake-profile", str(profile), "--node-name", "n1", *args],
        catch_exceptions=False,
    )


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (PROFILE.format(driver="580.126.20", numa="2026-02-30"), "gpus[0].numaNode: must be an integer, got a string"),
        (
            PROFILE.format(driver="2026-02-30", numa=0),
            "driverVersion: '2026-02-30' is not valid (expected e.g. 580.126.20)",
        ),
        (
            PROFILE.format(driver="580.126.20", numa="!!int abc"),
            "line 4, column 57: YAML syntax error: cannot decode !!str `abc` as a !!int",
        ),
        (PROFILE.format(driver="580.126.20", numa="9" * 5000), "gpus[0].numaNode: must be an integer, got a string"),
        (
            PROFILE.format(driver='"580.126.20\\n"', numa=0),
            "driverVersion: '580.126.20\\n' is not valid (expected e.g. 580.126.20)",
        ),
        (_alias_bomb(), "document 1 (line 1): aliases expand to more than 1000000 values (an alias bomb)"),
        (
            MIG_PROFILE.format(size=10**12, start=0),
            "models.odd.migProfiles[0].placementSize: must be <= 8, got 1000000000000",
        ),
        (
            MIG_PROFILE.format(size=4, start=8),
            "models.odd.migProfiles[0].placements[0]: start 8 + placementSize 4 passes the GPU's 8 memory slices",
        ),
    ],
    ids=[
        "bad-date",
        "date-as-version",
        "int-tag-on-text",
        "5000-digit-number",
        "version-with-trailing-newline",
        "alias-bomb",
        "placement-size-10^12",
        "placement-past-the-slices",
    ],
)
def test_a_hostile_fake_profile_is_one_line_naming_the_file_and_field(
    text: str, problem: str, tmp_path: pathlib.Path
) -> None:
    """Guards: a fake profile with a bad date, a tag on text, thousands of digits, an alias bomb or a MIG placement of
    10^12 memory slices (which spun for ever) is one line naming the file and the field, exit 1, no traceback."""
    profile = tmp_path / "profile.yaml"
    profile.write_text(text)
    result = _discover(profile, "--mig-mode", "dynamic")
    assert (result.exit_code, result.stdout) == (1, "")
    assert result.stderr == f"error: {profile}: {problem}\n"


def test_the_node_agent_refuses_a_hostile_fake_profile_with_one_line(
    tmp_path: pathlib.Path, sock_dir: pathlib.Path
) -> None:
    """Guards: `dractl node-agent` reads a fake profile as discover does: a MIG placement of 10^12 memory slices is one
    line naming the file and field, exit 1, before anything is served."""
    profile = tmp_path / "profile.yaml"
    profile.write_text(MIG_PROFILE.format(size=10**12, start=0))
    args = ["--node-name", "n1", "--device-source", "fake", "--fake-profile", str(profile), "--mig-mode", "dynamic"]
    args += ["--state-dir", str(tmp_path / "state"), "--cdi-root", str(tmp_path / "cdi"), "--health-port", "-1"]
    args += ["--kubelet-registrar-dir", str(sock_dir / "reg"), "--kubelet-plugins-dir", str(sock_dir / "plugins")]
    result = CliRunner().invoke(cli.main, ["node-agent", *args, "--metrics-port", "-1"], catch_exceptions=False)
    assert result.exit_code == 1
    assert result.stderr == (
        f"dractl node-agent: error: {profile}: models.odd.migProfiles[0].placementSize: must be <= 8, got "
        "1000000000000\n"
    )
    assert not (sock_dir / "plugins").exists()


def test_a_fake_profile_of_many_gpus_orders_them_by_bus_as_nvml_does() -> None:
    """Guards the fake's GPU index (NVML's enumeration order, by PCI bus) on a profile of thousands of GPUs whose
    minors run against the bus order, as the linear lookup that replaced a search per GPU builds it."""
    model = fakegpu.load_profile("t4-x2").gpus[0].model
    count = 3000
    specs = tuple(
        fakegpu.GpuSpec(model=model, minor=count - 1 - i, pci_bus_id=f"{i // 256:04x}:{i % 256:02x}:00.0")
        for i in range(count)
    )
    profile = fakegpu.Profile(name="many", driver_version="580.126.20", cuda_driver_version="13.0", gpus=specs)
    gpus = fakegpu.FakeGpus(profile, node_name="n1").gpus()
    assert [(gpu.minor, gpu.index) for gpu in gpus] == [(minor, count - 1 - minor) for minor in range(count)]


# --- Names and directories of the node agent ------------------------------------------------------------


@pytest.fixture
def dirs(sock_dir: pathlib.Path) -> list[str]:
    return [
        "--device-source",
        "fake",
        "--kubelet-registrar-dir",
        str(sock_dir / "reg"),
        "--kubelet-plugins-dir",
        str(sock_dir / "plugins"),
        "--cdi-root",
        str(sock_dir / "cdi"),
        "--state-dir",
        str(sock_dir / "state"),
        "--health-port",
        "-1",
        "--metrics-port",
        "-1",
    ]


def _agent(*args: str) -> Result:
    return CliRunner().invoke(cli.main, ["node-agent", *args], catch_exceptions=False)


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["--node-name", "n1\n"],
            "node name 'n1\\n' is not a DNS subdomain (lowercase letters, digits, '-' and '.'): set --node-name to the "
            "Node's name",
        ),
        (
            ["--node-name", "n1", "--driver-name", "gpu.nvidia.com\n"],
            "driver name 'gpu.nvidia.com\\n' is not a DNS subdomain of at most 63 characters such as gpu.nvidia.com: "
            "check --driver-name",
        ),
        (
            ["--node-name", "n1", "--pod-uid", "0f6c4c3e\n"],
            "--pod-uid '0f6c4c3e\\n' must be letters, digits, '.', '_' and '-' (the pod's metadata.uid)",
        ),
    ],
    ids=["node-name", "driver-name", "pod-uid"],
)
def test_a_name_with_a_trailing_newline_is_refused_naming_the_flag(
    args: list[str], line: str, dirs: list[str], sock_dir: pathlib.Path
) -> None:
    """Guards: a trailing newline in --node-name, --driver-name or --pod-uid (`$` matched before it, so a pool named
    `n1\\n` was published) is one line naming the flag, exit 1, before any state is written."""
    result = _agent(*dirs, *args)
    assert (result.exit_code, result.stderr) == (1, f"dractl node-agent: error: {line}\n")
    assert not (sock_dir / "state").exists()


def test_discover_refuses_a_node_name_with_a_trailing_newline() -> None:
    """Guards: `dractl discover --node-name $'n1\\n'` prints no slice of pool `n1\\n`: one line naming the flag."""
    result = CliRunner().invoke(
        cli.main, ["discover", "--device-source", "fake", "--node-name", "n1\n"], catch_exceptions=False
    )
    assert (result.exit_code, result.stdout) == (1, "")
    assert result.stderr.splitlines() == [
        "error: node name 'n1\\n' is not a DNS subdomain (lowercase letters, digits, '-' and '.'): set --node-name to "
        "the Node's name"
    ]


@pytest.mark.parametrize("flag", ["--state-dir", "--cdi-root", "--kubelet-plugins-dir", "--driver-root"])
def test_an_empty_directory_flag_is_refused_naming_it(flag: str, dirs: list[str], sock_dir: pathlib.Path) -> None:
    """Guards: an empty --state-dir or --cdi-root (or any directory flag: `--state-dir "$UNSET"`) is one line naming
    the flag, exit 2, instead of meaning the working directory. (An empty DRACTL_ variable is click's "unset": the
    default applies.)"""
    result = _agent(*dirs, "--node-name", "n1", f"{flag}=")
    assert result.exit_code == 2, result.stderr
    [line] = result.stderr.splitlines()
    assert line.startswith(f"dractl node-agent: error: Invalid value for '{flag}'"), line
    assert line.endswith("must not be empty (an empty path would mean the working directory)"), line
    assert not (sock_dir / "state").exists()


# --- The other validation patterns whose `$` let a trailing newline through ------------------------------------


def test_cdi_and_mig_device_names_refuse_a_trailing_newline() -> None:
    """Guards the CDI device name check and the MIG device name parser, whose `$` let `...\n` through."""
    with pytest.raises(ValueError, match="CDI device name"):
        cdi.device_name("0f6c4c3e", "gpu-0\n")
    assert mig.parse_name("gpu-0-mig-1g10gb-19-0") is not None
    assert mig.parse_name("gpu-0-mig-1g10gb-19-0\n") is None


def test_the_health_monitor_reads_no_minor_from_a_name_with_a_trailing_newline() -> None:
    """Guards the health monitor's GPU name pattern: `gpu-0\n` is not GPU 0's device."""
    published = slices.build(
        inventory.read(fakegpu.FakeGpus(fakegpu.load_profile("t4-x2"), node_name="n1")),
        options=slices.Options(node_name="n1", driver_name="gpu.nvidia.com"),
    )
    renamed = [
        dataclasses.replace(s, devices=tuple(dataclasses.replace(d, name=d.name + "\n") for d in s.devices))
        for s in published
    ]
    assert [d.name for d in health.devices_from_slices(published)] == ["gpu-0", "gpu-1"]
    assert health.devices_from_slices(renamed) == ()


@pytest.mark.parametrize(("text", "normalize"), [("1.2.3\n", False), ("1.2\n", True)], ids=["strict", "loose"])
def test_a_semantic_version_with_a_trailing_newline_is_refused(text: str, normalize: bool) -> None:
    """Guards semver's strict and loose patterns: a version attribute `1.2.3\n` is not 1.2.3."""
    with pytest.raises(semver.SemverError):
        semver.parse(text, normalize=normalize)


@pytest.mark.parametrize(
    ("field", "value"), [("pciBusID", "0000:07:00.0\n"), ("cudaDriverVersion", "13.0\n")], ids=["bus", "cuda"]
)
def test_a_fake_profile_field_with_a_trailing_newline_is_refused(field: str, value: str) -> None:
    """Guards the fake profile's patterns (versions, PCI addresses, roots, MIG profile names): a final newline is
    refused naming the field."""
    document: dict[str, object] = {
        "driverVersion": "580.126.20",
        "cudaDriverVersion": "13.0",
        "gpus": [{"model": "tesla-t4", "pciBusID": "0000:07:00.0"}],
    }
    if field == "pciBusID":
        document["gpus"] = [{"model": "tesla-t4", "pciBusID": value}]
    else:
        document[field] = value
    with pytest.raises(fakegpu.ProfileError, match=field):
        fakegpu.parse_profile(document, name="p")


def test_a_trace_example_node_with_a_trailing_newline_is_refused() -> None:
    """Guards the trace's example node name (a DNS label): `n1\n` is refused naming the field."""
    document = {
        "apiVersion": trace.API_VERSION,
        "kind": trace.KIND,
        "spec": {"cluster": {"examples": [{"file": "22-t4-node-01.yaml", "node": "n1\n"}]}, "events": []},
    }
    with pytest.raises(trace.TraceError) as caught:
        trace.parse(document, file="t.yaml")
    assert (
        "t.yaml: spec.cluster.examples[0].node: must be a DNS label (lower case letters, digits, '-'), got \"n1\\n\""
        in caught.value.problems
    )
