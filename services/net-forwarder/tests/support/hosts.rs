//! Test hosts for the tunnel: network namespaces joined by a veth pair (the "cluster network"),
//! a bubble in each (as the bubble launcher makes them), slirp4netns for the bubble's egress,
//! and the net-forwarder started through `tunnel-socket`, so its UDP socket is the host's.
//!
//! Rootless as in production: the bubble, slirp4netns, `tunnel-socket` and the net-forwarder
//! run as an unprivileged user ([`UNPRIVILEGED`]); only the test itself is root (to make the
//! test hosts and to look into the namespaces from outside).

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use super::{Bubble, Server, spawn, stop, wait_ready};

static NEXT: AtomicU32 = AtomicU32::new(0);

/// The user the bubbles run as: nobody.
pub const UNPRIVILEGED: u32 = 65534;

/// `setpriv` arguments that drop to [`UNPRIVILEGED`] before exec'ing the rest.
pub fn as_unprivileged() -> Vec<String> {
    let id = UNPRIVILEGED.to_string();
    ["setpriv", "--reuid", &id, "--regid", &id, "--clear-groups", "--"].map(String::from).to_vec()
}

/// slirp4netns is needed on top of what every bubble test needs; `false` after printing why
/// (a panic with HPK_REQUIRE_TOOLS=1).
pub fn slirp_available() -> bool {
    if Path::new("/usr/bin/slirp4netns").exists() {
        return true;
    }
    let why = "slirp4netns is not installed (scripts/setup.sh installs it)";
    hpk_test_support::skip(why);
    false
}

/// Fails unless process `pid` runs as [`UNPRIVILEGED`] (as the host sees it).
pub fn assert_unprivileged(pid: u32) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let uid = status.lines().find(|l| l.starts_with("Uid:")).unwrap_or_default();
    let uids: Vec<&str> = uid.split_whitespace().skip(1).collect();
    assert!(uids.iter().all(|u| *u == UNPRIVILEGED.to_string()), "process {pid} is not unprivileged: {uid}");
}

/// Hands `path` to [`UNPRIVILEGED`] (a file the bubble must read or a directory it writes).
pub fn give_away(path: &Path) {
    let id = Some(nix::unistd::Uid::from_raw(UNPRIVILEGED));
    nix::unistd::chown(path, id, Some(nix::unistd::Gid::from_raw(UNPRIVILEGED))).expect("chown");
}

/// Rootless TUN devices need /dev/net/tun to be 0666 (Debian's default; set-up ensures it).
pub fn open_up_dev_net_tun() {
    use std::os::unix::fs::PermissionsExt;
    let tun = Path::new("/dev/net/tun");
    let mode = std::fs::metadata(tun).expect("/dev/net/tun").permissions().mode() & 0o777;
    if mode & 0o666 != 0o666 {
        std::fs::set_permissions(tun, std::fs::Permissions::from_mode(0o666))
            .expect("chmod 0666 /dev/net/tun");
    }
}

/// Two test hosts on one link, 10.253.N.1 and 10.253.N.2 (N unique per test in the process).
pub struct Hosts {
    names: [String; 2],
    subnet: u32,
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
}

fn ip(args: &[&str]) {
    run(Command::new("ip").args(args));
}

impl Hosts {
    pub fn pair() -> Self {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let subnet = (std::process::id() + n) % 200 + 20;
        let base = format!("hpknf{}x{n}", std::process::id());
        let names = [format!("{base}a"), format!("{base}b")];
        let hosts = Hosts { names, subnet };
        let (va, vb) = (format!("nf{}x{n}a", std::process::id()), format!("nf{}x{n}b", std::process::id()));
        for name in &hosts.names {
            ip(&["netns", "add", name]);
        }
        ip(&["link", "add", &va, "type", "veth", "peer", "name", &vb]);
        for (i, (name, dev)) in hosts.names.iter().zip([&va, &vb]).enumerate() {
            ip(&["link", "set", dev, "netns", name]);
            ip(&["-n", name, "addr", "add", &format!("{}/24", hosts.addr(i)), "dev", dev]);
            ip(&["-n", name, "link", "set", dev, "up"]);
            ip(&["-n", name, "link", "set", "lo", "up"]);
        }
        hosts
    }

