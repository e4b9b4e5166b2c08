"""Every flag of every mode is as STYLE.md asks: mirrored by its DRACTL_<FLAG> variable, which --help shows, and
stating its default."""

from __future__ import annotations

import click
import pytest

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
