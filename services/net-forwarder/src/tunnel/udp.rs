//! The tunnel socket's side of the relays: a message goes out as chunks in as few sends as UDP
//! GSO allows, and datagrams come in as UDP GRO coalesced them.

use std::io::{IoSlice, IoSliceMut};
use std::net::{SocketAddr, SocketAddrV4, UdpSocket};
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use nix::errno::Errno;
use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, SockaddrIn, recvmsg, sendmsg};
use tracing::warn;

use super::chunks::{CHUNK_HEADER_LEN, Cutter};

/// Sends sealed messages as chunks.
pub struct Sender {
    socket: Arc<UdpSocket>,
    cutter: Cutter,
    gso: bool,
    headers: Vec<[u8; CHUNK_HEADER_LEN]>,
}

impl Sender {
    /// Chunks cut by `cutter`, sent with UDP GSO if `gso`.
    pub fn new(socket: Arc<UdpSocket>, cutter: Cutter, gso: bool) -> Self {
        Sender { socket, cutter, gso, headers: Vec::with_capacity(256) }
    }

    /// Sends `message`, whose id is `id`, to `to`: with GSO up to [`Cutter::per_send`] chunks
    /// per `sendmsg`, else one per `sendmsg`. Should the kernel refuse GSO at send time (a
    /// segment above the route's MTU: EMSGSIZE, or EINVAL before Linux 6.x; IPsec on the route:
    /// EIO), this and every later message go out chunk by chunk, and that is logged once.
    pub fn send(&mut self, message: &[u8], id: u32, to: SocketAddrV4) -> nix::Result<()> {
        let count = self.cutter.count(message.len());
        self.headers.clear();
        let cutter = self.cutter;
        self.headers.extend((0..count).map(|i| cutter.header(id, i, count)));
        let to = SockaddrIn::from(to);
        let mut first = 0;
        while first < count {
            let per_send = if self.gso { self.cutter.per_send() } else { 1 };
            let end = (first + per_send).min(count);
            match self.send_chunks(message, first..end, &to) {
                Ok(()) => first = end,
                Err(e @ (Errno::EINVAL | Errno::EIO | Errno::EMSGSIZE)) if end - first > 1 => {
                    warn!(
                        error = %e,
                        segment = self.cutter.segment(),
                        "the kernel refused a UDP GSO send (is --tunnel-mtu above the link's MTU?); \
                         the tunnel sends its chunks one by one from now on"
                    );
                    self.gso = false;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn send_chunks(&self, message: &[u8], chunks: Range<usize>, to: &SockaddrIn) -> nix::Result<()> {
        let mut iov = Vec::with_capacity(2 * chunks.len());
        for i in chunks.clone() {
            iov.push(IoSlice::new(&self.headers[i]));
            iov.push(IoSlice::new(self.cutter.piece(message, i)));
        }
        // The cutter keeps a segment within a link MTU, so below 65536.
        let segment = self.cutter.segment() as u16;
        let gso = [ControlMessage::UdpGsoSegments(&segment)];
        let cmsgs: &[ControlMessage] = if chunks.len() > 1 { &gso } else { &[] };
        loop {
            match sendmsg(self.socket.as_raw_fd(), &iov, cmsgs, MsgFlags::empty(), Some(to)) {
                Err(Errno::EINTR) => continue,
                r => return r.map(drop),
            }
        }
    }
}

/// Receives datagrams, coalesced by UDP GRO where the kernel does.
pub struct Receiver {
    socket: Arc<UdpSocket>,
    cmsg: Vec<u8>,
}

/// What one receive returned.
pub struct Received {
    /// Bytes received: one datagram, or several of `segment` bytes each (the last maybe fewer).
    pub len: usize,
    /// The sender.
    pub from: SocketAddr,
    /// Bytes of each datagram but the last.
    pub segment: usize,
}

impl Receiver {
    /// Receives from `socket` (UDP GRO turned on or not).
    pub fn new(socket: Arc<UdpSocket>) -> Self {
        Receiver { socket, cmsg: nix::cmsg_space!(i32) }
    }

    /// Receives into `buf`, which must hold the largest datagram (65507 bytes).
    pub fn recv(&mut self, buf: &mut [u8]) -> nix::Result<Received> {
        let mut iov = [IoSliceMut::new(buf)];
        let r = recvmsg::<SockaddrIn>(
            self.socket.as_raw_fd(),
            &mut iov,
            Some(&mut self.cmsg),
            MsgFlags::empty(),
        )?;
        let gro = r.cmsgs().ok().and_then(|mut cmsgs| {
            cmsgs.find_map(|c| match c {
                ControlMessageOwned::UdpGroSegments(size) => usize::try_from(size).ok(),
                _ => None,
            })
        });
        let from = r.address.ok_or(Errno::EAFNOSUPPORT)?;
        Ok(Received {
            len: r.bytes,
            from: SocketAddr::V4(SocketAddrV4::new(from.ip(), from.port())),
            segment: gro.filter(|&s| s > 0).unwrap_or(r.bytes).max(1),
        })
    }
}
