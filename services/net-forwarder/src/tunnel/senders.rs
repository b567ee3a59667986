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
    /// The three steps of [`Senders::begin`], [`Opening::open`] and [`Senders::finish`], for a
    /// caller that holds the table throughout.
    pub fn receive(
        &mut self,
        from: SocketAddr,
        message: &mut [u8],
        own: PodCidr,
    ) -> Result<Delivered, Refused> {
        let opening = self.begin(from, message)?;
        let range = opening.open(message, own)?;
        self.finish(&opening)?;
        Ok(Delivered { range, counters: opening.counters })
    }

    /// The checks before a message is opened: a current peer's key id, sent from that peer's
    /// endpoint, a counter its window has not seen. Returns what opens it, so that the table
    /// need not be held while it is decrypted (the receiving threads share it).
    pub fn begin(&self, from: SocketAddr, message: &[u8]) -> Result<Opening, Refused> {
        let header = Header::parse(message)?;
        let sender = self.by_id.get(&header.id).ok_or(Refused::Spoofed)?;
        if SocketAddr::V4(sender.peer.endpoint) != from {
            return Err(Refused::Spoofed);
        }
        // Before the tag: a replay costs no decryption.
        sender.window.check(header.counter)?;
        Ok(Opening {
            header,
            keys: sender.keys.clone(),
            pod_cidr: sender.peer.pod_cidr,
            counters: sender.counters.clone(),
        })
    }

    /// Records an opened message's counter in its sender's window: refused as a replay if
    /// another thread delivered the same counter meanwhile, and as spoofed if the sender left
    /// the table or changed its key since [`Senders::begin`].
    pub fn finish(&mut self, opening: &Opening) -> Result<(), Refused> {
        let sender = self.by_id.get_mut(&opening.header.id).ok_or(Refused::Spoofed)?;
        if !Arc::ptr_eq(&sender.keys, &opening.keys) {
            return Err(Refused::Spoofed);
        }
        sender.window.accept(opening.header.counter)?;
        sender.authentic = true;
        Ok(())
    }
}

/// A message that passed [`Senders::begin`], and the key that opens it.
pub struct Opening {
    header: Header,
    keys: Arc<PairKeys>,
    pod_cidr: PodCidr,
    /// The sender's counters.
    pub counters: Arc<PeerCounters>,
}

impl Opening {
    /// Decrypts and authenticates the message in place, and checks its packet: from the
    /// sender's pod CIDR (cryptokey routing), to `own`. Returns the payload's place.
    pub fn open(&self, message: &mut [u8], own: PodCidr) -> Result<Range<usize>, Refused> {
        let range = wire::open(&self.keys.open, self.header, message)?;
        let payload = &message[range.clone()];
        let (Some(src), Some(dst)) = (ipv4_field(payload, SRC), ipv4_field(payload, DST)) else {
            return Err(Refused::Malformed);
        };
        if !self.pod_cidr.contains(src) {
            return Err(Refused::Spoofed);
        }
        if !own.contains(dst) {
            return Err(Refused::Malformed);
        }
        Ok(range)
    }
}

#[cfg(test)]
#[path = "senders_tests.rs"]
mod tests;
