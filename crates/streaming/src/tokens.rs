//! Single-use, expiring tokens naming a pending streaming request (the path of the URL handed
//! out by the CRI `Exec`/`Attach`/`PortForward` responses).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::backend::{AttachRequest, ExecRequest, PortForwardRequest};
use crate::error::{Error, Result};
use crate::protocol::Endpoint;

/// How long a token stays valid unused (as the kubelet's streaming server).
pub const TOKEN_TTL: Duration = Duration::from_secs(60);
/// Most pending requests at once.
pub const MAX_PENDING: usize = 1000;
/// Random bytes in a token (hex-encoded in the URL).
const TOKEN_BYTES: usize = 16;

/// A request waiting for its client to connect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pending {
    /// For `/exec/<token>`.
    Exec(ExecRequest),
    /// For `/attach/<token>`.
    Attach(AttachRequest),
    /// For `/portforward/<token>`.
    PortForward(PortForwardRequest),
}

impl Pending {
    /// The endpoint this request is served on.
    pub fn endpoint(&self) -> Endpoint {
        match self {
            Pending::Exec(_) => Endpoint::Exec,
            Pending::Attach(_) => Endpoint::Attach,
            Pending::PortForward(_) => Endpoint::PortForward,
        }
    }
}

/// Pending requests by token.
#[derive(Debug, Default)]
pub struct TokenCache {
    entries: Mutex<HashMap<String, (Pending, Instant)>>,
}

impl TokenCache {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Pending, Instant)>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stores `req` under a fresh random token and returns the token.
    pub fn insert(&self, req: Pending) -> Result<String> {
        let mut raw = [0u8; TOKEN_BYTES];
        getrandom::fill(&mut raw)
            .map_err(|e| Error::Io { context: "generating a token", source: e.into() })?;
        let token = hex::encode(raw);
        let mut entries = self.lock();
        let now = Instant::now();
        entries.retain(|_, (_, expires)| *expires > now);
        if entries.len() >= MAX_PENDING {
            return Err(Error::TooManyPending(MAX_PENDING));
        }
        entries.insert(token.clone(), (req, now + TOKEN_TTL));
        Ok(token)
    }

    /// Whether `token` names an unexpired request for `endpoint`.
    pub fn contains(&self, token: &str, endpoint: Endpoint) -> bool {
        self.lock()
            .get(token)
            .is_some_and(|(req, expires)| *expires > Instant::now() && req.endpoint() == endpoint)
    }

    /// Removes and returns the request for `token` if it is unexpired and for `endpoint`.
    pub fn consume(&self, token: &str, endpoint: Endpoint) -> Option<Pending> {
        let mut entries = self.lock();
        let (req, expires) = entries.remove(token)?;
        if expires <= Instant::now() {
            return None;
        }
        if req.endpoint() != endpoint {
            // A token for another endpoint stays valid for its own.
            entries.insert(token.to_string(), (req, expires));
            return None;
        }
        Some(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pf() -> Pending {
        Pending::PortForward(PortForwardRequest { sandbox_id: "s".into(), ports: vec![] })
    }

    #[test]
    fn tokens_are_random_single_use_and_endpoint_bound() {
        let cache = TokenCache::default();
        let a = cache.insert(pf()).expect("insert");
        let b = cache.insert(pf()).expect("insert");
        assert_ne!(a, b);
        assert_eq!(a.len(), 32);
        assert!(cache.consume(&a, Endpoint::Exec).is_none());
        assert!(cache.contains(&a, Endpoint::PortForward));
        assert_eq!(cache.consume(&a, Endpoint::PortForward), Some(pf()));
        assert!(cache.consume(&a, Endpoint::PortForward).is_none());
        assert!(cache.consume("nope", Endpoint::PortForward).is_none());
    }

    #[test]
    fn expired_tokens_are_gone() {
        let cache = TokenCache::default();
        let t = cache.insert(pf()).expect("insert");
        if let Some((_, exp)) = cache.lock().get_mut(&t) {
            *exp = Instant::now();
        }
        assert!(!cache.contains(&t, Endpoint::PortForward));
        assert!(cache.consume(&t, Endpoint::PortForward).is_none());
    }
}
