//! The kubelet API as users feel it, through the real kubectl and API server, against the
//! release binaries on a real node, each figure beside its baseline in the same run:
//! - `kubectl logs -f --timestamps` line latency: the log record's timestamp (when the runtime's
//!   shim read the line) to the line's arrival at kubectl, p50/p99 of 100 lines;
//! - `kubectl exec pod -- true` round trip, p50/p99 of 50, beside `crictl exec` on the node
//!   (the runtime alone, no API server, no kubelet);
//! - `kubectl port-forward` throughput (curl of a 256 MiB file), beside curl of the pod IP
//!   from the node.
//!
//! Run (as root, after `cargo build --release --workspace --bins`):
//! `cargo bench -p hpk-kubelet --bench api`

#[path = "../tests/support/mod.rs"]
mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use support::{Cluster, eventually};

const LINES: usize = 100;
const EXECS: usize = 50;

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio");
    runtime.block_on(run());
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

async fn run() {
    let Some(c) = Cluster::start().await else {
        eprintln!("skipped: prerequisites missing (see above)");
        return;
    };
    c.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: ticker\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    image: {}\n    command: [sh, -c, 'while true; do echo tick; sleep 0.1; done']\n---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: httpd\n    image: {}\n",
        c.shell, c.httpd
    ));
    let ip = eventually(&c, "pods running", Duration::from_secs(60), || async {
        let mut ip = None;
        for name in ["ticker", "web"] {
            let pod = c.pods("default").get(name).await.ok()?;
            let status = pod.status?;
            (status.phase.as_deref() == Some("Running")).then_some(())?;
            ip = status.pod_ip;
        }
        ip
    })
    .await;
    logs_follow(&c);
    exec_round_trip(&c);
    port_forward(&c, &ip).await;
    let rss = c
        .node
        .kubelet_pid()
        .and_then(|pid| std::fs::read_to_string(format!("/proc/{pid}/status")).ok())
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("VmRSS:").map(|v| v.trim().to_owned())));
    println!("kubelet RSS after the runs (2 pods, API served): {}", rss.unwrap_or_else(|| "unknown".into()));
}

