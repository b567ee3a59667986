#!/usr/bin/env bash
# Checks images/build.sh's verify and unpack on a small hand-made layout: whiteouts and opaque
# directories of a later layer remove what the layers below hold, a whiteout through a symbolic
# link is refused, a blob that does not match its digest is refused. Needs no root, no network.
set -euo pipefail

BUILD="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/build.sh"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/hpk-images-test.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# layout DIR LAYER_DIR...: an OCI layout of one image whose layers are the given directories.
layout() {
  local out=$1 dir tar digest diff_ids="[]" layers="[]" size config manifest
  shift
  mkdir -p "$out/blobs/sha256"
  for dir in "$@"; do
    tar="$WORK/layer.tar"
    (cd "$dir" && find . -mindepth 1 -printf '%P\n' | LC_ALL=C sort) >"$WORK/list"
    tar -C "$dir" --no-recursion -T "$WORK/list" -cf "$tar" --numeric-owner --mtime=@0
    diff_ids=$(jq -c --arg d "sha256:$(sha256sum "$tar" | cut -d' ' -f1)" '. + [$d]' <<<"$diff_ids")
    gzip -n -c "$tar" >"$tar.gz"
    digest=$(sha256sum "$tar.gz" | cut -d' ' -f1)
    size=$(stat -c %s "$tar.gz")
    mv "$tar.gz" "$out/blobs/sha256/$digest"
    layers=$(jq -c --arg d "sha256:$digest" --argjson s "$size" \
      '. + [{mediaType: "application/vnd.oci.image.layer.v1.tar+gzip", digest: $d, size: $s}]' <<<"$layers")
  done
  jq -cn --argjson d "$diff_ids" '{architecture: "amd64", os: "linux", rootfs: {type: "layers", diff_ids: $d}}' >"$WORK/blob"
  config=$(sha256sum "$WORK/blob" | cut -d' ' -f1)
  size=$(stat -c %s "$WORK/blob")
  mv "$WORK/blob" "$out/blobs/sha256/$config"
  jq -cn --arg c "sha256:$config" --argjson s "$size" --argjson l "$layers" \
    '{schemaVersion: 2, mediaType: "application/vnd.oci.image.manifest.v1+json",
      config: {mediaType: "application/vnd.oci.image.config.v1+json", digest: $c, size: $s}, layers: $l}' >"$WORK/blob"
  manifest=$(sha256sum "$WORK/blob" | cut -d' ' -f1)
  size=$(stat -c %s "$WORK/blob")
  mv "$WORK/blob" "$out/blobs/sha256/$manifest"
  jq -n --arg m "sha256:$manifest" --argjson s "$size" \
    '{schemaVersion: 2, manifests: [{mediaType: "application/vnd.oci.image.manifest.v1+json", digest: $m, size: $s,
      annotations: {"org.opencontainers.image.ref.name": "test:1"}}]}' >"$out/index.json"
  echo '{"imageLayoutVersion":"1.0.0"}' >"$out/oci-layout"
}

# Layer 1: files, a directory to make opaque, a symbolic link out of the root filesystem.
mkdir -p "$WORK/l1/a" "$WORK/l1/d/sub" "$WORK/l2/a" "$WORK/l2/d" "$WORK/l3/escape" "$WORK/outside"
echo keep >"$WORK/l1/a/keep"
echo gone >"$WORK/l1/a/gone"
mkdir "$WORK/l1/a/gonedir" && echo x >"$WORK/l1/a/gonedir/x"
echo old >"$WORK/l1/d/old"
echo old >"$WORK/l1/d/sub/old"
mkfifo "$WORK/l1/a/fifo"
ln -s "$WORK/outside" "$WORK/l1/escape"
echo precious >"$WORK/outside/precious"
# Layer 2: whiteouts of a file and a directory, an opaque directory with one new file.
: >"$WORK/l2/a/.wh.gone"
: >"$WORK/l2/a/.wh.gonedir"
: >"$WORK/l2/d/.wh..wh..opq"
echo new >"$WORK/l2/d/new"
# Layer 3 (a separate image): a whiteout through layer 1's link.
rmdir "$WORK/l3/escape" && mkdir -p "$WORK/l3/escape" && : >"$WORK/l3/escape/.wh.precious"

layout "$WORK/good" "$WORK/l1" "$WORK/l2"
"$BUILD" verify --layout "$WORK/good" 2>/dev/null || fail "verify refused a good layout"
"$BUILD" unpack --layout "$WORK/good" --out "$WORK/root" 2>/dev/null || fail "unpack failed"
[ "$(cat "$WORK/root/a/keep")" = keep ] || fail "a/keep lost"
[ ! -e "$WORK/root/a/gone" ] || fail "whiteout a/.wh.gone did not remove a/gone"
[ ! -e "$WORK/root/a/gonedir" ] || fail "whiteout a/.wh.gonedir did not remove a/gonedir"
[ -p "$WORK/root/a/fifo" ] || fail "the FIFO a/fifo did not survive"
in_d=$(cd "$WORK/root/d" && find . -mindepth 1 -printf '%P ')
[ "$in_d" = "new " ] || fail "opaque d/ holds $in_d instead of new"
find "$WORK/root" -name '.wh.*' | grep -q . && fail "whiteout files were unpacked"

layout "$WORK/evil" "$WORK/l1" "$WORK/l3"
if "$BUILD" unpack --layout "$WORK/evil" --out "$WORK/evilroot" 2>"$WORK/evil.err"; then fail "a whiteout through a link was applied"; fi
[ -e "$WORK/outside/precious" ] || fail "a whiteout removed a file outside the root filesystem"
grep -q "leaves the root filesystem" "$WORK/evil.err" || fail "unpack of a whiteout through a link failed for another reason: $(cat "$WORK/evil.err")"

layout "$WORK/bad" "$WORK/l1"
blob=$(jq -r '.layers[0].digest | ltrimstr("sha256:")' "$WORK/bad/blobs/sha256/$(jq -r '.manifests[0].digest | ltrimstr("sha256:")' "$WORK/bad/index.json")")
printf 'x' >>"$WORK/bad/blobs/sha256/$blob"
if "$BUILD" verify --layout "$WORK/bad" 2>/dev/null; then fail "verify accepted a blob that does not match its digest"; fi
if "$BUILD" unpack --layout "$WORK/bad" --out "$WORK/badroot" 2>/dev/null; then fail "unpack accepted a blob that does not match its digest"; fi

echo "images/test.sh: ok"
