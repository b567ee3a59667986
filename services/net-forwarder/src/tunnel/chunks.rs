//! Sealed messages cut into link-MTU datagrams, and put back together.
//!
//! A sealed message ([`super::wire`]) is up to 64 KiB; one UDP datagram of that size would be
//! IP-fragmented into ~44 fragments on a 1500-MTU link. Instead the sender cuts it into chunks
//! that each fit one link-MTU datagram, every chunk behind a [`CHUNK_HEADER_LEN`]-byte header:
//!
//! ```text
//! 0      2       3        4          8       9       10       12
//! | "HK" | ver=3 | type=2 | message | index | count | stride | message bytes [index*stride..]
//! ```
//!
//! `message` is the message's id, its sender's low 28 bits of the sealed message's counter
//! above the *lane* (4 bits): the sending queue's number, by which the receiver's kernel picks
//! the socket, so the thread, that takes the datagram ([`crate::inherit::steer`]). `count` the
//! number of chunks, `stride` the bytes of message every chunk but the last carries (the last
//! carries 1 to `stride`). All chunks of a message are equal-size but the last, which is what
//! UDP GSO sends with one `sendmsg` and UDP GRO hands back coalesced.
//!
//! The header is not authenticated: the reassembled message is, as a whole, when it is opened.
//! Chunks from an address that is no current peer's endpoint never get here (the receiver drops
//! them first, [`super::senders::Senders::at`]), so strangers open no slot. A forged or corrupted
//! chunk from a peer's address therefore spoils at most the message it claims to belong to (an
//! authentication drop), and reassembly state is bounded so that forgeries cannot grow memory:
//! at most [`SLOTS_PER_SOURCE`] messages in progress per source address and [`MAX_SLOTS`] in
//! all; a peer that has delivered a message before is *trusted*, and a slot is taken from an
//! untrusted source before a trusted one. An in-progress message pushed out is dropped and
//! counted as incomplete ([`Reassembly::take_evicted`]). What remains open: an attacker who can
//! spoof a peer's endpoint at the IP level can still pre-open slots under predicted message ids
//! (the counters travel in clear) or push that peer's in-progress messages out. That is
//! bounded and only drops messages (large ones, in chunks); it never delivers one.

use std::net::SocketAddr;

use super::wire::{MAGIC, OVERHEAD, Refused, VERSION};
use crate::tuntap::VNET_HDR_LEN;

/// Bytes of the chunk header.
pub const CHUNK_HEADER_LEN: usize = 12;
/// The largest sealed message: a 64 KiB IP packet behind its virtio-net header, sealed.
pub const MAX_MESSAGE: usize = OVERHEAD + VNET_HDR_LEN + 65_535;
/// The largest UDP payload of one IPv4 datagram, which is also the most one GSO send carries.
pub const MAX_DATAGRAM: usize = 65_507;
/// IPv4 and UDP headers, without options.
pub const IP_UDP_HEADERS: usize = 28;
/// The most segments the kernel accepts in one UDP GSO send (`UDP_MAX_SEGMENTS` before 6.11).
pub const MAX_SEGMENTS: usize = 64;
/// Messages in progress per source address.
pub const SLOTS_PER_SOURCE: usize = 4;
/// Messages in progress in all.
pub const MAX_SLOTS: usize = 32;
/// Link MTUs accepted: IPv4's minimum (so that a message needs at most 255 chunks) to 65535.
pub const MTU_RANGE: std::ops::RangeInclusive<u32> = 576..=65_535;

/// Lanes a message id can name (its low 4 bits), so the most queues a tunnel has.
pub const LANES: usize = 16;
/// The byte of the chunk header whose low 4 bits are the lane (the message id's last).
pub const LANE_OFFSET: usize = 7;

/// The id of the message sealed under `counter` by the queue of lane `lane`.
pub fn message_id(counter: u64, lane: usize) -> u32 {
    ((counter as u32) << 4) | (lane % LANES) as u32
}

/// The lane of a message id.
pub fn lane(message: u32) -> usize {
    (message as usize) % LANES
}

const TYPE_CHUNK: u8 = 2;
/// Recently completed messages remembered, so that a duplicated chunk does not start a new one.
const DONE: usize = 16;

/// One chunk, parsed (not authenticated).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunk<'a> {
    /// The message's id (its counter's low 32 bits).
    pub message: u32,
    /// This chunk's place.
    pub index: u8,
    /// Chunks in the message.
    pub count: u8,
    /// Message bytes in every chunk but the last.
    pub stride: u16,
    /// This chunk's message bytes.
    pub data: &'a [u8],
}

