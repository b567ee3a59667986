#!/usr/bin/env bash
# Builds HPK's images as OCI image layouts without Docker, and unpacks them.
#
#   images/build.sh bubble --bin-dir DIR --controlplane PATH --out DIR [--archive FILE] [--tag TAG] [--arch ARCH]
#   images/build.sh pause  --bin-dir DIR --out DIR [--archive FILE] [--tag TAG] [--arch ARCH]
#   images/build.sh unpack --layout DIR --out ROOTFS [--ref NAME]
#   images/build.sh verify --layout DIR
#   images/build.sh context --bin-dir DIR [--controlplane PATH] --out DIR [--arch ARCH]   (for the Dockerfiles)
#   ARCH: amd64 (the default) or arm64; every binary given must be an ELF of that architecture.
#
# The bubble is three gzip'd layers: a Debian base made by mmdebstrap (cached under
# $HPK_CACHE_DIR/images, keyed by suite, mirrors, package list and recipe), the control plane,
# and our binaries (stripped). Layers are deterministic: sorted entries, numeric owners, every
# mtime set to $SOURCE_DATE_EPOCH (default 0), gzip without name or time
# (level $HPK_IMAGE_GZIP_LEVEL, default 1, for our binaries; 6 for the cached layers).
# Building the bubble's base needs root (mmdebstrap's root mode); everything else does not. An arm64
# base on an amd64 host runs its packages' maintainer scripts under qemu-aarch64-static through
# binfmt_misc, which this script mounts and registers for the build if needed, and undoes on exit.
set -euo pipefail
# The layers are filled in command substitutions ($(cached_layer ...)), where bash would otherwise
# drop -e: a failed mmdebstrap would then go on to cache a broken base.
shopt -s inherit_errexit
# Modes of what we create do not depend on the caller's umask.
umask 022

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE_DIR="${HPK_CACHE_DIR:-$HOME/.cache/hpk}/images"
EPOCH="${SOURCE_DATE_EPOCH:-0}"
SUITE=bookworm
MIRROR="${HPK_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SECURITY_MIRROR="${HPK_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}"
# Our binaries, in the bubble's /usr/local/bin; hpk is optional (it may not be built yet).
BUBBLE_BINARIES=(hpk-kubelet hpk-pod-runtime hpk-pause hpk-net-forwarder hpk-cert-signer)
OPTIONAL_BINARIES=(hpk)
CONTROLPLANE_LINKS=(kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubectl etcd)
IMAGE_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

WORK=""
# The target architecture (--arch, Debian's and OCI's name), the strip that handles its binaries
# (x86's cannot read aarch64 ones), its name in `readelf -h` (Machine:) and how to build for it.
ARCH=amd64
STRIP="strip"
ELF_MACHINE="Advanced Micro Devices X86-64"
CROSS_HINT=""

# binfmt_misc, for a base of a foreign architecture: what this build mounted or registered there,
# undone by cleanup.
BINFMT=/proc/sys/fs/binfmt_misc
BINFMT_MOUNTED=""
BINFMT_HANDLER=""
QEMU_AARCH64=/usr/bin/qemu-aarch64-static
# An aarch64 ELF executable's header, and the mask of what matters in it, as Debian's
# qemu-user-static registers them (/usr/lib/binfmt.d/qemu-aarch64.conf).
AARCH64_MAGIC='\x7f\x45\x4c\x46\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00'
AARCH64_MASK='\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff'

