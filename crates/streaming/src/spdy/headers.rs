//! SPDY/3 header blocks: name/value pairs, compressed with one zlib stream per direction and
//! the preset [`super::dictionary`].

use bytes::{Buf, BufMut, Bytes, BytesMut};
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

use super::dictionary::dictionary;
use crate::error::Error;

/// Default limit of a decompressed header block.
pub const MAX_HEADER_BLOCK: usize = 64 * 1024;
/// Limit of name/value pairs in one block.
const MAX_PAIRS: usize = 256;

/// Headers of one stream: lower-case names; a name may repeat.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Headers(Vec<(String, String)>);

impl Headers {
    /// No headers.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a value (the name is lower-cased, as SPDY requires).
    pub fn insert(&mut self, name: &str, value: &str) {
        self.0.push((name.to_ascii_lowercase(), value.to_string()));
    }

    /// The first value of `name` (case-insensitive).
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    /// All pairs in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(n, v)| (n.as_str(), v.as_str()))
    }

    /// Number of values.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// No values at all.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

fn bad(msg: impl Into<String>) -> Error {
    Error::HeaderBlock(msg.into())
}

/// Parses an uncompressed header block.
pub fn parse_block(mut b: &[u8]) -> Result<Headers, Error> {
    fn chunk<'a>(b: &mut &'a [u8], what: &str) -> Result<&'a [u8], Error> {
        if b.remaining() < 4 {
            return Err(bad(format!("truncated {what} length")));
        }
        let n = b.get_u32() as usize;
        if b.remaining() < n {
            return Err(bad(format!("{what} of {n} bytes runs past the block")));
        }
        let (s, rest) = b.split_at(n);
        *b = rest;
        Ok(s)
    }
    if b.remaining() < 4 {
        return Err(bad("truncated pair count"));
    }
    let count = b.get_u32() as usize;
    if count > MAX_PAIRS {
        return Err(bad(format!("{count} header pairs (at most {MAX_PAIRS})")));
    }
    let mut headers = Headers::new();
    for _ in 0..count {
        let name = chunk(&mut b, "header name")?;
        let name = std::str::from_utf8(name).map_err(|_| bad("header name is not UTF-8"))?;
        if name.is_empty() {
            return Err(bad("empty header name"));
        }
        let value = chunk(&mut b, "header value")?;
        let value = std::str::from_utf8(value).map_err(|_| bad(format!("value of {name} is not UTF-8")))?;
        // Several values of one name are joined by NUL.
        for v in value.split('\0') {
            headers.insert(name, v);
        }
    }
    if !b.is_empty() {
        return Err(bad(format!("{} bytes after the last header pair", b.len())));
    }
    Ok(headers)
}

/// Serialises headers (uncompressed), joining repeated names with NUL.
pub fn serialize_block(headers: &Headers) -> Bytes {
    let mut names: Vec<&str> = Vec::new();
    for (n, _) in headers.iter() {
        if !names.contains(&n) {
            names.push(n);
        }
    }
    let mut out = BytesMut::new();
    out.put_u32(names.len() as u32);
    for name in names {
        let value = headers.iter().filter(|(n, _)| *n == name).map(|(_, v)| v).collect::<Vec<_>>().join("\0");
        out.put_u32(name.len() as u32);
        out.put_slice(name.as_bytes());
        out.put_u32(value.len() as u32);
        out.put_slice(value.as_bytes());
    }
    out.freeze()
}

/// Decompresses the peer's header blocks (one zlib stream for the whole session).
pub struct HeaderDecoder {
    z: Decompress,
    max: usize,
}

impl HeaderDecoder {
    /// A decoder refusing blocks larger than `max` bytes once decompressed.
    pub fn new(max: usize) -> Self {
        Self { z: Decompress::new(true), max }
    }

