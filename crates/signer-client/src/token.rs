//! The node token on the wire: every request carries `authorization: Bearer <token>`.

use tonic::metadata::MetadataValue;
use tonic::service::Interceptor;
use tonic::{Request, Status};

use crate::{Error, Result};

/// Client side: attaches the bearer token to every request.
#[derive(Clone)]
pub struct AttachToken {
    value: MetadataValue<tonic::metadata::Ascii>,
}

impl AttachToken {
    /// Attaches `token`; fails if it cannot be sent as a header.
    pub fn new(token: &str) -> Result<Self> {
        let mut value: MetadataValue<_> =
            format!("Bearer {token}").parse().map_err(|_| Error::TokenNotSendable)?;
        value.set_sensitive(true);
        Ok(Self { value })
    }
}

impl Interceptor for AttachToken {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        request.metadata_mut().insert("authorization", self.value.clone());
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attaches_the_token_as_a_sensitive_bearer_header() {
        let mut attach = AttachToken::new("0123456789abcdef").expect("printable token");
        let request = attach.call(Request::new(())).expect("never refuses");
        let header = request.metadata().get("authorization").expect("attached");
        assert_eq!(header.to_str().expect("ascii"), "Bearer 0123456789abcdef");
        assert!(header.is_sensitive(), "kept out of debug output");
        assert!(matches!(AttachToken::new("line\nbreak"), Err(Error::TokenNotSendable)));
    }
}