log() { printf '[%s] %s\n' "$(date +%T)" "$*" >&2; }
die() { printf 'build.sh: %s\n' "$*" >&2; exit 1; }
usage() { sed -n '2,9s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" >&2; exit 2; }

# Undoes what enable_foreign_exec did, unmounts whatever a failed mmdebstrap left under the work
# directory, then removes it.
cleanup() {
  disable_foreign_exec
  if [ -z "$WORK" ] || [ ! -d "$WORK" ]; then return 0; fi
  local target
  while read -r target; do
    case "$target" in "$WORK"/*) umount -l "$target" 2>/dev/null || true ;; esac
  done < <(awk '{print $2}' /proc/self/mounts | sort -r)
  rm -rf "$WORK"
}

make_work() {
  WORK=$(mktemp -d "${TMPDIR:-/tmp}/hpk-images.XXXXXX")
  trap cleanup EXIT
  trap 'exit 130' INT TERM
}

need() {
  local tool
  for tool in "$@"; do
    command -v "$tool" >/dev/null || die "$tool is required (scripts/setup.sh installs it)"
  done
}

sha256() { sha256sum "$1" | cut -d' ' -f1; }

# set_arch ARCH: the architecture the image is for.
set_arch() {
  case "$1" in
    amd64) ARCH=amd64 STRIP="strip" ELF_MACHINE="Advanced Micro Devices X86-64" CROSS_HINT="" ;;
    arm64)
      ARCH=arm64 STRIP=aarch64-linux-gnu-strip ELF_MACHINE=AArch64
      CROSS_HINT="; cross-build it (ours: cargo build --target aarch64-unknown-linux-musl; the control plane: GOARCH=arm64 integration/controlplane/build.sh)"
      ;;
    *) die "--arch $1: amd64 or arm64" ;;
  esac
}

# The architecture of this machine, in Debian's names.
host_arch() {
  case "$(uname -m)" in
    x86_64) echo amd64 ;;
    aarch64) echo arm64 ;;
    *) uname -m ;;
  esac
}

# check_elf FILE: FILE is an ELF executable for $ARCH. A binary of the wrong one would only fail
# when the image runs, on the cluster.
check_elf() {
  local machine
  machine=$(LC_ALL=C readelf -h "$1" 2>/dev/null | sed -n 's/^ *Machine: *//p') || true
  [ -n "$machine" ] || die "$1 is not an ELF binary"
  [ "$machine" = "$ELF_MACHINE" ] ||
    die "$1 is built for $machine, not for $ARCH ($ELF_MACHINE)$CROSS_HINT"
}

# is_static FILE: FILE asks for no program interpreter (the dynamic loader). (Not readelf | grep -q:
# with pipefail, readelf killed by SIGPIPE would make that fail.)
is_static() {
  local headers
  headers=$(LC_ALL=C readelf -lW "$1") || die "readelf -l $1 failed"
  case "$headers" in *"Requesting program interpreter"*) return 1 ;; esac
}

# compress LEVEL FILE: gzip without name or time, to stdout; pigz (same bytes whatever the
# number of threads) where installed, which changes the layer digests, not their content.
compress() {
  if command -v pigz >/dev/null; then pigz -n "-$1" -c "$2"; else gzip -n "-$1" -c "$2"; fi
}

decompress() {
  if command -v pigz >/dev/null; then pigz -dc "$1"; else gzip -dc "$1"; fi
}

# The packages of the bubble's base, one a line in hpk-bubble/packages (comments allowed).
bubble_packages() { sed -e 's/#.*//' -e '/^[[:space:]]*$/d' "$HERE/hpk-bubble/packages" | tr -d ' \t'; }

# The Dockerfile installs the same packages; a drift would make the two images differ.
check_dockerfile_packages() {
  local from_docker from_list
  from_docker=$(sed -n '/^# packages:begin/,/^# packages:end/p' "$HERE/hpk-bubble/Dockerfile" |
    sed -n 's/^ *\([a-z0-9][a-z0-9.+-]*\) *[\]$/\1/p' | sort)
  from_list=$(bubble_packages | sort)
  [ "$from_docker" = "$from_list" ] ||
    die "images/hpk-bubble/Dockerfile and images/hpk-bubble/packages list different packages"
}

# tar_layer DIR FILE: a deterministic tar of DIR's contents (names without "./", sorted bytewise,
# numeric owners as they are, one mtime, no atime/ctime). Device nodes and sockets are left out:
# whoever runs the image mounts /dev.
tar_layer() {
  local dir=$1 out=$2 list
  list=$(mktemp "$WORK/list.XXXXXX")
  (cd "$dir" && find . -mindepth 1 ! -type b ! -type c ! -type s -printf '%P\n') | LC_ALL=C sort >"$list"
  tar -C "$dir" --no-recursion --verbatim-files-from -T "$list" -cf "$out" \
    --format=posix --pax-option='exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime' \
    --numeric-owner --mtime="@$EPOCH"
  rm -f "$list"
}

