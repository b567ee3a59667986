//! `hpk shell NODE [-- COMMAND…]`: a shell (or a command) inside a node's bubble, as users of
//! the original opened `apptainer shell instance://bubble1`.
//!
//! `crun exec` into the bubble with the image's crun, run from the launcher's mount namespace
//! (where crun's cgroup workaround lives) and, for an unprivileged launcher, its user
//! namespace (where the user is root) — both joined with setns by the launcher's PID from the
//! node record, so no nsenter is needed on the host.

use std::os::unix::process::CommandExt;
use std::path::Path;

use crate::bubble::process_alive;
use crate::cluster::{self, Shared};
use crate::error::{Error, Result};
use crate::hosttools::HostTools;

/// `hpk shell` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct ShellArgs {
    /// The cluster's name.
    #[arg(long, default_value = cluster::DEFAULT_NAME)]
    pub name: String,
    /// The node whose bubble to enter (e.g. hpk-1).
    pub node: String,
    /// The command to run instead of an interactive bash.
    #[arg(last = true)]
    pub command: Vec<String>,
}

/// Replaces this process with the shell; returns only on failure.
pub fn run(args: &ShellArgs) -> Result<i32> {
    let shared = Shared::new(&args.name)?;
    let record = shared.nodes().into_iter().flatten().find(|n| n.node == args.node).ok_or_else(|| {
        let known: Vec<String> = shared.nodes().into_iter().flatten().map(|n| n.node).collect();
        Error::Invalid(format!(
            "cluster {} has no node {:?} (nodes: {})",
            args.name,
            args.node,
            known.join(", ")
        ))
    })?;
    if !process_alive(record.launcher_pid) {
        return Err(Error::Invalid(format!(
            "the bubble of {} is not running (launcher {} gone)",
            args.node, record.launcher_pid
        )));
    }
    let rootfs = record.rootfs.clone().ok_or_else(|| {
        Error::Invalid(format!(
            "the bubble of {} was started by an older hpk: restart the cluster",
            args.node
        ))
    })?;
    // Checked on the host, before entering the launcher's user namespace (where the host's
    // owners do not show): the image is in the cache of the state directory the launcher
    // recorded, and that is still this user's alone.
    let state_base = record.state_dir.parent().and_then(Path::parent).unwrap_or(Path::new("/"));
    HostTools::from_cache(state_base, &rootfs)?;
    enter_launcher_namespaces(record.launcher_pid)?;
    let tools = HostTools::new(&rootfs)?;
    let mut cmd = crate::bubble::crun(&tools, &record.state_dir.join("crun"));
    cmd.arg("exec");
    let interactive = args.command.is_empty();
    if interactive && std::io::IsTerminal::is_terminal(&std::io::stdin()) {
        cmd.arg("--tty");
    }
    cmd.arg(format!("hpk-{}-{}", args.name, args.node));
    if interactive {
        cmd.args(["/bin/bash", "-l"]);
    } else {
        cmd.args(&args.command);
    }
    let err = cmd.exec();
    Err(Error::io("run", "the image's crun (hpk shell)", err))
}

/// Joins the launcher's user namespace (unless it is ours: a launcher that is root on the
/// host has none of its own) and its mount namespace, where its crun state and cgroup view are.
/// This process must be single-threaded.
fn enter_launcher_namespaces(pid: u32) -> Result<()> {
    use nix::sched::{CloneFlags, setns};
    let open = |ns: &str| {
        let path = format!("/proc/{pid}/ns/{ns}");
        std::fs::File::open(&path).map_err(|e| Error::io("open", path, e))
    };
    let (user, mnt) = (open("user")?, open("mnt")?);
    let own = std::fs::read_link("/proc/self/ns/user").ok();
    if own != std::fs::read_link(format!("/proc/{pid}/ns/user")).ok() {
        setns(&user, CloneFlags::CLONE_NEWUSER)
            .map_err(|e| Error::io("enter", "the launcher's user namespace", e.into()))?;
    }
    setns(&mnt, CloneFlags::CLONE_NEWNS)
        .map_err(|e| Error::io("enter", "the launcher's mount namespace", e.into()))
}
