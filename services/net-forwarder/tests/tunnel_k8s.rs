//! The tunnel with its routes from the real Kubernetes API, end to end: the harness's control
//! plane, two node test hosts on its bridge, on each a bubble whose only way out is slirp4netns
//! (so the net-forwarder reaches the API server through it), and a net-forwarder started as the
//! bubble launcher will (`tunnel-socket` in the host's namespace) with the node's kubeconfig and
//! neither `--pod-cidr` nor `--peer` nor a key file: the pod CIDR, the endpoint, the public keys
//! (made in memory at each start) and the routes all come from the Node objects.

mod support;

use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use hpk_integration::controlplane::{ControlPlane, client_from_kubeconfig};
use hpk_integration::netns::Host;
use hpk_net_forwarder::cidr::PodCidr;
use hpk_net_forwarder::nodes::peer_reader_rbac;
use hpk_net_forwarder::peers::{ENDPOINT_ANNOTATION, PUBLIC_KEY_ANNOTATION};
use hpk_proto::netforwarder::v1 as pb;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, DeleteParams, PostParams};
use support::hosts::{Slirp, as_unprivileged, assert_unprivileged, bubble_in, give_away, slirp_available};
use support::{Bubble, Client, Server, address, attach, bubble, tcp_round_trip};

/// How long any one expected change may take to show.
const WAIT: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(100);
const BIN: &str = env!("CARGO_BIN_EXE_hpk-net-forwarder");

/// The control plane with node hosts `a` and `b`, or `None` (after printing why) when a
/// prerequisite is missing.
async fn control_plane() -> Option<ControlPlane> {
    drop(bubble()?);
    if !slirp_available() {
        return None;
    }
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "hpk_integration=info,hpk_net_forwarder=warn".into());
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_test_writer().try_init();
    hpk_integration::skip_unless_available(ControlPlane::start(&["a", "b"]).await)
}

/// Polls `probe` until it answers `Ok`, for at most [`WAIT`]; `Err` describes what it saw.
async fn wait_until<T, F, Fut>(what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + WAIT;
    loop {
        match probe().await {
            Ok(value) => return value,
            Err(seen) if Instant::now() >= deadline => {
                panic!("{what}: not within {WAIT:?}; last seen: {seen}")
            }
            Err(_) => tokio::time::sleep(POLL).await,
        }
    }
}

/// Registers Node `name` as that node (`system:node:<name>`), as its kubelet will.
async fn register(kubeconfig: &Path, name: &str) {
    let client = client_from_kubeconfig(kubeconfig).await.expect("node client");
    let node: Node = serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).expect("node");
    Api::<Node>::all(client).create(&PostParams::default(), &node).await.expect("a node may register itself");
}

/// The pod CIDR the controller-manager allocates to Node `name`.
async fn allocated_cidr(admin: &Api<Node>, name: &str) -> PodCidr {
    wait_until(&format!("Node {name} gets a spec.podCIDR"), || async move {
        let node = admin.get(name).await.map_err(|e| e.to_string())?;
        match node.spec.and_then(|s| s.pod_cidr) {
            Some(cidr) => Ok(cidr.parse().expect("the controller-manager's pod CIDR parses")),
            None => Err("no spec.podCIDR".to_owned()),
        }
    })
    .await
}

fn annotation(node: &Node, name: &str) -> Option<String> {
    node.metadata.annotations.as_ref()?.get(name).cloned()
}

/// The routes into the tunnel: (node, destination, endpoint), sorted by node.
async fn tunnel_routes(client: &mut Client) -> Vec<(String, String, String)> {
    let routes = client.routes(pb::RoutesRequest {}).await.expect("routes").into_inner().routes;
    let mut found: Vec<_> = routes
        .into_iter()
        .filter(|r| r.interface == "hpk-tunnel")
        .map(|r| (r.node, r.destination, r.endpoint))
        .collect();
    found.sort();
    found
}

