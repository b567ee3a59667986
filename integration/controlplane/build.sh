#!/usr/bin/env bash
# Builds the hpk-controlplane multi-call binary (upstream Kubernetes control
# plane + kubectl + etcd, see README.md) and its per-component symlinks.
#
# Usage: integration/controlplane/build.sh [OUTDIR]   (default: integration/controlplane/bin)
#
# The build is cached: a stamp next to the binary records the Go toolchain and
# the sha256 of every input (go.mod, go.sum, main.go, this script). When the
# stamp matches and the binary exists, nothing is rebuilt. The Go build cache
# (GOCACHE) makes a rebuild after a small change take seconds (a relink); a cold
# build of the whole Kubernetes tree takes far longer.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${1:-$here/bin}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
cd "$here"

name=hpk-controlplane
bin="$out/$name"
stamp="$out/$name.stamp"
components=(kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubectl etcd)

# Everything that decides what the binary contains.
want_stamp="$(
	go version
	go env GOOS GOARCH
	sha256sum go.mod go.sum main.go build.sh
)"

link_components() {
	# Relative links, so the output directory can be moved or copied as a whole.
	local c
	for c in "${components[@]}"; do
		ln -sfn "$name" "$out/$c"
	done
}

if [[ -x "$bin" && -f "$stamp" && "$(cat "$stamp")" == "$want_stamp" ]]; then
	link_components
	echo "build.sh: $bin is up to date (stamp matches), nothing to do"
	exit 0
fi

# origin_commit MODULE: the git commit of MODULE's selected version, from the
# module cache's .info record (empty if the proxy did not record one).
origin_commit() {
	local version
	go mod download "$1" # fetches the .info record too; a no-op when cached
	version="$(go list -m -f '{{.Version}}' "$1")"
	sed -n 's/.*"Hash":"\([0-9a-f]*\)".*/\1/p' \
		"$(go env GOMODCACHE)/cache/download/$1/@v/$version.info" 2>/dev/null || true
}

# Version information, as upstream's hack/lib/version.sh injects it, so that
# `--version`, `kubectl version` and the API server's /version report the
# release rather than v0.0.0-master. The commit and date come from the module
# proxy's record of the release tag, which keeps the build reproducible.
k8s_version="$(go list -m -f '{{.Version}}' k8s.io/kubernetes)"
build_date="$(go list -m -f '{{.Time.UTC.Format "2006-01-02T15:04:05Z"}}' k8s.io/kubernetes)"
git_commit="$(origin_commit k8s.io/kubernetes)"
etcd_commit="$(origin_commit go.etcd.io/etcd/server/v3)"
major_minor="${k8s_version#v}"
git_major="${major_minor%%.*}"
major_minor="${major_minor#*.}"
git_minor="${major_minor%%.*}"

ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	ldflags+=" -X $pkg.gitVersion=$k8s_version"
	ldflags+=" -X $pkg.gitMajor=$git_major"
	ldflags+=" -X $pkg.gitMinor=$git_minor"
	ldflags+=" -X $pkg.gitTreeState=clean"
	ldflags+=" -X $pkg.buildDate=$build_date"
	if [[ -n "$git_commit" ]]; then
		ldflags+=" -X $pkg.gitCommit=$git_commit"
	fi
done
# etcd's own build script sets its short commit the same way.
if [[ -n "$etcd_commit" ]]; then
	ldflags+=" -X go.etcd.io/etcd/api/v3/version.GitSHA=${etcd_commit:0:7}"
fi

echo "build.sh: building $name (Kubernetes $k8s_version) into $out ..."
rm -f "$stamp"
start=$SECONDS
# CGO_ENABLED=0: a static binary, as upstream builds its control plane.
# -buildvcs=false: the wrapper's own git state must not change the binary.
CGO_ENABLED=0 go build -trimpath -buildvcs=false -ldflags "$ldflags" -o "$bin" .
elapsed=$((SECONDS - start))
printf '%s\n' "$want_stamp" >"$stamp"
link_components
echo "build.sh: built $bin ($(du -h "$bin" | cut -f1)) in $((elapsed / 60))m$((elapsed % 60))s"
