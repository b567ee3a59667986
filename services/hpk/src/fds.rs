//! Descriptors across processes: placed in a child at fixed numbers (3, 4, …) — the published
//! host sockets and the host-ports socket to `crun create --preserve-fds`, a ready pipe to
//! slirp4netns —, claimed by the bubble's supervisor, and adopted when received with
//! `SCM_RIGHTS` (the host ports). `std::process::Command` has no safe way to place a descriptor
//! at a number, nor std a way to own a raw one, so this module holds the crate's `unsafe` for
//! them.

#![allow(unsafe_code)]

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;

/// Makes `fds[i]` descriptor `3 + i` in the child `cmd` starts (close-on-exec cleared there);
/// the parent's descriptors are unchanged. The descriptors must stay open until the spawn.
pub fn pass(cmd: &mut std::process::Command, fds: &[&OwnedFd]) {
    unblock_signals(cmd);
    let sources: Vec<RawFd> = fds.iter().map(|fd| fd.as_raw_fd()).collect();
    // SAFETY: the closure runs in the child between fork and exec and calls only dup, dup2 and
    // fcntl (async-signal-safe) on descriptors that are open there; it allocates nothing (the
    // vectors were built before the fork and are only read).
    unsafe {
        cmd.pre_exec(move || {
            // First move every source above the target range, so a source that already sits on
            // a target number is not overwritten before it is copied.
            let base = 3 + sources.len() as RawFd;
            let mut moved = [0 as RawFd; 16];
            if sources.len() > moved.len() {
                return Err(std::io::Error::other("too many descriptors to pass"));
            }
            for (i, &fd) in sources.iter().enumerate() {
                let copy = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, base);
                if copy < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                moved[i] = copy;
            }
            for (i, &copy) in moved.iter().take(sources.len()).enumerate() {
                // dup2 clears close-on-exec on the new descriptor.
                if libc::dup2(copy, 3 + i as RawFd) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
}

/// Empties the signal mask in the child `cmd` starts: the launcher and the bubble's reaper
/// block the signals they wait for, and a mask is inherited across exec (slirp4netns would
/// otherwise never see its SIGTERM).
pub fn unblock_signals(cmd: &mut std::process::Command) {
    // SAFETY: runs between fork and exec; sigemptyset and sigprocmask are async-signal-safe
    // and touch only the stack-allocated set.
    unsafe {
        cmd.pre_exec(|| {
            let mut set = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
            libc::sigemptyset(set.as_mut_ptr());
            if libc::sigprocmask(libc::SIG_SETMASK, set.as_ptr(), std::ptr::null_mut()) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Claims inherited descriptor `fd` as a listening TCP socket (as `bubble-init` receives the
/// published ports); refuses anything else. Call at most once per descriptor.
pub fn claim_listener(fd: RawFd) -> std::io::Result<std::net::TcpListener> {
    claim_socket(fd, nix::sys::socket::SockType::Stream, true).map(std::net::TcpListener::from)
}

/// Claims inherited descriptor `fd` as a `SOCK_SEQPACKET` socket (the bubble's end of the
/// host-ports pair); refuses anything else. Call at most once per descriptor.
pub fn claim_seqpacket(fd: RawFd) -> std::io::Result<OwnedFd> {
    claim_socket(fd, nix::sys::socket::SockType::SeqPacket, false)
}

/// Claims inherited descriptor `fd` if it is an open socket of type `kind` (and listening,
/// when `listening`), close-on-exec from now on.
fn claim_socket(fd: RawFd, kind: nix::sys::socket::SockType, listening: bool) -> std::io::Result<OwnedFd> {
    use std::os::fd::{BorrowedFd, FromRawFd};
    if fd < 3 {
        return Err(std::io::Error::other(format!("descriptor {fd} is a standard stream")));
    }
    // SAFETY: F_GETFD only inspects the descriptor table entry.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return Err(std::io::Error::other(format!("descriptor {fd} is not open")));
    }
    // SAFETY: checked open just above; borrowed only for the getsockopt calls.
    let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
    let actual = nix::sys::socket::getsockopt(&borrowed, nix::sys::socket::sockopt::SockType)
        .map_err(|e| std::io::Error::other(format!("descriptor {fd} is not a socket: {e}")))?;
    let accepting = nix::sys::socket::getsockopt(&borrowed, nix::sys::socket::sockopt::AcceptConn)
        .map_err(|e| std::io::Error::other(format!("descriptor {fd}: {e}")))?;
    if actual != kind || accepting != listening {
        let what =
            if listening { format!("a listening {kind:?} socket") } else { format!("a {kind:?} socket") };
        return Err(std::io::Error::other(format!("descriptor {fd} is not {what}")));
    }
    // SAFETY: an open socket of the expected kind nothing else in this process owns (claimed
    // once, right after start); ownership moves into the OwnedFd, which closes it.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    nix::fcntl::fcntl(&owned, nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC))
        .map_err(|e| std::io::Error::other(format!("descriptor {fd}: {e}")))?;
    Ok(owned)
}

/// Takes ownership of descriptors the kernel installed in this process for a received
/// `SCM_RIGHTS` message (the host-ports answer), so they close when dropped.
pub fn own_received(raw: &[RawFd]) -> Vec<OwnedFd> {
    use std::os::fd::FromRawFd;
    raw.iter()
        // SAFETY: recvmsg just installed each of these in this process's table for this
        // message; nothing else refers to them, and each is adopted once.
        .map(|&fd| unsafe { OwnedFd::from_raw_fd(fd) })
        .collect()
}
