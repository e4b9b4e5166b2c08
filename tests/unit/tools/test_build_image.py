"""tools/build_image.py without building: how it reads the Dockerfile, .dockerignore and its inputs, and its archive."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import subprocess
import sys
import tarfile

import build_image
import pytest

import dractl

ROOT = pathlib.Path(__file__).resolve().parents[3]
BUILD_ARGS = {"VERSION": dractl.__version__, "SOURCE_DATE_EPOCH": "0"}
APT = "RUN apt-get update && apt-get install -y --no-install-recommends ${P} && rm -rf /var/lib/apt/lists/*"


def _recipe() -> build_image.Recipe:
    return build_image.read_recipe((ROOT / "Dockerfile").read_text(), build_args=BUILD_ARGS)


def test_runtime_stage_installs_no_compiler_and_builder_stage_does() -> None:
    """Guards: the image's stage installs python3 and libyaml but no compiler or headers; the builder's has them."""
    recipe = _recipe()
    runtime, builder = recipe.stages[-1], recipe.stage("builder")
    assert [stage.name for stage in recipe.stages] == ["builder", "runtime"]
    assert runtime.packages == ("python3", "libyaml-0-2")
    assert not [package for package in runtime.packages if package.endswith("-dev") or package in ("gcc", "g++")]
    assert {"gcc", "python3-dev", "libyaml-dev"} <= set(builder.packages)
    assert [
        (step.source_stage, step.sources, step.dest) for step in runtime.steps if isinstance(step, build_image.Copy)
    ] == [("builder", ("/opt/dractl",), "/opt/dractl")]


def test_dockerfile_config_is_replayed_with_the_version() -> None:
    """Guards: the config read from the Dockerfile: non-root user, dractl as entrypoint, the version in its label."""
    config = _recipe().config
    assert config.user == "10001:10001"
    assert config.entrypoint == ("/opt/dractl/bin/dractl",)
    assert config.env[0] == "PATH=/opt/dractl/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    labels = dict(config.labels)
    assert labels["org.opencontainers.image.version"] == dractl.__version__
    assert labels["org.opencontainers.image.title"] == "dractl"
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"


def test_builder_steps_get_the_build_arguments_and_the_script() -> None:
    """Guards: the compile runs builder.sh in /src with VERSION and SOURCE_DATE_EPOCH, as `docker build` gives them."""
    (run,) = [step for step in _recipe().stage("builder").steps if isinstance(step, build_image.Run)]
    env = dict(run.env)
    assert (run.command, run.workdir) == ("sh /tmp/builder.sh", "/src")
    assert (env["VERSION"], env["SOURCE_DATE_EPOCH"]) == (dractl.__version__, "0")
    assert run.mounts == (("tools/image/builder.sh", "/tmp/builder.sh"),)


@pytest.mark.parametrize(
    ("path", "left_out"),
    [
        ("pyproject.toml", False),
        ("setup.py", False),
        ("README.md", False),
        ("dractl/alloc.py", False),
        ("dractl/_alloc.pyx", False),
        ("dractl/_alloc_binpack.pxi", False),
        ("dractl/node/profiles/models.yaml", False),
        ("tools/image/builder.sh", False),
        ("dractl/_alloc.c", True),
        ("dractl/_alloc.cpython-311-x86_64-linux-gnu.so", True),
        ("dractl/__pycache__/alloc.cpython-311.pyc", True),
        ("dractl/_alloc.html", True),
        ("tests/conftest.py", True),
        ("tools/build_image.py", True),
        (".venv/bin/python", True),
        ("build/lib/dractl/alloc.py", True),
    ],
)
def test_dockerignore_sends_only_the_package_sources(path: str, left_out: bool) -> None:
    """Guards: the context holds the package's sources and the image scripts, never build outputs or the venv."""
    rules = build_image.ignore_rules((ROOT / ".dockerignore").read_text())
    assert build_image.ignored(path, rules) is left_out


def test_copied_files_are_the_sources_without_build_outputs() -> None:
    """Guards: the builder's COPY takes every source file of dractl/ (the .pyx included) and no compiled file."""
    recipe = _recipe()
    rules = build_image.ignore_rules((ROOT / ".dockerignore").read_text())
    copies = [step for step in recipe.stage("builder").steps if isinstance(step, build_image.Copy)]
    dests = [dest for step in copies for _, dest in build_image.copied_files(ROOT, step, rules)]
    assert {"/src/pyproject.toml", "/src/setup.py", "/src/README.md", "/src/dractl/_alloc.pyx"} <= set(dests)
    assert "/src/dractl/model/decode/_fastyaml.pyx" in dests
    assert not [dest for dest in dests if dest.endswith((".so", ".c", ".pyc")) or "__pycache__" in dest]


