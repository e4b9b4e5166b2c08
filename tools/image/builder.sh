#!/bin/sh
# The image's builder stage, run in the source directory (pyproject.toml, setup.py, README.md,
# dractl/): /opt/dractl, a virtual environment holding dractl, its compiled Cython extensions and
# its dependencies, made with the distribution's python3 so the runtime stage's python3 runs it.
# The Dockerfile runs this script, and so does tools/build_image.py in a root made by mmdebstrap,
# so both images hold the same /opt/dractl.
#
# VERSION (required): the version the image is labelled with; the build fails unless it is the
# version of the source. SOURCE_DATE_EPOCH (optional): Python then writes hash-based .pyc files,
# the same on every build whatever the files' times.
set -eu

if [ -z "${VERSION:-}" ]; then
    echo "builder.sh: VERSION is not set: pass dractl's version (dractl/__init__.py), e.g. docker build --build-arg VERSION=0.1.0" >&2
    exit 2
fi
python3 -m venv --without-pip /opt/dractl
python3 -m pip --python /opt/dractl/bin/python install --no-cache-dir --no-warn-script-location --disable-pip-version-check .
# setuptools compiles the extensions with -g; the debug sections would only add size and build paths.
find /opt/dractl/lib -path '*/site-packages/dractl/*' -name '*.so' -exec strip --strip-debug {} +
built="$(/opt/dractl/bin/dractl --version)"
if [ "$built" != "dractl $VERSION" ]; then
    echo "builder.sh: VERSION is $VERSION, but the source builds: $built" >&2
    exit 2
fi
