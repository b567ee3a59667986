//! Ports published on the host while a bubble runs: a pod's `hostPort`, a Service's
//! `nodePort` and a LoadBalancer's port.
//!
//! The launcher and the bubble's supervisor share a `SOCK_SEQPACKET` pair: the bubble's end is
//! inherited as descriptor [`FD_NAME`]. The supervisor asks for a port (`tcp 30080`); the
//! launcher, in the host's network namespace, binds it on the node's address and hands the
//! listening socket back (`SCM_RIGHTS`), keeping no copy. The port is published for as long as
//! the bubble holds that socket and free again once it closes it; the launcher holds no state,
//! so a bubble that ends frees every port it had. The bubble relays each accepted connection
//! with the same bounds as its own ports (`init::relay`).
//!
//! The protocol is one datagram each way, bounded: a request is `tcp PORT` (64 bytes at most);
//! the answer `ok tcp PORT` with the socket, or `error tcp PORT REASON`. Anything else gets an
//! `error` answer and changes nothing.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
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

/// A request: the port asked for (TCP only).
pub fn parse_request(message: &[u8]) -> std::result::Result<u16, String> {
    let text = std::str::from_utf8(message).map_err(|_| "not UTF-8".to_owned())?;
    let mut words = text.split(' ');
    match (words.next(), words.next(), words.next()) {
        (Some("tcp"), Some(port), None) => match port.parse::<u16>() {
            Ok(0) | Err(_) => Err(format!("{port:?} is not a port (1-65535)")),
            Ok(p) => Ok(p),
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
        let port = match parse_request(&buf[..n]) {
            Ok(p) => p,
            Err(why) => {
                tracing::warn!(%why, "refused a host-ports request");
                let _ = send(sock, &format!("error - - {why}"), None);
                continue;
            }
        };
        match TcpListener::bind(SocketAddr::from((address, port))) {
            Ok(listener) => {
                tracing::info!(%address, port, "published a port for the bubble");
                let fd: OwnedFd = listener.into();
                if let Err(e) = send(sock, &format!("ok tcp {port}"), Some(&fd)) {
                    tracing::warn!(port, error = %e, "could not hand a published port to the bubble");
                }
                // Our copy closes here: the bubble's is the only one.
            }
            Err(e) => {
                tracing::info!(%address, port, error = %e, "could not publish a port for the bubble");
                let _ = send(sock, &format!("error tcp {port} {e}"), None);
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

    /// Asks the launcher for TCP `port` on the node's address: the listening socket, or the
    /// launcher's reason (`Address already in use`, `Permission denied` below 1024, …).
    pub fn listen(&self, port: u16) -> std::result::Result<TcpListener, String> {
        send(&self.sock, &format!("tcp {port}"), None).map_err(|e| format!("the launcher is gone: {e}"))?;
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
            match answer_for(&text, port) {
                // An answer to an earlier request this side gave up on: its socket closes here.
                None => continue,
                Some(Ok(())) => {
                    let fd = received.ok_or("the launcher sent no socket")?;
                    return Ok(TcpListener::from(fd));
                }
                Some(Err(why)) => return Err(why),
            }
        }
    }
}

/// What an answer says about `port`: None for an answer about another port.
fn answer_for(text: &str, port: u16) -> Option<std::result::Result<(), String>> {
    let mut parts = text.splitn(4, ' ');
    let (verdict, _, answered, reason) = (parts.next()?, parts.next()?, parts.next()?, parts.next());
    if answered != port.to_string() && answered != "-" {
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
        assert_eq!(parse_request(b"tcp 30080"), Ok(30080));
        for bad in [&b"tcp 0"[..], b"tcp 70000", b"udp 53", b"tcp 1 2", b"", b"tcp -1", b"\xff\xfe"] {
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
        let listener = client.listen(port).expect("published");
        assert_eq!(listener.local_addr().expect("addr"), SocketAddr::from((Ipv4Addr::LOCALHOST, port)));
        // It accepts: the socket is listening, not merely bound.
        let _conn = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
        listener.accept().expect("accept");
        // Asked again while held: the launcher's reason comes back, nothing is bound twice.
        let busy = client.listen(port).expect_err("in use");
        assert!(busy.contains("in use"), "{busy}");
        // Dropped by the bubble: the port is free (the launcher kept no copy).
        drop(listener);
        let again = client.listen(port).expect("free again");
        drop(again);
        drop(client);
        launcher.join().expect("the launcher's side ends when the bubble's end closes");
    }

    #[test]
    fn answers_match_their_port() {
        assert_eq!(answer_for("ok tcp 80", 80), Some(Ok(())));
        assert_eq!(answer_for("ok tcp 81", 80), None);
        assert_eq!(
            answer_for("error tcp 80 Address already in use (os error 98)", 80),
            Some(Err("Address already in use (os error 98)".into()))
        );
        assert_eq!(answer_for("error - - unknown request", 80), Some(Err("unknown request".into())));
    }
}
