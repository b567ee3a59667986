//! `hpk-net-forwarder`: the node's pod network.
//!
//! Runs inside the bubble. Each pod sandbox's network namespace is joined to the bubble by a
//! kernel veth pair (no bridge, no relay process): the pod gets a /32 from the node's pod CIDR
//! and a default route via a link-local gateway; the bubble routes the /32 to the veth. The
//! allocations are persisted, so a restart neither loses nor reallocates an address.
//!
//! - [`cidr`] the pod CIDR, [`ipam`] the persisted allocations, [`netns`] namespace identity
//! - [`link`] the veth pairs over rtnetlink, behind the [`link::Network`] trait
//! - [`tap`] the fallback where veth is refused: TAPs and a relay, [`tuntap`] the devices
//! - [`service`] the gRPC handlers, [`server::run`] the process, [`stats`] interface counters

pub mod bubble;
pub mod cidr;
pub mod config;
mod error;
pub mod inherit;
pub mod ipam;
pub mod link;
pub mod metrics;
pub mod netns;
pub mod nodes;
pub mod peers;
pub mod ready;
pub mod server;
pub mod service;
pub mod stats;
pub mod tap;
pub mod tunnel;
pub mod tuntap;

pub use error::{Error, Result};
pub use server::run;
