// Package e2e builds upstream's Kubernetes end-to-end suite (the package
// k8s.io/kubernetes/test/e2e of the pinned release) into one test binary,
// e2e.test, which scripts/conformance.sh runs against an `hpk up` cluster.
//
// Upstream's own test/e2e/e2e_test.go is the main of that binary but lives in
// an _test.go file, which another module cannot import; this file plays its
// part: it links in the spec packages (their init functions register the
// specs with ginkgo), registers the suite's flags and hands over to
// e2e.RunE2ETests. Which packages to link decides which specs exist, so the
// list below is the one the release's e2e_test.go links, no more and no less.
package e2e

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"k8s.io/component-base/version"
	conformancetestdata "k8s.io/kubernetes/test/conformance/testdata"
	"k8s.io/kubernetes/test/e2e"
	"k8s.io/kubernetes/test/e2e/framework"
	"k8s.io/kubernetes/test/e2e/framework/config"
	"k8s.io/kubernetes/test/e2e/framework/testfiles"
	e2etestingmanifests "k8s.io/kubernetes/test/e2e/testing-manifests"
	testfixtures "k8s.io/kubernetes/test/fixtures"

	// Freezes the feature constants before any spec uses one.
	_ "k8s.io/kubernetes/test/e2e/feature"

	// The spec packages.
	_ "k8s.io/kubernetes/test/e2e/apimachinery"
	_ "k8s.io/kubernetes/test/e2e/apps"
	_ "k8s.io/kubernetes/test/e2e/architecture"
	_ "k8s.io/kubernetes/test/e2e/auth"
	_ "k8s.io/kubernetes/test/e2e/autoscaling"
	_ "k8s.io/kubernetes/test/e2e/cloud"
	_ "k8s.io/kubernetes/test/e2e/common"
	_ "k8s.io/kubernetes/test/e2e/dra"
	_ "k8s.io/kubernetes/test/e2e/instrumentation"
	_ "k8s.io/kubernetes/test/e2e/invariants"
	_ "k8s.io/kubernetes/test/e2e/kubectl"
	_ "k8s.io/kubernetes/test/e2e/lifecycle"
	_ "k8s.io/kubernetes/test/e2e/lifecycle/bootstrap"
	_ "k8s.io/kubernetes/test/e2e/network"
	_ "k8s.io/kubernetes/test/e2e/node"
	_ "k8s.io/kubernetes/test/e2e/scheduling"
	_ "k8s.io/kubernetes/test/e2e/storage"
	_ "k8s.io/kubernetes/test/e2e/storage/csimock"
	_ "k8s.io/kubernetes/test/e2e/storage/external"
	_ "k8s.io/kubernetes/test/e2e/windows"

	// Framework extensions: failure dumps, metrics gathering, node checks,
	// object formatting in failure messages.
	_ "k8s.io/kubernetes/test/e2e/framework/debug/init"
	_ "k8s.io/kubernetes/test/e2e/framework/metrics/init"
	_ "k8s.io/kubernetes/test/e2e/framework/node/init"
	_ "k8s.io/kubernetes/test/utils/format"
)

func TestMain(m *testing.M) {
	showVersion := flag.Bool("version", false, "Print the Kubernetes release the suite comes from and exit.")
	config.CopyFlags(config.Flags, flag.CommandLine)
	framework.RegisterCommonFlags(flag.CommandLine)
	framework.RegisterClusterFlags(flag.CommandLine)
	flag.Parse()

	if *showVersion {
		fmt.Println(version.Get())
		os.Exit(0)
	}
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "e2e.test: unexpected arguments: %q\n", flag.Args())
		os.Exit(2)
	}

	// Manifests and fixtures the specs read are embedded in the binary, so
	// that it runs from any directory without a Kubernetes checkout.
	testfiles.AddFileSource(e2etestingmanifests.GetE2ETestingManifestsFS())
	testfiles.AddFileSource(testfixtures.GetTestFixturesFS())
	testfiles.AddFileSource(conformancetestdata.GetConformanceTestdataFS())

	framework.AfterReadingAllFlags(&framework.TestContext)
	if root := framework.TestContext.RepoRoot; root != "" {
		testfiles.AddFileSource(testfiles.RootFileSource{Root: root})
	}
	os.Exit(m.Run())
}

func TestE2E(t *testing.T) {
	e2e.RunE2ETests(t)
}
