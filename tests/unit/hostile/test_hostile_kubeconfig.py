"""Hostile kubeconfigs: every mode reads them through one bounded reader (`kube.client.connect`), so an alias bomb,
deep nesting or a server that is not a URL is one line and exit 1, in bounded time and memory."""

from __future__ import annotations

import pathlib
import resource
import subprocess
import sys

import kubernetes.config.kube_config
import pytest
from click.testing import CliRunner

from dractl import cli
from dractl.kube import client

pytestmark = pytest.mark.timeout(60)

ROOT = pathlib.Path(__file__).resolve().parents[3]
BOMB = "not a kubeconfig: document 1 (line 1): aliases expand to more than 1000000 values (an alias bomb)"
GOOD = """\
apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: {server}{extra}}}}}]
contexts: [{{name: c, context: {{cluster: c, user: u}}}}]
current-context: c
users: [{{name: u, user: {{token: t}}}}]
"""


def _bomb() -> str:
    """A kubeconfig whose aliases expand to 10^9 values ("billion laughs"): 4 GiB in the official loader."""
    lines = ["l0: &l0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, 9)]
    return "\n".join(lines) + "\n" + GOOD.format(server="'https://127.0.0.1:6443'", extra=", x: *l8")


def _write(tmp_path: pathlib.Path, text: str) -> pathlib.Path:
    path = tmp_path / "kubeconfig"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (_bomb(), BOMB),
        (
            GOOD.format(server="'https://127.0.0.1:6443'", extra=", x: " + "[" * 5000 + "]" * 5000),
            "not a kubeconfig: nested too deeply: more than 1000 levels of [ and {",
        ),
        (
            "---\n" + GOOD.format(server="'https://h'", extra="") + "---\nb: 1\n",
            "not a kubeconfig: holds 2 YAML documents where one is expected",
        ),
        (
            GOOD.format(server="'not a url'", extra=""),
            "the cluster's server 'not a url' is not a URL such as https://HOST:PORT",
        ),
        (GOOD.format(server='""', extra=""), "the cluster's server '' is not a URL such as https://HOST:PORT"),
        (
            GOOD.format(server="'https://'", extra=""),
            "the cluster's server 'https:' is not a URL such as https://HOST:PORT",
        ),
    ],
    ids=["alias-bomb", "deep-nesting", "two-documents", "not-a-url", "empty-server", "no-host"],
)
def test_connect_refuses_a_hostile_kubeconfig_with_one_line(text: str, problem: str, tmp_path: pathlib.Path) -> None:
    """Guards `connect`'s reader: an alias bomb, deep nesting, several documents or a server that is not an http(s)
    URL is one `KubeconfigError` line (the bomb took 4 GiB, a malformed server retried for ever)."""
    with pytest.raises(client.KubeconfigError) as caught:
        client.connect(_write(tmp_path, text))
    assert str(caught.value) == problem


def test_kubeconfigs_named_by_the_environment_are_read_by_the_same_reader(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Guards: without --kubeconfig, each file of $KUBECONFIG goes through the bounded reader too, named in the line
    (the official loader reads $KUBECONFIG as it was at import, so the test sets what it read)."""
    good = tmp_path / "good"
    good.write_text(GOOD.format(server="'https://127.0.0.1:6443'", extra=""))
    bomb = _write(tmp_path, _bomb())
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setattr(kubernetes.config.kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", f"{good}:{tmp_path / 'no'}")
    assert client.connect().host == "https://127.0.0.1:6443"
    monkeypatch.setattr(kubernetes.config.kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", f"{good}:{bomb}")
    with pytest.raises(client.KubeconfigError) as caught:
        client.connect()
    assert str(caught.value) == f"{bomb}: {BOMB}"


@pytest.mark.parametrize(
    ("args", "prefix"),
    [
        (["explain", "claim", "ns/c"], "dractl explain: cannot use the kubeconfig ({path}): "),
        (
            ["controller", "--health-port", "-1", "--metrics-port", "-1"],
            "dractl controller: error: cannot build a Kubernetes client from kubeconfig {path}: ",
        ),
    ],
    ids=["explain", "controller"],
)
def test_every_mode_reports_an_alias_bomb_in_one_line(args: list[str], prefix: str, tmp_path: pathlib.Path) -> None:
    """Guards: `dractl explain` and `dractl controller` (the node agent: test_agent_start.py and below) read a
    kubeconfig alias bomb through the same reader: one line, exit 1."""
    path = _write(tmp_path, _bomb())
    result = CliRunner().invoke(cli.main, [*args, "--kubeconfig", str(path)], catch_exceptions=False)
    assert (result.exit_code, result.stdout) == (1, "")
    assert result.stderr == prefix.format(path=path) + BOMB + "\n"


def test_the_node_agent_reads_an_alias_bomb_in_bounded_memory(tmp_path: pathlib.Path, sock_dir: pathlib.Path) -> None:
    """Guards: `dractl node-agent --kubeconfig BOMB` in a process of its own, limited to 1 GiB of address space
    (the official loader alone took 4 GiB), is one line and exit 1."""
    path = _write(tmp_path, _bomb())

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2**30, 2**30))

    args = ["--node-name", "n1", "--device-source", "fake", "--kubeconfig", str(path), "--health-port", "-1"]
    args += ["--metrics-port", "-1", "--state-dir", str(tmp_path / "state"), "--cdi-root", str(tmp_path / "cdi")]
    args += ["--kubelet-registrar-dir", str(sock_dir / "reg"), "--kubelet-plugins-dir", str(sock_dir / "plugins")]
    result = subprocess.run(
        [sys.executable, "-m", "dractl", "node-agent", *args],
        capture_output=True,
        text=True,
        timeout=50,
        cwd=ROOT,
        preexec_fn=limit,
        check=False,
    )
    assert (result.returncode, result.stdout) == (1, "")
    assert (
        result.stderr == f"dractl node-agent: error: cannot build a Kubernetes client from kubeconfig {path}: {BOMB}\n"
    )
