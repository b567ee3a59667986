// Command hpk-controlplane is a multi-call binary holding the upstream
// Kubernetes control plane (kube-apiserver, kube-controller-manager,
// kube-scheduler, kube-proxy, kubectl) and etcd, all from one pinned release.
//
// One binary keeps the build to a single link of the shared dependency graph
// and guarantees that every component (and kubectl) comes from the same
// release. Each invocation still runs exactly one component, in its own
// process: upstream code keeps process-wide state (signal handlers, logging
// configuration, metric registries) that must not be set up twice.
//
// The component is chosen, like busybox or the old hyperkube, by the name the
// binary was started as (a symlink such as bin/kube-apiserver), or else by the
// first argument: `hpk-controlplane kube-apiserver --flags...`.
package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	_ "time/tzdata" // CronJob time zones, as upstream kube-apiserver/kube-controller-manager

	"go.etcd.io/etcd/server/v3/etcdmain"

	_ "k8s.io/client-go/plugin/pkg/client/auth" // kubectl's client auth plugins (exec, oidc)
	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	_ "k8s.io/component-base/logs/json/register"          // --logging-format=json
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go metrics
	_ "k8s.io/component-base/metrics/prometheus/version"  // kubernetes_build_info metric
	kubectlcmd "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	proxy "k8s.io/kubernetes/cmd/kube-proxy/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

// components maps a component name to a function that runs it with os.Args
// (whose first element is the component name) and returns the exit code.
// Each body mirrors the upstream cmd/<name>/main.go of the pinned release.
var components = map[string]func() int{
	"kube-apiserver": func() int { return cli.Run(apiserver.NewAPIServerCommand()) },
	"kube-controller-manager": func() int {
		return cli.Run(controllermanager.NewControllerManagerCommand())
	},
	"kube-scheduler": func() int { return cli.Run(scheduler.NewSchedulerCommand()) },
	"kube-proxy":     func() int { return cli.Run(proxy.NewProxyCommand()) },
	"kubectl": func() int {
		// As upstream: apply -v before flag parsing so that klog works while
		// the command tree (plugins, .kuberc) is being built.
		logs.GlogSetter(kubectlcmd.GetLogVerbosity(os.Args)) //nolint:errcheck
		if err := cli.RunNoErrOutput(kubectlcmd.NewDefaultKubectlCommand()); err != nil {
			kubectlutil.CheckErr(err) // prints the error and exits non-zero
		}
		return 0
	},
	"etcd": func() int {
		// etcdmain.Main exits by itself on errors; returning means success
		// (e.g. --version).
		etcdmain.Main(os.Args)
		return 0
	},
}

func main() {
	run, ok := components[filepath.Base(os.Args[0])]
	if !ok && len(os.Args) > 1 {
		if run, ok = components[os.Args[1]]; ok {
			// Drop our own name so that the component sees the same os.Args
			// as its upstream binary: cobra, kubectl plugins and etcd all
			// read os.Args directly, and usage messages show the right name.
			os.Args = os.Args[1:]
		}
	}
	if !ok {
		if len(os.Args) == 2 && (os.Args[1] == "-h" || os.Args[1] == "--help" || os.Args[1] == "help") {
			usage(os.Stdout)
			os.Exit(0)
		}
		if len(os.Args) > 1 {
			fmt.Fprintf(os.Stderr, "hpk-controlplane: unknown component %q\n\n", os.Args[1])
		}
		usage(os.Stderr)
		os.Exit(2)
	}
	os.Exit(run())
}

func usage(w io.Writer) {
	names := make([]string, 0, len(components))
	for name := range components {
		names = append(names, name)
	}
	sort.Strings(names)
	fmt.Fprintf(w, "Usage: hpk-controlplane COMPONENT [FLAGS...]\n"+
		"   or: COMPONENT [FLAGS...]   (via a symlink named after the component)\n\nComponents:\n")
	for _, name := range names {
		fmt.Fprintf(w, "  %s\n", name)
	}
}
