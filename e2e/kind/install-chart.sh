#!/usr/bin/env bash
# Install (or upgrade) dractl's chart as the suites do: release "dractl" (controller, classes,
# policies, node agents on the A100 worker) and "dractl-t4" (node agent on the T4 worker).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
for release in dractl:a100 dractl-t4:t4; do
  helm upgrade --install "${release%%:*}" "$REPO_ROOT/charts/dractl" --namespace dractl --create-namespace \
    --values "$REPO_ROOT/e2e/values/${release##*:}.yaml" --set image.tag="$DRACTL_VERSION"
done
for workload in daemonset/dractl-node-agent daemonset/dractl-t4-node-agent deployment/dractl-controller; do
  kubectl --namespace dractl rollout status "$workload" --timeout 180s
done
kubectl get resourceslices
