#!/usr/bin/env bash
# The README's first command: HPK as users meet it, on this machine. Installs and builds what is
# missing (scripts/setup.sh, the binaries, the bubble image), then:
#   - a real Slurm cluster in network namespaces (slurmctld on this machine as the login node,
#     three slurmd "compute nodes", munge) with an unprivileged user `hpke2e…`, and a local
#     registry holding busybox test images and CoreDNS (no registry on the internet is needed);
#   - the release bundle of this build (`make dist PROFILE=debug`: a static bin/hpk, the bubble
#     image, slurm/hpk.slurm) unpacked in that user's home, as a user unpacks a release;
#   - as that user, from the bundle: sbatch --nodes=3 slurm/hpk.slurm — one rootless bubble per
#     node, started with the image's own crun and slirp4netns;
#   - a Deployment of 4 httpd replicas behind a Service, fetched by DNS name from a pod.
# Leaves the cluster running and prints how to use and stop it. Needs root (network namespaces).
#   scripts/demo.sh            # then: scripts/demo.sh down
#   scripts/demo.sh local      # instead: `hpk up --nodes 2` on one test host, without Slurm
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "$0")/lib.sh"
cd "$HPK_ROOT"
STATE="${TMPDIR:-/tmp}/hpk-demo-$(id -u)"
HPK="$HPK_ROOT/target/debug/hpk"
KUBECTL="$HPK_CACHE_DIR/controlplane/bin/kubectl"
export PATH="$HPK_CACHE_DIR/tools/bin:$PATH"
MODE=${1:-slurm}

stop_helper() {
  if [ -f "$STATE/helper.pid" ]; then
    local pid
    pid=$(cat "$STATE/helper.pid")
    if kill "$pid" 2>/dev/null; then
      # The helper removes what it made (Slurm, its user, the registry) before it exits.
      for _ in $(seq 1 600); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
  fi
}

if [ "$MODE" = down ]; then
  if [ -f "$STATE/env" ] && [ -f "$STATE/job" ]; then
    # shellcheck disable=SC1091
    source "$STATE/env"
    runuser -u "$HPK_DEMO_USER" -- env SLURM_CONF="$HPK_DEMO_SLURM_CONF" \
      scancel --batch --signal=TERM "$(cat "$STATE/job")" || true
    for _ in $(seq 1 1200); do
      [ -z "$(runuser -u "$HPK_DEMO_USER" -- env SLURM_CONF="$HPK_DEMO_SLURM_CONF" squeue -h -j "$(cat "$STATE/job")" 2>/dev/null)" ] && break
      sleep 0.1
    done
  fi
  if [ -d "${HPK_HOME:-$HOME/.hpk}/demo" ]; then "$HPK" down --name demo || true; fi
  stop_helper
  rm -rf "$STATE"
  exit 0
fi
case "$MODE" in slurm | local) ;; *) echo "usage: scripts/demo.sh [slurm|local|down]" >&2; exit 2 ;; esac

# shellcheck source=scripts/setup.sh
source "$HPK_ROOT/scripts/setup.sh"
stage "apt packages" setup_packages
stage "/dev/net/tun" setup_dev_net_tun
stage "rust targets" setup_rust_targets
stage "go tools" setup_tools
stage "control plane" setup_controlplane
stage "binaries" cargo build --workspace --bins --locked
stage "bubble image" make images
stage "release bundle" make dist PROFILE=debug

# hpk-testcluster slurm|registry runs in the background until signalled; it writes shell
# variables to $STATE/env once everything is ready.
start_helper() {
  mkdir -p "$STATE"
  rm -f "$STATE/env"
  target/debug/hpk-testcluster "$1" --env-file "$STATE/env" >"$STATE/helper.log" 2>&1 &
  echo $! >"$STATE/helper.pid"
  for _ in $(seq 1 600); do
    [ -f "$STATE/env" ] && return 0
    kill -0 "$(cat "$STATE/helper.pid")" 2>/dev/null || { cat "$STATE/helper.log"; return 1; }
    sleep 0.1
  done
  echo "hpk-testcluster $1 was not ready within 60 s" >&2
  return 1
}

# The kubelets taint a node whose disk has less than 10 % free (upstream's default); development
# machines often run fuller than that, so the demo accepts down to HPK_DISK_PRESSURE_PERCENT.
DISK="--kubelet-arg=--disk-pressure-percent=${HPK_DISK_PRESSURE_PERCENT:-1}"

