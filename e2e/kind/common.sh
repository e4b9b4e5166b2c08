# Shared by the scripts beside this file: names, and where things are.
set -euo pipefail
KIND_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$KIND_DIR/../.." && pwd)"
KIND_CLUSTER_NAME="${KIND_CLUSTER_NAME:-dractl-e2e}"
KIND_NODE_IMAGE="${KIND_NODE_IMAGE:-kindest/node:v1.36.1}"
DRACTL_VERSION="$(sed -n 's/^__version__ = "\(.*\)"/\1/p' "$REPO_ROOT/dractl/__init__.py")"
DRACTL_IMAGE="dractl:$DRACTL_VERSION"
WORKLOAD_IMAGE="busybox:1.35"
