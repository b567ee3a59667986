//! Who is asking, and may they: the kubelet's own authentication and authorization, as the
//! upstream kubelet does them.
//!
//! - **Authentication**: a client certificate the TLS layer verified against the API server's
//!   client CA names the user (CN) and groups (O); otherwise a bearer token is checked with a
//!   TokenReview; otherwise the request is anonymous and refused (401).
//! - **Authorization**: a SubjectAccessReview for `nodes/<subresource>` of this node, the
//!   subresource and verb taken from the path and method ([`attributes`]); refused → 403.
//!
//! Both answers are cached (token: `--authentication-token-webhook-cache-ttl`; decisions:
//! `--authorization-webhook-cache-{authorized,unauthorized}-ttl`), keyed by a SHA-256 of the
//! token or by the whole user and request attributes.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use http::Method;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use kube::Api;
use kube::api::PostParams;
use sha2::{Digest, Sha256};

/// At most this many answers are cached per cache; beyond, expired ones are dropped, then all.
const CACHE_MAX: usize = 4096;

/// An authenticated user.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct User {
    /// The user name (a certificate's CN, a token's user).
    pub name: String,
    /// UID, when the token review gave one.
    pub uid: String,
    /// Groups, `system:authenticated` included.
    pub groups: Vec<String>,
    /// Extra attributes from the token review.
    pub extra: BTreeMap<String, Vec<String>>,
}

impl User {
    /// A user from a client certificate: CN and O, plus `system:authenticated`.
    pub fn from_certificate(name: String, mut groups: Vec<String>) -> Self {
        if !groups.iter().any(|g| g == "system:authenticated") {
            groups.push("system:authenticated".to_owned());
        }
        Self { name, uid: String::new(), groups, extra: BTreeMap::new() }
    }
}

/// A small map whose entries expire.
struct TtlCache<K, V> {
    entries: Mutex<HashMap<K, (Instant, V)>>,
}

impl<K: Eq + Hash, V: Clone> TtlCache<K, V> {
    fn new() -> Self {
        Self { entries: Mutex::new(HashMap::new()) }
    }

    fn get(&self, key: &K) -> Option<V> {
        let entries = self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        entries.get(key).filter(|(until, _)| *until > Instant::now()).map(|(_, v)| v.clone())
    }

    fn put(&self, key: K, value: V, ttl: Duration) {
        if ttl.is_zero() {
            return;
        }
        let mut entries = self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if entries.len() >= CACHE_MAX {
            let now = Instant::now();
            entries.retain(|_, (until, _)| *until > now);
            if entries.len() >= CACHE_MAX {
                entries.clear();
            }
        }
        entries.insert(key, (Instant::now() + ttl, value));
    }
}

/// The API server could not be asked about a token or a permission.
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    /// The TokenReview failed.
    #[error("TokenReview failed: {0}")]
    Token(#[source] kube::Error),
    /// The SubjectAccessReview failed.
    #[error("SubjectAccessReview failed: {0}")]
    Access(#[source] kube::Error),
}

/// Bearer tokens, checked with TokenReview as the node.
pub struct Authenticator {
    client: kube::Client,
    ttl: Duration,
    cache: TtlCache<[u8; 32], Option<User>>,
}

impl Authenticator {
    /// Reviews tokens through `client`, reusing answers for `ttl`.
    pub fn new(client: kube::Client, ttl: Duration) -> Self {
        Self { client, ttl, cache: TtlCache::new() }
    }

    /// The user `token` belongs to; `Ok(None)` when the API server says it is not valid.
    pub async fn token(&self, token: &str) -> Result<Option<User>, ReviewError> {
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if let Some(known) = self.cache.get(&key) {
            return Ok(known);
        }
        let review = TokenReview {
            spec: TokenReviewSpec { token: Some(token.to_owned()), audiences: None },
            ..TokenReview::default()
        };
        let answer = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(ReviewError::Token)?;
        let status = answer.status.unwrap_or_default();
        let user = match (status.authenticated, status.user) {
            (Some(true), Some(info)) => Some(User {
                name: info.username.unwrap_or_default(),
                uid: info.uid.unwrap_or_default(),
                groups: info.groups.unwrap_or_default(),
                extra: info.extra.unwrap_or_default(),
            }),
            _ => None,
        };
        self.cache.put(key, user.clone(), self.ttl);
        Ok(user)
    }
}

/// What a request asks to do to this node: the verb and the `nodes` subresources that allow
/// it, tried in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attributes {
    /// get, create, update, patch or delete.
    pub verb: &'static str,
    /// `nodes/<subresource>`s, any of which allows the request (the fine-grained one first,
    /// `proxy` as the fallback where Kubernetes 1.33+ kubelets accept it).
    pub subresources: &'static [&'static str],
}

