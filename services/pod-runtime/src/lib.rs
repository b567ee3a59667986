//! hpk-pod-runtime: turns "run this pod" into sandboxes and containers in a bubble.
//!
//! Work in progress toward a CRI v1 runtime (issue 4). What exists:
//! - [`pause`]: the logic of `hpk-pause`, PID 1 of every sandbox.
//! - [`images`]: the OCI image store of the crun engine.
//! - [`engine`]: the crun engine: OCI bundles for sandboxes and containers.

pub mod engine;
pub mod images;
pub mod pause;
