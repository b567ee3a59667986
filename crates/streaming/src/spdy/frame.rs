//! SPDY/3.1 framing: the [`Frame`] type and [`FrameCodec`], a `tokio_util` codec.
//!
//! Header blocks stay compressed here; the session's [`super::headers`] coders hold the
//! per-connection zlib state.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio_util::codec::{Decoder, Encoder};

use crate::error::Error;

/// The only SPDY version spoken.
pub const VERSION: u16 = 3;
/// FLAG_FIN: the sender's half of the stream ends with this frame.
pub const FLAG_FIN: u8 = 0x01;
/// FLAG_UNIDIRECTIONAL on SYN_STREAM: the recipient may not send on this stream.
pub const FLAG_UNIDIRECTIONAL: u8 = 0x02;
/// Frame header size (both kinds).
pub const HEADER_LEN: usize = 8;
/// Largest length the 24-bit length field can carry.
pub const MAX_LENGTH: usize = 0x00ff_ffff;

/// RST_STREAM / GOAWAY status codes used by this server.
pub mod status {
    /// PROTOCOL_ERROR.
    pub const PROTOCOL_ERROR: u32 = 1;
    /// INVALID_STREAM: a frame for a stream that is not open.
    pub const INVALID_STREAM: u32 = 2;
    /// REFUSED_STREAM: the stream was refused before any processing.
    pub const REFUSED_STREAM: u32 = 3;
    /// CANCEL: the stream is no longer needed.
    pub const CANCEL: u32 = 5;
    /// INTERNAL_ERROR.
    pub const INTERNAL_ERROR: u32 = 6;
    /// STREAM_IN_USE: SYN_STREAM for a stream id already open.
    pub const STREAM_IN_USE: u32 = 8;
}

mod kind {
    pub const SYN_STREAM: u16 = 1;
    pub const SYN_REPLY: u16 = 2;
    pub const RST_STREAM: u16 = 3;
    pub const SETTINGS: u16 = 4;
    pub const PING: u16 = 6;
    pub const GOAWAY: u16 = 7;
    pub const HEADERS: u16 = 8;
    pub const WINDOW_UPDATE: u16 = 9;
}

/// One SETTINGS entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setting {
    /// Entry flags (PERSIST_VALUE, PERSISTED).
    pub flags: u8,
    /// Setting id (24 bits), e.g. 7 = SETTINGS_INITIAL_WINDOW_SIZE.
    pub id: u32,
    /// Value.
    pub value: u32,
}

/// One SPDY/3.1 frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// DATA.
    Data {
        /// Stream.
        stream_id: u32,
        /// FLAG_FIN.
        fin: bool,
        /// Payload.
        data: Bytes,
    },
    /// SYN_STREAM: the peer opens a stream.
    SynStream {
        /// New stream.
        stream_id: u32,
        /// Associated stream (0 = none).
        associated_to: u32,
        /// Priority, 0 (highest) to 7.
        priority: u8,
        /// Frame flags (FIN, UNIDIRECTIONAL).
        flags: u8,
        /// Compressed header block.
        header_block: Bytes,
    },
    /// SYN_REPLY: the recipient accepts a stream.
    SynReply {
        /// Stream.
        stream_id: u32,
        /// FLAG_FIN.
        fin: bool,
        /// Compressed header block.
        header_block: Bytes,
    },
    /// RST_STREAM: abnormal end of a stream.
    RstStream {
        /// Stream.
        stream_id: u32,
        /// Status code.
        status: u32,
    },
    /// SETTINGS.
    Settings {
        /// FLAG_SETTINGS_CLEAR_SETTINGS.
        clear: bool,
        /// Entries.
        entries: Vec<Setting>,
    },
    /// PING.
    Ping {
        /// Ping id (odd: client-initiated).
        id: u32,
    },
    /// GOAWAY: no new streams will be accepted.
    GoAway {
        /// Last stream id the sender processed.
        last_good_stream_id: u32,
        /// Status code.
        status: u32,
    },
    /// HEADERS: more headers for a stream.
    Headers {
        /// Stream.
        stream_id: u32,
        /// FLAG_FIN.
        fin: bool,
        /// Compressed header block.
        header_block: Bytes,
    },
    /// WINDOW_UPDATE.
    WindowUpdate {
        /// Stream (0 = the session).
        stream_id: u32,
        /// Window increase.
        delta: u32,
    },
    /// A control frame of a type this server does not know; SPDY says to ignore it.
    Unknown {
        /// Frame type.
        frame_type: u16,
    },
}

