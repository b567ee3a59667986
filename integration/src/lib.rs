//! The real-cluster test harness.
//!
//! - [`netns`]: test hosts — network namespaces joined by a bridge on a private subnet of our own.
//! - [`pki`]: the cluster's certificates, generated with rcgen.
//! - [`controlplane`]: etcd, kube-apiserver, kube-controller-manager and kube-scheduler (the
//!   upstream ones, built by `controlplane/build.sh`), each its own process on a test host.
//! - [`registry`] and [`image`]: a local OCI registry and test images built without Docker.
//!
//! Everything a harness object creates it removes when dropped, also while a test panics.

pub mod image;
pub mod registry;
