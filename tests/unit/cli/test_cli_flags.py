"""Every flag of every mode is as STYLE.md asks: mirrored by its DRACTL_<FLAG> variable, which --help shows, and
stating its default."""

from __future__ import annotations

import importlib
from typing import Any

import click
import pytest
from click.testing import CliRunner

from dractl import cli


def _commands(group: click.Group, prefix: str = "") -> dict[str, click.Command]:
    """Each leaf command of `group` by its path ("explain claim")."""
    found: dict[str, click.Command] = {}
    for name, command in group.commands.items():
        path = f"{prefix}{name}"
        if isinstance(command, click.Group):
            found.update(_commands(command, f"{path} "))
        else:
            found[path] = command
    return found


COMMANDS = _commands(cli.main)


@pytest.mark.parametrize("path", sorted(COMMANDS))
def test_every_flag_is_mirrored_by_its_env_var_and_states_its_default(path: str) -> None:
    """Guards: each option of the mode reads DRACTL_<FLAG> of its long flag first, shows it in --help, and its help
    ends by stating the default."""
    options = [p for p in COMMANDS[path].params if isinstance(p, click.Option)]
    assert options, path
    for option in options:
        flag = next(o for o in option.opts if o.startswith("--"))
        expected = "DRACTL_" + flag.removeprefix("--").upper().replace("-", "_")
        envvars = [option.envvar] if isinstance(option.envvar, str) else list(option.envvar or ())
        assert envvars[:1] == [expected] and option.show_envvar, (path, flag)
        assert "(default: " in (option.help or "") and (option.help or "").endswith(").")


CLIENT_MODES = {
    "node-agent": (["node-agent", "--node-name", "n1"], "dractl.node.agent"),
    "explain-claim": (["explain", "claim", "ns/c"], "dractl.explain"),
    "explain-pod": (["explain", "pod", "ns/p"], "dractl.explain"),
}


@pytest.mark.parametrize(("args", "module"), list(CLIENT_MODES.values()), ids=list(CLIENT_MODES))
def test_the_client_rate_limit_flags_reach_every_mode_that_talks_to_the_api(
    args: list[str], module: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Guards: --kube-api-qps and --kube-api-burst (and their DRACTL_ variables) land in the settings of the node
    agent and of explain (the controller's are tested with its other flags); unset, they are 0 (no client-side
    limit) and 100."""
    seen: list[Any] = []
    monkeypatch.setattr(importlib.import_module(module), "run", lambda settings, **_: seen.append(settings) or 0)
    runner = CliRunner()
    empty = {"DRACTL_KUBE_API_QPS": "", "DRACTL_KUBE_API_BURST": ""}
    for extra, env in (
        ([], empty),
        (["--kube-api-qps", "7.5", "--kube-api-burst", "9"], empty),
        ([], {"DRACTL_KUBE_API_QPS": "300", "DRACTL_KUBE_API_BURST": "600"}),
    ):
        result = runner.invoke(cli.main, [*args, *extra], env=env, catch_exceptions=False)
        assert result.exit_code == 0, result.output
    assert [(s.kube_api_qps, s.kube_api_burst) for s in seen] == [(0.0, 100), (7.5, 9), (300.0, 600)]