/// The upstream kubelet's mapping of a request to authorization attributes: the method gives
/// the verb; `/stats` → stats, `/metrics` → metrics, `/logs` → log, `/spec` → spec,
/// `/configz` → configz, `/pods` → pods or proxy, `/healthz` → healthz or proxy,
/// `/containerLogs` → log or proxy (upstream asks proxy; the issue and RBAC users expect log),
/// everything else (exec, attach, portForward, run) → proxy.
pub fn attributes(method: &Method, path: &str) -> Attributes {
    let verb = match *method {
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "get",
    };
    let under = |prefix: &str| path == prefix || path.starts_with(&format!("{prefix}/"));
    let subresources: &'static [&'static str] = if under("/stats") {
        &["stats"]
    } else if under("/metrics") {
        &["metrics"]
    } else if under("/logs") {
        &["log"]
    } else if under("/spec") {
        &["spec"]
    } else if under("/configz") {
        &["configz"]
    } else if under("/pods") {
        &["pods", "proxy"]
    } else if under("/healthz") {
        &["healthz", "proxy"]
    } else if under("/containerLogs") {
        &["log", "proxy"]
    } else {
        &["proxy"]
    };
    Attributes { verb, subresources }
}

/// A decision: allowed, or why not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Go on.
    Allow,
    /// Refuse with this message.
    Deny(String),
}

/// SubjectAccessReviews for this node's subresources.
pub struct Authorizer {
    client: kube::Client,
    node: String,
    allowed_ttl: Duration,
    denied_ttl: Duration,
    cache: TtlCache<(User, &'static str, &'static str), bool>,
}

impl Authorizer {
    /// Asks the API server through `client` about node `node`.
    pub fn new(client: kube::Client, node: String, allowed_ttl: Duration, denied_ttl: Duration) -> Self {
        Self { client, node, allowed_ttl, denied_ttl, cache: TtlCache::new() }
    }

    /// May `user` do `attrs` on this node?
    pub async fn decide(&self, user: &User, attrs: &Attributes) -> Result<Decision, ReviewError> {
        for subresource in attrs.subresources {
            if self.allowed(user, attrs.verb, subresource).await? {
                return Ok(Decision::Allow);
            }
        }
        Ok(Decision::Deny(format!(
            "Forbidden (user={}, verb={}, resource=nodes, subresource={})",
            user.name,
            attrs.verb,
            attrs.subresources.join(" or ")
        )))
    }

    async fn allowed(
        &self,
        user: &User,
        verb: &'static str,
        subresource: &'static str,
    ) -> Result<bool, ReviewError> {
        let key = (user.clone(), verb, subresource);
        if let Some(known) = self.cache.get(&key) {
            return Ok(known);
        }
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.name.clone()),
                uid: (!user.uid.is_empty()).then(|| user.uid.clone()),
                groups: Some(user.groups.clone()),
                extra: (!user.extra.is_empty()).then(|| user.extra.clone()),
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(verb.to_owned()),
                    group: Some(String::new()),
                    version: Some("v1".to_owned()),
                    resource: Some("nodes".to_owned()),
                    subresource: Some(subresource.to_owned()),
                    name: Some(self.node.clone()),
                    ..ResourceAttributes::default()
                }),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        };
        let answer = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(ReviewError::Access)?;
        let allowed = answer.status.is_some_and(|s| s.allowed);
        let ttl = if allowed { self.allowed_ttl } else { self.denied_ttl };
        self.cache.put(key, allowed, ttl);
        Ok(allowed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_map_to_the_kubelets_subresources() {
        let get = |p: &str| attributes(&Method::GET, p).subresources;
        assert_eq!(get("/stats/summary"), ["stats"]);
        assert_eq!(get("/stats"), ["stats"]);
        assert_eq!(get("/metrics"), ["metrics"]);
        assert_eq!(get("/metrics/resource"), ["metrics"]);
        assert_eq!(get("/logs/syslog"), ["log"]);
        assert_eq!(get("/containerLogs/default/web/app"), ["log", "proxy"]);
        assert_eq!(get("/pods"), ["pods", "proxy"]);
        assert_eq!(get("/healthz"), ["healthz", "proxy"]);
        assert_eq!(get("/exec/default/web/app"), ["proxy"]);
        assert_eq!(get("/portForward/default/web"), ["proxy"]);
        // A prefix is a path segment, not a string prefix.
        assert_eq!(get("/statsx"), ["proxy"]);
        assert_eq!(get("/podsx"), ["proxy"]);
    }

    #[test]
    fn methods_map_to_verbs() {
        assert_eq!(attributes(&Method::POST, "/exec/a/b/c").verb, "create");
        assert_eq!(attributes(&Method::GET, "/exec/a/b/c").verb, "get");
        assert_eq!(attributes(&Method::PUT, "/x").verb, "update");
        assert_eq!(attributes(&Method::PATCH, "/x").verb, "patch");
        assert_eq!(attributes(&Method::DELETE, "/x").verb, "delete");
    }

    #[test]
    fn certificate_users_are_authenticated() {
        let u = User::from_certificate("admin".into(), vec!["system:masters".into()]);
        assert_eq!(u.groups, ["system:masters", "system:authenticated"]);
    }

    #[test]
    fn cached_answers_expire_and_zero_ttl_caches_nothing() {
        let cache: TtlCache<u32, bool> = TtlCache::new();
        cache.put(1, true, Duration::from_secs(60));
        cache.put(2, true, Duration::ZERO);
        cache.put(3, true, Duration::from_nanos(1));
        std::thread::sleep(Duration::from_millis(2));
        assert_eq!(cache.get(&1), Some(true));
        assert_eq!(cache.get(&2), None);
        assert_eq!(cache.get(&3), None);
    }
}
