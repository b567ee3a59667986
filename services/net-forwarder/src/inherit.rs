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

/// `tunnel-socket`: binds `queues` UDP sockets to `bind` in the current network namespace (one
/// port, a reuse-port group: [`bind_group`]), and replaces this process with `command`, the
/// sockets left open for it and their numbers, comma-separated, in `HPK_TUNNEL_FD`. Returns
/// only on failure.
pub fn exec_with_socket(bind: SocketAddrV4, queues: usize, command: &[String]) -> Error {
    let sockets = match bind_group(bind, queues) {
        Ok(s) => s,
        Err(e) => return e,
    };
    let local = sockets[0].local_addr().map(|a| a.to_string()).unwrap_or_default();
    let mut fds: Vec<OwnedFd> = Vec::with_capacity(sockets.len());
    for socket in sockets {
        let fd: OwnedFd = socket.into();
        if let Err(e) = fcntl(&fd, FcntlArg::F_SETFD(FdFlag::empty())) {
            return Error::io("let the tunnel socket be inherited", e.into());
        }
        fds.push(fd);
    }
    let Some((program, _)) = command.split_first() else {
        return Error::InvalidArgument("tunnel-socket needs a command to run".into());
    };
    let args: std::result::Result<Vec<CString>, _> =
        command.iter().map(|a| CString::new(a.as_str())).collect();
    let (Ok(program), Ok(args)) = (CString::new(program.as_str()), args) else {
        return Error::InvalidArgument("the command contains a NUL byte".into());
    };
    let numbers: Vec<String> = fds.iter().map(|fd| fd.as_raw_fd().to_string()).collect();
    let number = numbers.join(",");
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
    std::mem::forget(fds); // stay open across exec
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

/// Claims every inherited descriptor of `fds` ([`claim`]): the sockets of one tunnel, which
/// must all be bound to the same address (a reuse-port group, [`bind_group`]), in the group's
/// order. Refuses an empty list, duplicates and more than [`MAX_QUEUES`].
pub fn claim_all(fds: &[RawFd]) -> Result<(Vec<UdpSocket>, SocketAddrV4)> {
    let list = fds.iter().map(|f| f.to_string()).collect::<Vec<_>>().join(",");
    let bad = |why: &str| Error::Config(format!("--tunnel-fd {list}: {why}"));
    if fds.is_empty() {
        return Err(bad("no descriptor"));
    }
    if fds.len() > MAX_QUEUES {
        return Err(bad(&format!("at most {MAX_QUEUES} sockets")));
    }
    if fds.iter().enumerate().any(|(i, f)| fds[..i].contains(f)) {
        return Err(bad("a descriptor is named twice"));
    }
    // Every descriptor is checked before any is claimed: a bad list takes ownership of none.
    for &fd in fds {
        // SAFETY: F_GETFD only inspects the descriptor table entry; no memory is passed.
        if fd >= 3 && unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
            return Err(bad(&format!(
                "no such open descriptor: {fd} (was the server started by tunnel-socket?)"
            )));
        }
    }
    let mut sockets = Vec::with_capacity(fds.len());
    let mut first: Option<SocketAddrV4> = None;
    for &fd in fds {
        let (socket, local) = claim(fd)?;
        // One socket of a group: the kernel would hand the others' share of the datagrams to
        // sockets nobody reads.
        if fds.len() == 1 && getsockopt(&socket, sockopt::ReusePort).unwrap_or(false) {
            return Err(bad(
                "the socket is one of a reuse-port group (tunnel-socket --queues): pass all of them, as \
                 HPK_TUNNEL_FD does",
            ));
        }
        if let Some(first) = first.filter(|f| *f != local) {
            return Err(bad(&format!(
                "the sockets are bound to {first} and {local}; one tunnel has one address"
            )));
        }
        first = Some(local);
        sockets.push(socket);
    }
    Ok((sockets, first.unwrap_or_else(|| SocketAddrV4::new([0, 0, 0, 0].into(), 0))))
}

/// The most sockets (and TUN queues) one tunnel has: the lanes a chunk header can name
/// ([`crate::tunnel::chunks::LANES`]).
pub const MAX_QUEUES: usize = crate::tunnel::chunks::LANES;

