//! hpk-kubelet: the bubble's face to Kubernetes. It registers the node, keeps its Lease, and
//! drives every pod bound to it through the pod-runtime over CRI v1.
//!
//! `main.rs` only wires; each concern is a module here (see ARCHITECTURE.md).

pub mod cri;
pub mod downward;
pub mod node;
pub mod objects;
pub mod probes;
pub mod quantity;
pub mod spec;
pub mod volumes;
