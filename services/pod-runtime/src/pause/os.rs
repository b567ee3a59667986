//! The real [`Os`]: a signalfd for the handled signals, `waitpid`, `kill`, `alarm` and `/proc`.

use std::fs;
use std::io;

use nix::errno::Errno;
use nix::sys::prctl;
use nix::sys::signal::{self, SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{Pid, alarm, getpid};
use tracing::{debug, warn};

use super::event::ChildExit;
use super::supervisor::{Os, Reap, Target, Wake};
use super::{Error, Result};

/// The signals `hpk-pause` handles; all are blocked and read from the signalfd instead.
pub(crate) const HANDLED: [Signal; 5] =
    [Signal::SIGTERM, Signal::SIGINT, Signal::SIGCHLD, Signal::SIGHUP, Signal::SIGALRM];

/// Signal handling through a signalfd: a plain blocking loop, no async runtime, no handler code.
#[derive(Debug)]
pub struct SignalOs {
    signals: SignalFd,
    pid: i32,
}

impl SignalOs {
    /// Blocks the handled signals, opens the signalfd and, unless PID 1, becomes child
    /// subreaper. Must run before any thread or child is started (the mask is per thread and
    /// signals that arrive before it would take their default action).
    pub fn setup() -> Result<Self> {
        let mut mask = SigSet::empty();
        for signal in HANDLED {
            mask.add(signal);
        }
        // Blocked signals stay pending, even for PID 1 of a namespace (which otherwise drops
        // signals without a handler), until the signalfd reads them.
        mask.thread_block().map_err(Error::sys("block signals"))?;
        let signals =
            SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC).map_err(Error::sys("create signalfd"))?;
        let pid = getpid().as_raw();
        if pid != 1 {
            prctl::set_child_subreaper(true).map_err(Error::sys("become child subreaper"))?;
        }
        Ok(Self { signals, pid })
    }

    /// Our PID in our namespace.
    pub fn own_pid(&self) -> i32 {
        self.pid
    }
}

impl Os for SignalOs {
    fn is_pid1(&self) -> bool {
        self.pid == 1
    }

    fn next_wake(&mut self) -> Result<Wake> {
        loop {
            let info = match self.signals.read_signal() {
                Ok(Some(info)) => info,
                Ok(None) | Err(Errno::EINTR) => continue,
                Err(source) => return Err(Error::sys("read signalfd")(source)),
            };
            let signo = i32::try_from(info.ssi_signo).unwrap_or(0);
            match Signal::try_from(signo) {
                Ok(signal @ (Signal::SIGTERM | Signal::SIGINT)) => {
                    debug!(%signal, from = info.ssi_pid, "shutdown signal");
                    return Ok(Wake::Terminate(signal));
                }
                Ok(Signal::SIGCHLD) => return Ok(Wake::ChildExited),
                Ok(Signal::SIGHUP) => return Ok(Wake::Hangup),
                Ok(Signal::SIGALRM) => return Ok(Wake::Alarm),
                _ => warn!(signo, "unexpected signal on the signalfd"),
            }
        }
    }

    fn reap(&mut self) -> Result<Reap> {
        loop {
            match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) => {
                    return Ok(Reap::Exited(ChildExit::exited(pid.as_raw(), code)));
                }
                Ok(WaitStatus::Signaled(pid, signal, _core)) => {
                    return Ok(Reap::Exited(ChildExit::killed(pid.as_raw(), signal as i32)));
                }
                Ok(WaitStatus::StillAlive) => return Ok(Reap::NoneReady),
                // Stops and continues are not asked for (no WUNTRACED/WCONTINUED): skip them.
                Ok(other) => debug!(?other, "ignoring wait status"),
                Err(Errno::ECHILD) => return Ok(Reap::NoChildren),
                Err(Errno::EINTR) => {}
                Err(source) => return Err(Error::sys("waitpid")(source)),
            }
        }
    }

    fn children(&mut self) -> Result<Vec<i32>> {
        // We are single-threaded, so the calling thread's children are all of ours.
        match fs::read_to_string("/proc/thread-self/children") {
            Ok(list) => Ok(list.split_whitespace().filter_map(|p| p.parse().ok()).collect()),
            // Kernels without CONFIG_PROC_CHILDREN: find our children by their parent.
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(scan_proc_for_children(self.pid)),
            Err(source) => Err(Error::Proc { path: "/proc/thread-self/children", source }),
        }
    }

    fn kill(&mut self, target: Target, signal: Signal) -> Result<()> {
        let pid = match target {
            Target::Pid(pid) => Pid::from_raw(pid),
            Target::All => Pid::from_raw(-1),
        };
        match signal::kill(pid, signal) {
            Ok(()) | Err(Errno::ESRCH) => Ok(()),
            Err(source) => Err(Error::sys("send signal")(source)),
        }
    }

    fn arm_alarm(&mut self, seconds: u32) {
        // alarm(0) would cancel instead of firing; the supervisor never asks for 0.
        alarm::set(seconds.max(1));
    }
}

/// Every process in `/proc` whose parent is `parent`.
fn scan_proc_for_children(parent: i32) -> Vec<i32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| parent_of(*pid) == Some(parent))
        .collect()
}

/// The PPID field of `/proc/<pid>/stat` (the 2nd after the parenthesised command name).
fn parent_of(pid: i32) -> Option<i32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, after_name) = stat.rsplit_once(')')?;
    after_name.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_proc_scan_finds_a_child_of_ours() {
        let mut child = std::process::Command::new("sleep").arg("5").spawn().expect("sleep runs");
        let pid = i32::try_from(child.id()).expect("pids fit in i32");
        let found = scan_proc_for_children(getpid().as_raw());
        child.kill().expect("kill our own sleep");
        child.wait().expect("reap our own sleep");
        assert!(found.contains(&pid), "{pid} not in {found:?}");
    }
}