# cached_layer KEY FUNCTION ARGS...: the gzip'd layer KEY from the cache, or FUNCTION ARGS DIR
# fills a fresh directory DIR that becomes it. Prints "FILE DIFF_ID".
cached_layer() {
  local key=$1 fn=$2 dir tar
  shift 2
  mkdir -p "$CACHE_DIR"
  if ! cached "$key"; then
    dir="$WORK/$key.d"
    tar="$WORK/$key.tar"
    mkdir -p "$dir"
    "$fn" "$@" "$dir" >&2
    tar_layer "$dir" "$tar"
    rm -rf "$dir"
    sha256 "$tar" >"$WORK/$key.diff_id"
    compress 6 "$tar" >"$WORK/$key.tar.gz"
    rm -f "$tar"
    # Rename into place last, so an interrupted build never leaves a half layer in the cache.
    mv "$WORK/$key.tar.gz" "$CACHE_DIR/$key.tar.gz.tmp"
    mv "$WORK/$key.diff_id" "$CACHE_DIR/$key.diff_id"
    mv "$CACHE_DIR/$key.tar.gz.tmp" "$CACHE_DIR/$key.tar.gz"
  else
    log "layer $key from the cache"
  fi
  echo "$CACHE_DIR/$key.tar.gz $(cat "$CACHE_DIR/$key.diff_id")"
}

cached() { [ -s "$CACHE_DIR/$1.tar.gz" ] && [ -s "$CACHE_DIR/$1.diff_id" ]; }

# fresh_layer FUNCTION ARGS...: like cached_layer, for layers that change on every build.
fresh_layer() {
  local fn=$1 key dir tar
  shift
  key=$(basename "$(mktemp -d "$WORK/layer.XXXXXX")")
  dir="$WORK/$key.d"
  tar="$WORK/$key.tar"
  mkdir -p "$dir"
  "$fn" "$@" "$dir" >&2
  tar_layer "$dir" "$tar"
  rm -rf "$dir"
  # Our binaries change on every build: speed over the last 15 % of size, unless told otherwise.
  compress "${HPK_IMAGE_GZIP_LEVEL:-1}" "$tar" >"$WORK/$key.tar.gz"
  echo "$WORK/$key.tar.gz $(sha256 "$tar")"
  rm -f "$tar"
}

# --- the bubble's base -------------------------------------------------------------------------

fill_base() {
  local dir=$1 packages
  need mmdebstrap
  [ "$(id -u)" -eq 0 ] || die "the bubble's base is built by mmdebstrap as root (run as root, or build once as root to fill the cache)"
  packages=$(bubble_packages | paste -sd, -)
  log "mmdebstrap $SUITE with $packages"
  # The docs, manuals and translations are left out, as in debian:bookworm-slim (copyrights kept).
  # The host's resolv.conf and hostname, which mmdebstrap copies in, are emptied: the bubble's
  # launcher provides both. (The hooks' "$1" is mmdebstrap's, hence the single quotes.)
  # shellcheck disable=SC2016
  SOURCE_DATE_EPOCH="$EPOCH" mmdebstrap --quiet --mode=root --architectures="$ARCH" \
    --variant=apt --include="$packages" \
    --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/info/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --customize-hook='for f in etc/resolv.conf etc/hostname; do rm -f "$1/$f"; : >"$1/$f"; chmod 0644 "$1/$f"; done' \
    "$SUITE" "$dir" \
    "deb $MIRROR $SUITE main" "deb $MIRROR $SUITE-updates main" "deb $SECURITY_MIRROR $SUITE-security main"
  # mmdebstrap unmounts what it mounted; a leftover here would be tarred or break the removal.
  if awk '{print $2}' /proc/self/mounts | grep -q "^$dir/"; then
    die "mounts left under $dir after mmdebstrap"
  fi
}

# The base's cache key: what goes into it, the recipe (fill_base itself) included, so a change
# of either builds a new base. Package updates do not: remove the cached file to pick them up.
# The architecture is keyed on its own line, only when it is not amd64, and left out of the
# recipe: the amd64 key stays what it was before arm64 came, and with it the cached amd64 base.
base_key() {
  {
    echo "$SUITE $MIRROR $SECURITY_MIRROR epoch=$EPOCH"
    [ "$ARCH" = amd64 ] || echo "arch=$ARCH"
    bubble_packages
    # shellcheck disable=SC2016
    declare -f fill_base | sed 's/ --architectures="\$ARCH"//'
  } | sha256sum | cut -c1-16
}

