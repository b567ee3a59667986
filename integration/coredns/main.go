// The cluster DNS server HPK runs as a pod (deploy/coredns.yaml): CoreDNS of the pinned
// release with the plugins a Kubernetes cluster's Corefile uses, and none that talk to a cloud
// provider, a tracing service or etcd. CoreDNS documents this way of choosing plugins at
// compile time: a main package that imports coremain and the plugins, and names their order.
// Leaving out route53, azure, clouddns, trace, etcd, nomad, geoip, view and dnssec (which reads
// keys from AWS Secrets Manager) keeps their SDKs out of the build: on the 2-core VM it took
// 149 s and 241 MB of modules instead of 305 s and 1.6 GB, on a fresh machine
// (docs/benchmarks.md). dnstap needs no import: the server itself registers it.
package main

import (
	_ "github.com/coredns/caddy/onevent"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"
	_ "github.com/coredns/coredns/plugin/acl"
	_ "github.com/coredns/coredns/plugin/any"
	_ "github.com/coredns/coredns/plugin/auto"
	_ "github.com/coredns/coredns/plugin/autopath"
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/bufsize"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/cancel"
	_ "github.com/coredns/coredns/plugin/chaos"
	_ "github.com/coredns/coredns/plugin/debug"
	_ "github.com/coredns/coredns/plugin/dns64"
	_ "github.com/coredns/coredns/plugin/erratic"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/file"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/grpc"
	_ "github.com/coredns/coredns/plugin/grpc_server"
	_ "github.com/coredns/coredns/plugin/header"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/hosts"
	_ "github.com/coredns/coredns/plugin/https"
	_ "github.com/coredns/coredns/plugin/https3"
	_ "github.com/coredns/coredns/plugin/k8s_external"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/local"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metadata"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/minimal"
	_ "github.com/coredns/coredns/plugin/multisocket"
	_ "github.com/coredns/coredns/plugin/nsid"
	_ "github.com/coredns/coredns/plugin/pprof"
	_ "github.com/coredns/coredns/plugin/proxyproto"
	_ "github.com/coredns/coredns/plugin/quic"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
	_ "github.com/coredns/coredns/plugin/rewrite"
	_ "github.com/coredns/coredns/plugin/root"
	_ "github.com/coredns/coredns/plugin/secondary"
	_ "github.com/coredns/coredns/plugin/shed"
	_ "github.com/coredns/coredns/plugin/sign"
	_ "github.com/coredns/coredns/plugin/template"
	_ "github.com/coredns/coredns/plugin/timeouts"
	_ "github.com/coredns/coredns/plugin/tls"
	_ "github.com/coredns/coredns/plugin/transfer"
	_ "github.com/coredns/coredns/plugin/tsig"
	_ "github.com/coredns/coredns/plugin/whoami"
)

// The release's plugin order (core/dnsserver/zdirectives.go of v1.14.7), without the plugins
// left out above: a Corefile naming one of those is refused with CoreDNS' own
// "unknown directive" error.
var directives = []string{
	"root", "metadata", "cancel", "proxyproto", "quic", "grpc_server", "https", "https3",
	"timeouts", "multisocket", "reload", "nsid", "bufsize", "bind", "debug", "ready",
	"health", "pprof", "shed", "prometheus", "errors", "log", "dnstap", "local", "dns64", "any",
	"chaos", "loadbalance", "tsig", "rewrite", "autopath", "acl", "cache", "header",
	"tls", "minimal", "template", "transfer", "hosts", "k8s_external", "kubernetes", "file",
	"auto", "secondary", "loop", "forward", "grpc", "erratic", "whoami", "on", "sign",
}

func init() {
	dnsserver.Directives = directives
}

func main() {
	coremain.Run()
}
