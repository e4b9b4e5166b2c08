"""Build dractl's container image without Docker or a registry: the Dockerfile, replayed with mmdebstrap and umoci.

    python3 tools/build_image.py [--tag dractl:0.1.0] [--rebuild none|image|all]

Prints the path of an OCI image archive (a tar of an OCI image layout: `oci-layout`, `index.json`,
`blobs/`) that `ctr -n k8s.io images import` loads as `docker.io/library/dractl:<version>`, the name
a pod's `image: dractl:<version>` resolves to. From Python (the e2e suites): `build_image.build()`
returns an `Image` with that path and name. It runs as root (mmdebstrap, chroot and umoci make files
owned by other users) and needs Debian's `mmdebstrap` and `umoci` (`apt-get install -y mmdebstrap
umoci`), `unshare` and `chroot`.

How each instruction of the Dockerfile is replayed:

- `FROM debian:<suite>-slim`: a root made by `mmdebstrap --variant=minbase <suite>` with merged /usr,
  the dpkg path filters of Debian's -slim images (no documentation, manual pages or translations)
  and mmdebstrap's default sources (the suite, its updates and its security updates).
- `RUN apt-get update && apt-get install -y --no-install-recommends ${X} && rm -rf
  /var/lib/apt/lists/*` as a stage's first RUN: X's packages, installed by that mmdebstrap
  (`--include`; it installs no Recommends either and removes the package lists).
- `ARG`, `ENV`, `WORKDIR`: the environment and the directory of the later steps, as in Docker.
- `COPY SRC... DEST`: the same files of the build context, chosen by `.dockerignore` as Docker does.
- `RUN [--mount=type=bind,source=S,target=T] CMD`: `/bin/sh -c CMD` chrooted into the stage's root in
  private mount and PID namespaces, with /proc, the host's /dev, an empty /tmp, S bound read-only at
  T and, where the root has them, the host's /etc/resolv.conf and CA bundle (so that pip reaches
  PyPI through whatever TLS proxy the host trusts). A stage that the last one copies from runs its
  steps on an overlay over its cached root, which stays as mmdebstrap made it.
- `COPY --from=STAGE SRC DEST` in the last stage: one layer holding STAGE's SRC at DEST.
- `LABEL`, `ENV`, `USER`, `ENTRYPOINT` of the last stage: the image config, as Docker writes it.

Any other instruction or form is refused with its Dockerfile line. The layers differ from Docker's
(Docker adds one per RUN and COPY above the base image's; here the last stage's root, with its
packages and RUN steps, is one layer, then one per COPY --from); the files and the config are the same.

Everything is cached under $XDG_CACHE_HOME/dractl/image (default ~/.cache/dractl/image), keyed by
the content it is made from: the downloaded .deb files; each stage's root (by suite, packages and
steps); the builder's output (by its root, builder.sh and every file of the build context); the OCI
layout (by those and the config); the archive (by the layout and the image name). A build whose
inputs did not change returns at once; one that changed only dractl's source redoes the builder's
compile and the layers. Builds take a lock, so concurrent builds (pytest processes, engineers
sharing a machine) wait for each other and then reuse the result. Only the most recent entries of
each kind are kept.

Reproducible where the inputs allow: file times are clamped to SOURCE_DATE_EPOCH (default 0, the
value used for every time in the image), Python writes hash-based .pyc files, mmdebstrap drops the
files that differ between runs, the layers and the archive are written in a fixed order with fixed
owners, and assembling the same roots twice gives the same digests. The Debian packages and the
Python dependencies are the newest that the suite and pyproject.toml's ranges allow at build time,
which the cache keys do not see: `--rebuild all` fetches them again.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import datetime
import fcntl
import hashlib
import io
import json
import os
import pathlib
import posixpath
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent

# Bump when the way a cache entry is made changes, so no entry made the old way is reused.
FORMAT = 1
REBUILD = ("none", "image", "all")
TOOLS = ("mmdebstrap", "umoci", "unshare", "chroot")
# The environment a Docker base image gives RUN steps and the image config.
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# What Debian's -slim images leave out (debuerreotype's slimify), as dpkg path filters.
SLIM_DPKG_FILTERS = (
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/groff/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/linda/*",
    "path-exclude=/usr/share/lintian/overrides/*",
    "path-exclude=/usr/share/locale/*",
    "path-exclude=/usr/share/man/*",
)
# Docker's predefined build arguments: the host's proxies reach RUN steps without being declared.
PROXY_VARIABLES = ("http_proxy", "https_proxy", "ftp_proxy", "no_proxy", "all_proxy")
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
APT_RUN = re.compile(
    r"apt-get update && apt-get install -y --no-install-recommends (?P<packages>.+?)"
    r" && rm -rf /var/lib/apt/lists/\*"
)
VARIABLE = re.compile(r"\$(?:\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)\}|(?P<bare>[A-Za-z_][A-Za-z0-9_]*))")
REPOSITORY = re.compile(r"(?:[a-z0-9.-]+(?::[0-9]+)?/)?[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*")
TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
KEEP = {"roots": 4, "outputs": 3, "layouts": 3, "archives": 4}
STEP_TIMEOUT = 1800.0
# Private mount and PID namespaces: what a command mounts goes when it ends, and all of it ends when it is killed.
NAMESPACES = ("unshare", "--mount", "--pid", "--fork", "--kill-child", "--propagation", "private")


class BuildError(Exception):
    """The image cannot be built; the message names the file, line or step and what to do."""


# --- The Dockerfile -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Instruction:
    """One Dockerfile instruction: its first line, its keyword upper-cased, its arguments with continuations joined."""

    line: int
    keyword: str
    arguments: str


@dataclasses.dataclass(frozen=True, slots=True)
class Run:
    """A RUN step: `/bin/sh -c command` in `workdir` with exactly `env`, `mounts` (context file, target) bound."""

    line: int
    command: str
    env: tuple[tuple[str, str], ...]
    workdir: str
    mounts: tuple[tuple[str, str], ...]


@dataclasses.dataclass(frozen=True, slots=True)
class Copy:
    """A COPY step: context paths (or paths of the stage `source_stage`) to `dest`, absolute in the stage's root."""

    line: int
    sources: tuple[str, ...]
    dest: str
    source_stage: str | None


