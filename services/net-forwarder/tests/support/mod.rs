//! A test bubble (user + net + mount namespace, as in production), pods as network namespaces
//! nested in it, and the net-forwarder serving inside it.

#![allow(dead_code, missing_docs)]

pub mod hosts;
pub mod raw;

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use hpk_proto::netforwarder::v1 as pb;
use nix::sched::CloneFlags;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use pb::net_forwarder_client::NetForwarderClient;
use tonic::transport::Channel;

pub type Client = NetForwarderClient<Channel>;

/// `None` (after printing why) when a prerequisite is missing; a panic instead when
/// HPK_REQUIRE_TOOLS=1.
pub fn bubble() -> Option<Bubble> {
    if let Err(why) = prerequisites() {
        hpk_test_support::skip(why);
        return None;
    }
    Some(Bubble::create())
}

fn prerequisites() -> Result<(), String> {
    for tool in ["/bin/busybox", "/usr/bin/unshare", "/usr/bin/nsenter"] {
        if !Path::new(tool).exists() {
            return Err(format!("{tool} is not installed"));
        }
    }
    if !nix::unistd::geteuid().is_root() {
        return Err("the tests enter the pods' namespaces from outside the bubble: run as root".into());
    }
    let ok = Command::new("unshare")
        .args(["--user", "--map-root-user", "--net", "--mount", "true"])
        .status()
        .is_ok_and(|s| s.success());
    if !ok { Err("cannot create user + network namespaces (unshare failed)".into()) } else { Ok(()) }
}

fn spawn(cmd: &mut Command) -> Child {
    cmd.stdin(Stdio::null()).spawn().unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"))
}

fn stop(child: &mut Child) {
    let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
    let _ = child.wait();
}

/// The bubble: a process holding the namespaces, and a temp dir for sockets and state.
pub struct Bubble {
    holder: Child,
    pub dir: tempfile::TempDir,
}

/// `unshare`'s arguments for a bubble: user (root mapped to the caller), network and mount
/// namespaces, held by a sleeping process.
const HOLDER: &[&str] = &["--user", "--map-root-user", "--net", "--mount", "--", "sleep", "3600"];

impl Bubble {
    fn create() -> Self {
        Self::create_with(Command::new("unshare").args(HOLDER))
    }

    /// A bubble from a command that ends by exec'ing `unshare --user … sleep` (same PID).
    fn create_with(cmd: &mut Command) -> Self {
        let holder = spawn(cmd);
        let bubble = Bubble { holder, dir: tempfile::tempdir().expect("tempdir") };
        // unshare execs sleep once the namespaces exist and its uid map is written; wait for
        // that (before, an unprivileged bubble's /proc entries are not yet its user's).
        let own = std::fs::read_link("/proc/self/ns/user").expect("own userns");
        let deadline = Instant::now() + Duration::from_secs(5);
        let comm = || std::fs::read_to_string(format!("/proc/{}/comm", bubble.pid())).unwrap_or_default();
        while std::fs::read_link(format!("/proc/{}/ns/user", bubble.pid())).ok().as_ref() == Some(&own)
            || comm().trim() != "sleep"
        {
            assert!(Instant::now() < deadline, "the bubble did not come up");
            std::thread::sleep(Duration::from_millis(10));
        }
        bubble.ip(&["link", "set", "lo", "up"]);
        bubble
    }

    pub fn pid(&self) -> u32 {
        self.holder.id()
    }