    /// The host's address on the link.
    pub fn addr(&self, i: usize) -> Ipv4Addr {
        Ipv4Addr::new(10, 253, self.subnet as u8, i as u8 + 1)
    }

    pub fn netns(&self, i: usize) -> String {
        format!("/run/netns/{}", self.names[i])
    }

    /// A UDP port free on host `i` (nothing else runs in a test host's namespace).
    pub fn free_udp_port(&self, i: usize) -> u16 {
        let addr = self.addr(i);
        super::in_netns(&self.netns(i), move || {
            UdpSocket::bind((addr, 0)).expect("bind").local_addr().expect("addr").port()
        })
    }

    /// A rootless bubble whose namespaces are nested in host `i`'s network namespace.
    pub fn bubble(&self, i: usize) -> Bubble {
        bubble_in(&self.netns(i))
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        // The veth pair goes with the namespaces.
        for name in &self.names {
            let _ = Command::new("ip").args(["netns", "del", name]).status();
        }
    }
}

/// slirp4netns giving a bubble its egress, run from the host's namespace.
pub struct Slirp {
    child: Child,
}

impl Slirp {
    pub fn start(hosts: &Hosts, host: usize, bubble: &Bubble) -> Slirp {
        Slirp::start_in(&hosts.netns(host), bubble)
    }
}

impl Drop for Slirp {
    fn drop(&mut self) {
        stop(&mut self.child);
    }
}

/// A rootless bubble (run as [`UNPRIVILEGED`], its directory handed over) whose namespaces are
/// nested in the network namespace at `netns` (a path, e.g. a harness test host's
/// `/run/netns/<name>`).
pub fn bubble_in(netns: &str) -> Bubble {
    open_up_dev_net_tun();
    let bubble = Bubble::create_with(
        Command::new("nsenter")
            .arg(format!("--net={netns}"))
            .arg("--")
            .args(as_unprivileged())
            .arg("unshare")
            .args(super::HOLDER),
    );
    give_away(bubble.dir.path());
    assert_unprivileged(bubble.pid());
    bubble
}

impl Slirp {
    /// slirp4netns for `bubble`, run in the network namespace at `netns`: the bubble's
    /// connections leave from that namespace. Returns once the bubble has its default route.
    pub fn start_in(netns: &str, bubble: &Bubble) -> Slirp {
        let child = spawn(
            Command::new("nsenter")
                .arg(format!("--net={netns}"))
                .arg("--")
                .args(as_unprivileged())
                .args(["slirp4netns", "--configure", "--mtu=65520", "--disable-host-loopback"])
                .arg(bubble.pid().to_string())
                .arg("tap0")
                .stdout(Stdio::null()),
        );
        let slirp = Slirp { child };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !bubble.routes().iter().any(|r| r.starts_with("default via 10.0.2.2 dev tap0")) {
            assert!(Instant::now() < deadline, "slirp4netns did not configure tap0: {:?}", bubble.routes());
            std::thread::sleep(Duration::from_millis(20));
        }
        slirp
    }
}

/// How to start a net-forwarder with a tunnel.
pub struct TunnelServe<'a> {
    pub hosts: &'a Hosts,
    pub host: usize,
    pub pod_cidr: &'a str,
    pub port: u16,
    /// This node's private key file (`--tunnel-private-key-file`): its public key is in the
    /// other nodes' `--peer` flags.
    pub key: &'a Path,
    pub peers: Vec<String>,
    pub metrics: Option<&'a str>,
    /// `tunnel-socket --queues` and `serve --tunnel-queues`: by default one per CPU.
    pub queues: Option<u32>,
}

impl TunnelServe<'_> {
    pub fn endpoint(&self) -> SocketAddrV4 {
        SocketAddrV4::new(self.hosts.addr(self.host), self.port)
    }
}

