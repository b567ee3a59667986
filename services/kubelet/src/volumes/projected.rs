//! Projected volumes: several sources (service-account token, configMap, secret, downwardAPI)
//! in one directory. The API server injects one into every pod (`kube-api-access-xxxxx`: a
//! token, `kube-root-ca.crt`'s `ca.crt` and the namespace) and this is the path it takes.
//!
//! Tokens are cached per volume and path and rotated once 80 % of their lifetime has passed or
//! they are older than 24 h, as the kubelet's token manager does.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Pod, ProjectedVolumeSource, ServiceAccountTokenProjection};
use k8s_openapi::jiff::Timestamp;
use tracing::debug;

use super::api_data::{DEFAULT_MODE, KeySource, mode_bits, project_downward};
use super::atomic::{FileData, Payload, check_path};
use super::{VolumeContext, VolumeError, ownership};
use crate::objects::ObjectSource;

/// A token older than this is rotated whatever its expiry says: the API server may hand out
/// tokens valid far longer than asked for (extended expiration).
const MAX_TOKEN_AGE_MS: i64 = 24 * 3600 * 1000;

/// The expiry a `serviceAccountToken` source asks for when it sets none (the API server's
/// default).
const DEFAULT_EXPIRATION_SECONDS: i64 = 3600;

/// A token we hold, and when we got it.
#[derive(Clone, Debug)]
pub struct CachedToken {
    /// The JWT.
    pub token: String,
    /// When we received it.
    pub fetched: Timestamp,
    /// When it expires.
    pub expires: Timestamp,
}

impl CachedToken {
    /// Whether it is time for a new one at `now`.
    pub fn due(&self, now: Timestamp) -> bool {
        let age = now.as_millisecond() - self.fetched.as_millisecond();
        let lifetime = self.expires.as_millisecond() - self.fetched.as_millisecond();
        age >= MAX_TOKEN_AGE_MS || age.saturating_mul(10) >= lifetime.saturating_mul(8)
    }
}

/// Tokens by `volume/path`.
pub type TokenCache = HashMap<String, CachedToken>;

/// The content of projected volume `volume` of `pod`.
pub async fn payload(
    volume: &str,
    pod: &Pod,
    source: &ProjectedVolumeSource,
    ctx: &VolumeContext,
    objects: &impl ObjectSource,
    tokens: &mut TokenCache,
) -> Result<Payload, VolumeError> {
    let default_mode = mode_bits(source.default_mode, DEFAULT_MODE);
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let mut payload = Payload::new();
    for projection in source.sources.iter().flatten() {
        if let Some(token) = &projection.service_account_token {
            check_path(volume, &token.path)?;
            let jwt = token_for(volume, pod, token, objects, tokens).await?;
            // As the kubelet does: the token belongs to the containers' common user, readable
            // by it (and, with an fsGroup, its group) only.
            let owner = ownership::fs_user_in(pod, ctx);
            let mode = if owner.is_some() || ownership::fs_group_in(pod, ctx).is_some() {
                0o600
            } else {
                default_mode
            };
            payload.insert(token.path.clone(), FileData { data: jwt.into_bytes(), mode, owner });
        } else if let Some(map) = &projection.config_map {
            let source = KeySource {
                kind: "ConfigMap",
                namespace,
                name: &map.name,
                items: map.items.as_deref(),
                optional: map.optional.unwrap_or(false),
            };
            source.project(volume, objects, default_mode, &mut payload).await?;
        } else if let Some(secret) = &projection.secret {
            let source = KeySource {
                kind: "Secret",
                namespace,
                name: &secret.name,
                items: secret.items.as_deref(),
                optional: secret.optional.unwrap_or(false),
            };
            source.project(volume, objects, default_mode, &mut payload).await?;
        } else if let Some(downward) = &projection.downward_api {
            let items = downward.items.as_deref().unwrap_or_default();
            project_downward(volume, pod, items, ctx, default_mode, &mut payload)?;
        } else {
            let kind = if projection.cluster_trust_bundle.is_some() {
                "projected clusterTrustBundle"
            } else if projection.pod_certificate.is_some() {
                "projected podCertificate"
            } else {
                "empty projected source"
            };
            return Err(VolumeError::Unsupported { volume: volume.to_owned(), kind: kind.to_owned() });
        }
    }
    Ok(payload)
}

/// The cached token for this source, or a new one when there is none or it is due.
async fn token_for(
    volume: &str,
    pod: &Pod,
    source: &ServiceAccountTokenProjection,
    objects: &impl ObjectSource,
    tokens: &mut TokenCache,
) -> Result<String, VolumeError> {
    let key = format!("{volume}/{}", source.path);
    let now = Timestamp::now();
    if let Some(cached) = tokens.get(&key)
        && !cached.due(now)
    {
        return Ok(cached.token.clone());
    }
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let account = pod
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.as_deref())
        .filter(|a| !a.is_empty())
        .unwrap_or("default");
    let audiences: Vec<String> = source.audience.iter().filter(|a| !a.is_empty()).cloned().collect();
    let expiration = source.expiration_seconds.unwrap_or(DEFAULT_EXPIRATION_SECONDS);
    let token = objects
        .service_account_token(
            namespace,
            account,
            pod.metadata.name.as_deref().unwrap_or_default(),
            pod.metadata.uid.as_deref().unwrap_or_default(),
            audiences,
            expiration,
        )
        .await
        .map_err(|source| VolumeError::Api {
            volume: volume.to_owned(),
            what: format!("a token for service account {namespace}/{account}"),
            source,
        })?;
    debug!(volume, path = %source.path, expires = %token.expires, "service-account token fetched");
    let cached = CachedToken { token: token.token, fetched: now, expires: token.expires };
    let jwt = cached.token.clone();
    tokens.insert(key, cached);
    Ok(jwt)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::jiff::SignedDuration;

    use super::*;

    fn token(lifetime: SignedDuration) -> (CachedToken, Timestamp) {
        let fetched = Timestamp::now();
        (CachedToken { token: "t".into(), fetched, expires: fetched + lifetime }, fetched)
    }

    #[test]
    fn a_token_is_due_at_80_percent_or_24_hours() {
        let (hour, at) = token(SignedDuration::from_hours(1));
        assert!(!hour.due(at + SignedDuration::from_mins(47)), "78 % of an hour");
        assert!(hour.due(at + SignedDuration::from_mins(48)), "80 % of an hour");
        let (year, at) = token(SignedDuration::from_hours(24 * 365));
        assert!(!year.due(at + SignedDuration::from_hours(23)));
        assert!(year.due(at + SignedDuration::from_hours(24)), "an extended token still rotates daily");
        let (expired, at) = token(SignedDuration::from_secs(-5));
        assert!(expired.due(at), "already expired");
    }
}
