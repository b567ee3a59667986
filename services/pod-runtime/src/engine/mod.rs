//! The engines behind sandboxes and containers: crun (OCI runtime bundles) and Apptainer
//! (see [`apptainer`]); [`Engine`] says which one a runtime uses.
//!
//! The crun engine:
//! A sandbox is a crun container running `hpk-pause` in new PID, network, IPC, UTS and mount
//! namespaces. A pod container is a crun container that joins the sandbox's network, IPC, UTS
//! and PID namespaces (so its init is reparented to the pause, which reports its exit) with its
//! own mount namespace on an overlay of the image's layers.
//!
//! Resource limits are not applied: crun runs with `--cgroup-manager=disabled`, because on hosts
//! with hybrid cgroups (v1 plus a v2 hierarchy holding a controller) crun refuses every container
//! otherwise, and nothing is delegated to us. [`limits_not_enforced`] says so for `Status`.

pub mod apptainer;
mod cgroups;
mod crun;
mod error;
mod logs;
mod mountns;
mod rootfs;
mod spec;
pub mod sub_path;

pub use apptainer::Apptainer;
pub use cgroups::{CgroupMode, limits_not_enforced};
pub use crun::{ContainerState, Crun, Stdio3};
pub(crate) use error::run as run_command;
pub use error::{Error, Result};
pub use logs::{LogStream, copy_lines, write_cri_line};
pub use mountns::{MountNamespace, enter_private_mount_namespace};
pub use rootfs::Overlay;
pub use spec::{ALL_CAPS, ContainerSpec, DEFAULT_CAPS, Mount, Propagation, SandboxSpec, Security};

/// The engine `--engine` asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum EngineChoice {
    /// crun: OCI bundles on overlay roots.
    Crun,
    /// Apptainer: instances and SIF images (what HPC sites have).
    Apptainer,
    /// Apptainer when `apptainer` is on PATH and `crun` is not, else crun.
    Auto,
}

/// The engine a runtime uses: a resolved [`EngineChoice`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngineKind {
    /// crun.
    Crun,
    /// Apptainer.
    Apptainer,
}

impl EngineChoice {
    /// The engine to use; `on_path` says whether a program is on PATH.
    pub fn resolve(self, on_path: impl Fn(&str) -> bool) -> EngineKind {
        match self {
            Self::Crun => EngineKind::Crun,
            Self::Apptainer => EngineKind::Apptainer,
            Self::Auto if on_path("apptainer") && !on_path("crun") => EngineKind::Apptainer,
            Self::Auto => EngineKind::Crun,
        }
    }
}

impl EngineKind {
    /// Its name, as `--engine` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Crun => "crun",
            Self::Apptainer => "apptainer",
        }
    }
}

/// The engine of a runtime, with what it needs. The crun engine's [`Crun`] stays in the
/// runtime itself (which also runs mounts and `nsenter` through its prefix), so that variant
/// carries nothing; the runtime dispatches on this in `runtime/engine.rs`.
#[derive(Clone, Debug)]
pub enum Engine {
    /// crun, as the runtime's `Crun`.
    Crun,
    /// Apptainer.
    Apptainer(Apptainer),
}

impl Engine {
    /// Which engine this is.
    pub fn kind(&self) -> EngineKind {
        match self {
            Self::Crun => EngineKind::Crun,
            Self::Apptainer(_) => EngineKind::Apptainer,
        }
    }
}

/// Whether `program` is an executable file in a directory of PATH.
pub fn on_path(program: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|dir| {
            std::fs::metadata(dir.join(program))
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
    })
}

/// The absolute path of `program` on PATH, or `program` itself when it is not found (running
/// it then fails with a clear "not found").
pub fn resolve_program(program: &str) -> std::path::PathBuf {
    std::env::var_os("PATH")
        .and_then(|path| std::env::split_paths(&path).map(|dir| dir.join(program)).find(|p| p.is_file()))
        .unwrap_or_else(|| std::path::PathBuf::from(program))
}

#[cfg(test)]
mod choice_tests {
    use super::*;

    #[test]
    fn auto_picks_apptainer_only_where_crun_is_missing() {
        let only = |present: &'static [&'static str]| move |p: &str| present.contains(&p);
        assert_eq!(EngineChoice::Auto.resolve(only(&["apptainer"])), EngineKind::Apptainer);
        assert_eq!(EngineChoice::Auto.resolve(only(&["apptainer", "crun"])), EngineKind::Crun);
        assert_eq!(EngineChoice::Auto.resolve(only(&[])), EngineKind::Crun);
        assert_eq!(EngineChoice::Apptainer.resolve(only(&[])), EngineKind::Apptainer);
        assert_eq!(EngineChoice::Crun.resolve(only(&["apptainer"])), EngineKind::Crun);
        assert_eq!(EngineKind::Apptainer.name(), "apptainer");
    }
}
