#!/usr/bin/env bash
# Builds upstream's e2e suite of the pinned Kubernetes release, and the tools
# to run it, from Go modules (see README.md):
#   e2e.test  the suite (`go test -c` of this wrapper module)
#   ginkgo    the ginkgo v2 CLI at the version the module graph selects, which
#             runs e2e.test's specs in parallel processes
#   agnhost   the binary of the suite's all-purpose test image, for the
#             stand-in images (images.sh)
#   imagetools  curl, nc, dig, getent and nnp for those images (imagetools/)
#   sample-apiserver  the release's k8s.io/sample-apiserver, for the Aggregator
#             spec's stand-in image
#
# Usage: integration/e2e/build.sh [OUTDIR]   (default: ~/.cache/hpk/e2e/bin)
#
# The build is cached like integration/controlplane/build.sh: a stamp records
# the Go toolchain, GOOS/GOARCH and the sha256 of every input (go.mod, go.sum,
# e2e_test.go, imagetools/*.go, this script). When the stamp matches and the binaries exist,
# nothing is rebuilt. All are static (CGO_ENABLED=0).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${1:-${HOME}/.cache/hpk/e2e/bin}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
cd "$here"

bins=(e2e.test ginkgo agnhost imagetools sample-apiserver)
stamp="$out/e2e.stamp"

# Everything that decides what the binaries contain.
want_stamp="$(
	go version
	go env GOOS GOARCH
	sha256sum go.mod go.sum e2e_test.go imagetools/*.go build.sh
)"

up_to_date() {
	local b
	[[ -f "$stamp" && "$(cat "$stamp")" == "$want_stamp" ]] || return 1
	for b in "${bins[@]}"; do
		[[ -x "$out/$b" ]] || return 1
	done
}

if up_to_date; then
	echo "build.sh: $out/{${bins[*]// /,}} up to date (stamp matches), nothing to do"
	exit 0
fi

# The release, as the suite and kubectl report it (upstream injects it the
# same way); without it the suite logs v0.0.0-master.
k8s_version="$(go list -m -f '{{.Version}}' k8s.io/kubernetes)"
minor="${k8s_version#v*.}"
minor="${minor%%.*}"
major="${k8s_version#v}"
major="${major%%.*}"
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=$major"
	ldflags+=" -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
done
# agnhost reports the image tag it stands in for (upstream: its VERSION file).
agnhost_version="$(cat "$(go list -m -f '{{.Dir}}' k8s.io/kubernetes)/test/images/agnhost/VERSION")"

echo "build.sh: building ${bins[*]} (Kubernetes $k8s_version) into $out ..."
rm -f "$stamp"
export CGO_ENABLED=0
start=$SECONDS
# -buildvcs=false: the wrapper's own git state must not change the binaries.
go test -c -trimpath -buildvcs=false -ldflags "$ldflags" -o "$out/e2e.test" .
go build -trimpath -buildvcs=false -ldflags "-s -w" -o "$out/ginkgo" github.com/onsi/ginkgo/v2/ginkgo
go build -trimpath -buildvcs=false -ldflags "-s -w -X main.Version=$agnhost_version" \
	-o "$out/agnhost" k8s.io/kubernetes/test/images/agnhost
go build -trimpath -buildvcs=false -ldflags "-s -w" -o "$out/imagetools" ./imagetools
# The version flags too: it reports the release as its own (upstream's image is built with them).
go build -trimpath -buildvcs=false -ldflags "$ldflags" -o "$out/sample-apiserver" k8s.io/sample-apiserver
elapsed=$((SECONDS - start))
printf '%s\n' "$want_stamp" >"$stamp"
echo "build.sh: built ${bins[*]} ($(du -ch "${bins[@]/#/$out/}" | tail -1 | cut -f1)) in $((elapsed / 60))m$((elapsed % 60))s"
