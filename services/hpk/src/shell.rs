//! `hpk shell NODE [-- COMMAND…]`: a shell (or a command) inside a node's bubble, as users of
//! the original opened `apptainer shell instance://bubble1`.
//!
//! `crun exec` into the bubble, run from the launcher's mount namespace (where crun's cgroup
//! workaround lives) and, for an unprivileged launcher, its user namespace (where the user is
//! root) — entered with nsenter by the launcher's PID from the node record.

use std::os::unix::process::CommandExt;
use std::process::Command;

use crate::bubble::process_alive;
use crate::cluster::{self, Shared};
use crate::error::{Error, Result};

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
    let own_user = std::fs::read_link("/proc/self/ns/user").ok();
    let launcher_user = std::fs::read_link(format!("/proc/{}/ns/user", record.launcher_pid)).ok();
    let mut cmd = Command::new("nsenter");
    cmd.arg(format!("--target={}", record.launcher_pid)).arg("--mount");
    if own_user != launcher_user {
        cmd.args(["--user", "--preserve-credentials"]);
    }
    let interactive = args.command.is_empty();
    cmd.arg("--").arg("crun").arg(format!("--root={}", record.state_dir.join("crun").display())).arg("exec");
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
    Err(Error::io("run", "nsenter (hpk shell)", err))
}
