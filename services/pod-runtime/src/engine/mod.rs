//! The engines behind sandboxes and containers: crun (OCI runtime bundles, [`crun`]) and
//! Apptainer ([`apptainer`]), each an [`Engine`]: the one seam through which the runtime starts,
//! signals, inspects and removes what runs. Nothing outside this folder asks which engine runs.
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

use std::path::{Path, PathBuf};

use crate::images::{Credentials, ImageRecord};

pub mod apptainer;
pub mod crun;
mod error;
#[cfg(test)]
pub(crate) mod fake;
mod logs;
pub(crate) mod loopback;
mod rootfs;
mod spec;
pub mod sub_path;

pub use apptainer::{Apptainer, ApptainerEngine};
// The host-level set-up (hpk-oci), shared with the bubble launcher.
pub use crun::{ContainerState, Crun, CrunEngine, Stdio3};
pub(crate) use error::run as run_command;
pub use error::{Error, Result};
pub use hpk_oci::{
    ALL_CAPS, CgroupMode, DEFAULT_CAPS, MountNamespace, enter_private_mount_namespace, limits_not_enforced,
};
pub use logs::{LogStream, copy_lines, write_cri_line};
pub use rootfs::Overlay;
pub use spec::{ContainerSpec, Mount, Propagation, SandboxSpec, Security, User};

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

/// How a sandbox or container is signalled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    /// SIGTERM: a sandbox's pause forwards it with its grace period; a container's init gets it.
    Term,
    /// SIGKILL: a sandbox's pause, or a container's whole process tree.
    Kill,
}

impl Signal {
    /// Its name as `kill(1)` and crun spell it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Term => "TERM",
            Self::Kill => "KILL",
        }
    }
}

/// A container's root, as [`Engine::prepare_root`] made it.
#[derive(Clone, Debug)]
pub struct Root {
    /// What the engine runs: an overlay's mount point (crun) or a SIF (Apptainer).
    pub image: PathBuf,
    /// Where the image's `/etc/passwd` and `/etc/group` can be read, if anywhere (a SIF's
    /// cannot: only numeric users resolve).
    pub files: Option<PathBuf>,
}

/// Everything an engine needs to create a container, the user already resolved.
pub struct NewContainer<'a> {
    /// The container's ID.
    pub id: &'a str,
    /// The sandbox it joins.
    pub sandbox_id: &'a str,
    /// Its directory (bundle, FIFOs, records).
    pub dir: &'a Path,
    /// The sandbox's hpk-pause (host PID), whose namespaces the container joins.
    pub pause_pid: u32,
    /// What [`Engine::prepare_root`] made.
    pub root: Root,
    /// Arguments, environment (`KEY=value`) and working directory.
    pub args: Vec<String>,
    /// The environment, `KEY=value`.
    pub env: Vec<String>,
    /// The working directory.
    pub cwd: String,
    /// The user asked for (image or pod), resolved in the image's files where it has them.
    pub user: User,
    /// Whether the pod asked for a user (`runAsUser`), not only the image.
    pub pod_user: bool,
    /// What an engine that gives users by the bubble's mappings runs as instead of `user`,
    /// with what is not honoured, in words (see `runtime/unmapped.rs`).
    pub fit_user: &'a dyn Fn(User) -> (User, Option<String>),
    /// Mounts into the container.
    pub mounts: Vec<Mount>,
    /// Capabilities, seccomp, `no_new_privs`, masked paths.
    pub security: Security,
    /// Whether it has a PID namespace of its own (else the sandbox's).
    pub own_pid_namespace: bool,
    /// Whether its root is read-only.
    pub readonly_rootfs: bool,
    /// Its standard streams (the shim's FIFOs), or nulls with a terminal.
    pub stdio: Stdio3,
    /// The shim's console socket, when it has a terminal.
    pub console: Option<PathBuf>,
}

/// What creating a container gave, besides the container.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Created {
    /// Why it cannot start (its command is not in the image): it then "starts" and exits 127.
    pub start_error: Option<String>,
    /// What of its user this bubble cannot give, in words.
    pub not_honoured: Option<String>,
}

/// How to run a command in a running container (exec).
pub struct ExecIn<'a> {
    /// The container's ID.
    pub id: &'a str,
    /// Its directory.
    pub dir: &'a Path,
    /// The sandbox's hpk-pause (host PID).
    pub pause_pid: u32,
    /// The command.
    pub cmd: &'a [String],
    /// A directory of this exec's own for the engine's files.
    pub scratch: &'a Path,
    /// Where the engine writes the command's PID in the sandbox (crun).
    pub pid_file: &'a Path,
    /// Where the engine writes why it could not start the command.
    pub log: &'a Path,
}

