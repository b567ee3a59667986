//! `nodes` against the real control plane: each node acts as itself (`system:node:<name>`)
//! under the Node authorizer and NodeRestriction, the controller-manager allocates pod CIDRs.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hpk_integration::controlplane::{CLUSTER_CIDR, ControlPlane, client_from_kubeconfig};
use hpk_net_forwarder::Error;
use hpk_net_forwarder::cidr::PodCidr;
use hpk_net_forwarder::nodes::{NodeSync, peer_reader_rbac};
use hpk_net_forwarder::peers::{ENDPOINT_ANNOTATION, PUBLIC_KEY_ANNOTATION, Peer};
use hpk_net_forwarder::tunnel::identity::{Identity, PublicKey};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// How long any one expected change may take to show.
const WAIT: Duration = Duration::from_secs(60);

async fn start(nodes: &[&str]) -> Option<ControlPlane> {
    // The module's warnings (skipped peers, failed watches) in the output of a failing test.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "hpk_net_forwarder=warn,kube_runtime=warn".into());
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_test_writer().try_init();
    hpk_integration::skip_unless_available(ControlPlane::start(nodes).await)
}

/// Registers Node `name` as that node and returns its view of the cluster.
async fn register(cp: &ControlPlane, name: &str) -> NodeSync {
    let kubeconfig = cp.node_kubeconfig(name).expect("node kubeconfig");
    let client = client_from_kubeconfig(&kubeconfig).await.expect("node client");
    let node: Node = serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).expect("node");
    Api::<Node>::all(client).create(&PostParams::default(), &node).await.expect("a node may register itself");
    NodeSync::connect(&kubeconfig, name).await.expect("connect")
}

/// Node `name`'s public key in these tests.
fn key_of(name: &str) -> PublicKey {
    Identity::from_secret([name.as_bytes()[0]; 32]).public()
}

/// Sets an annotation of Node `name` as that node, unchecked.
async fn annotate(cp: &ControlPlane, name: &str, annotation: &str, value: &str) {
    let kubeconfig = cp.node_kubeconfig(name).expect("node kubeconfig");
    let client = client_from_kubeconfig(&kubeconfig).await.expect("node client");
    let patch = Patch::Merge(serde_json::json!({"metadata": {"annotations": {annotation: value}}}));
    Api::<Node>::all(client).patch(name, &PatchParams::default(), &patch).await.expect("annotate");
}