async fn tunnel_stats(client: &mut Client) -> pb::TunnelStats {
    let stats = client.stats(pb::StatsRequest::default()).await.expect("stats").into_inner();
    stats.tunnel.expect("the server has a tunnel")
}

/// One node test host: its bubble with slirp4netns, and the net-forwarder in it.
struct NodeHost {
    host: Host,
    kubeconfig: PathBuf,
    port: u16,
    // Dropped in this order: the net-forwarder, slirp4netns, the bubble.
    server: Option<Server>,
    _slirp: Slirp,
    bubble: Bubble,
}

impl NodeHost {
    /// The bubble and its egress on host `name`; the Node must be registered before [`Self::serve`].
    fn new(cp: &ControlPlane, name: &str) -> Self {
        let host = cp.network().host(name).expect("a node host").clone();
        let bubble = bubble_in(&netns_path(&host));
        let slirp = Slirp::start_in(&netns_path(&host), &bubble);
        let kubeconfig = own_copy(&cp.node_kubeconfig(name).expect("node kubeconfig"), bubble.dir.path());
        let ip = host.ip;
        let port = support::in_netns(&netns_path(&host), move || {
            UdpSocket::bind((ip, 0)).expect("bind").local_addr().expect("addr").port()
        });
        Self { host, kubeconfig, port, server: None, _slirp: slirp, bubble }
    }

    fn endpoint(&self) -> String {
        format!("{}:{}", self.host.ip, self.port)
    }

    /// `tunnel-socket` binds the host's UDP socket, then `serve` runs in the bubble as the node,
    /// with neither `--pod-cidr` nor `--peer`.
    async fn serve(&mut self) -> Client {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net={}", netns_path(&self.host)))
            .arg("--")
            .args(as_unprivileged())
            .args([BIN, "tunnel-socket", "--bind", &self.endpoint(), "--", "nsenter"])
            .arg(format!("--target={}", self.bubble.pid()))
            .args(["--user", "--net", "--mount", "--preserve-credentials", "--", BIN, "serve", "--socket"])
            .arg(self.bubble.socket())
            .arg("--state-dir")
            .arg(self.bubble.dir.path().join("state"))
            .args(["--mtu", "1500"])
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(["--node-name", &self.host.name]);
        let server = Server::start(&mut cmd, &self.bubble.socket()).await;
        assert_unprivileged(server.pid());
        let client = server.client();
        self.server = Some(server);
        client
    }
}

/// The node's kubeconfig and the files it names (CA, certificate, key), copied into `dir` for
/// the unprivileged user the bubble runs as: the harness writes them root's, 0600.
fn own_copy(kubeconfig: &Path, dir: &Path) -> PathBuf {
    let creds = dir.join("node-credentials");
    std::fs::create_dir(&creds).expect("mkdir");
    let text = std::fs::read_to_string(kubeconfig).expect("read the kubeconfig");
    let mut out = String::new();
    for line in text.lines() {
        let field = ["certificate-authority: ", "client-certificate: ", "client-key: "]
            .into_iter()
            .find_map(|f| line.trim_start().strip_prefix(f).map(|path| (f, path)));
        match field {
            Some((f, path)) => {
                let copy = creds.join(Path::new(path).file_name().expect("a file name"));
                std::fs::copy(path, &copy).expect("copy a credential");
                give_away(&copy);
                let indent = &line[..line.len() - line.trim_start().len()];
                out.push_str(&format!("{indent}{f}{}\n", copy.display()));
            }
            None => out.push_str(&format!("{line}\n")),
        }
    }
    let copy = creds.join("kubeconfig");
    std::fs::write(&copy, out).expect("write the kubeconfig");
    give_away(&copy);
    give_away(&creds);
    copy
}

