#!/usr/bin/env bash
# Runs the CRI validation suite (critest, cri-tools v1.34) against hpk-pod-runtime.
#
#   services/pod-runtime/critest/run.sh [options] [-- critest flags...]
#     --runtime BIN   hpk-pod-runtime   [target/debug/hpk-pod-runtime]
#     --pause BIN     hpk-pause         [target/debug/hpk-pause]
#     --net-forwarder BIN  hpk-net-forwarder, which gives pods their addresses
#                                       [target/debug/hpk-net-forwarder]
#     --critest BIN   critest           [$HPK_TOOLS_DIR/bin/critest, from scripts/setup.sh]
#     --crictl BIN    crictl            [$HPK_TOOLS_DIR/bin/crictl]
#     --out DIR       reports           [target/critest]
#     --focus RE / --skip RE            ginkgo focus / skip (repeatable)
#
# Everything runs as root in private network, mount, IPC and UTS namespaces (critest's
# "host" IPC segments and hostname changes stay there): a registry on
# 127.0.0.2:80 serves stand-ins of critest's images (images.sh), and /etc/hosts, in that
# namespace only, sends registry.k8s.io and gcr.io to it. So critest uses its own image names
# unchanged: with -registry-prefix its image tests would look the prefixed pulls up under the
# unprefixed names and fail. The host ports critest binds (12000-12003) are the namespace's.
#
# Writes DIR/junit.xml, DIR/critest.log, DIR/runtime.log, DIR/registry.log and DIR/summary.txt.
# Exit status: 0 when every spec passed, 1 when some failed, 2 on a setup error.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=scripts/lib.sh
source "$HERE/../../../scripts/lib.sh"

RUNTIME=$HPK_ROOT/target/debug/hpk-pod-runtime
PAUSE=$HPK_ROOT/target/debug/hpk-pause
NETFWD=$HPK_ROOT/target/debug/hpk-net-forwarder
CRITEST=$HPK_TOOLS_DIR/bin/critest
CRICTL=$HPK_TOOLS_DIR/bin/crictl
OUT=$HPK_ROOT/target/critest
GINKGO=()
while [ $# -gt 0 ]; do
  case $1 in
    --runtime) RUNTIME=$2; shift 2 ;;
    --pause) PAUSE=$2; shift 2 ;;
    --net-forwarder) NETFWD=$2; shift 2 ;;
    --critest) CRITEST=$2; shift 2 ;;
    --crictl) CRICTL=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --focus) GINKGO+=("-ginkgo.focus=$2"); shift 2 ;;
    --skip) GINKGO+=("-ginkgo.skip=$2"); shift 2 ;;
    --) shift; GINKGO+=("$@"); break ;;
    -h | --help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

die() { echo "run.sh: $*" >&2; exit 2; }

# Re-enter in fresh namespaces; nothing below touches the host's network or mounts.
if [ -z "${HPK_CRITEST_NS:-}" ]; then
  [ "$(id -u)" -eq 0 ] || die "needs root (network and mount namespaces, crun as root)"
  for tool in unshare crun nsenter docker-registry curl ip go "$RUNTIME" "$PAUSE" "$NETFWD" "$CRITEST" "$CRICTL"; do
    command -v "$tool" >/dev/null || die "$tool not found (scripts/setup.sh, cargo build -p hpk-pod-runtime --bins)"
  done
  mkdir -p "$OUT"
  OUT=$(cd "$OUT" && pwd)
  export HPK_CRITEST_NS=1
  exec unshare --net --mount --ipc --uts --propagation private -- "$0" --runtime "$RUNTIME" --pause "$PAUSE" --net-forwarder "$NETFWD" \
    --critest "$CRITEST" --crictl "$CRICTL" --out "$OUT" -- "${GINKGO[@]}"
fi

