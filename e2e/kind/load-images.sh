#!/usr/bin/env bash
# Build dractl's image with Docker (the repository's Dockerfile) and load it, with the seeds'
# workload image, into the kind cluster's nodes.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
docker build --build-arg "VERSION=$DRACTL_VERSION" -t "$DRACTL_IMAGE" "$REPO_ROOT"
docker pull "$WORKLOAD_IMAGE"
kind load docker-image --name "$KIND_CLUSTER_NAME" "$DRACTL_IMAGE" "$WORKLOAD_IMAGE"