/// Binds a socket in the current namespace (tests and hosts without bubbles).
pub fn bind(addr: SocketAddrV4) -> Result<(UdpSocket, SocketAddrV4)> {
    let sockets = bind_group(addr, 1)?;
    let local = local_v4(&sockets[0])?;
    Ok((sockets.into_iter().next().expect("one socket"), local))
}

/// Binds `queues` (1 to [`MAX_QUEUES`]) UDP sockets to `addr` in the current namespace: with
/// more than one, a reuse-port group on one port (the first bind picks it when `addr`'s port is
/// 0), so that the peers see one endpoint and each receiving thread has a socket of its own
/// ([`steer`] says which datagram goes to which). The kernel lets only sockets of the same user
/// join a group: another user on the host cannot bind the port and take a share of the
/// traffic.
pub fn bind_group(addr: SocketAddrV4, queues: usize) -> Result<Vec<UdpSocket>> {
    use nix::sys::socket::{SockFlag, SockaddrIn, bind, setsockopt, socket};
    if !(1..=MAX_QUEUES).contains(&queues) {
        return Err(Error::InvalidArgument(format!("a tunnel has 1 to {MAX_QUEUES} sockets, not {queues}")));
    }
    let failed = |what: &str, at: SocketAddrV4, e: nix::errno::Errno| {
        Error::io(format!("{what} the tunnel's UDP socket at {at}"), e.into())
    };
    let mut sockets: Vec<UdpSocket> = Vec::with_capacity(queues);
    let mut at = addr;
    for _ in 0..queues {
        let fd = socket(AddressFamily::Inet, SockType::Datagram, SockFlag::SOCK_CLOEXEC, None)
            .map_err(|e| failed("create", at, e))?;
        if queues > 1 {
            setsockopt(&fd, sockopt::ReusePort, &true).map_err(|e| failed("set SO_REUSEPORT on", at, e))?;
        }
        bind(fd.as_raw_fd(), &SockaddrIn::from(at)).map_err(|e| failed("bind", at, e))?;
        let socket = UdpSocket::from(fd);
        tune(&socket);
        // The rest join the first's port.
        at = local_v4(&socket)?;
        sockets.push(socket);
    }
    Ok(sockets)
}

fn local_v4(socket: &UdpSocket) -> Result<SocketAddrV4> {
    match socket.local_addr() {
        Ok(SocketAddr::V4(local)) => Ok(local),
        Ok(other) => Err(Error::Config(format!("the tunnel socket is bound to {other}, not IPv4"))),
        Err(e) => Err(Error::io("read the tunnel socket's address", e)),
    }
}

/// `SO_ATTACH_REUSEPORT_CBPF` (the same number on x86_64 and aarch64).
const SO_ATTACH_REUSEPORT_CBPF: libc::c_int = 51;

