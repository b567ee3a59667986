#!/usr/bin/env bash
# Installs what building and testing HPK needs on a fresh Debian 12 machine. Idempotent: a
# second run only checks.
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "$0")/lib.sh"

setup_packages() {
  # Lints our scripts (shellcheck); the benchmark's baseline and operators' checks (openssl).
  apt_install shellcheck openssl ca-certificates
}

setup_tools() {
  command -v go >/dev/null || { echo "Go is required (https://go.dev/doc/install)" >&2; exit 1; }
  go_tool grpcurl github.com/fullstorydev/grpcurl/cmd/grpcurl@v1.9.3
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  stage "apt packages" setup_packages
  stage "go tools" setup_tools
fi