impl Bubble {
    /// `hpk-net-forwarder tunnel-socket` in the host's namespace, exec'ing `nsenter` into the
    /// bubble, exec'ing `serve` with the socket inherited: as the bubble launcher will.
    pub async fn serve_tunnel(&self, t: &TunnelServe<'_>) -> Server {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net={}", t.hosts.netns(t.host)))
            .arg("--")
            .args(as_unprivileged())
            .arg(env!("CARGO_BIN_EXE_hpk-net-forwarder"))
            .args(["tunnel-socket", "--bind", &t.endpoint().to_string()]);
        if let Some(q) = t.queues {
            cmd.arg(format!("--queues={q}"));
        }
        cmd.arg("--")
            .arg("nsenter")
            .arg(format!("--target={}", self.pid()))
            .args(["--user", "--net", "--mount", "--preserve-credentials", "--"])
            .arg(env!("CARGO_BIN_EXE_hpk-net-forwarder"))
            .args(self.serve_args(t.pod_cidr))
            .arg("--tunnel-private-key-file")
            .arg(t.key);
        if let Some(q) = t.queues {
            cmd.arg(format!("--tunnel-queues={q}"));
        }
        for peer in &t.peers {
            cmd.args(["--peer", peer]);
        }
        if let Some(m) = t.metrics {
            cmd.args(["--metrics-address", m]);
        }
        let child = spawn(&mut cmd);
        let mut server = Server { child, client: None };
        server.client = Some(wait_ready(&self.socket(), &mut server.child).await);
        server
    }

    /// Counters of an interface in the bubble, from its /proc/net/dev: (rx bytes, tx bytes).
    pub fn interface_bytes(&self, name: &str) -> (u64, u64) {
        interface_bytes(&PathBuf::from(format!("/proc/{}/net/dev", self.pid())), name)
    }
}

/// (rx bytes, tx bytes) of `name` in a /proc/<pid>/net/dev.
pub fn interface_bytes(dev: &Path, name: &str) -> (u64, u64) {
    let text = std::fs::read_to_string(dev).expect("net/dev");
    let line = text
        .lines()
        .find_map(|l| l.split_once(':').filter(|(n, _)| n.trim() == name).map(|(_, rest)| rest.to_owned()))
        .unwrap_or_else(|| panic!("no {name} in {}", dev.display()));
    let f: Vec<u64> = line.split_whitespace().map(|v| v.parse().expect("counter")).collect();
    (f[0], f[8])
}

/// A private key file `name` in `dir` made by `hpk-net-forwarder tunnel-private-key`, and the
/// public key it printed.
pub fn gen_key(dir: &Path, name: &str) -> (PathBuf, String) {
    let path = dir.join(name);
    let out =
        Command::new(env!("CARGO_BIN_EXE_hpk-net-forwarder")).arg("tunnel-private-key").arg(&path).output();
    public_key_of(path, out)
}

/// [`gen_key`] run as the unprivileged user (who must own the file); `dir` is handed to that user.
pub fn gen_unprivileged_key(dir: &Path, name: &str) -> (PathBuf, String) {
    give_away(dir);
    let path = dir.join(name);
    let out = Command::new(as_unprivileged()[0].clone())
        .args(&as_unprivileged()[1..])
        .arg(env!("CARGO_BIN_EXE_hpk-net-forwarder"))
        .arg("tunnel-private-key")
        .arg(&path)
        .output();
    public_key_of(path, out)
}

fn public_key_of(path: PathBuf, out: std::io::Result<std::process::Output>) -> (PathBuf, String) {
    let out = out.expect("run tunnel-private-key");
    assert!(out.status.success(), "tunnel-private-key: {}", String::from_utf8_lossy(&out.stderr));
    let key = String::from_utf8(out.stdout).expect("utf-8").trim().to_owned();
    assert_eq!(key.len(), 64, "a public key: {key:?}");
    (path, key)
}
