//! The tunnel's message format and its per-message authentication.
//!
//! A *message* carries one packet from the TUN device (a virtio-net header and an IP packet, up
//! to 64 KiB with GSO), sealed:
//!
//! ```text
//! 0      2       3        4              12         20          28                  n-16     n
//! | "HK" | ver=2 | type=1 | incarnation | salt     | counter   | vnet hdr + packet | tag    |
//! |<---------------------- header, authenticated (AAD) ------->|<-- encrypted --->|
//! ```
//!
//! On the wire a message travels as one or more link-MTU UDP datagrams, *chunks*, each behind a
//! 12-byte chunk header ([`super::chunks`]); the receiver puts the chunks back together and
//! opens the message as a whole. Version 1 sent each message as one UDP datagram, which the
//! kernel IP-fragmented; version 2 peers and version 1 peers do not understand each other.
//!
//! Every node of a cluster shares one 32-byte key (a 0600 file). A sender never uses it directly:
//! at start it picks an *incarnation* (its start time in nanoseconds) and a random *salt*, and
//! derives its own AES-256-GCM key from the cluster key with HKDF-SHA256 over both. Nonces are
//! the message counter, so no (key, nonce) pair repeats even though every node holds the same
//! cluster key. The receiver derives the same key from the header, checks the tag (a forged or
//! corrupted message fails here), then the counter against a sliding window of the last
//! [`WINDOW`] counters of that sender, and refuses incarnations older than the newest it has
//! seen from the same address (replays of a previous run of the peer).

use ring::aead::{AES_256_GCM, Aad, LessSafeKey, Nonce, Tag, UnboundKey};
use ring::hkdf;

use crate::{Error, Result};

/// Length of the cluster key.
pub const KEY_LEN: usize = 32;
/// Bytes before the payload.
pub const HEADER_LEN: usize = 28;
/// The authentication tag after the payload.
pub const TAG_LEN: usize = 16;
/// Everything the tunnel adds to a packet (besides the UDP and IP headers).
pub const OVERHEAD: usize = HEADER_LEN + TAG_LEN;
/// How many counters below the highest one seen are still accepted (reordering tolerance).
pub const WINDOW: u64 = 1024;

/// The first bytes of every datagram and message.
pub(crate) const MAGIC: [u8; 2] = *b"HK";
/// The format's version; 2 since messages travel in chunks.
pub(crate) const VERSION: u8 = 2;
const TYPE_PACKET: u8 = 1;
const HKDF_SALT: &[u8] = b"hpk-tunnel-v1";

/// The cluster key, as read from its file.
#[derive(Clone)]
pub struct ClusterKey([u8; KEY_LEN]);

impl ClusterKey {
    /// A key from its 32 bytes.
    pub fn new(bytes: [u8; KEY_LEN]) -> Self {
        ClusterKey(bytes)
    }

    /// Parses the key file's text: 64 hexadecimal digits, surrounding whitespace ignored.
    pub fn parse(text: &str) -> Result<Self> {
        let bytes = hex::decode(text.trim())
            .ok()
            .and_then(|b| <[u8; KEY_LEN]>::try_from(b).ok())
            .ok_or_else(|| Error::Config(format!("a tunnel key is {} hexadecimal digits", KEY_LEN * 2)))?;
        Ok(ClusterKey(bytes))
    }

    /// The key file's text.
    pub fn to_text(&self) -> String {
        format!("{}\n", hex::encode(self.0))
    }

    fn derive(&self, id: SenderId) -> LessSafeKey {
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, HKDF_SALT).extract(&self.0);
        let info = id.to_bytes();
        let info = [&info[..]];
        // Both only fail for lengths beyond 255 blocks; 32 bytes is one.
        let okm = prk.expand(&info, &AES_256_GCM).expect("HKDF output of one block");
        LessSafeKey::new(UnboundKey::from(okm))
    }
}

impl std::fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterKey(..)")
    }
}

/// Who sent a datagram: one run of one node's net-forwarder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SenderId {
    /// Start time in nanoseconds since the UNIX epoch; a restarted peer has a larger one.
    pub incarnation: u64,
    /// Random, so two senders started in the same nanosecond still derive different keys.
    pub salt: u64,
}

impl SenderId {
    fn to_bytes(self) -> [u8; 16] {
        let mut b = [0; 16];
        b[..8].copy_from_slice(&self.incarnation.to_be_bytes());
        b[8..].copy_from_slice(&self.salt.to_be_bytes());
        b
    }
}

fn nonce(counter: u64) -> Nonce {
    let mut n = [0; 12];
    n[4..].copy_from_slice(&counter.to_be_bytes());
    Nonce::assume_unique_for_key(n)
}

/// The sending side: seals packets in place.
pub struct Sealer {
    id: SenderId,
    key: LessSafeKey,
    counter: u64,
}

impl Sealer {
    /// A sender for one run.
    pub fn new(cluster: &ClusterKey, id: SenderId) -> Self {
        Sealer { id, key: cluster.derive(id), counter: 0 }
    }

    /// The counter of the last message sealed (0 before the first).
    pub fn counter(&self) -> u64 {
        self.counter
    }

