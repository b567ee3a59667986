//! TUN and TAP devices from `/dev/net/tun`, with virtio-net headers and offloads.
//!
//! A device is created in the network namespace of the calling thread and lives as long as its
//! file descriptor, so a crashed process leaves no interface behind, unless it is made
//! persistent ([`Device::set_persistent`]): then it stays, without carrier, until it is deleted,
//! and opening the same name again re-attaches to it.
//! With [`Options::vnet_hdr`] every read and write carries a 10-byte `virtio_net_hdr` first,
//! which lets the kernel hand over and accept 64 KiB GSO packets with partial checksums instead
//! of one packet per MTU: the per-packet cost, not the per-byte cost, is what limits a relay.
//!
//! A device's descriptor can be passed to another process over a UNIX socket
//! ([`Device::send`], [`Device::receive`]): that is how a TAP created inside a pod's network
//! namespace reaches the relay in the bubble.
//!
//! This module holds the crate's only `unsafe` code: four ioctls that have no safe wrapper, and
//! taking ownership of a descriptor received with SCM_RIGHTS.

#![allow(unsafe_code)]

use std::fs::{File, OpenOptions};
use std::io;
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::{Error, Result};

/// Where the kernel's TUN/TAP clone device lives.
pub const CLONE_DEVICE: &str = "/dev/net/tun";
/// Size of the `virtio_net_hdr` that precedes each packet when [`Options::vnet_hdr`] is set.
pub const VNET_HDR_LEN: usize = 10;

const IFNAMSIZ: usize = 16;
const IFF_TUN: libc::c_short = 0x0001;
const IFF_TAP: libc::c_short = 0x0002;
const IFF_NO_PI: libc::c_short = 0x1000;
const IFF_VNET_HDR: libc::c_short = 0x4000;
const IFF_MULTI_QUEUE: libc::c_short = 0x0100;
// _IOW('T', 202, int), _IOW('T', 203, int), _IOW('T', 208, unsigned int), _IOW('T', 216, int), the
// same numbers on x86_64 and aarch64; of the request's type, unsigned long for glibc, int for musl.
const TUNSETIFF: libc::Ioctl = 0x4004_54ca;
const TUNSETPERSIST: libc::Ioctl = 0x4004_54cb;
const TUNSETOFFLOAD: libc::Ioctl = 0x4004_54d0;
const TUNSETVNETHDRSZ: libc::Ioctl = 0x4004_54d8;
/// Offload flags for TUNSETOFFLOAD: the reader takes partial checksums and TCP GSO packets.
const TUN_F_CSUM: libc::c_ulong = 0x01;
const TUN_F_TSO4: libc::c_ulong = 0x02;
const TUN_F_TSO6: libc::c_ulong = 0x04;

/// Layer 3 (IP packets) or layer 2 (Ethernet frames).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// IP packets, no link-layer header.
    Tun,
    /// Ethernet frames.
    Tap,
}

/// How to create a device.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// TUN or TAP.
    pub kind: Kind,
    /// Prefix each packet with a `virtio_net_hdr` and accept TCP segmentation and checksum
    /// offloads (GSO packets up to 64 KiB).
    pub vnet_hdr: bool,
    /// A multi-queue device (IFF_MULTI_QUEUE): every [`Device::create`] of the same name adds a
    /// queue with its own descriptor, and the kernel hands each flow's packets to one queue.
    pub multi_queue: bool,
}

/// An open TUN/TAP device; the interface disappears when this is dropped (and no other
/// process holds a duplicate of the descriptor).
#[derive(Debug)]
pub struct Device {
    file: File,
    name: String,
}

#[repr(C)]
struct IfReqFlags {
    name: [u8; IFNAMSIZ],
    flags: libc::c_short,
    // struct ifreq is 40 bytes on 64-bit Linux; the union after the name is 24.
    _pad: [u8; 22],
}

