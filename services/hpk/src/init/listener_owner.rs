//! Who listens on a relayed port (review L5): the relay joins a connection only to a listener
//! that a process of the bubble's own mount namespace holds, that is one of the bubble's
//! services. Every pod's container has a mount namespace of its own, a privileged hostNetwork
//! pod's too, so a pod that takes a relayed port while its service is down (binding it
//! explicitly, which the reserved ports do not prevent) is not exposed to the network.
//!
//! The listening sockets come from the kernel's socket diagnostics (`NETLINK_SOCK_DIAG`, only
//! sockets in the LISTEN state, of this network namespace); who holds one is looked up once per
//! socket in `/proc/<pid>/fd` of the processes that share this mount namespace, and remembered.

use std::collections::HashMap;
use std::sync::Mutex;

/// `SOCK_DIAG_BY_FAMILY`.
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_DUMP: u16 = 0x300;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const TCP_LISTEN: u32 = 10;
/// `struct nlmsghdr`.
const HEADER: usize = 16;
/// `struct inet_diag_msg`: family, state, timer, retrans, the 48-byte socket id, then
/// expires, rqueue, wqueue, uid and inode (u32 each).
const DIAG_MSG: usize = 72;
const DIAG_MSG_INODE: usize = 68;
/// Listeners remembered at most; beyond it the memory starts again (each service restart makes
/// a new socket).
const REMEMBERED: usize = 256;

/// Decides whether the listeners of a port are the bubble's services'.
pub struct ListenerOwner {
    /// `/proc/self/ns/mnt`'s link text: `mnt:[INODE]`.
    mount_ns: String,
    /// Socket inode → whether a process of this mount namespace holds it.
    known: Mutex<HashMap<u32, bool>>,
}

impl ListenerOwner {
    /// Reads this process's mount namespace.
    pub fn new() -> std::io::Result<Self> {
        let mount_ns = std::fs::read_link("/proc/self/ns/mnt")?.to_string_lossy().into_owned();
        Ok(Self { mount_ns, known: Mutex::new(HashMap::new()) })
    }

    /// Ok if every socket listening on TCP `port` in this network namespace (IPv4 or IPv6, any
    /// address) is held by a process of this mount namespace; otherwise why not.
    pub fn check(&self, port: u16) -> Result<(), String> {
        let mut inodes =
            listening(libc::AF_INET as u8, port).map_err(|e| format!("socket diagnostics: {e}"))?;
        inodes.extend(listening(libc::AF_INET6 as u8, port).map_err(|e| format!("socket diagnostics: {e}"))?);
        for inode in inodes {
            let known =
                self.known.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(&inode).copied();
            let ours = match known {
                Some(ours) => ours,
                None => {
                    let ours = self.held_here(inode);
                    let mut known = self.known.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    if known.len() >= REMEMBERED {
                        known.clear();
                    }
                    known.insert(inode, ours);
                    ours
                }
            };
            if !ours {
                return Err(format!(
                    "port {port} is held (socket {inode}) by a process outside the bubble's services, a pod's"
                ));
            }
        }
        Ok(())
    }

    /// Whether a process of this mount namespace has socket `inode` open.
    fn held_here(&self, inode: u32) -> bool {
        let wanted = format!("socket:[{inode}]");
        let Ok(procs) = std::fs::read_dir("/proc") else { return false };
        for entry in procs.flatten() {
            let name = entry.file_name();
            if !name.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
                continue;
            }
            let dir = entry.path();
            // A process whose namespace cannot be read (another user's) is not one of ours.
            match std::fs::read_link(dir.join("ns/mnt")) {
                Ok(ns) if ns.to_string_lossy() == self.mount_ns => {}
                _ => continue,
            }
            let Ok(fds) = std::fs::read_dir(dir.join("fd")) else { continue };
            if fds
                .flatten()
                .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|t| t.as_os_str() == wanted.as_str()))
            {
                return true;
            }
        }
        false
    }
}

