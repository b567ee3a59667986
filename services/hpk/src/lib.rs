//! `hpk`: the user's command. `hpk up|down|status` run a cluster of bubbles on this machine;
//! `hpk bubble` launches one bubble (what `slurm/hpk.slurm` runs on each node); `hpk
//! bubble-init` is the bubble's first process inside. See ARCHITECTURE.md.

pub mod bubble;
pub mod cluster;
pub mod error;
pub mod fds;
pub mod host_ports;
pub mod hosttools;
pub mod image;
pub mod init;
pub mod local;
pub mod preflight;
pub mod push;
pub mod shell;
pub mod slurm;
pub mod tainer;

pub use error::{Error, Result};
// The cluster's PKI, add-ons and control-plane flags live in hpk-cluster, which the test harness
// shares; they keep their paths here.
pub use hpk_cluster::{addons, controlplane, pki};
