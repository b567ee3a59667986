//! `hpk-net-forwarder open-tap`: a short-lived helper that creates (or re-opens) a TAP inside a
//! pod's network namespace and hands its descriptor back over SCM_RIGHTS.
//!
//! A separate process rather than a thread that enters the namespace: the descriptor crosses a
//! process boundary the same way a pod runtime or a privileged helper could hand one over, and
//! a process may also enter a user namespace (which a multi-threaded one cannot) should a pod's
//! network namespace ever need that. The namespace itself is passed to the helper as a
//! descriptor over the same socket (its stdin), not as a path: no race with the path being
//! reused, and no dependence on which pids /proc shows.

use std::fs::File;
use std::io::Read;
use std::os::fd::AsFd;
use std::process::{Command, Stdio};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sched::CloneFlags;
use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};

use crate::link::POD_INTERFACE;
use crate::tuntap::{self, Device, Kind, Options};
use crate::{Error, Result};

/// How long the helper may take to send the descriptor back.
const HELPER_TIMEOUT_MS: u16 = 10_000;
/// The options of both TAPs of an attachment.
pub const TAP_OPTIONS: Options = Options { kind: Kind::Tap, vnet_hdr: true, multi_queue: false };

/// `hpk-net-forwarder open-tap` (internal): receives a network namespace on stdin (a UNIX
/// socket), creates or re-opens the TAP there and sends its descriptor back.
#[derive(Debug, Clone, clap::Args)]
pub struct OpenTapArgs {
    /// Name of the TAP inside the namespace.
    #[arg(long, default_value = POD_INTERFACE)]
    pub name: String,
}

/// The helper's side: runs in the helper process, with the socket as stdin.
pub fn serve_open_tap(args: &OpenTapArgs) -> Result<()> {
    let stdin = std::io::stdin();
    let socket = stdin.as_fd();
    let (netns, _) = tuntap::receive_fd(socket)?
        .ok_or_else(|| Error::Config("open-tap: no network namespace was sent on stdin".into()))?;
    nix::sched::setns(&netns, CloneFlags::CLONE_NEWNET).map_err(|e| {
        Error::InvalidArgument(format!("open-tap: cannot enter the pod's network namespace: {e}"))
    })?;
    let device = Device::create(&args.name, TAP_OPTIONS)?;
    device.send(socket)
}

/// The net-forwarder's side: runs the helper (this same binary) for `netns` and returns the TAP
/// `name` it created or re-opened there. Blocking; bounded by [`HELPER_TIMEOUT_MS`].
pub fn open_in(netns: &File, name: &str) -> Result<Device> {
    let (ours, theirs) = socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC)
        .map_err(|e| Error::io("create a socket pair for the TAP helper", e.into()))?;
    // /proc/self/exe still names this binary when its file was replaced by an upgrade.
    let mut child = Command::new("/proc/self/exe")
        .args(["open-tap", "--name", name])
        .stdin(Stdio::from(theirs))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Error::io("start the TAP helper (/proc/self/exe open-tap)", e))?;
    // The Command, and with it our copy of the helper's end, is gone: if the helper exits
    // without answering, the socket reads as closed.
    let received = tuntap::send_fd(ours.as_fd(), netns.as_fd(), b"netns").and_then(|()| {
        let mut fds = [PollFd::new(ours.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(HELPER_TIMEOUT_MS)) {
            Ok(0) => Err(Error::Config(format!(
                "the TAP helper did not answer within {} s",
                HELPER_TIMEOUT_MS / 1000
            ))),
            Ok(_) => Device::receive(ours.as_fd()),
            Err(e) => Err(Error::io("wait for the TAP helper", e.into())),
        }
    });
    if !matches!(received, Ok(Some(_))) {
        let _ = child.kill();
    }
    let mut stderr = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        let _ = pipe.read_to_string(&mut stderr);
    }
    let status = child.wait().map_err(|e| Error::io("wait for the TAP helper", e))?;
    match received {
        Ok(Some(device)) if device.name() == name => Ok(device),
        Ok(Some(device)) => {
            Err(Error::Config(format!("the TAP helper sent {} instead of {name}", device.name())))
        }
        Ok(None) => Err(helper_failed(status, &stderr)),
        Err(_) if !stderr.trim().is_empty() => Err(helper_failed(status, &stderr)),
        Err(e) => Err(e),
    }
}

/// The helper's own message (the last line of its stderr), which says what to do.
fn helper_failed(status: std::process::ExitStatus, stderr: &str) -> Error {
    let why = stderr.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no message");
    let why = why.strip_prefix("hpk-net-forwarder: ").unwrap_or(why);
    Error::Config(format!("cannot create the pod's TAP ({status}): {why}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_the_helpers_last_words() {
        use std::os::unix::process::ExitStatusExt;
        let status = std::process::ExitStatus::from_raw(78 << 8);
        let stderr = "2026 ERROR failed\nhpk-net-forwarder: cannot open /dev/net/tun: mode 0600\n\n";
        let text = helper_failed(status, stderr).to_string();
        assert!(text.contains("cannot open /dev/net/tun: mode 0600"), "{text}");
        assert!(text.contains("78"), "{text}");
        assert!(helper_failed(status, "").to_string().contains("no message"));
    }
}
