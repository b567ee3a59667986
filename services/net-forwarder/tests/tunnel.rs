//! Two bubbles on two test hosts, each with slirp4netns for egress, joined by the
//! net-forwarder's tunnel: pod ↔ pod across hosts, forged datagrams, restarts, bad set-ups.

mod support;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream, UdpSocket};
use std::process::Command;
use std::time::{Duration, Instant};

use hpk_net_forwarder::tunnel::chunks::Cutter;
use hpk_net_forwarder::tunnel::identity::{Identity, PairKeys, PublicKey};
use hpk_net_forwarder::tunnel::keyfile;
use hpk_net_forwarder::tunnel::wire::{HEADER_LEN, Sealer, TAG_LEN};
use hpk_net_forwarder::tuntap::VNET_HDR_LEN;
use hpk_proto::netforwarder::v1 as pb;
use support::hosts::{
    Hosts, Slirp, TunnelServe, assert_unprivileged, gen_key, gen_unprivileged_key, slirp_available,
};
use support::raw::{Sniffer, Spoofer, udp_packet};
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
    let check = || {
        let holds = f();
        async move { holds.await.then_some(()) }
    };
    hpk_test_support::eventually(what, Duration::from_secs(10), check, String::new).await
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
    let (key_a, public_a) = gen_unprivileged_key(dir.path(), "a.key");
    let (key_b, public_b) = gen_unprivileged_key(dir.path(), "b.key");
    let (bubble_a, bubble_b) = (hosts.bubble(0), hosts.bubble(1));
    let _slirp_a = Slirp::start(&hosts, 0, &bubble_a);
    let _slirp_b = Slirp::start(&hosts, 1, &bubble_b);
    let (port_a, port_b) = (hosts.free_udp_port(0), hosts.free_udp_port(1));
    let serve_a = TunnelServe {
        hosts: &hosts,
        host: 0,
        pod_cidr: CIDR_A,
        port: port_a,
        key: &key_a,
        peers: vec![format!("b={CIDR_B}@{}:{port_b}/{public_b}", hosts.addr(1))],
        metrics: Some("127.0.0.1:9560"),
        queues: None,
    };
    let serve_b = TunnelServe {
        hosts: &hosts,
        host: 1,
        pod_cidr: CIDR_B,
        port: port_b,
        key: &key_b,
        peers: vec![format!("a={CIDR_A}@{}:{port_a}/{public_a}", hosts.addr(0))],
        metrics: None,
        queues: None,
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
    let drops = after.rx_dropped_auth + after.rx_dropped_replay + after.rx_dropped_malformed;
    assert_eq!(drops + after.rx_dropped_spoofed, 0, "{after:?}");
    assert_eq!(after.public_key, public_a, "the key of the file");

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
    // None comes from a peer's endpoint: all dropped before reassembly and counted as spoofed;
    // the pod sees nothing and no reassembly slot is taken.
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
            forged[..12].copy_from_slice(&[b'H', b'K', 3, 2, 0, 0, 0, i, 0, 1, 0x05, 0x6c]);
            forged[12..16].copy_from_slice(b"HK\x03\x01");
            s.send_to(&forged, target).expect("send forgery");
            // Chunk 0 of 3 of message 0x300 + i, whose other chunks never come.
            forged[..12].copy_from_slice(&[b'H', b'K', 3, 2, 0, 0, 3, i, 0, 3, 0x05, 0x6c]);
            s.send_to(&forged, target).expect("send a lone chunk");
        }
    });
    eventually("the forged datagrams are counted", || {
        let mut c = client_b.clone();
        let b_stats = b_stats.clone();
        async move {
            let now = tunnel_stats(&mut c).await;
            now.rx_dropped_spoofed - b_stats.rx_dropped_spoofed == 150
        }
    })
    .await;
    let now = tunnel_stats(&mut client_b).await;
    assert_eq!(
        (now.rx_dropped_malformed, now.rx_dropped_auth, now.rx_dropped_incomplete, now.rx_reassembling),
        (b_stats.rx_dropped_malformed, b_stats.rx_dropped_auth, b_stats.rx_dropped_incomplete, 0),
        "strangers' datagrams reached reassembly or opening: {now:?}"
    );
    assert_eq!(now.rx_senders, 1, "{now:?}");
    assert_eq!(ip_counter(&pod_b.netns_path(), "InReceives"), pod_ip_in, "pod B received a packet");
    assert!(pod_a.ping(ip_b), "the tunnel stopped serving after the forgeries");

    // Restart of A's net-forwarder (with its key file, so B's --peer still names it, and a
    // counter that starts above the last run's): an open connection survives, the address stays.
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
    let (key, public) = gen_key(dir.path(), "tunnel.key");
    let key = key.to_str().expect("utf-8 path");

    // The public key of a private key file, as the other nodes' --peer flags need it.
    let printed = Command::new(env!("CARGO_BIN_EXE_hpk-net-forwarder"))
        .args(["tunnel-public-key", "--private-key-file", key])
        .output()
        .expect("tunnel-public-key");
    assert!(printed.status.success(), "{}", String::from_utf8_lossy(&printed.stderr));
    assert_eq!(String::from_utf8_lossy(&printed.stdout).trim(), public);

    let open = dir.path().join("open.key");
    std::fs::copy(key, &open).expect("copy");
    std::fs::set_permissions(&open, std::os::unix::fs::PermissionsExt::from_mode(0o640)).expect("chmod");
    let open = open.to_str().expect("utf-8");
    let (code, err) = serve_fails(&["--tunnel-private-key-file", open]);
    assert!(code != 0 && err.contains("mode 0640") && err.contains("chmod 0600"), "{code}: {err}");
    let out = Command::new(env!("CARGO_BIN_EXE_hpk-net-forwarder"))
        .args(["tunnel-public-key", "--private-key-file", open])
        .output()
        .expect("tunnel-public-key");
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("mode 0640"));

    // A peer without a key, with a key in capitals, with a low-order key.
    let (code, err) = serve_fails(&["--peer", "b=10.244.2.0/24@127.0.0.1:9"]);
    assert!(code != 0 && err.contains("NAME=CIDR@ADDRESS:PORT/PUBLIC-KEY"), "{code}: {err}");
    let upper = format!("b=10.244.2.0/24@127.0.0.1:9/{}", public.to_uppercase());
    let (code, err) = serve_fails(&["--peer", &upper]);
    assert!(code != 0 && err.contains("64 lowercase hexadecimal digits"), "{code}: {err}");
    let low = format!("b=10.244.2.0/24@127.0.0.1:9/{}", "00".repeat(32));
    let (code, err) = serve_fails(&["--peer", &low]);
    assert!(code != 0 && err.contains("low-order"), "{code}: {err}");

    let (code, err) = serve_exits(true, &["--tunnel-listen", "0.0.0.0:0", "--tunnel-private-key-file", key]);
    assert!(code != 0 && err.contains("--tunnel-advertise"), "{code}: {err}");

    // Queues: 1 to 16; descriptors: a comma-separated list, each named once.
    for q in ["0", "17", "many"] {
        let (code, err) = serve_fails(&["--tunnel-queues", q]);
        assert!(code != 0 && err.contains("--tunnel-queues"), "{q}: {code}: {err}");
    }
    let (code, err) = serve_exits(false, &["--tunnel-fd", "1000,1000"]);
    assert!(code != 0 && err.contains("named twice"), "{code}: {err}");
    let (code, err) = serve_exits(false, &["--tunnel-fd", "3,x"]);
    assert!(code != 0 && err.contains("--tunnel-fd"), "{code}: {err}");
    let out = Command::new(env!("CARGO_BIN_EXE_hpk-net-forwarder"))
        .args(["tunnel-socket", "--bind", "127.0.0.1:0", "--queues", "0", "--", "true"])
        .output()
        .expect("tunnel-socket");
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("--queues"));

    let (code, err) = serve_fails(&["--tunnel-private-key-file", key, "--tunnel-fd", "0"]);
    assert!(code != 0 && err.contains("cannot be used with"), "{code}: {err}");

    // Run in this (the host's) network namespace: a refused start changes nothing there
    // (it once left the pod CIDR's first address on the host's lo).
    let lo = || {
        let out =
            Command::new("ip").args(["-4", "-o", "addr", "show", "dev", "lo"]).output().expect("ip addr");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let before = lo();
    let (code, err) = serve_exits(false, &["--tunnel-fd", "1000"]);
    let after = lo();
    if after != before {
        let _ = Command::new("ip").args(["addr", "del", "10.244.1.1/32", "dev", "lo"]).status();
    }
    assert_eq!(after, before, "a refused start changed the host's lo");
    assert!(code != 0 && err.contains("no such open descriptor"), "{code}: {err}");

    let again = Command::new(env!("CARGO_BIN_EXE_hpk-net-forwarder"))
        .arg("tunnel-private-key")
        .arg(key)
        .output()
        .expect("tunnel-private-key");
    assert!(!again.status.success(), "tunnel-private-key replaced an existing key");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_peer_overlapping_this_node_is_not_routed() {
    let Some(bubble) = bubble() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let (_, public_b) = gen_key(dir.path(), "b.key");
    let (_, public_self) = gen_key(dir.path(), "self.key");
    let peer_b = format!("b={CIDR_B}@127.0.0.1:9/{public_b}");
    let peer_self = format!("self=10.244.0.0/16@127.0.0.1:10/{public_self}");
    // No key file: the key pair is made in memory.
    let tunnel = ["--tunnel-listen", "127.0.0.1:0"];
    let peers = ["--peer", &peer_self, "--peer", &peer_b];
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

/// A one-chunk tunnel datagram carrying a UDP packet `src` → `dst`, sealed with `keys` by
/// `sealer`: what a node with those keys would send.
fn sealed(sealer: &mut Sealer, keys: &PairKeys, src: Ipv4Addr, dst: SocketAddrV4, data: &[u8]) -> Vec<u8> {
    let packet = udp_packet(SocketAddrV4::new(src, 4242), dst, data);
    let payload = VNET_HDR_LEN + packet.len();
    let mut message = vec![0u8; HEADER_LEN + payload + TAG_LEN];
    message[HEADER_LEN + VNET_HDR_LEN..HEADER_LEN + payload].copy_from_slice(&packet);
    let sealed = sealer.seal(&keys.seal, &mut message, payload).expect("seal");
    message.truncate(sealed.len);
    let id = hpk_net_forwarder::tunnel::chunks::message_id(sealed.counter, 0);
    let mut datagram = Cutter::new(1500).expect("MTU").header(id, 0, 1).to_vec();
    datagram.extend_from_slice(&message);
    datagram
}

/// The attacks of the security review's H1 and M5 on a running tunnel A → B: a genuine datagram
/// captured on the wire and replayed from other addresses and from its sender's own, one sealed
/// by a node not in the table, one sealed by the genuine peer A but carrying a packet from
/// outside A's pod CIDR, one with A's key id and a forged tag, and lone first chunks from
/// strangers. None reaches the pod, each is counted for what it is, and B keeps no state for
/// any of them; genuine traffic carries on.
#[tokio::test(flavor = "multi_thread")]
async fn replayed_and_spoofed_datagrams_are_neither_delivered_nor_stored() {
    let Some(probe) = bubble() else { return };
    drop(probe);
    let hosts = Hosts::pair();
    let dir = tempfile::tempdir().expect("tempdir");
    let (key_a, public_a) = gen_unprivileged_key(dir.path(), "a.key");
    let (key_b, public_b) = gen_unprivileged_key(dir.path(), "b.key");
    let (bubble_a, bubble_b) = (hosts.bubble(0), hosts.bubble(1));
    let (port_a, port_b) = (hosts.free_udp_port(0), hosts.free_udp_port(1));
    let serve_a = TunnelServe {
        hosts: &hosts,
        host: 0,
        pod_cidr: CIDR_A,
        port: port_a,
        key: &key_a,
        peers: vec![format!("b={CIDR_B}@{}:{port_b}/{public_b}", hosts.addr(1))],
        metrics: None,
        queues: None,
    };
    let serve_b = TunnelServe {
        hosts: &hosts,
        host: 1,
        pod_cidr: CIDR_B,
        port: port_b,
        key: &key_b,
        peers: vec![format!("a={CIDR_A}@{}:{port_a}/{public_a}", hosts.addr(0))],
        metrics: None,
        queues: None,
    };
    let (endpoint_a, endpoint_b) = (serve_a.endpoint(), serve_b.endpoint());
    let server_a = bubble_a.serve_tunnel(&serve_a).await;
    let server_b = bubble_b.serve_tunnel(&serve_b).await;
    let (mut client_a, mut client_b) = (server_a.client(), server_b.client());
    let (pod_a, pod_b) = (bubble_a.pod(), bubble_b.pod());
    let ip_a = address(&attach(&mut client_a, "pod-a", &pod_a).await);
    let ip_b = address(&attach(&mut client_b, "pod-b", &pod_b).await);
    assert!(pod_a.ping(ip_b), "pod A cannot ping pod B");

    // A UDP service in pod B, and a genuine datagram to it from pod A, captured on host B.
    let service = in_netns(&pod_b.netns_path(), move || UdpSocket::bind((ip_b, 0)).expect("bind"));
    service.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    let service_addr = match service.local_addr().expect("addr") {
        SocketAddr::V4(a) => a,
        other => panic!("{other}"),
    };
    let sniffer = in_netns(&hosts.netns(1), Sniffer::new);
    let capture = std::thread::spawn(move || {
        sniffer.capture(Duration::from_secs(5), |d| {
            d.from == endpoint_a
                && d.to == endpoint_b
                && d.payload.starts_with(b"HK\x03\x02")
                && d.payload[9] == 1
        })
    });
    in_netns(&pod_a.netns_path(), move || {
        let s = UdpSocket::bind((ip_a, 0)).expect("bind");
        s.send_to(b"genuine", service_addr).expect("send");
    });
    let mut buf = [0u8; 2048];
    let (n, _) = service.recv_from(&mut buf).expect("the genuine datagram arrives");
    assert_eq!(&buf[..n], b"genuine");
    let captured = capture.join().expect("capture thread").expect("the tunnel datagram A → B on the wire");

    // B counts a packet just after writing it into the bubble, so the genuine datagram can be
    // in pod B before B's counter has it: B's counters are read once they hold all A sent (two
    // pings and the datagram), so that any packet B counts from here on is an attack's.
    let before = {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let (a, b) = (tunnel_stats(&mut client_a).await, tunnel_stats(&mut client_b).await);
            if a.tx_packets >= 3 && b.rx_packets == a.tx_packets {
                break b;
            }
            assert!(Instant::now() < deadline, "B's counters never caught up with what A sent: {a:?} {b:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let pod_ip_in = ip_counter(&pod_b.netns_path(), "InReceives");
    let spoofer = in_netns(&hosts.netns(0), Spoofer::new);
    let lan = |host: u8| {
        let o = hosts.addr(0).octets();
        Ipv4Addr::new(o[0], o[1], o[2], host)
    };

    // (a) The capture replayed from 10 other sources: A's address with other ports, and other
    // addresses with A's port. Before, each new address got fresh replay state and a delivery.
    for i in 0..5u16 {
        spoofer.send(SocketAddrV4::new(*endpoint_a.ip(), 20_000 + i), endpoint_b, &captured.payload);
        spoofer.send(SocketAddrV4::new(lan(100 + i as u8), port_a), endpoint_b, &captured.payload);
    }
    // (b) The capture replayed from its genuine source, three times.
    for _ in 0..3 {
        spoofer.send(endpoint_a, endpoint_b, &captured.payload);
    }
    // (c) Sealed correctly for B, by a node that is not in B's table, from A's endpoint.
    let stranger = Identity::generate().expect("a key pair");
    let b_key = PublicKey::parse(&public_b).expect("B's key");
    let mut sealer = Sealer::new(stranger.public().key_id(), 0);
    let keys = stranger.pair(&b_key).expect("keys");
    spoofer.send(endpoint_a, endpoint_b, &sealed(&mut sealer, &keys, ip_a, service_addr, b"stranger"));
    // (d) Sealed by A itself (its key file), from A's endpoint, but from outside A's pod CIDR:
    // a node impersonating another node's pod (a DNS answer, say).
    let a = keyfile::parse(&std::fs::read_to_string(&key_a).expect("A's key")).expect("parse");
    assert_eq!(a.public().to_string(), public_a);
    // A's run counts from its start time; the capture says where it is. Ahead of it, so that
    // the window would take the message, and nothing else refuses it but the source check.
    let mut counter = [0u8; 8];
    counter.copy_from_slice(&captured.payload[12 + 12..12 + 20]);
    let counter = u64::from_be_bytes(counter);
    let mut sealer = Sealer::new(a.public().key_id(), counter + 1_000_000);
    let keys = a.pair(&b_key).expect("keys");
    let outside = Ipv4Addr::new(10, 244, 9, 9);
    spoofer.send(endpoint_a, endpoint_b, &sealed(&mut sealer, &keys, outside, service_addr, b"spoofed pod"));
    // (e) A's key id and a fresh counter, but a tag made without A's key.
    let mut forged = captured.payload.clone();
    forged[12 + 12..12 + 20].copy_from_slice(&(counter + 2_000_000).to_be_bytes());
    spoofer.send(endpoint_a, endpoint_b, &forged);
    // (f) First chunks of 3 from strangers: before, each took a reassembly slot.
    for i in 0..4u8 {
        let mut lone = captured.payload.clone();
        lone[4..12].copy_from_slice(&[0, 0, 7, i, 0, 3, 0, 4]);
        lone.truncate(16);
        spoofer.send(SocketAddrV4::new(lan(120 + i), 40_000), endpoint_b, &lone);
    }

    let want = |s: &pb::TunnelStats| {
        (
            s.rx_dropped_spoofed - before.rx_dropped_spoofed,
            s.rx_dropped_replay - before.rx_dropped_replay,
            s.rx_dropped_auth - before.rx_dropped_auth,
        )
    };
    // (spoofed: 10 replays, the stranger, the packet from outside A's CIDR, 4 lone chunks;
    // replays: 3; auth: the forged tag)
    let expected = (10 + 1 + 1 + 4, 3, 1);
    let deadline = Instant::now() + Duration::from_secs(10);
    let after = loop {
        let now = tunnel_stats(&mut client_b).await;
        if want(&now) == expected {
            break now;
        }
        assert!(
            Instant::now() < deadline,
            "(spoofed, replay, auth) {:?}, want {expected:?}: {now:?}",
            want(&now)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(after.rx_packets, before.rx_packets, "an attack datagram was delivered: {after:?}");
    assert_eq!(
        (after.rx_dropped_malformed, after.rx_dropped_incomplete),
        (before.rx_dropped_malformed, before.rx_dropped_incomplete),
        "{after:?}"
    );
    // No state for any of it: one sender (A), nothing in reassembly, the peer table as it was.
    assert_eq!((after.rx_senders, after.rx_reassembling, after.peers.len()), (1, 0, 1), "{after:?}");
    assert_eq!(after.peers[0].public_key, public_a);
    // Pod B received none of it.
    service.set_read_timeout(Some(Duration::from_millis(500))).expect("timeout");
    if let Ok((n, from)) = service.recv_from(&mut buf) {
        panic!("pod B received {:?} from {from}", String::from_utf8_lossy(&buf[..n]));
    }
    assert_eq!(ip_counter(&pod_b.netns_path(), "InReceives"), pod_ip_in, "pod B received a packet");

    // Genuine traffic carries on, A's window untouched by what was refused.
    in_netns(&pod_a.netns_path(), move || {
        let s = UdpSocket::bind((ip_a, 0)).expect("bind");
        s.send_to(b"after", service_addr).expect("send");
    });
    service.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    let (n, _) = service.recv_from(&mut buf).expect("genuine traffic after the attacks");
    assert_eq!(&buf[..n], b"after");
    assert!(pod_b.ping(ip_a) && pod_a.ping(ip_b), "the tunnel stopped serving after the attacks");
    server_a.stop();
    server_b.stop();
}

/// Two hosts' bubbles with slirp4netns, their keys and their tunnel's start (`queues` each).
struct TwoNodes {
    hosts: Hosts,
    _dir: tempfile::TempDir,
    keys: [(std::path::PathBuf, String); 2],
    ports: [u16; 2],
}

impl TwoNodes {
    /// `None` when the prerequisites are missing (said why on stderr).
    fn new() -> Option<Self> {
        let probe = bubble()?;
        drop(probe);
        if !slirp_available() {
            return None;
        }
        let hosts = Hosts::pair();
        let dir = tempfile::tempdir().expect("tempdir");
        let keys = [gen_unprivileged_key(dir.path(), "a.key"), gen_unprivileged_key(dir.path(), "b.key")];
        let ports = [hosts.free_udp_port(0), hosts.free_udp_port(1)];
        Some(TwoNodes { hosts, _dir: dir, keys, ports })
    }

    fn serve(&self, i: usize, queues: u32) -> TunnelServe<'_> {
        let other = 1 - i;
        let (name, cidr) = [("a", CIDR_A), ("b", CIDR_B)][other];
        let peer =
            format!("{name}={cidr}@{}:{}/{}", self.hosts.addr(other), self.ports[other], self.keys[other].1);
        TunnelServe {
            hosts: &self.hosts,
            host: i,
            pod_cidr: [CIDR_A, CIDR_B][i],
            port: self.ports[i],
            key: &self.keys[i].0,
            peers: vec![peer],
            metrics: None,
            queues: Some(queues),
        }
    }
}

/// Names of the threads of process `pid` that used CPU (utime + stime > 0).
fn busy_threads(pid: u32) -> Vec<String> {
    let mut busy = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).expect("tasks").flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else { continue };
        let Some((name, rest)) = stat.split_once(" (").and_then(|(_, r)| r.rsplit_once(") ")) else {
            continue;
        };
        let f: Vec<u64> = rest.split_whitespace().filter_map(|v| v.parse().ok()).collect();
        // After the name: state, then fields 4.. of stat(5); utime and stime are 14 and 15.
        if f.len() > 12 && f[10] + f[11] > 0 {
            busy.push(name.to_owned());
        }
    }
    busy
}

#[tokio::test(flavor = "multi_thread")]
async fn with_several_queues_each_flow_arrives_in_order() {
    let Some(nodes) = TwoNodes::new() else { return };
    let (bubble_a, bubble_b) = (nodes.hosts.bubble(0), nodes.hosts.bubble(1));
    let _slirp = (Slirp::start(&nodes.hosts, 0, &bubble_a), Slirp::start(&nodes.hosts, 1, &bubble_b));
    let server_a = bubble_a.serve_tunnel(&nodes.serve(0, 4)).await;
    let server_b = bubble_b.serve_tunnel(&nodes.serve(1, 4)).await;
    let (mut client_a, mut client_b) = (server_a.client(), server_b.client());
    let (pod_a, pod_b) = (bubble_a.pod(), bubble_b.pod());
    let ip_a = address(&attach(&mut client_a, "pod-a", &pod_a).await);
    let ip_b = address(&attach(&mut client_b, "pod-b", &pod_b).await);
    assert!(pod_a.ping(ip_b), "pod A cannot ping pod B");

    // 16 UDP flows from pod A to pod B, each numbering its datagrams; the kernel spreads the
    // flows over A's 4 queues, A's lanes spread them over B's 4 receiving sockets.
    const FLOWS: usize = 16;
    const PER_FLOW: u32 = 3_000;
    let sink = in_netns(&pod_b.netns_path(), move || UdpSocket::bind((ip_b, 0)).expect("bind"));
    let to = sink.local_addr().expect("addr");
    sink.set_read_timeout(Some(Duration::from_secs(2))).expect("timeout");
    let receiver = std::thread::spawn(move || {
        let mut last: std::collections::HashMap<u16, u32> = Default::default();
        let (mut got, mut reordered) = (0u32, Vec::new());
        let mut buf = [0u8; 2048];
        while let Ok((n, from)) = sink.recv_from(&mut buf) {
            assert!(n >= 4, "a short datagram");
            let seq = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]);
            if let Some(prev) = last.insert(from.port(), seq).filter(|&p| p >= seq) {
                reordered.push((from.port(), prev, seq));
            }
            got += 1;
        }
        (got, last.len(), reordered)
    });
    in_netns(&pod_a.netns_path(), move || {
        let flows: Vec<UdpSocket> = (0..FLOWS).map(|_| UdpSocket::bind((ip_a, 0)).expect("bind")).collect();
        let mut payload = [0x33u8; 1200];
        for seq in 0..PER_FLOW {
            payload[..4].copy_from_slice(&seq.to_be_bytes());
            for f in &flows {
                // A full socket buffer drops (counted as lost below), it does not reorder.
                let _ = f.send_to(&payload, to);
            }
            // Paced (some 600 Mbit/s at most) so that most arrive.
            if seq % 4 == 3 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    });
    let (got, flows_seen, reordered) = receiver.join().expect("receiver");
    let sent = FLOWS as u32 * PER_FLOW;
    assert!(
        reordered.is_empty(),
        "{} of {got} datagrams arrived before an earlier one of their flow: {:?}",
        reordered.len(),
        &reordered[..reordered.len().min(10)]
    );
    assert_eq!(flows_seen, FLOWS);
    assert!(got >= sent / 4, "only {got} of {sent} datagrams arrived");
    // A TCP stream too: whole and in order (the kernel would count reordering as loss).
    const BULK: usize = 16 << 20;
    assert_eq!(bulk(&pod_b.netns_path(), ip_b, &pod_a.netns_path(), BULK), BULK);
    let (a, b) = (tunnel_stats(&mut client_a).await, tunnel_stats(&mut client_b).await);
    for s in [&a, &b] {
        let drops = s.rx_dropped_auth + s.rx_dropped_replay + s.rx_dropped_malformed + s.rx_dropped_spoofed;
        assert_eq!(drops + s.rx_dropped_incomplete, 0, "{s:?}");
    }
    // The queues were used: more than one sending thread on A, receiving thread on B.
    let sending = busy_threads(server_a.pid()).into_iter().filter(|t| t.starts_with("tunnel-tx-")).count();
    let receiving = busy_threads(server_b.pid()).into_iter().filter(|t| t.starts_with("tunnel-rx-")).count();
    eprintln!(
        "{got} of {sent} datagrams arrived, in order; busy threads: {sending} sending on A, {receiving} receiving on B"
    );
    assert!(sending > 1 && receiving > 1, "{sending} sending threads on A, {receiving} receiving on B");
    server_a.stop();
    server_b.stop();
}

#[tokio::test(flavor = "multi_thread")]
async fn throughput_recovers_when_the_peer_restarts_mid_stream() {
    let Some(nodes) = TwoNodes::new() else { return };
    let (bubble_a, bubble_b) = (nodes.hosts.bubble(0), nodes.hosts.bubble(1));
    let _slirp = (Slirp::start(&nodes.hosts, 0, &bubble_a), Slirp::start(&nodes.hosts, 1, &bubble_b));
    let (serve_a, serve_b) = (nodes.serve(0, 2), nodes.serve(1, 2));
    let server_a = bubble_a.serve_tunnel(&serve_a).await;
    let server_b = bubble_b.serve_tunnel(&serve_b).await;
    let (mut client_a, mut client_b) = (server_a.client(), server_b.client());
    let (pod_a, pod_b) = (bubble_a.pod(), bubble_b.pod());
    let _ip_a = address(&attach(&mut client_a, "pod-a", &pod_a).await);
    let ip_b = address(&attach(&mut client_b, "pod-b", &pod_b).await);
    assert!(pod_a.ping(ip_b), "pod A cannot ping pod B");

    // One TCP stream A → B for 8 s; the receiver counts its bytes per 100 ms.
    const RUN: Duration = Duration::from_secs(8);
    let listener = in_netns(&pod_b.netns_path(), move || TcpListener::bind((ip_b, 0)).expect("bind"));
    let addr = listener.local_addr().expect("addr");
    let start = Instant::now();
    let sink = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().expect("accept");
        conn.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");
        let mut buckets = vec![0u64; 200];
        let mut buf = vec![0u8; 1 << 16];
        loop {
            match conn.read(&mut buf) {
                Ok(0) => return buckets,
                Ok(n) => buckets[(start.elapsed().as_millis() / 100).min(199) as usize] += n as u64,
                Err(e) => panic!("the stream broke: {e}"),
            }
        }
    });
    let source = std::thread::spawn({
        let netns = pod_a.netns_path();
        move || {
            let mut conn = in_netns(&netns, move || {
                TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect")
            });
            let chunk = vec![0x5au8; 1 << 16];
            while start.elapsed() < RUN {
                conn.write_all(&chunk).expect("the stream broke");
            }
        }
    });
    // B's net-forwarder restarts 2.5 s in (same key file; its counter starts above the last
    // run's), while the stream runs.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let replays = tunnel_stats(&mut client_a).await.rx_dropped_replay;
    server_b.stop();
    let server_b = bubble_b.serve_tunnel(&serve_b).await;
    let back = start.elapsed();
    source.join().expect("source");
    let buckets = sink.join().expect("sink");
    let rate = |from: Duration, to: Duration| {
        let (a, b) = ((from.as_millis() / 100) as usize, (to.as_millis() / 100) as usize);
        buckets[a..b].iter().sum::<u64>() as f64 * 8.0 / (to - from).as_secs_f64() / 1e9
    };
    let before = rate(Duration::from_millis(500), Duration::from_millis(2_500));
    // A second for TCP to retransmit what was lost while B was down, then the rest.
    let after = rate(back + Duration::from_secs(1), RUN);
    eprintln!("before the restart {before:.2} Gbit/s, after {after:.2} Gbit/s (B was back {back:?} in)");
    assert!(RUN > back + Duration::from_secs(2), "the restart took until {back:?}");
    assert!(after >= before * 0.3, "throughput collapsed after the restart: {before:.2} → {after:.2} Gbit/s");
    let a = tunnel_stats(&mut client_a).await;
    assert_eq!(a.rx_dropped_replay, replays, "the restarted peer's messages were refused as replays: {a:?}");
    let b = tunnel_stats(&mut server_b.client()).await;
    assert_eq!(b.rx_dropped_auth + b.rx_dropped_replay + b.rx_dropped_spoofed, 0, "{b:?}");
    server_a.stop();
    server_b.stop();
}
