//! The tunnel's message format and its per-message authentication.
//!
//! A *message* carries one packet from the TUN device (a virtio-net header and an IP packet, up
//! to 64 KiB with GSO), sealed with AES-256-GCM under the key of its sender and receiver
//! ([`super::identity`]):
//!
//! ```text
//! 0      2       3        4                12          20                  n-16     n
//! | "HK" | ver=3 | type=1 | sender key id | counter   | vnet hdr + packet | tag    |
//! |<------------- header, authenticated (AAD) ------->|<-- encrypted --->|
//! ```
//!
//! On the wire a message travels as one or more link-MTU UDP datagrams, *chunks*, each behind a
//! 12-byte chunk header ([`super::chunks`]); the receiver puts the chunks back together and
//! opens the message as a whole. Version 1 sent each message as one UDP datagram, which the
//! kernel IP-fragmented; version 2 shared one cluster key; no two versions understand each other.
//!
//! The *key id* names the sender (the first 8 bytes of the SHA-256 of its public key); the
//! receiver looks it up among its current peers and opens the message with that pair's key
//! ([`super::senders`]), so what opens was sealed by that peer, for this node. The nonce is the
//! *counter*, one per sender run and shared by all its peers: no (key, nonce) pair ever repeats,
//! even when a peer leaves the table and comes back with the same key. The receiver keeps a
//! sliding window of the last [`WINDOW`] counters of each sender and refuses a counter seen or
//! older. There is no incarnation: every run of a net-forwarder has a new key pair, so an old
//! run's messages carry a key id that no peer table holds, whatever the clocks say. (Only a
//! private key file reused across runs, in static set-ups, leans on the clock: see
//! [`Sealer::new`].)

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use ring::aead::{Aad, LessSafeKey, Nonce, Tag};

use super::identity::{KEY_ID_LEN, KeyId};
use crate::{Error, Result};

/// Bytes before the payload.
pub const HEADER_LEN: usize = 4 + KEY_ID_LEN + 8;
/// The authentication tag after the payload.
pub const TAG_LEN: usize = 16;
/// Everything the tunnel adds to a packet (besides the UDP and IP headers).
pub const OVERHEAD: usize = HEADER_LEN + TAG_LEN;
/// How many counters below the highest one seen are still accepted (reordering tolerance).
///
/// The counter is shared by all the peers a node sends to, so one receiver sees only some of
/// its values: with N peers busy, a window of W counter values covers about W/N messages to
/// this node. 4096 (512 bytes per peer) keeps the 1024 messages of reordering tolerance the
/// per-peer counter had with up to four busy peers, and still hundreds with more.
pub const WINDOW: u64 = 4096;

/// The first bytes of every datagram and message.
pub(crate) const MAGIC: [u8; 2] = *b"HK";
/// The format's version; 3 since each pair of nodes has its own keys.
pub(crate) const VERSION: u8 = 3;
const TYPE_PACKET: u8 = 1;

fn nonce(counter: u64) -> Nonce {
    let mut n = [0; 12];
    n[4..].copy_from_slice(&counter.to_be_bytes());
    Nonce::assume_unique_for_key(n)
}

/// The sending side of one run: its key id and its one counter, for every peer and every
/// sending thread (the tunnel's queues share one `Sealer`).
pub struct Sealer {
    id: KeyId,
    counter: AtomicU64,
}

impl Sealer {
    /// A sender whose messages carry key id `id` (its public key's) and counters from
    /// `after + 1` on.
    ///
    /// With a key pair made at start (the default) any start will do: no other run had the key.
    /// A private key file reused across runs (static set-ups) makes the same pair keys every
    /// run, so the tunnel starts the counter at the run's start time in nanoseconds: a later
    /// run's counters lie above all an earlier run sent (fewer than one message a nanosecond),
    /// no nonce repeats and the peers' windows accept it, unless the clock stepped back between
    /// the runs, the one case where a static set-up must make a new key.
    pub fn new(id: KeyId, after: u64) -> Self {
        Sealer { id, counter: AtomicU64::new(after) }
    }

    /// The counter of the last message sealed (the start before the first).
    pub fn counter(&self) -> u64 {
        self.counter.load(Relaxed)
    }

    /// `buf[HEADER_LEN..HEADER_LEN + len]` holds the payload; writes the header before it and
    /// the tag after it, encrypting the payload with `key` (the receiver's pair key), and
    /// returns the message's length and its counter. `buf` must have room for the tag. Threads
    /// that seal at once each take a counter of their own (one atomic add), so no nonce
    /// repeats; their messages may reach a peer in another order than their counters, which its
    /// window tolerates ([`WINDOW`]).
    pub fn seal(&self, key: &LessSafeKey, buf: &mut [u8], len: usize) -> Result<Sealed> {
        let total = HEADER_LEN + len + TAG_LEN;
        if buf.len() < total {
            return Err(Error::InvalidArgument(format!("no room for a {len}-byte packet")));
        }
        // Never wraps: a start time in nanoseconds leaves centuries of messages at any link speed.
        let counter = self.counter.fetch_add(1, Relaxed) + 1;
        let header = Header { id: self.id, counter };
        header.write(&mut buf[..HEADER_LEN]);
        let (header, rest) = buf.split_at_mut(HEADER_LEN);
        let tag = key
            .seal_in_place_separate_tag(nonce(counter), Aad::from(&header[..]), &mut rest[..len])
            .map_err(|_| Error::Config("AES-GCM refused to seal a packet".into()))?;
        rest[len..len + TAG_LEN].copy_from_slice(tag.as_ref());
        Ok(Sealed { len: total, counter })
    }
}