/// Encoder/decoder of SPDY/3.1 frames with size limits.
#[derive(Debug, Clone)]
pub struct FrameCodec {
    max_control: usize,
    max_data: usize,
}

impl FrameCodec {
    /// A codec refusing control frames over `max_control` and data frames over `max_data` bytes.
    pub fn new(max_control: usize, max_data: usize) -> Self {
        Self { max_control: max_control.min(MAX_LENGTH), max_data: max_data.min(MAX_LENGTH) }
    }
}

impl Default for FrameCodec {
    /// 64 KiB control frames (header blocks are tiny in these protocols), 16 MiB data frames.
    fn default() -> Self {
        Self::new(64 * 1024, MAX_LENGTH)
    }
}

fn malformed(what: &str) -> Error {
    Error::MalformedFrame(what.to_string())
}

/// Reads a 31-bit stream id (the top bit is reserved and ignored).
fn stream_id(b: &mut Bytes) -> u32 {
    b.get_u32() & 0x7fff_ffff
}

fn need(b: &Bytes, n: usize, frame: &str) -> Result<(), Error> {
    if b.len() < n {
        return Err(Error::MalformedFrame(format!(
            "{frame} frame body has {} bytes, needs at least {n}",
            b.len()
        )));
    }
    Ok(())
}

fn parse_control(frame_type: u16, flags: u8, mut b: Bytes) -> Result<Frame, Error> {
    let fin = flags & FLAG_FIN != 0;
    let frame = match frame_type {
        kind::SYN_STREAM => {
            need(&b, 10, "SYN_STREAM")?;
            let stream_id = stream_id(&mut b);
            let associated_to = b.get_u32() & 0x7fff_ffff;
            let priority = b.get_u8() >> 5;
            let _slot = b.get_u8();
            Frame::SynStream { stream_id, associated_to, priority, flags, header_block: b }
        }
        kind::SYN_REPLY => {
            need(&b, 4, "SYN_REPLY")?;
            Frame::SynReply { stream_id: stream_id(&mut b), fin, header_block: b }
        }
        kind::RST_STREAM => {
            need(&b, 8, "RST_STREAM")?;
            Frame::RstStream { stream_id: stream_id(&mut b), status: b.get_u32() }
        }
        kind::SETTINGS => {
            need(&b, 4, "SETTINGS")?;
            let count = b.get_u32() as usize;
            if count.checked_mul(8) != Some(b.len()) {
                return Err(Error::MalformedFrame(format!(
                    "SETTINGS announces {count} entries in {} bytes",
                    b.len()
                )));
            }
            let entries = (0..count)
                .map(|_| {
                    let w = b.get_u32();
                    Setting { flags: (w >> 24) as u8, id: w & 0x00ff_ffff, value: b.get_u32() }
                })
                .collect();
            Frame::Settings { clear: flags & 0x01 != 0, entries }
        }
        kind::PING => {
            need(&b, 4, "PING")?;
            Frame::Ping { id: b.get_u32() }
        }
        kind::GOAWAY => {
            need(&b, 8, "GOAWAY")?;
            Frame::GoAway { last_good_stream_id: stream_id(&mut b), status: b.get_u32() }
        }
        kind::HEADERS => {
            need(&b, 4, "HEADERS")?;
            Frame::Headers { stream_id: stream_id(&mut b), fin, header_block: b }
        }
        kind::WINDOW_UPDATE => {
            need(&b, 8, "WINDOW_UPDATE")?;
            let stream_id = stream_id(&mut b);
            let delta = b.get_u32() & 0x7fff_ffff;
            if delta == 0 {
                return Err(malformed("WINDOW_UPDATE with a delta of 0"));
            }
            Frame::WindowUpdate { stream_id, delta }
        }
        other => Frame::Unknown { frame_type: other },
    };
    Ok(frame)
}

impl Decoder for FrameCodec {
    type Item = Frame;
    type Error = Error;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, Error> {
        if src.len() < HEADER_LEN {
            return Ok(None);
        }
        let first = u32::from_be_bytes([src[0], src[1], src[2], src[3]]);
        let flags = src[4];
        let len = u32::from_be_bytes([0, src[5], src[6], src[7]]) as usize;
        let control = first & 0x8000_0000 != 0;
        let (kind, max) = if control { ("control", self.max_control) } else { ("data", self.max_data) };
        if len > max {
            return Err(Error::FrameTooLarge { kind, len, max });
        }
        if control {
            let version = ((first >> 16) & 0x7fff) as u16;
            if version != VERSION {
                return Err(Error::UnsupportedVersion(version));
            }
        }
        if src.len() < HEADER_LEN + len {
            src.reserve(HEADER_LEN + len - src.len());
            return Ok(None);
        }
        src.advance(HEADER_LEN);
        let body = src.split_to(len).freeze();
        if control {
            parse_control((first & 0xffff) as u16, flags, body).map(Some)
        } else {
            Ok(Some(Frame::Data { stream_id: first & 0x7fff_ffff, fin: flags & FLAG_FIN != 0, data: body }))
        }
    }

