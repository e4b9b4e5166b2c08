"""Frozen settings per mode, built by the CLI from flags and environment variables.

What it does: holds the values a mode runs with, already parsed and defaulted, so each
mode's `run()` takes one value instead of a list of flags. What it must not do: read the
environment, parse flags or import any other dractl layer; the CLI does the parsing and
this module sits at the bottom of the layers beside `model`.
"""

from __future__ import annotations

import dataclasses
import enum
import pathlib


class Policy(enum.Enum):
    """The allocation policy, by its CLI spelling; `alloc.Policy` is this same enum."""

    FIRST_FIT = "first-fit"  # upstream's choices exactly
    BINPACK = "binpack"  # scored: pack nodes and GPUs, keep locality, avoid MIG fragmentation


class OutputFormat(enum.Enum):
    TABLE = "table"
    JSON = "json"
    YAML = "yaml"


DEFAULT_SEARCH_LIMIT = 1_000_000
MAX_SEARCH_LIMIT = 2**63 - 1  # the allocator core counts search steps in an int64


class Retry(enum.Enum):
    """What a trace replay does with a claim it could not allocate, by its CLI spelling."""

    ON_DEPARTURE = "on-departure"  # wait, and try again after every departure (a scheduler's retry)
    NEVER = "never"  # drop it


@dataclasses.dataclass(frozen=True, slots=True)
class Simulate:
    """Settings of `dractl simulate`. No `paths` means the built-in example cluster; the path `-`
    is standard input (at most once).

    `trace` replays a trace file (`-` for stdin) instead of the manifests; `generate` is a
    generator spec whose trace is printed instead of simulating. `compare` lists the policies
    a trace replay runs side by side (empty: `policy` alone); `html` is where the allocation
    map is written (None: nowhere). `topology_levels` are node label keys, widest first, whose
    smallest domain that holds a whole gang (PodGroup) is preferred."""

    paths: tuple[pathlib.Path, ...] = ()
    policy: Policy = Policy.BINPACK
    output: OutputFormat = OutputFormat.TABLE
    timing: bool = False
    search_limit: int = DEFAULT_SEARCH_LIMIT
    trace: pathlib.Path | None = None
    retry: Retry = Retry.ON_DEPARTURE
    generate: str | None = None
    compare: tuple[Policy, ...] = ()
    html: pathlib.Path | None = None
    topology_levels: tuple[str, ...] = ()


DEFAULT_DRIVER_NAME = "gpu.nvidia.com"
DEFAULT_FAKE_PROFILE = "a100-80gb-x8"


class DeviceSource(enum.Enum):
    """Where the node agent learns its GPUs: the real NVML, or the deterministic fake."""

    NVML = "nvml"
    FAKE = "fake"


class MigMode(enum.Enum):
    """How MIG is published: `static` the MIG devices that exist; `dynamic` every profile x
    placement as partitionable devices, created when a claim is prepared."""

    STATIC = "static"
    DYNAMIC = "dynamic"


@dataclasses.dataclass(frozen=True, slots=True)
class Discover:
    """Settings of `dractl discover` (and the device part of `dractl node-agent`)."""

    node_name: str
    driver_name: str = DEFAULT_DRIVER_NAME
    device_source: DeviceSource = DeviceSource.NVML
    fake_profile: str = DEFAULT_FAKE_PROFILE
    mig_mode: MigMode = MigMode.STATIC
    consumable_memory: bool = False
    output: OutputFormat = OutputFormat.YAML


DEFAULT_KUBE_API_QPS = 0.0
"""Requests per second each mode's API client sends at most on average; 0: no client-side limit, the API server's
priority and fairness paces it (kube-scheduler's and the kubelet's 50 predate that, and bound dractl's scheduler
to 50 / 4 writes = 12.5 pods/s whatever the cluster)."""
DEFAULT_KUBE_API_BURST = 100
"""Requests a mode's API client may send at once above a `--kube-api-qps` above 0: kube-scheduler's and the
kubelet's default."""


class LogFormat(enum.Enum):
    JSON = "json"  # one JSON object per line, for the cluster's log collection
    CONSOLE = "console"  # aligned key=value lines for a person at a terminal