# enable_foreign_exec: this machine runs $ARCH's binaries, which mmdebstrap needs for the
# maintainer scripts of a foreign base: qemu-aarch64-static through binfmt_misc. Mounts
# binfmt_misc when it is not, and registers a handler (flag F: the kernel opens qemu now, so it
# need not be in the chroot) when no enabled one runs them (arch-test says, as mmdebstrap asks
# it). Both are undone on exit by disable_foreign_exec, so the machine is left as it was. Two
# builds of a foreign base at once could remove the other's handler: run one at a time.
enable_foreign_exec() {
  [ "$(id -u)" -eq 0 ] || die "the bubble's $ARCH base is built by mmdebstrap as root, with qemu through binfmt_misc (run as root, or build once as root to fill the cache)"
  need arch-test
  [ "$ARCH" = arm64 ] || die "a $ARCH base cannot be built on a $(host_arch) machine (arm64 under qemu only)"
  [ -x "$QEMU_AARCH64" ] || die "$QEMU_AARCH64 is required (package qemu-user-static; scripts/setup.sh installs it)"
  if ! mountpoint -q "$BINFMT"; then
    grep -qw binfmt_misc /proc/filesystems || die "this kernel has no binfmt_misc (modprobe binfmt_misc)"
    mount -t binfmt_misc binfmt_misc "$BINFMT" || die "cannot mount binfmt_misc on $BINFMT"
    BINFMT_MOUNTED=1
    log "mounted binfmt_misc on $BINFMT (until this build ends)"
  fi
  if arch-test "$ARCH" >/dev/null 2>&1; then
    log "an enabled binfmt_misc handler runs $ARCH binaries"
    return 0
  fi
  [ "$(cat "$BINFMT/status")" = enabled ] || die "binfmt_misc is disabled ($BINFMT/status)"
  local name=hpk-qemu-aarch64
  [ ! -e "$BINFMT/$name" ] ||
    die "$BINFMT/$name is registered but does not run arm64 binaries; remove it: echo -1 > $BINFMT/$name"
  printf '%s\n' ":$name:M::$AARCH64_MAGIC:$AARCH64_MASK:$QEMU_AARCH64:F" >"$BINFMT/register" ||
    die "cannot register $name in $BINFMT"
  BINFMT_HANDLER=$name
  log "registered binfmt_misc handler $name ($QEMU_AARCH64, until this build ends)"
  arch-test "$ARCH" >/dev/null 2>&1 || die "arch-test $ARCH fails, even with $BINFMT/$name"
}

# disable_foreign_exec: undoes enable_foreign_exec (a no-op when it did nothing).
disable_foreign_exec() {
  if [ -n "$BINFMT_HANDLER" ]; then
    { echo -1 >"$BINFMT/$BINFMT_HANDLER"; } 2>/dev/null || log "could not remove $BINFMT/$BINFMT_HANDLER"
    BINFMT_HANDLER=""
  fi
  if [ -n "$BINFMT_MOUNTED" ]; then
    umount "$BINFMT" || log "could not unmount $BINFMT"
    BINFMT_MOUNTED=""
  fi
}

# --- the binaries layers -----------------------------------------------------------------------

# install_binary SRC DEST: a stripped copy (symbols kept, for backtraces; debug info gone), of a
# binary for $ARCH.
install_binary() {
  check_elf "$1"
  "$STRIP" --strip-debug -o "$2" "$1"
  chmod 0755 "$2"
}

bin_dirs() {
  install -d -m 0755 "$1/usr" "$1/usr/local" "$1/usr/local/bin"
}

fill_controlplane() {
  local src=$1 dir=$2 link
  bin_dirs "$dir"
  # The multi-call binary is a Go binary without debug info already; copied as it is.
  install -m 0755 "$src" "$dir/usr/local/bin/hpk-controlplane"
  for link in "${CONTROLPLANE_LINKS[@]}"; do ln -s hpk-controlplane "$dir/usr/local/bin/$link"; done
}

fill_hpk_binaries() {
  local bin_dir=$1 dir=$2 name
  bin_dirs "$dir"
  for name in "${BUBBLE_BINARIES[@]}"; do
    install_binary "$bin_dir/$name" "$dir/usr/local/bin/$name"
  done
  for name in "${OPTIONAL_BINARIES[@]}"; do
    [ -x "$bin_dir/$name" ] && install_binary "$bin_dir/$name" "$dir/usr/local/bin/$name"
  done
  # `hpktainer run IMAGE` inside a bubble is `hpk tainer run IMAGE` (the original's name).
  if [ -x "$dir/usr/local/bin/hpk" ]; then ln -s hpk "$dir/usr/local/bin/hpktainer"; fi
  return 0
}

