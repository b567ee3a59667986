//! Test fixtures: pods from JSON and an in-memory [`ObjectSource`].

use std::collections::HashMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolume, PersistentVolumeClaim, Pod, Secret, Service};

use crate::objects::{ObjectSource, ServicesNotRead, Token};

/// A pod from a JSON literal (metadata name `web`, namespace `default`, uid `uid-1` unless given).
pub fn pod(spec: serde_json::Value) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web", "namespace": "default", "uid": "uid-1"},
        "spec": spec,
    }))
    .expect("a valid pod")
}

/// ConfigMaps and Secrets by name, all in one namespace.
#[derive(Default)]
pub struct FakeObjects {
    pub config_maps: HashMap<String, ConfigMap>,
    pub secrets: HashMap<String, Secret>,
    /// Every Service of the cluster.
    pub services: Vec<Service>,
}

impl FakeObjects {
    pub fn with_config_map(mut self, name: &str, data: &[(&str, &str)]) -> Self {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(name.into());
        cm.data = Some(data.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
        self.config_maps.insert(name.into(), cm);
        self
    }

    pub fn with_secret(mut self, name: &str, data: &[(&str, &str)]) -> Self {
        let mut secret = Secret::default();
        secret.metadata.name = Some(name.into());
        secret.data =
            Some(data.iter().map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec()))).collect());
        self.secrets.insert(name.into(), secret);
        self
    }

    pub fn with_service(mut self, service: serde_json::Value) -> Self {
        self.services.push(serde_json::from_value(service).expect("a valid service"));
        self
    }
}

impl ObjectSource for FakeObjects {
    async fn config_map(&self, _namespace: &str, name: &str) -> Result<Option<ConfigMap>, kube::Error> {
        Ok(self.config_maps.get(name).cloned())
    }

    async fn secret(&self, _namespace: &str, name: &str) -> Result<Option<Secret>, kube::Error> {
        Ok(self.secrets.get(name).cloned())
    }

    async fn persistent_volume_claim(
        &self,
        _namespace: &str,
        _name: &str,
    ) -> Result<Option<PersistentVolumeClaim>, kube::Error> {
        Ok(None)
    }

    async fn persistent_volume(&self, _name: &str) -> Result<Option<PersistentVolume>, kube::Error> {
        Ok(None)
    }

    async fn service_account_token(
        &self,
        _namespace: &str,
        _account: &str,
        _pod_name: &str,
        _pod_uid: &str,
        _audiences: Vec<String>,
        _expiration_seconds: i64,
    ) -> Result<Token, kube::Error> {
        Err(kube::Error::Service("no tokens in this fake".into()))
    }

    async fn services(&self) -> Result<Vec<std::sync::Arc<Service>>, ServicesNotRead> {
        Ok(self.services.iter().cloned().map(std::sync::Arc::new).collect())
    }
}
