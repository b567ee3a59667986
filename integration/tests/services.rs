//! ClusterIP Services and cluster DNS on a two-node HPK cluster: upstream kube-proxy (nftables
//! mode) on each node, CoreDNS from `deploy/coredns.yaml` as a pod on the HPK nodes, and pods
//! reaching a Service by name whose endpoints are pods on both nodes, the `kubernetes` Service,
//! and a Service without endpoints (refused, not hung).
//!
//! Needs the workspace's binaries (`cargo build --workspace --bins`), the control plane and
//! coredns (`scripts/setup.sh`), nft, crun, crictl, docker-registry, busybox-static.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use hpk_integration::clusterdns;
use hpk_integration::controlplane::ControlPlane;
use hpk_integration::hpknode::{HpkNode, NodeOptions, PEER_READER_RBAC};
use hpk_integration::registry::{Client, Registry};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;

const NODES: [&str; 2] = ["node1", "node2"];

/// Where `cargo build --workspace --bins` put the HPK binaries: beside this test's `deps/`.
fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("own path");
    exe.parent().and_then(|deps| deps.parent()).expect("target dir").to_owned()
}

/// The cluster: control plane, registry with the test images, two HPK nodes with kube-proxy
/// and the tunnel between them, routes from the control-plane host to the pod CIDRs.
struct Cluster {
    // Field order is drop order: the nodes before the registry and the control plane.
    nodes: Vec<HpkNode>,
    registry: Registry,
    shell: String,
    httpd: String,
    cp: ControlPlane,
}

impl Cluster {
    async fn start() -> Option<Self> {
        if !hpk_integration::tools_present(&[
            "crun",
            "docker-registry",
            "ip",
            "nsenter",
            "crictl",
            "curl",
            "nft",
        ]) {
            return None;
        }
        hpk_integration::skip_unless_available(clusterdns::coredns_binary())?;
        let cp = hpk_integration::skip_unless_available(ControlPlane::start(&NODES).await)?;
        let registry = Registry::start(IpAddr::V4(cp.network().gateway()), None).await.expect("registry");
        let client = Client::new(&registry.url()).expect("registry client");
        let shell_image = hpk_integration::image::shell_image().expect("shell image");
        client.push("hpk/shell", "v1", &shell_image).await.expect("push shell");
        client
            .push("hpk/httpd", "v1", &hpk_integration::image::httpd_image().expect("image"))
            .await
            .expect("push");
        let shell = format!("{}/hpk/shell:v1", registry.host_port());
        let httpd = format!("{}/hpk/httpd:v1", registry.host_port());

        cp.apply(PEER_READER_RBAC).expect("node RBAC");
        let options = NodeOptions {
            bin_dir: bin_dir(),
            insecure_registry: Some(registry.host_port()),
            tunnel: true,
            kubelet_args: vec![
                format!("--cluster-dns={}", clusterdns::CLUSTER_DNS_IP),
                format!("--cluster-domain={}", clusterdns::CLUSTER_DOMAIN),
                // This machine's disk may be fuller than the default 10 % threshold allows.
                "--disk-pressure-percent=1".into(),
            ],
            kube_proxy: true,
        };
        let mut nodes = Vec::new();
        for name in NODES {
            let dir = cp.dir().join("hpk").join(name);
            nodes.push(hpk_integration::skip_unless_available(HpkNode::start(&cp, name, &dir, &options))?);
        }
        let cluster = Self { nodes, registry, shell, httpd, cp };
        Some(cluster)
    }