unset http_proxy https_proxy HTTP_PROXY HTTPS_PROXY all_proxy ALL_PROXY
ip link set lo up
# As on a systemd host, / is shared: mounts critest makes later reach the runtime's namespace
# (a slave of this one) and, through rslave binds, its containers. Only this namespace's view.
mount --make-rshared /
TMP=$(mktemp -d /tmp/hpk-critest.XXXXXX)
RUNTIME_PID="" REGISTRY_PID="" NETFWD_PID=""
SOCK=unix://$TMP/run/cri.sock
crictl() { "$CRICTL" --config "$TMP/crictl.yaml" "$@"; }

# stop PID NAME: SIGTERM, then SIGKILL after 15 s; only processes this script started.
stop() {
  local pid=$1
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then echo "$2 ($pid) ignored SIGTERM; killing" >&2; kill -KILL "$pid" || true; fi
  wait "$pid" 2>/dev/null || true
}

cleanup() {
  local rc=$? pid leftover=()
  set +e
  if [ -n "$RUNTIME_PID" ] && kill -0 "$RUNTIME_PID" 2>/dev/null; then
    crictl --timeout 60s rmp --all --force >/dev/null 2>&1 ||
      echo "crictl rmp --all --force failed" >&2
  fi
  stop "$RUNTIME_PID" hpk-pod-runtime
  stop "$NETFWD_PID" hpk-net-forwarder
  stop "$REGISTRY_PID" docker-registry
  # Anything still in this private network namespace was started by this run (a container
  # the runtime failed to remove, a host-network pod): name it, then end it by PID.
  local ns
  ns=$(readlink /proc/self/ns/net)
  for pid in /proc/[0-9]*; do
    pid=${pid#/proc/}
    [ "$pid" = $$ ] && continue
    [ "$(readlink "/proc/$pid/ns/net" 2>/dev/null)" = "$ns" ] || continue
    grep -q "^PPid:[[:space:]]*$$\$" "/proc/$pid/status" 2>/dev/null && continue
    leftover+=("$pid:$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | cut -c1-80)")
    kill -KILL "$pid" 2>/dev/null
  done
  [ ${#leftover[@]} -eq 0 ] || printf 'killed leftover process %s\n' "${leftover[@]}" >&2
  # Mounts critest's propagation tests leave under the temp dir (this namespace's only).
  local mnt
  while read -r mnt; do
    umount -l "$mnt" 2>/dev/null
  done < <(awk -v t="$TMP" 'index($5, t) == 1 {print $5}' /proc/self/mountinfo | sort -r)
  rm -rf "$TMP"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Binaries are copied: a rebuild of target/ during the run must not swap them underneath.
mkdir -p "$TMP/bin" "$TMP/root" "$TMP/registry" "$TMP/tmp"
mkdir -m 0700 "$TMP/run"
printf 'runtime-endpoint: %s\nimage-endpoint: %s\n' "$SOCK" "$SOCK" >"$TMP/crictl.yaml"
cp "$RUNTIME" "$TMP/bin/hpk-pod-runtime"
cp "$PAUSE" "$TMP/bin/hpk-pause"
cp "$NETFWD" "$TMP/bin/hpk-net-forwarder"

echo "==> registry and images"
cat >"$TMP/registry/config.yml" <<EOF
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $TMP/registry/storage
  delete:
    enabled: true
http:
  addr: 127.0.0.2:80
  debug:
    addr: ""
    prometheus:
      enabled: false
EOF
# REGISTRY_* variables would override the config file.
env -u REGISTRY_HTTP_ADDR docker-registry serve "$TMP/registry/config.yml" >"$OUT/registry.log" 2>&1 &
REGISTRY_PID=$!
for _ in $(seq 100); do curl -fs -o /dev/null http://127.0.0.2:80/v2/ && break; sleep 0.1; done
curl -fs -o /dev/null http://127.0.0.2:80/v2/ || die "registry not ready; see $OUT/registry.log"
# Not on 127.0.0.1: critest fetches http://<pod IP>:80/, which with an empty pod IP is
# localhost:80 and must not find the registry there.
printf '%s\n' "127.0.0.1 localhost" "::1 localhost" "127.0.0.2 registry.k8s.io gcr.io" >"$TMP/hosts"
mount --bind "$TMP/hosts" /etc/hosts
"$HERE/images.sh" 127.0.0.2:80 "$TMP/images" >/dev/null

echo "==> hpk-net-forwarder"
# This namespace is the bubble: pods get 10.88.0.0/16 addresses routed here, where critest runs.
"$TMP/bin/hpk-net-forwarder" serve --socket="$TMP/nf/run/nf.sock" --state-dir="$TMP/nf/state" \
  --pod-cidr=10.88.0.0/16 >"$OUT/net-forwarder.log" 2>&1 &
NETFWD_PID=$!
for _ in $(seq 300); do
  [ -S "$TMP/nf/run/nf.sock" ] && break
  kill -0 "$NETFWD_PID" 2>/dev/null || die "hpk-net-forwarder exited; see $OUT/net-forwarder.log"
  sleep 0.1
done
[ -S "$TMP/nf/run/nf.sock" ] || die "hpk-net-forwarder not serving"

echo "==> hpk-pod-runtime"
"$TMP/bin/hpk-pod-runtime" --socket="$TMP/run/cri.sock" --root="$TMP/root" \
  --pause-binary="$TMP/bin/hpk-pause" --insecure-registry=registry.k8s.io,gcr.io \
  --net-forwarder-socket="$TMP/nf/run/nf.sock" --pod-grace-seconds=2 >"$OUT/runtime.log" 2>&1 &
RUNTIME_PID=$!
for _ in $(seq 300); do
  crictl --timeout 2s version >/dev/null 2>&1 && break
  kill -0 "$RUNTIME_PID" 2>/dev/null || die "hpk-pod-runtime exited; see $OUT/runtime.log"
  sleep 0.1
done
crictl --timeout 2s version >/dev/null || die "runtime not ready"

echo "==> critest"
rm -f "$OUT/junit.xml" "$OUT/summary.txt"
start=$(date +%s)
set +e
# critest's temp dirs (pod log dirs, seccomp profiles) go under $TMP: failed specs leave them.
(cd "$TMP" && TMPDIR=$TMP/tmp "$CRITEST" -test.timeout=0 \
  -runtime-endpoint "$SOCK" -image-endpoint "$SOCK" \
  -ginkgo.v -ginkgo.no-color -ginkgo.junit-report="$OUT/junit.xml" "${GINKGO[@]}") \
  >"$OUT/critest.log" 2>&1
critest_rc=$?
set -e
elapsed=$(($(date +%s) - start))

# The summary, from the JUnit report: counts of specs (critest itself skips its benchmarks),
# then each failure: its name and the start of its message.
[ -s "$OUT/junit.xml" ] || { tail -30 "$OUT/critest.log" >&2; die "critest wrote no report (exit $critest_rc)"; }
awk -v elapsed="$elapsed" '
  function attr(s, name,   m) { if (match(s, name "=\"[^\"]*\"")) return substr(s, RSTART + length(name) + 2, RLENGTH - length(name) - 3); return "" }
  function unxml(s) { gsub(/&#xA;/, " ", s); gsub(/&#34;|&quot;/, "\"", s); gsub(/&#39;|&apos;/, "\x27", s); gsub(/&lt;/, "<", s); gsub(/&gt;/, ">", s); gsub(/&amp;/, "\\&", s); return s }
  /<testcase / {
    name = unxml(attr($0, "name")); status = attr($0, "status"); cur = ""
    if (status == "failed" || status == "panicked" || status == "timedout" || status == "interrupted") cur = name
    else if (name ~ /^\[It\]/) n[status]++   # specs only, not the suite setup nodes
  }
  /<failure / && cur != "" { failed[++nf] = cur " -- " substr(unxml(attr($0, "message")), 1, 300); cur = "" }
  END {
    printf "critest: %d passed, %d failed, %d skipped (%d pending) in %ds\n", n["passed"], nf, n["skipped"], n["pending"], elapsed
    for (i = 1; i <= nf; i++) printf "FAIL %s\n", failed[i]
  }' "$OUT/junit.xml" >"$OUT/summary.txt"
cat "$OUT/summary.txt"
echo "reports in $OUT (critest.log, junit.xml, runtime.log)"
[ "$critest_rc" -eq 0 ] || exit 1
