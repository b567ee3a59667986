//! Ports published on the host while a bubble runs: a pod's `hostPort`, a Service's
//! `nodePort` and a LoadBalancer's port.
//!
//! The launcher and the bubble's supervisor share a `SOCK_SEQPACKET` pair: the bubble's end is
//! inherited as descriptor [`FD_NAME`]. The supervisor asks for a port (`tcp 30080`); the
//! launcher, in the host's network namespace, binds it on the node's address and hands the
//! listening socket back (`SCM_RIGHTS`), keeping no copy; `udp 30053` gets a bound UDP socket
//! the same way. The port is published for as long as
//! the bubble holds that socket and free again once it closes it; the launcher holds no state,
//! so a bubble that ends frees every port it had. The bubble relays each accepted connection
//! with the same bounds as its own ports (`init::relay`).
//!
//! The protocol is one datagram each way, bounded: a request is `tcp PORT` or `udp PORT`; the
//! answer `ok PROTO PORT` with the socket, or `error PROTO PORT REASON`. Anything else gets an
//! `error` answer and changes nothing.

use std::net::{Ipv4Addr, SocketAddr, TcpListener, UdpSocket};
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Duration;

use nix::sys::socket::{
    AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag, SockType, recvmsg, sendmsg,
    socketpair,
};

use crate::error::{Error, Result};

/// The inherited descriptor's name in `HPK_FDS`.
pub const FD_NAME: &str = "host-ports";
/// The largest request or answer.
const MAX_MESSAGE: usize = 256;
/// How long the bubble waits for an answer.
const ANSWER_BOUND: Duration = Duration::from_secs(5);

/// A socket pair: the launcher's end (non-blocking) and the bubble's.
pub fn pair() -> Result<(OwnedFd, OwnedFd)> {
    let (ours, theirs) = socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC)
        .map_err(|e| Error::io("create", "the host-ports socket pair", e.into()))?;
    set_nonblocking(&ours)?;
    Ok((ours, theirs))
}

fn set_nonblocking(fd: &OwnedFd) -> Result<()> {
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    let flags = fcntl(fd, FcntlArg::F_GETFL).map_err(|e| Error::io("configure", "a socket", e.into()))?;
    fcntl(fd, FcntlArg::F_SETFL(OFlag::from_bits_truncate(flags) | OFlag::O_NONBLOCK))
        .map_err(|e| Error::io("configure", "a socket", e.into()))?;
    Ok(())
}

/// A port's protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    /// A listening TCP socket.
    Tcp,
    /// A bound UDP socket.
    Udp,
}

impl Protocol {
    /// A Kubernetes port's `protocol` (TCP when unset); None for one not published (SCTP).
    pub fn from_kubernetes(protocol: Option<&str>) -> Option<Self> {
        match protocol.unwrap_or("TCP") {
            "TCP" => Some(Self::Tcp),
            "UDP" => Some(Self::Udp),
            _ => None,
        }
    }

    fn word(self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
            Self::Udp => "udp",
        }
    }
}

impl std::fmt::Display for Protocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Tcp => "TCP",
            Self::Udp => "UDP",
        })
    }
}

/// A socket the launcher handed over.
#[derive(Debug)]
pub enum Published {
    /// Listening.
    Tcp(TcpListener),
    /// Bound.
    Udp(UdpSocket),
}

/// A request: the protocol and port asked for.
pub fn parse_request(message: &[u8]) -> std::result::Result<(Protocol, u16), String> {
    let text = std::str::from_utf8(message).map_err(|_| "not UTF-8".to_owned())?;
    let mut words = text.split(' ');
    let protocol = match words.next() {
        Some("tcp") => Protocol::Tcp,
        Some("udp") => Protocol::Udp,
        _ => return Err(format!("unknown request {:?}", text.chars().take(32).collect::<String>())),
    };
    match (words.next(), words.next()) {
        (Some(port), None) => match port.parse::<u16>() {
            Ok(0) | Err(_) => {
                Err(format!("{:?} is not a port (1-65535)", port.chars().take(8).collect::<String>()))
            }
            Ok(p) => Ok((protocol, p)),
        },
        _ => Err(format!("unknown request {:?}", text.chars().take(32).collect::<String>())),
    }
}