    /// Decompresses and parses one header block.
    pub fn decode(&mut self, block: &[u8]) -> Result<Headers, Error> {
        let start_in = self.z.total_in();
        let mut out: Vec<u8> = Vec::with_capacity(512.min(self.max));
        loop {
            let consumed = (self.z.total_in() - start_in) as usize;
            if out.len() == out.capacity() {
                if out.len() >= self.max {
                    return Err(Error::HeaderBlockTooLarge { max: self.max });
                }
                out.reserve((out.capacity()).min(self.max - out.len()).max(64));
            }
            let before = (self.z.total_in(), self.z.total_out());
            match self.z.decompress_vec(&block[consumed..], &mut out, FlushDecompress::Sync) {
                Ok(Status::Ok | Status::BufError) => {}
                Ok(Status::StreamEnd) => return Err(bad("zlib stream ended inside a header block")),
                Err(e) if e.needs_dictionary().is_some() => {
                    self.z.set_dictionary(dictionary()).map_err(|e| bad(format!("zlib dictionary: {e}")))?;
                    continue;
                }
                Err(e) => return Err(bad(format!("zlib: {e}"))),
            }
            if out.len() > self.max {
                return Err(Error::HeaderBlockTooLarge { max: self.max });
            }
            let all_in = (self.z.total_in() - start_in) as usize == block.len();
            let progressed = before != (self.z.total_in(), self.z.total_out());
            if (all_in && out.len() < out.capacity()) || !progressed {
                if !all_in {
                    return Err(bad("zlib made no progress on the header block"));
                }
                break;
            }
        }
        parse_block(&out)
    }
}

/// Compresses this side's header blocks (one zlib stream for the whole session).
pub struct HeaderEncoder {
    z: Compress,
    started: bool,
}

impl Default for HeaderEncoder {
    fn default() -> Self {
        Self::new()
    }
}

impl HeaderEncoder {
    /// A fresh compressor.
    pub fn new() -> Self {
        Self { z: Compress::new(Compression::default(), true), started: false }
    }

    /// Compresses one header block (sync-flushed, so the peer can decode it at once).
    pub fn encode(&mut self, headers: &Headers) -> Result<Bytes, Error> {
        if !self.started {
            self.z.set_dictionary(dictionary()).map_err(|e| bad(format!("zlib dictionary: {e}")))?;
            self.started = true;
        }
        let input = serialize_block(headers);
        let start_in = self.z.total_in();
        let mut out: Vec<u8> = Vec::with_capacity(input.len() + 64);
        loop {
            let consumed = (self.z.total_in() - start_in) as usize;
            if out.len() == out.capacity() {
                out.reserve(256);
            }
            self.z
                .compress_vec(&input[consumed..], &mut out, FlushCompress::Sync)
                .map_err(|e| bad(format!("zlib: {e}")))?;
            let all_in = (self.z.total_in() - start_in) as usize == input.len();
            if all_in && out.len() < out.capacity() {
                break;
            }
        }
        Ok(Bytes::from(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Headers {
        let mut h = Headers::new();
        h.insert("streamType", "stdout");
        h.insert("port", "8080");
        h.insert("requestID", "0");
        h
    }

    #[test]
    fn blocks_round_trip_through_one_zlib_stream_each_way() {
        let mut enc = HeaderEncoder::new();
        let mut dec = HeaderDecoder::new(MAX_HEADER_BLOCK);
        for _ in 0..3 {
            let block = enc.encode(&sample()).expect("encode");
            let got = dec.decode(&block).expect("decode");
            assert_eq!(got.get("streamtype"), Some("stdout"));
            assert_eq!(got.get("requestid"), Some("0"));
            assert_eq!(got.len(), 3);
        }
    }

    #[test]
    fn repeated_names_are_joined_and_split_on_nul() {
        let mut h = Headers::new();
        h.insert("a", "1");
        h.insert("a", "2");
        let parsed = parse_block(&serialize_block(&h)).expect("parse");
        assert_eq!(parsed, h);
    }

    #[test]
    fn oversized_header_block_is_refused() {
        let mut h = Headers::new();
        h.insert("big", &"x".repeat(10_000));
        let block = HeaderEncoder::new().encode(&h).expect("encode");
        let err = HeaderDecoder::new(4096).decode(&block).expect_err("too large");
        assert!(matches!(err, Error::HeaderBlockTooLarge { max: 4096 }), "{err}");
    }

    #[test]
    fn garbage_and_truncated_blocks_are_errors() {
        assert!(HeaderDecoder::new(MAX_HEADER_BLOCK).decode(b"not zlib at all").is_err());
        assert!(parse_block(&[0, 0, 0, 1, 0, 0, 0, 9, b'a']).is_err());
        assert!(parse_block(&[0, 0, 0x10, 0]).is_err());
    }
}
