//! The preset zlib dictionary of SPDY/3 header compression (SPDY/3 draft, section 2.6.10.1).
//!
//! The dictionary is a run of length-prefixed words (4-byte big-endian length, then the word)
//! followed by a block of raw text; it is built from those two parts once.

use std::sync::OnceLock;

/// Length-prefixed words at the start of the dictionary, in order.
const WORDS: [&str; 65] = [
    "options",
    "head",
    "post",
    "put",
    "delete",
    "trace",
    "accept",
    "accept-charset",
    "accept-encoding",
    "accept-language",
    "accept-ranges",
    "age",
    "allow",
    "authorization",
    "cache-control",
    "connection",
    "content-base",
    "content-encoding",
    "content-language",
    "content-length",
    "content-location",
    "content-md5",
    "content-range",
    "content-type",
    "date",
    "etag",
    "expect",
    "expires",
    "from",
    "host",
    "if-match",
    "if-modified-since",
    "if-none-match",
    "if-range",
    "if-unmodified-since",
    "last-modified",
    "location",
    "max-forwards",
    "pragma",
    "proxy-authenticate",
    "proxy-authorization",
    "range",
    "referer",
    "retry-after",
    "server",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "user-agent",
    "vary",
    "via",
    "warning",
    "www-authenticate",
    "method",
    "get",
    "status",
    "200 OK",
    "version",
    "HTTP/1.1",
    "url",
    "public",
    "set-cookie",
    "keep-alive",
    "origin",
];

/// Raw text that ends the dictionary (status codes and common values, no separators).
const TAIL: &str = concat!(
    "100101201202205206300302303304305306307402405406407408409410411412413414415416417502504505",
    "203 Non-Authoritative Information204 No Content301 Moved Permanently400 Bad Request",
    "401 Unauthorized403 Forbidden404 Not Found500 Internal Server Error501 Not Implemented",
    "503 Service UnavailableJan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 ",
    "Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,image/png,image/jpg,image/gif,",
    "application/xml,application/xhtml+xml,text/plain,text/javascript,publicprivatemax-age=",
    "gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0.",
);

/// The SPDY/3 header dictionary (1423 bytes).
pub fn dictionary() -> &'static [u8] {
    static DICT: OnceLock<Vec<u8>> = OnceLock::new();
    DICT.get_or_init(|| {
        let mut d = Vec::with_capacity(1423);
        for w in WORDS {
            d.extend_from_slice(&(w.len() as u32).to_be_bytes());
            d.extend_from_slice(w.as_bytes());
        }
        d.extend_from_slice(TAIL.as_bytes());
        d
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dictionary_matches_the_spec_checksum() {
        let d = dictionary();
        assert_eq!(d.len(), 1423);
        // Adler-32 of the SPDY/3 dictionary, as carried in the zlib header's DICTID.
        let mut c = flate2::Compress::new(flate2::Compression::default(), true);
        let adler = c.set_dictionary(d).expect("set dictionary");
        assert_eq!(adler, 0xe3c6_a7c2);
    }
}
