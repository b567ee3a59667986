//! Two bubbles on two test hosts, each with slirp4netns for egress, joined by the
//! net-forwarder's tunnel: pod ↔ pod across hosts, forged datagrams, restarts, bad set-ups.

mod support;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::process::Command;
use std::time::{Duration, Instant};

use hpk_proto::netforwarder::v1 as pb;
use support::hosts::{
    Hosts, Slirp, TunnelServe, assert_unprivileged, gen_key, gen_unprivileged_key, slirp_available,
};
use support::{Client, address, attach, bubble, in_netns, tcp_round_trip};

const CIDR_A: &str = "10.244.1.0/24";
const CIDR_B: &str = "10.244.2.0/24";
const BUBBLE_A: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 1);

async fn tunnel_stats(client: &mut Client) -> pb::TunnelStats {
    let stats = client.stats(pb::StatsRequest::default()).await.expect("stats").into_inner();
    stats.tunnel.expect("the server has a tunnel")
}

/// Sends `bytes` from `client_ns` to a listener in `server_ns` and returns how many arrived.
fn bulk(server_ns: &str, server: Ipv4Addr, client_ns: &str, bytes: usize) -> usize {
    let listener = in_netns(server_ns, move || TcpListener::bind((server, 0)).expect("bind"));
    let addr = listener.local_addr().expect("addr");
    let sink = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().expect("accept");
        conn.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
        let mut buf = vec![0u8; 1 << 16];
        let mut total = 0;
        loop {
            match conn.read(&mut buf) {
                Ok(0) => return total,
                Ok(n) => total += n,
                Err(e) => panic!("receive after {total} bytes: {e}"),
            }
        }
    });
    let mut conn = in_netns(client_ns, move || {
        TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect")
    });
    let chunk = vec![0x5au8; 1 << 16];
    let mut sent = 0;
    while sent < bytes {
        let n = chunk.len().min(bytes - sent);
        conn.write_all(&chunk[..n]).expect("send");
        sent += n;
    }
    drop(conn);
    sink.join().expect("sink")
}

/// IP fragments the kernel of the namespace `netns` has taken in for reassembly (ReasmReqds).
fn reassembled_fragments(netns: &str) -> u64 {
    ip_counter(netns, "ReasmReqds")
}

/// An `Ip:` counter of the namespace `netns` (/proc/net/snmp).
fn ip_counter(netns: &str, name: &'static str) -> u64 {
    let snmp = in_netns(netns, || std::fs::read_to_string("/proc/thread-self/net/snmp").expect("snmp"));
    let mut ip = snmp.lines().filter(|l| l.starts_with("Ip:"));
    let (names, values) = (ip.next().expect("Ip: names"), ip.next().expect("Ip: values"));
    let at = names.split_whitespace().position(|n| n == name).expect("the counter");
    values.split_whitespace().nth(at).expect("a value").parse().expect("a number")
}