@dataclasses.dataclass(frozen=True, slots=True)
class Stage:
    """A build stage: a Debian suite's minimal root with `packages`, then `steps` in order."""

    name: str
    line: int
    image: str
    suite: str
    packages: tuple[str, ...]
    steps: tuple[Run | Copy, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class Config:
    """The image config the last stage declares, as Docker writes it (env as `NAME=value`)."""

    user: str
    entrypoint: tuple[str, ...]
    env: tuple[str, ...]
    labels: tuple[tuple[str, str], ...]


@dataclasses.dataclass(frozen=True, slots=True)
class Recipe:
    """The stages the image needs (the last one is the image) and its config."""

    stages: tuple[Stage, ...]
    config: Config

    def stage(self, name: str) -> Stage:
        return next(stage for stage in self.stages if stage.name == name)


def parse_dockerfile(text: str, *, source: str = "Dockerfile") -> list[Instruction]:
    """The instructions of a Dockerfile, with comments (parser directives too) and blank lines dropped. Pure."""
    lines = text.splitlines()
    instructions: list[Instruction] = []
    index = 0
    while index < len(lines):
        first = index + 1
        current = lines[index].rstrip()
        index += 1
        if not current.strip() or current.lstrip().startswith("#"):
            continue
        parts: list[str] = []
        while current.endswith("\\"):
            parts.append(current[:-1].strip())
            # Docker drops comment and blank lines inside a continued instruction.
            while index < len(lines) and (not lines[index].strip() or lines[index].lstrip().startswith("#")):
                index += 1
            if index == len(lines):
                raise BuildError(f"{source}:{first}: the instruction ends with a line continuation (\\)")
            current = lines[index].rstrip()
            index += 1
        parts.append(current.strip())
        keyword, _, arguments = " ".join(part for part in parts if part).partition(" ")
        instructions.append(Instruction(first, keyword.upper(), arguments.strip()))
    return instructions


def expand(text: str, variables: Mapping[str, str]) -> str:
    """`$NAME` and `${NAME}` replaced by their values, as Docker does outside RUN; an unset one is empty. Pure."""
    return VARIABLE.sub(lambda found: variables.get(found["braced"] or found["bare"], ""), text)


class _StageReader:
    """Reads one stage's instructions into a `Stage`, tracking its variables, environment and directory."""

    def __init__(self, *, name: str, line: int, image: str, suite: str, inherited: Mapping[str, str]) -> None:
        self.name, self.line, self.image, self.suite = name, line, image, suite
        self.inherited = inherited
        self.args: dict[str, str] = {}
        self.env: dict[str, str] = {"PATH": DEFAULT_PATH}
        self.declared_env: dict[str, str] = {}
        self.workdir = "/"
        self.packages: tuple[str, ...] = ()
        self.steps: list[Run | Copy] = []
        self.labels: dict[str, str] = {}
        self.user = ""
        self.entrypoint: tuple[str, ...] = ()

    def variables(self) -> dict[str, str]:
        return {**self.args, **self.env}

    def stage(self) -> Stage:
        return Stage(self.name, self.line, self.image, self.suite, self.packages, tuple(self.steps))


def _key_values(instruction: Instruction, *, source: str) -> list[tuple[str, str]]:
    """`NAME=value` pairs of ENV, LABEL or ARG (ARG's value optional), shell-quoted as Docker reads them."""
    try:
        words = shlex.split(instruction.arguments)
    except ValueError as err:
        raise BuildError(f"{source}:{instruction.line}: {instruction.keyword}: {err}") from None
    pairs: list[tuple[str, str]] = []
    for word in words:
        name, equals, value = word.partition("=")
        if not name or (not equals and instruction.keyword != "ARG"):
            raise BuildError(
                f"{source}:{instruction.line}: {instruction.keyword} {word!r}: write NAME=value"
                " (the older `ENV NAME value` form is not replayed)"
            )
        pairs.append((name, value if equals else "\0"))
    return pairs


def read_recipe(text: str, *, build_args: Mapping[str, str], source: str = "Dockerfile") -> Recipe:
    """The stages and config of a Dockerfile, for the given build arguments (`--build-arg`). Pure.

    Raises BuildError naming the line of any instruction or form this tool cannot replay.
    """
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    reader: _StageReader | None = None
    copied_from_stage = False
    for instruction in parse_dockerfile(text, source=source):
        where = f"{source}:{instruction.line}: {instruction.keyword}"
        keyword = instruction.keyword
        if keyword == "FROM":
            if reader is not None:
                stages.append(reader.stage())
            words = instruction.arguments.split()
            if len(words) == 3 and words[1].lower() == "as":
                name = words[2]
            elif len(words) == 1:
                name = str(len(stages))
            else:
                raise BuildError(f"{where} {instruction.arguments}: write FROM IMAGE [AS NAME]")
            image = expand(words[0], global_args)
            found = re.fullmatch(r"debian:(?P<suite>[a-z]+)-slim", image)
            if found is None:
                raise BuildError(f"{where} {image}: only debian:<suite>-slim bases are replayed (with mmdebstrap)")
            reader = _StageReader(
                name=name, line=instruction.line, image=image, suite=found["suite"], inherited=global_args
            )
            copied_from_stage = False
            continue
        if reader is None:
            if keyword != "ARG":
                raise BuildError(f"{where}: only ARG may come before the first FROM")
            for name, value in _key_values(instruction, source=source):
                global_args[name] = build_args.get(name, "" if value == "\0" else value)
            continue
        if keyword == "ARG":
            for name, value in _key_values(instruction, source=source):
                if name in build_args:
                    reader.args[name] = build_args[name]
                elif value != "\0":
                    reader.args[name] = value
                elif name in reader.inherited:
                    reader.args[name] = reader.inherited[name]
        elif keyword == "ENV":
            for name, value in _key_values(instruction, source=source):
                reader.env[name] = reader.declared_env[name] = expand(value, reader.variables())
        elif keyword == "WORKDIR":
            reader.workdir = posixpath.normpath(
                posixpath.join(reader.workdir, expand(instruction.arguments, reader.variables()))
            )
        elif keyword == "LABEL":
            for name, value in _key_values(instruction, source=source):
                reader.labels[name] = expand(value, reader.variables())
        elif keyword == "USER":
            reader.user = expand(instruction.arguments, reader.variables())
        elif keyword == "ENTRYPOINT":
            try:
                entrypoint = json.loads(instruction.arguments)
            except json.JSONDecodeError:
                entrypoint = None
            if not isinstance(entrypoint, list) or not all(isinstance(word, str) for word in entrypoint):
                raise BuildError(f"{where}: write the exec form, a JSON array of strings")
            reader.entrypoint = tuple(entrypoint)
        elif keyword == "COPY":
            step = _copy(instruction, reader, stages, where=where)
            if step.source_stage is None and copied_from_stage:
                raise BuildError(f"{where}: a COPY of context files after a COPY --from is not replayed: move it above")
            copied_from_stage = copied_from_stage or step.source_stage is not None
            reader.steps.append(step)
        elif keyword == "RUN":
            if copied_from_stage:
                raise BuildError(f"{where}: a RUN after a COPY --from is not replayed: move it above")
            _run(instruction, reader, where=where)
        else:
            raise BuildError(
                f"{where}: not replayed by tools/build_image.py"
                " (it replays FROM, ARG, ENV, WORKDIR, COPY, RUN, LABEL, USER and ENTRYPOINT)"
            )
    if reader is None:
        raise BuildError(f"{source}: has no FROM")
    stages.append(reader.stage())
    final = stages[-1]
    for stage in stages[:-1]:
        for earlier in stage.steps:
            if isinstance(earlier, Copy) and earlier.source_stage is not None:
                raise BuildError(f"{source}:{earlier.line}: COPY --from is replayed only in the last stage")
    needed = {step.source_stage for step in final.steps if isinstance(step, Copy) and step.source_stage}
    config = Config(
        user=reader.user,
        entrypoint=reader.entrypoint,
        env=tuple(f"{name}={value}" for name, value in {"PATH": DEFAULT_PATH, **reader.declared_env}.items()),
        labels=tuple(sorted(reader.labels.items())),
    )
    return Recipe(tuple(stage for stage in stages if stage.name in needed) + (final,), config)


def _copy(instruction: Instruction, reader: _StageReader, stages: Sequence[Stage], *, where: str) -> Copy:
    try:
        words = shlex.split(instruction.arguments)
    except ValueError as err:
        raise BuildError(f"{where}: {err}") from None
    source_stage: str | None = None
    while words and words[0].startswith("--"):
        flag = words.pop(0)
        if not flag.startswith("--from="):
            raise BuildError(f"{where} {flag}: not replayed (only --from=STAGE is)")
        source_stage = flag.removeprefix("--from=")
        if not any(stage.name == source_stage for stage in stages):
            raise BuildError(f"{where} {flag}: no earlier stage is named {source_stage!r}")
    if len(words) < 2 or words[0].startswith("["):
        raise BuildError(f"{where}: write COPY [--from=STAGE] SRC... DEST")
    variables = reader.variables()
    sources = tuple(expand(word, variables) for word in words[:-1])
    for path in sources:
        if any(character in path for character in "*?["):
            raise BuildError(f"{where} {path}: wildcards in COPY sources are not replayed")
    dest = expand(words[-1], variables)
    absolute = posixpath.normpath(posixpath.join(reader.workdir, dest))
    if dest.endswith("/") or len(sources) > 1:
        absolute += "/"
    return Copy(instruction.line, sources, absolute, source_stage)


def _run(instruction: Instruction, reader: _StageReader, *, where: str) -> None:
    arguments = instruction.arguments
    mounts: list[tuple[str, str]] = []
    while arguments.startswith("--"):
        flag, _, arguments = arguments.partition(" ")
        arguments = arguments.lstrip()
        options = dict(option.partition("=")[::2] for option in flag.removeprefix("--mount=").split(","))
        unknown = set(options) - {"type", "source", "target"}
        if not flag.startswith("--mount=") or options.get("type") != "bind" or unknown:
            raise BuildError(f"{where} {flag}: not replayed (only --mount=type=bind,source=S,target=T is)")
        if not options.get("source") or not posixpath.isabs(options.get("target", "")):
            raise BuildError(f"{where} {flag}: needs source= (a context path) and an absolute target=")
        mounts.append((options["source"], options["target"]))
    apt = APT_RUN.fullmatch(arguments)
    if apt is not None:
        if reader.steps or reader.packages:
            raise BuildError(f"{where}: apt-get is replayed only as the stage's first step")
        packages = tuple(expand(apt["packages"], reader.variables()).split())
        if not packages:
            raise BuildError(f"{where}: {apt['packages']} names no package: declare it with ARG in this stage")
        reader.packages = packages
        return
    if "apt-get" in arguments:
        raise BuildError(
            f"{where}: apt-get is replayed only as `apt-get update && apt-get install -y --no-install-recommends"
            " PACKAGES && rm -rf /var/lib/apt/lists/*`"
        )
    env = {**reader.args, **reader.env}
    env.setdefault("HOME", "/root")
    reader.steps.append(Run(instruction.line, arguments, tuple(sorted(env.items())), reader.workdir, tuple(mounts)))


# --- The build context ----------------------------------------------------------------------------


IgnoreRules = tuple[tuple[bool, "re.Pattern[str]"], ...]


def ignore_rules(text: str, *, source: str = ".dockerignore") -> IgnoreRules:
    """The rules of a .dockerignore, in order: (re-included?, pattern). Pure.

    Docker's syntax for `*`, `?`, `**` and `!`; character classes and escapes raise BuildError.
    """
    rules: list[tuple[bool, re.Pattern[str]]] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        include = line.startswith("!")
        pattern = posixpath.normpath(line.removeprefix("!").strip()).lstrip("/")
        if any(character in pattern for character in "[]\\"):
            raise BuildError(f"{source}:{number}: {line}: character classes and escapes are not supported")
        expression = ""
        for part in re.split(r"(\*\*/|\*\*|\*|\?)", pattern):
            expression += {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}.get(part, re.escape(part))
        rules.append((include, re.compile(expression)))
    return tuple(rules)


def ignored(path: str, rules: IgnoreRules) -> bool:
    """Whether Docker leaves the context path (relative, with /) out: the last rule matching it or a parent wins."""
    parts = path.split("/")
    candidates = ["/".join(parts[: end + 1]) for end in range(len(parts))]
    result = False
    for include, pattern in rules:
        if any(pattern.fullmatch(candidate) for candidate in candidates):
            result = not include
    return result


def copied_files(context: pathlib.Path, step: Copy, rules: IgnoreRules) -> list[tuple[pathlib.Path, str]]:
    """The (context file, absolute destination) pairs a COPY of context files makes, sorted; Docker's semantics.

    A directory source copies its contents (not itself); files that .dockerignore leaves out are
    not copied. A source that is missing or left out raises BuildError, as `docker build` fails.
    """
    pairs: list[tuple[pathlib.Path, str]] = []
    for source in step.sources:
        relative = posixpath.normpath(source).lstrip("/")
        path = context / relative
        if relative == "." or not (path.exists() or path.is_symlink()) or ignored(relative, rules):
            raise BuildError(
                f"Dockerfile:{step.line}: COPY {source}: not in the build context"
                " (missing, or left out by .dockerignore)"
            )
        if path.is_dir() and not path.is_symlink():
            for directory, subdirectories, files in os.walk(path):
                subdirectories.sort()
                for name in sorted(files):
                    inner = pathlib.Path(directory, name)
                    below = inner.relative_to(context).as_posix()
                    if not ignored(below, rules):
                        pairs.append((inner, posixpath.join(step.dest, inner.relative_to(path).as_posix())))
        else:
            dest = posixpath.join(step.dest, path.name) if step.dest.endswith("/") else step.dest
            pairs.append((path, dest))
    return sorted(pairs, key=lambda pair: pair[1])


# --- Inputs: version, time, name ------------------------------------------------------------------


def read_version(root: pathlib.Path = ROOT) -> str:
    """dractl's version, `__version__` in dractl/__init__.py, read without importing dractl."""
    path = root / "dractl" / "__init__.py"
    try:
        tree = ast.parse(path.read_text(), filename=str(path))
    except (OSError, SyntaxError) as err:
        raise BuildError(f"{path}: cannot read __version__: {err}") from None
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(target, ast.Name) and target.id == "__version__" for target in node.targets)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
            and TAG.fullmatch(node.value.value)
        ):
            return node.value.value
    raise BuildError(f'{path}: __version__: no `__version__ = "X.Y.Z"` (letters, digits, ".", "_", "-") found')


