//! The pod network's throughput, round trips and relay CPU, each path next to its baseline in
//! the same run (issue 5):
//!
//! 1. baseline A: a bare veth pair between two fresh network namespaces (MTU 1500);
//! 2. pod → pod in one bubble through the release `hpk-net-forwarder` (two pods attached over
//!    its API); goal ≥ 90 % of 1;
//! 3. baseline B: host → host TCP on the test link (two namespaces, "test hosts", joined by a
//!    veth pair, MTU 1500);
//! 4. pod → pod across bubbles: on each test host a bubble running `serve` with the tunnel, its
//!    UDP sockets bound on the host by `tunnel-socket`, with its default queues (one per CPU);
//!    goal ≥ 60 % of 3, and at most 8 % of a core per Gbit/s;
//! 5. the same with one queue (`--tunnel-queues 1`, what the tunnel had before it had queues);
//! 6. the seed's cross-node path: a bubble on host 1 whose link is slirp4netns, to host 2;
//!    reported as a ratio to 4;
//! 7. baseline C: host → host TCP on a second test link of MTU 9000 (jumbo frames);
//! 8. pod → pod across bubbles over that link (`--tunnel-mtu 9000`); goal ≥ 80 % of 7.
//!
//! `HPK_BENCH_NET_FORWARDER=PATH` runs another build of the net-forwarder on paths 2, 4, 5 and
//! 8 (an older one fails path 5: it has no queues), to compare builds against the same
//! baselines.
//!
//! Throughput: one iperf3 TCP stream per round, rounds interleaved across the paths so that
//! load from elsewhere on the machine spreads over all of them. Round trips: `ping -i 0.01`.
//! Relay CPU: utime + stime of the relay processes (/proc/PID/stat) over each round. Whole
//! machine CPU: the busy time of all CPUs (/proc/stat: everything but idle and iowait) over the
//! same round, iperf3, both TCP stacks and the softirqs included, so that a path's row shows
//! how much of the machine it left unused.
//! Everything runs in namespaces of its own on 10.251.0.0/16; nothing leaves them.
//!
//! Run as root: `cargo bench -p hpk-net-forwarder --bench network`. Prints `SKIPPED: why` and
//! succeeds when that is impossible (fails instead with HPK_REQUIRE_TOOLS=1). HPK_BENCH_ROUNDS
//! (default 5), HPK_BENCH_SECONDS (per round, default 3) and HPK_BENCH_PINGS (default 200)
//! change the effort.

mod support;

use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::Path;
use std::process::{Command, ExitCode, Stdio};
use std::time::Instant;

use anyhow::{Context as _, Result};
use support::bubble::{self, Bubble, SlirpBubble, Tunnel};
use support::measure::{self, Rtt};
use support::ns::{End, Guard, Namespace, Netns, Own, output, veth};
use support::report::{Measured, Ratio, Row};

const MTU: u32 = 1500;
const IPERF_PORT: u16 = 5201;
const TUNNEL_PORT: u16 = 47001;
const HOST1: Ipv4Addr = Ipv4Addr::new(10, 251, 2, 1);
const HOST2: Ipv4Addr = Ipv4Addr::new(10, 251, 2, 2);
const JUMBO: u32 = 9000;
const HOST3: Ipv4Addr = Ipv4Addr::new(10, 251, 4, 1);
const HOST4: Ipv4Addr = Ipv4Addr::new(10, 251, 4, 2);

struct Settings {
    rounds: usize,
    seconds: u32,
    pings: usize,
}

