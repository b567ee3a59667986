//! hpk-kubelet: the bubble's face to Kubernetes. It registers the node, keeps its Lease, and
//! drives every pod bound to it through the pod-runtime over CRI v1.
//!
//! `main.rs` only wires; each concern is a module here (see ARCHITECTURE.md).

pub mod api;
pub mod config;
pub mod cri;
pub mod diag;
pub mod downward;
mod error;
pub mod events;
pub mod eviction;
pub mod gpus;
pub mod image_gc;
pub mod log_rotation;
/// The bubble's ID mappings (`hpk-node-resources`).
pub use hpk_node_resources::ids as idmap;
pub mod cri_config;
pub mod node;
pub mod objects;
pub mod pods;
pub mod probes;
pub mod quantity;
pub mod remote_files;
mod server;
pub mod volumes;

pub use error::{Error, Result};
pub use server::run;
