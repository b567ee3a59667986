//! The receiver's table: what a sender must be, and that nothing else leaves state.

use super::*;
use crate::tunnel::identity::Identity;
use crate::tunnel::wire::{HEADER_LEN, Sealer, TAG_LEN, WINDOW};
use crate::tuntap::VNET_HDR_LEN;

const OWN: &str = "10.244.1.0/24";

/// A node of these tests: its identity, pod CIDR and endpoint.
struct Node {
    id: Identity,
    cidr: PodCidr,
    endpoint: SocketAddrV4,
    sealer: Sealer,
}

fn node(seed: u8) -> Node {
    let id = Identity::from_secret([seed; 32]);
    let sealer = Sealer::new(id.public().key_id(), 0);
    Node {
        id,
        cidr: format!("10.244.{seed}.0/24").parse().unwrap(),
        endpoint: SocketAddrV4::new([10, 250, 0, seed].into(), 4789),
        sealer,
    }
}

fn as_peer(n: &Node) -> Peer {
    Peer { node: format!("n{}", n.cidr), pod_cidr: n.cidr, endpoint: n.endpoint, public_key: n.id.public() }
}

/// The receiver `me`'s routes to `peers`.
fn routes(me: &Identity, peers: &[&Node]) -> Vec<Route> {
    peers
        .iter()
        .map(|p| Route {
            peer: as_peer(p),
            counters: Arc::default(),
            keys: Arc::new(me.pair(&p.id.public()).unwrap()),
        })
        .collect()
}

/// A message from `from` to `to` carrying an IPv4 packet `src` → `dst`.
fn message(from: &mut Node, to: &Identity, src: [u8; 4], dst: [u8; 4]) -> Vec<u8> {
    let mut packet = vec![0u8; VNET_HDR_LEN + 20];
    packet[VNET_HDR_LEN] = 0x45;
    packet[VNET_HDR_LEN + SRC..VNET_HDR_LEN + SRC + 4].copy_from_slice(&src);
    packet[VNET_HDR_LEN + DST..VNET_HDR_LEN + DST + 4].copy_from_slice(&dst);
    let mut buf = vec![0; HEADER_LEN + packet.len() + TAG_LEN];
    buf[HEADER_LEN..HEADER_LEN + packet.len()].copy_from_slice(&packet);
    let key = from.id.pair(&to.public()).unwrap();
    let n = from.sealer.seal(&key.seal, &mut buf, packet.len()).unwrap().len;
    buf.truncate(n);
    buf
}

/// A message from `n` for a pod of this node, from a pod of `n`.
fn genuine(n: &mut Node, me: &Identity) -> Vec<u8> {
    let seed = n.cidr.network().octets()[2];
    message(n, me, [10, 244, seed, 5], [10, 244, 1, 7])
}

fn own() -> PodCidr {
    OWN.parse().unwrap()
}

fn from(n: &Node) -> SocketAddr {
    SocketAddr::V4(n.endpoint)
}

#[test]
fn a_peer_is_received_once_per_message() {
    let me = Identity::from_secret([1; 32]);
    let mut a = node(2);
    let mut senders = Senders::new();
    senders.replace(&routes(&me, &[&a]));
    let d = genuine(&mut a, &me);
    let got = senders.receive(from(&a), &mut d.clone(), own()).expect("delivered");
    assert_eq!(got.range.len(), VNET_HDR_LEN + 20);
    assert_eq!(senders.receive(from(&a), &mut d.clone(), own()).err(), Some(Refused::Replay));
    assert_eq!(senders.at(from(&a)), Some(true), "it has delivered: trusted");
}

#[test]
fn a_replay_from_anywhere_else_is_refused_and_leaves_no_state() {
    let me = Identity::from_secret([1; 32]);
    let mut a = node(2);
    let mut senders = Senders::new();
    senders.replace(&routes(&me, &[&a]));
    let d = genuine(&mut a, &me);
    for port in 1..=10 {
        let elsewhere = SocketAddr::from(([10, 250, 0, 2], 4789 + port));
        assert_eq!(senders.at(elsewhere), None, "no reassembly for a stranger");
        assert_eq!(senders.receive(elsewhere, &mut d.clone(), own()).err(), Some(Refused::Spoofed));
    }
    assert_eq!(senders.len(), 1);
    // And the genuine message was not consumed by the refusals.
    assert!(senders.receive(from(&a), &mut d.clone(), own()).is_ok());
}

#[test]
fn an_unknown_sender_is_refused_and_leaves_no_state() {
    let me = Identity::from_secret([1; 32]);
    let (a, mut stranger) = (node(2), node(3));
    let mut senders = Senders::new();
    senders.replace(&routes(&me, &[&a]));
    // Sealed correctly for this node, but by a node not in the table, even from a peer's address.
    let d = genuine(&mut stranger, &me);
    for addr in [from(&stranger), from(&a)] {
        assert_eq!(senders.receive(addr, &mut d.clone(), own()).err(), Some(Refused::Spoofed));
    }
    assert_eq!(senders.len(), 1);
    assert_eq!(senders.at(from(&stranger)), None);
}