    fn decode_eof(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, Error> {
        match self.decode(src)? {
            Some(frame) => Ok(Some(frame)),
            None if src.is_empty() => Ok(None),
            None => Err(Error::TruncatedFrame(src.len())),
        }
    }
}

fn put_control(dst: &mut BytesMut, frame_type: u16, flags: u8, body_len: usize) -> Result<(), Error> {
    if body_len > MAX_LENGTH {
        return Err(Error::FrameTooLarge { kind: "control", len: body_len, max: MAX_LENGTH });
    }
    dst.reserve(HEADER_LEN + body_len);
    dst.put_u16(0x8000 | VERSION);
    dst.put_u16(frame_type);
    dst.put_u32((u32::from(flags) << 24) | body_len as u32);
    Ok(())
}

fn fin_flag(fin: bool) -> u8 {
    if fin { FLAG_FIN } else { 0 }
}

impl Encoder<Frame> for FrameCodec {
    type Error = Error;

    fn encode(&mut self, frame: Frame, dst: &mut BytesMut) -> Result<(), Error> {
        match frame {
            Frame::Data { stream_id, fin, data } => {
                if data.len() > MAX_LENGTH {
                    return Err(Error::FrameTooLarge { kind: "data", len: data.len(), max: MAX_LENGTH });
                }
                dst.reserve(HEADER_LEN + data.len());
                dst.put_u32(stream_id & 0x7fff_ffff);
                dst.put_u32((u32::from(fin_flag(fin)) << 24) | data.len() as u32);
                dst.put_slice(&data);
            }
            Frame::SynStream { stream_id, associated_to, priority, flags, header_block } => {
                put_control(dst, kind::SYN_STREAM, flags, 10 + header_block.len())?;
                dst.put_u32(stream_id & 0x7fff_ffff);
                dst.put_u32(associated_to & 0x7fff_ffff);
                dst.put_u8((priority & 0x07) << 5);
                dst.put_u8(0);
                dst.put_slice(&header_block);
            }
            Frame::SynReply { stream_id, fin, header_block } => {
                put_control(dst, kind::SYN_REPLY, fin_flag(fin), 4 + header_block.len())?;
                dst.put_u32(stream_id & 0x7fff_ffff);
                dst.put_slice(&header_block);
            }
            Frame::RstStream { stream_id, status } => {
                put_control(dst, kind::RST_STREAM, 0, 8)?;
                dst.put_u32(stream_id & 0x7fff_ffff);
                dst.put_u32(status);
            }
            Frame::Settings { clear, entries } => {
                put_control(dst, kind::SETTINGS, u8::from(clear), 4 + 8 * entries.len())?;
                dst.put_u32(entries.len() as u32);
                for e in entries {
                    dst.put_u32((u32::from(e.flags) << 24) | (e.id & 0x00ff_ffff));
                    dst.put_u32(e.value);
                }
            }
            Frame::Ping { id } => {
                put_control(dst, kind::PING, 0, 4)?;
                dst.put_u32(id);
            }
            Frame::GoAway { last_good_stream_id, status } => {
                put_control(dst, kind::GOAWAY, 0, 8)?;
                dst.put_u32(last_good_stream_id & 0x7fff_ffff);
                dst.put_u32(status);
            }
            Frame::Headers { stream_id, fin, header_block } => {
                put_control(dst, kind::HEADERS, fin_flag(fin), 4 + header_block.len())?;
                dst.put_u32(stream_id & 0x7fff_ffff);
                dst.put_slice(&header_block);
            }
            Frame::WindowUpdate { stream_id, delta } => {
                put_control(dst, kind::WINDOW_UPDATE, 0, 8)?;
                dst.put_u32(stream_id & 0x7fff_ffff);
                dst.put_u32(delta & 0x7fff_ffff);
            }
            Frame::Unknown { frame_type } => {
                return Err(Error::MalformedFrame(format!("cannot encode unknown frame type {frame_type}")));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "frame_tests.rs"]
mod tests;
