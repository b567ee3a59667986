//! HPK on Slurm: what `slurm/hpk.slurm` runs.
//!
//! ```text
//!  batch step (first node)                 job step "bubbles": one task per node (srun)
//!  hpk slurm job                           hpk slurm node   (node 0: controller, others: workers)
//!   1. srun … hpk slurm preflight  ──────►  each node checks tun, user namespaces, its state
//!      (fails the job in seconds,           filesystem, overlayfs, the image, its address and
//!       naming the node and the fix)        free ports
//!   2. srun … hpk slurm node  ───────────►  `hpk bubble` in the task: runs until signalled
//!   3. waits for the kubeconfig, N nodes
//!      Ready and CoreDNS; links
//!      ~/.hpk/kubeconfig → ~/.hpk/<jobid>/kubeconfig
//!   4. on SIGTERM (the time limit's `--signal=B:TERM@120`, `scancel --batch --signal=TERM`)
//!      or SIGINT: cordons every node, deletes every pod with its own grace period and waits
//!      (bounded), then stops the bubbles' step (`scancel --signal=TERM JOB.STEP`) and
//!      removes the cluster's files.
//! ```
//!
//! The cluster is named after the job: `~/.hpk/<jobid>/`. A plain `scancel` signals every
//! process of the job at once (Slurm's process tracking), pods included: then the bubbles
//! stop at once, and the batch step still removes the files.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};

use crate::bubble::{self, NodeOptions, Role};
use crate::cluster::{self, Shared};
use crate::error::{Error, Result};
use crate::local::{done, step};
use crate::{image, preflight};

/// How long the control plane may take to write the kubeconfig.
const CONTROL_PLANE_BOUND: Duration = Duration::from_secs(180);
/// How long the bubbles' step may take to stop once signalled: a bubble's stop grace and
/// sweep, with margin. With the drain's default it fits in the batch script's signal lead
/// (`--signal=B:TERM@120`; review L8: Slurm kills what is left at the time limit, KillWait
/// later).
pub(crate) const STEP_STOP_BOUND: Duration = Duration::from_secs(50);
/// The drain's default bound (`--drain-seconds`).
const DRAIN_DEFAULT_SECS: u64 = 50;
/// The name of the job step that runs the bubbles.
const BUBBLES_STEP: &str = "hpk-bubbles";
/// Each call to the API server during the graceful end.
const CALL_BOUND: Duration = Duration::from_secs(5);

/// `hpk slurm …`: the parts of `slurm/hpk.slurm`.
#[derive(Debug, clap::Subcommand)]
pub enum SlurmCmd {
    /// The batch step: start one bubble per allocated node, wait until the cluster is ready,
    /// and end it gracefully on SIGTERM.
    Job(JobArgs),
    /// A task of the first job step, one per node: check this node's prerequisites.
    Preflight(NodeArgs),
    /// A task of the bubbles' job step, one per node: run this node's bubble until signalled.
    Node(NodeArgs),
}

/// `hpk slurm job` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct JobArgs {
    /// What every node of the cluster is started with.
    #[command(flatten)]
    pub options: NodeOptions,
    /// The hpk-bubble image (OCI layout directory or oci-archive), readable on every node.
    #[arg(long, env = "HPK_IMAGE")]
    pub image: PathBuf,
    /// The longest the graceful end waits for pods to terminate before stopping the bubbles.
    #[arg(long, default_value_t = DRAIN_DEFAULT_SECS, value_parser = clap::value_parser!(u64).range(0..=3600))]
    pub drain_seconds: u64,
}

/// `hpk slurm preflight` / `hpk slurm node` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct NodeArgs {
    /// What every node of the cluster is started with.
    #[command(flatten)]
    pub options: NodeOptions,
    /// The hpk-bubble image (OCI layout directory or oci-archive).
    #[arg(long, env = "HPK_IMAGE")]
    pub image: PathBuf,
    /// The address to publish this node on [default: the address its host name resolves to
    /// on this host, else its first global IPv4 address].
    #[arg(long, env = "HPK_ADDRESS")]
    pub address: Option<Ipv4Addr>,
}

/// What Slurm tells a job's processes about it.
#[derive(Debug, Clone)]
struct SlurmEnv {
    job_id: String,
    nodes: usize,
}