fn main() -> ExitCode {
    if let Err(why) = prerequisites() {
        if std::env::var("HPK_REQUIRE_TOOLS").as_deref() == Ok("1") {
            eprintln!("network bench: prerequisite missing and HPK_REQUIRE_TOOLS=1: {why}");
            return ExitCode::FAILURE;
        }
        println!("SKIPPED: {why}");
        return ExitCode::SUCCESS;
    }
    let setting =
        |name: &str, default: usize| std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    let settings = Settings {
        rounds: setting("HPK_BENCH_ROUNDS", 5).max(1),
        seconds: u32::try_from(setting("HPK_BENCH_SECONDS", 3)).unwrap_or(3).max(1),
        pings: setting("HPK_BENCH_PINGS", 200).max(1),
    };
    match run(&settings) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("network bench failed: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn prerequisites() -> Result<(), String> {
    if !nix::unistd::geteuid().is_root() {
        return Err("the benchmark creates network namespaces and enters the pods': run as root".into());
    }
    for (tool, package) in [
        ("iperf3", "iperf3"),
        ("ping", "iputils-ping"),
        ("ip", "iproute2"),
        ("unshare", "util-linux"),
        ("nsenter", "util-linux"),
        ("setpriv", "util-linux"),
    ] {
        if !on_path(tool) {
            return Err(format!("{tool} is not installed (Debian package {package})"));
        }
    }
    let version =
        Command::new("ping").arg("-V").output().map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
    if !version.is_ok_and(|v| v.contains("iputils")) {
        return Err("ping is not iputils' ping (Debian package iputils-ping)".into());
    }
    let bubble =
        Command::new("unshare").args(["--user", "--map-root-user", "--net", "--mount", "true"]).status();
    if !bubble.is_ok_and(|s| s.success()) {
        return Err("cannot create user + network namespaces (unshare failed)".into());
    }
    Ok(())
}

fn on_path(tool: &str) -> bool {
    let found = Command::new("sh").args(["-c", &format!("command -v {tool}")]).stdout(Stdio::null()).status();
    found.is_ok_and(|s| s.success())
}

/// A path under measurement: where the client runs, the iperf3 server it talks to, the relays.
struct Probe<'a> {
    client: &'a dyn Netns,
    server: Ipv4Addr,
    port: u16,
    relays: Vec<u32>,
    _iperf3: Guard,
}

impl<'a> Probe<'a> {
    /// `port`: the iperf3 server's; paths 3 and 5 share host 2.
    fn new(
        client: &'a dyn Netns,
        server_ns: &dyn Netns,
        server: SocketAddrV4,
        relays: Vec<u32>,
    ) -> Result<Self> {
        let iperf3 = measure::iperf3_server(server_ns, *server.ip(), server.port())?;
        Ok(Probe { client, server: *server.ip(), port: server.port(), relays, _iperf3: iperf3 })
    }

    /// One iperf3 round: Gbit/s, the relays' CPU and the whole machine's, in % of a core.
    fn round(&self, seconds: u32, tick: f64) -> Result<(f64, f64, f64)> {
        let before = measure::cpu_ticks(&self.relays)?;
        let machine_before = measure::machine_busy_ticks()?;
        let start = Instant::now();
        let gbits = measure::iperf3(self.client, self.server, self.port, seconds)?;
        let elapsed = start.elapsed().as_secs_f64();
        let ticks = measure::cpu_ticks(&self.relays)? - before;
        let machine = measure::machine_busy_ticks()?.saturating_sub(machine_before);
        let share = |t: u64| t as f64 / tick / elapsed * 100.0;
        Ok((gbits, share(ticks), share(machine)))
    }

    fn ping(&self, count: usize) -> Result<Rtt, String> {
        measure::ping(self.client, self.server, count).map_err(|e| format!("{e:#}"))
    }
}

fn iperf3_at(addr: Ipv4Addr) -> SocketAddrV4 {
    SocketAddrV4::new(addr, IPERF_PORT)
}

