#!/usr/bin/env bash
# Checks an arm64 bundle (make dist ARCH=arm64) on an amd64 machine, under qemu-aarch64-static
# called by name (no binfmt_misc needed): unpacks it into a temporary directory, runs its bin/hpk,
# unpacks its bubble image (images/build.sh unpack) and runs binaries from that root filesystem
# (the dynamically linked ones with `-L ROOTFS`, so that qemu finds their loader and libraries
# there). Fails if any of them fails or says something else than it should, or if the image is
# not an arm64 one. Removes what it made. Needs root or unprivileged user namespaces (for crun,
# see run_in_rootfs).
#
#   images/test-arm64.sh BUNDLE.tar.gz
#   images/test-arm64.sh target/dist/hpk-0.1.0-arm64.tar.gz
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
QEMU="qemu-aarch64-static"
# The bubble's binaries run here, each with the start of what it must print: ours (static), what
# starts a bubble on the host (crun, slirp4netns: dynamic, Debian's) and kubectl (the control
# plane's multi-call binary).
ROOTFS_COMMANDS=(
  "/usr/local/bin/hpk-pod-runtime --version|hpk-pod-runtime "
  "/usr/local/bin/hpk-kubelet --version|hpk-kubelet "
  "/usr/local/bin/hpk-pause --version|hpk-pause "
  "/usr/bin/crun --version|crun version "
  "/usr/bin/slirp4netns --version|slirp4netns version "
  "/usr/local/bin/kubectl version --client|Client Version: "
)

die() { printf 'test-arm64.sh: %s\n' "$*" >&2; exit 1; }
[ $# -eq 1 ] || { sed -n '10,11s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" >&2; exit 2; }
BUNDLE=$1
[ -f "$BUNDLE" ] || die "$BUNDLE is not a file"
for tool in "$QEMU" jq tar readelf unshare; do
  command -v "$tool" >/dev/null || die "$tool is required (scripts/setup.sh installs it)"
done

WORK=$(mktemp -d "${TMPDIR:-/tmp}/hpk-test-arm64.XXXXXX")
# As anyone but root the unpacked files are the caller's, some directories without write
# permission: write permission is given back before the removal.
trap 'chmod -R u+w "$WORK" 2>/dev/null; rm -rf "$WORK"' EXIT

# check LABEL EXPECTED COMMAND...: runs COMMAND, prints it and its output; fails unless it
# succeeds and its output starts with EXPECTED.
check() {
  local label=$1 expected=$2 out rc=0
  shift 2
  echo "\$ $label"
  out=$("$@" 2>&1) || rc=$?
  printf '%s\n' "$out" | sed 's/^/  /'
  [ "$rc" -eq 0 ] || die "$label failed (exit $rc)"
  case "$out" in
    "$expected"*) ;;
    *) die "$label: the output does not start with '$expected'" ;;
  esac
}

# run_in_rootfs ROOTFS EXPECTED PATH ARGS...: PATH of the unpacked image under qemu, with ROOTFS
# as the prefix for its loader and libraries when it asks for one. crun re-executes itself from
# a copy before main (CVE-2019-5736); under qemu without binfmt_misc that copy would be qemu (the
# kernel's /proc/self/exe), which would then take crun's arguments as its own. It skips the copy
# when _LIBCONTAINER_CLONED_BINARY is set and it lies on a read-only mount: so each command runs
# in a private mount namespace (with a user namespace, unless root) with ROOTFS bound read-only.
run_in_rootfs() {
  local rootfs=$1 expected=$2 path=$3 file=$1$3 userns=()
  shift 3
  local qemu=("$QEMU")
  [ -f "$file" ] || die "the image has no $path"
  case "$(LC_ALL=C readelf -lW "$file")" in
    *"Requesting program interpreter"*) qemu+=(-L "$rootfs") ;;
  esac
  [ "$(id -u)" -eq 0 ] || userns=(--user --map-root-user)
  # shellcheck disable=SC2016 # $1 is the inner shell's.
  check "${qemu[*]} $path $*" "$expected" \
    unshare "${userns[@]}" --mount --propagation private sh -c \
    'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift && exec "$@"' sh "$rootfs" \
    env _LIBCONTAINER_CLONED_BINARY=1 "${qemu[@]}" "$file" "$@"
}

tar -xzf "$BUNDLE" -C "$WORK"
# The bundle holds one directory, hpk-<version>-arm64.
dirs=("$WORK"/*/)
[ ${#dirs[@]} -eq 1 ] || die "$BUNDLE holds ${#dirs[@]} top directories, not one"
tree=${dirs[0]%/}
case "$(basename "$tree")" in
  hpk-*-arm64) ;;
  *) die "$BUNDLE: its directory is $(basename "$tree"), not hpk-<version>-arm64" ;;
esac
echo "bundle $(basename "$tree")"
check "$QEMU bin/hpk --version" "hpk " "$QEMU" "$tree/bin/hpk" --version

image="$tree/share/hpk/hpk-bubble.oci.tar"
[ -f "$image" ] || die "$BUNDLE has no share/hpk/hpk-bubble.oci.tar"
mkdir "$WORK/layout"
tar -xf "$image" -C "$WORK/layout"
manifest="$WORK/layout/blobs/sha256/$(jq -r '.manifests[0].digest | ltrimstr("sha256:")' "$WORK/layout/index.json")"
config="$WORK/layout/blobs/sha256/$(jq -r '.config.digest | ltrimstr("sha256:")' "$manifest")"
index_arch=$(jq -r '.manifests[0].platform.architecture' "$WORK/layout/index.json")
config_arch=$(jq -r '.architecture' "$config")
echo "image: index.json platform $index_arch/$(jq -r '.manifests[0].platform.os' "$WORK/layout/index.json"), config $config_arch/$(jq -r .os "$config")"
[ "$config_arch" = arm64 ] || die "the image's config says architecture $config_arch, not arm64"
[ "$index_arch" = arm64 ] || die "the image's index.json says architecture $index_arch, not arm64"

"$HERE/build.sh" unpack --layout "$WORK/layout" --out "$WORK/rootfs"
for line in "${ROOTFS_COMMANDS[@]}"; do
  read -ra args <<<"${line%%|*}"
  run_in_rootfs "$WORK/rootfs" "${line#*|}" "${args[@]}"
done
echo "test-arm64.sh: $(basename "$BUNDLE") runs under qemu-aarch64"
