#!/usr/bin/env bash
# The README's first command: a local HPK cluster of two bubbles on this machine, and a demo
# workload on it. Installs and builds what is missing (scripts/setup.sh, the binaries, the
# bubble image), then:
#   - a private test host (a network namespace on a bridge of its own) with a local registry
#     holding busybox test images and CoreDNS (no registry on the internet is needed);
#   - `hpk up --nodes 2` on that host: rootless bubbles, each a Kubernetes node;
#   - a Deployment of 4 httpd replicas behind a Service, fetched by DNS name from a pod.
# Leaves the cluster running and prints how to use and stop it. Needs root (network namespaces).
#   scripts/demo.sh            # then: scripts/demo.sh down
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "$0")/lib.sh"
cd "$HPK_ROOT"
STATE="${TMPDIR:-/tmp}/hpk-demo-$(id -u)"
HPK="$HPK_ROOT/target/debug/hpk"
KUBECTL="$HPK_CACHE_DIR/controlplane/bin/kubectl"
export PATH="$HPK_CACHE_DIR/tools/bin:$PATH"

if [ "${1:-}" = down ]; then
  "$HPK" down --name demo || true
  if [ -f "$STATE/registry.pid" ]; then kill "$(cat "$STATE/registry.pid")" 2>/dev/null || true; fi
  rm -rf "$STATE"
  exit 0
fi

# shellcheck source=scripts/setup.sh
source "$HPK_ROOT/scripts/setup.sh"
stage "apt packages" setup_packages
stage "/dev/net/tun" setup_dev_net_tun
stage "go tools" setup_tools
stage "control plane" setup_controlplane
stage "binaries" cargo build --workspace --bins --locked
stage "bubble image" make images

start_registry() {
  mkdir -p "$STATE"
  rm -f "$STATE/env"
  target/debug/hpk-testcluster registry --env-file "$STATE/env" >"$STATE/registry.log" 2>&1 &
  echo $! >"$STATE/registry.pid"
  for _ in $(seq 1 600); do
    [ -f "$STATE/env" ] && return 0
    kill -0 "$(cat "$STATE/registry.pid")" 2>/dev/null || { cat "$STATE/registry.log"; return 1; }
    sleep 0.1
  done
  echo "the registry was not ready within 60 s" >&2
  return 1
}
stage "local registry" start_registry
# shellcheck disable=SC1091
source "$STATE/env"

# The kubelets taint a node whose disk has less than 10 % free (upstream's default); development
# machines often run fuller than that, so the demo accepts down to HPK_DISK_PRESSURE_PERCENT.
up() {
  nsenter --net="/run/netns/$HPK_DEMO_NETNS" -- "$HPK" up --name demo --nodes 2 \
    --insecure-registry="$HPK_DEMO_REGISTRY" --coredns-image="$HPK_DEMO_COREDNS" \
    --kubelet-arg=--disk-pressure-percent="${HPK_DISK_PRESSURE_PERCENT:-1}"
}
stage "hpk up --nodes 2" up

demo() {
  export KUBECONFIG="${HPK_HOME:-$HOME/.hpk}/demo/kubeconfig"
  "$KUBECTL" create deployment web --image="$HPK_DEMO_HTTPD" --replicas=4
  "$KUBECTL" expose deployment web --port=80 --target-port=8080
  "$KUBECTL" rollout status deployment/web --timeout=120s
  "$KUBECTL" get pods -o wide
  "$KUBECTL" run client --image="$HPK_DEMO_SHELL" --restart=Never -- sleep 3600
  "$KUBECTL" wait --for=condition=Ready pod/client --timeout=120s
  "$KUBECTL" exec client -- sh -c \
    "printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 5 web.default.svc.cluster.local 80 | tail -n 1"
}
stage "demo workload" demo

cat <<MSG

The cluster runs in two bubbles (user-namespace containers, one per node):
  export KUBECONFIG=${HPK_HOME:-$HOME/.hpk}/demo/kubeconfig
  $KUBECTL get nodes -o wide
  $HPK status --name demo
Stop it and remove everything: scripts/demo.sh down
MSG