    /// `ip ARGS` in the bubble's network namespace.
    pub fn ip(&self, args: &[&str]) {
        let out = self.exec(&["ip"], args);
        assert!(out.status.success(), "ip {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }

    fn exec(&self, prog: &[&str], args: &[&str]) -> Output {
        Command::new("nsenter")
            .arg(format!("--net=/proc/{}/ns/net", self.pid()))
            .arg("--")
            .args(prog)
            .args(args)
            .output()
            .expect("nsenter")
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("run/nf.sock")
    }

    /// Starts `hpk-net-forwarder serve` inside the bubble (user, net and mount namespace).
    pub async fn serve(&self, pod_cidr: &str) -> Server {
        self.serve_with(pod_cidr, &[]).await
    }

    /// `serve` and what every test gives it: this bubble's socket and state, the pod CIDR.
    pub fn serve_args(&self, pod_cidr: &str) -> Vec<std::ffi::OsString> {
        let socket = self.socket().into_os_string();
        let state = self.dir.path().join("state").into_os_string();
        let mut args: Vec<std::ffi::OsString> = vec!["serve".into(), "--socket".into(), socket];
        args.extend(["--state-dir".into(), state, "--pod-cidr".into(), pod_cidr.into()]);
        args.extend(["--mtu".into(), "1500".into()]);
        args
    }

    /// [`Bubble::serve`] with extra flags, e.g. `--attach-mode tap`.
    pub async fn serve_with(&self, pod_cidr: &str, extra: &[&str]) -> Server {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--target={}", self.pid()))
            .args(["--user", "--net", "--mount", "--"])
            .arg(env!("CARGO_BIN_EXE_hpk-net-forwarder"))
            .args(self.serve_args(pod_cidr))
            .args(extra);
        let child = spawn(&mut cmd);
        let mut server = Server { child, client: None };
        server.client = Some(wait_ready(&self.socket(), &mut server.child).await);
        server
    }

    /// A pod: a process holding a fresh network namespace nested in the bubble's user namespace.
    pub fn pod(&self) -> Pod {
        let child = spawn(
            Command::new("nsenter")
                .arg(format!("--target={}", self.pid()))
                .args(["--user", "--net", "--", "unshare", "--net", "--", "sleep", "3600"]),
        );
        let pod = Pod { child };
        let bubble_ns = std::fs::read_link(format!("/proc/{}/ns/net", self.pid())).expect("bubble netns");
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let ns = std::fs::read_link(pod.netns_path()).ok();
            let comm = std::fs::read_to_string(format!("/proc/{}/comm", pod.pid())).unwrap_or_default();
            if ns.is_some_and(|ns| ns != bubble_ns) && comm.trim() == "sleep" {
                break;
            }
            assert!(Instant::now() < deadline, "the pod did not come up");
            std::thread::sleep(Duration::from_millis(10));
        }
        pod
    }

    /// Names of the net-forwarder's interfaces (hpkv*, hpkp*, hpkt*) in the bubble.
    pub fn forwarder_interfaces(&self) -> BTreeSet<String> {
        let dev = std::fs::read_to_string(format!("/proc/{}/net/dev", self.pid())).expect("net/dev");
        dev.lines()
            .filter_map(|l| l.split_once(':').map(|(n, _)| n.trim().to_owned()))
            .filter(|n| ["hpkv", "hpkp", "hpkt"].iter().any(|p| n.starts_with(p)))
            .collect()
    }

    /// The bubble's IPv4 routes (main table), one line each.
    pub fn routes(&self) -> Vec<String> {
        let out = self.exec(&["ip"], &["-4", "route", "show"]);
        String::from_utf8_lossy(&out.stdout).lines().map(str::to_owned).collect()
    }

    /// Gives the bubble an address of its own (on `lo`: kernels without the dummy module).
    pub fn add_address(&self, addr: Ipv4Addr) {
        self.ip(&["addr", "add", &format!("{addr}/32"), "dev", "lo"]);
    }

    pub fn netns_path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/{}/ns/net", self.pid()))
    }
}

impl Drop for Bubble {
    fn drop(&mut self) {
        // The namespaces, and every veth pair in them, go with their last process.
        stop(&mut self.holder);
    }
}

async fn wait_ready(socket: &Path, child: &mut Child) -> Client {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("the net-forwarder exited at start: {status}");
        }
        if let Ok(channel) = hpk_rpc::connect::unix(socket).await {
            let mut client = NetForwarderClient::new(channel);
            if client.list(pb::ListRequest {}).await.is_ok() {
                return client;
            }
        }
        assert!(Instant::now() < deadline, "the net-forwarder did not answer within 20 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The net-forwarder process and a client connected to it.
pub struct Server {
    child: Child,
    client: Option<Client>,
}

impl Server {
    /// Spawns `cmd` (a `serve`) and waits until it answers on `socket`.
    pub async fn start(cmd: &mut Command, socket: &Path) -> Server {
        let child = spawn(cmd);
        let mut server = Server { child, client: None };
        server.client = Some(wait_ready(socket, &mut server.child).await);
        server
    }

    pub fn client(&self) -> Client {
        self.client.clone().expect("connected")
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Threads of the server process.
    pub fn threads(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/task", self.pid())).expect("task dir").count()
    }

    /// Open file descriptors of the server process.
    pub fn fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid())).expect("fd dir").count()
    }

    /// SIGTERM, and wait for a clean exit.
    pub fn stop(mut self) {
        self.client = None;
        kill(Pid::from_raw(self.pid() as i32), Signal::SIGTERM).expect("SIGTERM");
        let status = self.child.wait().expect("wait");
        assert!(status.success(), "the net-forwarder exited with {status} after SIGTERM");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            stop(&mut self.child);
        }
    }
}

/// A pod sandbox's network namespace, held by a sleeping process.
pub struct Pod {
    child: Child,
}

impl Pod {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn netns_path(&self) -> String {
        format!("/proc/{}/ns/net", self.pid())
    }

