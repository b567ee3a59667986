//! The tunnel's UDP socket, opened in the host's network namespace and inherited by the
//! net-forwarder inside the bubble.
//!
//! A socket belongs to the network namespace it was created in, whichever namespace the process
//! that holds it moves to. `hpk-net-forwarder tunnel-socket` binds it in the host's namespace
//! and execs the command that creates the bubble with the descriptor left open
//! (`HPK_TUNNEL_FD` says its number); `serve --tunnel-fd` claims it. So the process that relays
//! pod traffic lives in the bubble, and the only host-side thing it holds is one UDP socket.
//!
//! Claiming a descriptor by number is the one operation here without a safe API.

#![allow(unsafe_code)]

use std::ffi::CString;
use std::net::{SocketAddr, SocketAddrV4, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use nix::fcntl::{FcntlArg, FdFlag, fcntl};
use nix::sys::socket::{
    AddressFamily, SockType, SockaddrLike, SockaddrStorage, getsockname, getsockopt, sockopt,
};

use crate::{Error, Result};

/// The environment variable that carries the inherited descriptor's number.
pub const FD_ENV: &str = "HPK_TUNNEL_FD";
/// Socket buffer size asked for (the kernel caps it at net.core.[rw]mem_max): a tunnel datagram
/// is up to 64 KiB, and a 208 KiB default buffer holds only three.
const BUFFER_BYTES: usize = 4 << 20;

/// `tunnel-socket`: binds a UDP socket to `bind` in the current network namespace, and replaces
/// this process with `command`, the socket left open for it and its number in `HPK_TUNNEL_FD`.
/// Returns only on failure.
pub fn exec_with_socket(bind: SocketAddrV4, command: &[String]) -> Error {
    let socket = match UdpSocket::bind(bind) {
        Ok(s) => s,
        Err(e) => return Error::io(format!("bind the tunnel's UDP socket to {bind}"), e),
    };
    let local = socket.local_addr().map(|a| a.to_string()).unwrap_or_default();
    tune(&socket);
    let fd: OwnedFd = socket.into();
    if let Err(e) = fcntl(&fd, FcntlArg::F_SETFD(FdFlag::empty())) {
        return Error::io("let the tunnel socket be inherited", e.into());
    }
    let Some((program, _)) = command.split_first() else {
        return Error::InvalidArgument("tunnel-socket needs a command to run".into());
    };
    let args: std::result::Result<Vec<CString>, _> =
        command.iter().map(|a| CString::new(a.as_str())).collect();
    let (Ok(program), Ok(args)) = (CString::new(program.as_str()), args) else {
        return Error::InvalidArgument("the command contains a NUL byte".into());
    };
    let number = fd.as_raw_fd();
    let mut env: Vec<CString> = std::env::vars_os()
        .filter(|(k, _)| k != FD_ENV)
        .filter_map(|(k, v)| {
            let mut kv = k.into_encoded_bytes();
            kv.push(b'=');
            kv.extend(v.into_encoded_bytes());
            CString::new(kv).ok()
        })
        .collect();
    env.extend(CString::new(format!("{FD_ENV}={number}")));
    eprintln!("hpk-net-forwarder: tunnel socket {local} is fd {number}");
    std::mem::forget(fd); // stays open across exec
    match nix::unistd::execvpe(&program, &args, &env) {
        Err(e) => Error::io(format!("exec {}", program.to_string_lossy()), e.into()),
    }
}

/// Claims the inherited descriptor `fd`: it must be an IPv4 UDP socket bound to a port.
/// Marks it close-on-exec so it goes no further. Call at most once per descriptor.
pub fn claim(fd: RawFd) -> Result<(UdpSocket, SocketAddrV4)> {
    let bad = |why: String| Error::Config(format!("--tunnel-fd {fd}: {why}"));
    if fd < 3 {
        return Err(bad("0, 1 and 2 are the standard streams".into()));
    }
    // SAFETY: F_GETFD only inspects the descriptor table entry; no memory is passed.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return Err(bad("no such open descriptor (was the server started by tunnel-socket?)".into()));
    }
    // SAFETY: the descriptor is open (checked above) and inherited from the parent; nothing
    // in this process has claimed it: `claim` is called once, at start, with the number the
    // parent handed over, and from here on the OwnedFd is its only owner.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let kind = getsockopt(&owned, sockopt::SockType).map_err(|e| bad(format!("not a socket ({e})")))?;
    if kind != SockType::Datagram {
        return Err(bad(format!("a {kind:?} socket, not UDP")));
    }
    let addr: SockaddrStorage =
        getsockname(owned.as_raw_fd()).map_err(|e| bad(format!("getsockname: {e}")))?;
    let local = match (addr.family(), addr.as_sockaddr_in()) {
        (Some(AddressFamily::Inet), Some(sin)) => SocketAddrV4::new(sin.ip(), sin.port()),
        _ => return Err(bad("not an IPv4 socket".into())),
    };
    if local.port() == 0 {
        return Err(bad("the socket is not bound".into()));
    }
    fcntl(&owned, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC))
        .map_err(|e| bad(format!("set close-on-exec: {e}")))?;
    let socket = UdpSocket::from(owned);
    Ok((socket, local))
}