impl SlurmEnv {
    fn from_env() -> Result<Self> {
        let var = |name: &str| {
            std::env::var(name).map_err(|_| Error::Prerequisite {
                what: format!("{name} is not set: this runs inside a Slurm job"),
                fix: "submit it with `sbatch --nodes=N slurm/hpk.slurm`; for a cluster on this machine use `hpk up`"
                    .into(),
            })
        };
        let job_id = var("SLURM_JOB_ID")?;
        let nodes = var("SLURM_JOB_NUM_NODES")
            .or_else(|_| var("SLURM_NNODES"))?
            .parse()
            .map_err(|e| Error::Invalid(format!("SLURM_JOB_NUM_NODES: {e}")))?;
        Ok(Self { job_id, nodes })
    }
}

/// The node's name in the cluster: Slurm's name for it, lower-cased.
fn node_name() -> Result<String> {
    let name = std::env::var("SLURMD_NODENAME").unwrap_or_else(|_| bubble::hostname());
    let name = name.split('.').next().unwrap_or_default().to_ascii_lowercase();
    cluster::check_label(&name, "node name")?;
    Ok(name)
}

/// The address this node is published on: `--address`, else the one its host name resolves
/// to if this host has it, else the first global IPv4 address.
fn node_address(args: &NodeArgs) -> Result<Ipv4Addr> {
    if let Some(a) = args.address {
        return Ok(a);
    }
    let local = local_addresses();
    let resolved = std::net::ToSocketAddrs::to_socket_addrs(&(bubble::hostname().as_str(), 0))
        .map(|addrs| {
            addrs
                .filter_map(|a| match a.ip() {
                    std::net::IpAddr::V4(v4) => Some(v4),
                    std::net::IpAddr::V6(_) => None,
                })
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    if let Some(a) = resolved.into_iter().find(|a| !a.is_loopback() && local.contains(a)) {
        return Ok(a);
    }
    crate::local::default_address()
}

/// This host's IPv4 addresses.
fn local_addresses() -> Vec<Ipv4Addr> {
    crate::local::ipv4_addresses().into_iter().map(|(_, ip)| ip).collect()
}

/// `hpk slurm preflight`: prints one line naming this node, and fails with the fix.
pub fn preflight_node(args: &NodeArgs) -> Result<i32> {
    let node = node_name().unwrap_or_else(|_| bubble::hostname());
    match check_node(args) {
        Ok(address) => {
            println!("hpk: node {node}: ready to start (address {address})");
            Ok(0)
        }
        Err(e) => {
            eprintln!("hpk: node {node}: {e}");
            Ok(2)
        }
    }
}

fn check_node(args: &NodeArgs) -> Result<Ipv4Addr> {
    node_name()?;
    preflight::check_all(&cluster::state_base())?;
    std::fs::metadata(&args.image).map_err(|e| Error::Image {
        path: args.image.clone(),
        reason: format!("{e}: it must be readable on every node (a shared file system), or set HPK_IMAGE"),
    })?;
    let address = node_address(args)?;
    for what in ["TCP", "UDP"] {
        let bound = if what == "TCP" {
            std::net::TcpListener::bind((address, 0)).map(drop)
        } else {
            std::net::UdpSocket::bind((address, 0)).map(drop)
        };
        bound.map_err(|e| Error::Prerequisite {
            what: format!("cannot bind a {what} port on {address}: {e}"),
            fix: "free some ports (net.ipv4.ip_local_port_range), or set HPK_ADDRESS to another of this node's addresses".into(),
        })?;
    }
    Ok(address)
}

/// `hpk slurm node`: this node's bubble, until the step is signalled. Must run before any
/// thread starts (see [`bubble::run`]).
pub fn node(args: &NodeArgs) -> Result<i32> {
    let env = SlurmEnv::from_env()?;
    let result = (|| {
        let node = node_name()?;
        let role =
            if std::env::var("SLURM_NODEID").as_deref() == Ok("0") { Role::Controller } else { Role::Worker };
        let address = node_address(args)?;
        Ok::<_, Error>(bubble::BubbleArgs {
            options: args.options.clone(),
            cluster: env.job_id.clone(),
            node,
            role,
            address,
            image: args.image.clone(),
            client_ca_file: None,
        })
    })()
    .and_then(|bubble_args| bubble::run(&bubble_args));
    if let Err(e) = &result {
        // The batch step waits for this node: tell it why it will never come.
        if let Ok(shared) = Shared::new(&env.job_id) {
            let node = node_name().unwrap_or_else(|_| bubble::hostname());
            let _ = cluster::write_file(&failed_file(&shared, &node), format!("{e}\n").as_bytes(), 0o644);
        }
    }
    result
}

fn failed_file(shared: &Shared, node: &str) -> PathBuf {
    shared.dir.join(format!("failed-{node}"))
}

/// The first failure a node reported, as an error.
fn node_failure(shared: &Shared) -> Result<()> {
    let Ok(entries) = std::fs::read_dir(&shared.dir) else { return Ok(()) };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(node) = name.strip_prefix("failed-") {
            let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
            return Err(Error::Failed {
                what: format!("the bubble of node {node}"),
                detail: text.trim().to_owned(),
            });
        }
    }
    Ok(())
}

/// `hpk slurm job`: the batch step. Returns the job's exit code.
pub async fn job(args: &JobArgs) -> Result<i32> {
    use tokio::signal::unix::{SignalKind, signal};
    let env = SlurmEnv::from_env()?;
    let shared = Shared::new(&env.job_id)?;
    // A --bind that cannot be bound fails the job here, before any node starts.
    let (binds, warnings) = bubble::binds::resolve_here(&args.options.explicit_binds(true)?)?;
    for warning in &warnings {
        println!("hpk: warning: {warning}");
    }
    let exe = std::env::current_exe().map_err(|e| Error::io("find", "this program", e))?;
    let t0 = Instant::now();
    println!(
        "HPK {} — job {}: a Kubernetes cluster on {} node(s), image {}",
        env!("CARGO_PKG_VERSION"),
        env.job_id,
        env.nodes,
        args.image.display()
    );
    for bind in &binds {
        println!("hpk: every node sees {}", bind);
    }
    let mut term = signal(SignalKind::terminate()).map_err(|e| Error::io("watch", "SIGTERM", e))?;
    let mut int = signal(SignalKind::interrupt()).map_err(|e| Error::io("watch", "SIGINT", e))?;

    // Certificates live as long as the job may (review L1).
    let mut options = args.options.clone();
    if options.lifetime.is_none() {
        options.lifetime = time_left(&env).await;
    }
    step("checking every node's prerequisites");
    let mut preflight = srun(&env, "hpk-preflight");
    preflight.arg(&exe).args(["slurm", "preflight", "--image"]).arg(&args.image);
    preflight.args(options.to_args());
    let status = tokio::select! {
        s = preflight.status() => s.map_err(|e| Error::io("run", "srun (the preflight step)", e))?,
        _ = term.recv() => return Ok(143),
        _ = int.recv() => return Ok(130),
    };
    if !status.success() {
        eprintln!("hpk: a node lacks a prerequisite (named above, with its fix); nothing was started");
        return Ok(2);
    }
    done(&format!("{} node(s) ready to start ({:.1} s)", env.nodes, t0.elapsed().as_secs_f64()));

    shared.remove()?;
    image::create_private_dir(&shared.dir)?;
    step("starting one bubble per node");
    let mut bubbles = srun(&env, BUBBLES_STEP);
    // A node that fails later is a node failure of the cluster, not the end of the others.
    bubbles.arg("--kill-on-bad-exit=0").arg(&exe).args(["slurm", "node", "--image"]).arg(&args.image);
    bubbles.args(options.to_args());
    // The cluster's node-token key: in the step's environment, which Slurm carries to each
    // node's launcher over its own authenticated channel, never on the shared filesystem (review
    // M4). Each launcher gives its bubble only its own node's token (review H3).
    bubbles.env(cluster::NODE_TOKEN_KEY_ENV, cluster::new_node_token_key()?);
    let mut step_child = bubbles.spawn().map_err(|e| Error::io("start", "srun (the bubbles' step)", e))?;

    let ready = tokio::select! {
        r = wait_ready(&shared, &env, t0) => r,
        s = step_child.wait() => Err(Error::Failed {
            what: "the bubbles' job step".into(),
            detail: format!("srun ended ({}) before the cluster was ready; see the messages above",
                s.map(|s| s.to_string()).unwrap_or_default()),
        }),
        _ = term.recv() => Err(Error::Invalid("SIGTERM before the cluster was ready".into())),
        _ = int.recv() => Err(Error::Invalid("SIGINT before the cluster was ready".into())),
    };
    if let Err(e) = ready {
        eprintln!("hpk: {e}");
        stop_step(&env, &mut step_child).await;
        remove_files(&shared);
        return Ok(1);
    }
    let link = link_kubeconfig(&shared).unwrap_or_else(|e| {
        eprintln!("hpk: could not link ~/.hpk/kubeconfig ({e}): use the cluster's own");
        shared.kubeconfig()
    });
    println!(
        "\nCluster {} is up: {} node(s) Ready, cluster DNS ready, {:.1} s after the job started.\n",
        shared.name,
        env.nodes,
        t0.elapsed().as_secs_f64()
    );
    println!("export KUBECONFIG={}", link.display());
    println!("kubectl get nodes -o wide\n");
    crate::local::print_status(&shared).await;
    println!(
        "\nThe cluster ends with the job: at its time limit, or `scancel --batch --signal=TERM {}` (graceful).",
        env.job_id
    );

    // Asked to end (exit 0), or every bubble gone by itself (the cluster failed: exit 1).
    let (why, code) = tokio::select! {
        _ = term.recv() => ("SIGTERM".to_owned(), 0),
        _ = int.recv() => ("SIGINT".to_owned(), 0),
        s = step_child.wait() => (format!("the bubbles' step ended ({})", s.map(|s| s.to_string()).unwrap_or_default()), 1),
    };
    let t_end = Instant::now();
    println!("hpk: job ending ({why}): cordoning the nodes and letting the pods terminate");
    drain(&shared, &mut step_child, Duration::from_secs(args.drain_seconds)).await;
    println!("hpk: stopping the bubbles");
    stop_step(&env, &mut step_child).await;
    remove_files(&shared);
    println!("hpk: cluster {} ended and removed ({:.1} s)", shared.name, t_end.elapsed().as_secs_f64());
    Ok(code)
}

/// An srun for one task per node of the job.
fn srun(env: &SlurmEnv, name: &str) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new("srun");
    cmd.arg(format!("--job-name={name}"))
        .arg(format!("--nodes={}", env.nodes))
        .arg(format!("--ntasks={}", env.nodes))
        .arg("--ntasks-per-node=1")
        .arg("--export=ALL")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    cmd
}