    /// `buf[HEADER_LEN..HEADER_LEN + len]` holds the payload; writes the header before it and
    /// the tag after it, encrypting the payload, and returns the datagram's length. `buf` must
    /// have room for the tag.
    pub fn seal(&mut self, buf: &mut [u8], len: usize) -> Result<usize> {
        let total = HEADER_LEN + len + TAG_LEN;
        if buf.len() < total {
            return Err(Error::InvalidArgument(format!("no room for a {len}-byte packet")));
        }
        self.counter += 1;
        buf[0..2].copy_from_slice(&MAGIC);
        buf[2] = VERSION;
        buf[3] = TYPE_PACKET;
        buf[4..20].copy_from_slice(&self.id.to_bytes());
        buf[20..28].copy_from_slice(&self.counter.to_be_bytes());
        let (header, rest) = buf.split_at_mut(HEADER_LEN);
        let tag = self
            .key
            .seal_in_place_separate_tag(nonce(self.counter), Aad::from(&header[..]), &mut rest[..len])
            .map_err(|_| Error::Config("AES-GCM refused to seal a packet".into()))?;
        rest[len..len + TAG_LEN].copy_from_slice(tag.as_ref());
        Ok(total)
    }
}

/// Why a datagram was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// Too short, wrong magic, unknown version or type.
    Malformed,
    /// The tag did not verify: forged, corrupted, or another cluster's key.
    Auth,
    /// Authentic, but a counter already seen or too old, or an older incarnation.
    Replay,
}

/// The receiving side for one remote address: the sender it last heard from there.
pub struct Opener {
    cluster: ClusterKey,
    current: Option<(SenderId, LessSafeKey, Window)>,
}

impl Opener {
    /// No sender heard yet.
    pub fn new(cluster: ClusterKey) -> Self {
        Opener { cluster, current: None }
    }

    /// Verifies and decrypts `datagram` in place; returns the payload's range.
    pub fn open(&mut self, datagram: &mut [u8]) -> std::result::Result<std::ops::Range<usize>, Refused> {
        if datagram.len() < OVERHEAD
            || datagram[0..2] != MAGIC
            || datagram[2] != VERSION
            || datagram[3] != TYPE_PACKET
        {
            return Err(Refused::Malformed);
        }
        let id = SenderId {
            incarnation: u64::from_be_bytes(field(&datagram[4..12])),
            salt: u64::from_be_bytes(field(&datagram[12..20])),
        };
        let counter = u64::from_be_bytes(field(&datagram[20..28]));
        let payload_len = datagram.len() - OVERHEAD;
        let fresh = match &self.current {
            Some((cur, _, _)) if *cur == id => None,
            _ => Some(self.cluster.derive(id)),
        };
        let key = match (&fresh, &self.current) {
            (Some(key), _) | (None, Some((_, key, _))) => key,
            (None, None) => return Err(Refused::Auth),
        };
        let (header, rest) = datagram.split_at_mut(HEADER_LEN);
        let (payload, tag) = rest.split_at_mut(payload_len);
        let tag = Tag::from(<[u8; TAG_LEN]>::try_from(&tag[..]).map_err(|_| Refused::Malformed)?);
        key.open_in_place_separate_tag(nonce(counter), Aad::from(&header[..]), tag, payload, 0..)
            .map_err(|_| Refused::Auth)?;
        match fresh {
            None => {
                let (_, _, window) = self.current.as_mut().ok_or(Refused::Auth)?;
                window.accept(counter)?;
            }
            Some(key) => {
                if self.current.as_ref().is_some_and(|(cur, _, _)| cur.incarnation >= id.incarnation) {
                    return Err(Refused::Replay);
                }
                let mut window = Window::default();
                window.accept(counter)?;
                self.current = Some((id, key, window));
            }
        }
        Ok(HEADER_LEN..HEADER_LEN + payload_len)
    }
}

fn field(bytes: &[u8]) -> [u8; 8] {
    let mut b = [0; 8];
    b.copy_from_slice(bytes);
    b
}

/// A sliding window over the counters seen from one sender (RFC 6479's idea, one bitmap).
#[derive(Default)]
struct Window {
    highest: u64,
    seen: [u64; (WINDOW / 64) as usize],
}

impl Window {
    fn accept(&mut self, counter: u64) -> std::result::Result<(), Refused> {
        if counter == 0 || counter + WINDOW <= self.highest {
            return Err(Refused::Replay);
        }
        if counter > self.highest {
            let shift = counter - self.highest;
            if shift >= WINDOW {
                self.seen = Default::default();
            } else {
                for c in self.highest + 1..=counter {
                    self.clear(c);
                }
            }
            self.highest = counter;
        } else if self.is_set(counter) {
            return Err(Refused::Replay);
        }
        self.set(counter);
        Ok(())
    }

    fn slot(counter: u64) -> (usize, u64) {
        let bit = counter % WINDOW;
        ((bit / 64) as usize, 1 << (bit % 64))
    }

    fn is_set(&self, c: u64) -> bool {
        let (i, m) = Self::slot(c);
        self.seen[i] & m != 0
    }

    fn set(&mut self, c: u64) {
        let (i, m) = Self::slot(c);
        self.seen[i] |= m;
    }

    fn clear(&mut self, c: u64) {
        let (i, m) = Self::slot(c);
        self.seen[i] &= !m;
    }
}

#[cfg(test)]
#[path = "wire_tests.rs"]
mod tests;
