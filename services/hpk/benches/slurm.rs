//! HPK on a real Slurm (3 test hosts that hide crun, slirp4netns, nsenter, unshare and
//! newuidmap, as a site's), as a user meets it:
//! - `sbatch --nodes=N slurm/hpk.slurm` from the unpacked release bundle → every node Ready
//!   (seen by kubectl), for N = 1 and 3 (goal < 30 s for 3, and no slower than 1.1× the
//!   development path), and → the job saying the cluster is up (cluster DNS ready too);
//! - the development path in the same run: the repository's script with `HPK_BIN` (the glibc
//!   debug build) and `HPK_IMAGE`, 3 nodes;
//! - a pod created → Running on a worker node: the first (its image pulled) and a second;
//! - `scancel` → nothing of the job left on any host;
//! - baseline in the same run: `hpk up --nodes 3` on one host without Slurm.
//!
//! Run (as root, after `cargo build --workspace --bins && make images && make dist
//! PROFILE=debug`): `cargo bench -p hpk --bench slurm`

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use support::slurm::SlurmEnv;
use support::{Env, prerequisites, text};

const RUNS: usize = 3;

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio");
    runtime.block_on(run());
}

fn ready_count(env: &SlurmEnv, id: u32) -> usize {
    let out = env.kubectl(
        id,
        &[
            "get",
            "nodes",
            "-o",
            "jsonpath={range .items[*]}{.status.conditions[?(@.type==\"Ready\")].status}{\"\\n\"}{end}",
        ],
    );
    String::from_utf8_lossy(&out.stdout).lines().filter(|l| *l == "True").count()
}

/// Seconds from `t0` until `check` holds, polling every 50 ms (bounded).
fn until(t0: Instant, within: Duration, mut check: impl FnMut() -> bool) -> f64 {
    while !check() {
        assert!(t0.elapsed() < within, "not within {within:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    t0.elapsed().as_secs_f64()
}

fn pod_running(env: &SlurmEnv, id: u32, pod: &str) -> bool {
    let out = env.kubectl(id, &["get", "pod", pod, "-o", "jsonpath={.status.phase}"]);
    out.stdout == b"Running"
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

async fn run() {
    let Some(image) = prerequisites() else { return };
    if !hpk_integration::tools_present(&["slurmctld", "slurmd", "munged", "sbatch", "srun"]) {
        return;
    }
    let env = SlurmEnv::start(3).await;
    let mut dev_ready = Vec::new();
    let (mut ready, mut up, mut first_pod, mut second_pod, mut clean) = (
        [Vec::new(), Vec::new()],
        [Vec::new(), Vec::new()],
        Vec::new(),
        Vec::new(),
        [Vec::new(), Vec::new()],
    );
    for run in 1..=RUNS {
        // The development path first, then the bundle's (the image cache is warm for both).
        let t0 = Instant::now();
        let id = env.submit_dev(&["--nodes=3"]).expect("sbatch (development path)");
        let kubeconfig = env.kubeconfig(id);
        let r = until(t0, Duration::from_secs(300), || kubeconfig.is_file() && ready_count(&env, id) == 3);
        env.wait_up(id, t0);
        dev_ready.push(r);
        env.cancel(id, &[]);
        env.wait_clean(id, Duration::from_secs(120));
        println!("run {run}, 3 node(s), development path: Ready {r:.1} s");
        for (slot, nodes) in [1usize, 3].into_iter().enumerate() {
            let t0 = Instant::now();
            let id = env.submit(&[&format!("--nodes={nodes}")]).expect("sbatch");
            let kubeconfig = env.kubeconfig(id);
            let r = until(t0, Duration::from_secs(300), || {
                kubeconfig.is_file() && ready_count(&env, id) == nodes
            });
            let u = env.wait_up(id, t0).as_secs_f64();
            ready[slot].push(r);
            up[slot].push(u);
            let mut line = format!("run {run}, {nodes} node(s): Ready {r:.1} s, job says up {u:.1} s");
            if nodes == 3 {
                for (i, times) in [&mut first_pod, &mut second_pod].into_iter().enumerate() {
                    let pod = format!("p{i}");
                    env.apply(
                        id,
                        &format!(
                            "apiVersion: v1
kind: Pod
metadata: {{name: {pod}}}
spec:
  nodeSelector: {{kubernetes.io/hostname: node3}}
  terminationGracePeriodSeconds: 1
  containers: [{{name: c, image: {}, command: [sleep, '3600']}}]
",
                            env.shell
                        ),
                    );
                    // From `kubectl apply` returning: the API server has the pod.
                    let t = Instant::now();
                    times.push(until(t, Duration::from_secs(120), || pod_running(&env, id, &pod)));
                }
                line.push_str(&format!(
                    ", pod → Running on node3 {:.2} s (image pulled) / {:.2} s",
                    first_pod.last().unwrap_or(&f64::NAN),
                    second_pod.last().unwrap_or(&f64::NAN)
                ));
            }
            let t = Instant::now();
            env.cancel(id, &[]);
            env.wait_clean(id, Duration::from_secs(120));
            clean[slot].push(t.elapsed().as_secs_f64());
            println!("{line}, scancel → clean {:.1} s", t.elapsed().as_secs_f64());
        }
    }
    drop(env);

    // The baseline: the same bubbles started by `hpk up` on one host, no Slurm.
    let local = Env::start(image).await;
    let mut baseline = Vec::new();
    for run in 1..=RUNS {
        let name = format!("base{run}");
        let out = local.up(&name, 3);
        let output = text(&out);
        assert!(out.status.success(), "hpk up: {output}");
        let seconds: f64 = output
            .split("node(s) Ready in ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(f64::NAN);
        println!("baseline run {run}: hpk up --nodes 3 → Ready {seconds:.1} s");
        baseline.push(seconds);
        let down = local.down(&name);
        assert!(down.status.success(), "hpk down: {}", text(&down));
    }

    println!("\n| what (median of {RUNS}) | 1 node | 3 nodes |\n|---|---|---|");
    println!(
        "| `sbatch` from the bundle → every node Ready, seen by kubectl (goal < 30 s for 3) | {:.1} s | {:.1} s |",
        median(ready[0].clone()),
        median(ready[1].clone())
    );
    let (bundle, dev) = (median(ready[1].clone()), median(dev_ready));
    println!(
        "| same run, development path (`HPK_BIN`, `HPK_IMAGE`) → every node Ready | | {dev:.1} s (bundle/development {:.2}×, goal ≤ 1.10×) |",
        bundle / dev
    );
    println!(
        "| `sbatch` → the job says the cluster is up (cluster DNS ready too) | {:.1} s | {:.1} s |",
        median(up[0].clone()),
        median(up[1].clone())
    );
    println!(
        "| `scancel` → no process, socket or file of the job on any host | {:.1} s | {:.1} s |",
        median(clean[0].clone()),
        median(clean[1].clone())
    );
    println!("| pod created → Running on a worker, image pulled | | {:.2} s |", median(first_pod));
    println!("| pod created → Running on a worker, image present | | {:.2} s |", median(second_pod));
    println!("| baseline: `hpk up --nodes 3` on one host → every node Ready | | {:.1} s |", median(baseline));
}
