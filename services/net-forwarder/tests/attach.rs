//! The net-forwarder in a test bubble, pods as nested network namespaces, driven through its
//! gRPC API as the pod runtime will drive it.

mod support;

use std::net::Ipv4Addr;

use hpk_proto::netforwarder::v1 as pb;
use support::{address, attach, bubble, detach, list};
use tonic::Code;

/// The first host of the pod CIDR: the net-forwarder puts it on the bubble's `lo`.
const BUBBLE_ADDRESS: Ipv4Addr = Ipv4Addr::new(10, 252, 0, 1);

#[tokio::test(flavor = "multi_thread")]
async fn pods_reach_each_other_and_the_bubble() {
    let Some(bubble) = bubble() else { return };
    let routes_before = bubble.routes();
    let server = bubble.serve("10.252.0.0/24").await;
    let mut client = server.client();
    let (pod_a, pod_b) = (bubble.pod(), bubble.pod());
    let a = attach(&mut client, "sandbox-a", &pod_a).await;
    let b = attach(&mut client, "sandbox-b", &pod_b).await;
    assert_eq!((a.gateway.as_str(), a.mtu, a.pod_interface.as_str()), ("169.254.1.1", 1500, "eth0"));
    assert_ne!(a.address, b.address);
    assert!(a.address.starts_with("10.252.0.") && a.address.ends_with("/32"), "{}", a.address);

    support::pods_and_bubble_talk(&bubble, BUBBLE_ADDRESS, (&pod_a, &a), (&pod_b, &b));

    let stats = client.stats(pb::StatsRequest { sandbox_id: "sandbox-a".into() }).await.expect("stats");
    let stats = stats.into_inner().interfaces;
    assert_eq!(stats.len(), 1);
    assert!(stats[0].rx_packets > 0 && stats[0].tx_packets > 0, "{:?}", stats[0]);
    let routes = client.routes(pb::RoutesRequest {}).await.expect("routes").into_inner().routes;
    assert_eq!(routes.len(), 2);
    assert!(bubble.routes().iter().any(|r| r.starts_with(&format!(
        "{} dev {}",
        address(&a),
        a.host_interface
    ))));

    detach(&mut client, "sandbox-a").await;
    detach(&mut client, "sandbox-b").await;
    assert!(!pod_a.ping(BUBBLE_ADDRESS), "pod A still reaches the bubble after detach");
    support::assert_nothing_attached(&bubble, &mut client, &routes_before).await;
    server.stop();
}

