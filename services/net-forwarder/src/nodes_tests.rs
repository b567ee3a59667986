//! Unit tests of [`super`]: Node objects to peers, the peer table, the wait's errors.

use super::*;

/// Node `name`'s public key in these tests.
fn key_of(name: &str) -> PublicKey {
    crate::tunnel::identity::Identity::from_secret([name.as_bytes()[0]; 32]).public()
}

/// A Node; with an endpoint, it also has its valid public key.
fn node(name: &str, cidr: Option<&str>, endpoint: Option<&str>) -> Node {
    let key = endpoint.map(|_| key_of(name).to_string());
    node_with_key(name, cidr, endpoint, key.as_deref())
}

fn node_with_key(name: &str, cidr: Option<&str>, endpoint: Option<&str>, key: Option<&str>) -> Node {
    let mut node = Node::default();
    node.metadata.name = Some(name.into());
    let annotations: BTreeMap<String, String> =
        [(ENDPOINT_ANNOTATION, endpoint), (PUBLIC_KEY_ANNOTATION, key)]
            .into_iter()
            .filter_map(|(k, v)| Some((k.to_owned(), v?.to_owned())))
            .collect();
    if !annotations.is_empty() {
        node.metadata.annotations = Some(annotations);
    }
    node.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
        pod_cidr: cidr.map(str::to_owned),
        ..Default::default()
    });
    node
}

fn own_cidr() -> PodCidr {
    "10.244.0.0/24".parse().expect("literal")
}

#[test]
fn a_node_with_cidr_and_endpoint_is_a_peer() {
    let peer = peer_of(&node("b", Some("10.244.1.0/24"), Some("10.250.0.3:4789")), "a").expect("well-formed");
    assert_eq!(
        peer,
        Some(Peer {
            node: "b".into(),
            pod_cidr: "10.244.1.0/24".parse().expect("literal"),
            endpoint: "10.250.0.3:4789".parse().expect("literal"),
            public_key: key_of("b"),
        })
    );
}

#[test]
fn missing_fields_and_self_are_not_peers_yet() {
    assert_eq!(peer_of(&node("b", Some("10.244.1.0/24"), None), "a").expect("well-formed"), None);
    assert_eq!(peer_of(&node("b", None, Some("10.250.0.3:4789")), "a").expect("well-formed"), None);
    assert_eq!(peer_of(&Node::default(), "a").expect("well-formed"), None);
    let keyless = node_with_key("b", Some("10.244.1.0/24"), Some("10.250.0.3:4789"), None);
    assert_eq!(peer_of(&keyless, "a").expect("well-formed"), None, "no key published yet");
    let key = key_of("b").to_string();
    let endpointless = node_with_key("b", Some("10.244.1.0/24"), None, Some(&key));
    assert_eq!(peer_of(&endpointless, "a").expect("well-formed"), None);
    assert_eq!(
        peer_of(&node("a", Some("10.244.1.0/24"), Some("10.250.0.3:4789")), "a").expect("well-formed"),
        None
    );
}

#[test]
fn malformed_values_are_errors_that_name_node_and_value() {
    for bad in ["garbage", "1.2.3.4", "1.2.3.4:0", "[::1]:5"] {
        let e = peer_of(&node("b", Some("10.244.1.0/24"), Some(bad)), "a").expect_err("malformed");
        let msg = e.to_string();
        assert!(matches!(e, Error::InvalidArgument(_)), "{bad}: {e}");
        assert!(msg.contains("Node b") && msg.contains(&format!("{bad:?}")), "{msg}");
        assert!(msg.contains(ENDPOINT_ANNOTATION), "{msg}");
    }
    let good = key_of("b").to_string();
    for bad in [
        String::new(),
        "garbage".to_owned(),
        good.to_uppercase(),
        format!(" {good}"),
        good[..62].to_owned(),
        format!("{good}00"),
        "00".repeat(32),
        // A point of order 8: every shared secret with it is zero.
        "5f9c95bca3508c24b1d0b1559c83ef5b04445cc4581c8e86d8224eddd09f1157".to_owned(),
    ] {
        let n = node_with_key("b", Some("10.244.1.0/24"), Some("10.250.0.3:4789"), Some(&bad));
        let e = peer_of(&n, "a").expect_err("malformed key");
        let msg = e.to_string();
        assert!(matches!(e, Error::InvalidArgument(_)), "{bad}: {e}");
        assert!(msg.contains("Node b") && msg.contains(PUBLIC_KEY_ANNOTATION), "{msg}");
        assert!(msg.contains(&format!("{bad:?}")), "{msg}");
    }
    for bad in ["10.244.1.5/24", "fd00::/64", "x"] {
        let e = peer_of(&node("b", Some(bad), Some("10.250.0.3:4789")), "a").expect_err("malformed");
        assert!(e.to_string().contains("spec.podCIDR"), "{e}");
    }
}

#[test]
fn own_pod_cidr_is_read_from_spec() {
    assert_eq!(
        node_pod_cidr(&node("a", Some("10.244.3.0/24"), None)).expect("set").expect("valid").to_string(),
        "10.244.3.0/24"
    );
    assert!(node_pod_cidr(&node("a", None, None)).is_none());
    assert!(node_pod_cidr(&node("a", Some("nonsense"), None)).expect("set").is_err());
}