def source_date_epoch(environment: Mapping[str, str]) -> int:
    """SOURCE_DATE_EPOCH from the environment (default 0): the time of every file and date in the image."""
    value = environment.get("SOURCE_DATE_EPOCH", "0")
    if not re.fullmatch(r"[0-9]{1,11}", value):
        raise BuildError(f"SOURCE_DATE_EPOCH: {value!r} is not a whole number of seconds since 1970-01-01")
    return int(value)


def image_name(tag: str) -> tuple[str, str]:
    """containerd's full name for `--tag`, and the tag: `dractl:0.1.0` -> `docker.io/library/dractl:0.1.0`, `0.1.0`.

    Names are normalized as the kubelet normalizes a pod's `image:`. Raises BuildError when the
    tag is not REPOSITORY:TAG.
    """
    repository, colon, version = tag.rpartition(":")
    if not colon or "/" in version or not REPOSITORY.fullmatch(repository) or not TAG.fullmatch(version):
        raise BuildError(f"--tag: {tag!r} is not NAME:TAG (lower-case name, e.g. dractl:0.1.0)")
    first, slash, _ = repository.partition("/")
    if not slash:
        repository = f"docker.io/library/{repository}"
    elif "." not in first and ":" not in first and first != "localhost":
        repository = f"docker.io/{repository}"
    return f"{repository}:{version}", version


