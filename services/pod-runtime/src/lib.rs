//! hpk-pod-runtime: turns "run this pod" into sandboxes and containers in a bubble.
//!
//! A CRI v1 runtime (issue 4, in progress):
//! - [`server`]: `run` — the CRI `RuntimeService` and `ImageService` on a UNIX socket.
//! - [`cri`]: the gRPC adapters; [`runtime`]: sandboxes, containers, their exits.
//! - [`remote`]: `hpk.podruntime.v1.Remote` for a kubelet on another machine (files, logs,
//!   allocation).
//! - [`engine`]: the crun engine: OCI bundles, overlay roots, CRI logs, the mount namespace.
//! - [`images`]: the OCI image store of the crun engine.
//! - [`pause`]: the logic of `hpk-pause`, PID 1 of every sandbox.
//! - [`idmap`]: which user and group IDs exist in this bubble (one, or several).
//! - [`logshim`]: the per-container process that writes a container's output to its CRI log.

pub mod cri;
pub mod engine;
/// The bubble's ID mappings (`hpk-node-resources`).
pub use hpk_node_resources::ids as idmap;
pub mod images;
pub mod logshim;
#[cfg(test)]
mod one_id;
pub mod pause;
pub mod remote;
pub mod runtime;
pub mod server;