@pytest.mark.parametrize(
    ("dockerfile", "message"),
    [
        ("FROM ubuntu:22.04\n", "Dockerfile:1: FROM ubuntu:22.04: only debian:<suite>-slim bases are replayed"),
        ("ENV A=1\nFROM debian:bookworm-slim\n", "Dockerfile:1: ENV: only ARG may come before the first FROM"),
        ("FROM debian:bookworm-slim\nEXPOSE 8080\n", "Dockerfile:2: EXPOSE: not replayed by tools/build_image.py"),
        ("FROM debian:bookworm-slim\nENTRYPOINT dractl\n", "Dockerfile:2: ENTRYPOINT: write the exec form"),
        ("FROM debian:bookworm-slim\nENV A 1\n", "Dockerfile:2: ENV 'A': write NAME=value"),
        ("FROM debian:bookworm-slim\nCOPY --chown=1:1 a /b\n", "Dockerfile:2: COPY --chown=1:1: not replayed"),
        ("FROM debian:bookworm-slim\nCOPY a*.py /b/\n", "Dockerfile:2: COPY a*.py: wildcards in COPY sources"),
        ("FROM debian:bookworm-slim\nRUN --network=none true\n", "Dockerfile:2: RUN --network=none: not replayed"),
        ("FROM debian:bookworm-slim\nRUN apt-get install -y gcc\n", "Dockerfile:2: RUN: apt-get is replayed only as"),
        ("FROM debian:bookworm-slim\n" + APT + "\n", "Dockerfile:2: RUN: ${P} names no package: declare it with ARG"),
        (
            "FROM debian:bookworm-slim\nRUN true\nARG P=gcc\n" + APT + "\n",
            "Dockerfile:4: RUN: apt-get is replayed only",
        ),
        ("FROM debian:bookworm-slim\nRUN true \\\n", "Dockerfile:2: the instruction ends with a line continuation"),
        (
            "FROM debian:bookworm-slim AS b\nFROM debian:bookworm-slim\nCOPY --from=a /x /x\n",
            "no earlier stage is named",
        ),
        (
            "FROM debian:bookworm-slim AS b\nRUN true\nFROM debian:bookworm-slim\nCOPY --from=b /o /o\nRUN true\n",
            "Dockerfile:5: RUN: a RUN after a COPY --from is not replayed",
        ),
        ("ARG A=1\n", "Dockerfile: has no FROM"),
    ],
    ids=[
        "other-base",
        "env-before-from",
        "unknown-instruction",
        "shell-entrypoint",
        "old-env-form",
        "copy-chown",
        "copy-wildcard",
        "run-flag",
        "bare-apt-get",
        "undeclared-packages",
        "apt-get-after-a-step",
        "dangling-continuation",
        "unknown-stage",
        "run-after-copy-from",
        "no-from",
    ],
)
def test_dockerfile_it_cannot_replay_is_refused_with_its_line(dockerfile: str, message: str) -> None:
    """Guards: an instruction or form the tool would not replay faithfully is refused, naming its line and the fix."""
    with pytest.raises(build_image.BuildError) as err:
        build_image.read_recipe(dockerfile, build_args=BUILD_ARGS)
    assert message in str(err.value)


def test_dockerignore_with_a_character_class_is_refused_with_its_line() -> None:
    """Guards: .dockerignore syntax the tool does not match as Docker does is refused, naming the line."""
    with pytest.raises(build_image.BuildError, match=r"^\.dockerignore:3: \[ab\]\*: character classes"):
        build_image.ignore_rules("*\n!dractl\n[ab]*\n")


@pytest.mark.parametrize(
    ("tag", "name"),
    [
        ("dractl:0.1.0", "docker.io/library/dractl:0.1.0"),
        ("team/dractl:next", "docker.io/team/dractl:next"),
        ("ghcr.io/team/dractl:1", "ghcr.io/team/dractl:1"),
        ("localhost/dractl:1", "localhost/dractl:1"),
        ("localhost:5000/dractl:v1.2", "localhost:5000/dractl:v1.2"),
    ],
)
def test_tag_is_named_as_the_kubelet_names_a_pods_image(tag: str, name: str) -> None:
    """Guards: the archive names the image exactly as a pod's `image:` with that tag resolves in containerd."""
    assert build_image.image_name(tag) == (name, tag.rpartition(":")[2])


