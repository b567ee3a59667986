//! The receiver's state: one entry per authenticated sender, which is to say per current peer.
//!
//! Each entry is a peer of the table ([`super::Tunnel::set_peers`]) with the key that opens its
//! messages and the window of its counters. Nothing is ever added for a datagram: a message
//! from an address that is no peer's endpoint, with a key id no peer has, or with the key id of
//! another peer than the one at that address, is refused before any state is looked at; a
//! message whose packet's source is outside the sender's pod CIDR (cryptokey routing, as
//! WireGuard does it) or whose destination is not this node's is refused after opening, and
//! leaves the window as it was. The table is therefore bounded by the peer table, and a
//! captured datagram replayed from anywhere is either a stranger's or a replay.

use std::collections::HashMap;
use std::net::{SocketAddr, SocketAddrV4};
use std::ops::Range;
use std::sync::Arc;

use super::identity::{KeyId, PairKeys};
use super::wire::{self, Header, Refused, Window};
use super::{DST, PeerCounters, Route, SRC, ipv4_field};
use crate::cidr::PodCidr;
use crate::peers::Peer;

/// One authenticated sender.
struct Sender {
    peer: Peer,
    keys: Arc<PairKeys>,
    window: Window,
    /// It has delivered a message (its reassembly slots are kept over a stranger's).
    authentic: bool,
    counters: Arc<PeerCounters>,
}

/// A message that was opened and may be delivered.
pub struct Delivered {
    /// The payload's place in the message.
    pub range: Range<usize>,
    /// The sender's counters.
    pub counters: Arc<PeerCounters>,
}

/// The senders this node accepts messages from: the current peers, by key id and by endpoint.
#[derive(Default)]
pub struct Senders {
    by_id: HashMap<KeyId, Sender>,
    by_endpoint: HashMap<SocketAddrV4, KeyId>,
}

impl Senders {
    /// No peers: every message is refused.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many senders have state.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Whether no sender has state.
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// Replaces the senders by the peers of `routes`. A peer whose public key is unchanged
    /// keeps its window, so that its messages already delivered cannot be replayed after a
    /// change of the table; a peer that leaves takes its state with it. Two peers with the
    /// same key id or endpoint ([`crate::peers::validate`] refuses them) keep the first.
    pub fn replace(&mut self, routes: &[Route]) {
        let mut by_id = HashMap::with_capacity(routes.len());
        let mut by_endpoint = HashMap::with_capacity(routes.len());
        for r in routes {
            let id = r.peer.public_key.key_id();
            if by_id.contains_key(&id) || by_endpoint.contains_key(&r.peer.endpoint) {
                continue;
            }
            let (window, authentic) = match self.by_id.remove(&id) {
                Some(old) if old.peer.public_key == r.peer.public_key => (old.window, old.authentic),
                _ => (Window::default(), false),
            };
            by_endpoint.insert(r.peer.endpoint, id);
            by_id.insert(
                id,
                Sender {
                    peer: r.peer.clone(),
                    keys: r.keys.clone(),
                    window,
                    authentic,
                    counters: r.counters.clone(),
                },
            );
        }
        self.by_id = by_id;
        self.by_endpoint = by_endpoint;
    }

    /// Whether `from` is a peer's endpoint, and if so whether that peer has delivered a message
    /// (`Some(true)`): chunks from elsewhere are dropped before reassembly.
    pub fn at(&self, from: SocketAddr) -> Option<bool> {
        let SocketAddr::V4(from) = from else { return None };
        let id = self.by_endpoint.get(&from)?;
        self.by_id.get(id).map(|s| s.authentic)
    }

    /// Opens a whole message that came from `from`, in place, and checks its packet: from the
    /// sender's pod CIDR, to `own`. Only a message that passes every check moves the window.
    pub fn receive(
        &mut self,
        from: SocketAddr,
        message: &mut [u8],
        own: PodCidr,
    ) -> Result<Delivered, Refused> {
        let header = Header::parse(message)?;
        let sender = self.by_id.get_mut(&header.id).ok_or(Refused::Spoofed)?;
        if SocketAddr::V4(sender.peer.endpoint) != from {
            return Err(Refused::Spoofed);
        }
        // Before the tag: a replay costs no decryption.
        sender.window.check(header.counter)?;
        let range = wire::open(&sender.keys.open, header, message)?;
        let payload = &message[range.clone()];
        let (Some(src), Some(dst)) = (ipv4_field(payload, SRC), ipv4_field(payload, DST)) else {
            return Err(Refused::Malformed);
        };
        if !sender.peer.pod_cidr.contains(src) {
            return Err(Refused::Spoofed);
        }
        if !own.contains(dst) {
            return Err(Refused::Malformed);
        }
        sender.window.accept(header.counter)?;
        sender.authentic = true;
        Ok(Delivered { range, counters: sender.counters.clone() })
    }
}

#[cfg(test)]
#[path = "senders_tests.rs"]
mod tests;
