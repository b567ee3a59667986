#!/usr/bin/env bash
# The cluster lane (CI's "cluster tests" stage): every integration test binary (tests/*.rs of
# each crate), several at a time. Each binary runs as `cargo test` would run it (from its
# crate's directory, its tests on as many threads as cargo gives them), with its output kept
# apart and printed whole when it ends, then its time. The binaries mostly wait on clusters
# (API servers, bubbles, Slurm) starting and settling, so running JOBS of them at once takes
# the lane from about 36 minutes to about 20 on 2 cores (docs/benchmarks.md).
#   scripts/test-cluster.sh [--jobs N] [-- CARGO-TEST-ARGS...]
# Binaries named in SOLO run alone, one after another, after all others:
# - hpk-integration::sweep: `hpk-testcluster sweep` removes every harness's namespaces and
#   processes, so nothing else may run beside it;
# - hpk-kubelet::api: it measures what load on the machine changes (a pod burning one core
#   must show about one core in the stats; a followed log line must arrive within 2 s).
# A binary still running after BOUND seconds (30 minutes, about twice the longest's time) is
# ended (SIGTERM, SIGKILL 30 s later) and counts as failed: a test that hangs fails the lane with
# its output, instead of holding CI until its own limit. (Each test's kubectl calls have their own
# bound, so a hang there fails just that test, with what it printed.)
# Closes with one line like test_lane's: passed, failed, skipped (ignored plus skipped at run
# time for a missing prerequisite, each listed with its reason), and exits non-zero if any
# binary failed.
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "$0")/lib.sh"
cd "$HPK_ROOT"

jobs=3
BOUND=${HPK_TEST_BINARY_BOUND:-1800}
while [ $# -gt 0 ]; do
  case $1 in
    --jobs) jobs=${2:?--jobs needs a number}; shift 2 ;;
    --) shift; break ;;
    *) echo "unknown argument: $1 (usage: $0 [--jobs N] [-- CARGO-TEST-ARGS...])" >&2; exit 2 ;;
  esac
done
[[ $jobs =~ ^[1-9][0-9]*$ ]] || { echo "--jobs needs a positive number, got '$jobs'" >&2; exit 2; }

# Longest first, from the lane's measured times (docs/benchmarks.md), so that the long ones
# do not start last; binaries not listed follow in cargo's order.
ORDER=(
  hpk::slurm hpk::attacks hpk::local hpk::data hpk::faults hpk::scale hpk-kubelet::restart
  hpk-kubelet::connector hpk::gpus hpk-pod-runtime::sub_path hpk-kubelet::pods hpk-kubelet::node
  hpk-net-forwarder::attach
)
SOLO=(hpk-kubelet::api hpk-integration::sweep)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The test binaries, built once: target name, executable, crate directory.
cargo test --no-run --message-format=json --workspace --locked --test '*' "$@" >"$work/build.json"
jq -r 'select(.reason == "compiler-artifact" and .profile.test == true and .executable != null)
       | [.target.name, .executable, (.manifest_path | sub("/Cargo.toml$"; ""))] | @tsv' \
  "$work/build.json" | sort -u >"$work/binaries.tsv"
# Named PACKAGE::TARGET, the package's name from its manifest.
while IFS=$'\t' read -r target exe dir; do
  pkg=$(sed -n 's/^name = "\(.*\)"$/\1/p' "$dir/Cargo.toml" | head -1)
  printf '%s::%s\t%s\t%s\n' "$pkg" "$target" "$exe" "$dir"
done <"$work/binaries.tsv" >"$work/named.tsv"
[ -s "$work/named.tsv" ] || { echo "no integration test binaries were built" >&2; exit 1; }

queue=()
for name in "${ORDER[@]}"; do
  grep -q "^$name	" "$work/named.tsv" && queue+=("$name")
done
solo=()
for name in "${SOLO[@]}"; do
  grep -q "^$name	" "$work/named.tsv" && solo+=("$name")
done
while IFS=$'\t' read -r name _; do
  printf '%s\n' "${queue[@]}" "${solo[@]}" | grep -qx "$name" || queue+=("$name")
done <"$work/named.tsv"

lane_start=$(date +%s)
declare -A started=() pid_of=()
failed=()

# run_one NAME: runs the binary in the background, its output to $work/NAME.log.
run_one() {
  local name=$1 exe dir
  exe=$(awk -F'\t' -v n="$name" '$1 == n { print $2 }' "$work/named.tsv")
  dir=$(awk -F'\t' -v n="$name" '$1 == n { print $3 }' "$work/named.tsv")
  started[$name]=$(date +%s)
  echo "---- start $name ($(date -u +%H:%M:%S))"
  (cd "$dir" && HPK_SKIP_LOG="$work/$name.skips" CARGO_MANIFEST_DIR="$dir" \
     exec timeout --kill-after=30 "$BOUND" "$exe") \
    >"$work/$name.log" 2>&1 &
  pid_of[$!]=$name
}

# reap: waits for one running binary, prints its output and time.
reap() {
  local pid rc=0 name
  wait -n -p pid || rc=$?
  name=${pid_of[$pid]}
  unset "pid_of[$pid]"
  echo "==== $name: exit $rc after $(($(date +%s) - ${started[$name]}))s"
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    echo "==== $name did not finish within ${BOUND}s and was ended; what it printed:"
  fi
  sed 's/^/    /' "$work/$name.log"
  printf '%s\t%s\n' "$name" "$(($(date +%s) - ${started[$name]}))" >>"$work/times.tsv"
  [ "$rc" -eq 0 ] || failed+=("$name")
}

for name in "${queue[@]}"; do
  while [ "${#pid_of[@]}" -ge "$jobs" ]; do reap; done
  run_one "$name"
done
while [ "${#pid_of[@]}" -gt 0 ]; do reap; done
for name in "${solo[@]}"; do
  run_one "$name"
  reap
done

echo "---- cluster lane: time of each binary (s), $jobs at a time ----"
sort -t$'\t' -k2,2nr "$work/times.tsv"
echo "cluster lane wall time: $(($(date +%s) - lane_start))s"
cat "$work"/*.skips 2>/dev/null >"$work/skips" || true
if [ -s "$work/skips" ]; then
  echo "---- cluster: skipped at run time (test, reason) ----"
  cat "$work/skips"
fi
cat "$work"/*.log | awk -v runtime="$(cut -f1 "$work/skips" | sort -u | wc -l)" '
  /^test result:/ { p += $4; f += $6; i += $8 }
  END { printf "cluster tests: %d passed, %d failed, %d skipped (%d ignored, %d at run time)\n",
               p - runtime, f, i + runtime, i, runtime }'
if [ ${#failed[@]} -gt 0 ]; then
  echo "failed: ${failed[*]}" >&2
  exit 1
fi
