#!/usr/bin/env bash
# The workspace's layering (ARCHITECTURE.md, "Layers"): a crate's normal dependencies among our
# own crates are libraries under crates/, never a service (services/), the harness
# (integration/) or the command. So no service links another, the command links no service, and
# the harness links none either. Dev-dependencies may reach up (a service's tests use the
# harness). Prints each crate's own dependencies; fails naming any edge that breaks the rule.
#   scripts/check-layers.sh
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "$0")/lib.sh"
cd "$HPK_ROOT"

status=0
while read -r name path; do
  own=()
  while read -r dep dep_path; do
    own+=("$dep")
    case "$dep_path" in
      "$HPK_ROOT"/crates/*) ;;
      *)
        echo "LAYER BROKEN: $name ($path) depends on $dep ($dep_path), which is not a library under crates/"
        status=1
        ;;
    esac
  done < <(cargo tree --locked -p "$name" -e normal --prefix none --depth 1 |
    awk 'NR > 1 && /\(\// { gsub(/[()]/, "", $3); print $1, $3 }')
  printf '%-20s %-26s -> %s\n' "$name" "${path#"$HPK_ROOT"/}" "${own[*]:-(none of ours)}"
done < <(cargo metadata --locked --format-version 1 --no-deps |
  grep -o '"name":"hpk[a-z-]*","version":"[^"]*","id":"path+file://[^#"]*' |
  sed -E 's/"name":"([^"]+)".*path\+file:\/\/(.*)/\1 \2/')
exit "$status"
