//! The TAP attachment (`--attach-mode tap`): the fallback where a veth into the pod is refused.
//! The net-forwarder in a test bubble, pods as nested network namespaces, over the gRPC API.

mod support;

use std::net::Ipv4Addr;
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use hpk_proto::netforwarder::v1 as pb;
use support::{Bubble, Server, address, attach, detach, list, tcp_round_trip};
use tonic::Code;

const BUBBLE_ADDRESS: Ipv4Addr = Ipv4Addr::new(10, 253, 0, 1);
const GATEWAY: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);
const TAP: &[&str] = &["--attach-mode", "tap"];

/// The bubble, with /dev/net/tun opened up for rootless TAPs as a host would have it.
fn bubble() -> Option<Bubble> {
    let bubble = support::bubble()?;
    let tun = std::path::Path::new("/dev/net/tun");
    let mode = std::fs::metadata(tun).map(|m| m.permissions().mode() & 0o777);
    if mode.as_ref().is_ok_and(|m| m & 0o666 != 0o666) {
        std::fs::set_permissions(tun, std::fs::Permissions::from_mode(0o666))
            .expect("chmod 0666 /dev/net/tun");
    }
    if mode.is_err() {
        hpk_test_support::skip("/dev/net/tun does not exist (modprobe tun)");
        return None;
    }
    Some(bubble)
}

/// `ip -d link show eth0` in the pod says it is a TAP.
fn pod_has_tap(pod: &support::Pod) -> bool {
    let out = pod.ip(&["-d", "link", "show", "eth0"]);
    out.status.success() && String::from_utf8_lossy(&out.stdout).contains("tun type tap")
}

