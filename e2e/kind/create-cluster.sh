#!/usr/bin/env bash
# Create the kind cluster (e2e/kind/cluster.yaml): a control plane and two fake GPU workers.
#   KIND_CLUSTER_NAME (dractl-e2e), KIND_NODE_IMAGE (kindest/node:v1.36.1)
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
kind create cluster --name "$KIND_CLUSTER_NAME" --image "$KIND_NODE_IMAGE" --config "$KIND_DIR/cluster.yaml" --wait 180s