class CdiGenerator(enum.Enum):
    """Where the CDI edits every claim spec shares (driver libraries, binaries) come from."""

    NATIVE = "native"  # dractl reads the driver root itself
    NVIDIA_CTK = "nvidia-ctk"  # `nvidia-ctk cdi generate`


DEFAULT_CDI_ROOT = pathlib.Path("/var/run/cdi")
DEFAULT_DRIVER_ROOT = pathlib.Path("/")
DEFAULT_KUBELET_REGISTRAR_DIR = pathlib.Path("/var/lib/kubelet/plugins_registry")
DEFAULT_KUBELET_PLUGINS_DIR = pathlib.Path("/var/lib/kubelet/plugins")
DEFAULT_HEALTH_PORT = 51515
# Not 8080: an agent on the host's network shares the host's ports, where 8080 is the first one anything else takes.
DEFAULT_METRICS_PORT = 51516
# Loopback: the kubelet probes a host-network pod from the host's network namespace, which it shares. The chart runs
# the agent on the pod network and passes 0.0.0.0, since the probe then comes to the pod's own address.
DEFAULT_HEALTH_ADDRESS = "127.0.0.1"


@dataclasses.dataclass(frozen=True, slots=True)
class NodeAgent:
    """Settings of `dractl node-agent`. The device fields mean what they mean for `Discover`.

    `state_dir` None means `<kubelet_plugins_dir>/<driver_name>` (beside the DRA socket);
    `driver_root` is where the host has the NVIDIA driver's files (what CDI specs name) and
    `container_driver_root` where the agent reads them, None meaning the same path;
    `kubeconfig` None means the in-cluster config; `kube_api_qps` and `kube_api_burst` limit its
    client's requests; a port of -1 turns that endpoint off; `metrics_address` None means the
    Node's InternalIP (loopback when it has none); `log_format` None means console on a terminal
    and JSON otherwise; `pod_uid` "" means the sockets have fixed names (one agent per node),
    otherwise names of their own (rolling updates).
    """

    node_name: str
    driver_name: str = DEFAULT_DRIVER_NAME
    device_source: DeviceSource = DeviceSource.NVML
    fake_profile: str = DEFAULT_FAKE_PROFILE
    mig_mode: MigMode = MigMode.STATIC
    consumable_memory: bool = False
    cdi_root: pathlib.Path = DEFAULT_CDI_ROOT
    cdi_generator: CdiGenerator = CdiGenerator.NATIVE
    driver_root: pathlib.Path = DEFAULT_DRIVER_ROOT
    container_driver_root: pathlib.Path | None = None
    kubelet_registrar_dir: pathlib.Path = DEFAULT_KUBELET_REGISTRAR_DIR
    kubelet_plugins_dir: pathlib.Path = DEFAULT_KUBELET_PLUGINS_DIR
    state_dir: pathlib.Path | None = None
    kubeconfig: pathlib.Path | None = None
    kube_api_qps: float = DEFAULT_KUBE_API_QPS
    kube_api_burst: int = DEFAULT_KUBE_API_BURST
    health_port: int = DEFAULT_HEALTH_PORT
    metrics_port: int = DEFAULT_METRICS_PORT
    health_address: str = DEFAULT_HEALTH_ADDRESS
    metrics_address: str | None = None
    log_format: LogFormat | None = None
    pod_uid: str = ""

    @property
    def plugin_state_dir(self) -> pathlib.Path:
        return self.state_dir if self.state_dir is not None else self.kubelet_plugins_dir / self.driver_name

    @property
    def agent_driver_root(self) -> pathlib.Path:
        return self.container_driver_root if self.container_driver_root is not None else self.driver_root


class ExplainKind(enum.Enum):
    """What `dractl explain` explains, by its subcommand's name."""

    CLAIM = "claim"
    POD = "pod"


class ExplainOutput(enum.Enum):
    """`dractl explain -o`: text for people; json and yaml carry the same content as data."""

    TEXT = "text"
    JSON = "json"
    YAML = "yaml"


DEFAULT_EXPLAIN_TIMEOUT = 30.0
"""`dractl explain --timeout` by default, in seconds: the whole run, every request and retry included. A healthy server
answers its few lists in well under a second; a silent one held explain 91 s (three tries of 30 s) before this bound,
and one that trickles bytes for ever."""


