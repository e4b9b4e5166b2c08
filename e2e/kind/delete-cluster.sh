#!/usr/bin/env bash
# Delete the kind cluster.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
kind delete cluster --name "$KIND_CLUSTER_NAME"
