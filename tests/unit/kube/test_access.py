"""The API access table (dractl/kube/access.py) against the code: every call site, both ways; the chart's copy."""

from __future__ import annotations

import ast
import dataclasses
import pathlib
import subprocess
import sys
import textwrap

import pytest
import yaml

from dractl.controller import run
from dractl.kube import access
from dractl.kube import client as kube_client

ROOT = pathlib.Path(__file__).resolve().parents[3]
PACKAGE = ROOT / "dractl"
CHART_RBAC = ROOT / "charts" / "dractl" / "files" / "rbac.yaml"
RBAC_DOC = ROOT / "docs" / "helm.md"

# Client methods and the RBAC verb (and subresource) each one sends.
_METHODS = {
    "get": ("get", ""),
    "list": ("list", ""),
    "watch": ("watch", ""),
    "create": ("create", ""),
    "update": ("update", ""),
    "update_status": ("update", "status"),
    "patch": ("patch", ""),
    "delete": ("delete", ""),
}
_TYPED = {
    "get_resource_claim": ("get", kube_client.RESOURCE_CLAIMS),
    "list_resource_slices": ("list", kube_client.RESOURCE_SLICES),
}
# Client methods that read discovery (/apis/<group>/<version>), which the system:discovery role lets every client read.
_DISCOVERY = {"serves"}
_CONSTANTS = {name: value for name, value in vars(kube_client).items() if isinstance(value, kube_client.Resource)}
# These take the resource from their callers (whose call sites are read instead).
_GENERIC = {"dractl.kube.client", "dractl.kube.informer", "dractl.kube.access", "dractl.kube.finalizers"}
# `finalizers.change(client, RESOURCE, ...)` reads the object and writes it back (protobuf GET and PUT);
# `finalizers.add_with_patch(client, RESOURCE, ...)` patches it.
_FINALIZER_VERBS = {"change": ("get", "update"), "add_with_patch": ("patch",)}
_HELPERS = {cls for part in access.COMPONENTS for cls in part.provides}


@dataclasses.dataclass
class Uses:
    """What one module's code asks of the API: (group, resource[/subresource], verb) with where, and helpers built."""

    calls: dict[tuple[str, str, str], list[str]] = dataclasses.field(default_factory=dict)
    builds: set[str] = dataclasses.field(default_factory=set)
    unreadable: list[str] = dataclasses.field(default_factory=list)

    def add(self, resource: kube_client.Resource, verb: str, subresource: str, where: str) -> None:
        name = f"{resource.plural}/{subresource}" if subresource else resource.plural
        self.calls.setdefault((resource.group, name, verb), []).append(where)
        implied = access.IMPLIED.get((resource.group, name, verb))
        if implied is not None:
            self.add(implied.resource, verb, implied.subresource, f"{where} (implied)")


def _client_aliases(tree: ast.Module) -> tuple[set[str], set[str]]:
    """Names bound to the kube client module, and resource constants imported by name."""
    modules, names = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "dractl.kube":
            modules |= {alias.asname or alias.name for alias in node.names if alias.name == "client"}
        elif isinstance(node, ast.ImportFrom) and node.module == "dractl.kube.client":
            names |= {alias.asname or alias.name for alias in node.names if alias.name in _CONSTANTS}
        elif isinstance(node, ast.Import):
            modules |= {alias.asname for alias in node.names if alias.name == "dractl.kube.client" and alias.asname}
    return modules, names


