//! hpk-cluster: what makes an HPK cluster, written once and used by both the `hpk` command (its
//! controller and node bubbles) and the test harness, so that the tests run the cluster the
//! product runs.
//!
//! - [`pki`]: the cluster's CAs, certificates and kubeconfigs (rcgen).
//! - [`addons`]: the cluster's addresses (Service and Pod CIDRs, cluster DNS) and its add-ons'
//!   flags and manifests (kube-proxy, CoreDNS).
//! - [`controlplane`]: the flags of etcd, kube-apiserver, kube-controller-manager and
//!   kube-scheduler.
//!
//! No service crate and no Kubernetes client here: flags, files and certificates only.

pub mod addons;
pub mod controlplane;
mod error;
pub mod files;
pub mod pki;

pub use error::{Error, Result};
