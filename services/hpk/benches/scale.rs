//! Clusters of many bubbles on one machine (`docs/benchmarks.md`, `docs/scale.md`): for each
//! size in `HPK_BENCH_NODES` (default `1,3,10`), on a test host with the image built:
//! - `hpk up --nodes N` to every node Ready and to cluster DNS ready, as `up` reports them, and
//!   its wall time (goal at 10: Ready in under 60 s);
//! - the reachability matrix: a busybox httpd on every node, fetched by every other node's pod
//!   by IP (through the tunnel) and through a Service by name (CoreDNS, kube-proxy); all must
//!   answer, each from the right node;
//! - `hpk down` wall time.
//!
//! For the largest size, 20 s after `up` returned and before the matrix: the memory of every
//! bubble (RSS, PSS and private memory of its processes, from `smaps_rollup`), of each program
//! in a worker bubble, the machine's `MemAvailable` drop per node; the routes and kube-proxy
//! nftables rules in a worker bubble; and the API server's load over 60 s of an idle cluster
//! (`apiserver_request_total` by resource and verb, and the open watches).
//!
//! Run (as root, after `cargo build --workspace --bins && make images`):
//! `cargo bench -p hpk --bench scale`

#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use support::{
    Env, bubble_processes, mem_available_kib, memory_kib, prerequisites, reachability_matrix, reported, text,
};

/// Seconds of idle cluster over which the API server's request rates are taken.
const IDLE_WINDOW: Duration = Duration::from_secs(60);

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio");
    runtime.block_on(run());
}

/// The program a bubble process runs, as the memory tables name it.
fn program(cmdline: &str) -> String {
    let program = cmdline.split_whitespace().next().unwrap_or("").rsplit('/').next().unwrap_or("").to_owned();
    match program.as_str() {
        "hpk" if cmdline.contains("--supervise") => "hpk bubble-init (supervisor)".to_owned(),
        "hpk" => "hpk bubble-init (reaper)".to_owned(),
        "hpk-pod-runtime" if cmdline.contains("log-shim") => "hpk-pod-runtime log-shim".to_owned(),
        _ => program,
    }
}

/// (RSS, PSS, private, anonymous) KiB summed over the processes of a bubble, and by program.
fn bubble_memory(cluster: &str, node: &str) -> ([u64; 4], BTreeMap<String, [u64; 4]>) {
    let mut total = [0; 4];
    let mut by_program: BTreeMap<String, [u64; 4]> = BTreeMap::new();
    for (pid, cmdline) in bubble_processes(cluster, node) {
        let Some(figures) = memory_kib(pid) else { continue };
        let entry = by_program.entry(program(&cmdline)).or_default();
        for i in 0..4 {
            total[i] += figures[i];
            entry[i] += figures[i];
        }
    }
    (total, by_program)
}

/// A row of MiB figures.
fn mib(kib: &[u64; 4]) -> String {
    kib.iter().map(|k| format!("{:.1}", *k as f64 / 1024.0)).collect::<Vec<_>>().join(" | ")
}

/// Lines of `cmd` run in the network namespace of `pid`.
fn lines_in_netns(pid: u32, cmd: &[&str]) -> usize {
    let out = Command::new("nsenter").arg(format!("--net=/proc/{pid}/ns/net")).arg("--").args(cmd).output();
    out.map(|o| String::from_utf8_lossy(&o.stdout).lines().count()).unwrap_or(0)
}

/// `apiserver_request_total` summed by "resource/subresource verb", and the open watches.
fn api_counters(env: &Env, cluster: &str) -> (BTreeMap<String, f64>, f64) {
    let metrics = env.kubectl_ok(cluster, &["get", "--raw", "/metrics"]);
    let label = |labels: &str, name: &str| -> String {
        labels
            .split(',')
            .find_map(|kv| kv.strip_prefix(&format!("{name}=\"")))
            .map(|v| v.trim_end_matches('"').to_owned())
            .unwrap_or_default()
    };
    let mut requests = BTreeMap::new();
    let mut watches = 0.0;
    for line in metrics.lines() {
        let Some((series, value)) = line.rsplit_once(' ') else { continue };
        let Ok(value) = value.parse::<f64>() else { continue };
        if let Some(labels) = series.strip_prefix("apiserver_request_total{") {
            let (resource, sub) = (label(labels, "resource"), label(labels, "subresource"));
            let key = format!(
                "{}{} {}",
                resource,
                if sub.is_empty() { String::new() } else { format!("/{sub}") },
                label(labels, "verb")
            );
            *requests.entry(key).or_insert(0.0) += value;
        } else if let Some(labels) = series.strip_prefix("apiserver_longrunning_requests{")
            && label(labels, "verb") == "WATCH"
        {
            watches += value;
        }
    }
    (requests, watches)
}

struct Row {
    nodes: usize,
    ready: f64,
    dns: f64,
    wall: f64,
    matrix: f64,
    down: f64,
}