/// The launcher's side: answers every request waiting on `sock` by binding the port on
/// `address`. Returns false once the bubble's end is closed (nothing more will come).
pub fn answer_pending(sock: &OwnedFd, address: Ipv4Addr) -> bool {
    loop {
        let mut buf = [0u8; MAX_MESSAGE];
        let received = nix::sys::socket::recv(sock.as_raw_fd(), &mut buf, MsgFlags::MSG_DONTWAIT);
        let n = match received {
            Ok(0) => return false,
            Ok(n) => n,
            Err(nix::errno::Errno::EAGAIN) => return true,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => {
                tracing::warn!(error = %e, "the host-ports socket failed: no more ports are published");
                return false;
            }
        };
        let (protocol, port) = match parse_request(&buf[..n]) {
            Ok(p) => p,
            Err(why) => {
                tracing::warn!(%why, "refused a host-ports request");
                let _ = send(sock, &format!("error - - {why}"), None);
                continue;
            }
        };
        let at = SocketAddr::from((address, port));
        let bound = match protocol {
            Protocol::Tcp => TcpListener::bind(at).map(OwnedFd::from),
            Protocol::Udp => UdpSocket::bind(at).map(OwnedFd::from),
        };
        let word = protocol.word();
        match bound {
            Ok(fd) => {
                tracing::info!(%address, port, %protocol, "published a port for the bubble");
                if let Err(e) = send(sock, &format!("ok {word} {port}"), Some(&fd)) {
                    tracing::warn!(port, %protocol, error = %e, "could not hand a published port to the bubble");
                }
                // Our copy closes here: the bubble's is the only one.
            }
            Err(e) => {
                tracing::info!(%address, port, %protocol, error = %e, "could not publish a port for the bubble");
                let _ = send(sock, &format!("error {word} {port} {e}"), None);
            }
        }
    }
}

fn send(sock: &OwnedFd, text: &str, fd: Option<&OwnedFd>) -> nix::Result<usize> {
    let iov = [std::io::IoSlice::new(text.as_bytes())];
    let fds = fd.map(|f| [f.as_raw_fd()]);
    let cmsgs: Vec<ControlMessage<'_>> =
        fds.as_ref().map(|f| ControlMessage::ScmRights(f)).into_iter().collect();
    sendmsg::<()>(sock.as_raw_fd(), &iov, &cmsgs, MsgFlags::MSG_NOSIGNAL, None)
}

/// The bubble's side: the inherited end of the pair. Blocking; one request at a time.
pub struct Client {
    sock: OwnedFd,
}

impl Client {
    /// Takes the inherited descriptor `fd`.
    pub fn new(sock: OwnedFd) -> Result<Self> {
        let timeout = nix::sys::time::TimeVal::new(ANSWER_BOUND.as_secs() as i64, 0);
        nix::sys::socket::setsockopt(&sock, nix::sys::socket::sockopt::ReceiveTimeout, &timeout)
            .map_err(|e| Error::io("configure", "the host-ports socket", e.into()))?;
        Ok(Self { sock })
    }

    /// Asks the launcher for `port` on the node's address: the listening (TCP) or bound (UDP)
    /// socket, or the launcher's reason (`Address already in use`, `Permission denied` below
    /// 1024, …).
    pub fn publish(&self, protocol: Protocol, port: u16) -> std::result::Result<Published, String> {
        send(&self.sock, &format!("{} {port}", protocol.word()), None)
            .map_err(|e| format!("the launcher is gone: {e}"))?;
        loop {
            let mut buf = [0u8; MAX_MESSAGE];
            let mut iov = [std::io::IoSliceMut::new(&mut buf)];
            let mut space = nix::cmsg_space!([std::os::fd::RawFd; 1]);
            let msg =
                recvmsg::<()>(self.sock.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC)
                    .map_err(|e| format!("no answer from the launcher: {e}"))?;
            let mut received: Option<OwnedFd> = None;
            for cmsg in msg.cmsgs().map_err(|e| format!("a bad answer: {e}"))? {
                if let ControlMessageOwned::ScmRights(fds) = cmsg {
                    for owned in crate::fds::own_received(&fds) {
                        received.get_or_insert(owned);
                    }
                }
            }
            let n = msg.bytes;
            if n == 0 {
                return Err("the launcher is gone".into());
            }
            let text = String::from_utf8_lossy(&buf[..n]).into_owned();
            match answer_for(&text, protocol, port) {
                // An answer to an earlier request this side gave up on: its socket closes here.
                None => continue,
                Some(Ok(())) => {
                    let fd = received.ok_or("the launcher sent no socket")?;
                    return Ok(match protocol {
                        Protocol::Tcp => Published::Tcp(TcpListener::from(fd)),
                        Protocol::Udp => Published::Udp(UdpSocket::from(fd)),
                    });
                }
                Some(Err(why)) => return Err(why),
            }
        }
    }
}