# fill_pause BIN_DIR DIR: hpk-pause and the shared libraries ldd says it loads, at the paths the
# loader looks for them (no ld.so.cache in the image; Debian's loader searches the multiarch
# directories by default). ldd knows only this machine's libraries: for another architecture,
# hpk-pause must be static (musl), and is alone.
fill_pause() {
  local bin_dir=$1 dir=$2 lib
  check_elf "$bin_dir/hpk-pause"
  if [ "$ARCH" != "$(host_arch)" ] && ! is_static "$bin_dir/hpk-pause"; then
    die "$bin_dir/hpk-pause is dynamically linked: for $ARCH it must be static (--target aarch64-unknown-linux-musl)"
  fi
  bin_dirs "$dir"
  install_binary "$bin_dir/hpk-pause" "$dir/usr/local/bin/hpk-pause"
  while read -r lib; do
    install -d -m 0755 "$dir$(dirname "$lib")"
    cp -L "$lib" "$dir$lib"
    chmod 0755 "$dir$lib"
  done < <(ldd "$bin_dir/hpk-pause" 2>/dev/null | grep -o '/[^ ]*' | sort -u)
  # Parent directories made by install -d are 0755 already; /tmp for anything that wants one.
  install -d -m 1777 "$dir/tmp"
}

# --- the OCI layout ----------------------------------------------------------------------------

# put_blob LAYOUT FILE: moves FILE into LAYOUT's blobs by its digest; prints the digest.
put_blob() {
  local digest
  digest=$(sha256 "$2")
  mv "$2" "$1/blobs/sha256/$digest"
  echo "sha256:$digest"
}

# write_layout OUT TAG ENTRYPOINT_JSON CMD_JSON "FILE DIFF_ID COMMENT"...: the layout with one
# image: its layers in order, the config, the manifest, index.json naming TAG.
write_layout() {
  local out=$1 tag=$2 entrypoint=$3 cmd=$4 layout layers="[]" diff_ids="[]" history="[]"
  local spec file diff_id comment digest size config_digest manifest_digest created
  shift 4
  layout="$WORK/layout"
  mkdir -p "$layout/blobs/sha256"
  created=$(date -u -d "@$EPOCH" +%Y-%m-%dT%H:%M:%SZ)
  for spec in "$@"; do
    read -r file diff_id comment <<<"$spec"
    size=$(stat -c %s "$file")
    cp "$file" "$WORK/blob"
    digest=$(put_blob "$layout" "$WORK/blob")
    layers=$(jq -c --arg d "$digest" --argjson s "$size" \
      '. + [{mediaType: "application/vnd.oci.image.layer.v1.tar+gzip", digest: $d, size: $s}]' <<<"$layers")
    diff_ids=$(jq -c --arg d "sha256:$diff_id" '. + [$d]' <<<"$diff_ids")
    history=$(jq -c --arg c "$comment" --arg t "$created" '. + [{created: $t, created_by: "images/build.sh", comment: $c}]' <<<"$history")
  done
  jq -cnS --arg created "$created" --arg path "PATH=$IMAGE_PATH" --argjson ep "$entrypoint" \
    --argjson cmd "$cmd" --argjson diff_ids "$diff_ids" --argjson history "$history" \
    --arg arch "$ARCH" \
    '{created: $created, architecture: $arch, os: "linux",
      config: ({Env: [$path], WorkingDir: "/"} + (if $ep then {Entrypoint: $ep} else {} end)
               + (if $cmd then {Cmd: $cmd} else {} end)),
      rootfs: {type: "layers", diff_ids: $diff_ids}, history: $history}' >"$WORK/blob"
  size=$(stat -c %s "$WORK/blob")
  config_digest=$(put_blob "$layout" "$WORK/blob")
  jq -cnS --arg cd "$config_digest" --argjson cs "$size" --argjson layers "$layers" \
    '{schemaVersion: 2, mediaType: "application/vnd.oci.image.manifest.v1+json",
      config: {mediaType: "application/vnd.oci.image.config.v1+json", digest: $cd, size: $cs},
      layers: $layers}' >"$WORK/blob"
  size=$(stat -c %s "$WORK/blob")
  manifest_digest=$(put_blob "$layout" "$WORK/blob")
  jq -nS --arg md "$manifest_digest" --argjson ms "$size" --arg tag "$tag" --arg arch "$ARCH" \
    '{schemaVersion: 2, mediaType: "application/vnd.oci.image.index.v1+json",
      manifests: [{mediaType: "application/vnd.oci.image.manifest.v1+json", digest: $md, size: $ms,
                   platform: {architecture: $arch, os: "linux"},
                   annotations: {"org.opencontainers.image.ref.name": $tag}}]}' >"$layout/index.json"
  echo '{"imageLayoutVersion":"1.0.0"}' >"$layout/oci-layout"
  verify_layout "$layout"
  replace_dir "$layout" "$out"
  log "$tag: $out (manifest $manifest_digest)"
}