def _timestamp(epoch: int) -> str:
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _digest(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:24]


def _file_digest(path: pathlib.Path) -> str:
    if path.is_symlink():
        return "symlink:" + os.readlink(path)
    return hashlib.sha256(path.read_bytes()).hexdigest() + (":x" if os.access(path, os.X_OK) else "")


# --- Running things -------------------------------------------------------------------------------


def chroot_argv(
    root: pathlib.Path,
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    workdir: str = "/",
    user: str | None = None,
    binds: Sequence[tuple[pathlib.Path, str]] = (),
    network: bool = False,
    overlay: tuple[pathlib.Path, pathlib.Path, pathlib.Path] | None = None,
    then: Sequence[str] = (),
) -> list[str]:
    """The command running `argv` chrooted into `root` as a container would, leaving no trace on the host.

    It runs in private mount and PID namespaces (whatever it mounts goes when it ends, and
    `--kill-child` ends it all when the caller kills it), with /proc, the host's /dev, an empty
    /tmp, exactly `env`, `binds` (host path, path in the root) read-only, and with `network` the
    host's resolv.conf and CA bundle over the root's own. With `overlay` (lower, upper, work),
    `root` is the mount point of an overlay and writes go to upper. `then` are shell lines run in
    the namespace afterwards (the root still mounted). Pure: only builds the argv.
    """
    target = shlex.quote(str(root))
    lines = ["set -eu"]
    if overlay is not None:
        lower, upper, work = (shlex.quote(str(path)) for path in overlay)
        lines.append(f"mount -t overlay overlay -o lowerdir={lower},upperdir={upper},workdir={work} {target}")
    lines += [
        f"mount -t proc proc {target}/proc",
        f"mount --rbind /dev {target}/dev",
        f"mount -t tmpfs -o mode=1777 tmpfs {target}/tmp",
    ]
    if network:
        for path in ("/etc/resolv.conf", CA_BUNDLE):
            inside = f"{target}{path}"
            lines.append(f"if [ -f {path} ] && [ -f {inside} ]; then mount --bind -o ro {path} {inside}; fi")
    for host, inside_path in binds:
        inside = shlex.quote(f"{root}{inside_path}")
        make = f"mkdir -p {inside}" if host.is_dir() else f'mkdir -p "$(dirname {inside})" && touch {inside}'
        lines += [make, f"mount --bind -o ro {shlex.quote(str(host))} {inside}"]
    command = ["chroot", *([f"--userspec={user}"] if user else []), str(root)]
    command += ["/usr/bin/env", "-i", "-C", workdir, *(f"{name}={value}" for name, value in env.items()), *argv]
    lines.append(shlex.join(command))
    lines.extend(then)
    return [*NAMESPACES, "sh", "-c", "\n".join(lines)]


