#!/usr/bin/env bash
# Installs what building and testing HPK needs on a fresh Debian 12 machine. Idempotent: a
# second run only checks.
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "$0")/lib.sh"

setup_packages() {
  # Lints our scripts (shellcheck); the benchmark's baseline and operators' checks (openssl).
  apt_install shellcheck openssl ca-certificates
  # Test hosts (ip netns, unshare --uts) and what runs on them.
  apt_install iproute2 util-linux
  # The local OCI registry and the busybox the test images are built from; the conformance
  # stand-in images' shell (integration/e2e/images.sh).
  apt_install docker-registry busybox-static bash-static
  # The pod-runtime's engine; protoc for the k8s-cri crate's build script (CRI v1 types).
  apt_install crun protobuf-compiler
  # critest/run.sh pushes its stand-in images to the local registry with curl.
  apt_install curl
  # images/build.sh: the bubble's Debian base (mmdebstrap), the OCI JSON (jq), stripping our
  # binaries (binutils), gzip'd layers on every core (pigz).
  apt_install mmdebstrap jq binutils pigz
  # kubectl exec -it driven through a terminal in the kubelet API tests
  apt_install tmux
  # The pod network benchmark (services/net-forwarder/benches/network.rs): iperf3 for
  # throughput, ping for round trips, slirp4netns for the seed's cross-node path it compares
  # with. iperf3's package asks whether to run a system-wide server on :5201; answer no, the
  # benchmark starts its own in test namespaces.
  echo "iperf3 iperf3/start_daemon boolean false" | as_root debconf-set-selections
  apt_install iperf3 slirp4netns iputils-ping
  # kube-proxy's nftables mode (it runs `nft`) for ClusterIP Services on the test nodes.
  apt_install nftables
  # The Slurm lab's Vagrantfile is checked with `vagrant validate` (vagrant/README.md); no
  # hypervisor is needed for that.
  apt_install vagrant
  # A real Slurm cluster in test namespaces (integration/src/slurm.rs): slurmctld, slurmd, the
  # client commands, and munge for their authentication.
  apt_install slurm-wlm munge
  # The several-ID bubbles: the setuid newuidmap/newgidmap pair (the one host helper HPK may
  # use) and /etc/subuid ranges, as sites that offer rootless containers have them.
  apt_install uidmap
  # The release bundle's static hpk (x86_64-unknown-linux-musl): musl-gcc for ring's C parts.
  apt_install musl-tools
  # The arm64 bundle and images (make dist ARCH=arm64): the cross compiler and binutils that link
  # the aarch64-unknown-linux-musl binaries, compile ring's C parts and strip them
  # (.cargo/config.toml); qemu-aarch64-static, which runs the arm64 base's maintainer scripts for
  # mmdebstrap (through binfmt_misc) and the bundle's checks (images/test-arm64.sh), and
  # arch-test, which mmdebstrap asks whether it can run arm64 binaries at all. The cross
  # compiler's C headers (ring includes <stdint.h>) are only its Recommends, which
  # --no-install-recommends leaves out: named here, or a fresh machine cannot build ring.
  apt_install gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user-static arch-test
  # htpasswd (bcrypt entries) for the registry that asks for credentials in hpk image push's
  # tests (services/hpk/tests/push.rs).
  apt_install apache2-utils
  # A network filesystem for the preflight's refusal test: sshfs over a pipe to sftp-server.
  apt_install sshfs openssh-sftp-server
  # The package enables a system-wide registry on :5000 (all interfaces); the tests run their
  # own instances, so keep that one off.
  # The same for iperf3, should it have been enabled before, and for Slurm and munge: the
  # tests start their own daemons with their own configuration and key.
  if command -v systemctl >/dev/null; then
    systemctl disable docker-registry iperf3 slurmctld slurmd munge >/dev/null 2>&1 || true
    if [ -d /run/systemd/system ]; then systemctl stop docker-registry iperf3 slurmctld slurmd munge || true; fi
  fi
}