# check_replaceable DIR: DIR is absent, empty, or an OCI layout (which a build replaces whole).
check_replaceable() {
  [ ! -e "$1" ] || [ -f "$1/oci-layout" ] || { [ -d "$1" ] && [ -z "$(ls -A "$1")" ]; } ||
    die "$1 exists and is not an OCI layout; refusing to replace it"
}

# replace_dir SRC DEST: DEST becomes SRC.
replace_dir() {
  local src=$1 dest=$2
  check_replaceable "$dest"
  rm -rf "$dest"
  mkdir -p "$(dirname "$dest")"
  mv "$src" "$dest"
}

# verify_layout DIR: every blob's name is its sha256; each manifest's config and layers exist with
# their sizes; each layer's diff_id is the sha256 of its uncompressed tar.
verify_layout() {
  local dir=$1 blob manifest config i n layer diff_id actual results
  jq -e '.imageLayoutVersion == "1.0.0"' "$dir/oci-layout" >/dev/null || die "$dir: bad oci-layout"
  for blob in "$dir"/blobs/sha256/*; do
    [ "$(sha256 "$blob")" = "$(basename "$blob")" ] || die "$blob: content does not match its name"
  done
  for manifest in $(jq -r '.manifests[].digest' "$dir/index.json"); do
    check_descriptor "$dir" "$(jq -c --arg d "$manifest" '.manifests[] | select(.digest == $d)' "$dir/index.json")"
    manifest="$dir/blobs/sha256/${manifest#sha256:}"
    check_descriptor "$dir" "$(jq -c .config "$manifest")"
    config="$dir/blobs/sha256/$(jq -r '.config.digest | ltrimstr("sha256:")' "$manifest")"
    n=$(jq '.layers | length' "$manifest")
    [ "$n" = "$(jq '.rootfs.diff_ids | length' "$config")" ] || die "$manifest: layers and diff_ids differ in number"
    # Decompressing is most of the time: the layers in parallel, one job each.
    results=$(mktemp -d "${TMPDIR:-/tmp}/hpk-verify.XXXXXX")
    for ((i = 0; i < n; i++)); do
      check_descriptor "$dir" "$(jq -c ".layers[$i]" "$manifest")"
      layer="$dir/blobs/sha256/$(jq -r ".layers[$i].digest | ltrimstr(\"sha256:\")" "$manifest")"
      uncompressed "$layer" "$(jq -r ".layers[$i].mediaType" "$manifest")" | sha256sum | cut -d' ' -f1 >"$results/$i" &
    done
    wait
    for ((i = 0; i < n; i++)); do
      diff_id=$(jq -r ".rootfs.diff_ids[$i]" "$config")
      actual="sha256:$(cat "$results/$i")"
      [ "$actual" = "$diff_id" ] || { rm -rf "$results"; die "layer $i of $manifest: diff_id $diff_id, uncompressed $actual"; }
    done
    rm -rf "$results"
  done
}

# check_descriptor LAYOUT DESCRIPTOR_JSON: the blob exists with the size the descriptor says.
check_descriptor() {
  local digest size file
  digest=$(jq -r .digest <<<"$2")
  size=$(jq -r .size <<<"$2")
  file="$1/blobs/sha256/${digest#sha256:}"
  [ -f "$file" ] || die "blob $digest is missing"
  [ "$(stat -c %s "$file")" = "$size" ] || die "blob $digest: size $(stat -c %s "$file"), descriptor says $size"
}

uncompressed() {
  case "$2" in
    *tar+gzip | *tar.gzip) decompress "$1" ;;
    *tar) cat "$1" ;;
    *) die "layer media type $2 not supported" ;;
  esac
}

write_archive() {
  local layout=$1 archive=$2
  mkdir -p "$(dirname "$archive")"
  tar -C "$layout" -cf "$archive.tmp" --sort=name --numeric-owner --owner=0 --group=0 \
    --mtime="@$EPOCH" oci-layout index.json blobs
  mv "$archive.tmp" "$archive"
  log "archive $archive"
}

# --- unpacking ---------------------------------------------------------------------------------

# inside ROOT REL: REL is a relative path without "..", and no directory on the way to it in
# ROOT is a symbolic link (a whiteout must never remove something outside ROOT).
inside() {
  local root=$1 rel=$2 part path parts
  case "/$rel/" in /../* | */../* | //*) return 1 ;; esac
  path=$root
  IFS=/ read -ra parts <<<"$(dirname "$rel")"
  for part in "${parts[@]}"; do
    [ -z "$part" ] || [ "$part" = . ] && continue
    path="$path/$part"
    [ -L "$path" ] && return 1
  done
  return 0
}

# apply_whiteouts ROOT LAYER MEDIA_TYPE: what LAYER deletes from the layers below it.
apply_whiteouts() {
  local root=$1 entry name dir
  while IFS= read -r entry; do
    entry=${entry#./}
    name=$(basename "$entry")
    dir=$(dirname "$entry")
    inside "$root" "$entry" || die "layer entry $entry leaves the root filesystem"
    if [ "$name" = .wh..wh..opq ]; then
      [ -d "$root/$dir" ] && find "$root/$dir" -mindepth 1 -maxdepth 1 -exec rm -rf {} +
    else
      rm -rf "${root:?}/$dir/${name#.wh.}"
    fi
  done < <(uncompressed "$2" "$3" | tar -t | grep -E '(^|/)\.wh\.[^/]+$' || true)
}

cmd_unpack() {
  local layout="" out="" ref="" manifest config n i layer media digest
  while [ $# -gt 0 ]; do
    case "$1" in
      --layout) layout=$2; shift 2 ;;
      --out) out=$2; shift 2 ;;
      --ref) ref=$2; shift 2 ;;
      *) usage ;;
    esac
  done
  if [ -z "$layout" ] || [ -z "$out" ]; then usage; fi
  need jq tar gzip
  [ -f "$layout/index.json" ] || die "$layout is not an OCI layout (no index.json)"
  if [ -n "$ref" ]; then
    digest=$(jq -r --arg r "$ref" '[.manifests[] | select(.annotations["org.opencontainers.image.ref.name"] == $r)][0].digest // empty' "$layout/index.json")
  else
    [ "$(jq '.manifests | length' "$layout/index.json")" = 1 ] || die "$layout holds several images; say which with --ref"
    digest=$(jq -r '.manifests[0].digest' "$layout/index.json")
  fi
  [ -n "$digest" ] || die "no image $ref in $layout"
  manifest="$layout/blobs/sha256/${digest#sha256:}"
  [ "$(sha256 "$manifest")" = "${digest#sha256:}" ] || die "manifest $digest does not match its digest"
  config="$layout/blobs/sha256/$(jq -r '.config.digest | ltrimstr("sha256:")' "$manifest")"
  if [ -e "$out" ] && [ -n "$(ls -A "$out")" ]; then die "$out exists and is not empty"; fi
  mkdir -p "$out"
  n=$(jq '.layers | length' "$manifest")
  for ((i = 0; i < n; i++)); do
    digest=$(jq -r ".layers[$i].digest" "$manifest")
    media=$(jq -r ".layers[$i].mediaType" "$manifest")
    layer="$layout/blobs/sha256/${digest#sha256:}"
    [ "$(sha256 "$layer")" = "${digest#sha256:}" ] || die "layer $digest does not match its digest"
    [ "sha256:$(uncompressed "$layer" "$media" | sha256sum | cut -d' ' -f1)" = "$(jq -r ".rootfs.diff_ids[$i]" "$config")" ] ||
      die "layer $digest does not match its diff_id"
    log "layer $((i + 1))/$n $digest"
    apply_whiteouts "$out" "$layer" "$media"
    # As root, owners are kept (numeric, as in the tar); otherwise everything is the caller's.
    uncompressed "$layer" "$media" |
      tar -x -C "$out" --numeric-owner --preserve-permissions --delay-directory-restore \
        --exclude='.wh.*'
  done
  log "unpacked into $out"
}

# --- commands ----------------------------------------------------------------------------------

parse_build_args() {
  BIN_DIR="" CONTROLPLANE="" OUT="" ARCHIVE="" TAG=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --bin-dir) BIN_DIR=$2; shift 2 ;;
      --controlplane) CONTROLPLANE=$2; shift 2 ;;
      --out) OUT=$2; shift 2 ;;
      --archive) ARCHIVE=$2; shift 2 ;;
      --tag) TAG=$2; shift 2 ;;
      --arch) set_arch "$2"; shift 2 ;;
      *) usage ;;
    esac
  done
  if [ -z "$BIN_DIR" ] || [ -z "$OUT" ]; then usage; fi
  [ -d "$BIN_DIR" ] || die "--bin-dir $BIN_DIR is not a directory"
  check_replaceable "$OUT"
}

cmd_bubble() {
  local base key cp bins start=$SECONDS name
  parse_build_args "$@"
  [ -n "$CONTROLPLANE" ] || usage
  [ -x "$CONTROLPLANE" ] || die "--controlplane $CONTROLPLANE is not an executable"
  for name in "${BUBBLE_BINARIES[@]}"; do
    [ -x "$BIN_DIR/$name" ] || die "$BIN_DIR/$name is missing"
  done
  need jq tar gzip "$STRIP" readelf sha256sum
  check_elf "$CONTROLPLANE"
  check_dockerfile_packages
  make_work
  key="bubble-base-$(base_key)"
  # In this shell, not in cached_layer's: the exit trap must know what to undo.
  if [ "$ARCH" != "$(host_arch)" ] && ! cached "$key"; then enable_foreign_exec; fi
  base=$(cached_layer "$key" fill_base)
  cp=$(cached_layer "controlplane-$(sha256 "$CONTROLPLANE" | cut -c1-16)" fill_controlplane "$CONTROLPLANE")
  log "stripping our binaries"
  bins=$(fresh_layer fill_hpk_binaries "$BIN_DIR")
  # No entrypoint: the bubble's launcher says what runs; `apptainer shell` and people get bash.
  write_layout "$OUT" "${TAG:-hpk-bubble:dev}" null '["/bin/bash"]' \
    "$base Debian $SUITE with $(bubble_packages | paste -sd' ' -)" \
    "$cp the upstream control plane (hpk-controlplane)" \
    "$bins HPK binaries"
  [ -z "$ARCHIVE" ] || write_archive "$OUT" "$ARCHIVE"
  log "hpk-bubble ($ARCH) built in $((SECONDS - start)) s"
}

cmd_pause() {
  local layer start=$SECONDS
  parse_build_args "$@"
  [ -x "$BIN_DIR/hpk-pause" ] || die "$BIN_DIR/hpk-pause is missing"
  need jq tar gzip "$STRIP" readelf sha256sum ldd
  make_work
  layer=$(fresh_layer fill_pause "$BIN_DIR")
  write_layout "$OUT" "${TAG:-hpk-pause:dev}" '["/usr/local/bin/hpk-pause"]' null \
    "$layer hpk-pause and its shared libraries"
  [ -z "$ARCHIVE" ] || write_archive "$OUT" "$ARCHIVE"
  log "hpk-pause ($ARCH) built in $((SECONDS - start)) s"
}

# The build context of hpk-bubble/Dockerfile and hpk-pause/Dockerfile: bin/ (ours, stripped) and
# controlplane/.
cmd_context() {
  local name
  parse_build_args "$@"
  [ -e "$OUT" ] && die "$OUT exists"
  need "$STRIP" readelf
  [ -z "$CONTROLPLANE" ] || check_elf "$CONTROLPLANE"
  mkdir -p "$OUT/bin"
  for name in "${BUBBLE_BINARIES[@]}" "${OPTIONAL_BINARIES[@]}"; do
    [ -x "$BIN_DIR/$name" ] && install_binary "$BIN_DIR/$name" "$OUT/bin/$name"
  done
  if [ -n "$CONTROLPLANE" ]; then
    mkdir -p "$OUT/controlplane"
    install -m 0755 "$CONTROLPLANE" "$OUT/controlplane/hpk-controlplane"
  fi
  log "Docker build context in $OUT"
}

cmd_verify() {
  if [ "${1:-}" != --layout ] || [ -z "${2:-}" ]; then usage; fi
  need jq sha256sum gzip
  verify_layout "$2"
  log "$2: digests, sizes and diff_ids check out"
}

main() {
  [ $# -gt 0 ] || usage
  local command=$1
  shift
  case "$command" in
    bubble) cmd_bubble "$@" ;;
    pause) cmd_pause "$@" ;;
    unpack) cmd_unpack "$@" ;;
    verify) cmd_verify "$@" ;;
    context) cmd_context "$@" ;;
    -h | --help | help) usage ;;
    *) usage ;;
  esac
}

main "$@"
