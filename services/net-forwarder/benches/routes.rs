//! The tunnel's sending thread finds each packet's peer by its destination address. Side by
//! side in one run, for 10, 100 and 1,000 peers of a /24 each (the cluster's layout): the scan
//! it did before (the first peer whose pod CIDR holds the address) and `CidrIndex` (a hash
//! lookup per prefix length in use). Destinations are spread over every peer, in a fixed
//! pseudo-random order, so the scan's figure is its average, not its best case.
//!
//! `cargo bench -p hpk-net-forwarder --bench routes`; HPK_BENCH_LOOKUPS (default 2,000,000)
//! per figure. No root, no network.

use std::hint::black_box;
use std::net::Ipv4Addr;
use std::time::Instant;

use hpk_net_forwarder::cidr::{CidrIndex, PodCidr};

fn main() {
    let lookups: usize =
        std::env::var("HPK_BENCH_LOOKUPS").ok().and_then(|v| v.parse().ok()).unwrap_or(2_000_000);
    println!("peers  scan ns/lookup  index ns/lookup  (each over {lookups} lookups, the better of 3 runs)");
    for peers in [10u32, 100, 1000] {
        let networks: Vec<PodCidr> = (0..peers)
            .map(|i| format!("10.{}.{}.0/24", 244 + i / 256, i % 256).parse().expect("a /24"))
            .collect();
        let index = CidrIndex::new(&networks);
        // A fixed sequence of destinations, each in some peer's /24 (xorshift, so no RNG crate).
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let destinations: Vec<Ipv4Addr> = (0..4096)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let peer = (state % u64::from(peers)) as u32;
                Ipv4Addr::from(0x0af4_0000 + peer * 256 + 2 + (state >> 32) as u32 % 250)
            })
            .collect();
        for d in &destinations {
            assert_eq!(index.find(*d), networks.iter().position(|c| c.contains(*d)), "{d}");
        }
        let time = |f: &dyn Fn(Ipv4Addr) -> Option<usize>| {
            (0..3)
                .map(|_| {
                    let start = Instant::now();
                    let mut found = 0usize;
                    for i in 0..lookups {
                        found += black_box(f(black_box(destinations[i % destinations.len()]))).unwrap_or(0);
                    }
                    black_box(found);
                    start.elapsed().as_nanos() as f64 / lookups as f64
                })
                .fold(f64::MAX, f64::min)
        };
        let scan = time(&|d| networks.iter().position(|c| c.contains(d)));
        let indexed = time(&|d| index.find(d));
        println!("{peers:>5}  {scan:>14.1}  {indexed:>15.1}");
    }
}
