//! The log shim: one small process per container that turns its stdout and stderr into the CRI
//! log file, and outlives the runtime.
//!
//! The container writes into two FIFOs in its directory; the shim reads them and appends CRI
//! records (see [`crate::engine::write_cri_line`]) to the log path the kubelet gave. Because the
//! shim is its own process (its own process group, not a child the runtime must keep), a
//! runtime that is killed and restarted leaves every container's output flowing: nothing the
//! container holds points into the runtime. SIGUSR1 makes the shim reopen the log path, which
//! is how ReopenContainerLog reaches it; the runtime finds the shim again after a restart by
//! the PID in the container's record, checked against `/proc/<pid>/cmdline`.
//!
//! The shim reads with `poll`: a FIFO opened for reading before any writer reports nothing
//! until a writer has come and gone, so the shim can start first and still see end-of-file
//! exactly when the container and everything it forked have closed their output. It exits then.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};

use crate::engine::{LogStream, write_cri_line};

/// The first argument that runs `hpk-pod-runtime` as a log shim.
pub const SUBCOMMAND: &str = "log-shim";

/// Bytes read per wake-up.
const CHUNK: usize = 64 * 1024;

/// A line longer than this is written out as partial records before its end arrives, so a
/// container printing without newlines cannot grow the shim.
const MAX_PENDING_LINE: usize = 16 * 1024;

/// What a shim copies where.
#[derive(Clone, Debug, clap::Parser)]
#[command(name = "hpk-pod-runtime log-shim", about = "Copies a container's output into its CRI log")]
pub struct Args {
    /// The container (for `ps` and for the runtime to recognise its shim).
    #[arg(long)]
    pub id: String,
    /// The FIFO the container's stdout goes into.
    #[arg(long)]
    pub stdout: PathBuf,
    /// The FIFO the container's stderr goes into.
    #[arg(long)]
    pub stderr: PathBuf,
    /// The CRI log file; reopened on SIGUSR1.
    #[arg(long)]
    pub log: PathBuf,
}

/// Whether `pid` is the log shim of container `id` (PIDs are reused; the record may be stale).
pub fn is_shim_of(pid: u32, id: &str) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else { return false };
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    args.contains(&SUBCOMMAND.as_bytes()) && args.contains(&id.as_bytes())
}

/// Runs the shim: opens the FIFOs, says `ready` on stdout, copies until both streams end.
pub fn run(args: &Args) -> io::Result<()> {
    let mut signals = SigSet::empty();
    signals.add(Signal::SIGUSR1);
    signals.thread_block().map_err(io::Error::from)?;
    let signal_fd = SignalFd::with_flags(&signals, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)
        .map_err(io::Error::from)?;
    let mut streams = [
        Some(Stream::open(&args.stdout, LogStream::Stdout)?),
        Some(Stream::open(&args.stderr, LogStream::Stderr)?),
    ];
    let mut log = open_log(&args.log)?;
    {
        let mut stdout = io::stdout().lock();
        stdout.write_all(b"ready\n")?;
        stdout.flush()?;
    }
    while streams.iter().any(Option::is_some) {
        let (signal_ready, ready) = {
            let mut fds = vec![PollFd::new(signal_fd.as_fd(), PollFlags::POLLIN)];
            fds.extend(streams.iter().flatten().map(|s| PollFd::new(s.file.as_fd(), PollFlags::POLLIN)));
            match poll(&mut fds, PollTimeout::NONE) {
                Ok(_) => {}
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(e.into()),
            }
            let woke = |fd: &PollFd| fd.revents().is_some_and(|r| !r.is_empty());
            let ready: Vec<bool> = fds[1..].iter().map(woke).collect();
            (woke(&fds[0]), ready)
        };
        if signal_ready {
            while let Ok(Some(_)) = signal_fd.read_signal() {}
            match open_log(&args.log) {
                Ok(file) => log = file,
                Err(e) => {
                    eprintln!("hpk-pod-runtime log-shim {}: reopening {}: {e}", args.id, args.log.display())
                }
            }
        }
        let mut ready = ready.into_iter();
        for slot in streams.iter_mut() {
            let Some(stream) = slot else { continue };
            if ready.next() != Some(true) {
                continue;
            }
            if !stream.pump(&mut log, &args.id)? {
                *slot = None;
            }
        }
    }
    Ok(())
}

fn open_log(path: &Path) -> io::Result<File> {
    OpenOptions::new().create(true).append(true).mode(0o640).open(path)
}

/// One FIFO and the part of a line read from it so far.
struct Stream {
    file: File,
    kind: LogStream,
    pending: Vec<u8>,
}

impl Stream {
    fn open(path: &Path, kind: LogStream) -> io::Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_NONBLOCK | nix::libc::O_CLOEXEC)
            .open(path)
            .map_err(|e| io::Error::new(e.kind(), format!("opening {}: {e}", path.display())))?;
        Ok(Self { file, kind, pending: Vec::new() })
    }

    /// Reads what is there and writes complete lines; `false` at end of file.
    fn pump(&mut self, log: &mut File, id: &str) -> io::Result<bool> {
        let mut buf = vec![0u8; CHUNK];
        let n = match self.file.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted => {
                return Ok(true);
            }
            Err(e) => return Err(e),
        };
        if n == 0 {
            if !self.pending.is_empty() {
                self.write(log, id, false);
            }
            return Ok(false);
        }
        self.pending.extend_from_slice(&buf[..n]);
        while let Some(end) = self.pending.iter().position(|b| *b == b'\n') {
            let rest = self.pending.split_off(end + 1);
            self.pending.pop();
            self.write(log, id, true);
            self.pending = rest;
        }
        if self.pending.len() >= MAX_PENDING_LINE {
            self.write(log, id, false);
        }
        Ok(true)
    }

    /// Writes `pending` as one line; a full disk loses the line, never blocks the container.
    fn write(&mut self, log: &mut File, id: &str, complete: bool) {
        if let Err(e) = write_cri_line(log, self.kind, &self.pending, complete) {
            eprintln!("hpk-pod-runtime log-shim {id}: writing the log: {e}");
        }
        self.pending.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stale_pid_is_not_a_shim() {
        // This test process is no shim of anything.
        assert!(!is_shim_of(std::process::id(), "abc"));
        assert!(!is_shim_of(u32::MAX, "abc"));
    }
}