#[test]
fn a_peer_must_send_from_its_endpoint_under_its_own_key() {
    let me = Identity::from_secret([1; 32]);
    let (mut a, b) = (node(2), node(3));
    let mut senders = Senders::new();
    senders.replace(&routes(&me, &[&a, &b]));
    let d = genuine(&mut a, &me);
    assert_eq!(
        senders.receive(from(&b), &mut d.clone(), own()).err(),
        Some(Refused::Spoofed),
        "A's message from B"
    );
    assert!(senders.receive(from(&a), &mut d.clone(), own()).is_ok());
}

#[test]
fn a_packet_from_outside_the_senders_pod_cidr_is_refused_and_not_recorded() {
    let me = Identity::from_secret([1; 32]);
    let (mut a, b) = (node(2), node(3));
    let mut senders = Senders::new();
    senders.replace(&routes(&me, &[&a, &b]));
    // Authentic from A, but claiming to come from one of B's pods, or from anywhere.
    for src in [[10, 244, 3, 5], [10, 244, 1, 9], [8, 8, 8, 8]] {
        let mut d = message(&mut a, &me, src, [10, 244, 1, 7]);
        assert_eq!(senders.receive(from(&a), &mut d, own()).err(), Some(Refused::Spoofed), "{src:?}");
    }
    // Not for this node: malformed, as before.
    let mut d = message(&mut a, &me, [10, 244, 2, 5], [10, 244, 3, 7]);
    assert_eq!(senders.receive(from(&a), &mut d, own()).err(), Some(Refused::Malformed));
    assert_eq!(senders.at(from(&a)), Some(false), "nothing delivered yet");
    // A refused message did not move the window: an earlier counter still opens.
    let mut early = node(2);
    let mut d = genuine(&mut early, &me);
    assert!(
        senders.receive(from(&a), &mut d, own()).is_ok(),
        "counter 1 again: its refusals recorded nothing"
    );
}

#[test]
fn a_peer_removed_from_the_table_is_refused() {
    let me = Identity::from_secret([1; 32]);
    let (mut a, b) = (node(2), node(3));
    let mut senders = Senders::new();
    senders.replace(&routes(&me, &[&a, &b]));
    senders.replace(&routes(&me, &[&b]));
    let mut d = genuine(&mut a, &me);
    assert_eq!(senders.receive(from(&a), &mut d, own()).err(), Some(Refused::Spoofed));
    assert_eq!(senders.at(from(&a)), None);
    assert_eq!(senders.len(), 1);
}

#[test]
fn the_window_survives_a_table_change_while_the_key_is_unchanged() {
    let me = Identity::from_secret([1; 32]);
    let (mut a, b) = (node(2), node(3));
    let mut senders = Senders::new();
    senders.replace(&routes(&me, &[&a]));
    let d = genuine(&mut a, &me);
    assert!(senders.receive(from(&a), &mut d.clone(), own()).is_ok());
    // B joins; A is unchanged: A's delivered message is still a replay.
    senders.replace(&routes(&me, &[&a, &b]));
    assert_eq!(senders.receive(from(&a), &mut d.clone(), own()).err(), Some(Refused::Replay));
    // A restarts with a new key pair (and the same endpoint): a new sender, a new window, and
    // its old run's messages carry a key id nobody holds any more.
    let mut a2 = Node { id: Identity::from_secret([42; 32]), ..node(2) };
    a2.sealer = Sealer::new(a2.id.public().key_id(), 0);
    senders.replace(&routes(&me, &[&a2, &b]));
    assert_eq!(senders.receive(from(&a), &mut d.clone(), own()).err(), Some(Refused::Spoofed));
    assert!(senders.receive(from(&a2), &mut genuine(&mut a2, &me), own()).is_ok());
}

#[test]
fn the_state_is_bounded_by_the_peer_table() {
    let me = Identity::from_secret([1; 32]);
    let mut a = node(2);
    let mut senders = Senders::new();
    senders.replace(&routes(&me, &[&a]));
    // Thousands of messages, genuine ones replayed and forgeries, from thousands of addresses.
    let ds: Vec<Vec<u8>> = (0..WINDOW + 10).map(|_| genuine(&mut a, &me)).collect();
    for (i, d) in ds.iter().enumerate() {
        let addr = SocketAddr::from(([10, 250, (i >> 8) as u8, i as u8], 1000 + i as u16));
        let _ = senders.receive(addr, &mut d.clone(), own());
        let mut forged = d.clone();
        forged[HEADER_LEN] ^= 1;
        assert_eq!(senders.receive(from(&a), &mut forged, own()).err(), Some(Refused::Auth));
    }
    assert_eq!(senders.len(), 1);
    // Out of order within the window, from the right address: all delivered once.
    for d in ds.iter().rev().take(WINDOW as usize) {
        assert!(senders.receive(from(&a), &mut d.clone(), own()).is_ok());
    }
    assert_eq!(senders.receive(from(&a), &mut ds[0].clone(), own()).err(), Some(Refused::Replay), "too old");
}
