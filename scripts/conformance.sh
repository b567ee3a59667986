#!/usr/bin/env bash
# Runs upstream's Kubernetes e2e conformance suite (v1.35.4, built from Go modules) against a
# fresh HPK cluster on this machine — `hpk up`, or `sbatch --nodes=3 slurm/hpk.slurm` on a real
# Slurm — and writes the results (`make conformance`).
#
#   scripts/conformance.sh [options]
#     --focus RE            ginkgo focus           ['\[Conformance\]']
#     --skip RE             ginkgo skip            ['\[Flaky\]']
#                           By default all 441 [Conformance] specs: the 406 neither [Serial] nor
#                           [Disruptive] nor [Slow], and the 35 that are, which the summary counts
#                           apart. Ginkgo runs the [Serial] ones after all the others, one at a
#                           time on its first process (the framework marks them ginkgo.Serial).
#                           '\[Serial\]|\[Disruptive\]|\[Flaky\]|\[Slow\]' leaves only the 406.
#     --known-failures FILE tab-separated lines: spec-name regex (grep -E), reason. The exit status
#                           counts only failures no line matches ('#' lines are comments)
#     --procs N             parallel ginkgo processes              [2]
#     --cluster KIND        local: `hpk up --nodes N` on a test host; slurm: a real Slurm of three
#                           compute nodes in test namespaces (hpk-testcluster slurm: one mapped
#                           ID, as an unprivileged site user has), the release bundle unpacked
#                           in its user's home, and `sbatch --nodes=3 slurm/hpk.slurm` as that
#                           user, as scripts/demo.sh does             [local]
#     --nodes N             bubbles of `hpk up --nodes` (local)    [2]
#     --timeout DURATION    ginkgo's bound on the whole run        [60m]
#     --flake-attempts N    runs of a failing spec before it counts as failed; a spec that
#                           passed on a later attempt is marked so in the summary  [1]
#     --out DIR             reports and logs                       [target/conformance]
#     --up-arg ARG          one more flag for `hpk up` or hpk.slurm (repeatable), e.g. --up-arg=--bind=/scratch/data
#
# What it does, each step cached where it can be:
#   1. builds e2e.test, ginkgo, agnhost and imagetools (integration/e2e/build.sh: stamp-cached in
#      ~/.cache/hpk/e2e/bin), the control plane's kubectl, and, when missing, the binaries
#      (cargo build) and the bubble image (make images);
#   2. `hpk-testcluster registry`: a test host (network namespace) with a local registry and
#      CoreDNS' and the other add-ons' images, as scripts/demo.sh local; pushes the e2e stand-in
#      images to it (integration/e2e/images.sh) and points the suite at them (KUBE_TEST_REPO_LIST);
#   3. `hpk up --nodes 2` on that test host, with its own HPK_HOME and HPK_STATE_DIR, and a
#      directory of the run bound at /tmp/job-e2e (the Job specs mount hostPaths there);
#      with --cluster slurm instead: the Slurm (its login node holds the registry), the release
#      bundle (`make dist PROFILE=debug` when missing) unpacked in the user's home, the job
#      submitted with the same flags and a directory of the user's bound at /tmp/job-e2e;
#   4. ginkgo run e2e.test --provider=skeleton in the test host's network namespace (slurm: on
#      the login node, with the user's ~/.hpk/kubeconfig);
#   5. DIR/summary.md: command, date, time taken, totals, one row per spec;
#   6. `hpk down` (slurm: `scancel --batch --signal=TERM` and the job's end), stops the registry
#      host (or the Slurm), removes the temporary directory.
# Writes DIR/report.json, DIR/junit.xml (ginkgo's), DIR/planned.json (the dry run listing the
# specs the focus selects), DIR/e2e.log, DIR/hpk-up.log, DIR/registry.log, DIR/summary.md.
# Exit status: 0 when every selected spec passed or failed as listed in --known-failures,
# 1 when some other spec failed or did not run, 2 on a setup error.
set -euo pipefail
# The whole script is one function, which bash parses before it runs any of it: editing this
# file while a run is under way cannot change what that run does.
main() {
# shellcheck source=scripts/lib.sh
source "$(dirname "$0")/lib.sh"
cd "$HPK_ROOT"

FOCUS='\[Conformance\]'
SKIP='\[Flaky\]'
KNOWN=""
PROCS=2
NODES=2
KIND=local
TIMEOUT=60m
ATTEMPTS=1
OUT=$HPK_ROOT/target/conformance
UP_ARGS=()
# The command line as a person would type it again: arguments with specials in single quotes.
COMMAND=scripts/conformance.sh
for arg in "$@"; do
  if [[ $arg =~ ^[A-Za-z0-9_./=:,+-]+$ ]]; then COMMAND+=" $arg"; else COMMAND+=" '${arg//\'/\'\\\'\'}'"; fi
done
while [ $# -gt 0 ]; do
  case $1 in
    --focus) FOCUS=$2; shift 2 ;;
    --skip) SKIP=$2; shift 2 ;;
    --known-failures) KNOWN=$(realpath "$2"); shift 2 ;;
    --procs) PROCS=$2; shift 2 ;;
    --nodes) NODES=$2; shift 2 ;;
    --cluster) KIND=$2; shift 2 ;;
    --timeout) TIMEOUT=$2; shift 2 ;;
    --flake-attempts) ATTEMPTS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --up-arg) UP_ARGS+=("$2"); shift 2 ;;
    --up-arg=*) UP_ARGS+=("${1#--up-arg=}"); shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "conformance.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

