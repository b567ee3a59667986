//! Test hosts: network namespaces joined by a bridge on a private subnet of our own.
//!
//! The bridge lives in the root namespace with the subnet's `.1` address, so the test process
//! itself is a host on the network. No host has a default route and nothing forwards, so no
//! traffic leaves the subnet.

use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use tracing::{debug, warn};

use crate::{Error, Result};

/// Prefix of every name (namespaces, bridge, veths) the harness creates, for cleanup and checks.
pub const NAME_PREFIX: &str = "hpkt";

/// A network of test hosts. Dropping it removes the namespaces, veths and bridge.
#[derive(Debug)]
pub struct TestNetwork {
    id: String,
    bridge: String,
    subnet: [u8; 3],
    hosts: Vec<Host>,
    bridge_created: bool,
}

/// One test host: a network namespace with one interface on the test network.
#[derive(Clone, Debug)]
pub struct Host {
    /// The host's name (also its hostname for commands run through [`Host::command`]).
    pub name: String,
    /// The network namespace (under /run/netns).
    pub netns: String,
    /// The host's address on the test network.
    pub ip: Ipv4Addr,
}

impl Host {
    /// A command to run on this host: in its network namespace and a UTS namespace with its
    /// hostname. The command execs in place, so the child's PID is the program's.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args([
            "netns",
            "exec",
            &self.netns,
            "unshare",
            "--uts",
            "--",
            "sh",
            "-c",
            r#"hostname "$0" && exec "$@""#,
        ]);
        cmd.arg(&self.name).arg(program);
        cmd
    }
}

impl TestNetwork {
    /// Creates hosts named `names` on a fresh /24 under 10.250.0.0/16; host `i` gets `.10+i`.
    pub fn create(names: &[&str]) -> Result<Self> {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let id = format!("{:x}", (std::process::id() << 4 | n) & 0xffffff);
        let subnet = free_subnet(std::process::id().wrapping_add(n))?;
        let bridge = format!("{NAME_PREFIX}b{id}");
        let mut net = Self { id, bridge, subnet, hosts: Vec::new(), bridge_created: false };
        net.build(names)?;
        Ok(net)
    }