/// Waits (bounded) until the peer list is exactly `want`.
async fn wait_peers(rx: &mut watch::Receiver<Vec<Peer>>, what: &str, want: &[&Peer]) {
    let want: Vec<Peer> = want.iter().map(|p| (*p).clone()).collect();
    let found = tokio::time::timeout(WAIT, rx.wait_for(|peers| *peers == want))
        .await
        .map(|peers| peers.map(|_| ()).expect("the watch task holds the sender"));
    found.unwrap_or_else(|_| panic!("{what}: peers still {:?} after {WAIT:?}, want {want:?}", *rx.borrow()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_cidr_waits_for_registration_and_allocation_and_the_endpoint_is_published() {
    let Some(cp) = start(&["a"]).await else { return };
    let admin: Api<Node> = Api::all(cp.admin_client().await.expect("admin client"));

    // A node that never registers: a bounded wait and an error that says what is missing.
    let ghost = cp.node_kubeconfig("ghost").expect("kubeconfig");
    let ghost = NodeSync::connect(&ghost, "ghost").await.expect("connect");
    let started = Instant::now();
    let e = ghost.pod_cidr(Duration::from_secs(3)).await.expect_err("no Node ghost");
    assert!(e.to_string().starts_with("Node ghost not found"), "{e}");
    assert!(matches!(e, Error::Unavailable(_)) && e.exit_code() == 69, "{e:?}");
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());

    // The wait starts before the Node exists and ends once the controller-manager allocates.
    let kubeconfig = cp.node_kubeconfig("a").expect("node kubeconfig");
    let waiting = NodeSync::connect(&kubeconfig, "a").await.expect("connect");
    let wait = tokio::spawn(async move { waiting.pod_cidr(WAIT).await });
    let a = register(&cp, "a").await;
    let cidr = wait.await.expect("join").expect("pod CIDR of a");
    let cluster: PodCidr = CLUSTER_CIDR.parse().expect("cluster CIDR");
    assert!(cluster.contains(cidr.network()) && cidr.prefix() == 24, "{cidr}");
    let spec = admin.get("a").await.expect("get a").spec.and_then(|s| s.pod_cidr);
    assert_eq!(spec.as_deref(), Some(cidr.to_string().as_str()));
    assert_eq!(a.pod_cidr(Duration::from_secs(10)).await.expect("again"), cidr, "same answer once set");

    // Publishing as the node itself is allowed and visible to others: endpoint and key together.
    let key = key_of("a");
    a.publish_tunnel("10.250.0.2:4789".parse().expect("addr"), &key, WAIT).await.expect("publish");
    let annotations = admin.get("a").await.expect("get a").metadata.annotations.unwrap_or_default();
    assert_eq!(annotations.get(ENDPOINT_ANNOTATION).map(String::as_str), Some("10.250.0.2:4789"));
    assert_eq!(annotations.get(PUBLIC_KEY_ANNOTATION), Some(&key.to_string()));

    // Another node's object is refused (403) at once, not retried until the deadline.
    let a_client = client_from_kubeconfig(&kubeconfig).await.expect("client");
    register(&cp, "b").await;
    let impostor = NodeSync::new(a_client, "b");
    let started = Instant::now();
    let e =
        impostor.publish_tunnel("10.250.0.2:4789".parse().expect("addr"), &key, WAIT).await.expect_err("403");
    assert!(e.to_string().contains("403"), "{e}");
    assert_eq!(tonic::Status::from(e).code(), tonic::Code::PermissionDenied);
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());

    // An endpoint no peer would accept is refused before it reaches the API server.
    let e =
        a.publish_tunnel("0.0.0.0:4789".parse().expect("addr"), &key, WAIT).await.expect_err("unspecified");
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_peers_follows_nodes_and_skips_malformed_annotations() {
    let Some(cp) = start(&["a"]).await else { return };
    let admin: Api<Node> = Api::all(cp.admin_client().await.expect("admin client"));
    let a = register(&cp, "a").await;
    let b = register(&cp, "b").await;
    let c = register(&cp, "c").await;
    let a_cidr = a.pod_cidr(WAIT).await.expect("a's pod CIDR");
    let b_cidr = b.pod_cidr(WAIT).await.expect("b's pod CIDR");
    let c_cidr = c.pod_cidr(WAIT).await.expect("c's pod CIDR");

    // A node may read only its own Node object until the cluster grants more.
    let a_client =
        client_from_kubeconfig(&cp.node_kubeconfig("a").expect("kubeconfig")).await.expect("client");
    match Api::<Node>::all(a_client).list(&ListParams::default()).await {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 403, "{status:?}"),
        other => panic!("node a must not list all Nodes without the grant: {other:?}"),
    }
    let admin_client = cp.admin_client().await.expect("admin client");
    let (role, binding) = peer_reader_rbac();
    let params = PostParams::default();
    Api::<ClusterRole>::all(admin_client.clone()).create(&params, &role).await.expect("ClusterRole");
    Api::<ClusterRoleBinding>::all(admin_client).create(&params, &binding).await.expect("binding");

    let (tx, mut rx) = watch::channel(Vec::new());
    let bad = Arc::new(AtomicU64::new(0));
    let shutdown = CancellationToken::new();
    let watching = tokio::spawn({
        let (tx, bad, shutdown) = (tx.clone(), bad.clone(), shutdown.clone());
        async move { a.watch_peers(a_cidr, tx, bad, shutdown).await }
    });

    // a itself never appears; b does once it has published.
    annotate(&cp, "a", ENDPOINT_ANNOTATION, "10.250.0.2:4789").await;
    b.publish_tunnel("10.250.0.3:4789".parse().expect("addr"), &key_of("b"), WAIT).await.expect("publish b");
    let peer_b = Peer {
        node: "b".into(),
        pod_cidr: b_cidr,
        endpoint: "10.250.0.3:4789".parse().expect("addr"),
        public_key: key_of("b"),
    };
    wait_peers(&mut rx, "b published", &[&peer_b]).await;

    // An endpoint without a key is not yet a peer, and no problem either.
    annotate(&cp, "c", ENDPOINT_ANNOTATION, "10.250.0.4:4789").await;
    // A malformed annotation is skipped and counted. The watch delivers events in order, so
    // once b's later change shows, c's bad value has been seen.
    annotate(&cp, "c", PUBLIC_KEY_ANNOTATION, "garbage").await;
    b.publish_tunnel("10.250.0.3:4790".parse().expect("addr"), &key_of("b"), WAIT)
        .await
        .expect("republish b");
    let peer_b = Peer { endpoint: "10.250.0.3:4790".parse().expect("addr"), ..peer_b };
    wait_peers(&mut rx, "b's new endpoint after c's garbage", &[&peer_b]).await;
    assert_eq!(bad.load(Ordering::Relaxed), 1, "c's garbage counted once");

    // Fixed, c appears; the problem is not counted again.
    c.publish_tunnel("10.250.0.4:4789".parse().expect("addr"), &key_of("c"), WAIT).await.expect("publish c");
    let peer_c = Peer {
        node: "c".into(),
        pod_cidr: c_cidr,
        endpoint: "10.250.0.4:4789".parse().expect("addr"),
        public_key: key_of("c"),
    };
    wait_peers(&mut rx, "c fixed", &[&peer_b, &peer_c]).await;
    assert_eq!(bad.load(Ordering::Relaxed), 1);

    // Deleted, it is gone.
    admin.delete("c", &DeleteParams::default()).await.expect("delete c");
    wait_peers(&mut rx, "c deleted", &[&peer_b]).await;

    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), watching)
        .await
        .expect("watch_peers stops when cancelled")
        .expect("join");
    assert_eq!(*tx.borrow(), [peer_b]);
}