die() { echo "conformance.sh: $*" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || die "needs root (network namespaces for the registry host, as scripts/demo.sh local)"
[ -z "$KNOWN" ] || [ -f "$KNOWN" ] || die "--known-failures $KNOWN: no such file"
case $KIND in local | slurm) ;; *) die "--cluster $KIND: local or slurm" ;; esac
for tool in go jq curl nsenter docker-registry busybox; do
  command -v "$tool" >/dev/null || die "$tool not found (scripts/setup.sh)"
done
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
rm -f "$OUT"/{report.json,junit.xml,planned.json,summary.md,e2e.log,hpk-up.log,registry.log,hpk-down.log}

E2E_BIN=$HPK_CACHE_DIR/e2e/bin
KUBECTL=$HPK_CACHE_DIR/controlplane/bin/kubectl
HPK=$HPK_ROOT/target/debug/hpk
TMP=$(mktemp -d /tmp/hpk-conformance.XXXXXX)
CLUSTER=conformance
HELPER_PID="" NETNS="" UP="" SUITE_PID="" JOB=""
# The cluster's kubeconfig, once it is up.
KUBECONFIG_FILE=$TMP/home/$CLUSTER/kubeconfig

# stop PID NAME: SIGTERM, then SIGKILL after 60 s; only the processes this script started.
stop() {
  local pid=$1
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 600); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then echo "$2 ($pid) ignored SIGTERM; killing" >&2; kill -KILL "$pid" || true; fi
  wait "$pid" 2>/dev/null || true
}

# descendants PID: the PIDs of PID's children, theirs, and so on.
descendants() {
  local child
  for child in $(pgrep -P "$1"); do
    echo "$child"
    descendants "$child"
  done
}

in_host() { nsenter --net="/run/netns/$NETNS" -- env HPK_HOME="$TMP/home" HPK_STATE_DIR="$TMP/state" "$@"; }
# Where the suite runs: the local cluster's test host, or the Slurm's login node (this namespace).
on_client() { if [ "$KIND" = local ]; then in_host "$@"; else "$@"; fi; }
# The Slurm's user, as demo.sh runs it.
as_user() {
  runuser -u "$HPK_DEMO_USER" -- env HOME="$HPK_DEMO_HOME" SLURM_CONF="$HPK_DEMO_SLURM_CONF" \
    PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin "$@"
}

