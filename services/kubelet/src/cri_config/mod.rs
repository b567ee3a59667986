//! From a Pod to the CRI configs the pod-runtime is given: the container's environment
//! (`env.rs`, with `$(VAR)` expansion from `expand.rs`), the sandbox (`sandbox.rs`, its DNS in
//! `dns.rs`), the container (`container.rs`) and the security contexts of both
//! (`security.rs`), and which of its IDs the bubble cannot honour (`unmapped.rs`). Everything here is pure but for reading ConfigMaps and Secrets (through an
//! [`ObjectSource`](crate::objects::ObjectSource)) and the host's resolv.conf.

mod container;
mod dns;
mod env;
mod expand;
mod sandbox;
mod security;
mod service_env;
mod unmapped;

#[cfg(test)]
mod fixtures;

pub use container::{container_config, resources as linux_resources};
pub use dns::DnsSettings;
pub use env::{ResolvedEnv, resolve_env};
pub use expand::expand;
pub use sandbox::sandbox_config;
pub use security::verify_run_as_non_root;
pub use unmapped::{NOT_HONOURED_REASON, not_honoured};

use crate::downward::DownwardError;
use crate::quantity::InvalidQuantity;

/// Errors that make a container's (or the sandbox's) config impossible: the pod shows
/// `CreateContainerConfigError` with this message.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// A ConfigMap or Secret the container needs does not exist (`kind` is `configmap` or
    /// `secret`, as the API server words it).
    #[error("{kind} {name:?} not found")]
    NotFound {
        /// `configmap` or `secret`.
        kind: &'static str,
        /// The object's name.
        name: String,
    },
    /// The object exists but lacks the key an env var refers to.
    #[error("couldn't find key {key:?} in {kind} {namespace}/{name}")]
    MissingKey {
        /// `ConfigMap` or `Secret`.
        kind: &'static str,
        /// The key asked for.
        key: String,
        /// The pod's namespace.
        namespace: String,
        /// The object's name.
        name: String,
    },
    /// Reading a ConfigMap or Secret failed for another reason than its absence.
    #[error("couldn't read {kind} {namespace}/{name}: {source}")]
    Read {
        /// `configmap` or `secret`.
        kind: &'static str,
        /// The pod's namespace.
        namespace: String,
        /// The object's name.
        name: String,
        /// What the API server (or the transport) said (boxed: it is large).
        #[source]
        source: Box<kube::Error>,
    },
    /// A `fieldRef` or `resourceFieldRef` the downward API cannot resolve.
    #[error("env {env:?}: {source}")]
    Downward {
        /// The variable being defined.
        env: String,
        /// Why it could not be resolved.
        #[source]
        source: DownwardError,
    },
    /// An env source this kubelet does not implement (e.g. `fileKeyRef`).
    #[error("env {env:?}: {what} is not supported")]
    Unsupported {
        /// The variable being defined.
        env: String,
        /// What it asked for.
        what: &'static str,
    },
    /// The Services (for the service-link variables) have not been read yet.
    #[error(transparent)]
    Services(#[from] crate::objects::ServicesNotRead),
    /// A resource quantity of the container that does not parse.
    #[error("container {container}: {resource}: {source}")]
    Quantity {
        /// The container's name.
        container: String,
        /// e.g. `limits.cpu`.
        resource: String,
        /// The quantity that failed.
        #[source]
        source: InvalidQuantity,
    },
    /// The host's resolv.conf (for `dnsPolicy: Default`) cannot be read.
    #[error("couldn't read the host's DNS config {path}: {source}")]
    ResolvConf {
        /// Its path.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The pod's hostname cannot be used.
    #[error("pod hostname {hostname:?} is invalid: {reason}")]
    Hostname {
        /// The hostname as derived from the pod.
        hostname: String,
        /// Why it cannot be used.
        reason: String,
    },
    /// runAsNonRoot with `runAsUser: 0`.
    #[error("container's runAsUser breaks non-root policy (pod: {pod:?}, container: {container})")]
    RunAsUserRoot {
        /// `name_namespace(uid)`.
        pod: String,
        /// The container's name.
        container: String,
    },
    /// runAsNonRoot with no runAsUser and an image whose user is root.
    #[error("container has runAsNonRoot and image will run as root (pod: {pod:?}, container: {container})")]
    ImageRunsAsRoot {
        /// `name_namespace(uid)`.
        pod: String,
        /// The container's name.
        container: String,
    },
    /// runAsNonRoot with no runAsUser and an image user given by name.
    #[error(
        "container has runAsNonRoot and image has non-numeric user ({user}), cannot verify user is non-root \
         (pod: {pod:?}, container: {container})"
    )]
    NonNumericUser {
        /// The image's user.
        user: String,
        /// `name_namespace(uid)`.
        pod: String,
        /// The container's name.
        container: String,
    },
}

/// The pod as the kubelet names it in messages: `name_namespace(uid)`.
pub(crate) fn pod_display(pod: &k8s_openapi::api::core::v1::Pod) -> String {
    let m = &pod.metadata;
    format!(
        "{}_{}({})",
        m.name.as_deref().unwrap_or_default(),
        m.namespace.as_deref().unwrap_or_default(),
        m.uid.as_deref().unwrap_or_default()
    )
}