impl Chunk<'_> {
    /// The bytes of the whole message, when this is its last chunk.
    fn message_len(&self) -> usize {
        (self.count as usize - 1) * self.stride as usize + self.data.len()
    }
}

/// Parses one datagram as a chunk; refuses (as malformed) what no honest sender produces.
pub fn parse(datagram: &[u8]) -> Result<Chunk<'_>, Refused> {
    if datagram.len() <= CHUNK_HEADER_LEN
        || datagram[0..2] != MAGIC
        || datagram[2] != VERSION
        || datagram[3] != TYPE_CHUNK
    {
        return Err(Refused::Malformed);
    }
    let chunk = Chunk {
        message: u32::from_be_bytes([datagram[4], datagram[5], datagram[6], datagram[7]]),
        index: datagram[8],
        count: datagram[9],
        stride: u16::from_be_bytes([datagram[10], datagram[11]]),
        data: &datagram[CHUNK_HEADER_LEN..],
    };
    let last = chunk.count.checked_sub(1).ok_or(Refused::Malformed)?;
    let stride = chunk.stride as usize;
    // Every chunk but the last is `stride` long; the last ends the message, no larger than the
    // largest.
    let fits = if chunk.index < last {
        chunk.data.len() == stride
    } else {
        chunk.index == last && chunk.data.len() <= stride && chunk.message_len() <= MAX_MESSAGE
    };
    if !fits || last as usize * stride >= MAX_MESSAGE {
        return Err(Refused::Malformed);
    }
    Ok(chunk)
}

/// How the sender cuts messages for a link MTU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cutter {
    stride: usize,
}

impl Cutter {
    /// Chunks that fit one datagram of a link of `mtu` bytes (within [`MTU_RANGE`]).
    pub fn new(mtu: u32) -> Option<Self> {
        MTU_RANGE.contains(&mtu).then(|| Cutter { stride: mtu as usize - IP_UDP_HEADERS - CHUNK_HEADER_LEN })
    }

    /// Message bytes in every chunk but the last.
    pub fn stride(&self) -> usize {
        self.stride
    }

    /// The UDP payload of a full chunk: the GSO segment size.
    pub fn segment(&self) -> usize {
        self.stride + CHUNK_HEADER_LEN
    }

    /// The most chunks one GSO send carries.
    pub fn per_send(&self) -> usize {
        (MAX_DATAGRAM / self.segment()).min(MAX_SEGMENTS)
    }

    /// Chunks of a `len`-byte message (1 to [`MAX_MESSAGE`] bytes).
    pub fn count(&self, len: usize) -> usize {
        len.div_ceil(self.stride).max(1)
    }

    /// The header of chunk `index` of `count` of message `message`.
    pub fn header(&self, message: u32, index: usize, count: usize) -> [u8; CHUNK_HEADER_LEN] {
        let mut h = [0; CHUNK_HEADER_LEN];
        h[0..2].copy_from_slice(&MAGIC);
        h[2] = VERSION;
        h[3] = TYPE_CHUNK;
        h[4..8].copy_from_slice(&message.to_be_bytes());
        // Both fit: MTU_RANGE keeps count ≤ 255 and the stride < 65536.
        h[8] = index as u8;
        h[9] = count as u8;
        h[10..12].copy_from_slice(&(self.stride as u16).to_be_bytes());
        h
    }

    /// The message bytes of chunk `index`.
    pub fn piece<'m>(&self, message: &'m [u8], index: usize) -> &'m [u8] {
        let start = index * self.stride;
        &message[start..(start + self.stride).min(message.len())]
    }
}

/// One message in progress.
struct Slot {
    from: SocketAddr,
    message: u32,
    count: u8,
    stride: u16,
    trusted: bool,
    born: u64,
    have: [u64; 4],
    got: usize,
    len: Option<usize>,
    buf: Vec<u8>,
}

impl Slot {
    fn has(&self, index: u8) -> bool {
        self.have[index as usize / 64] & (1 << (index % 64)) != 0
    }

    fn mark(&mut self, index: u8) {
        self.have[index as usize / 64] |= 1 << (index % 64);
    }
}

