//! Helpers every HPK gRPC service shares.
//!
//! - [`serve`]: run a set of tonic services on a UNIX socket or on TCP with TLS, always with
//!   `grpc.health.v1` and server reflection, stopping gracefully when a token is cancelled.
//! - [`connect`]: open a channel to such a server over a UNIX socket or TLS with a pinned CA.
//! - [`unix`]: socket-path hygiene (private directory, 0600 socket, stale sockets).
//! - [`telemetry`] and [`shutdown`]: tracing set-up and SIGTERM/SIGINT handling for `main`.

pub mod connect;
mod error;
pub mod serve;
pub mod shutdown;
pub mod telemetry;
pub mod unix;

pub use error::{Error, Result};
pub use serve::{Listener, Services, serve};