if [ "$MODE" = slurm ]; then
  stage "local Slurm (3 nodes) and registry" start_helper slurm
  # shellcheck disable=SC1091
  source "$STATE/env"
  as_user() {
    runuser -u "$HPK_DEMO_USER" -- env HOME="$HPK_DEMO_HOME" SLURM_CONF="$HPK_DEMO_SLURM_CONF" \
      PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin "$@"
  }
  version=$(sed -n '/^\[workspace\.package\]/,/^\[/s/^version = "\(.*\)"$/\1/p' Cargo.toml)
  BUNDLE="$HPK_DEMO_HOME/hpk-$version"
  unpack() {
    # Readable by the user wherever the checkout is: a copy in its home first.
    install -o "$HPK_DEMO_USER" -m 0644 "target/dist/hpk-$version.tar.gz" "$HPK_DEMO_HOME/"
    as_user tar -xzf "$HPK_DEMO_HOME/hpk-$version.tar.gz" -C "$HPK_DEMO_HOME"
  }
  stage "the bundle unpacked in ~$HPK_DEMO_USER" unpack
  submit() {
    (cd "$BUNDLE" && as_user sbatch --parsable --output="$HPK_DEMO_HOME/slurm-%j.out" --nodes=3 slurm/hpk.slurm \
      --insecure-registry="$HPK_DEMO_REGISTRY" --coredns-image="$HPK_DEMO_COREDNS" \
      --metrics-server-image="$HPK_DEMO_METRICS_SERVER" --local-path-provisioner-image="$HPK_DEMO_LOCAL_PATH" \
      --local-path-helper-image="$HPK_DEMO_SHELL" "$DISK") >"$STATE/job"
    local job out
    job=$(cut -d';' -f1 "$STATE/job")
    echo "$job" >"$STATE/job"
    out="$HPK_DEMO_HOME/slurm-$job.out"
    echo "job $job: $out"
    for _ in $(seq 1 3000); do
      if grep -q '^export KUBECONFIG=' "$out" 2>/dev/null; then cat "$out"; return 0; fi
      if [ -z "$(as_user squeue -h -j "$job")" ]; then cat "$out" 2>/dev/null; return 1; fi
      sleep 0.1
    done
    cat "$out"
    echo "the cluster was not up within 300 s" >&2
    return 1
  }
  stage "cd hpk-$version && sbatch --nodes=3 slurm/hpk.slurm" submit
  KUBECONFIG_PATH="$HPK_DEMO_HOME/.hpk/kubeconfig"
else
  stage "local registry" start_helper registry
  # shellcheck disable=SC1091
  source "$STATE/env"
  up() {
    nsenter --net="/run/netns/$HPK_DEMO_NETNS" -- "$HPK" up --name demo --nodes 2 \
      --insecure-registry="$HPK_DEMO_REGISTRY" --coredns-image="$HPK_DEMO_COREDNS" \
      --metrics-server-image="$HPK_DEMO_METRICS_SERVER" --local-path-provisioner-image="$HPK_DEMO_LOCAL_PATH" \
      --local-path-helper-image="$HPK_DEMO_SHELL" "$DISK"
  }
  stage "hpk up --nodes 2" up
  KUBECONFIG_PATH="${HPK_HOME:-$HOME/.hpk}/demo/kubeconfig"
fi

demo() {
  export KUBECONFIG="$KUBECONFIG_PATH"
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

if [ "$MODE" = slurm ]; then
  cat <<MSG

HPK runs as Slurm job $(cat "$STATE/job") of user $HPK_DEMO_USER: one bubble per node (node1 the controller).
  export KUBECONFIG=$KUBECONFIG_PATH
  $KUBECTL get nodes -o wide
  runuser -u $HPK_DEMO_USER -- env SLURM_CONF=$HPK_DEMO_SLURM_CONF squeue
End it gracefully and remove everything: scripts/demo.sh down
MSG
else
  cat <<MSG

The cluster runs in two bubbles (user-namespace containers, one per node):
  export KUBECONFIG=$KUBECONFIG_PATH
  $KUBECTL get nodes -o wide
  $HPK status --name demo
Stop it and remove everything: scripts/demo.sh down
MSG
fi