/// PIDs of the processes in the network namespace named `netns`, one a line.
fn processes_in(netns: &str) -> String {
    let out = Command::new("ip").args(["netns", "pids", netns]).output().expect("ip netns pids");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn netns_path(host: &Host) -> String {
    format!("/run/netns/{}", host.netns)
}

#[tokio::test(flavor = "multi_thread")]
async fn nodes_from_the_api_are_routed_through_the_tunnel() {
    let Some(cp) = control_plane().await else { return };
    let admin_client = cp.admin_client().await.expect("admin client");
    let admin: Api<Node> = Api::all(admin_client.clone());
    let (role, binding) = peer_reader_rbac();
    let params = PostParams::default();
    Api::<ClusterRole>::all(admin_client.clone()).create(&params, &role).await.expect("ClusterRole");
    Api::<ClusterRoleBinding>::all(admin_client).create(&params, &binding).await.expect("binding");

    let (mut a, mut b) = (NodeHost::new(&cp, "a"), NodeHost::new(&cp, "b"));
    register(&a.kubeconfig, "a").await;
    register(&b.kubeconfig, "b").await;
    let cidr_a = allocated_cidr(&admin, "a").await;
    let cidr_b = allocated_cidr(&admin, "b").await;
    // The bubbles' one way to the API server is slirp4netns.
    for node in [&a, &b] {
        let out = Command::new("nsenter")
            .arg(format!("--net={}", node.bubble.netns_path().display()))
            .args(["--", "ip", "-4", "route", "get", &cp.host().ip.to_string()])
            .output()
            .expect("ip route get");
        let route = String::from_utf8_lossy(&out.stdout);
        assert!(route.contains("via 10.0.2.2 dev tap0"), "bubble {}: {route}", node.host.name);
    }
    let mut client_a = a.serve().await;
    let mut client_b = b.serve().await;

    // Each takes its Node's pod CIDR, and its pods get addresses in it.
    for (client, cidr) in [(&mut client_a, cidr_a), (&mut client_b, cidr_b)] {
        let listed = client.list(pb::ListRequest {}).await.expect("list").into_inner();
        assert_eq!(listed.pod_cidr, cidr.to_string(), "the net-forwarder's pod CIDR is its Node's");
    }
    let (pod_a, pod_b) = (a.bubble.pod(), b.bubble.pod());
    let ip_a = address(&attach(&mut client_a, "pod-a", &pod_a).await);
    let ip_b = address(&attach(&mut client_b, "pod-b", &pod_b).await);
    assert!(cidr_a.contains(ip_a) && cidr_b.contains(ip_b), "{ip_a} in {cidr_a}, {ip_b} in {cidr_b}");

    // Each Node carries its host's address and the bound port, and the public key its
    // net-forwarder made at start; the tunnel says the same.
    for (node, client) in [(&a, &mut client_a), (&b, &mut client_b)] {
        let published = admin.get(&node.host.name).await.expect("get node");
        let name = &node.host.name;
        assert_eq!(
            annotation(&published, ENDPOINT_ANNOTATION),
            Some(node.endpoint()),
            "Node {name}'s endpoint"
        );
        let stats = tunnel_stats(client).await;
        assert_eq!(stats.endpoint, node.endpoint());
        assert_eq!(stats.public_key.len(), 64, "{stats:?}");
        assert_eq!(
            annotation(&published, PUBLIC_KEY_ANNOTATION),
            Some(stats.public_key),
            "Node {name}'s key"
        );
    }

    // Each bubble routes the other node's pod CIDR into the tunnel.
    let want_a = vec![("b".to_owned(), cidr_b.to_string(), b.endpoint())];
    let want_b = vec![("a".to_owned(), cidr_a.to_string(), a.endpoint())];
    for (client, want, name) in [(&client_a, &want_a, "a"), (&client_b, &want_b, "b")] {
        wait_until(&format!("node {name} routes the other node"), || {
            let mut client = client.clone();
            async move {
                let routes = tunnel_routes(&mut client).await;
                if routes == *want { Ok(()) } else { Err(format!("{routes:?}, want {want:?}")) }
            }
        })
        .await;
    }
    let kernel = a.bubble.routes();
    assert!(kernel.iter().any(|r| r.starts_with(&format!("{cidr_b} dev hpk-tunnel"))), "{kernel:?}");

    // Pod ↔ pod across the hosts, both ways.
    assert!(pod_a.ping(ip_b), "pod A cannot ping pod B");
    assert!(pod_b.ping(ip_a), "pod B cannot ping pod A");
    assert_eq!(tcp_round_trip(&pod_b.netns_path(), ip_b, &pod_a.netns_path()), "HELLO POD");
    assert_eq!(tcp_round_trip(&pod_a.netns_path(), ip_a, &pod_b.netns_path()), "HELLO POD");
    let stats = tunnel_stats(&mut client_a).await;
    let peer = stats.peers.iter().find(|p| p.node == "b").expect("peer b in the tunnel's stats");
    assert!(peer.tx_packets > 0 && peer.rx_packets > 0, "pod traffic did not cross the tunnel: {peer:?}");
    assert_eq!(stats.rx_dropped_auth + stats.rx_dropped_replay + stats.rx_dropped_malformed, 0, "{stats:?}");

    // A third Node with a malformed annotation: refused and counted on both, routed nowhere.
    for client in [&mut client_a, &mut client_b] {
        assert_eq!(tunnel_stats(client).await.peers_refused, 0);
    }
    let key_c = hpk_net_forwarder::tunnel::identity::Identity::from_secret([0xc; 32]).public().to_string();
    let bad: Node = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "c", "annotations": {
            ENDPOINT_ANNOTATION: "not-an-endpoint",
            PUBLIC_KEY_ANNOTATION: key_c,
        }}
    }))
    .expect("node");
    admin.create(&params, &bad).await.expect("create Node c");
    let cidr_c = allocated_cidr(&admin, "c").await;
    for (client, name) in [(&client_a, "a"), (&client_b, "b")] {
        wait_until(&format!("node {name} refuses Node c"), || {
            let mut client = client.clone();
            async move {
                let refused = tunnel_stats(&mut client).await.peers_refused;
                if refused == 1 { Ok(()) } else { Err(format!("peers_refused {refused}")) }
            }
        })
        .await;
    }
    assert_eq!(tunnel_routes(&mut client_a).await, want_a);
    assert_eq!(tunnel_routes(&mut client_b).await, want_b);
    for node in [&a, &b] {
        let kernel = node.bubble.routes();
        assert!(!kernel.iter().any(|r| r.starts_with(&cidr_c.to_string())), "{kernel:?}");
    }
    assert!(pod_a.ping(ip_b), "pod A cannot ping pod B after Node c");
    assert_eq!(tcp_round_trip(&pod_a.netns_path(), ip_a, &pod_b.netns_path()), "HELLO POD");

    // Node b deleted: a no longer routes it, in its table or the kernel.
    admin.delete("b", &DeleteParams::default()).await.expect("delete Node b");
    wait_until("node a drops the route to deleted Node b", || {
        let mut client = client_a.clone();
        async move {
            let routes = tunnel_routes(&mut client).await;
            if routes.is_empty() { Ok(()) } else { Err(format!("{routes:?}")) }
        }
    })
    .await;
    let kernel = a.bubble.routes();
    assert!(!kernel.iter().any(|r| r.starts_with(&cidr_b.to_string())), "{kernel:?}");
    assert!(tunnel_stats(&mut client_a).await.peers.is_empty(), "the tunnel still has peer b");

    // Clean-up: the net-forwarders exit cleanly on SIGTERM; once the pods, slirp4netns and the
    // bubbles are gone, nothing of ours is left on the node hosts. The harness removes the rest.
    drop((client_a, client_b, pod_a, pod_b));
    for node in [&mut a, &mut b] {
        node.server.take().expect("serving").stop();
    }
    let netns = [a.host.netns.clone(), b.host.netns.clone()];
    drop((a, b));
    for netns in netns {
        assert_eq!(processes_in(&netns), "", "processes left in {netns}");
    }
}