/// Polls `f` until it holds, for at most 10 s.
async fn eventually<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f().await {
        assert!(Instant::now() < deadline, "{what}: not within 10 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn pods_on_two_hosts_talk_through_the_tunnel_not_slirp() {
    let Some(probe) = bubble() else { return };
    drop(probe);
    if !slirp_available() {
        return;
    }
    let hosts = Hosts::pair();
    let dir = tempfile::tempdir().expect("tempdir");
    let key = gen_unprivileged_key(dir.path());
    let (bubble_a, bubble_b) = (hosts.bubble(0), hosts.bubble(1));
    let _slirp_a = Slirp::start(&hosts, 0, &bubble_a);
    let _slirp_b = Slirp::start(&hosts, 1, &bubble_b);
    let (port_a, port_b) = (hosts.free_udp_port(0), hosts.free_udp_port(1));
    let serve_a = TunnelServe {
        hosts: &hosts,
        host: 0,
        pod_cidr: CIDR_A,
        port: port_a,
        key: &key,
        peers: vec![format!("b={CIDR_B}@{}:{port_b}", hosts.addr(1))],
        metrics: Some("127.0.0.1:9560"),
    };
    let serve_b = TunnelServe {
        hosts: &hosts,
        host: 1,
        pod_cidr: CIDR_B,
        port: port_b,
        key: &key,
        peers: vec![format!("a={CIDR_A}@{}:{port_a}", hosts.addr(0))],
        metrics: None,
    };
    let server_a = bubble_a.serve_tunnel(&serve_a).await;
    let server_b = bubble_b.serve_tunnel(&serve_b).await;
    // Rootless, as in production: the relay and its socket belong to an unprivileged user.
    assert_unprivileged(server_a.pid());
    assert_unprivileged(server_b.pid());
    let (mut client_a, mut client_b) = (server_a.client(), server_b.client());
    let (pod_a, pod_b) = (bubble_a.pod(), bubble_b.pod());
    let a = attach(&mut client_a, "pod-a", &pod_a).await;
    let b = attach(&mut client_b, "pod-b", &pod_b).await;
    let (ip_a, ip_b) = (address(&a), address(&b));

    // The routes: one into the tunnel, with the bubble's own address as source.
    let routes = client_a.routes(pb::RoutesRequest {}).await.expect("routes").into_inner().routes;
    let tunnel_route = routes.iter().find(|r| r.node == "b").expect("a route to node b");
    assert_eq!((tunnel_route.destination.as_str(), tunnel_route.interface.as_str()), (CIDR_B, "hpk-tunnel"));
    assert!(
        bubble_a
            .routes()
            .iter()
            .any(|r| r.starts_with(&format!("{CIDR_B} dev hpk-tunnel"))
                && r.contains(&format!("src {BUBBLE_A}"))),
        "{:?}",
        bubble_a.routes()
    );

    // Pod ↔ pod across the hosts, both ways; the bubble reaches the other host's pod too.
    assert!(pod_a.ping(ip_b), "pod A cannot ping pod B");
    assert!(pod_b.ping(ip_a), "pod B cannot ping pod A");
    assert_eq!(tcp_round_trip(&pod_b.netns_path(), ip_b, &pod_a.netns_path()), "HELLO POD");
    assert_eq!(tcp_round_trip(&pod_a.netns_path(), ip_a, &pod_b.netns_path()), "HELLO POD");
    let bubble_a_ns = bubble_a.netns_path().display().to_string();
    assert_eq!(tcp_round_trip(&pod_b.netns_path(), ip_b, &bubble_a_ns), "HELLO POD");

    // Bulk traffic: the tunnel carries it, slirp4netns's tap0 does not, and in datagrams that
    // fit the link: host B reassembles no IP fragments.
    let before = tunnel_stats(&mut client_a).await;
    let fragments = reassembled_fragments(&hosts.netns(1));
    let (slirp_rx, slirp_tx) = bubble_a.interface_bytes("tap0");
    const BULK: usize = 32 << 20;
    assert_eq!(bulk(&pod_b.netns_path(), ip_b, &pod_a.netns_path(), BULK), BULK);
    let after = tunnel_stats(&mut client_a).await;
    let (slirp_rx2, slirp_tx2) = bubble_a.interface_bytes("tap0");
    assert_eq!(reassembled_fragments(&hosts.netns(1)), fragments, "the tunnel's datagrams were fragmented");
    assert!(after.tx_bytes - before.tx_bytes >= BULK as u64, "{before:?}\n{after:?}");
    assert!(
        slirp_tx2 - slirp_tx < 64 << 10 && slirp_rx2 - slirp_rx < 64 << 10,
        "traffic went through slirp4netns: tap0 tx +{} rx +{}",
        slirp_tx2 - slirp_tx,
        slirp_rx2 - slirp_rx
    );
    let peer = after.peers.iter().find(|p| p.node == "b").expect("peer b");
    assert!(peer.tx_bytes >= BULK as u64 && peer.rx_packets > 0, "{peer:?}");
    assert_eq!(after.rx_dropped_auth + after.rx_dropped_replay + after.rx_dropped_malformed, 0, "{after:?}");

    // The bubble's egress is slirp4netns: it reaches a listener on the other host's address.
    let host_b = hosts.addr(1);
    let listener = in_netns(&hosts.netns(1), move || TcpListener::bind((host_b, 0)).expect("bind"));
    let port = listener.local_addr().expect("addr").port();
    let accept = std::thread::spawn(move || listener.accept().map(|(_, peer)| peer));
    in_netns(&bubble_a_ns, move || {
        TcpStream::connect_timeout(&SocketAddr::from((host_b, port)), Duration::from_secs(5))
            .expect("egress through slirp4netns")
    });
    accept.join().expect("accept thread").expect("accept");

    // Metrics on the bubble's loopback show the same counters.
    let metrics = Command::new("nsenter")
        .arg(format!("--net={bubble_a_ns}"))
        .args(["--", "curl", "-sf", "http://127.0.0.1:9560/metrics"])
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&metrics.stdout);
    assert!(text.contains("hpk_net_peer_bytes_total{node=\"b\",direction=\"tx\"}"), "{text}");
    assert!(text.contains("hpk_net_pod_packets_total{sandbox=\"pod-a\""), "{text}");

    // Forged datagrams from another process on host B, to B's tunnel port: garbage, well-formed
    // one-chunk messages with a wrong tag, and first chunks of messages that never complete.
    // All dropped and counted; the pod sees nothing.
    let b_stats = tunnel_stats(&mut client_b).await;
    // IPv4 packets pod B takes in (the bubble's ARP probes to it are not IPv4).
    let pod_ip_in = ip_counter(&pod_b.netns_path(), "InReceives");
    let target = SocketAddr::from((hosts.addr(1), port_b));
    in_netns(&hosts.netns(1), move || {
        let s = UdpSocket::bind("0.0.0.0:0").expect("bind");
        for i in 0..50u8 {
            s.send_to(&[i; 100], target).expect("send garbage");
            // Chunk 0 of 1 (message i, stride 1388), then a message header; the tag is wrong.
            let mut forged = vec![i; 1400];
            forged[..12].copy_from_slice(&[b'H', b'K', 2, 2, 0, 0, 0, i, 0, 1, 0x05, 0x6c]);
            forged[12..16].copy_from_slice(b"HK\x02\x01");
            s.send_to(&forged, target).expect("send forgery");
            // Chunk 0 of 3 of message 0x300 + i, whose other chunks never come.
            forged[..12].copy_from_slice(&[b'H', b'K', 2, 2, 0, 0, 3, i, 0, 3, 0x05, 0x6c]);
            s.send_to(&forged, target).expect("send a lone chunk");
        }
    });
    eventually("the forged datagrams are counted", || {
        let mut c = client_b.clone();
        let b_stats = b_stats.clone();
        async move {
            let now = tunnel_stats(&mut c).await;
            now.rx_dropped_malformed - b_stats.rx_dropped_malformed == 50
                && now.rx_dropped_auth - b_stats.rx_dropped_auth == 50
                // The forger's address holds 4 messages in progress; each newer one pushes one out.
                && now.rx_dropped_incomplete - b_stats.rx_dropped_incomplete == 46
        }
    })
    .await;
    assert_eq!(ip_counter(&pod_b.netns_path(), "InReceives"), pod_ip_in, "pod B received a packet");
    assert!(pod_a.ping(ip_b), "the tunnel stopped serving after the forgeries");

    // Restart of A's net-forwarder: an open connection survives, the address stays.
    let listener = in_netns(&pod_b.netns_path(), move || TcpListener::bind((ip_b, 0)).expect("bind"));
    let addr = listener.local_addr().expect("addr");
    let echo = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().expect("accept");
        conn.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");
        let mut buf = [0u8; 5];
        for _ in 0..2 {
            conn.read_exact(&mut buf).expect("read");
            conn.write_all(&buf.to_ascii_uppercase()).expect("write");
        }
    });
    let mut conn = in_netns(&pod_a.netns_path(), move || {
        TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect")
    });
    conn.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");
    let mut buf = [0u8; 5];
    conn.write_all(b"first").expect("send");
    conn.read_exact(&mut buf).expect("answer");
    assert_eq!(&buf, b"FIRST");
    server_a.stop();
    let server_a = bubble_a.serve_tunnel(&serve_a).await;
    let mut client_a = server_a.client();
    conn.write_all(b"again").expect("send after restart");
    conn.read_exact(&mut buf).expect("answer after restart");
    assert_eq!(&buf, b"AGAIN");
    echo.join().expect("echo thread");
    let listed = client_a.list(pb::ListRequest {}).await.expect("list").into_inner();
    assert_eq!(listed.attachments.len(), 1);
    assert_eq!(address(&listed.attachments[0]), ip_a, "the pod's address changed at restart");
    assert!(pod_b.ping(ip_a), "pod B cannot reach pod A after the restart");
    server_a.stop();
    server_b.stop();
}