/// Waits (bounded) until `f` holds; the server's short-lived threads finish asynchronously.
fn settles(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !f() {
        assert!(Instant::now() < deadline, "{what} within 15 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn tap_pods_reach_each_other_and_the_bubble() {
    let Some(bubble) = bubble() else { return };
    let routes_before = bubble.routes();
    let server = bubble.serve_with("10.253.0.0/24", TAP).await;
    let mut client = server.client();
    let (pod_a, pod_b) = (bubble.pod(), bubble.pod());
    let a = attach(&mut client, "sandbox-a", &pod_a).await;
    let b = attach(&mut client, "sandbox-b", &pod_b).await;
    assert!(a.host_interface.starts_with("hpkt"), "{}", a.host_interface);
    assert_eq!((a.gateway.as_str(), a.mtu, a.pod_interface.as_str()), ("169.254.1.1", 1500, "eth0"));
    assert!(pod_has_tap(&pod_a), "the pod's eth0 is not a TAP");
    assert_eq!(bubble.forwarder_interfaces().len(), 2, "{:?}", bubble.forwarder_interfaces());

    support::pods_and_bubble_talk(&bubble, BUBBLE_ADDRESS, (&pod_a, &a), (&pod_b, &b));

    let stats = client.stats(pb::StatsRequest { sandbox_id: "sandbox-a".into() }).await.expect("stats");
    let stats = stats.into_inner().interfaces;
    assert_eq!(stats.len(), 1);
    let s = &stats[0];
    assert_eq!(s.interface, a.host_interface);
    // Two pings each way and three TCP exchanges, plus ARP: at least that many frames each way.
    assert!(s.rx_packets >= 10 && s.tx_packets >= 10, "{s:?}");
    assert!(s.rx_bytes > s.rx_packets * 40 && s.tx_bytes > s.tx_packets * 40, "{s:?}");
    assert_eq!((s.rx_dropped, s.tx_dropped, s.rx_errors, s.tx_errors), (0, 0, 0, 0), "{s:?}");
    let routes = client.routes(pb::RoutesRequest {}).await.expect("routes").into_inner().routes;
    assert!(routes.iter().all(|r| r.interface.starts_with("hpkt")), "{routes:?}");
    assert!(bubble.routes().iter().any(|r| r.starts_with(&format!(
        "{} dev {}",
        address(&a),
        a.host_interface
    ))));

    detach(&mut client, "sandbox-a").await;
    assert!(!pod_a.interfaces().contains("eth0"), "the pod's TAP outlived detach");
    assert!(pod_b.ping(GATEWAY), "detaching A disturbed B");
    detach(&mut client, "sandbox-b").await;
    assert!(!pod_b.interfaces().contains("eth0"), "the pod's TAP outlived detach");
    support::assert_nothing_attached(&bubble, &mut client, &routes_before).await;
    server.stop();
}

#[tokio::test(flavor = "multi_thread")]
async fn tap_restart_keeps_addresses_and_reconnects() {
    let Some(bubble) = bubble() else { return };
    let server = bubble.serve_with("10.253.0.0/24", TAP).await;
    let mut client = server.client();
    let (pod_a, pod_b, pod_c) = (bubble.pod(), bubble.pod(), bubble.pod());
    let a = attach(&mut client, "a", &pod_a).await;
    let b = attach(&mut client, "b", &pod_b).await;
    attach(&mut client, "c", &pod_c).await;
    assert!(pod_a.ping(address(&b)));
    server.stop();

    // While it is down the TAPs persist (without a relay, so no traffic); one pod dies.
    assert!(pod_has_tap(&pod_a), "the pod's TAP went with the net-forwarder");
    assert_eq!(bubble.forwarder_interfaces().len(), 3, "{:?}", bubble.forwarder_interfaces());
    pod_c.kill();

    // Restarted in auto mode: existing TAP attachments are restored as TAPs all the same.
    let server = bubble.serve("10.253.0.0/24").await;
    let mut client = server.client();
    let listed = list(&mut client).await.attachments;
    assert_eq!(listed, vec![a.clone(), b.clone()], "attachments after restart");
    assert!(pod_a.ping(address(&b)), "pods did not reconnect after the restart");
    assert!(pod_b.ping(address(&a)), "pods did not reconnect after the restart");
    assert_eq!(tcp_round_trip(&pod_b.netns_path(), address(&b), &pod_a.netns_path()), "HELLO POD");
    assert_eq!(
        bubble.forwarder_interfaces().len(),
        2,
        "the dead pod's TAP: {:?}",
        bubble.forwarder_interfaces()
    );
    let stats = client.stats(pb::StatsRequest { sandbox_id: "a".into() }).await.expect("stats").into_inner();
    assert!(stats.interfaces[0].rx_packets > 0, "the restarted relay counts nothing: {stats:?}");

    detach(&mut client, "a").await;
    detach(&mut client, "b").await;
    assert!(bubble.forwarder_interfaces().is_empty(), "{:?}", bubble.forwarder_interfaces());
    assert!(!pod_a.interfaces().contains("eth0") && !pod_b.interfaces().contains("eth0"));
    server.stop();
}

#[tokio::test(flavor = "multi_thread")]
async fn tap_bad_attach_leaves_nothing() {
    let Some(bubble) = bubble() else { return };
    let routes_before = bubble.routes();
    let server = bubble.serve_with("10.253.0.0/24", TAP).await;
    let mut client = server.client();
    let err = client
        .attach(pb::AttachRequest { sandbox_id: "s1".into(), netns_path: "/nonexistent/netns".into() })
        .await
        .expect_err("no such namespace");
    assert_eq!(err.code(), Code::NotFound, "{err}");

    // Fails after the address was allocated: the pod has an eth0 that is not a TAP.
    let pod = bubble.pod();
    let out = pod.ip(&["link", "add", "eth0", "type", "veth", "peer", "name", "other"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let err = client
        .attach(pb::AttachRequest { sandbox_id: "s1".into(), netns_path: pod.netns_path() })
        .await
        .expect_err("eth0 is taken");
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
    assert!(err.message().contains("TAP") && err.message().contains("eth0"), "{}", err.message());

    assert!(bubble.forwarder_interfaces().is_empty(), "left {:?}", bubble.forwarder_interfaces());
    assert_eq!(bubble.routes(), routes_before);
    assert_eq!(list(&mut client).await.free_addresses, 253, "a failed attach kept its address");
    assert!(!pod_has_tap(&pod));
    server.stop();
}

#[tokio::test(flavor = "multi_thread")]
async fn tap_pod_dying_while_attached_is_detached_cleanly() {
    let Some(bubble) = bubble() else { return };
    let server = bubble.serve_with("10.253.0.0/24", TAP).await;
    let mut client = server.client();
    let (pod_a, pod_b) = (bubble.pod(), bubble.pod());
    attach(&mut client, "a", &pod_a).await;
    let threads = server.threads();
    let b = attach(&mut client, "b", &pod_b).await;
    assert!(pod_a.ping(address(&b)));
    pod_b.kill();
    // The TAP's descriptor keeps the dead pod's namespace, and the relay, until Detach.
    detach(&mut client, "b").await;
    assert_eq!(bubble.forwarder_interfaces().len(), 1, "{:?}", bubble.forwarder_interfaces());
    settles("the dead pod's relay threads end", || server.threads() <= threads);
    assert!(pod_a.ping(GATEWAY), "the other pod lost its network");
    server.stop();
}

#[tokio::test(flavor = "multi_thread")]
async fn tap_attach_detach_cycles_leave_nothing_behind() {
    let Some(bubble) = bubble() else { return };
    let routes_before = bubble.routes();
    let server = bubble.serve_with("10.253.0.0/24", TAP).await;
    let mut client = server.client();
    let pod = bubble.pod();
    // One cycle first, so lazily started threads and opened resources are in the baseline.
    attach(&mut client, "warm-up", &pod).await;
    detach(&mut client, "warm-up").await;
    let (fds, threads) = (server.fds(), server.threads());
    for i in 0..50 {
        let sandbox = format!("cycle-{i}");
        let a = attach(&mut client, &sandbox, &pod).await;
        if i % 10 == 0 {
            assert!(pod.ping(GATEWAY), "cycle {i}: {a:?}");
        }
        detach(&mut client, &sandbox).await;
    }
    assert!(!pod.interfaces().contains("eth0"), "{:?}", pod.interfaces());
    support::assert_nothing_attached(&bubble, &mut client, &routes_before).await;
    settles("file descriptors back to the baseline", || server.fds() <= fds);
    settles("threads back to the baseline", || server.threads() <= threads);
    leak_report(&server, fds, threads);
    server.stop();
}

fn leak_report(server: &Server, fds: usize, threads: usize) {
    println!(
        "after 50 cycles: fds {} (baseline {fds}), threads {} (baseline {threads})",
        server.fds(),
        server.threads()
    );
}