/// A future an engine returns from a trait method.
pub type EngineFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = Result<T>> + Send + 'a>>;

/// An engine: the sandbox and container lifecycle, exec, state, and what it keeps of images.
///
/// Blocking (it runs processes): the runtime calls it from its request tasks, as before there
/// was a trait. Every method that removes or stops something succeeds on what is already gone.
pub trait Engine: Send + Sync + std::fmt::Debug {
    /// Which engine this is (for `Status` and logs only; never branched on).
    fn kind(&self) -> EngineKind;

    /// Whether the engine runs at all (CRI `RuntimeReady`).
    fn ready(&self) -> Result<()>;

    /// Starts the sandbox's hpk-pause from files in `dir`.
    fn start_sandbox(&self, spec: &SandboxSpec, dir: &Path) -> Result<()>;

    /// The host PID of a sandbox's pause right after it started.
    fn sandbox_pid(&self, id: &str, dir: &Path) -> Result<Option<u32>>;

    /// The sandbox's state (`running` with the pause's host PID); `None` if the engine does not
    /// know it.
    fn sandbox_state(&self, id: &str) -> Result<Option<ContainerState>>;

    /// Signals the sandbox's pause.
    fn kill_sandbox(&self, id: &str, signal: Signal) -> Result<()>;

    /// Removes what the engine keeps of the sandbox, killing it if it still runs.
    fn delete_sandbox(&self, id: &str) -> Result<()>;

    /// Brings up the loopback interface of the sandbox whose pause is `pid`.
    fn loopback_up(&self, pid: u32) -> Result<()>;

    /// Refuses a terminal where the engine cannot give one.
    fn check_tty(&self, tty: bool) -> Result<()>;

    /// The root of a new container in `dir`, from the image's `layers` (crun mounts them, with
    /// the container's writable layer in `writable`) or the image itself (Apptainer's SIF).
    /// `destinations` are where the container's binds go. [`Engine::unmount`] undoes it.
    fn prepare_root(
        &self,
        dir: &Path,
        writable: &Path,
        layers: Vec<PathBuf>,
        image: &ImageRecord,
        destinations: &[&str],
    ) -> Result<Root>;

    /// Creates the container, waiting for start.
    fn create_container(&self, new: NewContainer<'_>) -> Result<Created>;

    /// Starts a created container; returns its init's PID in the sandbox.
    fn start_container(&self, id: &str, dir: &Path, pause_pid: u32) -> Result<Option<i32>>;

    /// Signals a container's init (`Term`), or kills its whole process tree (`Kill`).
    fn kill_container(&self, id: &str, dir: &Path, pause_pid: u32, signal: Signal) -> Result<()>;

    /// Removes what the engine keeps of a container.
    fn delete_container(&self, id: &str, dir: &Path, pause_pid: u32) -> Result<()>;

    /// Undoes [`Engine::prepare_root`] for the container in `dir`.
    fn unmount(&self, dir: &Path) -> Result<()>;

    /// A command run in a running container, without a terminal, its streams the caller's.
    fn exec(&self, exec: ExecIn<'_>) -> Result<tokio::process::Command>;

    /// A command run in a running container with a terminal, whose master the engine sends to
    /// `console`; the command returns once the process runs.
    fn exec_tty(&self, exec: ExecIn<'_>, console: &Path) -> Result<tokio::process::Command>;

    /// Refuses credentials the engine cannot use, before anything is downloaded.
    fn check_pull(&self, _auth: Option<&Credentials>) -> Result<()> {
        Ok(())
    }

    /// After the store pulled `image` (as `reference`): what the engine keeps of its own.
    fn pulled<'a>(
        &'a self,
        _reference: &'a str,
        _image: &'a ImageRecord,
        _auth: Option<&'a Credentials>,
    ) -> EngineFuture<'a, ()> {
        Box::pin(async { Ok(()) })
    }

    /// Whether the engine can run `image` as the store has it.
    fn has_image(&self, _image: &ImageRecord) -> bool {
        true
    }

    /// After the store removed its last record of `image`.
    fn image_removed(&self, _image: &ImageRecord) -> Result<()> {
        Ok(())
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