cleanup() {
  local rc=$?
  set +e
  # An interrupted run: ginkgo's processes first (they delete their namespaces), by PID.
  if [ -n "$SUITE_PID" ] && kill -0 "$SUITE_PID" 2>/dev/null; then
    local pid
    # ginkgo does not pass an interrupt on to its e2e.test processes: each is told itself.
    for pid in $(descendants "$SUITE_PID"); do kill -INT "$pid" 2>/dev/null; done
    stop "$SUITE_PID" ginkgo
  fi
  if [ -n "$JOB" ]; then
    echo "==> scancel --batch --signal=TERM $JOB"
    as_user scancel --batch --signal=TERM "$JOB" || true
    for _ in $(seq 1200); do
      [ -z "$(as_user squeue -h -j "$JOB" 2>/dev/null)" ] && break
      sleep 0.1
    done
    cp "$HPK_DEMO_HOME/slurm-$JOB.out" "$OUT/hpk-down.log" 2>/dev/null
  fi
  if [ -n "$UP" ]; then
    echo "==> hpk down --name $CLUSTER"
    in_host "$HPK" down --name "$CLUSTER" >"$OUT/hpk-down.log" 2>&1 || echo "hpk down failed: see $OUT/hpk-down.log" >&2
  fi
  # The helper removes its registry, the test host and its network before it exits.
  stop "$HELPER_PID" hpk-testcluster
  rm -rf "$TMP"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

build() {
  # shellcheck source=scripts/setup.sh
  source "$HPK_ROOT/scripts/setup.sh"
  setup_controlplane
  integration/e2e/build.sh "$E2E_BIN"
  if [ ! -x "$HPK" ] || [ ! -x target/debug/hpk-testcluster ]; then cargo build --workspace --bins --locked; fi
  if [ ! -f target/images/hpk-bubble.oci.tar ] || [ ! -f target/images/hpk-pause/index.json ]; then make images; fi
  if [ "$KIND" = slurm ] && [ ! -f "target/dist/hpk-$(version).tar.gz" ]; then make dist PROFILE=debug; fi
}

version() { sed -n '/^\[workspace\.package\]/,/^\[/s/^version = "\(.*\)"$/\1/p' Cargo.toml; }

start_registry() {
  local helper=registry
  [ "$KIND" = local ] || helper=slurm
  target/debug/hpk-testcluster "$helper" --env-file "$TMP/env" >"$OUT/registry.log" 2>&1 &
  HELPER_PID=$!
  for _ in $(seq 1 3000); do
    [ -f "$TMP/env" ] && break
    kill -0 "$HELPER_PID" 2>/dev/null || { cat "$OUT/registry.log"; return 1; }
    sleep 0.1
  done
  [ -f "$TMP/env" ] || { echo "hpk-testcluster $helper was not ready within 300 s" >&2; return 1; }
  # shellcheck disable=SC1091
  source "$TMP/env"
  NETNS=${HPK_DEMO_NETNS:-}
  integration/e2e/images.sh "$HPK_DEMO_REGISTRY" "$TMP/images" "$E2E_BIN" target/images/hpk-pause \
    "$TMP/repo-list.yaml" "$HPK_CACHE_DIR/controlplane/bin/etcd"
}

up() {
  UP=1
  # The kubelets taint a node whose disk is < 10 % free; the suite would wait on that taint.
  # HPK lets pods mount only bound host paths: the Job specs' hostPath /tmp/job-e2e/<random>
  # (test/e2e/framework/job) is this run's own directory.
  mkdir -p "$TMP/job-e2e"
  in_host "$HPK" up --name "$CLUSTER" --nodes "$NODES" --image target/images/hpk-bubble.oci.tar \
    --bind="$TMP/job-e2e:/tmp/job-e2e" \
    --insecure-registry="$HPK_DEMO_REGISTRY" --coredns-image="$HPK_DEMO_COREDNS" \
    --metrics-server-image="$HPK_DEMO_METRICS_SERVER" --local-path-provisioner-image="$HPK_DEMO_LOCAL_PATH" \
    --local-path-helper-image="$HPK_DEMO_SHELL" --kubelet-arg=--disk-pressure-percent=1 "${UP_ARGS[@]}" 2>&1 | tee "$OUT/hpk-up.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || return 1
  in_host "$KUBECTL" --kubeconfig "$TMP/home/$CLUSTER/kubeconfig" get nodes -o wide
}

# The Slurm way: the bundle unpacked in the user's home and the job submitted as the user, with
# the flags `up` gives; up once hpk.slurm prints the kubeconfig's export line.
submit() {
  local bundle out
  bundle=$HPK_DEMO_HOME/hpk-$(version)
  install -o "$HPK_DEMO_USER" -m 0644 "target/dist/hpk-$(version).tar.gz" "$HPK_DEMO_HOME/"
  as_user tar -xzf "$HPK_DEMO_HOME/hpk-$(version).tar.gz" -C "$HPK_DEMO_HOME"
  as_user mkdir -p "$HPK_DEMO_HOME/job-e2e"
  JOB=$(cd "$bundle" && as_user sbatch --parsable --output="$HPK_DEMO_HOME/slurm-%j.out" --nodes=3 slurm/hpk.slurm \
    --bind="$HPK_DEMO_HOME/job-e2e:/tmp/job-e2e" \
    --insecure-registry="$HPK_DEMO_REGISTRY" --coredns-image="$HPK_DEMO_COREDNS" \
    --metrics-server-image="$HPK_DEMO_METRICS_SERVER" --local-path-provisioner-image="$HPK_DEMO_LOCAL_PATH" \
    --local-path-helper-image="$HPK_DEMO_SHELL" --kubelet-arg=--disk-pressure-percent=1 "${UP_ARGS[@]}")
  JOB=${JOB%%;*}
  out=$HPK_DEMO_HOME/slurm-$JOB.out
  echo "job $JOB: $out"
  for _ in $(seq 1 6000); do
    grep -q '^export KUBECONFIG=' "$out" 2>/dev/null && break
    if [ -z "$(as_user squeue -h -j "$JOB")" ]; then cat "$out" 2>/dev/null; JOB=""; return 1; fi
    sleep 0.1
  done
  cp "$out" "$OUT/hpk-up.log"
  grep -q '^export KUBECONFIG=' "$out" || { cat "$out"; echo "the cluster was not up within 600 s" >&2; return 1; }
  KUBECONFIG_FILE=$HPK_DEMO_HOME/.hpk/kubeconfig
  "$KUBECTL" --kubeconfig "$KUBECONFIG_FILE" get nodes -o wide
}

E2E_ARGS=()
e2e_args() {
  E2E_ARGS=(--provider=skeleton --kubeconfig="$KUBECONFIG_FILE" --kubectl-path="$KUBECTL"
    --report-dir="$TMP/e2e-reports" --e2e-output-dir="$TMP/e2e-output")
  mkdir -p "$TMP/e2e-reports" "$TMP/e2e-output"
}

plan() {
  e2e_args
  "$E2E_BIN/e2e.test" --ginkgo.dry-run --ginkgo.focus="$FOCUS" --ginkgo.skip="$SKIP" \
    --ginkgo.json-report="$OUT/planned.json" --ginkgo.no-color "${E2E_ARGS[@]}" >/dev/null 2>&1 || true
  [ -s "$OUT/planned.json" ] || die "the dry run wrote no report"
  PLANNED=$(jq '[.[].SpecReports[] | select(.LeafNodeType == "It" and .State == "passed")] | length' "$OUT/planned.json")
  echo "$PLANNED specs selected"
  [ "$PLANNED" -gt 0 ] || die "the focus selects no spec"
}

run_suite() {
  e2e_args
  local rc=0
  # In the background, so that an interrupt reaches the trap at once; nsenter and env exec.
  on_client env KUBE_TEST_REPO_LIST="$TMP/repo-list.yaml" "$E2E_BIN/ginkgo" run --nodes="$PROCS" --timeout="$TIMEOUT" \
    --focus="$FOCUS" --skip="$SKIP" --flake-attempts="$ATTEMPTS" --no-color --output-dir="$OUT" --json-report=report.json --junit-report=junit.xml \
    "$E2E_BIN/e2e.test" -- "${E2E_ARGS[@]}" >"$OUT/e2e.log" 2>&1 &
  SUITE_PID=$!
  wait "$SUITE_PID" || rc=$?
  SUITE_PID=""
  # The last lines, without ginkgo's one-character-per-spec progress lines.
  awk 'length($0) < 300' "$OUT/e2e.log" | tail -n 30
  echo "ginkgo exited with $rc (the summary decides)"
}

STARTED=$(date -u '+%Y-%m-%d %H:%M UTC')
START_S=$SECONDS
stage "build (cached)" build
if [ "$KIND" = local ]; then
  stage "registry and e2e images" start_registry
  stage "hpk up --nodes $NODES" up
else
  stage "Slurm, registry and e2e images" start_registry
  stage "sbatch --nodes=3 slurm/hpk.slurm" submit
fi
stage "select specs (dry run)" plan
RUN_START=$SECONDS
stage "e2e suite" run_suite
RUN_S=$((SECONDS - RUN_START))

# One TSV line per selected spec: name, state, seconds, the failure message on one line (cut).
# A spec the suite's timeout cut short counts as not run.
results() {
  jq -r --slurpfile planned "$OUT/planned.json" '
    def name: ([.ContainerHierarchyTexts[], .LeafNodeText] | join(" ") | gsub("\\s+"; " "));
    ([$planned[0][].SpecReports[] | select(.LeafNodeType == "It" and .State == "passed") | name]) as $want
    | ([.[].SpecReports[] | select(.LeafNodeType == "It")]
       | map({key: name, value: .}) | from_entries) as $got
    | $want[] as $n
    | ($got[$n] // null) as $r
    | [$n,
       (if $r == null then "not-run"
        elif $r.State == "skipped" and (($r.RunTime // 0) == 0) and (($r.Failure.Message // "") == "") then "not-run"
        elif ($r.State | IN("interrupted", "aborted")) then "not-run"
        elif ($r.Failure.Message // "") == "A suite timeout occurred" then "not-run"
        elif ($r.State | IN("failed", "timedout", "panicked")) then "failed"
        else $r.State end),
       (if $r == null then 0 else (($r.RunTime // 0) / 1e9 | floor) end),
       (if $r != null and $r.State == "passed" and (($r.NumAttempts // 1) > 1)
        then "flaky: passed on attempt \($r.NumAttempts)"
        else (($r.Failure.Message // "") + (if ($r.Failure.ForwardedPanic // "") != "" then ": " + $r.Failure.ForwardedPanic else "" end)
          | gsub("\\s+"; " ") | .[0:240]) end)]
    | @tsv' "$OUT/report.json" 2>/dev/null
}

# known NAME: the reason of the first --known-failures line whose regex matches NAME.
known() {
  [ -n "$KNOWN" ] || return 1
  local re reason
  while IFS=$'\t' read -r re reason; do
    case $re in '' | '#'*) continue ;; esac
    if grep -qE -- "$re" <<<"$1"; then echo "${reason:-listed}"; return 0; fi
  done <"$KNOWN"
  return 1
}

if [ -s "$OUT/report.json" ]; then
  results >"$TMP/results.tsv"
else
  # No report (ginkgo killed): every selected spec counts as not run.
  jq -r '.[].SpecReports[] | select(.LeafNodeType == "It" and .State == "passed")
    | [([.ContainerHierarchyTexts[], .LeafNodeText] | join(" ")), "not-run", 0, ""] | @tsv' \
    "$OUT/planned.json" >"$TMP/results.tsv"
fi
count() { awk -F'\t' -v s="$1" '$2 == s' "$TMP/results.tsv" | wc -l; }
PASSED=$(count passed) FAILED=$(count failed) SKIPPED=$(count skipped) NOTRUN=$(count not-run)
# group SERIAL: "passed P of N (X.Y %)" for the [Serial], [Disruptive] or [Slow] specs (1) or
# the others (0).
group() {
  awk -F'\t' -v serial="$1" '($1 ~ /\[(Serial|Disruptive|Slow)\]/) == serial { n++; if ($2 == "passed") p++ }
    END { if (n) printf "passed %d of %d (%.1f %%)", p, n, 100 * p / n; else printf "none selected" }' "$TMP/results.tsv"
}
UNEXPECTED=0
{
  echo "# Conformance run, $STARTED"
  echo
  echo "- Command: \`$COMMAND\`"
  if [ "$KIND" = local ]; then CLUSTER_SAID="\`hpk up --nodes $NODES\`"; else CLUSTER_SAID="\`sbatch --nodes=3 slurm/hpk.slurm\` on a real Slurm (one mapped ID)"; fi
  echo "- Focus: \`$FOCUS\`; skip: \`$SKIP\`; $PROCS ginkgo processes, $ATTEMPTS attempt(s) per spec; $CLUSTER_SAID"
  echo "- Kubernetes e2e suite $("$E2E_BIN/e2e.test" --version 2>/dev/null | head -1), stand-in images (docs/conformance.md)"
  echo "- HPK: checkout $(git describe --always --dirty 2>/dev/null || echo unknown), bubble image $(sed -n 's/.*✓ image \(sha256:[0-9a-f]*\).*/\1/p' "$OUT/hpk-up.log" | head -1)"
  echo "- Time: suite $((RUN_S / 60))m$((RUN_S % 60))s, all $(((SECONDS - START_S) / 60))m$(((SECONDS - START_S) % 60))s (build, registry, the cluster, suite)"
  echo "- Specs selected: $(wc -l <"$TMP/results.tsv"): passed $PASSED, failed $FAILED, skipped $SKIPPED, not run $NOTRUN"
  echo "- Specs neither \`[Serial]\`, \`[Disruptive]\` nor \`[Slow]\`: $(group 0); the others (\`[Serial]\` ones run last, one at a time): $(group 1)"
  echo
  echo "| spec | result | s | failure |"
  echo "|---|---|---|---|"
  while IFS=$'\t' read -r name state secs msg; do
    note=$msg
    if [ "$state" = failed ] || [ "$state" = not-run ]; then
      if reason=$(known "$name"); then
        note="known: $reason. $msg"
      else
        UNEXPECTED=$((UNEXPECTED + 1))
      fi
    fi
    printf '| %s | %s | %s | %s |\n' "${name//|/\\|}" "$state" "$secs" "${note//|/\\|}"
  done < <(sort -t$'\t' -k2,2 -k1,1 "$TMP/results.tsv")
} >"$OUT/summary.md"
stage_summary
FLAKY=$(grep -c $'\tflaky: ' "$TMP/results.tsv" || true)
echo "conformance: passed $PASSED ($FLAKY on a later attempt), failed $FAILED, skipped $SKIPPED, not run $NOTRUN; $UNEXPECTED not in --known-failures"
echo "neither serial, disruptive nor slow: $(group 0); serial, disruptive or slow: $(group 1)"
echo "summary: $OUT/summary.md"
[ "$UNEXPECTED" -eq 0 ]
}
main "$@"
