//! Pods get addresses from hpk-net-forwarder: RunPodSandbox attaches the sandbox's network
//! namespace, PodSandboxStatus reports the IP, pods reach each other and the bubble reaches
//! them, and stopping the sandbox gives the address back. The net-forwarder runs in a network
//! namespace of the test's own (the "bubble"), never in the host's.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hpk_integration::image::{HTTPD_INDEX, HTTPD_PORT};
use support::{CRICTL_TOOLS, Runtime, registry_with_shell_image, tools_present};

/// A child process killed and reaped on drop.
struct Owned(Child);

impl Drop for Owned {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The net-forwarder binary, built beside this crate's binaries (`cargo test --workspace`
/// and `cargo build -p hpk-net-forwarder` build it).
fn net_forwarder() -> PathBuf {
    let path = Path::new(support::RUNTIME).with_file_name("hpk-net-forwarder");
    assert!(path.is_file(), "{} is missing: run `cargo build -p hpk-net-forwarder` first", path.display());
    path
}

/// Waits until process `pid` (an `unshare --net …` just spawned) is in a network namespace of
/// its own. Until unshare(2) has run, /proc/PID/ns/net is still this test's namespace, and an
/// `ip addr add` sent "into the bubble" would land on the host (seen in CI: 10.250.99.1 on the
/// host's lo).
fn wait_for_own_network_namespace(pid: u32) {
    let ours = std::fs::read_link("/proc/self/ns/net").expect("this test's network namespace");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match std::fs::read_link(format!("/proc/{pid}/ns/net")) {
            Ok(theirs) if theirs != ours => return,
            Ok(_) => {}
            Err(e) => panic!("process {pid} (unshare --net) is gone: {e}"),
        }
        assert!(
            std::time::Instant::now() < deadline,
            "process {pid} has no network namespace of its own after 10 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

fn in_bubble(bubble: u32, program: &str) -> Command {
    let mut cmd = Command::new("nsenter");
    cmd.arg(format!("--net=/proc/{bubble}/ns/net")).arg("--").arg(program);
    cmd
}

/// Sends an HTTP request through `cmd` (an `nc`) and returns the reply. stdin stays open until
/// the server has answered and closed: busybox nc stops reading the network once its stdin ends.
fn http_get_in(mut cmd: Command) -> String {
    let mut child =
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("nc");
    let mut stdin = child.stdin.take().expect("stdin");
    std::io::Write::write_all(&mut stdin, b"GET / HTTP/1.0\r\n\r\n").expect("request");
    let mut reply = String::new();
    let _ = std::io::Read::read_to_string(&mut child.stdout.take().expect("stdout"), &mut reply);
    drop(stdin);
    let _ = child.wait();
    reply
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_get_addresses_and_reach_each_other() {
    if !tools_present(&[CRICTL_TOOLS, &["ip"]].concat()) {
        return;
    }
    let (registry, shell, _) = registry_with_shell_image().await;
    let httpd = support::push_httpd_image(&registry).await;
    let tmp = tempfile::tempdir().expect("tempdir");
    tokio::task::block_in_place(|| {
        // The bubble: a network namespace held by a sleeping process of this test.
        let bubble = Owned(
            Command::new("unshare").args(["--net", "sleep", "infinity"]).spawn().expect("unshare --net"),
        );
        let bubble_pid = bubble.0.id();
        wait_for_own_network_namespace(bubble_pid);
        // A bubble has an address of its own (slirp4netns' in production): traffic it sends
        // to pods comes from there.
        for args in [&["link", "set", "lo", "up"][..], &["addr", "add", "10.250.99.1/32", "dev", "lo"][..]] {
            assert!(in_bubble(bubble_pid, "ip").args(args).status().expect("ip").success(), "ip {args:?}");
        }
        let nf_dir = tmp.path().join("nf");
        std::fs::create_dir_all(&nf_dir).expect("nf dir");
        let nf_socket = nf_dir.join("run/nf.sock");
        let nf_log = std::fs::File::create(nf_dir.join("nf.log")).expect("log");
        let _nf = Owned(
            in_bubble(bubble_pid, net_forwarder().to_str().expect("utf-8"))
                .args(["serve", "--pod-cidr", "10.89.0.0/24"])
                .arg("--socket")
                .arg(&nf_socket)
                .arg("--state-dir")
                .arg(nf_dir.join("state"))
                .stderr(nf_log)
                .spawn()
                .expect("start hpk-net-forwarder"),
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        while !nf_socket.exists() {
            assert!(Instant::now() < deadline, "net-forwarder not serving: {}", read(&nf_dir.join("nf.log")));
            std::thread::sleep(Duration::from_millis(50));
        }
        let socket_arg = format!("--net-forwarder-socket={}", nf_socket.display());
        let rt = Runtime::start_with(tmp.path(), &registry.host_port(), &[&socket_arg]);
        rt.ok(&["pull", &shell]);
        rt.ok(&["pull", &httpd]);
        let pod = |name: &str, image: &str, command: &[&str]| {
            let (pod_id, ctr_id) = rt.run_pod(tmp.path(), name, image, command, false, false);
            let status: serde_json::Value =
                serde_json::from_str(&rt.ok(&["inspectp", &pod_id])).expect("inspectp");
            let ip = status["status"]["network"]["ip"].as_str().unwrap_or_default().to_owned();
            (pod_id, ctr_id, ip)
        };
        let (web_pod, _, web_ip) = pod("web", &httpd, &[]);
        let (client_pod, client, client_ip) = pod("client", &shell, &["sleep", "300"]);
        assert!(
            web_ip.starts_with("10.89.0.") && client_ip.starts_with("10.89.0."),
            "{web_ip} {client_ip}\n{}",
            rt.log()
        );
        assert_ne!(web_ip, client_ip);

        // Pod to pod, over the pods' own interfaces.
        let request = format!("printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc {web_ip} {HTTPD_PORT}");
        let deadline = Instant::now() + Duration::from_secs(10);
        let body = loop {
            let out = rt.crictl(&["exec", "-s", &client, "sh", "-c", &request]);
            let body = String::from_utf8_lossy(&out.stdout).into_owned();
            if body.contains(HTTPD_INDEX) || Instant::now() > deadline {
                break body;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        assert!(body.contains(HTTPD_INDEX), "pod to pod: {body:?}\n{}", read(&nf_dir.join("nf.log")));
        // The bubble reaches a pod.
        let deadline = Instant::now() + Duration::from_secs(10);
        let reply = loop {
            let mut nc = in_bubble(bubble_pid, "/bin/busybox");
            nc.args(["nc", "-w", "10", &web_ip, &HTTPD_PORT.to_string()]);
            let reply = http_get_in(nc);
            if reply.contains(HTTPD_INDEX) || Instant::now() > deadline {
                break reply;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        assert!(reply.contains(HTTPD_INDEX), "bubble to pod: {reply:?}");

        // Stopping the sandboxes gives the addresses and interfaces back.
        for pod in [&web_pod, &client_pod] {
            rt.ok(&["stopp", pod]);
            rt.ok(&["rmp", pod]);
        }
        let links = in_bubble(bubble_pid, "ip").args(["-o", "link"]).output().expect("ip link");
        let links = String::from_utf8_lossy(&links.stdout);
        assert!(!links.contains("hpkv"), "no pod interface left in the bubble: {links}");
    });
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}