/// Binds a socket in the current namespace (tests and hosts without bubbles).
pub fn bind(addr: SocketAddrV4) -> Result<(UdpSocket, SocketAddrV4)> {
    let socket =
        UdpSocket::bind(addr).map_err(|e| Error::io(format!("bind the tunnel socket to {addr}"), e))?;
    tune(&socket);
    match socket.local_addr() {
        Ok(SocketAddr::V4(local)) => Ok((socket, local)),
        Ok(other) => Err(Error::Config(format!("the tunnel socket is bound to {other}, not IPv4"))),
        Err(e) => Err(Error::io("read the tunnel socket's address", e)),
    }
}

/// What the kernel offers the tunnel socket for cutting and coalescing datagrams.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Offloads {
    /// UDP GSO (`UDP_SEGMENT`, Linux 4.18): one send of equal-size segments.
    pub gso: bool,
    /// UDP GRO (`UDP_GRO`, Linux 5.0): one receive of coalesced segments.
    pub gro: bool,
}

/// Turns on UDP GRO on `socket` and probes for UDP GSO (asked for per send, so the socket's
/// default segment size stays 0). An option the kernel refuses is reported off, not an error.
pub fn udp_offloads(socket: &UdpSocket) -> Offloads {
    use nix::sys::socket::setsockopt;
    Offloads {
        gso: setsockopt(socket, sockopt::UdpGsoSegment, &0).is_ok(),
        gro: setsockopt(socket, sockopt::UdpGroSegment, &true).is_ok(),
    }
}

fn tune(socket: &UdpSocket) {
    for (what, result) in [
        ("receive", nix::sys::socket::setsockopt(socket, sockopt::RcvBuf, &BUFFER_BYTES)),
        ("send", nix::sys::socket::setsockopt(socket, sockopt::SndBuf, &BUFFER_BYTES)),
    ] {
        if let Err(e) = result {
            tracing::warn!(error = %e, "cannot enlarge the tunnel socket's {what} buffer");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::IntoRawFd;

    #[test]
    fn claims_a_bound_udp_socket() {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = s.local_addr().unwrap().port();
        let (socket, local) = claim(s.into_raw_fd()).unwrap();
        assert_eq!(local, SocketAddrV4::new([127, 0, 0, 1].into(), port));
        let flags = fcntl(&socket, FcntlArg::F_GETFD).unwrap();
        assert!(FdFlag::from_bits_truncate(flags).contains(FdFlag::FD_CLOEXEC));
    }

    #[test]
    fn this_kernel_offers_udp_offloads() {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        // Linux ≥ 5.0 has both; the tests run on newer kernels.
        assert_eq!(udp_offloads(&s), Offloads { gso: true, gro: true });
        assert!(getsockopt(&s, sockopt::UdpGroSegment).unwrap());
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let not_udp = UdpSocket::from(OwnedFd::from(tcp));
        assert_eq!(udp_offloads(&not_udp), Offloads { gso: false, gro: false });
    }

    #[test]
    fn refuses_what_is_not_a_bound_ipv4_udp_socket() {
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let e = claim(tcp.into_raw_fd()).unwrap_err().to_string();
        assert!(e.contains("not UDP"), "{e}");
        let file = std::fs::File::open("/proc/self/stat").unwrap();
        let e = claim(file.into_raw_fd()).unwrap_err().to_string();
        assert!(e.contains("not a socket"), "{e}");
        let v6 = UdpSocket::bind("[::1]:0");
        if let Ok(v6) = v6 {
            let e = claim(v6.into_raw_fd()).unwrap_err().to_string();
            assert!(e.contains("IPv4"), "{e}");
        }
        assert!(claim(2).unwrap_err().to_string().contains("standard streams"));
        assert!(claim(1_000_000).unwrap_err().to_string().contains("no such open descriptor"));
    }
}