async fn run() {
    let Some(image) = prerequisites() else { return };
    let sizes: Vec<usize> = std::env::var("HPK_BENCH_NODES")
        .unwrap_or_else(|_| "1,3,10".into())
        .split(',')
        .map(|n| n.trim().parse().expect("HPK_BENCH_NODES: comma-separated node counts"))
        .collect();
    let largest = sizes.iter().copied().max().unwrap_or(1);
    let env = Env::start(image).await;
    let mut rows = Vec::new();
    for &n in &sizes {
        let name = format!("scale{n}");
        let available_before = mem_available_kib();
        let started = Instant::now();
        let up = env.up(&name, u16::try_from(n).expect("node count"));
        let wall = started.elapsed().as_secs_f64();
        let output = text(&up);
        assert!(up.status.success(), "hpk up --nodes {n}: {output}");
        let (ready, dns) = (reported(&output, "node(s) Ready in "), reported(&output, "cluster DNS in "));
        println!("{n} node(s): Ready {ready:.1} s, DNS {dns:.1} s, up wall {wall:.1} s");
        if n == largest {
            tokio::time::sleep(Duration::from_secs(20)).await;
            let drop = available_before.saturating_sub(mem_available_kib());
            println!(
                "\n{n} nodes, idle 20 s: MemAvailable down {:.0} MiB in all, {:.0} MiB per node\n",
                drop as f64 / 1024.0,
                drop as f64 / 1024.0 / n as f64
            );
            println!(
                "| bubble | processes' RSS MiB | PSS MiB | private MiB | anonymous MiB |\n|---|---|---|---|---|"
            );
            let mut worker_programs = BTreeMap::new();
            for i in 1..=n {
                let node = format!("{name}-{i}");
                let (total, programs) = bubble_memory(&name, &node);
                println!("| {node} | {} |", mib(&total));
                if i == n {
                    worker_programs = programs;
                }
            }
            println!(
                "\n| program in worker bubble {name}-{n} | RSS MiB | PSS MiB | private MiB | anonymous MiB |\n|---|---|---|---|---|"
            );
            for (program, figures) in &worker_programs {
                println!("| {program} | {} |", mib(figures));
            }
            // The bubble's reaper (PID 1 in it) is in the bubble's network namespace; pods are not.
            let processes = bubble_processes(&name, &format!("{name}-{n}"));
            if let Some((pid, _)) = processes.iter().find(|(_, c)| program(c) == "hpk bubble-init (reaper)") {
                println!(
                    "\nworker bubble {name}-{n}: {} routes, {} lines of nftables rules",
                    lines_in_netns(*pid, &["ip", "-o", "route", "show", "table", "all"]),
                    lines_in_netns(*pid, &["nft", "list", "ruleset"])
                );
            }
            let (before, _) = api_counters(&env, &name);
            tokio::time::sleep(IDLE_WINDOW).await;
            let (after, watches) = api_counters(&env, &name);
            let seconds = IDLE_WINDOW.as_secs_f64();
            let mut rates: Vec<(String, f64)> = after
                .iter()
                .map(|(k, v)| (k.clone(), (v - before.get(k).copied().unwrap_or(0.0)) / seconds))
                .filter(|(_, r)| *r > 0.0)
                .collect();
            rates.sort_by(|a, b| b.1.total_cmp(&a.1));
            let total: f64 = rates.iter().map(|r| r.1).sum();
            println!(
                "\nAPI server, idle {n}-node cluster over {seconds:.0} s: {total:.2} requests/s \
                 ({:.3} per node), {watches:.0} open watches ({:.1} per node)\n",
                total / n as f64,
                watches / n as f64
            );
            println!("| resource verb | requests/s |\n|---|---|");
            for (key, rate) in rates.iter().take(15) {
                println!("| {key} | {rate:.3} |");
            }
        }
        let started = Instant::now();
        let matrix = reachability_matrix(&env, &name, n);
        let matrix_seconds = started.elapsed().as_secs_f64();
        println!("\n{n} nodes, reachability ({matrix_seconds:.1} s):\n{}", matrix.table());
        let failures = matrix.failures();
        assert!(failures.is_empty(), "{n} nodes: unreachable:\n{}", failures.join("\n"));
        let started = Instant::now();
        let down = env.down(&name);
        assert!(down.status.success(), "hpk down: {}", text(&down));
        rows.push(Row {
            nodes: n,
            ready,
            dns,
            wall,
            matrix: matrix_seconds,
            down: started.elapsed().as_secs_f64(),
        });
    }
    println!(
        "\n| nodes | `up` → all Ready s | `up` → DNS ready s | `up` wall s | matrix (deploy + fetch) s | `down` s |\n\
         |---|---|---|---|---|---|"
    );
    for r in &rows {
        println!(
            "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |",
            r.nodes, r.ready, r.dns, r.wall, r.matrix, r.down
        );
    }
}