def scan(source: str, module: str) -> Uses:
    """Every API use in one module's source: client calls with a resource constant, typed reads, informers,
    helper classes built; any other use of a resource constant is `unreadable` (the table cannot be checked)."""
    tree = ast.parse(source)
    modules, names = _client_aliases(tree)

    def constant(node: ast.AST) -> kube_client.Resource | None:
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules:
            return _CONSTANTS.get(node.attr)
        if isinstance(node, ast.Name) and node.id in names:
            return _CONSTANTS[node.id]
        return None

    uses = Uses()
    understood: set[int] = set()
    for node in ast.walk(tree):
        where = f"{module}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Attribute) and constant(node.value) is not None:
            understood.add(id(node.value))  # `kube_client.PODS.api_version`: a name, not a call
        if not isinstance(node, ast.Call):
            continue
        called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        if called in _HELPERS:
            uses.builds.add(called)
        elif called in _TYPED:
            verb, resource = _TYPED[called]
            uses.add(resource, verb, "", where)
        elif called in _FINALIZER_VERBS and len(node.args) >= 2 and (resource := constant(node.args[1])) is not None:
            understood.add(id(node.args[1]))
            for verb in _FINALIZER_VERBS[called]:
                uses.add(resource, verb, "", where)
        elif called in _DISCOVERY and node.args and constant(node.args[0]) is not None:
            understood.add(id(node.args[0]))  # discovery: every client may read it, no rule needed
        elif called == "Informer" and len(node.args) >= 2 and (resource := constant(node.args[1])) is not None:
            understood.add(id(node.args[1]))
            uses.add(resource, "list", "", where)
            uses.add(resource, "watch", "", where)
        elif called in _METHODS and node.args and (resource := constant(node.args[0])) is not None:
            understood.add(id(node.args[0]))
            verb, subresource = _METHODS[called]
            for keyword in node.keywords:
                if keyword.arg == "subresource":
                    if not (isinstance(keyword.value, ast.Constant) and isinstance(keyword.value.value, str)):
                        uses.unreadable.append(f"{where}: subresource is not a literal string")
                        continue
                    subresource = keyword.value.value
            uses.add(resource, verb, subresource, where)
    for node in ast.walk(tree):
        if constant(node) is not None and id(node) not in understood:
            uses.unreadable.append(
                f"{module}:{getattr(node, 'lineno', 0)}: {ast.unparse(node)} used other than in a call"
            )
    return uses


def _package_modules() -> dict[str, Uses]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        if module in _GENERIC or module.startswith("dractl._proto"):
            continue
        uses = scan(path.read_text(), module)
        if uses.calls or uses.builds or uses.unreadable:
            found[module] = uses
    return found


MODULES = _package_modules()


def _flat(rules: tuple[access.Rule, ...]) -> set[tuple[str, str, str]]:
    return {(rule.resource.group, rule.name, verb) for rule in rules for verb in rule.verbs}


def test_the_scanner_reads_calls_informers_helpers_and_refuses_what_it_cannot_read() -> None:
    """Guards: the checker itself: each call form it must see is seen (with the permission a claim status write
    implies), and a resource in a variable is reported."""
    source = textwrap.dedent(
        """
        from dractl.kube import client as kc
        from dractl.kube import events
        def f(c, informer):
            c.patch(kc.PODS, "p", subresource="status", patch={})
            c.create(kc.PODS, {}, name="p", subresource="binding")
            c.update_status(kc.RESOURCE_CLAIMS, {})
            c.get_resource_claim("ns", "n")
            informer.Informer(c, kc.NODES, decode=None)
            events.Recorder(c)
            kind = kc.PODS.kind
            resource = kc.DEVICE_CLASSES
        """
    )
    uses = scan(source, "m")
    assert sorted(uses.calls) == [
        ("", "nodes", "list"),
        ("", "nodes", "watch"),
        ("", "pods/binding", "create"),
        ("", "pods/status", "patch"),
        ("resource.k8s.io", "resourceclaims", "get"),
        ("resource.k8s.io", "resourceclaims/binding", "update"),
        ("resource.k8s.io", "resourceclaims/status", "update"),
    ]
    assert uses.builds == {"Recorder"}
    assert uses.unreadable == ["m:12: kc.DEVICE_CLASSES used other than in a call"]


def test_every_module_that_calls_the_api_belongs_to_one_component() -> None:
    """Guards: a new module making API calls cannot be left out of the table (and so out of the chart's RBAC)."""
    owners: dict[str, list[str]] = {}
    for part in access.COMPONENTS:
        for module in part.modules:
            owners.setdefault(module, []).append(part.name)
    unowned = sorted(m for m in MODULES if m not in owners and m not in access.UNCHECKED)
    assert unowned == [], f"modules calling the API that no component in dractl/kube/access.py lists: {unowned}"
    shared = {m: names for m, names in owners.items() if len(names) > 1}
    assert shared == {}
    stale = sorted(m for m in owners if m not in MODULES)
    assert stale == [], f"modules listed in dractl/kube/access.py that make no API call: {stale}"


