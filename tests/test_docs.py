"""README.md and the pages of docs/: every relative link resolves, and the front door's commands are the pages' own.

A link is `[text](target)` outside code blocks and code spans; a relative target must name an existing file or
directory, and its `#anchor` (a page's own too) a heading of the markdown file it names, slugged as GitHub slugs
headings. README.md's quick-start commands must be commands the reference pages print (where the tests that run
those pages' commands run them), except the two set-up commands, which CI itself runs; and README.md's own
`dractl` commands run as printed.
"""

from __future__ import annotations

import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").glob("*.md"))
SET_UP = (
    "python3 -m venv .venv && .venv/bin/pip install . && .venv/bin/dractl simulate",
    "python3 -m venv .venv && .venv/bin/pip install -e '.[test]' && .venv/bin/python -m pytest",
)
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _prose(text: str) -> str:
    """The text without fenced code blocks and code spans. Pure."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.DOTALL | re.MULTILINE)
    return re.sub(r"`[^`\n]*`", "", text)


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but `-` and `_` dropped, spaces to `-`. Pure."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: pathlib.Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.DOTALL | re.MULTILINE)
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, flags=re.MULTILINE)}


@pytest.mark.parametrize("page", [README, *PAGES], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: pathlib.Path) -> None:
    """Guards the README split: every relative link of README.md and docs/*.md names an existing file (or directory)
    and every anchor a heading of the page it names."""
    broken = []
    for target in _LINK.findall(_prose(page.read_text(encoding="utf-8"))):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and (resolved.suffix != ".md" or anchor not in _anchors(resolved)):
            broken.append(f"{target}: no heading #{anchor} in {resolved.relative_to(ROOT)}")
    assert broken == [], f"{page.relative_to(ROOT)}: broken links"


def _normal(command: str) -> str:
    return " ".join(shlex.split(command, comments=True))


def _sh_commands(text: str) -> list[str]:
    """Each command of the text's sh blocks, continuation lines joined, comments dropped, blanks normalised. Pure."""
    commands = []
    for block in re.findall(r"^```sh\n(.*?)^```", text, flags=re.DOTALL | re.MULTILINE):
        for line in block.replace("\\\n", " ").splitlines():
            if _normal(line):
                commands.append(_normal(line))
    return commands


def test_the_readmes_commands_are_the_reference_pages_own() -> None:
    """Guards: README.md's quick start prints only commands a docs page prints (in an sh block, or a code span), so
    the tests that run the pages' commands as printed run README's too; the set-up commands stay exactly as CI runs
    them."""
    readme = README.read_text(encoding="utf-8")
    for command in SET_UP:
        assert f"```sh\n{command}\n```" in readme
    pages = "\n".join(page.read_text(encoding="utf-8") for page in PAGES)
    printed = set(_sh_commands(pages))
    spans = " ".join(pages.replace("\\|", "|").split())  # a table cell escapes its pipes
    foreign = [
        command
        for command in _sh_commands(readme)
        if command not in {_normal(c) for c in SET_UP} and command not in printed and command not in spans
    ]
    assert foreign == [], "README.md commands no docs page prints"


def test_the_readme_fits_a_few_screens() -> None:
    """Guards the front door: README.md stays short (the reference lives in docs/)."""
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 150


def test_the_readmes_dractl_commands_run_as_printed(tmp_path: pathlib.Path) -> None:
    """Guards the front door as a new user meets it: every `dractl` command of README.md's sh blocks runs as printed,
    in order, in a fresh directory (the user's own `claims.yaml`/`my-claims.yaml` are an example claim; `kubectl` is a
    stand-in on PATH that prints a node's slices, as `kubectl get resourceslices -o yaml` would), exits 0 and leaves
    what it says it writes."""
    commands = [c for c in _sh_commands(README.read_text(encoding="utf-8")) if c.startswith(("dractl ", "kubectl get"))]
    assert any(c.startswith("kubectl get resourceslices") for c in commands) and len(commands) >= 5, commands
    (tmp_path / "dractl").mkdir()
    (tmp_path / "dractl" / "examples").symlink_to(ROOT / "dractl" / "examples")
    claim = (ROOT / "dractl" / "examples" / "30-pattern1-training.yaml").read_text(encoding="utf-8")
    for name in ("claims.yaml", "my-claims.yaml"):
        (tmp_path / name).write_text(claim, encoding="utf-8")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    dractl = pathlib.Path(sys.executable).parent / "dractl"
    kubectl = bin_dir / "kubectl"
    kubectl.write_text(
        f"#!/bin/sh\nexec {dractl} discover --device-source fake --fake-profile h100-80gb-x8 --node-name n1\n"
    )
    kubectl.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{dractl.parent}:{os.environ['PATH']}"}
    env.pop("KUBECONFIG", None)
    for command in commands:
        done = subprocess.run(
            ["bash", "-o", "pipefail", "-c", command],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, f"{command}: exit {done.returncode}: {done.stderr[-2000:]}"
    for written in ("trace.yaml", "map.html", "node.yaml"):
        assert (tmp_path / written).stat().st_size > 0, written
