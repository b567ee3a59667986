//! hpk-signer-client: what a node needs to get its kubelet certificates from the cert-signer.
//!
//! The node generates its key locally ([`client::SignerClient::request`]: the key never leaves),
//! sends a CSR for it with its node token ([`token::AttachToken`]), checks the answer is for that
//! key, writes key and certificate atomically ([`files::write_atomic`]) and renews at two thirds
//! of the lifetime ([`client::keep_renewed`]). [`Profile`] and [`San`] are the terms of a request,
//! shared with the signer (`hpk-cert-signer`), which depends on this crate, never the reverse.

pub mod client;
mod error;
pub mod files;
pub mod san;
pub mod token;

pub use client::{CertRequest, Credentials, SignerClient, build_csr, keep_renewed};
pub use error::{Error, Result};
pub use san::San;

/// Which kind of certificate a request is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Profile {
    /// The kubelet API's TLS serving certificate (serverAuth, node SANs).
    Serving,
    /// The node's client identity toward the API server (clientAuth, no SANs).
    Client,
}

impl std::fmt::Display for Profile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Serving => "serving",
            Self::Client => "client",
        })
    }
}