impl Device {
    /// Creates the device `name` in the calling thread's network namespace, or attaches to it if
    /// a persistent device of that name and kind exists.
    pub fn create(name: &str, options: Options) -> Result<Self> {
        if name.is_empty() || name.len() >= IFNAMSIZ || name.contains(['/', ' ', '\0']) {
            return Err(Error::InvalidArgument(format!("interface name {name:?} is not valid")));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(CLONE_DEVICE)
            .map_err(|e| Error::Config(explain_open_error(Path::new(CLONE_DEVICE), &e)))?;
        let mut req = IfReqFlags { name: [0; IFNAMSIZ], flags: 0, _pad: [0; 22] };
        req.name[..name.len()].copy_from_slice(name.as_bytes());
        req.flags = IFF_NO_PI
            | match options.kind {
                Kind::Tun => IFF_TUN,
                Kind::Tap => IFF_TAP,
            };
        if options.vnet_hdr {
            req.flags |= IFF_VNET_HDR;
        }
        if options.multi_queue {
            req.flags |= IFF_MULTI_QUEUE;
        }
        // SAFETY: `file` is an open /dev/net/tun descriptor and `req` a properly laid out,
        // initialised `struct ifreq` that outlives the call; TUNSETIFF only reads and writes it.
        let rc = unsafe { libc::ioctl(file.as_raw_fd(), TUNSETIFF, &mut req as *mut IfReqFlags) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            return Err(Error::Config(format!(
                "cannot create {name} (TUNSETIFF): {e}; creating a TUN/TAP device needs CAP_NET_ADMIN in the \
                 network namespace's user namespace (run inside the bubble)"
            )));
        }
        let device = Device { file, name: name.to_owned() };
        if options.vnet_hdr {
            let size = VNET_HDR_LEN as libc::c_int;
            // SAFETY: TUNSETVNETHDRSZ reads one int through the pointer, which is valid for
            // the duration of the call.
            let rc =
                unsafe { libc::ioctl(device.file.as_raw_fd(), TUNSETVNETHDRSZ, &size as *const libc::c_int) };
            device.check(rc, "TUNSETVNETHDRSZ")?;
            let offload = TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6;
            // SAFETY: TUNSETOFFLOAD takes its argument by value; no memory is passed.
            let rc = unsafe { libc::ioctl(device.file.as_raw_fd(), TUNSETOFFLOAD, offload) };
            device.check(rc, "TUNSETOFFLOAD")?;
        }
        Ok(device)
    }

    fn check(&self, rc: libc::c_int, what: &str) -> Result<()> {
        if rc < 0 {
            let e = io::Error::last_os_error();
            return Err(Error::Config(format!("cannot configure {} ({what}): {e}", self.name)));
        }
        Ok(())
    }

    /// Keeps the interface after its last descriptor is closed (`true`), or lets it go with the
    /// last descriptor again (`false`).
    pub fn set_persistent(&self, persistent: bool) -> Result<()> {
        // SAFETY: TUNSETPERSIST takes its argument by value; no memory is passed.
        let rc =
            unsafe { libc::ioctl(self.file.as_raw_fd(), TUNSETPERSIST, libc::c_ulong::from(persistent)) };
        self.check(rc, "TUNSETPERSIST")
    }

    /// Makes reads and writes return `WouldBlock` instead of waiting.
    pub fn set_nonblocking(&self) -> Result<()> {
        use nix::fcntl::{FcntlArg, OFlag, fcntl};
        let flags = fcntl(&self.file, FcntlArg::F_GETFL).map_err(|e| self.os_error("F_GETFL", e))?;
        let flags = OFlag::from_bits_retain(flags) | OFlag::O_NONBLOCK;
        fcntl(&self.file, FcntlArg::F_SETFL(flags)).map_err(|e| self.os_error("O_NONBLOCK", e))?;
        Ok(())
    }

    fn os_error(&self, what: &str, e: nix::errno::Errno) -> Error {
        Error::Config(format!("cannot configure {} ({what}): {e}", self.name))
    }

    /// Sends the descriptor, with the name as the message, over a connected UNIX socket.
    pub fn send(&self, socket: BorrowedFd<'_>) -> Result<()> {
        send_fd(socket, self.file.as_fd(), self.name.as_bytes())
    }

    /// Receives a device sent with [`Device::send`]; `None` when the peer closed the socket
    /// without sending one.
    pub fn receive(socket: BorrowedFd<'_>) -> Result<Option<Self>> {
        let Some((fd, name)) = receive_fd(socket)? else { return Ok(None) };
        let name = String::from_utf8(name)
            .ok()
            .filter(|n| !n.is_empty() && n.len() < IFNAMSIZ)
            .ok_or_else(|| Error::Config("a TAP descriptor came with a malformed interface name".into()))?;
        Ok(Some(Device { file: File::from(fd), name }))
    }

    /// The interface's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The descriptor: reads return one packet (or frame), writes take one.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Gives up the descriptor (to pass it to another process or thread).
    pub fn into_file(self) -> File {
        self.file
    }
}

impl AsFd for Device {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
}

/// Sends `fd`, with `message` (at most 64 bytes, not empty), over a connected UNIX socket with
/// SCM_RIGHTS.
pub fn send_fd(socket: BorrowedFd<'_>, fd: BorrowedFd<'_>, message: &[u8]) -> Result<()> {
    use nix::sys::socket::{ControlMessage, MsgFlags, UnixAddr, sendmsg};
    let fds = [fd.as_raw_fd()];
    sendmsg::<UnixAddr>(
        socket.as_raw_fd(),
        &[IoSlice::new(message)],
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::MSG_NOSIGNAL,
        None,
    )
    .map_err(|e| Error::io("send a descriptor over a UNIX socket", e.into()))?;
    Ok(())
}

/// Receives one descriptor and its message sent with [`send_fd`] (close-on-exec); `None` when
/// the peer closed the socket without sending one.
pub fn receive_fd(socket: BorrowedFd<'_>) -> Result<Option<(OwnedFd, Vec<u8>)>> {
    use nix::sys::socket::{ControlMessageOwned, MsgFlags, UnixAddr, recvmsg};
    let mut message = [0u8; 64];
    let mut space = nix::cmsg_space!([std::os::fd::RawFd; 1]);
    let mut iov = [IoSliceMut::new(&mut message)];
    let msg = recvmsg::<UnixAddr>(socket.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC)
        .map_err(|e| Error::io("receive a descriptor over a UNIX socket", e.into()))?;
    let len = msg.bytes;
    let mut received: Vec<OwnedFd> = Vec::new();
    for cmsg in msg.cmsgs().map_err(|e| Error::io("read a control message", e.into()))? {
        if let ControlMessageOwned::ScmRights(fds) = cmsg {
            // SAFETY: SCM_RIGHTS installed these descriptors in this process during the recvmsg
            // above; nothing else knows them, so each is owned exactly once, here.
            received.extend(fds.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
        }
    }
    // More than one descriptor is a confused peer; the extra ones are closed here.
    Ok(received.into_iter().next().map(|fd| (fd, message[..len.min(message.len())].to_vec())))
}

/// Why `/dev/net/tun` cannot be opened, in words a user can act on. Rootless TUN/TAP needs the
/// device to be world read-writable (0666, Debian's default); some hosts ship it 0600.
pub fn explain_open_error(path: &Path, e: &io::Error) -> String {
    match e.kind() {
        io::ErrorKind::NotFound => {
            format!("{} does not exist: the kernel's tun module is not loaded (modprobe tun)", path.display())
        }
        io::ErrorKind::PermissionDenied => {
            let mode = std::fs::metadata(path).map(|m| m.permissions().mode() & 0o777).unwrap_or(0);
            format!(
                "cannot open {}: {e}; it is mode {mode:04o}, and rootless TUN/TAP devices need 0666 \
                 (as root: chmod 0666 {})",
                path.display(),
                path.display()
            )
        }
        _ => format!("cannot open {}: {e}", path.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ifreq_has_the_kernel_layout() {
        assert_eq!(std::mem::size_of::<IfReqFlags>(), 40);
        assert_eq!(std::mem::offset_of!(IfReqFlags, flags), 16);
    }

    #[test]
    fn refuses_bad_names() {
        for name in ["", "sixteen-chars-xx", "a/b", "a b"] {
            let e = Device::create(name, Options { kind: Kind::Tun, vnet_hdr: false, multi_queue: false })
                .expect_err("a bad name");
            assert!(matches!(e, Error::InvalidArgument(_)), "{name:?}: {e}");
        }
    }

    #[test]
    fn explains_a_0600_device() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("tun");
        std::fs::write(&path, "").expect("write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let e = io::Error::from(io::ErrorKind::PermissionDenied);
        let text = explain_open_error(&path, &e);
        assert!(text.contains("mode 0600") && text.contains("chmod 0666"), "{text}");
        let text = explain_open_error(&dir.path().join("absent"), &io::Error::from(io::ErrorKind::NotFound));
        assert!(text.contains("modprobe tun"), "{text}");
    }
}
