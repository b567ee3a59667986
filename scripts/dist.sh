#!/usr/bin/env bash
# Packs the release bundle a user copies to a Slurm cluster: OUT/hpk-<version>.tar.gz holding
# hpk-<version>/ with bin/hpk (statically linked: refused otherwise), share/hpk/hpk-bubble.oci.tar
# (whose crun and slirp4netns also start the bubble on the host), slurm/hpk.slurm (when this
# checkout has it) and README.md. `make dist` builds the inputs and runs this.
#
#   scripts/dist.sh [--arch amd64|arm64] --hpk FILE --image FILE [--out DIR]
#
# --arch arm64 packs hpk-<version>-arm64.tar.gz (directory hpk-<version>-arm64/); bin/hpk and the
# image must be arm64 ones (refused otherwise). amd64, the default, keeps the names above.
#
# Unpacked anywhere on the cluster's shared filesystem, the directory is the HPK_PREFIX that
# slurm/hpk.slurm reads its files from (by default the directory the job was submitted from):
#   cd hpk-<version> && sbatch --nodes=N slurm/hpk.slurm
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "$0")/lib.sh"

die() { printf 'dist.sh: %s\n' "$*" >&2; exit 1; }
usage() { sed -n '7s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" >&2; exit 2; }

hpk="" image="" out="$HPK_ROOT/target/dist" arch=amd64
while [ $# -gt 0 ]; do
  case "$1" in
    --arch) arch=${2:?}; shift 2 ;;
    --hpk) hpk=${2:?}; shift 2 ;;
    --image) image=${2:?}; shift 2 ;;
    --out) out=${2:?}; shift 2 ;;
    -h | --help) usage ;;
    *) echo "dist.sh: unknown argument: $1" >&2; usage ;;
  esac
done
if [ -z "$hpk" ] || [ -z "$image" ]; then usage; fi
# The strip that reads the architecture's binaries (x86's cannot read aarch64 ones), its name in
# `readelf -h`, and the bundle's name after the version.
case "$arch" in
  amd64) strip="strip" machine="Advanced Micro Devices X86-64" suffix="" ;;
  arm64) strip="aarch64-linux-gnu-strip" machine="AArch64" suffix="-arm64" ;;
  *) die "--arch $arch: amd64 or arm64" ;;
esac
command -v "$strip" >/dev/null || die "$strip is required (scripts/setup.sh installs it)"
[ -x "$hpk" ] || die "$hpk is missing: run make static-hpk"
[ -f "$image" ] || die "$image is missing: run make release-images (or make images, for PROFILE=debug)"
# A dynamic program would need the cluster's C library to match the one it was built with.
headers=$(LC_ALL=C readelf -hlW "$hpk") || die "$hpk is not an ELF binary"
case "$headers" in
  *"Requesting program interpreter"*) die "$hpk is dynamically linked: the bundle's hpk must be static (make static-hpk)" ;;
esac
hpk_machine=$(sed -n 's/^ *Machine: *//p' <<<"$headers")
[ "$hpk_machine" = "$machine" ] || die "$hpk is built for ${hpk_machine:-no known machine}, not for $arch ($machine)"
# The image's platform, as images/build.sh --arch wrote it.
image_arch=$(tar -xOf "$image" index.json | jq -r '[.manifests[].platform.architecture] | unique | join(",")')
[ "$image_arch" = "$arch" ] || die "$image is an image for ${image_arch:-no architecture}, not for $arch"

# The workspace's version ([workspace.package] in Cargo.toml), which every crate inherits.
version=$(sed -n '/^\[workspace\.package\]/,/^\[/s/^version = "\(.*\)"$/\1/p' "$HPK_ROOT/Cargo.toml")
[ -n "$version" ] || die "no version under [workspace.package] in Cargo.toml"
name="hpk-$version$suffix"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tree="$work/$name"
mkdir -p "$tree/bin"
# Symbols kept for backtraces, debug info dropped (a debug build's is hundreds of MB).
"$strip" --strip-debug -o "$tree/bin/hpk" "$hpk"
chmod 0755 "$tree/bin/hpk"
install -D -m 0644 "$image" "$tree/share/hpk/hpk-bubble.oci.tar"
if [ -f "$HPK_ROOT/slurm/hpk.slurm" ]; then
  install -D -m 0755 "$HPK_ROOT/slurm/hpk.slurm" "$tree/slurm/hpk.slurm"
else
  echo "dist.sh: no slurm/hpk.slurm in this checkout; the bundle has none" >&2
fi
install -D -m 0644 "$HPK_ROOT/docs/bundle-README.md" "$tree/README.md"

# Reproducible: sorted names, numeric owners root, every mtime $SOURCE_DATE_EPOCH (default 0).
mkdir -p "$out"
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@${SOURCE_DATE_EPOCH:-0}" \
  -C "$work" -cf - "$name" | gzip -n >"$out/$name.tar.gz"
echo "$out/$name.tar.gz:"
tar -tvzf "$out/$name.tar.gz"