/// Latency of followed log lines: record timestamp → arrival.
fn logs_follow(c: &Cluster) {
    let mut child =
        c.cp.kubectl()
            .args(["logs", "-f", "--timestamps", "--tail=0", "ticker"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("kubectl logs -f");
    let reader = BufReader::new(child.stdout.take().expect("stdout"));
    let mut latencies = Vec::with_capacity(LINES);
    for line in reader.lines().take(LINES) {
        let arrived = SystemTime::now();
        let line = line.expect("line");
        let stamp = line.split_whitespace().next().expect("timestamp");
        let written = time::OffsetDateTime::parse(stamp, &time::format_description::well_known::Rfc3339)
            .expect("RFC 3339 timestamp");
        let written = SystemTime::UNIX_EPOCH + Duration::from_nanos(written.unix_timestamp_nanos() as u64);
        latencies.push(arrived.duration_since(written).unwrap_or_default());
    }
    let _ = child.kill();
    let _ = child.wait();
    latencies.sort();
    println!(
        "kubectl logs -f line latency ({LINES} lines): p50 {}, p99 {}, max {}",
        ms(percentile(&latencies, 50.0)),
        ms(percentile(&latencies, 99.0)),
        ms(*latencies.last().expect("lines"))
    );
}

/// `kubectl exec ticker -- true` beside `crictl exec <id> true` on the node.
fn exec_round_trip(c: &Cluster) {
    let endpoint = format!("unix://{}", c.node.runtime_socket().display());
    // In node1's network namespace: the runtime's streaming server listens on its loopback.
    let crictl = |args: &[&str]| {
        let out = c
            .node
            .host()
            .command("crictl")
            .args(["--runtime-endpoint", &endpoint, "--image-endpoint", &endpoint])
            .args(args)
            .output()
            .expect("crictl");
        assert!(out.status.success(), "crictl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    let id = crictl(&["ps", "-q", "--name", "main", "--label", "io.kubernetes.pod.name=ticker"]);
    let time = |run: &dyn Fn()| -> Vec<Duration> {
        let mut all: Vec<Duration> = (0..EXECS)
            .map(|_| {
                let started = Instant::now();
                run();
                started.elapsed()
            })
            .collect();
        all.sort();
        all
    };
    let kubectl = time(&|| {
        let status = c.cp.kubectl().args(["exec", "ticker", "--", "true"]).status().expect("kubectl");
        assert!(status.success());
    });
    let direct = time(&|| {
        crictl(&["exec", &id, "true"]);
    });
    // kubectl itself: process start, kubeconfig, one API request.
    let get = time(&|| {
        let status = c.cp.kubectl().args(["get", "pod", "ticker", "-o", "name"]).output().expect("kubectl");
        assert!(status.status.success());
    });
    println!(
        "kubectl exec pod -- true ({EXECS}): p50 {}, p99 {}   | crictl exec on the node (runtime only): p50 {}, p99 {}   | kubectl get pod (kubectl's own start + 1 request): p50 {}, p99 {}",
        ms(percentile(&kubectl, 50.0)),
        ms(percentile(&kubectl, 99.0)),
        ms(percentile(&direct, 50.0)),
        ms(percentile(&direct, 99.0)),
        ms(percentile(&get, 50.0)),
        ms(percentile(&get, 99.0))
    );
}

/// curl of a 256 MiB file through `kubectl port-forward`, beside curl of the pod IP from node1.
async fn port_forward(c: &Cluster, pod_ip: &str) {
    let made =
        c.cp.kubectl()
            .args(["exec", "web", "--", "dd", "if=/dev/zero", "of=/www/big", "bs=1M", "count=256"])
            .output()
            .expect("dd");
    assert!(made.status.success(), "dd: {}", String::from_utf8_lossy(&made.stderr));
    let mut forward =
        c.cp.kubectl()
            .args(["port-forward", "pod/web", ":8080"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("kubectl port-forward");
    let mut lines = BufReader::new(forward.stdout.take().expect("stdout")).lines();
    let first = lines.next().expect("a line").expect("line");
    let port: u16 = first
        .split("127.0.0.1:")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|p| p.parse().ok())
        .expect("local port");
    // Keep draining kubectl's output (it writes a line per connection).
    std::thread::spawn(move || for _ in lines {});
    let speed = |mut cmd: Command| -> f64 {
        let out = cmd.args(["-sS", "-o", "/dev/null", "-w", "%{speed_download}"]).output().expect("curl");
        assert!(out.status.success(), "curl: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().parse::<f64>().expect("speed") * 8.0 / 1e9
    };
    // The runtime's streaming server alone: crictl port-forward on node1 (no API server, no
    // kubelet), to tell which hop costs what.
    let endpoint = format!("unix://{}", c.node.runtime_socket().display());
    let sandbox = {
        let out = c
            .node
            .host()
            .command("crictl")
            .args(["--runtime-endpoint", &endpoint, "pods", "-q", "--name", "^web$"])
            .output()
            .expect("crictl pods");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    let mut crictl_forward = c
        .node
        .host()
        .command("crictl")
        .args(["--runtime-endpoint", &endpoint, "port-forward", &sandbox, "18080:8080"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("crictl port-forward");
    // Ready once it says it forwards (client-go's "Forwarding from 127.0.0.1:18080 -> 8080").
    let mut crictl_lines = BufReader::new(crictl_forward.stdout.take().expect("stdout")).lines();
    let ready = crictl_lines.next().and_then(Result::ok).unwrap_or_default();
    assert!(ready.contains("Forwarding from"), "crictl port-forward: {ready:?}");
    std::thread::spawn(move || for _ in crictl_lines {});
    let mut through = Vec::new();
    let mut direct = Vec::new();
    let mut runtime_only = Vec::new();
    for _ in 0..3 {
        let mut cmd = Command::new("curl");
        cmd.arg(format!("http://127.0.0.1:{port}/big"));
        through.push(speed(cmd));
        let mut cmd = c.node.host().command("curl");
        cmd.arg(format!("http://{pod_ip}:8080/big"));
        direct.push(speed(cmd));
        let mut cmd = c.node.host().command("curl");
        cmd.arg("http://127.0.0.1:18080/big");
        runtime_only.push(speed(cmd));
    }
    let _ = forward.kill();
    let _ = forward.wait();
    let _ = crictl_forward.kill();
    let _ = crictl_forward.wait();
    let best = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
    println!(
        "port-forward throughput (256 MiB, best of 3): kubectl {:.2} Gbit/s   | crictl port-forward on the node (runtime only): {:.2} Gbit/s   | curl of the pod IP from the node: {:.2} Gbit/s",
        best(&through),
        best(&runtime_only),
        best(&direct)
    );
}