/// The inodes of the TCP sockets of `family` listening on `port` in this network namespace.
fn listening(family: u8, port: u16) -> std::io::Result<Vec<u32>> {
    use nix::sys::socket::{MsgFlags, SockFlag, SockProtocol, SockType, recv, send, socket};
    let sock = socket(
        nix::sys::socket::AddressFamily::Netlink,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::NetlinkSockDiag,
    )?;
    // nlmsghdr, then inet_diag_req_v2: family, protocol, ext, pad, states, a zero socket id
    // (every socket; the port is matched below).
    let mut request = Vec::with_capacity(HEADER + 56);
    request.extend_from_slice(&((HEADER + 56) as u32).to_ne_bytes());
    request.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    request.extend_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    request.extend_from_slice(&1u32.to_ne_bytes());
    request.extend_from_slice(&0u32.to_ne_bytes());
    request.extend_from_slice(&[family, libc::IPPROTO_TCP as u8, 0, 0]);
    request.extend_from_slice(&(1u32 << TCP_LISTEN).to_ne_bytes());
    request.extend_from_slice(&[0u8; 48]);
    send(std::os::fd::AsRawFd::as_raw_fd(&sock), &request, MsgFlags::empty())?;

    let mut found = Vec::new();
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        let n = recv(std::os::fd::AsRawFd::as_raw_fd(&sock), &mut buf, MsgFlags::empty())?;
        if n == 0 {
            return Err(std::io::Error::other("the kernel closed the dump"));
        }
        let mut at = 0;
        while at + HEADER <= n {
            let field = |o: usize| u32::from_ne_bytes([buf[o], buf[o + 1], buf[o + 2], buf[o + 3]]);
            let len = field(at) as usize;
            let kind = u16::from_ne_bytes([buf[at + 4], buf[at + 5]]);
            if len < HEADER || at + len > n {
                return Err(std::io::Error::other("a malformed netlink message"));
            }
            match kind {
                NLMSG_DONE => return Ok(found),
                NLMSG_ERROR => {
                    let errno = if len >= HEADER + 4 { field(at + HEADER) as i32 } else { 0 };
                    return Err(std::io::Error::from_raw_os_error(-errno));
                }
                SOCK_DIAG_BY_FAMILY if len >= HEADER + DIAG_MSG => {
                    let msg = at + HEADER;
                    // idiag_sport, network byte order, first in the socket id.
                    let sport = u16::from_be_bytes([buf[msg + 4], buf[msg + 5]]);
                    if sport == port {
                        found.push(field(msg + DIAG_MSG_INODE));
                    }
                }
                _ => {}
            }
            at += (len + 3) & !3;
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A listener of this process (which shares its own mount namespace) passes; the same port
    /// taken by a process in a mount namespace of its own, as every pod's container is, does
    /// not.
    #[test]
    fn only_listeners_of_this_mount_namespace_are_relayed_to() {
        let owner = ListenerOwner::new().expect("mount namespace");
        let ours = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = ours.local_addr().expect("addr").port();
        owner.check(port).expect("a listener of this process");
        let sockets = listening(libc::AF_INET as u8, port).expect("diag");
        assert_eq!(sockets.len(), 1, "{sockets:?}");
        drop(ours);
        owner.check(port).expect("nothing listens: nothing to refuse (the connection fails)");

        if !nix::unistd::geteuid().is_root() {
            assert!(
                std::env::var("HPK_REQUIRE_TOOLS").as_deref() != Ok("1"),
                "a mount namespace of its own needs root here"
            );
            eprintln!("SKIPPED: a mount namespace of its own needs root here");
            return;
        }
        let (mut squatter, port) = squatter();
        let refused = owner.check(port);
        let _ = squatter.kill();
        let _ = squatter.wait();
        let why = refused.expect_err("a listener of another mount namespace");
        assert!(why.contains(&port.to_string()) && why.contains("outside"), "{why}");
    }

    /// A squatter in a mount namespace of its own (as root), listening on a loopback port of
    /// its choosing, which it returns; it ends within a minute if not killed.
    pub(in crate::init) fn squatter() -> (std::process::Child, u16) {
        let mut squatter = std::process::Command::new("unshare")
            .args(["--mount", "--propagation", "private", "--", "python3", "-c"])
            .arg(
                "import socket,sys,time\n\
                 s=socket.socket(); s.bind(('127.0.0.1',0)); s.listen()\n\
                 print(s.getsockname()[1], flush=True); time.sleep(60)",
            )
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("unshare python3");
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(squatter.stdout.take().expect("stdout")),
            &mut line,
        )
        .expect("the squatter's port");
        let port: u16 = line.trim().parse().expect("a port");
        (squatter, port)
    }
}
