//! The API objects a pod refers to (ConfigMaps, Secrets, PVCs/PVs, service-account tokens),
//! read as the node: the Node authorizer allows exactly those referenced by pods bound to it.

use std::future::Future;

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{
    ConfigMap, PersistentVolume, PersistentVolumeClaim, Secret, Service, ServiceAccount,
};
use kube::Api;
use kube::api::PostParams;
use kube::runtime::{WatchStreamExt, reflector, watcher};

/// How long a container start waits for the first list of Services before it fails (and is
/// retried), as the kubelet refuses to make service-link variables before it has them.
const SERVICES_WAIT: Duration = Duration::from_secs(10);

/// The Services have not been read from the API server yet.
#[derive(Debug, thiserror::Error)]
#[error("services have not yet been read at least once, cannot construct envvars")]
pub struct ServicesNotRead;

/// A service-account token as the TokenRequest API returned it.
#[derive(Clone, Debug)]
pub struct Token {
    /// The JWT.
    pub token: String,
    /// When it expires.
    pub expires: k8s_openapi::jiff::Timestamp,
}

/// Reads the objects a pod refers to. [`ApiObjects`] is the real one; a unit test may supply
/// its own.
pub trait ObjectSource: Send + Sync {
    /// ConfigMap `name` in `namespace`, `None` when it does not exist.
    fn config_map(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<ConfigMap>, kube::Error>> + Send;
    /// Secret `name` in `namespace`, `None` when it does not exist.
    fn secret(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<Secret>, kube::Error>> + Send;
    /// PersistentVolumeClaim `name` in `namespace`, `None` when it does not exist.
    fn persistent_volume_claim(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<PersistentVolumeClaim>, kube::Error>> + Send;
    /// PersistentVolume `name`, `None` when it does not exist.
    fn persistent_volume(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<Option<PersistentVolume>, kube::Error>> + Send;
    /// A token for service account `account` in `namespace`, bound to pod `pod_name`/`pod_uid`.
    fn service_account_token(
        &self,
        namespace: &str,
        account: &str,
        pod_name: &str,
        pod_uid: &str,
        audiences: Vec<String>,
        expiration_seconds: i64,
    ) -> impl Future<Output = Result<Token, kube::Error>> + Send;
    /// Every Service of the cluster (for the containers' service-link variables), as last
    /// seen; an error until they have been read once.
    fn services(&self) -> impl Future<Output = Result<Vec<Arc<Service>>, ServicesNotRead>> + Send;
}

/// [`ObjectSource`] over the API server; Services from a watch of all of them (the Node
/// authorizer lets a node list and watch Services), as the kubelet keeps them.
#[derive(Clone)]
pub struct ApiObjects {
    client: kube::Client,
    services: reflector::Store<Service>,
}

impl ApiObjects {
    /// Reads through `client` (the node's identity), and starts the watch of Services; it
    /// runs, backing off and retrying on errors, as long as the process does.
    pub fn new(client: kube::Client) -> Self {
        let (services, writer) = reflector::store();
        let watch =
            watcher(Api::<Service>::all(client.clone()), watcher::Config::default()).default_backoff();
        tokio::spawn(reflector::reflector(writer, watch).for_each(|event| async move {
            if let Err(error) = event {
                tracing::warn!(%error, "service watch interrupted");
            }
        }));
        Self { client, services }
    }

    /// One whose Services are `services`, read once, with no watch (for tests).
    #[cfg(test)]
    pub fn with_services(client: kube::Client, services: Vec<Service>) -> Self {
        let (store, mut writer) = reflector::store();
        writer.apply_watcher_event(&watcher::Event::Init);
        for service in services {
            writer.apply_watcher_event(&watcher::Event::InitApply(service));
        }
        writer.apply_watcher_event(&watcher::Event::InitDone);
        Self { client, services: store }
    }
}

impl ObjectSource for ApiObjects {
    async fn config_map(&self, namespace: &str, name: &str) -> Result<Option<ConfigMap>, kube::Error> {
        Api::<ConfigMap>::namespaced(self.client.clone(), namespace).get_opt(name).await
    }

    async fn secret(&self, namespace: &str, name: &str) -> Result<Option<Secret>, kube::Error> {
        Api::<Secret>::namespaced(self.client.clone(), namespace).get_opt(name).await
    }

    async fn persistent_volume_claim(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<PersistentVolumeClaim>, kube::Error> {
        Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), namespace).get_opt(name).await
    }

    async fn persistent_volume(&self, name: &str) -> Result<Option<PersistentVolume>, kube::Error> {
        Api::<PersistentVolume>::all(self.client.clone()).get_opt(name).await
    }

    async fn service_account_token(
        &self,
        namespace: &str,
        account: &str,
        pod_name: &str,
        pod_uid: &str,
        audiences: Vec<String>,
        expiration_seconds: i64,
    ) -> Result<Token, kube::Error> {
        let request = TokenRequest {
            spec: TokenRequestSpec {
                audiences,
                expiration_seconds: Some(expiration_seconds),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: Some(pod_name.into()),
                    uid: Some(pod_uid.into()),
                }),
            },
            ..TokenRequest::default()
        };
        let accounts = Api::<ServiceAccount>::namespaced(self.client.clone(), namespace);
        let answer: TokenRequest =
            accounts.create_subresource("token", account, &PostParams::default(), &request).await?;
        match answer.status {
            Some(status) => Ok(Token { token: status.token, expires: status.expiration_timestamp.0 }),
            None => Err(kube::Error::Service("TokenRequest answered without a status".into())),
        }
    }

    async fn services(&self) -> Result<Vec<Arc<Service>>, ServicesNotRead> {
        match tokio::time::timeout(SERVICES_WAIT, self.services.wait_until_ready()).await {
            Ok(Ok(())) => Ok(self.services.state()),
            _ => Err(ServicesNotRead),
        }
    }
}
