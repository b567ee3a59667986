//! Who listens on a relayed port (review L5): the relay joins a connection only to a listener
//! that one of the bubble's services holds, the processes its supervisor started. A pod that
//! takes a relayed port while its service is down (binding it explicitly, which the reserved
//! ports do not prevent; a privileged hostNetwork pod can) is not exposed to the network.
//!
//! The listening sockets come from the kernel's socket diagnostics (`NETLINK_SOCK_DIAG`, only
//! sockets in the LISTEN state, of this network namespace); who holds one is looked up once per
//! socket in `/proc/<pid>/fd` of the services, and remembered.

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
    /// The PIDs of the services now.
    services: Box<dyn Fn() -> Vec<u32> + Send + Sync>,
    /// Socket inode → whether a service holds it.
    known: Mutex<HashMap<u32, bool>>,
}

impl ListenerOwner {
    /// Listeners are the services' if a process `services` names holds them.
    pub fn new(services: impl Fn() -> Vec<u32> + Send + Sync + 'static) -> Self {
        Self { services: Box::new(services), known: Mutex::new(HashMap::new()) }
    }

    /// Ok if every socket listening on TCP `port` in this network namespace that a connection
    /// to `127.0.0.1:port` can reach (bound to that address or a wildcard, IPv4 or IPv6) is
    /// held by one of the services; otherwise why not.
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
                    let ours = (self.services)().into_iter().any(|pid| holds(pid, inode));
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
}

/// Whether process `pid` has socket `inode` open.
fn holds(pid: u32, inode: u32) -> bool {
    let wanted = format!("socket:[{inode}]");
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { return false };
    fds.flatten().any(|fd| std::fs::read_link(fd.path()).is_ok_and(|t| t.as_os_str() == wanted.as_str()))
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
                    let errno = if len >= HEADER + 4 { field(at + HEADER) as i32 } else { -libc::EIO };
                    // Zero is an acknowledgement, not an error.
                    if errno != 0 {
                        return Err(std::io::Error::from_raw_os_error(-errno));
                    }
                }
                SOCK_DIAG_BY_FAMILY if len >= HEADER + DIAG_MSG => {
                    let msg = at + HEADER;
                    // The socket id: idiag_sport (network byte order), idiag_dport, then
                    // idiag_src (16 bytes; an IPv4 address in the first 4).
                    let sport = u16::from_be_bytes([buf[msg + 4], buf[msg + 5]]);
                    let src: [u8; 16] = buf[msg + 8..msg + 24].try_into().unwrap_or([0xff; 16]);
                    if sport == port && reaches_loopback(family, &src) {
                        found.push(field(msg + DIAG_MSG_INODE));
                    }
                }
                _ => {}
            }
            at += (len + 3) & !3;
        }
    }
}

/// Whether a listener bound to `src` (of `family`) gets connections to `127.0.0.1`: bound to
/// it or to a wildcard (`0.0.0.0`; `::` or a v4-mapped one, for a dual-stack IPv6 socket).
fn reaches_loopback(family: u8, src: &[u8; 16]) -> bool {
    const LOOPBACK: [u8; 4] = [127, 0, 0, 1];
    if i32::from(family) == libc::AF_INET {
        return src[..4] == LOOPBACK || src[..4] == [0; 4];
    }
    let v4_mapped = src[..10] == [0; 10] && src[10..12] == [0xff, 0xff];
    *src == [0; 16] || (v4_mapped && (src[12..] == LOOPBACK || src[12..] == [0; 4]))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    fn bind(addr: &str) -> (std::net::TcpListener, u16) {
        let listener = std::net::TcpListener::bind(addr).expect("bind");
        let port = listener.local_addr().expect("addr").port();
        (listener, port)
    }

    /// A listener a service holds passes. One no service holds (a pod's; here one of this
    /// process while the owner names no service) is refused, on the loopback or a wildcard
    /// address, IPv4 or IPv6. One on another address gets no connection to the loopback and
    /// is no reason to refuse.
    #[test]
    fn only_listeners_the_services_hold_are_relayed_to() {
        let services = ListenerOwner::new(|| vec![std::process::id()]);
        let no_service = ListenerOwner::new(Vec::new);
        let (ours, port) = bind("127.0.0.1:0");
        services.check(port).expect("a listener of a service");
        let sockets = listening(libc::AF_INET as u8, port).expect("diag");
        assert_eq!(sockets.len(), 1, "{sockets:?}");
        let why = no_service.check(port).expect_err("a listener no service holds");
        assert!(why.contains(&port.to_string()) && why.contains("outside"), "{why}");
        drop(ours);
        no_service.check(port).expect("nothing listens: nothing to refuse (the connection fails)");

        for addr in ["0.0.0.0:0", "[::]:0"] {
            let (_squatter, port) = bind(addr);
            let why = no_service.check(port).expect_err(addr);
            assert!(why.contains("outside"), "{addr}: {why}");
        }
        let (_elsewhere, port) = bind("127.0.0.2:0");
        no_service.check(port).expect("another address's listener is not on the relay's way");
    }

    /// A squatter: a listener on the IPv6 wildcard (dual stack, as busybox's `nc -l` binds) of
    /// a port of its choosing, which never accepts; pair it with an owner naming no service.
    pub(in crate::init) fn squatter() -> (std::net::TcpListener, u16) {
        bind("[::]:0")
    }
}
