//! Bubbles (user + network + mount namespaces) as the benchmark makes them: one running the
//! release `hpk-net-forwarder serve` (with or without the tunnel), one with slirp4netns; and
//! pods, network namespaces nested in a bubble.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail};
use hpk_proto::netforwarder::v1 as pb;
use pb::net_forwarder_client::NetForwarderClient;
use tonic::transport::Channel;

use super::ns::{Guard, Netns, output, wait_until};

type Client = NetForwarderClient<Channel>;

/// The net-forwarder under test: this build's, or `HPK_BENCH_NET_FORWARDER` (another build's,
/// to compare with in the same run of the baselines).
pub fn bin() -> String {
    std::env::var("HPK_BENCH_NET_FORWARDER")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_hpk-net-forwarder").into())
}

/// Whether this build of the net-forwarder has the cross-node tunnel (`tunnel-socket`).
pub fn has_tunnel() -> bool {
    std::process::Command::new(bin())
        .args(["tunnel-socket", "--help"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// `hpk-net-forwarder tunnel-private-key PATH`: a new private key (mode 0600); returns the
/// public key it prints, for the other bubble's `--peer`.
pub fn gen_key(path: &Path) -> Result<String> {
    output(std::process::Command::new(bin()).arg("tunnel-private-key").arg(path))
        .map(|out| out.trim().to_owned())
}

/// The tunnel of a bubble: its UDP socket, bound in the test host's namespace, its private key
/// file and the static peers (`NAME=CIDR@IP:PORT/PUBLIC-KEY`).
pub struct Tunnel<'a> {
    pub bind: SocketAddrV4,
    pub key: &'a Path,
    pub peers: Vec<String>,
    /// `--queues`/`--tunnel-queues`; by default one per CPU (a build before them has one).
    pub queues: Option<u32>,
    /// The host link's MTU (`--tunnel-mtu`).
    pub link_mtu: u32,
}

/// A bubble whose holder is `hpk-net-forwarder serve` itself, and a client of its API.
pub struct Bubble {
    client: Client,
    runtime: tokio::runtime::Runtime,
    server: Guard,
    _dir: tempfile::TempDir,
}

impl Bubble {
    /// Creates the bubble from inside `host`'s network namespace, as
    /// `[tunnel-socket --bind … --] unshare --user --map-root-user --net --mount -- serve …`.
    pub fn start(host: &dyn Netns, pod_cidr: &str, tunnel: Option<Tunnel<'_>>) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let socket = dir.path().join("run/nf.sock");
        let mut args = vec![format!("--net={}", host.netns_path()), "--".into()];
        if let Some(t) = &tunnel {
            args.extend([bin(), "tunnel-socket".into(), "--bind".into(), t.bind.to_string()]);
            args.extend(t.queues.map(|q| format!("--queues={q}")));
            args.push("--".into());
        }
        args.extend(["unshare", "--user", "--map-root-user", "--net", "--mount", "--"].map(String::from));
        args.extend([bin(), "serve".into()]);
        args.extend([
            "--socket".into(),
            path(&socket),
            "--state-dir".into(),
            path(&dir.path().join("state")),
        ]);
        args.extend(["--pod-cidr", pod_cidr, "--mtu", "1500"].map(String::from));
        if let Some(t) = &tunnel {
            // The sockets' descriptors come in HPK_TUNNEL_FD, from tunnel-socket.
            args.extend(["--tunnel-private-key-file".into(), path(t.key)]);
            args.extend(t.queues.map(|q| format!("--tunnel-queues={q}")));
            args.push(format!("--tunnel-mtu={}", t.link_mtu));
            args.extend(t.peers.iter().flat_map(|p| ["--peer".to_owned(), p.clone()]));
        }
        let mut server = Guard::spawn("nsenter", &args)?;
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let client = connect(&runtime, &mut server, &socket)?;
        Ok(Bubble { client, runtime, server, _dir: dir })
    }

    /// The net-forwarder's PID (also the bubble's holder).
    pub fn pid(&self) -> u32 {
        self.server.pid()
    }

    /// A new pod, attached over the API; returns it with its address.
    pub fn pod(&mut self, sandbox_id: &str) -> Result<(Pod, Ipv4Addr)> {
        let pod = Pod::new(self.pid())?;
        let request = pb::AttachRequest { sandbox_id: sandbox_id.into(), netns_path: pod.netns_path() };
        let mut client = self.client.clone();
        let response =
            self.runtime.block_on(client.attach(request)).with_context(|| format!("attach {sandbox_id}"))?;
        let attachment = response.into_inner().attachment.ok_or_else(|| anyhow!("attach: no attachment"))?;
        let addr = attachment.address.split('/').next().unwrap_or_default();
        Ok((pod, addr.parse().with_context(|| format!("attached address {:?}", attachment.address))?))
    }

    /// The tunnel's counters, from the Stats RPC.
    pub fn tunnel_stats(&self) -> Result<Option<pb::TunnelStats>> {
        let mut client = self.client.clone();
        let stats = self.runtime.block_on(client.stats(pb::StatsRequest::default())).context("stats")?;
        Ok(stats.into_inner().tunnel)
    }
}

impl Netns for Bubble {
    fn netns_path(&self) -> String {
        format!("/proc/{}/ns/net", self.pid())
    }
}

/// Waits (bounded) until the net-forwarder answers List on `socket`.
fn connect(runtime: &tokio::runtime::Runtime, server: &mut Guard, socket: &Path) -> Result<Client> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        server.check_running().context("hpk-net-forwarder serve")?;
        let connected = runtime.block_on(async {
            let mut client = NetForwarderClient::new(hpk_rpc::connect::unix(socket).await.ok()?);
            client.list(pb::ListRequest {}).await.ok().map(|_| client)
        });
        if let Some(client) = connected {
            return Ok(client);
        }
        if Instant::now() > deadline {
            bail!("hpk-net-forwarder did not answer within 20 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A pod: a network namespace nested in a bubble, held by a sleeping process.
pub struct Pod {
    holder: Guard,
}

impl Pod {
    /// `nsenter --target=BUBBLE --user --net -- unshare --net -- sleep infinity`.
    fn new(bubble: u32) -> Result<Self> {
        let args = [&format!("--target={bubble}"), "--user", "--net", "--", "unshare", "--net", "--"]
            .map(String::from)
            .into_iter()
            .chain(["sleep".into(), "infinity".into()])
            .collect::<Vec<_>>();
        let mut holder = Guard::spawn("nsenter", &args)?;
        holder.wait_in_new_netns("sleep", &format!("/proc/{bubble}/ns/net"))?;
        Ok(Pod { holder })
    }
}

impl Netns for Pod {
    fn netns_path(&self) -> String {
        format!("/proc/{}/ns/net", self.holder.pid())
    }
}

/// The seed's cross-node path: a bubble created from a test host's namespace, its only link a
/// slirp4netns TAP (`--configure --mtu=65520 --disable-host-loopback`), slirp4netns running in
/// the host's namespace.
pub struct SlirpBubble {
    slirp: Guard,
    holder: Guard,
}

impl SlirpBubble {
    /// `cidr` is slirp's internal network (the bubble gets its .100, the gateway is .2).
    pub fn start(host: &dyn Netns, cidr: &str) -> Result<Self> {
        let net = format!("--net={}", host.netns_path());
        let args = [&net, "--", "unshare", "--user", "--map-root-user", "--net", "--mount", "--", "sleep"]
            .map(String::from)
            .into_iter()
            .chain(["infinity".into()])
            .collect::<Vec<_>>();
        let mut holder = Guard::spawn("nsenter", &args)?;
        holder.wait_in_new_netns("sleep", &host.netns_path())?;
        let args = [&net, "--", "slirp4netns", "--configure", "--mtu=65520", "--disable-host-loopback"]
            .map(String::from)
            .into_iter()
            .chain([format!("--cidr={cidr}"), holder.pid().to_string(), "tap0".into()])
            .collect::<Vec<_>>();
        let slirp = Guard::spawn("nsenter", &args)?;
        let mut bubble = SlirpBubble { slirp, holder };
        wait_until("slirp4netns to configure tap0", || {
            bubble.slirp.check_running().context("slirp4netns")?;
            Ok(output(bubble.command("ip").args(["-4", "route", "show", "default"]))?.contains("tap0"))
        })?;
        Ok(bubble)
    }

    /// The relay's PID.
    pub fn slirp_pid(&self) -> u32 {
        self.slirp.pid()
    }
}

impl Netns for SlirpBubble {
    fn netns_path(&self) -> String {
        format!("/proc/{}/ns/net", self.holder.pid())
    }
}

fn path(p: &Path) -> String {
    p.display().to_string()
}