#[tokio::test(flavor = "multi_thread")]
async fn restart_keeps_pods_connected_and_their_addresses() {
    let Some(bubble) = bubble() else { return };
    let server = bubble.serve("10.252.0.0/24").await;
    let mut client = server.client();
    let (pod_a, pod_b, pod_c) = (bubble.pod(), bubble.pod(), bubble.pod());
    let a = attach(&mut client, "a", &pod_a).await;
    let b = attach(&mut client, "b", &pod_b).await;
    let c = attach(&mut client, "c", &pod_c).await;
    server.stop();

    // While it is down: pods keep talking; one pod dies.
    assert!(pod_a.ping(address(&b)), "pods lost connectivity when the net-forwarder stopped");
    pod_c.kill();

    let server = bubble.serve("10.252.0.0/24").await;
    let mut client = server.client();
    let listed = list(&mut client).await.attachments;
    assert_eq!(listed, vec![a.clone(), b.clone()], "allocations after restart");
    assert!(pod_b.ping(address(&a)), "pods lost connectivity across the restart");
    let pod_d = bubble.pod();
    let d = attach(&mut client, "d", &pod_d).await;
    assert!(![&a.address, &b.address].contains(&&d.address), "{} was handed out twice", d.address);
    assert_ne!(d.address, c.address, "the dead pod's address was reused at once");
    assert!(pod_d.ping(address(&a)));
    let err = client
        .attach(pb::AttachRequest { sandbox_id: "a".into(), netns_path: pod_a.netns_path() })
        .await
        .expect_err("a is attached");
    assert_eq!(err.code(), Code::AlreadyExists);
    server.stop();
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_attach_requests_are_refused_cleanly() {
    let Some(bubble) = bubble() else { return };
    let server = bubble.serve("10.252.0.4/30").await;
    let mut client = server.client();
    let pod = bubble.pod();
    let not_netns = bubble.dir.path().join("plain-file");
    std::fs::write(&not_netns, b"").expect("write");
    let cases = [
        ("s1", "/nonexistent/netns".to_owned(), Code::NotFound, "does not exist"),
        ("s1", "relative/netns".to_owned(), Code::InvalidArgument, "must be absolute"),
        ("s1", not_netns.display().to_string(), Code::InvalidArgument, "network namespace"),
        ("", pod.netns_path(), Code::InvalidArgument, "sandbox id"),
        ("bad/id", pod.netns_path(), Code::InvalidArgument, "sandbox id"),
    ];
    for (sandbox, path, code, message) in cases {
        let err = client
            .attach(pb::AttachRequest { sandbox_id: sandbox.into(), netns_path: path.clone() })
            .await
            .expect_err(&path);
        assert_eq!(err.code(), code, "{sandbox:?} {path}: {err}");
        assert!(err.message().contains(message), "{path}: {}", err.message());
    }
    assert!(
        bubble.forwarder_interfaces().is_empty(),
        "a failed attach left {:?}",
        bubble.forwarder_interfaces()
    );
    assert_eq!(list(&mut client).await.free_addresses, 1, "a failed attach kept its address");

    attach(&mut client, "s1", &pod).await;
    let err = client
        .attach(pb::AttachRequest { sandbox_id: "s1".into(), netns_path: pod.netns_path() })
        .await
        .expect_err("twice");
    assert_eq!(err.code(), Code::AlreadyExists);
    let other = bubble.pod();
    let err = client
        .attach(pb::AttachRequest { sandbox_id: "s2".into(), netns_path: other.netns_path() })
        .await
        .expect_err("exhausted");
    assert_eq!(err.code(), Code::ResourceExhausted, "{err}");
    assert!(err.message().contains("10.252.0.4/30 is exhausted"), "{}", err.message());
    let err = client.detach(pb::DetachRequest { sandbox_id: "s2".into() }).await.expect_err("unknown");
    assert_eq!(err.code(), Code::NotFound);
    assert_eq!(bubble.forwarder_interfaces().len(), 1);
    server.stop();
}

/// Attach/detach cycles that must leave nothing behind (issue 5: 500).
const CYCLES: usize = 500;

#[tokio::test(flavor = "multi_thread")]
async fn attach_detach_cycles_leave_nothing_behind() {
    let Some(bubble) = bubble() else { return };
    let routes_before = bubble.routes();
    let server = bubble.serve("10.252.0.0/24").await;
    let mut client = server.client();
    let pod = bubble.pod();
    // One cycle first, so lazily opened resources are counted in the baseline.
    attach(&mut client, "warm-up", &pod).await;
    detach(&mut client, "warm-up").await;
    let fds = server.fds();
    let threads = server.threads();
    for i in 0..CYCLES {
        let sandbox = format!("cycle-{i}");
        attach(&mut client, &sandbox, &pod).await;
        detach(&mut client, &sandbox).await;
    }
    support::assert_nothing_attached(&bubble, &mut client, &routes_before).await;
    assert_eq!(server.fds(), fds, "file descriptors leaked over {CYCLES} cycles");
    // The runtime's blocking pool may keep a few idle threads; a leak would be one per cycle.
    assert!(
        server.threads() <= threads + 4,
        "threads leaked over {CYCLES} cycles: {threads} → {}",
        server.threads()
    );
    // The pod's namespace is clean too: it can be attached again.
    let again = attach(&mut client, "again", &pod).await;
    assert!(pod.ping(Ipv4Addr::new(169, 254, 1, 1)), "{again:?}");
    server.stop();
}