/// Builds every path, measures them, prints the table; false when a path failed.
fn run(settings: &Settings) -> Result<bool> {
    let tick = measure::ticks_per_second()?;
    let started = output(Command::new("date").args(["-u", "+%Y-%m-%d %H:%M UTC"]))?;
    let load = std::fs::read_to_string("/proc/loadavg")?;

    // 1. Baseline A.
    let (a1, a2) = (Namespace::new(&Own)?, Namespace::new(&Own)?);
    let a = End { ns: &a1, name: "bench0", address: "10.251.1.1/24" };
    veth(&a, &End { ns: &a2, name: "bench1", address: "10.251.1.2/24" }, MTU)?;
    let veth_pair = Probe::new(&a1, &a2, iperf3_at(Ipv4Addr::new(10, 251, 1, 2)), vec![])?;

    // 2. Pod → pod in one bubble.
    let mut one = Bubble::start(&Own, "10.251.10.0/24", None).context("bubble of path 2")?;
    let (pod_a, _) = one.pod("bench-one-a")?;
    let (pod_b, pod_b_addr) = one.pod("bench-one-b")?;
    let one_bubble = Probe::new(&pod_a, &pod_b, iperf3_at(pod_b_addr), vec![one.pid()])?;

    // 3. The test hosts and their link.
    let (host1, host2) = (Namespace::new(&Own)?, Namespace::new(&Own)?);
    let h1 = End { ns: &host1, name: "link0", address: "10.251.2.1/24" };
    veth(&h1, &End { ns: &host2, name: "link1", address: "10.251.2.2/24" }, MTU)?;
    let host_link = Probe::new(&host1, &host2, iperf3_at(HOST2), vec![])?;

    // 4. Pod → pod across bubbles, one on each test host: the tunnel with its default queues
    // (one per CPU), and with one.
    let key_dir = tempfile::tempdir()?;
    let tunnel = bubble::has_tunnel();
    let start = |queues: Option<u32>, cidrs: [&'static str; 2], port: u16| {
        let link = Link { hosts: [&host1, &host2], addrs: [HOST1, HOST2], mtu: MTU };
        tunnel.then(|| Across::start(&link, key_dir.path(), queues, cidrs, port)).transpose()
    };
    let across = start(None, ["10.251.11.0/24", "10.251.12.0/24"], TUNNEL_PORT).context("path 4")?;
    let across_probe = across.as_ref().map(Across::probe).transpose()?;
    // Another build (HPK_BENCH_NET_FORWARDER) may have no queues to ask for.
    let other_build = std::env::var_os("HPK_BENCH_NET_FORWARDER").is_some();
    let one_queue = if other_build {
        None
    } else {
        start(Some(1), ["10.251.15.0/24", "10.251.16.0/24"], TUNNEL_PORT + 1).context("path 5")?
    };
    let one_queue_probe = one_queue.as_ref().map(Across::probe).transpose()?;

    // 5. Through slirp4netns from a bubble on host 1 to host 2.
    let slirp = if on_path("slirp4netns") {
        // slirp4netns answers the bubble's pings with ICMP datagram sockets, which the host's
        // namespace allows to no group by default. Without them the row says "no replies".
        let _ = host1.command("sysctl").args(["-qw", "net.ipv4.ping_group_range=0 2147483647"]).status();
        Some(SlirpBubble::start(&host1, "10.251.3.0/24").context("slirp bubble")?)
    } else {
        None
    };
    let slirp_probe = slirp
        .as_ref()
        .map(|s| Probe::new(s, &host2, SocketAddrV4::new(HOST2, IPERF_PORT + 1), vec![s.slirp_pid()]))
        .transpose()?;

    // 7. Baseline C: host → host TCP on a test link of MTU 9000 (jumbo frames).
    let (host3, host4) = (Namespace::new(&Own)?, Namespace::new(&Own)?);
    let h3 = End { ns: &host3, name: "jumbo0", address: "10.251.4.1/24" };
    veth(&h3, &End { ns: &host4, name: "jumbo1", address: "10.251.4.2/24" }, JUMBO)?;
    let jumbo_link = Probe::new(&host3, &host4, iperf3_at(HOST4), vec![])?;

    // 8. Pod → pod across bubbles over that link, the tunnel cutting 9000-byte datagrams.
    let link = Link { hosts: [&host3, &host4], addrs: [HOST3, HOST4], mtu: JUMBO };
    let cidrs = ["10.251.13.0/24", "10.251.14.0/24"];
    let jumbo = tunnel
        .then(|| Across::start(&link, key_dir.path(), None, cidrs, TUNNEL_PORT + 2))
        .transpose()
        .context("path 8")?;
    let jumbo_probe = jumbo.as_ref().map(Across::probe).transpose()?;

    let probes = [
        Some(&veth_pair),
        Some(&one_bubble),
        Some(&host_link),
        across_probe.as_ref(),
        one_queue_probe.as_ref(),
        slirp_probe.as_ref(),
        Some(&jumbo_link),
        jumbo_probe.as_ref(),
    ];
    let mut rows = rows(across.is_some(), one_queue.is_some(), slirp.is_some());
    measure_all(&probes, &mut rows, settings, tick);

    let ratios = [
        Ratio { path: 1, base: 0, goal: Some(0.9) },
        Ratio { path: 3, base: 2, goal: Some(0.6) },
        Ratio { path: 4, base: 2, goal: None },
        Ratio { path: 3, base: 5, goal: None },
        Ratio { path: 7, base: 6, goal: Some(0.8) },
    ];
    println!(
        "\nRun of {} ({} rounds of {} s, {} pings per path).",
        started.trim(),
        settings.rounds,
        settings.seconds,
        settings.pings
    );
    println!(
        "Load average at start: {}; at the end: {}",
        load.trim(),
        std::fs::read_to_string("/proc/loadavg")?.trim()
    );
    let cpus = std::fs::read_to_string("/proc/stat")?
        .lines()
        .filter(|l| l.starts_with("cpu") && !l.starts_with("cpu "))
        .count();
    println!("CPUs: {cpus}: the whole machine's CPU is at most {} % of a core.\n", cpus * 100);
    print!("{}", support::report::table(&rows, &ratios, settings.rounds));
    for (name, a) in [("path 4", &across), ("path 5", &one_queue), ("path 8", &jumbo)] {
        if let Some(a) = a {
            println!("\n{name}: {}", a.counters()?);
        }
    }
    Ok(rows
        .iter()
        .all(|r| r.result.is_ok() || r.result.as_ref().is_err_and(|e| e.starts_with("not available"))))
}