/// Runs `cmd`, which must exit by itself within 20 s (it is killed otherwise).
fn output_within(cmd: &mut Command) -> std::process::Output {
    let child = cmd
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(Duration::from_secs(20)) {
        Ok(out) => out.expect("wait"),
        Err(_) => {
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            panic!("{cmd:?} did not exit within 20 s: it was expected to fail at start");
        }
    }
}

/// Runs `serve` with `args` (after the socket, state and pod CIDR), in a fresh bubble or not,
/// and returns its exit code and stderr; it must exit by itself.
fn serve_exits(in_bubble: bool, args: &[&str]) -> (i32, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cmd = if in_bubble {
        let mut unshare = Command::new("unshare");
        unshare
            .args(["--user", "--map-root-user", "--net", "--mount", "--"])
            .arg(env!("CARGO_BIN_EXE_hpk-net-forwarder"));
        unshare
    } else {
        Command::new(env!("CARGO_BIN_EXE_hpk-net-forwarder"))
    };
    cmd.arg("serve")
        .arg("--socket")
        .arg(dir.path().join("run/nf.sock"))
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .args(["--pod-cidr", CIDR_A])
        .args(args);
    let out = output_within(&mut cmd);
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// `serve` with a tunnel on the bubble's loopback and `args`, in a fresh bubble.
fn serve_fails(args: &[&str]) -> (i32, String) {
    let mut all = vec!["--tunnel-listen", "127.0.0.1:0"];
    all.extend_from_slice(args);
    serve_exits(true, &all)
}

#[test]
fn bad_tunnel_set_ups_fail_clearly() {
    let Some(probe) = bubble() else { return };
    drop(probe);
    let dir = tempfile::tempdir().expect("tempdir");
    let key = gen_key(dir.path());
    let key = key.to_str().expect("utf-8 path");

    let (code, err) = serve_fails(&[]);
    assert!(code != 0 && err.contains("--tunnel-key-file"), "{code}: {err}");

    let open = dir.path().join("open.key");
    std::fs::copy(key, &open).expect("copy");
    std::fs::set_permissions(&open, std::os::unix::fs::PermissionsExt::from_mode(0o644)).expect("chmod");
    let (code, err) = serve_fails(&["--tunnel-key-file", open.to_str().expect("utf-8")]);
    assert!(code != 0 && err.contains("mode 0644") && err.contains("chmod 0600"), "{code}: {err}");

    let (code, err) = serve_fails(&["--tunnel-key-file", key, "--peer", "b=10.244.2.0/24"]);
    assert!(code != 0 && err.contains("NAME=CIDR@ADDRESS:PORT"), "{code}: {err}");

    let (code, err) = serve_exits(true, &["--tunnel-listen", "0.0.0.0:0", "--tunnel-key-file", key]);
    assert!(code != 0 && err.contains("--tunnel-advertise"), "{code}: {err}");

    let (code, err) = serve_fails(&["--tunnel-key-file", key, "--tunnel-fd", "0"]);
    assert!(code != 0 && err.contains("cannot be used with"), "{code}: {err}");

    let (code, err) = serve_exits(false, &["--tunnel-fd", "1000", "--tunnel-key-file", key]);
    assert!(code != 0 && err.contains("no such open descriptor"), "{code}: {err}");

    let again = Command::new(env!("CARGO_BIN_EXE_hpk-net-forwarder"))
        .arg("gen-key")
        .arg(key)
        .output()
        .expect("gen-key");
    assert!(!again.status.success(), "gen-key replaced an existing key");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_peer_overlapping_this_node_is_not_routed() {
    let Some(bubble) = bubble() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let key = gen_key(dir.path());
    let key = key.to_str().expect("utf-8 path");
    let peer_b = format!("b={CIDR_B}@127.0.0.1:9");
    let tunnel = ["--tunnel-listen", "127.0.0.1:0", "--tunnel-key-file", key];
    let peers = ["--peer", "self=10.244.0.0/16@127.0.0.1:9", "--peer", &peer_b];
    let server = bubble.serve_with(CIDR_A, &[&tunnel[..], &peers[..]].concat()).await;
    let routes = server.client().routes(pb::RoutesRequest {}).await.expect("routes").into_inner().routes;
    let nodes: Vec<&str> = routes.iter().map(|r| r.node.as_str()).collect();
    assert_eq!(nodes, ["b"], "{routes:?}");
    assert_eq!(tunnel_stats(&mut server.client()).await.peers_refused, 1);
    assert!(!bubble.routes().iter().any(|r| r.starts_with("10.244.0.0/16")), "{:?}", bubble.routes());
    // A packet for peer b's pod CIDR goes into the tunnel and is counted for b.
    let mut client = server.client();
    in_netns(&bubble.netns_path().display().to_string(), || {
        let s = UdpSocket::bind("0.0.0.0:0").expect("bind");
        s.send_to(b"x", "10.244.2.9:9").expect("send");
    });
    eventually("the packet for peer b is sent", || {
        let mut c = client.clone();
        async move { tunnel_stats(&mut c).await.tx_packets >= 1 }
    })
    .await;
    let stats = tunnel_stats(&mut client).await;
    assert_eq!(stats.peers.len(), 1);
    assert_eq!(stats.peers[0].tx_packets, stats.tx_packets);
    server.stop();
}