    /// `busybox ping` from inside the pod: true if every echo came back.
    pub fn ping(&self, to: Ipv4Addr) -> bool {
        Command::new("nsenter")
            .arg(format!("--net={}", self.netns_path()))
            .args(["--", "/bin/busybox", "ping", "-c", "2", "-W", "2"])
            .arg(to.to_string())
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// Names of the interfaces in the pod's namespace.
    pub fn interfaces(&self) -> BTreeSet<String> {
        let dev = std::fs::read_to_string(format!("/proc/{}/net/dev", self.pid())).expect("net/dev");
        dev.lines().skip(2).filter_map(|l| l.split_once(':').map(|(n, _)| n.trim().to_owned())).collect()
    }

    /// `ip ARGS` in the pod's network namespace.
    pub fn ip(&self, args: &[&str]) -> Output {
        Command::new("nsenter")
            .arg(format!("--net={}", self.netns_path()))
            .args(["--", "ip"])
            .args(args)
            .output()
            .expect("nsenter ip")
    }

    /// Kills the pod's process; its network namespace goes with it.
    pub fn kill(mut self) {
        stop(&mut self.child);
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        stop(&mut self.child);
    }
}

/// Runs `f` on a thread that entered the network namespace at `netns`.
pub fn in_netns<T: Send + 'static>(netns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let file = File::open(netns).expect("open netns");
    std::thread::spawn(move || {
        nix::sched::setns(&file, CloneFlags::CLONE_NEWNET).expect("setns");
        f()
    })
    .join()
    .expect("thread in netns")
}

/// A TCP round trip from the namespace `client_ns` to `server` listening in `server_ns`: the
/// client sends a line, the server answers it upper-cased.
pub fn tcp_round_trip(server_ns: &str, server: Ipv4Addr, client_ns: &str) -> String {
    let listener = in_netns(server_ns, move || TcpListener::bind((server, 0)).expect("bind"));
    let addr: SocketAddr = listener.local_addr().expect("addr");
    let echo = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().expect("accept");
        conn.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
        let mut buf = [0u8; 64];
        let n = conn.read(&mut buf).expect("read");
        conn.write_all(&buf[..n].to_ascii_uppercase()).expect("write");
    });
    let mut conn = in_netns(client_ns, move || {
        TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect")
    });
    conn.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    conn.write_all(b"hello pod").expect("send");
    let mut answer = String::new();
    conn.read_to_string(&mut answer).expect("receive");
    echo.join().expect("echo thread");
    answer
}

/// Two attached pods of `bubble` ping each other and talk TCP; pod A and the bubble (at
/// `bubble_address`) talk TCP both ways.
pub fn pods_and_bubble_talk(
    bubble: &Bubble,
    bubble_address: Ipv4Addr,
    (pod_a, a): (&Pod, &pb::Attachment),
    (pod_b, b): (&Pod, &pb::Attachment),
) {
    assert!(pod_a.ping(address(b)), "pod A cannot ping pod B");
    assert!(pod_b.ping(address(a)), "pod B cannot ping pod A");
    assert_eq!(tcp_round_trip(&pod_b.netns_path(), address(b), &pod_a.netns_path()), "HELLO POD");
    assert!(pod_a.ping(bubble_address), "pod A cannot ping the bubble");
    let bubble_ns = bubble.netns_path().display().to_string();
    assert_eq!(tcp_round_trip(&bubble_ns, bubble_address, &pod_a.netns_path()), "HELLO POD");
    assert_eq!(tcp_round_trip(&pod_a.netns_path(), address(a), &bubble_ns), "HELLO POD");
}

/// The address part of an Attachment's "a.b.c.d/32".
pub fn address(a: &pb::Attachment) -> Ipv4Addr {
    a.address.split('/').next().and_then(|s| s.parse().ok()).expect("address/prefix")
}

pub async fn attach(client: &mut Client, sandbox: &str, pod: &Pod) -> pb::Attachment {
    client
        .attach(pb::AttachRequest { sandbox_id: sandbox.into(), netns_path: pod.netns_path() })
        .await
        .unwrap_or_else(|e| panic!("attach {sandbox}: {e}"))
        .into_inner()
        .attachment
        .expect("attachment")
}

pub async fn detach(client: &mut Client, sandbox: &str) {
    client
        .detach(pb::DetachRequest { sandbox_id: sandbox.into() })
        .await
        .unwrap_or_else(|e| panic!("detach {sandbox}: {e}"));
}

/// Everything detached: no interface of the net-forwarder's, the bubble's routes as they were
/// before, no allocation, every address of a /24 free.
pub async fn assert_nothing_attached(bubble: &Bubble, client: &mut Client, routes_before: &[String]) {
    assert!(bubble.forwarder_interfaces().is_empty(), "{:?}", bubble.forwarder_interfaces());
    assert_eq!(bubble.routes(), routes_before);
    let listed = list(client).await;
    assert!(listed.attachments.is_empty(), "{:?}", listed.attachments);
    assert_eq!(listed.free_addresses, 253);
}

pub async fn list(client: &mut Client) -> pb::ListResponse {
    client.list(pb::ListRequest {}).await.expect("list").into_inner()
}