@dataclasses.dataclass(frozen=True, slots=True)
class Explain:
    """Settings of `dractl explain claim|pod NS/NAME`; `kubeconfig` None means the in-cluster
    config, else $KUBECONFIG or ~/.kube/config; `kube_api_qps` and `kube_api_burst` limit its
    client's requests; `timeout` (seconds) bounds the whole run, from reading the kubeconfig to the
    explanation."""

    kind: ExplainKind
    namespace: str
    name: str
    kubeconfig: pathlib.Path | None = None
    kube_api_qps: float = DEFAULT_KUBE_API_QPS
    kube_api_burst: int = DEFAULT_KUBE_API_BURST
    policy: Policy = Policy.BINPACK
    output: ExplainOutput = ExplainOutput.TEXT
    search_limit: int = DEFAULT_SEARCH_LIMIT
    timeout: float = DEFAULT_EXPLAIN_TIMEOUT


DEFAULT_CONTROLLERS = ("scheduler",)
"""`--controllers` by default: dractl's scheduler only. kube-controller-manager's resourceclaim controller makes the
claims in every cluster with DRA on; `claims` is for clusters where it is off (two claim controllers would both
write pods' resourceClaimStatuses)."""
DEFAULT_SCHEDULER_NAME = "dractl"
DEFAULT_CONTROLLER_WORKERS = 16
"""Worker threads per controller by default. A scheduling worker spends nearly all its time waiting for the API
server (three writes in a row per pod); with 4, pods queued for tens of seconds behind a busy server while the
process used under a core (benchmarks/controller.py)."""
DEFAULT_LEASE_NAME = "dractl-controller"
DEFAULT_LEASE_DURATION = 15.0  # seconds; client-go's defaults, as kube-controller-manager uses them
DEFAULT_RENEW_DEADLINE = 10.0
DEFAULT_RETRY_PERIOD = 2.0
DEFAULT_CONTROLLER_METRICS_PORT = 8080
DEFAULT_CONTROLLER_HEALTH_PORT = 8081


@dataclasses.dataclass(frozen=True, slots=True)
class ControllerConfig:
    """Settings of `dractl controller`.

    `controllers` names the controllers to run (`dractl.controller.run.CONTROLLERS` knows them);
    `namespace` "" watches every namespace; `lease_namespace` "" means the pod's own namespace
    in a cluster, else `default`; durations are seconds; a port of -1 turns that endpoint off, 0
    picks a free one, and equal metrics and health ports serve every path on one listener;
    `kubeconfig` None means the in-cluster config, else $KUBECONFIG or ~/.kube/config;
    `kube_api_qps` and `kube_api_burst` limit the controllers' requests (the leader election has
    a limiter of its own, so a busy controller never delays a renewal); `topology_levels` are node
    label keys, widest first, whose smallest domain that holds a gang whole the scheduler prefers;
    `log_format` None means console on a terminal and JSON otherwise. Values are checked by
    `dractl.controller.run.check`, not here.
    """

    kubeconfig: pathlib.Path | None = None
    kube_api_qps: float = DEFAULT_KUBE_API_QPS
    kube_api_burst: int = DEFAULT_KUBE_API_BURST
    controllers: tuple[str, ...] = DEFAULT_CONTROLLERS
    scheduler_name: str = DEFAULT_SCHEDULER_NAME
    policy: Policy = Policy.BINPACK
    topology_levels: tuple[str, ...] = ()
    workers: int = DEFAULT_CONTROLLER_WORKERS
    namespace: str = ""
    leader_elect: bool = True
    lease_name: str = DEFAULT_LEASE_NAME
    lease_namespace: str = ""
    lease_duration: float = DEFAULT_LEASE_DURATION
    renew_deadline: float = DEFAULT_RENEW_DEADLINE
    retry_period: float = DEFAULT_RETRY_PERIOD
    metrics_port: int = DEFAULT_CONTROLLER_METRICS_PORT
    health_port: int = DEFAULT_CONTROLLER_HEALTH_PORT
    log_format: LogFormat | None = None