    /// Waits until both Nodes are Ready with a podCIDR, kube-proxy synced on both, and routes
    /// the pod CIDRs from the control-plane host.
    async fn wait_nodes(&mut self) {
        let nodes: Api<Node> = Api::all(self.cp.admin_client().await.expect("admin"));
        let started = Instant::now();
        for name in NODES {
            loop {
                let node = nodes.get_opt(name).await.ok().flatten();
                let ready = node
                    .as_ref()
                    .and_then(|n| n.status.as_ref()?.conditions.as_ref())
                    .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
                let cidr = node.as_ref().and_then(|n| n.spec.as_ref()?.pod_cidr.as_ref()).is_some();
                if ready && cidr {
                    break;
                }
                assert!(started.elapsed() < Duration::from_secs(90), "{name} not Ready\n{}", self.logs());
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        for node in &mut self.nodes {
            node.wait_kube_proxy(Duration::from_secs(60)).expect("kube-proxy synced");
        }
        let routes = self.cp.route_pod_cidrs().await.expect("routes");
        assert_eq!(routes.len(), NODES.len(), "{routes:?}");
        eprintln!(
            "nodes Ready, kube-proxy synced in {:?}; control-plane routes {routes:?}",
            started.elapsed()
        );
    }

    fn kubectl(&self, args: &[&str]) -> std::process::Output {
        hpk_test_support::output_within(self.cp.kubectl().args(args), std::time::Duration::from_secs(180))
    }

    /// `sh -c script` in pod `pod`: (success, stdout + stderr).
    fn exec(&self, pod: &str, script: &str) -> (bool, String) {
        let out = self.kubectl(&["exec", pod, "--", "sh", "-c", script]);
        let text =
            format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        (out.status.success(), text)
    }

    fn logs(&self) -> String {
        let get = self.kubectl(&["get", "pods,svc,endpointslices", "-A", "-o", "wide"]);
        let mut text = format!("--- kubectl get:\n{}", String::from_utf8_lossy(&get.stdout));
        let coredns = self.kubectl(&["logs", "-n", "kube-system", "-l", "k8s-app=kube-dns", "--tail=20"]);
        text.push_str(&format!("--- coredns:\n{}", String::from_utf8_lossy(&coredns.stdout)));
        for node in &self.nodes {
            text.push_str(&node.logs());
        }
        text
    }
}

fn workloads(httpd: &str, shell: &str) -> String {
    // Each httpd replica serves its pod and node name, so the client sees which one answered.
    use hpk_integration::manifest::{httpd_who_answers, service, spread_deployment};
    let mut text = [
        spread_deployment("web", 4, "DoNotSchedule", None, &httpd_who_answers(httpd)),
        service("web", "web", 8080),
        service("nobody-home", "no-such-pods", 8080),
    ]
    .join("---\n");
    for node in NODES {
        text.push_str(&format!(
            "---\napiVersion: v1\nkind: Pod\nmetadata: {{name: client-{node}}}\nspec:\n  nodeName: {node}\n  \
             terminationGracePeriodSeconds: 1\n  containers:\n  - {{name: sh, image: {shell}, command: [sleep, '3600']}}\n"
        ));
    }
    text
}

/// Whether every pod of `names` is Running and Ready.
async fn all_ready(pods: &Api<Pod>, names: &[String]) -> bool {
    for name in names {
        let Ok(Some(pod)) = pods.get_opt(name).await else { return false };
        let ready = pod
            .status
            .and_then(|s| s.conditions)
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        if !ready {
            return false;
        }
    }
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_reach_services_by_name_on_both_nodes() {
    let started = Instant::now();
    let Some(mut c) = Cluster::start().await else { return };
    c.wait_nodes().await;
    let t_nodes = started.elapsed();

    let image = clusterdns::deploy(&c.cp, &c.registry).await.expect("deploy CoreDNS");
    if let Err(e) = clusterdns::wait_ready(&c.cp, Duration::from_secs(120)).await {
        panic!("{e}\n{}", c.logs());
    }
    let t_dns = started.elapsed();
    eprintln!("CoreDNS ({image}) ready after {:?}", t_dns - t_nodes);

    c.cp.apply(&workloads(&c.httpd, &c.shell)).expect("apply workloads");
    let admin = c.cp.admin_client().await.expect("admin");
    let pods: Api<Pod> = Api::namespaced(admin, "default");
    let clients: Vec<String> = NODES.iter().map(|n| format!("client-{n}")).collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let web = pods.list(&kube::api::ListParams::default().labels("app=web")).await.expect("list");
        let names: Vec<String> = web.items.iter().filter_map(|p| p.metadata.name.clone()).collect();
        if names.len() == 4 && all_ready(&pods, &names).await && all_ready(&pods, &clients).await {
            break;
        }
        assert!(Instant::now() < deadline, "workloads not ready\n{}", c.logs());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let t_pods = started.elapsed();

    for client in &clients {
        // The kubelet gave the pod the cluster's resolver and search path.
        let (ok, resolv) = c.exec(client, "cat /etc/resolv.conf");
        assert!(ok, "{resolv}");
        assert!(resolv.contains(&format!("nameserver {}", clusterdns::CLUSTER_DNS_IP)), "{resolv}");
        assert!(
            resolv.contains("search default.svc.cluster.local svc.cluster.local cluster.local"),
            "{resolv}"
        );

        // By name, through the Service: answers from pods on both nodes, within a bound.
        let mut seen = std::collections::BTreeMap::<String, usize>::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        while seen.len() < NODES.len() {
            let (ok, out) = c.exec(
                client,
                r"for i in 1 2 3 4 5 6 7 8; do printf 'GET / HTTP/1.0\r\n\r\n' | timeout 5 nc -w 3 web.default.svc.cluster.local 80; done",
            );
            for line in out.lines().filter(|l| l.starts_with("pod=")) {
                let node = line.split("node=").nth(1).unwrap_or_default().trim().to_owned();
                *seen.entry(node).or_default() += 1;
            }
            assert!(
                Instant::now() < deadline,
                "{client}: answers only from {seen:?} (ok={ok}): {out}\n{}",
                c.logs()
            );
        }
        eprintln!("{client}: web answered from {seen:?}");
        assert!(NODES.iter().all(|n| seen.contains_key(*n)), "{seen:?}");

        // The short name resolves through the search path.
        let (ok, out) = c.exec(client, r"printf 'GET / HTTP/1.0\r\n\r\n' | timeout 5 nc -w 3 web 80");
        assert!(ok && out.contains("pod="), "{client}: short name: {out}");

        // The kubernetes Service: its name resolves to the first Service address and TCP 443
        // connects (DNAT to the API server on the control-plane host, routed back).
        let (ok, out) = c.exec(client, "nslookup kubernetes.default.svc.cluster.local");
        assert!(ok && out.contains(clusterdns::KUBERNETES_SERVICE_IP), "{client}: nslookup: {out}");
        let (ok, out) = c.exec(
            client,
            "timeout 5 nc -w 3 kubernetes.default.svc.cluster.local 443 -e true && echo connected",
        );
        assert!(ok && out.contains("connected"), "{client}: kubernetes:443: {out}");

        // Names outside the cluster domain fail (SERVFAIL, no forwarder): an answer, at once.
        let before = Instant::now();
        let (ok, out) = c.exec(client, "timeout 10 nslookup example.com; echo rc=$?");
        assert!(ok && out.contains("rc=1") && before.elapsed() < Duration::from_secs(5), "{client}: {out}");
        eprintln!("{client}: example.com in {:?}: {}", before.elapsed(), out.trim().replace('\n', " / "));

        // No endpoints: fails at once (the node has no route for the address once kube-proxy
        // does not DNAT it; with one, kube-proxy rejects), not a hang until the timeout.
        let before = Instant::now();
        let (ok, out) = c
            .exec(client, r"printf 'GET / HTTP/1.0\r\n\r\n' | timeout 10 nc -w 8 nobody-home 80; echo rc=$?");
        let took = before.elapsed();
        assert!(ok && !out.contains("HTTP/") && !out.contains("rc=0"), "{client}: nobody-home: {out}");
        assert!(took < Duration::from_secs(5), "{client}: nobody-home took {took:?}: {out}");
        eprintln!("{client}: nobody-home failed in {took:?}: {}", out.trim());
    }
    eprintln!(
        "timings: nodes + kube-proxy {t_nodes:?}, CoreDNS {:?}, workloads {:?}, checks {:?}",
        t_dns - t_nodes,
        t_pods - t_dns,
        started.elapsed() - t_pods
    );
}