fn rows(tunnel: bool, one_queue: bool, slirp: bool) -> Vec<Row> {
    let available = |yes: bool, why: &str| {
        if yes { Ok(Measured::default()) } else { Err(format!("not available: {why}")) }
    };
    vec![
        Row {
            label: "baseline A: veth pair between two namespaces",
            relay: None,
            result: available(true, ""),
        },
        Row {
            label: "pod → pod, one bubble (hpk-net-forwarder, veth)",
            relay: Some("hpk-net-forwarder"),
            result: available(true, ""),
        },
        Row {
            label: "baseline B: host → host TCP on the test link (veth, MTU 1500)",
            relay: None,
            result: available(true, ""),
        },
        Row {
            label: "pod → pod across bubbles (hpk-net-forwarder tunnel over the test link, default queues)",
            relay: Some("2 × hpk-net-forwarder"),
            result: available(tunnel, "this hpk-net-forwarder has no `tunnel-socket`"),
        },
        Row {
            label: "pod → pod across bubbles, the tunnel with one queue (--tunnel-queues 1)",
            relay: Some("2 × hpk-net-forwarder"),
            result: available(one_queue, "another build (HPK_BENCH_NET_FORWARDER), maybe without queues"),
        },
        Row {
            label: "bubble on host 1 → host 2 through slirp4netns (the seed's cross-node path)",
            relay: Some("slirp4netns"),
            result: available(slirp, "slirp4netns is not installed"),
        },
        Row {
            label: "baseline C: host → host TCP on a test link of MTU 9000 (veth)",
            relay: None,
            result: available(true, ""),
        },
        Row {
            label: "pod → pod across bubbles over the MTU 9000 link (--tunnel-mtu 9000)",
            relay: Some("2 × hpk-net-forwarder"),
            result: available(tunnel, "this hpk-net-forwarder has no `tunnel-socket`"),
        },
    ]
}