/// What an answer says about `protocol` `port`: None for an answer about another port.
fn answer_for(text: &str, protocol: Protocol, port: u16) -> Option<std::result::Result<(), String>> {
    let mut parts = text.splitn(4, ' ');
    let (verdict, word, answered, reason) = (parts.next()?, parts.next()?, parts.next()?, parts.next());
    if (answered != port.to_string() || word != protocol.word()) && answered != "-" {
        return None;
    }
    match verdict {
        "ok" => Some(Ok(())),
        _ => Some(Err(reason.unwrap_or("refused").to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_checked_before_anything_is_bound() {
        assert_eq!(parse_request(b"tcp 30080"), Ok((Protocol::Tcp, 30080)));
        assert_eq!(parse_request(b"udp 30053"), Ok((Protocol::Udp, 30053)));
        for bad in [&b"tcp 0"[..], b"tcp 70000", b"sctp 53", b"udp", b"tcp 1 2", b"", b"tcp -1", b"\xff\xfe"]
        {
            assert!(parse_request(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn a_port_is_bound_on_the_address_and_handed_over_and_freed_when_dropped() {
        let (ours, theirs) = pair().expect("pair");
        let client = Client::new(theirs).expect("client");
        let launcher = std::thread::spawn(move || {
            let mut poll =
                [nix::poll::PollFd::new(std::os::fd::AsFd::as_fd(&ours), nix::poll::PollFlags::POLLIN)];
            loop {
                let _ = nix::poll::poll(&mut poll, nix::poll::PollTimeout::from(1000u16));
                if !answer_pending(&ours, Ipv4Addr::LOCALHOST) {
                    return;
                }
            }
        });
        // A free port, found and released.
        let port = TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
        let Ok(Published::Tcp(listener)) = client.publish(Protocol::Tcp, port) else {
            panic!("not published")
        };
        assert_eq!(listener.local_addr().expect("addr"), SocketAddr::from((Ipv4Addr::LOCALHOST, port)));
        // It accepts: the socket is listening, not merely bound.
        let _conn = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
        listener.accept().expect("accept");
        // Asked again while held: the launcher's reason comes back, nothing is bound twice.
        let busy = client.publish(Protocol::Tcp, port).expect_err("in use");
        assert!(busy.contains("in use"), "{busy}");
        // Dropped by the bubble: the port is free (the launcher kept no copy).
        drop(listener);
        let again = client.publish(Protocol::Tcp, port).expect("free again");
        drop(again);
        // UDP: a bound socket on the address, which receives what is sent to it; the same
        // number over TCP is another port.
        let udp_port = UdpSocket::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
        let Ok(Published::Udp(udp)) = client.publish(Protocol::Udp, udp_port) else {
            panic!("not published")
        };
        assert_eq!(udp.local_addr().expect("addr"), SocketAddr::from((Ipv4Addr::LOCALHOST, udp_port)));
        let sender = UdpSocket::bind("127.0.0.1:0").expect("sender");
        sender.send_to(b"ping", ("127.0.0.1", udp_port)).expect("send");
        let mut buf = [0u8; 16];
        udp.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
        let (n, from) = udp.recv_from(&mut buf).expect("received");
        assert_eq!((&buf[..n], from), (&b"ping"[..], sender.local_addr().expect("addr")));
        let busy = client.publish(Protocol::Udp, udp_port).expect_err("in use");
        assert!(busy.contains("in use"), "{busy}");
        drop(udp);
        drop(client.publish(Protocol::Udp, udp_port).expect("free again"));
        drop(client);
        launcher.join().expect("the launcher's side ends when the bubble's end closes");
    }

    #[test]
    fn answers_match_their_port() {
        assert_eq!(answer_for("ok tcp 80", Protocol::Tcp, 80), Some(Ok(())));
        assert_eq!(answer_for("ok tcp 81", Protocol::Tcp, 80), None);
        assert_eq!(answer_for("ok tcp 80", Protocol::Udp, 80), None);
        assert_eq!(answer_for("ok udp 80", Protocol::Udp, 80), Some(Ok(())));
        assert_eq!(
            answer_for("error tcp 80 Address already in use (os error 98)", Protocol::Tcp, 80),
            Some(Err("Address already in use (os error 98)".into()))
        );
        assert_eq!(
            answer_for("error - - unknown request", Protocol::Udp, 80),
            Some(Err("unknown request".into()))
        );
    }
}