def _execute(argv: Sequence[str], *, log: pathlib.Path, what: str, env: Mapping[str, str] | None = None) -> None:
    """Run argv with its output in `log`; BuildError with the output's end when it fails or runs too long."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as output:
        try:
            done = subprocess.run(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                env=env,
                timeout=STEP_TIMEOUT,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise BuildError(f"{what}: still running after {STEP_TIMEOUT:.0f} s, stopped; its output: {log}") from None
    if done.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
        raise BuildError(f"{what}: exited with {done.returncode}; the end of its output ({log}):\n{tail}")


def _clamp_times(tree: pathlib.Path, epoch: int) -> None:
    """Set every time later than `epoch` in the tree to `epoch` (symlinks themselves, not their targets)."""
    for directory, subdirectories, files in os.walk(tree):
        for name in subdirectories + files:
            path = os.path.join(directory, name)
            if os.lstat(path).st_mtime > epoch:
                os.utime(path, (epoch, epoch), follow_symlinks=False)
    if tree.stat().st_mtime > epoch:
        os.utime(tree, (epoch, epoch))


# --- The build ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Image:
    """A built image: the OCI archive, containerd's name for it, the manifest's digest, and what this call made.

    `made` lists the cache kinds built by this call (`roots`, `outputs`, `layouts`, `archives`);
    empty when everything came from the cache.
    """

    archive: pathlib.Path
    name: str
    tag: str
    digest: str
    made: tuple[str, ...]


def default_cache() -> pathlib.Path:
    """$XDG_CACHE_HOME/dractl/image, default ~/.cache/dractl/image."""
    base = os.environ.get("XDG_CACHE_HOME") or str(pathlib.Path.home() / ".cache")
    return pathlib.Path(base) / "dractl" / "image"


class _Build:
    """One build's plan: every cache key computed up front from the recipe and the context, entries made on demand."""

    def __init__(
        self,
        *,
        recipe: Recipe,
        rules: IgnoreRules,
        epoch: int,
        cache: pathlib.Path,
        rebuild: frozenset[str],
        report: Callable[[str], None],
    ) -> None:
        self.recipe, self.rules, self.epoch, self.cache = recipe, rules, epoch, cache
        self.rebuild, self.report = rebuild, report
        self.made: list[str] = []
        self.step_keys = {stage.name: self._steps_key(stage) for stage in recipe.stages}
        self.final = recipe.stages[-1]
        self.copies = [step for step in self.final.steps if isinstance(step, Copy) and step.source_stage]
        self.layout_key = _digest(
            FORMAT,
            self._root_key(self.final, with_steps=True),
            [(self._output_key(step), step.sources, step.dest) for step in self.copies],
            dataclasses.asdict(recipe.config),
            epoch,
        )

    def _base_key(self, stage: Stage) -> list[object]:
        return [FORMAT, stage.suite, stage.packages, SLIM_DPKG_FILTERS, self.epoch]

    def _root_key(self, stage: Stage, *, with_steps: bool) -> str:
        return _digest(self._base_key(stage), self.step_keys[stage.name] if with_steps else None)

    def _output_key(self, step: Copy) -> str:
        assert step.source_stage is not None
        stage = self.recipe.stage(step.source_stage)
        sources = sorted({source for copy in self.copies if copy.source_stage == stage.name for source in copy.sources})
        return _digest(self._root_key(stage, with_steps=False), self.step_keys[stage.name], sources)

    def _steps_key(self, stage: Stage) -> str:
        """A digest of a stage's steps and of every context file they copy or bind."""
        parts: list[object] = []
        for step in stage.steps:
            if isinstance(step, Copy) and step.source_stage is None:
                files = copied_files(ROOT, step, self.rules)
                parts.append(["COPY", [(dest, _file_digest(path)) for path, dest in files]])
            elif isinstance(step, Run):
                mounts = [(target, _tree_digest(ROOT / source)) for source, target in step.mounts]
                parts.append(["RUN", step.command, step.env, step.workdir, mounts])
        return _digest(parts)

    # Cache entries: <cache>/<kind>/<key>/, made under a temporary name and renamed when complete.

    def _entry(self, kind: str, key: str, make: Callable[[pathlib.Path], None], what: str) -> pathlib.Path:
        entry = self.cache / kind / key
        if entry.exists() and kind not in self.rebuild:
            os.utime(entry)
            return entry
        scratch = self.cache / kind / f"{key}.tmp-{os.getpid()}"
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir(parents=True)
        started = time.monotonic()
        self.report(f"build_image: {what}...")
        try:
            make(scratch)
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            raise
        if entry.exists():
            shutil.rmtree(entry)
        scratch.rename(entry)
        self.made.append(kind)
        self.report(f"build_image: {what}: {time.monotonic() - started:.0f} s")
        return entry

    def _logs(self, name: str) -> pathlib.Path:
        return self.cache / "logs" / f"{name}.log"

    def root(self, stage: Stage, *, with_steps: bool) -> pathlib.Path:
        """The stage's root: mmdebstrap's, then (with_steps) its COPY and RUN steps applied in place."""

        def make(scratch: pathlib.Path) -> None:
            root = scratch / "root"
            self._mmdebstrap(stage, root)
            if with_steps:
                self._apply_steps(stage, root, overlay=None)
                # What a container runtime provides and the host put there does not belong in a layer.
                for name in ("dev", "proc", "sys", "tmp"):
                    for inner in (root / name).iterdir():
                        if inner.is_dir() and not inner.is_symlink():
                            shutil.rmtree(inner)
                        else:
                            inner.unlink()
                for name in ("etc/resolv.conf", "etc/hostname"):
                    (root / name).unlink(missing_ok=True)
                _clamp_times(root, self.epoch)

        what = f"stage {stage.name}: mmdebstrap {stage.suite} + {' '.join(stage.packages)}"
        key = self._root_key(stage, with_steps=with_steps)
        return self._entry("roots", key, make, what + (" + its steps" if with_steps else "")) / "root"

    def _mmdebstrap(self, stage: Stage, root: pathlib.Path) -> None:
        debs = self.cache / "debs"
        debs.mkdir(parents=True, exist_ok=True)
        argv = [
            "mmdebstrap",
            "--variant=minbase",
            "--mode=root",
            "--format=directory",
            "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
            "--skip=essential/unlink",
            f"--include={','.join(stage.packages)}",
            *(f"--dpkgopt={rule}" for rule in SLIM_DPKG_FILTERS),
            # Downloaded packages are kept between builds (mmdebstrap's documented way to cache them).
            '--setup-hook=mkdir -p "$1"/var/cache/apt/archives/',
            f"--setup-hook=sync-in {debs} /var/cache/apt/archives/",
            f"--customize-hook=sync-out /var/cache/apt/archives {debs}",
            stage.suite,
            str(root),
        ]
        environment = {**os.environ, "SOURCE_DATE_EPOCH": str(self.epoch)}
        # In its own mount and PID namespaces, so a failed or stopped mmdebstrap leaves no mount behind.
        wrapped = [*NAMESPACES, *argv]
        _execute(
            wrapped,
            log=self._logs(f"mmdebstrap-{stage.name}"),
            what=f"mmdebstrap of stage {stage.name}",
            env=environment,
        )

    def _apply_steps(
        self,
        stage: Stage,
        root: pathlib.Path,
        *,
        overlay: tuple[pathlib.Path, pathlib.Path, pathlib.Path] | None,
        then: Sequence[str] = (),
    ) -> None:
        """COPY and RUN steps in order; with an overlay, files are copied into its upper directory."""
        files_root = overlay[1] if overlay is not None else root
        runs = [step for step in stage.steps if isinstance(step, Run)]
        for step in stage.steps:
            if isinstance(step, Copy) and step.source_stage is None:
                for path, dest in copied_files(ROOT, step, self.rules):
                    _place(path, files_root / dest.lstrip("/"))
            elif isinstance(step, Run):
                (files_root / step.workdir.lstrip("/")).mkdir(parents=True, exist_ok=True)
                binds = [(ROOT / source, target) for source, target in step.mounts]
                argv = chroot_argv(
                    root,
                    ["/bin/sh", "-c", step.command],
                    env={**dict(step.env), **_proxies()},
                    workdir=step.workdir,
                    binds=binds,
                    network=True,
                    overlay=overlay,
                    then=then if step is runs[-1] else (),
                )
                _execute(
                    argv,
                    log=self._logs(f"run-{stage.name}-{step.line}"),
                    what=f"Dockerfile:{step.line}: RUN {step.command}",
                )

    def output(self, step: Copy) -> pathlib.Path:
        """What the last stage copies from `step.source_stage`: its steps run on an overlay over its cached root."""
        assert step.source_stage is not None
        stage = self.recipe.stage(step.source_stage)
        base = self.root(stage, with_steps=False)
        sources = sorted({source for copy in self.copies if copy.source_stage == stage.name for source in copy.sources})

        def make(scratch: pathlib.Path) -> None:
            upper, work, merged, tree = (scratch / name for name in ("upper", "work", "merged", "tree"))
            for path in (upper, work, merged, tree):
                path.mkdir()
            then = [
                f"mkdir -p {shlex.quote(str((tree / source.lstrip('/')).parent))} && "
                f"cp -a {shlex.quote(str(merged / source.lstrip('/')))} {shlex.quote(str(tree / source.lstrip('/')))}"
                for source in sources
            ]
            if not any(isinstance(inner, Run) for inner in stage.steps):
                raise BuildError(f"Dockerfile:{stage.line}: stage {stage.name} has no RUN step to copy results from")
            self._apply_steps(stage, merged, overlay=(base, upper, work), then=then)
            for name in ("upper", "work", "merged"):
                shutil.rmtree(scratch / name)
            _clamp_times(tree, self.epoch)

        key = self._output_key(step)
        return self._entry("outputs", key, make, f"stage {stage.name}: its steps (the compile)") / "tree"

    def layout(self) -> pathlib.Path:
        """The OCI image layout (tag `build`): the last stage's root, one layer per COPY --from, the config."""

        def make(scratch: pathlib.Path) -> None:
            layout = scratch / "layout"
            image = f"{layout}:build"
            created = _timestamp(self.epoch)
            umoci = self._logs("umoci")
            _execute(["umoci", "init", "--layout", str(layout)], log=umoci, what="umoci init")
            _execute(["umoci", "new", "--image", image], log=umoci, what="umoci new")

            def insert(tree: pathlib.Path, dest: str, *, created_by: str) -> None:
                """One layer: `tree` at `dest` in the image, with its history entry."""
                argv = ["umoci", "insert", "--image", image, "--history.created", created]
                argv += ["--history.created_by", created_by, str(tree), dest]
                _execute(argv, log=umoci, what=f"umoci insert {dest}")

            runs = "; ".join(f"RUN {step.command}" for step in self.final.steps if isinstance(step, Run))
            packages = " ".join(self.final.packages)
            insert(
                final_root, "/", created_by=f"FROM {self.final.image} (mmdebstrap); apt-get install {packages}; {runs}"
            )
            for step, tree in zip(self.copies, outputs, strict=True):
                for source in step.sources:
                    # As Docker's COPY: a directory's contents go to DEST, a file into DEST/ or to DEST.
                    copied = tree / source.lstrip("/")
                    dest = step.dest.rstrip("/") or "/"
                    if step.dest.endswith("/") and not copied.is_dir():
                        dest = posixpath.join(step.dest, copied.name)
                    insert(copied, dest, created_by=f"COPY --from={step.source_stage} {source} {dest}")
            config = self.recipe.config
            argv = [
                "umoci",
                "config",
                "--image",
                image,
                "--created",
                created,
                "--history.created",
                created,
                "--history.created_by",
                "LABEL, ENV, USER, ENTRYPOINT (Dockerfile)",
                "--config.user",
                config.user,
            ]
            argv += [word for part in config.entrypoint for word in ("--config.entrypoint", part)]
            argv += [word for variable in config.env for word in ("--config.env", variable)]
            argv += [word for name, value in config.labels for word in ("--config.label", f"{name}={value}")]
            _execute(argv, log=umoci, what="umoci config")
            _execute(["umoci", "gc", "--layout", str(layout)], log=umoci, what="umoci gc")

        final_root = self.root(self.final, with_steps=True)
        outputs = [self.output(step) for step in self.copies]
        return self._entry("layouts", self.layout_key, make, "the OCI layout (umoci)") / "layout"

    def archive(self, name: str, tag: str) -> pathlib.Path:
        """The layout as one tar, index.json naming the image as `docker save` does; cached per name."""
        file_name = f"{name.rpartition('/')[2].replace(':', '-')}.oci.tar"

        def make(scratch: pathlib.Path) -> None:
            write_archive(layout, scratch / file_name, name=name, tag=tag, epoch=self.epoch)

        layout = self.layout()
        key = _digest(self.layout_key, name, tag)
        return self._entry("archives", key, make, f"the archive {file_name}") / file_name

    def archive_if_cached(self, name: str, tag: str) -> pathlib.Path | None:
        file_name = f"{name.rpartition('/')[2].replace(':', '-')}.oci.tar"
        entry = self.cache / "archives" / _digest(self.layout_key, name, tag)
        if self.rebuild or not entry.exists():
            return None
        os.utime(entry)
        return entry / file_name


