//! `/stats/summary` and `/metrics/resource`: what the node, its pods and their containers use,
//! as the kubelet's Summary API (`stats/v1alpha1`) and as the Prometheus text metrics-server
//! scrapes.
//!
//! - [`summary`]: the Summary API's types, with upstream's JSON names;
//! - [`node`]: the node's own figures from `/proc` and `statvfs`;
//! - [`rate`]: `usageNanoCores` from two cumulative CPU samples;
//! - [`assemble`]: a [`Summary`] from CRI answers and node readings, without I/O;
//! - [`collector`]: [`Collector`], which asks the runtime and reads the machine;
//! - [`resource`]: the text of `/metrics/resource`.

pub mod assemble;
pub mod collector;
pub mod node;
pub mod rate;
pub mod resource;
pub mod summary;

#[cfg(test)]
mod tests;

pub use collector::Collector;
pub use resource::{RESOURCE_METRICS_CONTENT_TYPE, resource_metrics, resource_scrape_failed};
pub use summary::{
    ContainerStats, CpuStats, FsStats, InterfaceStats, MemoryStats, NetworkStats, NodeStats, PodReference,
    PodStats, ProcessStats, RlimitStats, RuntimeStats, Summary, Timestamp, VolumeStats,
};
