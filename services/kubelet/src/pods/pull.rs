//! Images: imagePullPolicy decides whether to pull; imagePullSecrets give the registry
//! credentials (`.dockerconfigjson` / `.dockercfg` Secrets), matched on the image's registry.

use std::time::Instant;

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{Container, Pod};

use super::error::{RETRY_CONTAINER, Reason, Retry, StepError};
use crate::cri::CriClient;
use crate::objects::ObjectSource;

/// An image ready to run.
#[derive(Clone, Debug)]
pub struct Ready {
    /// The reference to create containers from (the runtime's image id).
    pub image_ref: String,
    /// The image's numeric user, when it sets one.
    pub uid: Option<i64>,
    /// The image's user name, when not numeric.
    pub username: String,
    /// Set when this call pulled the image: how long it took.
    pub pulled_in: Option<std::time::Duration>,
}

/// Why an image is not ready; `reason` is what the container's waiting state shows.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{reason}: {message}")]
pub struct NotReady {
    /// ErrImagePull, ErrImageNeverPull, InvalidImageName.
    pub reason: Reason,
    /// What went wrong.
    pub message: String,
}

impl NotReady {
    /// The worker's error: a failed pull is tried again after the image's back-off, a wrong
    /// name or policy after a while.
    pub fn into_step_error(self) -> StepError {
        let retry =
            if self.reason == Reason::ErrImagePull { Retry::BackOff } else { Retry::After(RETRY_CONTAINER) };
        StepError::new(self.reason, self.message, retry)
    }
}

/// The pull policy in force: the spec's, else Always for `:latest` or no tag, else IfNotPresent.
pub fn policy(container: &Container) -> &'static str {
    match container.image_pull_policy.as_deref() {
        Some("Always") => "Always",
        Some("Never") => "Never",
        Some("IfNotPresent") => "IfNotPresent",
        _ => {
            let image = container.image.as_deref().unwrap_or("");
            let without_digest = image.split('@').next().unwrap_or(image);
            let last = without_digest.rsplit('/').next().unwrap_or(without_digest);
            if image.contains('@') {
                "IfNotPresent"
            } else {
                match last.split_once(':') {
                    Some((_, "latest")) | None => "Always",
                    Some(_) => "IfNotPresent",
                }
            }
        }
    }
}

/// The registry host of an image reference (`docker.io` when it names none).
pub fn registry_of(image: &str) -> &str {
    match image.split_once('/') {
        Some((first, _)) if first.contains('.') || first.contains(':') || first == "localhost" => first,
        _ => "docker.io",
    }
}

/// Looks the image up, pulling it as the policy says.
pub async fn ensure(
    runtime: &dyn CriClient,
    objects: &impl ObjectSource,
    pod: &Pod,
    container: &Container,
    on_pulling: impl FnOnce(),
) -> Result<Ready, NotReady> {
    let image = container.image.clone().unwrap_or_default();
    if image.trim().is_empty() || image.chars().any(char::is_whitespace) {
        return Err(NotReady {
            reason: Reason::InvalidImageName,
            message: format!("invalid image name {image:?}"),
        });
    }
    let spec = cri::ImageSpec { image: image.clone(), ..cri::ImageSpec::default() };
    let present = status(runtime, &spec).await;
    let policy = policy(container);
    if let Some(ready) = present.clone().filter(|_| policy != "Always") {
        return Ok(ready);
    }
    if policy == "Never" {
        return Err(NotReady {
            reason: Reason::ErrImageNeverPull,
            message: format!("Container image {image:?} is not present with pull policy of Never"),
        });
    }
    on_pulling();
    let auth = credentials(objects, pod, registry_of(&image)).await;
    let started = Instant::now();
    match runtime.pull_image(spec.clone(), auth).await {
        Ok(image_ref) => {
            let found = status(runtime, &spec).await;
            Ok(Ready {
                image_ref: if image_ref.is_empty() { image } else { image_ref },
                uid: found.as_ref().and_then(|f| f.uid),
                username: found.map(|f| f.username).unwrap_or_default(),
                pulled_in: Some(started.elapsed()),
            })
        }
        Err(error) => Err(NotReady {
            reason: Reason::ErrImagePull,
            message: format!("failed to pull image {image:?}: {}", error.message()),
        }),
    }
}

