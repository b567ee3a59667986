//! Node tokens (review H3): loaded from private files, sent as `authorization: Bearer …`
//! ([`AttachToken`], the client's side, lives in `hpk-signer-client`).
//!
//! A node's token is the HMAC-SHA256 of its name under the cluster's key
//! ([`hpk_rpc::node_token`]). The interceptor here refuses requests without a token of that
//! form; the service checks the token against the node the request names
//! ([`crate::service::Signer::sign`]), in constant time.

use std::path::Path;
use std::sync::Arc;

use hpk_rpc::log_limit::LogLimit;
use tonic::service::Interceptor;
use tonic::{Request, Status};
use tracing::warn;

use crate::{Error, Result};

pub use hpk_signer_client::token::AttachToken;

/// Shortest token accepted, so a placeholder cannot be mistaken for a secret.
const MIN_TOKEN_LEN: usize = 16;

/// Loads a token or the cluster's key from a 0600 file (surrounding whitespace ignored).
pub fn load(path: &Path) -> Result<String> {
    let raw = crate::secrets::read_private(path)?;
    let bad = |reason: &str| Error::BadToken { path: path.to_owned(), reason: reason.to_owned() };
    let text = String::from_utf8(raw).map_err(|_| bad("not UTF-8 text"))?;
    let token = text.trim();
    if token.len() < MIN_TOKEN_LEN {
        return Err(bad(&format!("shorter than {MIN_TOKEN_LEN} characters")));
    }
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(bad("contains spaces or non-printable characters"));
    }
    Ok(token.to_owned())
}

/// Server side: rejects requests without a bearer token of a node token's form, before their
/// body is read. Which node the token is good for is the service's check.
#[derive(Clone, Default)]
pub struct RequireToken {
    /// Refusals logged at most a few every 10 s: any peer can cause them.
    refusals: Arc<LogLimit>,
}

impl RequireToken {
    fn check(&self, request: &Request<()>) -> Result<()> {
        presented(request.metadata()).map(|_| ())
    }
}

/// The bearer token of a request, if it has a node token's form.
pub fn presented(metadata: &tonic::metadata::MetadataMap) -> Result<&[u8]> {
    let header = metadata.get("authorization").ok_or(Error::MissingToken)?;
    let token = header.as_bytes().strip_prefix(b"Bearer ").ok_or(Error::MissingToken)?;
    if hpk_rpc::node_token::well_formed(token) { Ok(token) } else { Err(Error::WrongToken) }
}

impl Interceptor for RequireToken {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        match self.check(&request) {
            Ok(()) => Ok(request),
            Err(err) => {
                if let Some(dropped) = self.refusals.admit() {
                    if let Some(summary) = self.refusals.summary(dropped) {
                        warn!(dropped, verdict = "unauthenticated", "{summary}");
                    }
                    let peer = request.remote_addr().map(|a| a.to_string()).unwrap_or_default();
                    warn!(%peer, verdict = "unauthenticated", reason = %err, "request refused");
                }
                Err(err.into())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request_with(header: Option<&str>) -> Request<()> {
        let mut request = Request::new(());
        if let Some(value) = header {
            request.metadata_mut().insert("authorization", value.parse().expect("ascii"));
        }
        request
    }

    #[test]
    fn only_a_bearer_token_of_the_right_form_passes_the_interceptor() {
        let mut check = RequireToken::default();
        let token = hpk_rpc::node_token::derive(b"key", "n1");
        assert!(check.call(request_with(Some(&format!("Bearer {token}")))).is_ok());
        for bad in [
            None,
            Some(token.clone()),
            Some(format!("Bearer {}", &token[1..])),
            Some(format!("Bearer {token}0")),
            Some(format!("Bearer {}", "g".repeat(64))),
            Some("Bearer 0123456789abcdef".into()),
        ] {
            let status = check.call(request_with(bad.as_deref())).expect_err("must be refused");
            assert_eq!(status.code(), tonic::Code::Unauthenticated, "{bad:?}");
        }
    }

    #[test]
    fn short_or_open_token_files_are_refused() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join("token");
        std::fs::write(&path, "short\n").expect("write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        assert!(matches!(load(&path), Err(Error::BadToken { .. })));
        std::fs::write(&path, "0123456789abcdef\n").expect("write");
        assert_eq!(load(&path).expect("good token"), "0123456789abcdef");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        assert!(matches!(load(&path), Err(Error::InsecureSecret { .. })));
    }
}