    fn build(&mut self, names: &[&str]) -> Result<()> {
        let gateway = format!("{}/24", self.gateway());
        ip(&["link", "add", &self.bridge, "type", "bridge"])?;
        self.bridge_created = true;
        ip(&["addr", "add", &gateway, "dev", &self.bridge])?;
        ip(&["link", "set", &self.bridge, "up"])?;
        for (i, name) in names.iter().enumerate() {
            let index = u8::try_from(10 + i).map_err(|_| Error::NoFreeSubnet)?;
            let netns = format!("{NAME_PREFIX}-{}-{name}", self.id);
            let veth = format!("{NAME_PREFIX}v{}{i}", self.id);
            let ip_addr = Ipv4Addr::new(self.subnet[0], self.subnet[1], self.subnet[2], index);
            ip(&["netns", "add", &netns])?;
            self.hosts.push(Host { name: (*name).to_owned(), netns: netns.clone(), ip: ip_addr });
            ip(&["link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &netns])?;
            ip(&["link", "set", &veth, "master", &self.bridge, "up"])?;
            ip(&["-n", &netns, "addr", "add", &format!("{ip_addr}/24"), "dev", "eth0"])?;
            ip(&["-n", &netns, "link", "set", "eth0", "up"])?;
            ip(&["-n", &netns, "link", "set", "lo", "up"])?;
            debug!(host = name, %ip_addr, netns, "test host up");
        }
        Ok(())
    }

    /// The bridge's address: the test process's own address on the network.
    pub fn gateway(&self) -> Ipv4Addr {
        Ipv4Addr::new(self.subnet[0], self.subnet[1], self.subnet[2], 1)
    }

    /// The host named `name`.
    pub fn host(&self, name: &str) -> Option<&Host> {
        self.hosts.iter().find(|h| h.name == name)
    }

    /// All hosts, in creation order.
    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    /// The bridge's name.
    pub fn bridge(&self) -> &str {
        &self.bridge
    }

    /// The network's identifier, part of every name it created.
    pub fn id(&self) -> &str {
        &self.id
    }
}

impl Drop for TestNetwork {
    fn drop(&mut self) {
        // Deleting a namespace destroys its end of the veth, which destroys the other end.
        for host in self.hosts.drain(..).rev() {
            if let Err(e) = ip(&["netns", "del", &host.netns]) {
                warn!(netns = host.netns, error = %e, "could not delete test namespace");
            }
        }
        if self.bridge_created
            && let Err(e) = ip(&["link", "del", &self.bridge])
        {
            warn!(bridge = self.bridge, error = %e, "could not delete test bridge");
        }
    }
}

/// Removes what crashed harness runs left (a test process killed with SIGKILL cannot run its
/// Drop): stops the processes inside `hpkt-*` namespaces and registries by PID, deletes those
/// namespaces, the harness's temporary directories and the `hpktb*` bridges. Only for when no
/// harness is running. Returns what it removed.
pub fn sweep() -> Result<Vec<String>> {
    let mut removed = Vec::new();
    for line in ip(&["netns", "list"])?.lines() {
        let Some(ns) = line.split_whitespace().next().filter(|n| n.starts_with(&format!("{NAME_PREFIX}-")))
        else {
            continue;
        };
        let mut pids: Vec<i32> =
            ip(&["netns", "pids", ns])?.split_whitespace().filter_map(|p| p.parse().ok()).collect();
        // Newest first, like an orderly teardown: the API server must not outlive etcd waiting.
        pids.sort_unstable_by(|a, b| b.cmp(a));
        for pid in pids {
            crate::process::stop_pid(pid);
            removed.push(format!("process {pid} in {ns}"));
        }
        ip(&["netns", "del", ns])?;
        removed.push(format!("namespace {ns}"));
    }
    // Registries on loopback live in no test namespace: find them by their config's path.
    let tmp = std::env::temp_dir();
    let registry_dirs = tmp.join("hpk-registry-").display().to_string();
    for entry in std::fs::read_dir("/proc").map_err(|e| Error::io("list", "/proc", e))?.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|p| p.parse::<i32>().ok()) else { continue };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(&registry_dirs) {
            crate::process::stop_pid(pid);
            removed.push(format!("registry process {pid}"));
        }
    }
    for entry in std::fs::read_dir(&tmp).map_err(|e| Error::io("list", tmp.display(), e))?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !(name.starts_with("hpk-testcluster-") || name.starts_with("hpk-registry-")) {
            continue;
        }
        // Directories of runs, and the pid file of a killed `up`.
        let path = entry.path();
        let result = if path.is_dir() { std::fs::remove_dir_all(&path) } else { std::fs::remove_file(&path) };
        result.map_err(|e| Error::io("remove", path.display(), e))?;
        removed.push(path.display().to_string());
    }
    for line in ip(&["-o", "link", "show", "type", "bridge"])?.lines() {
        let name = line.split(':').nth(1).map(str::trim).unwrap_or_default();
        if name.starts_with(&format!("{NAME_PREFIX}b")) {
            ip(&["link", "del", name])?;
            removed.push(format!("bridge {name}"));
        }
    }
    Ok(removed)
}

/// Picks a /24 in 10.250.0.0/16 that no interface of this machine uses, starting at `seed`.
fn free_subnet(seed: u32) -> Result<[u8; 3]> {
    let out = run(Command::new("ip").args(["-4", "-o", "addr", "show"]))?;
    for step in 0..256u32 {
        let octet = u8::try_from((seed.wrapping_add(step)) % 250 + 1).map_err(|_| Error::NoFreeSubnet)?;
        if !out.contains(&format!(" 10.250.{octet}.")) {
            return Ok([10, 250, octet]);
        }
    }
    Err(Error::NoFreeSubnet)
}

/// Runs `ip ARGS`.
pub fn ip(args: &[&str]) -> Result<String> {
    run(Command::new("ip").args(args))
}

/// Runs a command to completion; non-zero exit is an error carrying its stderr.
pub fn run(cmd: &mut Command) -> Result<String> {
    let shown = format!("{cmd:?}");
    let out = cmd.output().map_err(|e| Error::io("run", &shown, e))?;
    if !out.status.success() {
        return Err(Error::Command {
            command: shown,
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
