#!/usr/bin/env bash
# The unit lane (`make test-unit`, CI's first test stage): every crate's unit tests (lib and
# bin targets) and doc tests. No cluster, no registry, no Slurm: under 3 minutes once built.
# A few unit tests need root for part of what they check (other users' files, a network
# namespace of their own); as another user they skip with the reason, counted as skipped.
#   scripts/test-unit.sh
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "$0")/lib.sh"
cd "$HPK_ROOT"
test_lane unit --workspace --locked --lib --bins
test_lane doc --workspace --locked --doc
