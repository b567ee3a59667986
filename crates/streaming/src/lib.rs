//! The server side of the Kubernetes streaming protocols: `exec`, `attach` and
//! `port-forward`, as the CRI streaming server of `hpk-pod-runtime` (and later the kubelet's
//! HTTPS API).
//!
//! - [`StreamServer`] hands out single-use URLs (`/exec/<token>`, ...) and serves them.
//! - [`protocol`] serves an already-upgraded connection, for servers doing their own HTTP.
//! - [`spdy`] is the SPDY/3.1 framing and session, written for these protocols.
//!
//! See the crate's README for the protocols, limits and what is not implemented.

mod backend;
mod error;
mod outq;
mod pipe;
pub mod protocol;
mod server;
pub mod spdy;
mod status;
pub mod tokens;

pub use backend::{
    AsyncStream, AttachRequest, Backend, BoxFuture, BoxReader, BoxStream, BoxWriter, ExecRequest, Io,
    PortForwardRequest, TerminalSize,
};
pub use error::{Error, Result};
pub use server::StreamServer;