def _tree_digest(path: pathlib.Path) -> str:
    if path.is_dir():
        return _digest(
            [
                (inner.relative_to(path).as_posix(), _file_digest(inner))
                for inner in sorted(path.rglob("*"))
                if inner.is_file()
            ]
        )
    if not path.exists():
        raise BuildError(f"{path}: a RUN --mount source that does not exist")
    return _file_digest(path)


def _place(source: pathlib.Path, dest: pathlib.Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(source, dest, follow_symlinks=False)


def _proxies() -> dict[str, str]:
    return {
        name: os.environ[name]
        for variable in PROXY_VARIABLES
        for name in (variable, variable.upper())
        if name in os.environ
    }


def write_archive(layout: pathlib.Path, archive: pathlib.Path, *, name: str, tag: str, epoch: int) -> None:
    """Write the OCI layout as an uncompressed tar: entries sorted, owned by 0:0, all dated `epoch`.

    index.json names the one manifest with `io.containerd.image.name` (containerd's import uses it
    as the image's name) and `org.opencontainers.image.ref.name` (the tag), as `docker save` does.
    """
    index = json.loads((layout / "index.json").read_text())
    (manifest,) = index["manifests"]
    manifest["annotations"] = {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": tag}
    index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [manifest]}
    members: list[tuple[str, bytes | pathlib.Path | None]] = [
        ("blobs/", None),
        ("blobs/sha256/", None),
        ("index.json", json.dumps(index, sort_keys=True, separators=(",", ":")).encode()),
        ("oci-layout", (layout / "oci-layout").read_bytes()),
    ]
    members += [(f"blobs/sha256/{blob.name}", blob) for blob in sorted((layout / "blobs" / "sha256").iterdir())]
    with tarfile.open(archive, "w", format=tarfile.USTAR_FORMAT) as output:
        for member, content in sorted(members, key=lambda item: item[0]):
            info = tarfile.TarInfo(member.rstrip("/"))
            info.mtime, info.uid, info.gid, info.uname, info.gname = epoch, 0, 0, "", ""
            if content is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                output.addfile(info)
            elif isinstance(content, bytes):
                info.size, info.mode = len(content), 0o644
                output.addfile(info, io.BytesIO(content))
            else:
                info.size, info.mode = content.stat().st_size, 0o644
                with content.open("rb") as blob:
                    output.addfile(info, blob)


def read_image(archive: pathlib.Path) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(index.json, the manifest, the config) of an OCI archive: what a runtime reads before the layers."""
    with tarfile.open(archive) as members:

        def blob(name: str) -> dict[str, Any]:
            extracted = members.extractfile(name)
            if extracted is None:
                raise BuildError(f"{archive}: {name} is not a file")
            loaded: dict[str, Any] = json.load(extracted)
            return loaded

        index = blob("index.json")
        manifest = blob("blobs/sha256/" + index["manifests"][0]["digest"].removeprefix("sha256:"))
        config = blob("blobs/sha256/" + manifest["config"]["digest"].removeprefix("sha256:"))
    return index, manifest, config


def _prune(cache: pathlib.Path) -> None:
    """Remove unfinished entries (no build holds the lock) and all but the most recently used of each kind."""
    for kind, keep in KEEP.items():
        directory = cache / kind
        if not directory.is_dir():
            continue
        entries = sorted(directory.iterdir(), key=lambda entry: entry.stat().st_mtime, reverse=True)
        finished = [entry for entry in entries if ".tmp-" not in entry.name]
        for entry in [entry for entry in entries if ".tmp-" in entry.name] + finished[keep:]:
            shutil.rmtree(entry, ignore_errors=True)


@contextlib.contextmanager
def _locked(cache: pathlib.Path, report: Callable[[str], None]) -> Iterator[None]:
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / "lock").open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            report(f"build_image: waiting for another build to release {cache / 'lock'}")
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def preflight() -> None:
    """BuildError unless this is root with every tool the build runs on PATH."""
    if os.geteuid() != 0:
        raise BuildError("needs root: mmdebstrap, chroot and umoci make files owned by other users")
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        raise BuildError(f"needs {', '.join(missing)} on PATH: apt-get install -y mmdebstrap umoci")


def build(
    *,
    tag: str | None = None,
    rebuild: str = "none",
    cache: pathlib.Path | None = None,
    report: Callable[[str], None] = _stderr,
) -> Image:
    """Build (or take from the cache) the image the Dockerfile describes; returns its OCI archive and name.

    `tag` defaults to `dractl:<version>`. `rebuild`: `none` reuses every cached entry whose inputs
    are unchanged; `image` re-assembles the layers and the archive from the cached roots; `all`
    rebuilds everything but the downloaded packages. Safe to call concurrently (a lock), and again:
    unchanged inputs return the cached archive without running anything.
    """
    if rebuild not in REBUILD:
        raise BuildError(f"--rebuild: {rebuild!r} is not one of {', '.join(REBUILD)}")
    version = read_version()
    epoch = source_date_epoch(os.environ)
    name, short_tag = image_name(tag or f"dractl:{version}")
    dockerfile = ROOT / "Dockerfile"
    recipe = read_recipe(
        dockerfile.read_text(), build_args={"VERSION": version, "SOURCE_DATE_EPOCH": str(epoch)}, source=str(dockerfile)
    )
    rules = ignore_rules((ROOT / ".dockerignore").read_text(), source=str(ROOT / ".dockerignore"))
    kinds = {"none": frozenset(), "image": frozenset({"layouts", "archives"}), "all": frozenset(KEEP)}[rebuild]
    plan = _Build(recipe=recipe, rules=rules, epoch=epoch, cache=cache or default_cache(), rebuild=kinds, report=report)
    cached = plan.archive_if_cached(name, short_tag)
    if cached is None:
        preflight()
        with _locked(plan.cache, report):
            _prune(plan.cache)
            cached = plan.archive(name, short_tag)
    index, _, _ = read_image(cached)
    return Image(cached, name, short_tag, index["manifests"][0]["digest"], tuple(plan.made))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--tag",
        default=os.environ.get("DRACTL_TAG"),
        help="Image name and tag, as a pod's image: field names it (default: dractl:<version>). [env: DRACTL_TAG]",
    )
    parser.add_argument(
        "--rebuild",
        choices=REBUILD,
        default=os.environ.get("DRACTL_REBUILD", "none"),
        help="none reuses what is cached; image re-assembles the layers; all rebuilds all but the downloaded"
        " packages (default: none). [env: DRACTL_REBUILD]",
    )
    arguments = parser.parse_args(argv)
    try:
        image = build(tag=arguments.tag, rebuild=arguments.rebuild)
    except BuildError as err:
        print(f"build_image: {err}", file=sys.stderr)
        return 1
    print(image.archive)
    return 0


if __name__ == "__main__":
    sys.exit(main())