async fn wait_ready(shared: &Shared, env: &SlurmEnv, t0: Instant) -> Result<()> {
    let deadline = Instant::now() + CONTROL_PLANE_BOUND;
    while !shared.kubeconfig().is_file() {
        node_failure(shared)?;
        if Instant::now() >= deadline {
            return Err(Error::NotReady {
                what: "the control plane".into(),
                seconds: CONTROL_PLANE_BOUND.as_secs(),
                detail: "see the first node's messages above".into(),
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    done(&format!("control plane ready ({:.1} s)", t0.elapsed().as_secs_f64()));
    let client = crate::init::client(&shared.kubeconfig()).await?;
    let mut alive = || node_failure(shared);
    crate::local::wait_nodes_ready(client.clone(), env.nodes, &|_| true, &mut alive, t0).await?;
    step("waiting for cluster DNS (CoreDNS)");
    crate::local::wait_coredns(client, &mut alive).await?;
    done(&format!("cluster DNS ready ({:.1} s)", t0.elapsed().as_secs_f64()));
    Ok(())
}

/// `~/.hpk/kubeconfig` → this cluster's kubeconfig (replaced atomically).
fn link_kubeconfig(shared: &Shared) -> Result<PathBuf> {
    let home = cluster::hpk_home()?;
    let link = home.join("kubeconfig");
    let tmp = home.join(format!(".kubeconfig.{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(shared.kubeconfig(), &tmp).map_err(|e| Error::io("link", tmp.display(), e))?;
    std::fs::rename(&tmp, &link).map_err(|e| Error::io("link", link.display(), e))?;
    Ok(link)
}

/// Cordons every node and deletes every pod with its own grace period; waits until those pods
/// are gone, the bubbles' step ends (a plain `scancel` signals them too), or `bound` passes.
/// Every failure is reported and skipped: the bubbles are stopped afterwards whatever happens.
async fn drain(shared: &Shared, step_child: &mut tokio::process::Child, bound: Duration) {
    tokio::select! {
        () = drain_pods(shared, bound) => {}
        _ = step_child.wait() => eprintln!("hpk: the bubbles stopped before every pod had terminated"),
    }
}

async fn drain_pods(shared: &Shared, bound: Duration) {
    let deadline = Instant::now() + bound;
    let client = match tokio::time::timeout(CALL_BOUND, crate::init::client(&shared.kubeconfig())).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => return eprintln!("hpk: no API client, skipping the drain: {e}"),
        Err(_) => {
            return eprintln!("hpk: no API client within {} s, skipping the drain", CALL_BOUND.as_secs());
        }
    };
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::all(client.clone());
    let cordon = serde_json::json!({"spec": {"unschedulable": true}});
    match tokio::time::timeout(CALL_BOUND, nodes.list(&ListParams::default())).await {
        Ok(Ok(list)) => {
            for n in list.items {
                let name = n.metadata.name.unwrap_or_default();
                let patched = tokio::time::timeout(
                    CALL_BOUND,
                    nodes.patch(&name, &PatchParams::default(), &Patch::Merge(&cordon)),
                )
                .await;
                match patched {
                    Ok(Ok(_)) => done(&format!("node {name} cordoned")),
                    Ok(Err(e)) => eprintln!("hpk: cordon {name}: {e}"),
                    Err(_) => eprintln!("hpk: cordon {name}: no answer within {} s", CALL_BOUND.as_secs()),
                }
            }
        }
        Ok(Err(e)) => return eprintln!("hpk: listing nodes failed, skipping the drain: {e}"),
        Err(_) => return eprintln!("hpk: the API server did not answer, skipping the drain"),
    }
    let list = match tokio::time::timeout(CALL_BOUND, pods.list(&ListParams::default())).await {
        Ok(Ok(list)) => list.items,
        _ => return eprintln!("hpk: listing pods failed, skipping their graceful termination"),
    };
    let mut waiting = Vec::new();
    for pod in list {
        let (Some(ns), Some(name)) = (pod.metadata.namespace.clone(), pod.metadata.name.clone()) else {
            continue;
        };
        if pod.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none() {
            continue;
        }
        let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
        match tokio::time::timeout(CALL_BOUND, api.delete(&name, &DeleteParams::default())).await {
            Ok(Ok(_)) => waiting.push((ns, name, pod.metadata.uid.unwrap_or_default())),
            Ok(Err(kube::Error::Api(e))) if e.code == 404 => {}
            Ok(Err(e)) => eprintln!("hpk: delete pod {ns}/{name}: {e}"),
            Err(_) => eprintln!("hpk: delete pod {ns}/{name}: no answer"),
        }
    }
    println!(
        "  • {} pod(s) terminating (each within its grace period, at most {} s)",
        waiting.len(),
        bound.as_secs()
    );
    loop {
        let listed = tokio::time::timeout(CALL_BOUND, pods.list(&ListParams::default())).await;
        if let Ok(Ok(list)) = listed {
            let present: std::collections::HashSet<String> =
                list.items.into_iter().filter_map(|p| p.metadata.uid).collect();
            waiting.retain(|(_, _, uid)| present.contains(uid));
            if waiting.is_empty() {
                done("every pod terminated");
                return;
            }
        }
        if Instant::now() >= deadline {
            let names: Vec<String> = waiting.iter().map(|(ns, n, _)| format!("{ns}/{n}")).collect();
            eprintln!(
                "hpk: still terminating after {} s, stopping anyway: {}",
                bound.as_secs(),
                names.join(", ")
            );
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Stops the bubbles' step: SIGTERM to each of its tasks through Slurm (`scancel
/// --signal=TERM JOB.STEP`), so that every launcher tears its bubble down; srun itself must
/// not be signalled: it would end the step with SIGKILL. SIGKILL to srun after
/// [`STEP_STOP_BOUND`].
async fn stop_step(env: &SlurmEnv, step_child: &mut tokio::process::Child) {
    if let Ok(Some(_)) = step_child.try_wait() {
        return;
    }
    let step = bubbles_step(env).await;
    let signalled = tokio::process::Command::new("scancel")
        .arg("--signal=TERM")
        .arg(&step)
        .stdin(std::process::Stdio::null())
        .status()
        .await;
    if !signalled.is_ok_and(|s| s.success()) {
        eprintln!("hpk: scancel --signal=TERM {step} failed: signalling srun instead");
        if let Some(pid) = step_child.id() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
    }
    if tokio::time::timeout(STEP_STOP_BOUND, step_child.wait()).await.is_err() {
        eprintln!("hpk: the bubbles did not stop within {} s: killing the step", STEP_STOP_BOUND.as_secs());
        let _ = step_child.kill().await;
    }
}

/// The time the job has left (squeue's `%L`), plus the margin Slurm's signal lead and
/// teardown need; `None` where the job has no limit (the default lifetime applies).
async fn time_left(env: &SlurmEnv) -> Option<Duration> {
    let listed = tokio::process::Command::new("squeue")
        .args(["--noheader", "--format=%L"])
        .arg(format!("--jobs={}", env.job_id))
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .ok()?;
    let left = cluster::parse_slurm_time_left(&String::from_utf8_lossy(&listed.stdout))?;
    Some(left + Duration::from_secs(3600))
}

/// `JOB.STEP` of the bubbles' step, as squeue lists it (by its name), else the second step
/// of the job (the first is the preflight).
async fn bubbles_step(env: &SlurmEnv) -> String {
    let listed = tokio::process::Command::new("squeue")
        .args(["--steps", "--noheader", "--format=%i %j"])
        .arg(format!("--jobs={}", env.job_id))
        .stdin(std::process::Stdio::null())
        .output()
        .await;
    let text = listed.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default();
    text.lines()
        .filter_map(|l| l.split_once(' '))
        .find(|(_, name)| name.trim() == BUBBLES_STEP)
        .map(|(id, _)| id.to_owned())
        .unwrap_or_else(|| format!("{}.1", env.job_id))
}

/// Removes the cluster's shared directory, and `~/.hpk/kubeconfig` if it points at it.
fn remove_files(shared: &Shared) {
    if let Ok(home) = cluster::hpk_home() {
        let link = home.join("kubeconfig");
        if std::fs::read_link(&link).is_ok_and(|target| target == shared.kubeconfig()) {
            let _ = std::fs::remove_file(&link);
        }
    }
    if let Err(e) = shared.remove() {
        eprintln!("hpk: could not remove the cluster's files: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Review L8: the graceful end — the drain, then the bubbles' step stopping (each bubble's
    /// stop grace and sweep inside it) — fits in the lead time the batch script asks Slurm
    /// for, with margin, so Slurm's kill at the time limit finds nothing left to remove.
    #[test]
    fn the_graceful_end_fits_in_the_signal_lead_with_margin() {
        let script = include_str!("../../../slurm/hpk.slurm");
        let lead: u64 = script
            .lines()
            .find_map(|l| l.strip_prefix("#SBATCH --signal=B:TERM@"))
            .and_then(|n| n.trim().parse().ok())
            .expect("hpk.slurm asks for --signal=B:TERM@<seconds>");
        let bubble = crate::bubble::STOP_GRACE + crate::bubble::SWEEP_BOUND;
        assert!(
            bubble + Duration::from_secs(5) <= STEP_STOP_BOUND,
            "a bubble's stop {bubble:?} in {STEP_STOP_BOUND:?}"
        );
        let end = Duration::from_secs(DRAIN_DEFAULT_SECS) + STEP_STOP_BOUND;
        let margin = Duration::from_secs(15);
        assert!(
            end + margin <= Duration::from_secs(lead),
            "the graceful end {end:?} + {margin:?} in a {lead} s lead"
        );
    }

    fn shared(dir: &std::path::Path) -> Shared {
        Shared { name: "42".into(), dir: dir.to_owned() }
    }

    #[test]
    fn a_node_failure_file_ends_the_wait_with_its_message() {
        let dir = tempfile::tempdir().expect("tempdir");
        let shared = shared(dir.path());
        assert!(node_failure(&shared).is_ok(), "nothing failed yet");
        std::fs::write(dir.path().join("kubeconfig"), "").expect("write");
        assert!(node_failure(&shared).is_ok(), "other files are not failures");
        std::fs::write(failed_file(&shared, "node2"), "crun create (the bubble) failed: no space\n")
            .expect("write");
        let e = node_failure(&shared).expect_err("node2 failed");
        assert_eq!(
            e.to_string(),
            "the bubble of node node2 failed: crun create (the bubble) failed: no space"
        );
    }

    #[test]
    fn a_missing_directory_is_no_failure() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(node_failure(&shared(&dir.path().join("absent"))).is_ok());
    }

    #[test]
    fn the_job_flags_parse_and_bad_ones_are_refused() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(subcommand)]
            cmd: SlurmCmd,
        }
        let cli = Cli::try_parse_from([
            "hpk",
            "job",
            "--image",
            "/x.tar",
            "--drain-seconds",
            "30",
            "--insecure-registry=r:5000",
        ])
        .expect("valid flags");
        let SlurmCmd::Job(args) = cli.cmd else { panic!("not job") };
        assert_eq!(args.drain_seconds, 30);
        assert_eq!(args.options.insecure_registries, ["r:5000"]);
        assert!(Cli::try_parse_from(["hpk", "job", "--image", "/x", "--drain-seconds", "-1"]).is_err());
        assert!(Cli::try_parse_from(["hpk", "job", "--image", "/x", "--drain-seconds", "3601"]).is_err());
        assert!(Cli::try_parse_from(["hpk", "node", "--image", "/x", "--address", "not-an-ip"]).is_err());
    }
}