#[test]
fn the_wait_for_the_own_pod_cidr_says_what_was_missing() {
    let secs = Duration::from_secs(3);
    let mut seen = OwnNode::default();
    let refused = kube::core::Status::failure("nodes is forbidden", "Forbidden").with_code(403);
    let refused = watcher::Error::InitialListFailed(kube::Error::Api(Box::new(refused)));
    assert!(seen.observe("a", Err(refused)).is_none());
    let e = seen.timed_out("a", secs).to_string();
    assert!(e.starts_with("Node a: no answer from the API server within 3 s"), "{e}");
    assert!(e.contains("last API error") && e.contains("nodes is forbidden"), "{e}");

    let mut seen = OwnNode::default();
    assert!(seen.observe("a", Ok(watcher::Event::Init)).is_none());
    assert!(seen.observe("a", Ok(watcher::Event::InitDone)).is_none());
    let e = seen.timed_out("a", secs);
    assert!(e.to_string().starts_with("Node a not found (waited 3 s"), "{e}");
    assert_eq!(e.exit_code(), 69);

    let unallocated = node("a", None, None);
    assert!(seen.observe("a", Ok(watcher::Event::Apply(unallocated))).is_none());
    let e = seen.timed_out("a", secs).to_string();
    assert!(e.starts_with("Node a has no spec.podCIDR") && e.contains("--allocate-node-cidrs"), "{e}");

    let allocated = node("a", Some("10.244.7.0/24"), None);
    let found = seen.observe("a", Ok(watcher::Event::Apply(allocated))).expect("done");
    assert_eq!(found.expect("pod CIDR").to_string(), "10.244.7.0/24");
    assert!(seen.observe("a", Ok(watcher::Event::Delete(Node::default()))).is_none());
    assert!(seen.timed_out("a", secs).to_string().starts_with("Node a not found"));
}

#[test]
fn the_table_counts_each_problem_once_while_it_lasts() {
    let bad = AtomicU64::new(0);
    let mut table = PeerTable::new("a", own_cidr());
    assert!(table.apply(&node("a", Some("10.244.0.0/24"), Some("10.250.0.2:1"))));
    assert!(table.apply(&node("b", Some("10.244.1.0/24"), Some("10.250.0.3:1"))));
    assert!(table.apply(&node("c", Some("10.244.2.0/24"), Some("garbage"))));
    let names = |peers: Vec<Peer>| peers.into_iter().map(|p| p.node).collect::<Vec<_>>();
    assert_eq!(names(table.peers(&bad)), ["b"]);
    assert_eq!(names(table.peers(&bad)), ["b"]);
    assert_eq!(bad.load(Ordering::Relaxed), 1, "the same bad value counts once");

    // An unchanged Node is no change; another bad value is another problem.
    assert!(!table.apply(&node("c", Some("10.244.2.0/24"), Some("garbage"))));
    assert!(table.apply(&node("c", Some("10.244.2.0/24"), Some("1.2.3.4:0"))));
    assert_eq!(names(table.peers(&bad)), ["b"]);
    assert_eq!(bad.load(Ordering::Relaxed), 2);

    // Fixed, it becomes a peer; a CIDR overlapping this node's is refused and counted.
    table.apply(&node("c", Some("10.244.2.0/24"), Some("10.250.0.4:1")));
    table.apply(&node("d", Some("10.244.0.0/16"), Some("10.250.0.5:1")));
    assert_eq!(names(table.peers(&bad)), ["b", "c"]);
    assert_eq!(bad.load(Ordering::Relaxed), 3);

    assert!(table.delete(&node("b", None, None)));
    assert!(!table.delete(&node("b", None, None)));
    assert_eq!(names(table.peers(&bad)), ["c"]);
    assert_eq!(bad.load(Ordering::Relaxed), 3);

    // A malformed key is counted like a malformed endpoint; a missing one is not yet a peer.
    table.apply(&node_with_key("e", Some("10.244.5.0/24"), Some("10.250.0.6:1"), Some("nope")));
    table.apply(&node_with_key("f", Some("10.244.6.0/24"), Some("10.250.0.7:1"), None));
    assert_eq!(names(table.peers(&bad)), ["c"]);
    assert_eq!(bad.load(Ordering::Relaxed), 4);
}

#[test]
fn refused_requests_are_not_retried() {
    let status =
        |code| kube::Error::Api(Box::new(kube::core::Status::failure("no", "Reason").with_code(code)));
    for code in [400, 401, 403, 422] {
        assert!(!retryable(&status(code)), "{code}");
    }
    for code in [404, 409, 429, 500, 503] {
        assert!(retryable(&status(code)), "{code}");
    }
}

#[test]
fn errors_map_to_exit_codes_and_grpc_codes() {
    let forbidden = Error::kube(
        "patch",
        kube::Error::Api(Box::new(kube::core::Status::failure("no", "Forbidden").with_code(403))),
    );
    assert_eq!(forbidden.exit_code(), 69);
    assert!(forbidden.to_string().starts_with("patch: no (403"), "{forbidden}");
    assert_eq!(tonic::Status::from(forbidden).code(), tonic::Code::PermissionDenied);
    let gone = Error::Unavailable("Node x not found".into());
    assert_eq!(gone.exit_code(), 69);
    assert_eq!(tonic::Status::from(gone).code(), tonic::Code::Unavailable);
}
