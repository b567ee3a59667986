//! Pod start as the API sees it, against the release binaries on a real node (the upstream
//! control plane, hpk-net-forwarder, hpk-pod-runtime with crun, hpk-kubelet):
//! - 100 pods created one after another (image present): create → phase Running, p50/p99;
//! - 100 pods created at once: time until every one is Running;
//! - the kubelet's RSS with 100 pods.
//!
//! Run (as root, after `cargo build --release --workspace --bins`):
//! `cargo bench -p hpk-kubelet --bench pods`. With `HPK_BENCH_SAMPLES=FILE` every sequential
//! sample is also appended to FILE (`measurement<TAB>milliseconds`), to pool runs.

#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::runtime::watcher::{self, Event};
use support::Cluster;

const PODS: usize = 100;

fn pod(name: &str, image: &str) -> Pod {
    let manifest = hpk_integration::manifest::pod(name, image, &["sleep", "3600"], &[("bench", "pods")]);
    serde_json::from_value(manifest).expect("pod")
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio");
    runtime.block_on(run());
}

/// Watches the bench pods; sends (name, when it was first seen Running).
fn running_times(c: &Cluster) -> tokio::sync::mpsc::UnboundedReceiver<(String, Instant)> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let stream = watcher::watcher(c.pods("default"), watcher::Config::default().labels("bench=pods"));
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            if let Ok(Event::Apply(p) | Event::InitApply(p)) = event
                && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
            {
                let _ = tx.send((p.metadata.name.unwrap_or_default(), Instant::now()));
            }
        }
    });
    rx
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Appends `samples` to `$HPK_BENCH_SAMPLES`, if set.
fn record_samples(name: &str, samples: &[Duration]) {
    let Some(path) = std::env::var_os("HPK_BENCH_SAMPLES") else { return };
    let lines: String = samples.iter().map(|d| format!("{name}\t{:.3}\n", d.as_secs_f64() * 1e3)).collect();
    let mut file =
        std::fs::OpenOptions::new().create(true).append(true).open(path).expect("open samples file");
    std::io::Write::write_all(&mut file, lines.as_bytes()).expect("write samples");
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

async fn delete_all(c: &Cluster) {
    let pods = c.pods("default");
    let _ =
        pods.delete_collection(&DeleteParams::default(), &ListParams::default().labels("bench=pods")).await;
    let deadline = Instant::now() + Duration::from_secs(300);
    while Instant::now() < deadline {
        if pods
            .list(&ListParams::default().labels("bench=pods"))
            .await
            .map(|l| l.items.is_empty())
            .unwrap_or(false)
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    panic!("bench pods not deleted within 300 s");
}

async fn run() {
    let Some(c) = Cluster::start().await else {
        eprintln!("prerequisites missing; nothing measured");
        return;
    };
    let pods = c.pods("default");
    let pp = PostParams::default();
    // The image is present: one pod pulls it first.
    pods.create(&pp, &pod("warm", &c.shell)).await.expect("create");
    let mut seen = running_times(&c);
    loop {
        let (name, _) = seen.recv().await.expect("watch");
        if name == "warm" {
            break;
        }
    }
    pods.delete("warm", &DeleteParams::default()).await.expect("delete");
    delete_all(&c).await;

    // One after another.
    let mut latencies = Vec::with_capacity(PODS);
    for i in 0..PODS {
        let name = format!("seq-{i}");
        let started = Instant::now();
        pods.create(&pp, &pod(&name, &c.shell)).await.expect("create");
        loop {
            let (seen_name, at) = seen.recv().await.expect("watch");
            if seen_name == name {
                latencies.push(at - started);
                break;
            }
        }
    }
    let kubelet_pid = c.node.kubelet_pid().expect("kubelet");
    let rss_100 = rss_kib(kubelet_pid);
    record_samples("create → Running, sequential", &latencies);
    latencies.sort();
    println!(
        "sequential create → Running ({PODS} pods): p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        percentile(&latencies, 50.0).as_secs_f64() * 1e3,
        percentile(&latencies, 99.0).as_secs_f64() * 1e3,
        latencies[latencies.len() - 1].as_secs_f64() * 1e3
    );
    println!("kubelet RSS with {PODS} pods: {:.1} MiB", rss_100 as f64 / 1024.0);
    delete_all(&c).await;
    while seen.try_recv().is_ok() {}

    // All at once.
    let started = Instant::now();
    let creates = (0..PODS).map(|i| {
        let pods = pods.clone();
        let pp = pp.clone();
        let p = pod(&format!("burst-{i}"), &c.shell);
        async move { pods.create(&pp, &p).await.expect("create") }
    });
    futures_util::future::join_all(creates).await;
    let created = started.elapsed();
    let mut running: HashMap<String, Instant> = HashMap::new();
    while running.len() < PODS {
        let (name, at) = tokio::time::timeout(Duration::from_secs(600), seen.recv())
            .await
            .expect("all Running within 600 s")
            .expect("watch");
        if name.starts_with("burst-") {
            running.entry(name).or_insert(at);
        }
    }
    let all = running.values().max().map(|t| *t - started).unwrap_or_default();
    let mut each: Vec<Duration> = running.values().map(|t| *t - started).collect();
    each.sort();
    println!(
        "{PODS} pods created at once (creates took {:.2} s): all Running after {:.2} s (p50 {:.2} s)",
        created.as_secs_f64(),
        all.as_secs_f64(),
        percentile(&each, 50.0).as_secs_f64()
    );
    println!("kubelet RSS with {PODS} pods (burst): {:.1} MiB", rss_kib(kubelet_pid) as f64 / 1024.0);
    delete_all(&c).await;
}
