#!/usr/bin/env bash
# The test command: sets up a fresh machine, then runs every check CI runs.
#   scripts/test.sh
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "$0")/lib.sh"
# shellcheck source=scripts/setup.sh
source "$HPK_ROOT/scripts/setup.sh"
cd "$HPK_ROOT"

# Tests that need a tool fail, rather than skip, when it is missing.
export HPK_REQUIRE_TOOLS=1

shell_scripts() {
  git ls-files -z '*.sh' .ci/run | xargs -0 shellcheck -x
}

stage "apt packages" setup_packages
stage "go tools" setup_tools
stage "cargo fmt --check" cargo fmt --all --check
stage "cargo clippy" cargo clippy --workspace --all-targets --locked -- -D warnings
stage "shellcheck" shell_scripts
stage "cargo test" cargo test --workspace --locked
stage_summary