/// Makes the kernel hand each datagram to the socket of a reuse-port group (`sockets`, in the
/// order they joined it) that its sender's *lane* names: the low 4 bits of the chunk header's
/// message id ([`crate::tunnel::chunks::lane`]), modulo the group's size. A sender's queue puts
/// its lane there, and the kernel keeps a flow on one queue, so a flow's messages stay on one
/// receiving thread, in order; and all the chunks of a message go to the same one. A group of
/// one needs nothing. A classic BPF program of four instructions, run on the UDP payload.
pub fn steer(sockets: &[UdpSocket]) -> Result<()> {
    if sockets.len() < 2 {
        return Ok(());
    }
    const LD_B_ABS: u16 = 0x30; // A = payload[k]
    const AND_K: u16 = 0x54; // A &= k
    const MOD_K: u16 = 0x94; // A %= k
    const RET_A: u16 = 0x16; // return A
    let op = |code: u16, k: u32| libc::sock_filter { code, jt: 0, jf: 0, k };
    let lanes = (crate::tunnel::chunks::LANES - 1) as u32;
    let mut program = [
        op(LD_B_ABS, crate::tunnel::chunks::LANE_OFFSET as u32),
        op(AND_K, lanes),
        op(MOD_K, sockets.len() as u32),
        op(RET_A, 0),
    ];
    let prog = libc::sock_fprog { len: program.len() as u16, filter: program.as_mut_ptr() };
    // SAFETY: setsockopt reads `prog` and the four instructions it points to, which outlive
    // the call; the kernel copies the program.
    let rc = unsafe {
        libc::setsockopt(
            sockets[0].as_raw_fd(),
            libc::SOL_SOCKET,
            SO_ATTACH_REUSEPORT_CBPF,
            (&prog as *const libc::sock_fprog).cast(),
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        return Err(Error::io(
            "steer the tunnel's sockets by lane (SO_ATTACH_REUSEPORT_CBPF)",
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
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

    /// A chunk header's first 8 bytes naming lane `lane`, and a byte of payload.
    fn datagram(lane: u8) -> Vec<u8> {
        let mut d = b"HK\x03\x02\x00\x00\x01".to_vec();
        d.push(0xa0 | lane);
        d.extend_from_slice(&[0; 5]);
        d
    }

    #[test]
    fn a_group_of_sockets_shares_one_port_and_each_lane_reaches_its_socket() {
        let sockets = bind_group(SocketAddrV4::new([127, 0, 0, 1].into(), 0), 3).unwrap();
        let local = local_v4(&sockets[0]).unwrap();
        assert!(sockets.iter().all(|s| local_v4(s).unwrap() == local));
        steer(&sockets).unwrap();
        for s in &sockets {
            s.set_read_timeout(Some(std::time::Duration::from_secs(2))).unwrap();
        }
        let peer = UdpSocket::bind("127.0.0.1:0").unwrap();
        for lane in 0..16u8 {
            peer.send_to(&datagram(lane), local).unwrap();
            let mut buf = [0u8; 64];
            let (n, _) = sockets[lane as usize % 3].recv_from(&mut buf).unwrap();
            assert_eq!(&buf[..n], &datagram(lane)[..], "lane {lane}");
        }
        // Nothing reached another socket.
        for s in &sockets {
            s.set_nonblocking(true).unwrap();
            assert!(s.recv_from(&mut [0u8; 64]).is_err());
        }
        // A datagram too short to name a lane goes to the first.
        peer.send_to(b"HK", local).unwrap();
        sockets[0].set_nonblocking(false).unwrap();
        assert_eq!(sockets[0].recv_from(&mut [0u8; 64]).unwrap().0, 2);
    }

    #[test]
    fn a_group_is_one_to_sixteen_sockets_and_a_lone_socket_shares_no_port() {
        let any = SocketAddrV4::new([127, 0, 0, 1].into(), 0);
        assert!(bind_group(any, 0).unwrap_err().to_string().contains("1 to 16"));
        assert!(bind_group(any, 17).is_err());
        let one = bind_group(any, 1).unwrap();
        // A lone socket is no group: the port cannot be shared.
        let taken = local_v4(&one[0]).unwrap();
        assert!(bind_group(taken, 2).is_err());
    }

    #[test]
    fn claims_a_list_of_sockets_of_one_address_only() {
        let any = SocketAddrV4::new([127, 0, 0, 1].into(), 0);
        let group: Vec<RawFd> = bind_group(any, 2).unwrap().into_iter().map(|s| s.into_raw_fd()).collect();
        let e = claim_all(&group[1..]).unwrap_err().to_string();
        assert!(e.contains("pass all of them"), "{e}");
        let group: Vec<RawFd> = bind_group(any, 2).unwrap().into_iter().map(|s| s.into_raw_fd()).collect();
        let (sockets, local) = claim_all(&group).unwrap();
        assert_eq!(sockets.len(), 2);
        assert_eq!(local_v4(&sockets[1]).unwrap(), local);
        let a = UdpSocket::bind("127.0.0.1:0").unwrap().into_raw_fd();
        let b = UdpSocket::bind("127.0.0.1:0").unwrap().into_raw_fd();
        let e = claim_all(&[a, b]).unwrap_err().to_string();
        assert!(e.contains("one tunnel has one address"), "{e}");
        let c = UdpSocket::bind("127.0.0.1:0").unwrap().into_raw_fd();
        assert!(claim_all(&[c, c]).unwrap_err().to_string().contains("twice"));
        assert!(claim_all(&[]).unwrap_err().to_string().contains("no descriptor"));
        let e = claim_all(&[c, 1_000_000]).unwrap_err().to_string();
        assert!(e.contains("no such open descriptor: 1000000"), "{e}");
        // Refused before any was claimed: `c` is still open and unclaimed.
        assert!(claim(c).is_ok());
    }

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
