//! How the daemons start: munged with a key of this cluster's, slurmctld and slurmd each in
//! namespaces of their own, and the bounded wait for each to be ready.

use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use super::{POLL, START_TIMEOUT, set_mode};
use crate::process::Process;
use crate::{Error, Result};

/// munged for this cluster only: its own key (1 KiB of random bytes), socket, log and seed.
pub(super) fn start_munged(munge_dir: &Path, log_dir: &Path) -> Result<Process> {
    let key = munge_dir.join("munge.key");
    let mut bytes = [0u8; 1024];
    getrandom::fill(&mut bytes).map_err(|e| Error::io("generate", "munge key", std::io::Error::other(e)))?;
    std::fs::write(&key, bytes).map_err(|e| Error::io("write", key.display(), e))?;
    set_mode(&key, 0o400)?;
    let socket = munge_dir.join("munge.socket");
    let mut cmd = Command::new("munged");
    cmd.arg("--foreground")
        .arg(format!("--socket={}", socket.display()))
        .arg(format!("--key-file={}", key.display()))
        .arg(format!("--pid-file={}", munge_dir.join("munged.pid").display()))
        .arg(format!("--seed-file={}", munge_dir.join("munged.seed").display()))
        .arg(format!("--log-file={}", log_dir.join("munged.log").display()));
    let mut munged = Process::spawn("munged", cmd, &log_dir.join("munged.out"))?;
    wait_for("munged's socket", START_TIMEOUT, &mut [&mut munged], || Ok(socket.exists()))?;
    Ok(munged)
}

/// Makes `base` (`unshare` alone, or after `nsenter --net`) run the program appended to the
/// returned command in a UTS namespace named `hostname` and a mount namespace of its own where
/// each `(source, target)` of `binds` is bind-mounted (/etc/hosts first). Each step execs, so
/// the process keeps the PID the harness spawned.
pub(super) fn in_own_host(hostname: &str, binds: &[(PathBuf, PathBuf)], mut base: Command) -> Command {
    base.args(["--uts", "--mount", "--propagation", "slave", "--", "sh", "-c"])
        .arg(
            r#"hostname "$1" && shift && while [ "$1" != -- ]; do mount --bind "$1" "$2" || exit 1; shift 2; done && shift && exec "$@""#,
        )
        .arg("sh")
        .arg(hostname);
    for (source, target) in binds {
        base.arg(source).arg(target);
    }
    base.arg("--");
    base
}

/// A root command with `SLURM_CONF` set.
pub(super) fn root_command(conf: &Path, program: &str) -> Command {
    let mut cmd = Command::new(program);
    cmd.env("SLURM_CONF", conf);
    cmd
}

/// Polls `ready` every [`POLL`] until it holds, failing if a process in `watched` exits or
/// `timeout` passes.
pub(super) fn wait_for(
    what: &str,
    timeout: Duration,
    watched: &mut [&mut Process],
    mut ready: impl FnMut() -> Result<bool>,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    let mut last = String::new();
    loop {
        for process in watched.iter_mut() {
            process.check_alive()?;
        }
        match ready() {
            Ok(true) => return Ok(()),
            Ok(false) => last.clear(),
            Err(e) => last = e.to_string(),
        }
        if Instant::now() >= deadline {
            return Err(Error::NotReady { what: what.into(), seconds: timeout.as_secs(), detail: last });
        }
        std::thread::sleep(POLL);
    }
}

/// Two distinct free TCP ports on `ip`, both held while picking so they differ.
pub(super) fn free_ports(ip: Ipv4Addr) -> Result<[u16; 2]> {
    let bind = || TcpListener::bind((ip, 0)).map_err(|e| Error::io("bind a free port on", ip, e));
    let (a, b) = (bind()?, bind()?);
    let port =
        |l: &TcpListener| l.local_addr().map(|a| a.port()).map_err(|e| Error::io("read port of", ip, e));
    Ok([port(&a)?, port(&b)?])
}