# Rootless TUN/TAP (slirp4netns, the net-forwarder's TAP devices) opens /dev/net/tun as the
# user; some hosts and container images leave it 0600 root. The kernel still checks the
# device's owner and CAP_NET_ADMIN in the creating namespace, so 0666 is the usual mode
# (udev's default). Redone on every run: /dev is rebuilt at boot.
setup_dev_net_tun() {
  [ -c /dev/net/tun ] || return 0
  if [ "$(stat -c %a /dev/net/tun)" != 666 ]; then
    echo "chmod 0666 /dev/net/tun"
    as_root chmod 0666 /dev/net/tun
  fi
}

# The Rust targets of the bundles' static binaries, for the toolchain rust-toolchain.toml pins:
# the amd64 bundle's hpk, and every binary of the arm64 bundle and images.
setup_rust_targets() {
  local target
  command -v rustup >/dev/null || { echo "rustup is required (https://rustup.rs)" >&2; exit 1; }
  for target in x86_64-unknown-linux-musl aarch64-unknown-linux-musl; do
    (cd "$HPK_ROOT" && rustup target list --installed | grep -qx "$target") ||
      (cd "$HPK_ROOT" && rustup target add "$target")
  done
}

setup_tools() {
  command -v go >/dev/null || { echo "Go is required (https://go.dev/doc/install)" >&2; exit 1; }
  go_tool grpcurl github.com/fullstorydev/grpcurl/cmd/grpcurl@v1.9.3
  # CRI client; v1.35.0 is not served by the module proxy, v1.34 is within the supported skew.
  go_tool crictl sigs.k8s.io/cri-tools/cmd/crictl@v1.34.0
  # metrics-server for `kubectl top` in the kubelet API tests (run there as a pod from a
  # Docker-free image of this static binary); v0.9.0 is the newest the module proxy serves.
  CGO_ENABLED=0 go_tool metrics-server sigs.k8s.io/metrics-server/cmd/metrics-server@v0.9.0
  # Cluster DNS (deploy/coredns.yaml), run as a pod from a Docker-free image of this static
  # binary in the Services tests: CoreDNS v1.14.7 with the plugins a cluster uses, none of the
  # cloud ones (integration/coredns/main.go).
  go_local_tool coredns integration/coredns
  # Storage (deploy/local-path-provisioner.yaml, StorageClass local-path), run as a pod from a
  # Docker-free image of this static binary; v0.0.30 is the newest the module proxy serves.
  CGO_ENABLED=0 go_tool local-path-provisioner github.com/rancher/local-path-provisioner@v0.0.30
  setup_critest
}

# The CRI validation suite, run against hpk-pod-runtime by services/pod-runtime/critest/run.sh.
# Upstream ships it as a Go test binary, so it is built with `go test -c`, at crictl's version.
setup_critest() {
  go_test_tool critest sigs.k8s.io/cri-tools v1.34.0 ./cmd/critest \
    "-X sigs.k8s.io/cri-tools/pkg/version.Version=1.34.0"
}

# The upstream control plane (kube-apiserver, controller-manager, scheduler, kube-proxy,
# kubectl, etcd) from Go modules; build.sh rebuilds only when its inputs change.
setup_controlplane() {
  "$HPK_ROOT/integration/controlplane/build.sh" "$HPK_CACHE_DIR/controlplane/bin"
}

# The control plane for arm64 images (make images ARCH=arm64, which runs the same when it is
# missing), cross-compiled by Go; not a default stage: a cold build takes ~7.5 minutes here.
setup_controlplane_arm64() {
  GOARCH=arm64 "$HPK_ROOT/integration/controlplane/build.sh" "$HPK_CACHE_DIR/controlplane-arm64/bin"
}

# Upstream's e2e suite of the pinned release (e2e.test, ginkgo, agnhost, imagetools), from Go
# modules; build.sh rebuilds only when its inputs change. scripts/conformance.sh runs it.
setup_e2e() {
  "$HPK_ROOT/integration/e2e/build.sh" "$HPK_CACHE_DIR/e2e/bin"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  stage "apt packages" setup_packages
  stage "/dev/net/tun" setup_dev_net_tun
  stage "rust targets" setup_rust_targets
  stage "go tools" setup_tools
  stage "control plane" setup_controlplane
  stage "e2e suite" setup_e2e
fi
