//! What one 64 KiB message costs the tunnel, piece by piece, on this machine: the cipher (seal,
//! open), the copy that puts chunks back together, and the system calls with the kernel's
//! copies (a UDP GSO send of the message's chunks and their GRO receive, over loopback). Each
//! figure is nanoseconds per message and the share of one core that piece takes per Gbit/s of
//! pod traffic (a message carries 64 KiB; the TUN read and write cost about what the UDP send
//! and receive do: one copy and one system call each).
//!
//! `cargo bench -p hpk-net-forwarder --bench pieces`; HPK_BENCH_MESSAGES (default 20,000) per
//! figure, the best of 3 runs. No root; the sockets are on 127.0.0.1.

use std::hint::black_box;
use std::net::{SocketAddr, SocketAddrV4, UdpSocket};
use std::sync::Arc;
use std::time::Instant;

use hpk_net_forwarder::tunnel::chunks::{self, Cutter};
use hpk_net_forwarder::tunnel::identity::Identity;
use hpk_net_forwarder::tunnel::udp::{Receiver, Sender};
use hpk_net_forwarder::tunnel::wire::{self, HEADER_LEN, Header, Sealer, TAG_LEN};

const PAYLOAD: usize = 65_536;

fn main() -> anyhow::Result<()> {
    let messages: usize =
        std::env::var("HPK_BENCH_MESSAGES").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000);
    let best = |f: &mut dyn FnMut()| {
        (0..3)
            .map(|_| {
                let start = Instant::now();
                for _ in 0..messages {
                    f();
                }
                start.elapsed().as_nanos() as f64 / messages as f64
            })
            .fold(f64::INFINITY, f64::min)
    };
    let (a, b) = (Identity::from_secret([7; 32]), Identity::from_secret([9; 32]));
    let (ab, ba) = (a.pair(&b.public())?, b.pair(&a.public())?);
    let sealer = Sealer::new(a.public().key_id(), 0);
    let mut buf = vec![0x42u8; HEADER_LEN + PAYLOAD + TAG_LEN];
    let seal = best(&mut || {
        black_box(sealer.seal(&ab.seal, &mut buf, PAYLOAD).expect("seal"));
    });
    // Opening needs a fresh sealed message each time: seal one, copy it back before each open
    // (the copy is measured on its own below and subtracted).
    let sealed = buf.clone();
    let mut work = sealed.clone();
    let copy_and_open = best(&mut || {
        work.copy_from_slice(&sealed);
        let header = Header::parse(&work).expect("header");
        black_box(wire::open(&ba.open, header, &mut work).expect("open"));
    });
    let mut target = vec![0u8; PAYLOAD];
    let copy = best(&mut || {
        target.copy_from_slice(black_box(&sealed[HEADER_LEN..HEADER_LEN + PAYLOAD]));
        black_box(&target);
    });
    let open = copy_and_open - copy * (sealed.len() as f64 / PAYLOAD as f64);

    // The message as chunks: one GSO send, one GRO receive (or several where the kernel splits).
    let rx = UdpSocket::bind("127.0.0.1:0")?;
    let tx = UdpSocket::bind("127.0.0.1:0")?;
    let to = match rx.local_addr()? {
        SocketAddr::V4(v4) => v4,
        other => anyhow::bail!("bound to {other}"),
    };
    let offloads_tx = hpk_net_forwarder::inherit::udp_offloads(&tx);
    let offloads_rx = hpk_net_forwarder::inherit::udp_offloads(&rx);
    for s in [&rx, &tx] {
        nix::sys::socket::setsockopt(s, nix::sys::socket::sockopt::RcvBuf, &(8 << 20))?;
    }
    let cutter = Cutter::new(1500).expect("MTU");
    let mut sender = Sender::new(Arc::new(tx), cutter, offloads_tx.gso);
    let mut receiver = Receiver::new(Arc::new(rx));
    let mut datagrams = vec![0u8; 65_536];
    let expect = cutter.count(sealed.len()) * chunks::CHUNK_HEADER_LEN + sealed.len();
    let mut id = 0u32;
    let syscalls = best(&mut || {
        id = id.wrapping_add(1);
        sender.send(&sealed, id, SocketAddrV4::new(*to.ip(), to.port())).expect("send");
        let mut got = 0;
        while got < expect {
            got += receiver.recv(&mut datagrams).expect("receive").len;
        }
    });
    let per_gbit = |ns: f64| ns / (PAYLOAD as f64 * 8.0) * 100.0;
    println!(
        "64 KiB messages, {messages} per figure (best of 3); UDP GSO {}, GRO {}; {} chunks of {} bytes",
        offloads_tx.gso,
        offloads_rx.gso && offloads_rx.gro,
        cutter.count(sealed.len()),
        cutter.segment()
    );
    println!("| piece | ns per message | GB/s | % of a core per Gbit/s |\n|---|---|---|---|");
    let row = |name: &str, ns: f64| {
        println!("| {name} | {ns:.0} | {:.2} | {:.2} |", PAYLOAD as f64 / ns, per_gbit(ns));
    };
    row("seal (AES-256-GCM, ring)", seal);
    row("open (AES-256-GCM, ring)", open);
    row("copy (reassembly, memcpy)", copy);
    row("UDP GSO send + GRO receive (2+ system calls, 2 kernel copies)", syscalls);
    let relay = seal + open + copy + 2.0 * syscalls;
    row("sum for both relays (the TUN read and write counted as one more send + receive)", relay);
    Ok(())
}
