# shellcheck shell=bash
# Shared helpers for HPK's scripts: timed stages and idempotent installs.

HPK_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export HPK_ROOT
# Tools we build (grpcurl, the control plane) live outside the checkout so that every clone
# and every CI run reuses them; each is keyed by its pinned version.
export HPK_CACHE_DIR="${HPK_CACHE_DIR:-$HOME/.cache/hpk}"
export HPK_TOOLS_DIR="${HPK_TOOLS_DIR:-$HPK_CACHE_DIR/tools}"
export PATH="$HPK_TOOLS_DIR/bin:$PATH"

STAGE_TIMES=()

# stage NAME COMMAND...: runs COMMAND, prints how long it took, remembers it for the summary.
stage() {
  local name=$1 start end
  shift
  echo "==> $name"
  start=$(date +%s)
  "$@"
  end=$(date +%s)
  STAGE_TIMES+=("$(printf '%-28s %5ss' "$name" $((end - start)))")
  echo "<== $name: $((end - start))s"
}

stage_summary() {
  echo "---- stage times ----"
  printf '%s\n' "${STAGE_TIMES[@]}"
}

# test_lane NAME CARGO-TEST-ARGS...: runs `cargo test CARGO-TEST-ARGS` and closes with one line
# for the lane: passed, failed, and skipped — the tests cargo ignored plus those that skipped at
# run time for a missing prerequisite. Those record themselves in $HPK_SKIP_LOG
# (hpk-test-support's skip); cargo counted them as passed, so they move from passed to skipped.
# Returns cargo's status.
test_lane() {
  local name=$1 log skips rc
  shift
  log=$(mktemp)
  skips=$(mktemp)
  HPK_SKIP_LOG=$skips cargo test "$@" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  if [ -s "$skips" ]; then
    echo "---- $name: skipped at run time (test, reason) ----"
    cat "$skips"
  fi
  awk -v lane="$name" -v runtime="$(sort -u "$skips" | cut -f1 | sort -u | wc -l)" '
    /^test result:/ { p += $4; f += $6; i += $8 }
    END { printf "%s tests: %d passed, %d failed, %d skipped (%d ignored, %d at run time)\n",
                 lane, p - runtime, f, i + runtime, i, runtime }' "$log"
  rm -f "$log" "$skips"
  return "$rc"
}

# as_root COMMAND...: runs COMMAND as root, through sudo unless we are root already.
as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# apt_install PKG...: installs the Debian packages that are missing, and only those.
apt_install() {
  local missing=()
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "installing: ${missing[*]}"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
}

# go_tool NAME MODULE@VERSION: installs a pinned Go tool into $HPK_TOOLS_DIR/bin once per version.
go_tool() {
  local name=$1 module=$2 stamp
  stamp="$HPK_TOOLS_DIR/stamps/$name"
  if [ -x "$HPK_TOOLS_DIR/bin/$name" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$module" ]; then
    return 0
  fi
  echo "building $module"
  mkdir -p "$HPK_TOOLS_DIR/bin" "$HPK_TOOLS_DIR/stamps"
  GOBIN="$HPK_TOOLS_DIR/bin" GOFLAGS=-trimpath go install "$module"
  echo "$module" >"$stamp"
}

# go_test_tool NAME MODULE VERSION PACKAGE [LDFLAGS]: builds a pinned Go test binary
# (`go test -c`) of PACKAGE inside MODULE@VERSION into $HPK_TOOLS_DIR/bin once per version; for
# suites shipped as tests, like cri-tools' critest. The module's own go.mod and go.sum pin its
# dependencies, as `go install module@version` does for a main package.
go_test_tool() {
  local name=$1 module=$2 version=$3 package=$4 ldflags=${5:-} stamp dir
  stamp="$HPK_TOOLS_DIR/stamps/$name"
  if [ -x "$HPK_TOOLS_DIR/bin/$name" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$module@$version $package" ]; then
    return 0
  fi
  echo "building $module@$version $package"
  mkdir -p "$HPK_TOOLS_DIR/bin" "$HPK_TOOLS_DIR/stamps"
  dir=$(go mod download -json "$module@$version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  [ -n "$dir" ] || { echo "go mod download $module@$version gave no directory" >&2; return 1; }
  (cd "$dir" && GOFLAGS=-trimpath go test -c -ldflags "$ldflags" -o "$HPK_TOOLS_DIR/bin/$name" "$package")
  echo "$module@$version $package" >"$stamp"
}

# go_local_tool NAME DIR: builds the main package of the Go module in DIR (a directory of this
# repository with its own go.mod and go.sum) into $HPK_TOOLS_DIR/bin/NAME, static, once per
# content of DIR and Go toolchain.
go_local_tool() {
  local name=$1 dir=$HPK_ROOT/$2 stamp want
  stamp="$HPK_TOOLS_DIR/stamps/$name"
  want="$(go version) $(cat "$dir"/go.mod "$dir"/go.sum "$dir"/*.go | sha256sum | cut -d' ' -f1)"
  if [ -x "$HPK_TOOLS_DIR/bin/$name" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
    return 0
  fi
  echo "building $2 ($name)"
  mkdir -p "$HPK_TOOLS_DIR/bin" "$HPK_TOOLS_DIR/stamps"
  (cd "$dir" && CGO_ENABLED=0 GOFLAGS=-trimpath go build -o "$HPK_TOOLS_DIR/bin/$name" .)
  echo "$want" >"$stamp"
}
