//! The crate's one error type.

use std::io;

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can go wrong while serving a streaming session.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A request handed to `exec_url`/`attach_url`/`port_forward_url` is not valid.
    #[error("invalid streaming request: {0}")]
    InvalidRequest(String),
    /// Too many URLs are waiting to be used.
    #[error("too many pending streaming requests (at most {0})")]
    TooManyPending(usize),
    /// The peer sent bytes that are not a valid SPDY/3.1 frame.
    #[error("malformed SPDY frame: {0}")]
    MalformedFrame(String),
    /// The connection ended in the middle of a frame.
    #[error("connection closed in the middle of a SPDY frame ({0} bytes left over)")]
    TruncatedFrame(usize),
    /// A frame is larger than this server accepts.
    #[error("SPDY {kind} frame of {len} bytes exceeds the limit of {max} bytes")]
    FrameTooLarge {
        /// Control or data.
        kind: &'static str,
        /// Announced length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A SPDY control frame of a version other than 3.
    #[error("unsupported SPDY version {0} (only SPDY/3.1 is spoken)")]
    UnsupportedVersion(u16),
    /// A SPDY header block could not be decompressed or parsed.
    #[error("invalid SPDY header block: {0}")]
    HeaderBlock(String),
    /// A decompressed SPDY header block is larger than the limit.
    #[error("SPDY header block exceeds the limit of {max} bytes")]
    HeaderBlockTooLarge {
        /// The limit.
        max: usize,
    },
    /// The peer violated the SPDY session rules (stream ids, duplicate streams).
    #[error("SPDY protocol error: {0}")]
    Protocol(String),
    /// The client did not open the streams it announced in time.
    #[error("timed out after {0:?} waiting for the client to create streams")]
    StreamCreationTimeout(std::time::Duration),
    /// WebSocket failure.
    #[error("websocket: {0}")]
    WebSocket(#[source] Box<tokio_tungstenite::tungstenite::Error>),
    /// Reading or writing the connection failed.
    #[error("connection: {0}")]
    Connection(#[from] io::Error),
    /// I/O failed while doing something specific.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: &'static str,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

impl From<tokio_tungstenite::tungstenite::Error> for Error {
    fn from(e: tokio_tungstenite::tungstenite::Error) -> Self {
        Error::WebSocket(Box::new(e))
    }
}
