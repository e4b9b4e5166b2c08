#!/bin/sh
# The image's runtime stage, after its packages are installed: the user the controller runs as.
# It owns no home directory and has no login shell; the node agent runs as root instead. Run by
# the Dockerfile and by tools/build_image.py alike.
set -eu

useradd --uid 10001 --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin dractl