def test_no_call_site_hides_its_resource() -> None:
    """Guards: every use of a resource constant is a call the checker reads (else the table could be wrong unseen)."""
    unreadable = [
        line for module, uses in MODULES.items() if module not in access.UNCHECKED for line in uses.unreadable
    ]
    assert unreadable == []


@pytest.mark.parametrize("part", access.COMPONENTS, ids=lambda part: part.name)
def test_each_components_rules_are_exactly_what_its_calls_need(part: access.Component) -> None:
    """Guards: the table is the code: a call without a rule (a 403 in a cluster) or a rule without a call (more than
    least privilege) fails, naming the call sites."""
    called: dict[tuple[str, str, str], list[str]] = {}
    built: set[str] = set()
    for module in part.modules:
        for key, where in MODULES[module].calls.items():
            called.setdefault(key, []).extend(where)
        built |= MODULES[module].builds
    declared = _flat(part.rules)
    missing = {key: called[key] for key in sorted(set(called) - declared)}
    unused = sorted(declared - set(called))
    assert missing == {}, f"{part.name}: calls without a rule in dractl/kube/access.py"
    assert unused == [], f"{part.name}: rules no call of {', '.join(part.modules)} needs"
    assert sorted(built) == sorted(part.builds), f"{part.name}: helper classes built"


def test_the_controllers_are_the_ones_the_controller_runs() -> None:
    """Guards: the chart has rules for exactly the controllers `--controllers` accepts."""
    assert sorted(access.CONTROLLERS) == sorted(run.CONTROLLERS)


def test_the_node_agent_may_read_no_pod() -> None:
    """Guards least privilege: the node agent (with its helpers) has no rule on pods in any scope, since pod specs hold
    secrets in their environment and it rebuilds a lost checkpoint from claims alone."""
    granted = [
        rule["resources"][0]
        for scope in access.Scope
        for rule in access.rules(["node-agent"], scope=scope)
        if rule["apiGroups"] == [""]
    ]
    assert not [resource for resource in granted if resource.split("/")[0] == "pods"], granted


def test_a_mode_gets_its_helpers_rules_merged_per_resource() -> None:
    """Guards: the node agent's rules include what its claim reader and Event recorder call, one rule per resource."""
    rules = access.rules(["node-agent"], scope=access.Scope.CLUSTER)
    assert rules == [
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get", "list"]},
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["resourceslices"],
            "verbs": ["list", "watch", "create", "update", "delete"],
        },
    ]
    assert access.rules(["node-agent"], scope=access.Scope.OWN_NAMESPACE) == []
    both = access.rules(["controller", "claims", "scheduler"], scope=access.Scope.CLUSTER)
    pods = [rule for rule in both if rule["resources"] == ["resourceclaims"]]
    assert pods == [
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["resourceclaims"],
            "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
        }
    ]


def test_regenerating_the_charts_rbac_and_the_docs_table_changes_nothing(tmp_path: pathlib.Path) -> None:
    """Guards: charts/dractl/files/rbac.yaml and the RBAC table of the docs page (between its markers) are exactly what
    tools/gen_rbac.py writes from the table, so neither can omit what the chart grants."""
    out, doc = tmp_path / "rbac.yaml", tmp_path / "doc.md"
    completed = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gen_rbac.py"), "--out", str(out), "--doc-out", str(doc)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert out.read_text() == CHART_RBAC.read_text(), "stale: run `python tools/gen_rbac.py`"
    assert yaml.safe_load(out.read_text()) == access.chart_rbac()
    assert doc.read_text() == RBAC_DOC.read_text(), f"stale table in {RBAC_DOC}: run `python tools/gen_rbac.py`"
    assert "| node agent | " in doc.read_text()
