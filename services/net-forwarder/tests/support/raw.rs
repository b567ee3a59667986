//! Raw IPv4 sockets for the attack tests: one that sees every UDP datagram a test host takes in
//! (to capture a genuine tunnel datagram), one that sends UDP from any source address and port
//! (to replay or forge it as if from anywhere, the genuine sender included).

use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use nix::sys::socket::{
    AddressFamily, MsgFlags, SockFlag, SockProtocol, SockType, SockaddrIn, recv, sendto, setsockopt, socket,
    sockopt,
};
use nix::sys::time::TimeVal;

/// A UDP datagram as seen on the wire.
#[derive(Clone, Debug)]
pub struct Datagram {
    pub from: SocketAddrV4,
    pub to: SocketAddrV4,
    pub payload: Vec<u8>,
}

/// A socket that receives a copy of every UDP datagram for the namespace it was made in.
pub struct Sniffer(OwnedFd);

impl Sniffer {
    /// Must be called on a thread in the namespace to watch (see `in_netns`).
    pub fn new() -> Sniffer {
        let fd = socket(AddressFamily::Inet, SockType::Raw, SockFlag::SOCK_CLOEXEC, SockProtocol::Udp)
            .expect("raw UDP socket (needs CAP_NET_RAW)");
        setsockopt(&fd, sockopt::ReceiveTimeout, &TimeVal::new(0, 100_000)).expect("SO_RCVTIMEO");
        Sniffer(fd)
    }

    /// The first datagram within `timeout` that `want` accepts.
    pub fn capture(&self, timeout: Duration, want: impl Fn(&Datagram) -> bool) -> Option<Datagram> {
        let deadline = Instant::now() + timeout;
        let mut buf = vec![0u8; 65_536];
        while Instant::now() < deadline {
            let Ok(n) = recv(self.0.as_raw_fd(), &mut buf, MsgFlags::empty()) else { continue };
            if let Some(d) = parse(&buf[..n]).filter(|d| want(d)) {
                return Some(d);
            }
        }
        None
    }
}

fn parse(ip: &[u8]) -> Option<Datagram> {
    let ihl = (*ip.first()? & 0x0f) as usize * 4;
    if ip[0] >> 4 != 4 || ip.len() < ihl + 8 || ip[9] != 17 {
        return None;
    }
    let addr = |at: usize| Ipv4Addr::new(ip[at], ip[at + 1], ip[at + 2], ip[at + 3]);
    let port = |at: usize| u16::from_be_bytes([ip[at], ip[at + 1]]);
    let udp_len = port(ihl + 4) as usize;
    let payload = ip.get(ihl + 8..ihl + udp_len)?.to_vec();
    Some(Datagram {
        from: SocketAddrV4::new(addr(12), port(ihl)),
        to: SocketAddrV4::new(addr(16), port(ihl + 2)),
        payload,
    })
}

/// A socket that sends whole IPv4 packets, source address included.
pub struct Spoofer(OwnedFd);

impl Spoofer {
    /// Must be called on a thread in the namespace to send from.
    pub fn new() -> Spoofer {
        let fd = socket(AddressFamily::Inet, SockType::Raw, SockFlag::SOCK_CLOEXEC, SockProtocol::Raw)
            .expect("raw IP socket (needs CAP_NET_RAW)");
        Spoofer(fd)
    }

    /// Sends `payload` in a UDP datagram `from` → `to` (the kernel fills in the IP checksum).
    pub fn send(&self, from: SocketAddrV4, to: SocketAddrV4, payload: &[u8]) {
        let packet = udp_packet(from, to, payload);
        let dest = SockaddrIn::from(SocketAddrV4::new(*to.ip(), 0));
        sendto(self.0.as_raw_fd(), &packet, &dest, MsgFlags::empty()).expect("send a raw packet");
    }
}

/// An IPv4 packet (header checksum computed) carrying a UDP datagram without checksum.
pub fn udp_packet(from: SocketAddrV4, to: SocketAddrV4, payload: &[u8]) -> Vec<u8> {
    let total = 28 + payload.len();
    let mut p = vec![0u8; total];
    p[0] = 0x45;
    p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    p[6] = 0x40; // don't fragment
    p[8] = 64;
    p[9] = 17;
    p[12..16].copy_from_slice(&from.ip().octets());
    p[16..20].copy_from_slice(&to.ip().octets());
    let sum = checksum(&p[..20]);
    p[10..12].copy_from_slice(&sum.to_be_bytes());
    p[20..22].copy_from_slice(&from.port().to_be_bytes());
    p[22..24].copy_from_slice(&to.port().to_be_bytes());
    p[24..26].copy_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    p[28..].copy_from_slice(payload);
    p
}

fn checksum(header: &[u8]) -> u16 {
    let mut sum: u32 = header.chunks(2).map(|w| u32::from(u16::from_be_bytes([w[0], w[1]]))).sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}