@pytest.mark.parametrize("tag", ["dractl", "Dractl:1", "dractl:", "dractl:a/b", "dractl:-x"])
def test_malformed_tag_is_refused(tag: str) -> None:
    """Guards: a --tag that is not NAME:TAG gets one message naming the flag, not a broken archive."""
    with pytest.raises(build_image.BuildError, match=f"^--tag: '{tag}' is not NAME:TAG"):
        build_image.image_name(tag)


@pytest.mark.parametrize("value", ["yesterday", "-1", "1.5", ""])
def test_malformed_source_date_epoch_is_refused(value: str) -> None:
    """Guards: a SOURCE_DATE_EPOCH that is not whole seconds is refused, naming the variable; unset means 0."""
    with pytest.raises(build_image.BuildError, match="^SOURCE_DATE_EPOCH: .* is not a whole number of seconds"):
        build_image.source_date_epoch({"SOURCE_DATE_EPOCH": value})
    assert build_image.source_date_epoch({}) == 0


def test_version_is_read_from_the_source_and_its_absence_named(tmp_path: pathlib.Path) -> None:
    """Guards: the image's version is dractl.__version__; a source without one is refused naming file and field."""
    assert build_image.read_version(ROOT) == dractl.__version__
    (tmp_path / "dractl").mkdir()
    (tmp_path / "dractl" / "__init__.py").write_text('"""No version here."""\n')
    with pytest.raises(build_image.BuildError, match=r"dractl/__init__.py: __version__: no `__version__ = "):
        build_image.read_version(tmp_path)


def _layout(directory: pathlib.Path) -> pathlib.Path:
    """A minimal OCI layout as umoci leaves it: one manifest (tag `build`), its config and a layer."""
    blobs = directory / "blobs" / "sha256"
    blobs.mkdir(parents=True)

    def blob(content: bytes) -> dict[str, object]:
        digest = hashlib.sha256(content).hexdigest()
        (blobs / digest).write_bytes(content)
        return {"digest": f"sha256:{digest}", "size": len(content)}

    config = blob(json.dumps({"config": {"User": "10001:10001"}}).encode())
    layer = blob(b"layer bytes")
    manifest = blob(json.dumps({"schemaVersion": 2, "config": config, "layers": [layer]}).encode())
    index = {
        "schemaVersion": 2,
        "manifests": [{**manifest, "annotations": {"org.opencontainers.image.ref.name": "build"}}],
    }
    (directory / "index.json").write_text(json.dumps(index))
    (directory / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    return directory


def test_archive_names_the_image_and_is_byte_for_byte_reproducible(tmp_path: pathlib.Path) -> None:
    """Guards: the archive's index names the image for containerd and Docker; file times never change its bytes."""
    layout = _layout(tmp_path / "layout")
    first, second = tmp_path / "first.tar", tmp_path / "second.tar"
    build_image.write_archive(layout, first, name="docker.io/library/dractl:1", tag="1", epoch=0)
    for path in layout.rglob("*"):
        os.utime(path, (1_700_000_000, 1_700_000_000))
    build_image.write_archive(layout, second, name="docker.io/library/dractl:1", tag="1", epoch=0)
    assert first.read_bytes() == second.read_bytes()
    index, manifest, config = build_image.read_image(first)
    assert index["manifests"][0]["annotations"] == {
        "io.containerd.image.name": "docker.io/library/dractl:1",
        "org.opencontainers.image.ref.name": "1",
    }
    assert config["config"]["User"] == "10001:10001"
    assert len(manifest["layers"]) == 1
    with tarfile.open(first) as archive:
        members = archive.getmembers()
    assert [member.name for member in members] == sorted(member.name for member in members)
    assert {(member.uid, member.gid, member.mtime) for member in members} == {(0, 0, 0)}


def test_command_line_refuses_bad_input_with_one_line() -> None:
    """Guards: `tools/build_image.py` with a bad flag or variable exits 1 with one line, before building anything."""
    for argv, environment, line in (
        (["--tag", "NOPE"], {}, "build_image: --tag: 'NOPE' is not NAME:TAG"),
        ([], {"SOURCE_DATE_EPOCH": "soon"}, "build_image: SOURCE_DATE_EPOCH: 'soon' is not a whole number"),
    ):
        done = subprocess.run(
            [sys.executable, str(ROOT / "tools" / "build_image.py"), *argv],
            capture_output=True,
            text=True,
            env={**os.environ, **environment},
            timeout=60,
            check=False,
        )
        assert (done.returncode, done.stdout) == (1, "")
        assert done.stderr.startswith(line) and done.stderr.count("\n") == 1, done.stderr
