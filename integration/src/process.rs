//! Harness processes: spawned on a test host, logged to a file, stopped by PID.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::{Error, Result};

/// How long a component gets to exit after SIGTERM before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// A process the harness started.
#[derive(Debug)]
pub struct Process {
    name: String,
    child: Child,
    log: PathBuf,
}

impl Process {
    /// Spawns `cmd` with stdout and stderr appended to `log`.
    pub fn spawn(name: &str, mut cmd: Command, log: &Path) -> Result<Self> {
        let file = std::fs::File::create(log).map_err(|e| Error::io("create", log.display(), e))?;
        let err = file.try_clone().map_err(|e| Error::io("dup", log.display(), e))?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(err)
            .spawn()
            .map_err(|e| Error::io("start", name, e))?;
        Ok(Self { name: name.to_owned(), child, log: log.to_owned() })
    }

    /// The process ID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The component's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The exit status, if the process has exited (it is reaped then).
    pub fn exit_status(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Fails with the log's tail if the process has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(Error::Exited {
                component: self.name.clone(),
                status: status.to_string(),
                log: self.log.clone(),
                tail: self.log_tail(30),
            }),
            Err(e) => Err(Error::io("wait for", &self.name, e)),
        }
    }

    /// The last `lines` lines of the log.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// SIGTERM, then SIGKILL after [`STOP_GRACE`]; always reaps.
    pub fn stop(&mut self) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        if let Ok(raw) = i32::try_from(self.child.id()) {
            let _ = kill(Pid::from_raw(raw), Signal::SIGTERM);
        }
        let deadline = Instant::now() + STOP_GRACE;
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        tracing::warn!(component = self.name, "did not stop after SIGTERM; killing");
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Stops a process that is not our child (left by a crashed run): SIGTERM, then SIGKILL after
/// [`STOP_GRACE`].
pub fn stop_pid(pid: i32) {
    stop_pids(&[pid], STOP_GRACE);
}

/// Stops processes that are not our children: SIGTERM to all of them, then SIGKILL to those
/// still running after `grace`, and waits (bounded) until they are gone or zombies.
pub fn stop_pids(pids: &[i32], grace: Duration) {
    let signal_all = |signal| {
        for &pid in pids {
            let _ = kill(Pid::from_raw(pid), signal);
        }
    };
    let all_gone_within = |limit: Duration| {
        let deadline = Instant::now() + limit;
        loop {
            if !pids.iter().any(|&pid| is_running(pid)) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    signal_all(Signal::SIGTERM);
    if all_gone_within(grace) {
        return;
    }
    signal_all(Signal::SIGKILL);
    if !all_gone_within(Duration::from_secs(5)) {
        tracing::warn!(?pids, "processes still running after SIGKILL");
    }
}

/// Whether `pid` exists and is not a zombie. Orphans that init has not reaped yet stay zombies
/// for seconds on minimal init systems; they hold nothing but their PID, so they count as gone.
pub fn is_running(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    // The state follows the parenthesised command name, which may itself contain ") ".
    let state = stat.rsplit_once(") ").and_then(|(_, rest)| rest.chars().next());
    !matches!(state, None | Some('Z' | 'X'))
}

impl Drop for Process {
    fn drop(&mut self) {
        self.stop();
    }
}
