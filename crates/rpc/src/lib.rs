//! Helpers every HPK gRPC service shares.
//!
//! - [`serve`]: run a set of tonic services on a UNIX socket or on TCP with TLS, always with
//!   `grpc.health.v1` and server reflection, stopping gracefully when a token is cancelled.
//!   With [`Listener::mutual_tls`], only clients with a certificate from a given CA are served,
//!   and one port carries gRPC (`h2`) and an HTTP/1.1 handler (`http/1.1`) side by side.
//!   Every call runs in a DEBUG span `rpc` ([`trace`]: method, peer, code, latency).
//! - [`connect`]: open a channel to such a server over a UNIX socket or TLS with a pinned CA,
//!   presenting a client certificate where the server asks for one.
//! - [`mtls`]: the rustls configurations of mutual TLS.
//! - [`unix`]: socket-path hygiene (private directory, 0600 socket, stale sockets).
//! - [`log_limit`]: rate limits for log lines a peer can cause (refusals, failed handshakes).
//! - [`node_token`]: per-node tokens, HMAC of the node's name under the cluster's key.
//! - [`flags`]: parsers for command-line flags the services share (durations).
//! - [`limits`]: the open-files limit raised to its hard limit, first thing in every `main`.
//! - [`telemetry`] and [`shutdown`]: tracing set-up and SIGTERM/SIGINT handling for `main`.

pub mod connect;
mod error;
pub mod flags;
pub mod limits;
pub mod log_limit;
pub mod mtls;
pub mod node_token;
pub mod readiness;
pub mod serve;
pub mod shutdown;
pub mod telemetry;
pub mod trace;
pub mod unix;

pub use error::{Error, Result};
pub use readiness::Readiness;
pub use serve::{Listener, Services, serve};
