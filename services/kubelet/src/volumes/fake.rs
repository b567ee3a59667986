//! An [`ObjectSource`] for tests: objects in maps, tokens numbered, and a record of how many
//! tokens were asked for.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolume, PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use crate::objects::{ObjectSource, ServicesNotRead, Token};

/// A token request as the fake saw it: namespace, account, pod name, audiences, expiration seconds.
pub type TokenRequestSeen = (String, String, String, Vec<String>, i64);

/// Objects by `namespace/name` (PersistentVolumes by name).
#[derive(Default)]
pub struct FakeObjects {
    pub config_maps: Mutex<HashMap<String, ConfigMap>>,
    pub secrets: Mutex<HashMap<String, Secret>>,
    pub claims: Mutex<HashMap<String, PersistentVolumeClaim>>,
    pub volumes: Mutex<HashMap<String, PersistentVolume>>,
    /// Lifetime of the tokens handed out, milliseconds; 0 means as asked.
    pub token_lifetime_ms: AtomicU32,
    /// Tokens handed out so far.
    pub tokens_issued: AtomicU32,
    /// The last token request: namespace, account, pod name, audiences, expiration seconds.
    pub last_token_request: Mutex<Option<TokenRequestSeen>>,
    /// Every Service of the cluster.
    pub services: Vec<Service>,
}

impl FakeObjects {
    pub fn add_config_map(&self, value: serde_json::Value) {
        let map: ConfigMap = serde_json::from_value(value).expect("configmap");
        let key = format!(
            "{}/{}",
            map.metadata.namespace.as_deref().unwrap_or("ns"),
            map.metadata.name.clone().unwrap_or_default()
        );
        self.config_maps.lock().expect("lock").insert(key, map);
    }

    pub fn add_secret(&self, value: serde_json::Value) {
        let secret: Secret = serde_json::from_value(value).expect("secret");
        let key = format!(
            "{}/{}",
            secret.metadata.namespace.as_deref().unwrap_or("ns"),
            secret.metadata.name.clone().unwrap_or_default()
        );
        self.secrets.lock().expect("lock").insert(key, secret);
    }

    pub fn add_claim(&self, value: serde_json::Value) {
        let claim: PersistentVolumeClaim = serde_json::from_value(value).expect("claim");
        let key = format!(
            "{}/{}",
            claim.metadata.namespace.as_deref().unwrap_or("ns"),
            claim.metadata.name.clone().unwrap_or_default()
        );
        self.claims.lock().expect("lock").insert(key, claim);
    }

    pub fn add_volume(&self, value: serde_json::Value) {
        let pv: PersistentVolume = serde_json::from_value(value).expect("pv");
        self.volumes.lock().expect("lock").insert(pv.metadata.name.clone().unwrap_or_default(), pv);
    }
}

impl ObjectSource for FakeObjects {
    async fn config_map(&self, namespace: &str, name: &str) -> Result<Option<ConfigMap>, kube::Error> {
        Ok(self.config_maps.lock().expect("lock").get(&format!("{namespace}/{name}")).cloned())
    }

    async fn secret(&self, namespace: &str, name: &str) -> Result<Option<Secret>, kube::Error> {
        Ok(self.secrets.lock().expect("lock").get(&format!("{namespace}/{name}")).cloned())
    }

    async fn persistent_volume_claim(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<PersistentVolumeClaim>, kube::Error> {
        Ok(self.claims.lock().expect("lock").get(&format!("{namespace}/{name}")).cloned())
    }

    async fn persistent_volume(&self, name: &str) -> Result<Option<PersistentVolume>, kube::Error> {
        Ok(self.volumes.lock().expect("lock").get(name).cloned())
    }

    async fn service_account_token(
        &self,
        namespace: &str,
        account: &str,
        pod_name: &str,
        _pod_uid: &str,
        audiences: Vec<String>,
        expiration_seconds: i64,
    ) -> Result<Token, kube::Error> {
        let n = self.tokens_issued.fetch_add(1, Ordering::SeqCst) + 1;
        let lifetime_ms = match self.token_lifetime_ms.load(Ordering::SeqCst) {
            0 => expiration_seconds * 1000,
            ms => i64::from(ms),
        };
        *self.last_token_request.lock().expect("lock") =
            Some((namespace.into(), account.into(), pod_name.into(), audiences, expiration_seconds));
        let expires = Timestamp::now() + SignedDuration::from_millis(lifetime_ms);
        Ok(Token { token: format!("token-{n}"), expires })
    }

    async fn services(&self) -> Result<Vec<std::sync::Arc<Service>>, ServicesNotRead> {
        Ok(self.services.iter().cloned().map(std::sync::Arc::new).collect())
    }
}

/// A pod in namespace `ns` named `web` with `volumes` and one container mounting `mounts`.
pub fn pod(volumes: serde_json::Value, mounts: serde_json::Value) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web", "namespace": "ns", "uid": "uid-1",
                     "labels": {"app": "web", "tier": "front"}},
        "spec": {
            "serviceAccountName": "builder",
            "volumes": volumes,
            "containers": [{"name": "main", "image": "busybox", "volumeMounts": mounts}],
        },
    }))
    .expect("pod")
}
