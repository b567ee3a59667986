//! The crun engine: sandboxes and containers as OCI runtime bundles run by crun.
//!
//! A sandbox is a crun container running `hpk-pause` in new PID, network, IPC, UTS and mount
//! namespaces. A pod container is a crun container that joins the sandbox's network, IPC, UTS
//! and PID namespaces (so its init is reparented to the pause, which reports its exit) with its
//! own mount namespace on an overlay of the image's layers.
//!
//! Resource limits are not applied: crun runs with `--cgroup-manager=disabled`, because on hosts
//! with hybrid cgroups (v1 plus a v2 hierarchy holding a controller) crun refuses every container
//! otherwise, and nothing is delegated to us. [`limits_not_enforced`] says so for `Status`.

mod cgroups;
mod crun;
mod error;
mod logs;
mod mountns;
mod rootfs;
mod spec;

pub use cgroups::{CgroupMode, limits_not_enforced};
pub use crun::{ContainerState, Crun, Stdio3};
pub use error::{Error, Result};
pub use logs::{LogStream, copy_lines, write_cri_line};
pub use mountns::{MountNamespace, enter_private_mount_namespace};
pub use rootfs::Overlay;
pub use spec::{ALL_CAPS, ContainerSpec, DEFAULT_CAPS, Mount, Propagation, SandboxSpec, Security};