/// Pings, then the iperf3 rounds, interleaved across the paths; a path that fails stops there
/// and shows why in its row.
fn measure_all(probes: &[Option<&Probe<'_>>], rows: &mut [Row], settings: &Settings, tick: f64) {
    for (probe, row) in probes.iter().zip(rows.iter_mut()) {
        if let (Some(p), Ok(m)) = (probe, &mut row.result) {
            m.rtt = Some(p.ping(settings.pings));
        }
    }
    for round in 1..=settings.rounds {
        for (i, (probe, row)) in probes.iter().zip(rows.iter_mut()).enumerate() {
            let (Some(p), Ok(m)) = (probe, &mut row.result) else { continue };
            match p.round(settings.seconds, tick) {
                Ok((gbits, cpu, machine)) => {
                    eprintln!(
                        "round {round}, path {}: {gbits:.2} Gbit/s, relay CPU {cpu:.1} %, machine CPU {machine:.0} %",
                        i + 1
                    );
                    m.gbits.push(gbits);
                    m.relay_cpu.push(cpu);
                    m.machine_cpu.push(machine);
                }
                Err(e) => row.result = Err(format!("failed in round {round}: {e:#}")),
            }
        }
    }
}

/// Two test hosts and the link between them.
struct Link<'a> {
    hosts: [&'a dyn Netns; 2],
    addrs: [Ipv4Addr; 2],
    mtu: u32,
}

/// Paths 4, 5 and 8: a bubble with the tunnel on each test host, a pod in each.
struct Across {
    bubbles: [Bubble; 2],
    pods: [bubble::Pod; 2],
    server: Ipv4Addr,
}

impl Across {
    fn start(
        link: &Link<'_>,
        key_dir: &Path,
        queues: Option<u32>,
        cidrs: [&str; 2],
        port: u16,
    ) -> Result<Self> {
        let keys = [key_dir.join(format!("{port}-1.key")), key_dir.join(format!("{port}-2.key"))];
        let public = [bubble::gen_key(&keys[0])?, bubble::gen_key(&keys[1])?];
        let endpoint = |host: Ipv4Addr| SocketAddrV4::new(host, port);
        let tunnel = |own: usize| Tunnel {
            bind: endpoint(link.addrs[own]),
            key: &keys[own],
            peers: vec![format!(
                "host{}={}@{}/{}",
                2 - own,
                cidrs[1 - own],
                endpoint(link.addrs[1 - own]),
                public[1 - own]
            )],
            queues,
            link_mtu: link.mtu,
        };
        let mut b1 = Bubble::start(link.hosts[0], cidrs[0], Some(tunnel(0))).context("bubble on host 1")?;
        let mut b2 = Bubble::start(link.hosts[1], cidrs[1], Some(tunnel(1))).context("bubble on host 2")?;
        let (pod1, _) = b1.pod("bench-across-a")?;
        let (pod2, server) = b2.pod("bench-across-b")?;
        Ok(Across { bubbles: [b1, b2], pods: [pod1, pod2], server })
    }

    fn probe(&self) -> Result<Probe<'_>> {
        let relays = self.bubbles.iter().map(Bubble::pid).collect();
        Probe::new(&self.pods[0], &self.pods[1], iperf3_at(self.server), relays)
    }

    /// The tunnel's counters on both sides, as the Stats RPC reports them.
    fn counters(&self) -> Result<String> {
        let mut text = String::from("Tunnel counters after the run (Stats RPC):");
        for (i, b) in self.bubbles.iter().enumerate() {
            let Some(t) = b.tunnel_stats()? else {
                text += &format!("\n- host {}: no tunnel in Stats", i + 1);
                continue;
            };
            text += &format!(
                "\n- host {}: tx {} packets / {} bytes ({:.0} bytes per packet), rx {} / {}; dropped: auth {}, \
                 replay {}, malformed {}, spoofed {}, no route {}, tx errors {}, rx errors {}",
                i + 1,
                t.tx_packets,
                t.tx_bytes,
                t.tx_bytes as f64 / t.tx_packets.max(1) as f64,
                t.rx_packets,
                t.rx_bytes,
                t.rx_dropped_auth,
                t.rx_dropped_replay,
                t.rx_dropped_malformed,
                t.rx_dropped_spoofed,
                t.tx_dropped_no_route,
                t.tx_dropped_error,
                t.rx_dropped_error
            );
        }
        Ok(text)
    }
}
