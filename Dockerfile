# dractl's container image: one image for every mode (`dractl node-agent`, `dractl controller`, ...).
#
#   docker build --build-arg VERSION=0.1.0 -t dractl:0.1.0 .
#
# VERSION must be the version in dractl/__init__.py: the builder stage checks it. With
# --build-arg SOURCE_DATE_EPOCH=<seconds> Python's .pyc files are hash-based, so they stay valid
# when the build clamps file times (BuildKit's rewrite-timestamp). Machines without
# Docker build the same image with `python3 tools/build_image.py`, which reads this file and replays
# it (README.md, "Container image"); keep to the instructions that tool replays, or it says which
# line it cannot.

ARG BASE_IMAGE=debian:bookworm-slim
ARG BUILDER_PACKAGES="python3 python3-dev python3-pip gcc libc6-dev libyaml-dev ca-certificates"
ARG RUNTIME_PACKAGES="python3 libyaml-0-2"

# The builder: compiles the Cython extensions and installs dractl and its dependencies into the
# virtual environment /opt/dractl. Nothing else of this stage reaches the image.
FROM ${BASE_IMAGE} AS builder
ARG BUILDER_PACKAGES
ARG SOURCE_DATE_EPOCH
RUN apt-get update && apt-get install -y --no-install-recommends ${BUILDER_PACKAGES} && rm -rf /var/lib/apt/lists/*
ARG VERSION
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY dractl ./dractl
RUN --mount=type=bind,source=tools/image/builder.sh,target=/tmp/builder.sh sh /tmp/builder.sh

# The runtime: the distribution's python3 and libyaml, the virtual environment, and the user the
# controller runs as. No compiler and no headers. The node agent's pods run as root instead
# (the kubelet's directories, NVML and MPS need it); the chart sets runAsUser for each.
FROM ${BASE_IMAGE} AS runtime
ARG RUNTIME_PACKAGES
ARG SOURCE_DATE_EPOCH
ARG VERSION
RUN apt-get update && apt-get install -y --no-install-recommends ${RUNTIME_PACKAGES} && rm -rf /var/lib/apt/lists/*
RUN --mount=type=bind,source=tools/image/runtime.sh,target=/tmp/runtime.sh sh /tmp/runtime.sh
COPY --from=builder /opt/dractl /opt/dractl
ENV PATH=/opt/dractl/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8 \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
LABEL org.opencontainers.image.title="dractl" \
      org.opencontainers.image.description="Dynamic Resource Allocation for NVIDIA GPUs on Kubernetes: node agent, controller, simulator" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
USER 10001:10001
ENTRYPOINT ["/opt/dractl/bin/dractl"]