/// Messages in progress, bounded ([`MAX_SLOTS`], [`SLOTS_PER_SOURCE`]).
#[derive(Default)]
pub struct Reassembly {
    slots: Vec<Slot>,
    spare: Vec<Vec<u8>>,
    done: Vec<(SocketAddr, u32)>,
    next_done: usize,
    tick: u64,
    evicted: u64,
}

impl Reassembly {
    /// Nothing in progress.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a chunk from `from` (`trusted`: it has sent an authentic message before). Returns
    /// the whole message once its last missing chunk arrives; hand its buffer back with
    /// [`Reassembly::recycle`]. A chunk that contradicts its message's others is malformed; a
    /// duplicate is ignored.
    pub fn add(
        &mut self,
        from: SocketAddr,
        trusted: bool,
        chunk: &Chunk<'_>,
    ) -> Result<Option<Vec<u8>>, Refused> {
        if chunk.count == 1 {
            return Ok(Some(self.single(chunk.data)));
        }
        if self.done.contains(&(from, chunk.message)) {
            return Ok(None);
        }
        let i = match self.slots.iter().rposition(|s| s.message == chunk.message && s.from == from) {
            Some(i) => i,
            None => self.open(from, trusted, chunk),
        };
        let slot = &mut self.slots[i];
        if slot.count != chunk.count || slot.stride != chunk.stride {
            return Err(Refused::Malformed);
        }
        if slot.has(chunk.index) {
            return Ok(None);
        }
        let start = chunk.index as usize * chunk.stride as usize;
        slot.buf[start..start + chunk.data.len()].copy_from_slice(chunk.data);
        slot.mark(chunk.index);
        slot.got += 1;
        if chunk.index + 1 == chunk.count {
            slot.len = Some(chunk.message_len());
        }
        if slot.got < slot.count as usize {
            return Ok(None);
        }
        let slot = self.slots.swap_remove(i);
        self.remember(from, chunk.message);
        let mut buf = slot.buf;
        buf.truncate(slot.len.unwrap_or(0));
        Ok(Some(buf))
    }

    /// Hands back a message's buffer for reuse.
    pub fn recycle(&mut self, buf: Vec<u8>) {
        if self.spare.len() < 2 {
            self.spare.push(buf);
        }
    }

    /// Messages dropped incomplete since the last call.
    pub fn take_evicted(&mut self) -> u64 {
        std::mem::take(&mut self.evicted)
    }

    /// Messages in progress.
    pub fn in_progress(&self) -> usize {
        self.slots.len()
    }

    fn buffer(&mut self) -> Vec<u8> {
        // What a previous message left in it is overwritten before it is read.
        let mut buf = self.spare.pop().unwrap_or_default();
        buf.resize(MAX_MESSAGE, 0);
        buf
    }

    fn single(&mut self, data: &[u8]) -> Vec<u8> {
        let mut buf = self.spare.pop().unwrap_or_default();
        buf.clear();
        buf.extend_from_slice(data);
        buf
    }

    fn remember(&mut self, from: SocketAddr, message: u32) {
        if self.done.len() < DONE {
            self.done.push((from, message));
        } else {
            self.done[self.next_done] = (from, message);
        }
        self.next_done = (self.next_done + 1) % DONE;
    }

    /// A slot for a new message, pushing out another if the bounds say so; returns its index.
    fn open(&mut self, from: SocketAddr, trusted: bool, chunk: &Chunk<'_>) -> usize {
        let oldest = |slots: &[Slot], pick: &dyn Fn(&Slot) -> bool| {
            slots.iter().enumerate().filter(|(_, s)| pick(s)).min_by_key(|(_, s)| s.born).map(|(i, _)| i)
        };
        let victim = if self.slots.iter().filter(|s| s.from == from).count() >= SLOTS_PER_SOURCE {
            oldest(&self.slots, &|s| s.from == from)
        } else if self.slots.len() >= MAX_SLOTS {
            oldest(&self.slots, &|s| !s.trusted).or_else(|| oldest(&self.slots, &|_| true))
        } else {
            None
        };
        if let Some(v) = victim {
            let gone = self.slots.swap_remove(v);
            self.evicted += 1;
            self.recycle(gone.buf);
        }
        let buf = self.buffer();
        self.tick += 1;
        self.slots.push(Slot {
            from,
            message: chunk.message,
            count: chunk.count,
            stride: chunk.stride,
            trusted,
            born: self.tick,
            have: [0; 4],
            got: 0,
            len: None,
            buf,
        });
        self.slots.len() - 1
    }
}

#[cfg(test)]
#[path = "chunks_tests.rs"]
mod tests;
