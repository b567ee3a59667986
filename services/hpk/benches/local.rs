//! `hpk up` and `hpk down` as a user meets them, on a test host with the image built:
//! - `hpk up --nodes 2` to every node Ready (goal < 30 s) and to cluster DNS ready, as `up`
//!   itself reports them, and its wall time;
//! - from `hpk up`'s start until `kubectl top nodes` answers for both nodes (metrics-server,
//!   deployed by `up`, has scraped both kubelets);
//! - `kubectl apply` of a StatefulSet of 2 with `volumeClaimTemplates` (node-local volumes of
//!   the default StorageClass, made by the local-path provisioner `up` deployed) until both
//!   pods are Ready, beside the same StatefulSet without volumes, in the same cluster;
//! - `hpk down` wall time;
//! - the idle resident memory of each service in a bubble, 20 s after `up` returned.
//!
//! Run (as root, after `cargo build --workspace --bins && make images`):
//! `cargo bench -p hpk --bench local`

#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use support::{Env, bubble_processes, prerequisites, reported, text};

const RUNS: usize = 3;

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio");
    runtime.block_on(run());
}

/// VmRSS in KiB of each process of the cluster's bubbles (nodes `NAME-1`, `NAME-2`), by
/// program name.
fn rss_by_program(name: &str) -> BTreeMap<String, Vec<u64>> {
    let mut out: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for node in [format!("{name}-1"), format!("{name}-2")] {
        for (pid, cmdline) in bubble_processes(name, &node) {
            let program =
                cmdline.split_whitespace().next().unwrap_or("").rsplit('/').next().unwrap_or("").to_owned();
            let program = match program.as_str() {
                "hpk" if cmdline.contains("--supervise") => "hpk bubble-init (supervisor)".to_owned(),
                "hpk" => "hpk bubble-init (reaper)".to_owned(),
                _ => program,
            };
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            if let Some(kib) = status
                .lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
            {
                out.entry(program).or_default().push(kib);
            }
        }
    }
    out
}

/// A StatefulSet `name` of 2 pods of `image`, with a node-local volume each when `volumes`.
fn statefulset(name: &str, image: &str, volumes: bool) -> String {
    let mut text = format!(
        "apiVersion: apps/v1\nkind: StatefulSet\nmetadata: {{name: {name}}}\nspec:\n  serviceName: {name}\n  \
         replicas: 2\n  podManagementPolicy: Parallel\n  selector: {{matchLabels: {{app: {name}}}}}\n  template:\n    \
         metadata: {{labels: {{app: {name}}}}}\n    spec:\n      terminationGracePeriodSeconds: 1\n      containers:\n      \
         - name: c\n        image: {image}\n        command: [sleep, '3600']\n"
    );
    if volumes {
        text.push_str(
            "        volumeMounts: [{name: data, mountPath: /data}]\n  volumeClaimTemplates:\n  \
             - metadata: {name: data}\n    spec:\n      accessModes: [ReadWriteOnce]\n      \
             resources: {requests: {storage: 64Mi}}\n",
        );
    }
    text
}

/// Seconds from `kubectl apply` of [`statefulset`] until both its pods are Ready.
async fn statefulset_ready(env: &Env, cluster: &str, name: &str, volumes: bool) -> f64 {
    let started = Instant::now();
    env.apply(cluster, &statefulset(name, &env.shell, volumes));
    loop {
        let ready =
            env.kubectl(cluster, &["get", "statefulset", name, "-o", "jsonpath={.status.readyReplicas}"]);
        if String::from_utf8_lossy(&ready.stdout) == "2" {
            return started.elapsed().as_secs_f64();
        }
        assert!(
            started.elapsed() < Duration::from_secs(180),
            "StatefulSet {name}: {}",
            env.diagnose(cluster)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn run() {
    let Some(image) = prerequisites() else { return };
    let env = Env::start(image).await;
    let mut rows = Vec::new();
    let mut memory = BTreeMap::new();
    for run in 1..=RUNS {
        let name = format!("bench{run}");
        let started = Instant::now();
        let up = env.up(&name, 2);
        let wall = started.elapsed();
        let output = text(&up);
        assert!(up.status.success(), "hpk up: {output}");
        let (ready, dns) = (reported(&output, "node(s) Ready in "), reported(&output, "cluster DNS in "));
        let metrics = loop {
            let top = env.kubectl(&name, &["top", "nodes", "--no-headers"]);
            if top.status.success() && String::from_utf8_lossy(&top.stdout).lines().count() == 2 {
                break started.elapsed();
            }
            assert!(started.elapsed() < Duration::from_secs(240), "kubectl top nodes: {}", text(&top));
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        if run == 1 {
            tokio::time::sleep(Duration::from_secs(20)).await;
            memory = rss_by_program(&name);
        }
        // The image pulled once first, so that neither figure includes it.
        statefulset_ready(&env, &name, "warm", false).await;
        let plain = statefulset_ready(&env, &name, "plain", false).await;
        let volumes = statefulset_ready(&env, &name, "db", true).await;
        let started = Instant::now();
        let down = env.down(&name);
        assert!(down.status.success(), "hpk down: {}", text(&down));
        let down_wall = started.elapsed();
        println!(
            "run {run}: nodes Ready {ready:.1} s, DNS ready {dns:.1} s, up wall {:.1} s, kubectl top {:.1} s, \
             StatefulSet of 2 Ready {plain:.1} s, with volumes {volumes:.1} s, down {:.1} s",
            wall.as_secs_f64(),
            metrics.as_secs_f64(),
            down_wall.as_secs_f64()
        );
        rows.push((
            ready,
            dns,
            wall.as_secs_f64(),
            down_wall.as_secs_f64(),
            metrics.as_secs_f64(),
            plain,
            volumes,
        ));
    }
    type Row = (f64, f64, f64, f64, f64, f64, f64);
    let median = |f: fn(&Row) -> f64| {
        let mut v: Vec<f64> = rows.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!("\n| what (2 nodes, median of {RUNS}) | seconds |\n|---|---|");
    println!("| `hpk up` → every node Ready (goal < 30 s) | {:.1} |", median(|r| r.0));
    println!("| `hpk up` → cluster DNS ready (CoreDNS 2/2) | {:.1} |", median(|r| r.1));
    println!("| `hpk up` wall time (image unpacked and cached) | {:.1} |", median(|r| r.2));
    println!("| `hpk up` start → `kubectl top nodes` answers for both | {:.1} |", median(|r| r.4));
    println!("| `kubectl apply` → StatefulSet of 2 Ready, no volumes | {:.1} |", median(|r| r.5));
    println!(
        "| `kubectl apply` → StatefulSet of 2 Ready, a local-path volume each (PVCs provisioned) | {:.1} |",
        median(|r| r.6)
    );
    println!("| `hpk down` wall time | {:.1} |", median(|r| r.3));
    println!("\n| process (first run, idle 20 s, both bubbles) | RSS MiB each |\n|---|---|");
    for (program, kib) in &memory {
        let each: Vec<String> = kib.iter().map(|k| format!("{:.1}", *k as f64 / 1024.0)).collect();
        println!("| {program} | {} |", each.join(", "));
    }
}
