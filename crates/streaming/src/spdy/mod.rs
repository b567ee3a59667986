//! SPDY/3.1, written for the Kubernetes streaming protocols: framing ([`frame`]), header
//! compression ([`headers`]) and a server-side session ([`session`]).

pub mod dictionary;
pub mod frame;
pub mod headers;
pub mod session;

pub use frame::{Frame, FrameCodec};
pub use headers::Headers;
pub use session::{NewStream, Session, SpdyStream, StreamReader, StreamWriter};
