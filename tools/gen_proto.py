"""Regenerate the gRPC stubs in dractl/_proto/ from the .proto files beside them.

Run from anywhere: `python tools/gen_proto.py` (with the pinned grpcio-tools of the test extra).
`--out DIR` writes into DIR instead of the repository, which the stub test uses to check that
regeneration changes nothing. The .proto files are compiled with the repository root as the
include path, so the generated modules import each other as `dractl._proto.<name>_pb2` and
their descriptor file names (`dractl/_proto/<name>.proto`) cannot clash with anyone else's.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "dractl" / "_proto"

# The version the committed stubs were generated with; another version writes other code.
GRPCIO_TOOLS_VERSION = "1.85.1"


def proto_files() -> list[pathlib.Path]:
    """The .proto sources, sorted so generation order is stable."""
    return sorted(PROTO_DIR.glob("*.proto"))


def generate(out: pathlib.Path) -> None:
    """Write <name>_pb2.py, <name>_pb2.pyi and <name>_pb2_grpc.py for every source under out/dractl/_proto/.

    Idempotent: the output depends only on the sources and the grpcio-tools version.
    Raises SystemExit with protoc's message if compilation fails or the version is wrong.
    """
    import importlib.metadata

    from grpc_tools import protoc

    installed = importlib.metadata.version("grpcio-tools")
    if installed != GRPCIO_TOOLS_VERSION:
        raise SystemExit(f"gen_proto: grpcio-tools {GRPCIO_TOOLS_VERSION} is required, {installed} is installed")
    (out / "dractl" / "_proto").mkdir(parents=True, exist_ok=True)
    include = pathlib.Path(protoc.__file__).parent / "_proto"
    for source in proto_files():
        args = [
            "grpc_tools.protoc",
            f"-I{ROOT}",
            f"-I{include}",
            f"--python_out={out}",
            f"--pyi_out={out}",
            f"--grpc_python_out={out}",
            str(source.relative_to(ROOT)),
        ]
        if protoc.main(args) != 0:
            raise SystemExit(f"gen_proto: protoc failed on {source.relative_to(ROOT)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=pathlib.Path, default=ROOT, help="root to write dractl/_proto/ under (default: the repo)"
    )
    args = parser.parse_args(argv)
    generate(args.out.resolve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
