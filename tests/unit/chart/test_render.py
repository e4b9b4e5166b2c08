"""The chart rendered by Helm's engine for several value sets: valid objects, flags dractl takes, least privilege."""

from __future__ import annotations

import itertools
import pathlib
from typing import Any

import helm_python
import kubernetes_validate.utils
import pytest
import yaml
from support import chart

import dractl
from dractl import cli
from dractl.kube import access
from dractl.node import driverfiles

EXAMPLES = pathlib.Path(dractl.__file__).parent / "examples" / "00-deviceclasses.yaml"
OLDEST = "1.34.0"
NEWEST = kubernetes_validate.utils.latest_version()
RENDERED = {name: chart.render(values) for name, values in chart.VALUE_SETS.items()}


def _container(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (workload,) = chart.find(objects, kind)
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    return container


def _parse(command: str, args: list[str]) -> dict[str, Any]:
    """The parameters dractl's own CLI parses from the chart's args (a flag it does not know fails here)."""
    assert args[0] == command
    context = cli.main.commands[command].make_context(command, list(args[1:]))
    return dict(context.params)


@pytest.mark.parametrize("version", [OLDEST, NEWEST])
@pytest.mark.parametrize("values", sorted(RENDERED), ids=str)
def test_every_object_is_valid_for_kubernetes(values: str, version: str) -> None:
    """Guards: each rendered object validates (strict: no unknown field) against the OpenAPI schema of Kubernetes
    1.34 and of the newest version kubernetes-validate knows."""
    objects = RENDERED[values]
    assert objects
    for item in objects:
        kubernetes_validate.utils.validate(item, version, strict=True)


def test_helm_lint_finds_no_warning_or_error() -> None:
    """Guards: `helm lint --strict` (Helm's own chart checks, kubeVersion included) passes with the defaults."""
    report = helm_python.lint(chart.CHART, strict=True, kube_version="v1.34.0")
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert problems == [] and report["errors"] == []


def test_the_chart_version_is_dractls() -> None:
    """Guards: the chart's version and appVersion (hence the default image tag) follow dractl.__version__."""
    document = yaml.safe_load((chart.CHART / "Chart.yaml").read_text())
    assert document["version"] == document["appVersion"] == dractl.__version__
    assert _container(RENDERED["defaults"], "Deployment")["image"] == f"dractl:{dractl.__version__}"


@pytest.mark.parametrize("values", sorted(RENDERED), ids=str)
def test_the_args_are_flags_dractl_accepts(values: str) -> None:
    """Guards: the chart and the CLI agree: every arg the chart passes parses with dractl's own flag definitions."""
    objects = RENDERED[values]
    if chart.find(objects, "Deployment"):
        container = _container(objects, "Deployment")
        assert container["command"] == ["dractl"]
        _parse("controller", container["args"])
    if chart.find(objects, "DaemonSet"):
        container = _container(objects, "DaemonSet")
        assert container["command"] == ["dractl"]
        _parse("node-agent", container["args"])


def test_the_default_controller_runs_only_the_scheduler_with_two_leader_elected_replicas() -> None:
    """Guards: claims are left to kube-controller-manager by default; 2 replicas elect a leader; probes, non-root."""
    objects = RENDERED["defaults"]
    (deployment,) = chart.find(objects, "Deployment", "dractl-controller")
    container = _container(objects, "Deployment")
    params = _parse("controller", container["args"])
    assert params["controllers"] == "scheduler" and params["leader_elect"] is True
    assert deployment["spec"]["replicas"] == 2
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": params["health_port"]}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": params["health_port"]}
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["priorityClassName"] == "system-cluster-critical"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True and container["resources"]["requests"]
    (budget,) = chart.find(objects, "PodDisruptionBudget")
    assert budget["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    values = yaml.safe_load((chart.CHART / "values.yaml").read_text())
    assert values["controller"]["controllers"] == ["scheduler"]
    assert "kube-controller-manager's resourceclaim controller" in (chart.CHART / "values.yaml").read_text()


def test_topology_levels_reach_the_controller_as_one_flag() -> None:
    """Guards: controller.topologyLevels becomes --topology-levels (widest first, comma-joined); none by default."""
    params = _parse("controller", _container(RENDERED["both-controllers-first-fit"], "Deployment")["args"])
    assert params["topology_levels"] == "example.com/block,rack,kubernetes.io/hostname"
    assert _parse("controller", _container(RENDERED["defaults"], "Deployment")["args"])["topology_levels"] == ""


def test_the_node_agent_daemonset_mounts_the_kubelets_directories_and_names_its_node() -> None:
    """Guards: the DaemonSet: kubelet plugin and registry dirs, CDI dir, /dev and the driver root at fixed paths (the
    agent told both of the driver root's paths); NODE_NAME and the pod's UID from the downward API (sockets of its
    own, so an update starts the new agent beside the old one: maxSurge 1, maxUnavailable 0); GPU nodes only; the
    endpoints on every address of the pod's network namespace, where the probe and the Service reach them."""
    objects = RENDERED["defaults"]
    (daemonset,) = chart.find(objects, "DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    container = _container(objects, "DaemonSet")
    params = _parse("node-agent", container["args"])
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    host_paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    assert {path: host_paths[name] for path, name in mounts.items()} == {
        "/var/lib/kubelet/plugins": "/var/lib/kubelet/plugins",
        "/var/lib/kubelet/plugins_registry": "/var/lib/kubelet/plugins_registry",
        "/var/run/cdi": "/var/run/cdi",
        "/dev": "/dev",
        "/driver-root": "/",
    }
    assert str(params["kubelet_plugins_dir"]) == "/var/lib/kubelet/plugins"
    assert str(params["kubelet_registrar_dir"]) == "/var/lib/kubelet/plugins_registry"
    assert params["device_source"] == "nvml"
    assert {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in container["env"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}} in container["env"]
    assert daemonset["spec"]["updateStrategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    assert (params["health_address"], params["metrics_address"]) == ("0.0.0.0", "0.0.0.0")
    assert (str(params["driver_root"]), str(params["container_driver_root"])) == ("/", "/driver-root")
    assert container["securityContext"]["privileged"] is True
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": params["health_port"]}


def test_the_node_agent_loads_nvml_from_every_directory_it_finds_driver_files_in() -> None:
    """Guards: the agent's LD_LIBRARY_PATH names, under /driver-root, every library directory driver discovery
    searches on amd64 and arm64 (GKE's <root>/lib64 included), so NVML loads from the driver whose files the CDI
    specs mount, wherever that driver root keeps them."""
    container = _container(RENDERED["defaults"], "DaemonSet")
    (path,) = [e["value"] for e in container["env"] if e["name"] == "LD_LIBRARY_PATH"]
    searched = {f"/driver-root{d}" for machine in ("x86_64", "aarch64") for d in driverfiles.library_dirs(machine)}
    assert searched <= set(path.split(":"))
    assert "/driver-root/lib64" in searched


@pytest.mark.parametrize("values", sorted(RENDERED), ids=str)
def test_no_host_ipc_and_the_plugin_directory_propagates_mounts(values: str) -> None:
    """Guards: the agent never shares the host's IPC namespace (each MPS daemon has a tmpfs of its own), and that
    tmpfs, under the state directory in the kubelet's plugin directory, reaches the host (Bidirectional)."""
    for daemonset in chart.find(RENDERED[values], "DaemonSet"):
        pod = daemonset["spec"]["template"]["spec"]
        assert "hostIPC" not in pod
        (container,) = pod["containers"]
        (plugins,) = [m for m in container["volumeMounts"] if m["name"] == "kubelet-plugins"]
        assert plugins["mountPropagation"] == "Bidirectional"


def test_fake_devices_take_the_profile_and_no_driver_root() -> None:
    """Guards: fake devices: the profile and MIG mode reach the agent; the host's driver root is not mounted."""
    container = _container(RENDERED["fake-dynamic-mig"], "DaemonSet")
    params = _parse("node-agent", container["args"])
    assert (params["device_source"], params["fake_profile"], params["mig_mode"]) == ("fake", "a100-80gb-x8", "dynamic")
    assert "/driver-root" not in {m["mountPath"] for m in container["volumeMounts"]}
    assert params["log_format"] == "console"


def test_values_reach_a_second_release_side_by_side() -> None:
    """Guards: driver name, names, image, directories and the classes follow the values (e2e runs two releases)."""
    objects = RENDERED["second-release"]
    container = _container(objects, "DaemonSet")
    params = _parse("node-agent", container["args"])
    assert params["driver_name"] == "gpu.e2e.example.com"
    assert str(params["kubelet_plugins_dir"]) == "/var/lib/k0s/kubelet/plugins"
    assert container["image"] == "localhost/dractl:dev" and container["imagePullPolicy"] == "Never"
    assert {o["metadata"]["name"] for o in chart.find(objects, "DeviceClass")} == {
        "gpu.e2e.example.com",
        "mig.e2e.example.com",
    }
    assert all("extendedResourceName" not in o["spec"] for o in chart.find(objects, "DeviceClass"))
    (vap,) = chart.find(objects, "ValidatingAdmissionPolicy", "dractl-e2e-resourceslices")
    assert (
        "system:serviceaccount:dractl-system:dractl-e2e-node-agent" in vap["spec"]["matchConditions"][0]["expression"]
    )
    assert '"gpu.e2e.example.com"' in vap["spec"]["validations"][2]["expression"]
    (daemonset,) = chart.find(objects, "DaemonSet")
    volumes = {v["name"]: v["hostPath"]["path"] for v in daemonset["spec"]["template"]["spec"]["volumes"]}
    assert volumes["driver-root"] == "/run/nvidia/driver"


def test_the_device_classes_are_the_examples() -> None:
    """Guards: the chart's DeviceClasses gpu.nvidia.com and mig.nvidia.com are exactly dractl/examples' ones."""
    examples = {d["metadata"]["name"]: d["spec"] for d in yaml.safe_load_all(EXAMPLES.read_text()) if d}
    rendered = {d["metadata"]["name"]: d["spec"] for d in chart.find(RENDERED["defaults"], "DeviceClass")}
    assert rendered == {name: examples[name] for name in ("gpu.nvidia.com", "mig.nvidia.com")}


def _rules(objects: list[dict[str, Any]], kind: str, name: str) -> list[dict[str, Any]]:
    (role,) = chart.find(objects, kind, name)
    return role["rules"]


@pytest.mark.parametrize(
    "controllers",
    [list(chosen) for size in (1, 2) for chosen in itertools.permutations(access.CONTROLLERS, size)],
    ids=",".join,
)
def test_the_controllers_rbac_is_the_tables_for_the_controllers_it_runs(controllers: list[str]) -> None:
    """Guards: the controller's ClusterRole and Role are exactly access.rules for the chosen --controllers (in any
    order): nothing for a controller that does not run."""
    objects = chart.render({"controller": {"controllers": controllers}})
    names = ("controller", *controllers)
    assert _rules(objects, "ClusterRole", "dractl-controller") == access.rules(names, scope=access.Scope.CLUSTER)
    assert _rules(objects, "Role", "dractl-controller") == access.rules(names, scope=access.Scope.OWN_NAMESPACE)
    (binding,) = chart.find(objects, "RoleBinding", "dractl-controller")
    assert binding["metadata"]["namespace"] == chart.NAMESPACE
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "dractl-controller", "namespace": chart.NAMESPACE}
    ]


def test_the_node_agents_rbac_is_the_tables_and_it_has_its_own_account() -> None:
    """Guards: the node agent's ClusterRole is access.rules for the node agent; no Role; its pod uses its account."""
    objects = RENDERED["defaults"]
    assert _rules(objects, "ClusterRole", "dractl-node-agent") == access.rules(
        ["node-agent"], scope=access.Scope.CLUSTER
    )
    assert chart.find(objects, "Role", "dractl-node-agent") == []
    (daemonset,) = chart.find(objects, "DaemonSet")
    assert daemonset["spec"]["template"]["spec"]["serviceAccountName"] == "dractl-node-agent"
    (deployment,) = chart.find(objects, "Deployment")
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "dractl-controller"


@pytest.mark.parametrize(
    ("values", "absent"),
    [
        ("node-agent-only", {"Deployment", "PodDisruptionBudget", "Role", "DeviceClass"}),
        ("controller-only", {"DaemonSet", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}),
        ("claims-only-no-leader-election", {"PodDisruptionBudget", "Service", "Role", "RoleBinding"}),
    ],
)
def test_disabled_parts_leave_no_objects(values: str, absent: set[str]) -> None:
    """Guards: a component switched off leaves neither its workload nor its account, roles or policies behind."""
    objects = RENDERED[values]
    assert {o["kind"] for o in objects} & absent == set()
    if values == "claims-only-no-leader-election":
        # Without leader election there is no Lease, so no Role either.
        assert "--no-leader-elect" in _container(objects, "Deployment")["args"]


def test_metrics_services_select_each_components_pods() -> None:
    """Guards: one metrics Service per component, port "metrics", selecting exactly that component's pods."""
    objects = RENDERED["defaults"]
    for component, kind in (("controller", "Deployment"), ("node-agent", "DaemonSet")):
        (service,) = chart.find(objects, "Service", f"dractl-{component}-metrics")
        (workload,) = chart.find(objects, kind)
        assert service["spec"]["selector"] == workload["spec"]["selector"]["matchLabels"]
        assert service["spec"]["ports"][0]["targetPort"] == "metrics"
    assert chart.find(RENDERED["both-controllers-first-fit"], "Service") == []


@pytest.mark.parametrize(
    ("values", "problem"),
    [
        ({"nodeAgent": {"deviceSource": "cuda"}}, "/nodeAgent/deviceSource"),
        ({"controller": {"controllers": ["claims", "allocator"]}}, "/controller/controllers/1"),
        ({"controller": {"controllers": []}}, "/controller/controllers"),
        ({"controller": {"replica": 2}}, "additional properties 'replica' not allowed"),
        ({"nodeAgent": {"metricsPort": 0}}, "/nodeAgent/metricsPort"),
        ({"nodeAgent": {"kubeletPluginsDir": "var/lib/kubelet/plugins"}}, "/nodeAgent/kubeletPluginsDir"),
        ({"logFormat": "text"}, "/logFormat"),
        ({"kubeApi": {"qps": -1, "burst": 100}}, "/kubeApi/qps"),
        ({"controller": {"topologyLevels": ["rack id"]}}, "/controller/topologyLevels/0"),
    ],
    ids=[
        "device-source",
        "controller-name",
        "no-controllers",
        "typo",
        "port-zero",
        "relative-dir",
        "log-format",
        "negative-qps",
        "topology-level-not-a-label-key",
    ],
)
def test_bad_values_are_refused_naming_the_key(values: dict[str, Any], problem: str) -> None:
    """Guards: values.schema.json refuses a bad value at install time with a message naming the key."""
    with pytest.raises(helm_python.HelmValuesError) as caught:
        chart.render(values)
    assert problem in str(caught.value)


def test_notes_say_how_to_verify() -> None:
    """Guards: NOTES.txt names the commands that show the release works and what runs."""
    text = chart.notes()
    assert "kubectl -n dractl-system rollout status deployment/dractl-controller" in text
    assert "kubectl get resourceslices --field-selector spec.driver=gpu.nvidia.com" in text
    assert 'add "claims" to controller.controllers' in text


def test_notes_say_to_delete_the_gpu_pods_before_uninstalling() -> None:
    """Guards issue 25: uninstalling while GPU pods run leaves them Terminating for ever (no agent to unprepare), so
    the notes say to delete or drain them first and how to find the claims still allocated; no agent, no warning."""
    text = chart.notes()
    assert "Before `helm uninstall dractl -n dractl-system`, delete the pods that use gpu.nvidia.com devices" in text
    assert "kubectl get resourceclaims -A" in text
    assert "helm uninstall" not in chart.notes({"nodeAgent": {"enabled": False}})