async fn status(runtime: &dyn CriClient, spec: &cri::ImageSpec) -> Option<Ready> {
    let image = runtime.image_status(spec.clone()).await.ok()??;
    Some(Ready {
        image_ref: image.id.clone(),
        uid: image.uid.map(|u| u.value),
        username: image.username,
        pulled_in: None,
    })
}

/// The first credentials in the pod's imagePullSecrets for `registry`.
async fn credentials(objects: &impl ObjectSource, pod: &Pod, registry: &str) -> Option<cri::AuthConfig> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    for reference in pod.spec.iter().flat_map(|s| s.image_pull_secrets.iter().flatten()) {
        let Ok(Some(secret)) = objects.secret(namespace, &reference.name).await else {
            tracing::warn!(secret = %reference.name, "imagePullSecret not found");
            continue;
        };
        let data = secret.data.unwrap_or_default();
        let config = match (data.get(".dockerconfigjson"), data.get(".dockercfg")) {
            (Some(json), _) => serde_json::from_slice::<serde_json::Value>(&json.0)
                .ok()
                .and_then(|v| v.get("auths").cloned()),
            (None, Some(cfg)) => serde_json::from_slice::<serde_json::Value>(&cfg.0).ok(),
            _ => None,
        };
        if let Some(found) = config.and_then(|auths| match_registry(&auths, registry)) {
            return Some(found);
        }
    }
    None
}

/// The entry of a `auths` map for `registry` (keys may carry a scheme or a path).
fn match_registry(auths: &serde_json::Value, registry: &str) -> Option<cri::AuthConfig> {
    let map = auths.as_object()?;
    let host_of = |key: &str| {
        let key = key.strip_prefix("https://").or_else(|| key.strip_prefix("http://")).unwrap_or(key);
        key.split('/').next().unwrap_or(key).to_owned()
    };
    let wanted = if registry == "docker.io" {
        ["docker.io", "index.docker.io", "registry-1.docker.io"].as_slice()
    } else {
        std::slice::from_ref(&registry)
    };
    let (key, entry) = map.iter().find(|(k, _)| wanted.contains(&host_of(k).as_str()))?;
    let text = |name: &str| entry.get(name).and_then(|v| v.as_str()).unwrap_or("").to_owned();
    Some(cri::AuthConfig {
        username: text("username"),
        password: text("password"),
        auth: text("auth"),
        server_address: key.clone(),
        identity_token: text("identitytoken"),
        registry_token: text("registrytoken"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container(image: &str, policy: Option<&str>) -> Container {
        Container {
            name: "c".into(),
            image: Some(image.into()),
            image_pull_policy: policy.map(Into::into),
            ..Container::default()
        }
    }

    #[test]
    fn pull_policy_defaults_like_the_api_server() {
        assert_eq!(policy(&container("busybox", None)), "Always");
        assert_eq!(policy(&container("busybox:latest", None)), "Always");
        assert_eq!(policy(&container("localhost:5000/busybox", None)), "Always", "a port is not a tag");
        assert_eq!(policy(&container("localhost:5000/busybox:1.36", None)), "IfNotPresent");
        assert_eq!(policy(&container("busybox@sha256:abc", None)), "IfNotPresent");
        assert_eq!(policy(&container("busybox", Some("Never"))), "Never");
    }

    #[test]
    fn credentials_match_the_images_registry() {
        assert_eq!(registry_of("10.250.1.1:5000/hpk/shell:v1"), "10.250.1.1:5000");
        assert_eq!(registry_of("library/busybox"), "docker.io");
        let auths = serde_json::json!({
            "https://index.docker.io/v1/": {"auth": "aHViOnB3"},
            "10.250.1.1:5000": {"username": "u", "password": "p"}
        });
        let found = match_registry(&auths, "10.250.1.1:5000").expect("found");
        assert_eq!((found.username.as_str(), found.password.as_str()), ("u", "p"));
        assert_eq!(match_registry(&auths, "docker.io").expect("hub").auth, "aHViOnB3");
        assert!(match_registry(&auths, "quay.io").is_none());
    }
}
