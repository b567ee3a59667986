#!/usr/bin/env bash
# Runs commands from an image with crun: unpacks the OCI layout (images/build.sh unpack) into a
# temporary root filesystem, then runs each COMMAND (split on spaces, no shell) in a rootless
# container of it, read-only, without a terminal, and removes everything again.
#
#   images/smoke.sh LAYOUT COMMAND...
#   images/smoke.sh target/images/hpk-bubble '/usr/sbin/nft --version' 'crun --version'
#
# Where the host mounts cgroup v1 with a cgroup2 hierarchy beside it (hybrid), crun refuses to run
# (see shared/notes/crun-in-bubbles.md); the containers then run in a private mount namespace
# with that hierarchy hidden, which needs root.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
[ $# -ge 2 ] || { sed -n '2,8s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" >&2; exit 2; }
LAYOUT=$1
shift
command -v crun >/dev/null || { echo "smoke.sh: crun is required" >&2; exit 1; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/hpk-smoke.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

"$HERE/build.sh" unpack --layout "$LAYOUT" --out "$WORK/rootfs"

hybrid=false
if grep -q ' /sys/fs/cgroup/unified cgroup2 ' /proc/self/mounts; then hybrid=true; fi

n=0
for line in "$@"; do
  n=$((n + 1))
  read -ra args <<<"$line"
  bundle="$WORK/bundle$n"
  mkdir -p "$bundle"
  (cd "$bundle" && crun spec --rootless)
  args_json=$(printf '%s\n' "${args[@]}" | jq -R . | jq -sc .)
  jq --arg root "$WORK/rootfs" --argjson args "$args_json" \
    '.process.terminal = false | .process.args = $args | .root = {path: $root, readonly: true}
     | del(.linux.resources) | del(.linux.cgroupsPath)' \
    "$bundle/config.json" >"$bundle/config.json.new"
  mv "$bundle/config.json.new" "$bundle/config.json"
  echo "\$ $line"
  if $hybrid; then
    # shellcheck disable=SC2016 # $1 and $2 are the inner shell's.
    unshare -m sh -c 'mount -t tmpfs -o ro,size=4k none /sys/fs/cgroup/unified &&
      exec crun --cgroup-manager=disabled run --bundle "$1" "$2"' sh "$bundle" "hpk-smoke-$$-$n"
  else
    crun --cgroup-manager=disabled run --bundle "$bundle" "hpk-smoke-$$-$n"
  fi
done