/// A message [`Sealer::seal`] wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sealed {
    /// Its bytes.
    pub len: usize,
    /// Its counter (its nonce).
    pub counter: u64,
}

/// Why a datagram was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// Too short, wrong magic, unknown version or type.
    Malformed,
    /// The tag did not verify under the named sender's key: forged or corrupted.
    Auth,
    /// Authentic, but a counter already seen or too old.
    Replay,
    /// Not from a current peer: an address that is no peer's endpoint, a key id no peer has or
    /// that is not the one of the peer at that address, or an authentic packet whose source is
    /// outside the sender's pod CIDR.
    Spoofed,
}

/// A message's header, parsed (not yet authenticated).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// The sender's key id.
    pub id: KeyId,
    /// The message's counter.
    pub counter: u64,
}

impl Header {
    /// The header of a message of known format and long enough to hold a tag.
    pub fn parse(message: &[u8]) -> std::result::Result<Header, Refused> {
        if message.len() < OVERHEAD
            || message[0..2] != MAGIC
            || message[2] != VERSION
            || message[3] != TYPE_PACKET
        {
            return Err(Refused::Malformed);
        }
        let mut id = [0; KEY_ID_LEN];
        id.copy_from_slice(&message[4..4 + KEY_ID_LEN]);
        let mut counter = [0; 8];
        counter.copy_from_slice(&message[4 + KEY_ID_LEN..HEADER_LEN]);
        Ok(Header { id: KeyId(id), counter: u64::from_be_bytes(counter) })
    }

    fn write(&self, out: &mut [u8]) {
        out[0..2].copy_from_slice(&MAGIC);
        out[2] = VERSION;
        out[3] = TYPE_PACKET;
        out[4..4 + KEY_ID_LEN].copy_from_slice(&self.id.0);
        out[4 + KEY_ID_LEN..HEADER_LEN].copy_from_slice(&self.counter.to_be_bytes());
    }
}

/// Verifies and decrypts `message` (whose header is `header`) in place with `key`; returns the
/// payload's range.
pub fn open(
    key: &LessSafeKey,
    header: Header,
    message: &mut [u8],
) -> std::result::Result<std::ops::Range<usize>, Refused> {
    let payload_len = message.len().checked_sub(OVERHEAD).ok_or(Refused::Malformed)?;
    let (aad, rest) = message.split_at_mut(HEADER_LEN);
    let (payload, tag) = rest.split_at_mut(payload_len);
    let tag = Tag::from(<[u8; TAG_LEN]>::try_from(&tag[..]).map_err(|_| Refused::Malformed)?);
    key.open_in_place_separate_tag(nonce(header.counter), Aad::from(&aad[..]), tag, payload, 0..)
        .map_err(|_| Refused::Auth)?;
    Ok(HEADER_LEN..HEADER_LEN + payload_len)
}

const WORDS: usize = (WINDOW / 64) as usize;

/// A sliding window over the counters seen from one sender (RFC 6479's idea, one bitmap).
/// [`Window::check`] before opening, [`Window::accept`] once the message is delivered, so that
/// a message refused for any reason leaves the window as it was.
#[derive(Clone)]
pub struct Window {
    highest: u64,
    seen: [u64; WORDS],
}

impl Default for Window {
    fn default() -> Self {
        Window { highest: 0, seen: [0; WORDS] }
    }
}

impl Window {
    /// Whether `counter` is new: not 0, not seen, not older than the window.
    pub fn check(&self, counter: u64) -> std::result::Result<(), Refused> {
        if counter == 0 || counter + WINDOW <= self.highest {
            return Err(Refused::Replay);
        }
        if counter <= self.highest && self.is_set(counter) {
            return Err(Refused::Replay);
        }
        Ok(())
    }

    /// Records `counter`, after [`Window::check`] accepted it.
    pub fn accept(&mut self, counter: u64) -> std::result::Result<(), Refused> {
        self.check(counter)?;
        if counter > self.highest {
            self.advance(counter);
        }
        let (i, m) = Self::slot(counter);
        self.seen[i] |= m;
        Ok(())
    }

    /// Moves the top of the window to `to`, forgetting the slots it reuses.
    fn advance(&mut self, to: u64) {
        if to - self.highest >= WINDOW {
            self.seen = [0; WORDS];
        } else {
            // A word at a time: with a shared counter, the gaps between messages are common.
            let mut c = self.highest + 1;
            while c <= to {
                let bit = c % WINDOW;
                let n = (64 - bit % 64).min(to - c + 1);
                let mask = if n == 64 { !0 } else { ((1u64 << n) - 1) << (bit % 64) };
                self.seen[(bit / 64) as usize] &= !mask;
                c += n;
            }
        }
        self.highest = to;
    }

    fn slot(counter: u64) -> (usize, u64) {
        let bit = counter % WINDOW;
        ((bit / 64) as usize, 1 << (bit % 64))
    }

    fn is_set(&self, c: u64) -> bool {
        let (i, m) = Self::slot(c);
        self.seen[i] & m != 0
    }
}

#[cfg(test)]
#[path = "wire_tests.rs"]
mod tests;
