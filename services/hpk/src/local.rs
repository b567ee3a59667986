//! `hpk up`, `hpk down`, `hpk status`: a cluster of bubbles on this machine, the way kind and
//! k3d give one — the first bubble the controller, every bubble a node.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::ListParams;

use crate::bubble::{self, NodeOptions, process_alive, tail};
use crate::cluster::{self, Shared};
use crate::error::{Error, Result};
use crate::hosttools::HostTools;
use crate::{image, preflight};

const CONTROL_PLANE_BOUND: Duration = Duration::from_secs(180);
const NODES_BOUND: Duration = Duration::from_secs(180);
const DOWN_BOUND: Duration = Duration::from_secs(60);
const DNS_BOUND: Duration = Duration::from_secs(120);

/// `hpk up` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct UpArgs {
    /// What every node of the cluster is started with.
    #[command(flatten)]
    pub options: NodeOptions,
    /// How many nodes (bubbles); the first is also the controller.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub nodes: u16,
    /// The cluster's name: files in ~/.hpk/<name>, nodes <name>-1 … <name>-N.
    #[arg(long, default_value = cluster::DEFAULT_NAME)]
    pub name: String,
    /// The hpk-bubble image (OCI layout directory or oci-archive).
    #[arg(long, env = "HPK_IMAGE")]
    pub image: Option<PathBuf>,
    /// The host address to publish on [default: the first global IPv4 address].
    #[arg(long)]
    pub address: Option<Ipv4Addr>,
}

/// `hpk down` / `hpk status` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct NameArgs {
    /// The cluster's name.
    #[arg(long, default_value = cluster::DEFAULT_NAME)]
    pub name: String,
}

/// The image `hpk up` uses without `--image`: `target/images/hpk-bubble` beside the binary's
/// build tree, or `<prefix>/share/hpk/hpk-bubble[.oci.tar]` of an installation (`make dist`).
pub fn default_image() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    let mut candidates = Vec::new();
    for dir in exe.ancestors().skip(1).take(3) {
        candidates.push(dir.join("images/hpk-bubble"));
        candidates.push(dir.join("share/hpk/hpk-bubble"));
        candidates.push(dir.join("share/hpk/hpk-bubble.oci.tar"));
    }
    // An image layout has an index.json (the source tree's images/hpk-bubble has not).
    candidates
        .iter()
        .find(|c| {
            c.join("index.json").is_file() || (c.extension().is_some_and(|e| e == "tar") && c.is_file())
        })
        .cloned()
        .unwrap_or_else(|| PathBuf::from("target/images/hpk-bubble"))
}

/// `hpk up`.
pub async fn up(args: &UpArgs) -> Result<()> {
    let shared = Shared::new(&args.name)?;
    if shared.nodes().iter().flatten().any(|n| process_alive(n.launcher_pid))
        || launchers(&shared).iter().any(|p| process_alive(*p))
    {
        return Err(Error::Invalid(format!(
            "cluster {} is already running; `hpk status --name {0}`, or `hpk down --name {0}` first",
            args.name
        )));
    }
    step("checking prerequisites");
    // A --bind that cannot be bound fails here, before anything is made.
    let (_, warnings) = bubble::binds::resolve_here(&args.options.explicit_binds(true)?)?;
    for warning in &warnings {
        eprintln!("hpk: warning: {warning}");
    }
    preflight::check_all(&cluster::state_base())?;
    let image_path = args.image.clone().unwrap_or_else(default_image);
    step(&format!("unpacking the image {}", image_path.display()));
    let started = Instant::now();
    let unpacked = image::unpack(&image_path, &cluster::image_cache())?;
    HostTools::new(&unpacked.rootfs)?;
    done(&format!("image {} ({:.1} s)", short(&unpacked.digest), started.elapsed().as_secs_f64()));
    let address = match args.address {
        Some(a) => a,
        None => default_address()?,
    };
    // A fresh shared directory: nothing of an earlier run may be taken for this one's.
    shared.remove()?;
    image::create_private_dir(&shared.dir)?;
    let result = start_nodes(args, &shared, &image_path, address).await;
    if let Err(e) = result {
        eprintln!("hpk up failed: {e}");
        // The node directories go with the cleanup: show what their logs said first.
        print_log_tails(&shared);
        eprintln!("cleaning up …");
        let _ = down_cluster(&shared, false);
        return Err(e);
    }
    Ok(())
}

async fn start_nodes(args: &UpArgs, shared: &Shared, image: &Path, address: Ipv4Addr) -> Result<()> {
    let t0 = Instant::now();
    let names: Vec<String> = (1..=args.nodes).map(|i| format!("{}-{i}", args.name)).collect();
    // The cluster's node-token key, handed to each launcher in its environment only.
    let token_key = cluster::new_node_token_key()?;
    // The machine's GPUs (or the allocation's, inside a Slurm job), shared out: no two nodes
    // get the same device.
    let env = |k: &str| std::env::var(k).ok();
    let listed =
        [bubble::gpus::GPUS_ENV, "SLURM_STEP_GPUS", "SLURM_JOB_GPUS"].iter().any(|v| env(v).is_some());
    let machine_gpus = match listed {
        true => bubble::gpus::allocated(&env)?,
        false => bubble::gpus::on_this_machine(&bubble::gpus::host(&env).dev_dir, &env),
    };
    let shares = bubble::gpus::share_out(&machine_gpus, names.len());
    if !machine_gpus.is_empty() {
        let each: Vec<String> = names.iter().zip(&shares).map(|(n, g)| format!("{n} {g:?}")).collect();
        done(&format!("GPUs {machine_gpus:?}: {}", each.join(", ")));
    }
    step(&format!("starting the controller bubble {} on {address}", names[0]));
    let mut pids = vec![(
        names[0].clone(),
        spawn_launcher(
            args,
            shared,
            NodeLaunch { node: &names[0], role: bubble::Role::Controller, gpus: &shares[0] },
            image,
            address,
            &token_key,
        )?,
    )];
    let deadline = Instant::now() + CONTROL_PLANE_BOUND;
    while !shared.kubeconfig().is_file() {
        check_launchers(shared, &pids)?;
        if Instant::now() >= deadline {
            return Err(Error::NotReady {
                what: "the control plane".into(),
                seconds: CONTROL_PLANE_BOUND.as_secs(),
                detail: format!("see {}", cluster::node_dir(&shared.name, &names[0]).join("logs").display()),
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    done(&format!("control plane ready ({:.1} s)", t0.elapsed().as_secs_f64()));
    for (i, name) in names.iter().enumerate().skip(1) {
        step(&format!("starting the worker bubble {name}"));
        pids.push((
            name.clone(),
            spawn_launcher(
                args,
                shared,
                NodeLaunch { node: name, role: bubble::Role::Worker, gpus: &shares[i] },
                image,
                address,
                &token_key,
            )?,
        ));
    }
    let client = crate::init::client(&shared.kubeconfig()).await?;
    let mut alive = || check_launchers(shared, &pids);
    wait_nodes_ready(client.clone(), names.len(), &|n| names.iter().any(|m| m == n), &mut alive, t0).await?;
    let nodes_ready = t0.elapsed();
    step("waiting for cluster DNS (CoreDNS)");
    wait_coredns(client, &mut alive).await?;
    done(&format!("cluster DNS ready ({:.1} s)", t0.elapsed().as_secs_f64()));
    println!(
        "\nCluster {} is up: {} node(s) Ready in {:.1} s, cluster DNS in {:.1} s.\n",
        shared.name,
        names.len(),
        nodes_ready.as_secs_f64(),
        t0.elapsed().as_secs_f64()
    );
    println!("export KUBECONFIG={}", shared.kubeconfig().display());
    println!("kubectl get nodes -o wide\n");
    print_status(shared).await;
    Ok(())
}

/// Waits until `want` nodes accepted by `ours` are Ready (bounded), printing each; `alive`
/// fails fast when a bubble is gone.
pub(crate) async fn wait_nodes_ready(
    client: kube::Client,
    want: usize,
    ours: &dyn Fn(&str) -> bool,
    alive: &mut dyn FnMut() -> Result<()>,
    t0: Instant,
) -> Result<()> {
    let nodes: Api<Node> = Api::all(client);
    let deadline = Instant::now() + NODES_BOUND;
    let mut ready = std::collections::BTreeSet::new();
    let mut seen = std::collections::BTreeSet::new();
    while ready.len() < want {
        alive()?;
        if let Ok(list) = nodes.list(&ListParams::default()).await {
            for node in list.items {
                let name = node.metadata.name.clone().unwrap_or_default();
                if !ours(&name) {
                    continue;
                }
                seen.insert(name.clone());
                if is_ready(&node) && ready.insert(name.clone()) {
                    done(&format!("node {name} Ready ({:.1} s)", t0.elapsed().as_secs_f64()));
                }
            }
        }
        if Instant::now() >= deadline {
            let waiting: Vec<&String> = seen.iter().filter(|n| !ready.contains(*n)).collect();
            return Err(Error::NotReady {
                what: format!(
                    "{} of {want} nodes (registered but not Ready: {waiting:?})",
                    want - ready.len()
                ),
                seconds: NODES_BOUND.as_secs(),
                detail: "see each node's logs under the state directory".into(),
            });
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(())
}

/// Waits until every CoreDNS replica is ready (bounded); `alive` fails fast when a bubble is
/// gone.
pub(crate) async fn wait_coredns(client: kube::Client, alive: &mut dyn FnMut() -> Result<()>) -> Result<()> {
    use k8s_openapi::api::apps::v1::Deployment;
    let deployments: Api<Deployment> = Api::namespaced(client, "kube-system");
    let deadline = Instant::now() + DNS_BOUND;
    loop {
        alive()?;
        let last = match deployments.get_opt("coredns").await {
            Ok(Some(d)) => {
                let wanted = d.spec.and_then(|s| s.replicas).unwrap_or(1);
                let ready = d.status.and_then(|s| s.ready_replicas).unwrap_or(0);
                if ready >= wanted {
                    return Ok(());
                }
                format!("{ready} of {wanted} replicas ready")
            }
            Ok(None) => "no Deployment kube-system/coredns yet".into(),
            Err(e) => e.to_string(),
        };
        if Instant::now() >= deadline {
            let pods = pod_states(
                &Api::namespaced(deployments.clone().into_client(), "kube-system"),
                "k8s-app=kube-dns",
            )
            .await;
            return Err(Error::NotReady {
                what: "cluster DNS (kube-system/coredns)".into(),
                seconds: DNS_BOUND.as_secs(),
                detail: format!("{last}\n{pods}"),
            });
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// One line per pod matching `selector` and per container: where it runs and why it waits.
async fn pod_states(pods: &Api<Pod>, selector: &str) -> String {
    let Ok(list) = pods.list(&ListParams::default().labels(selector)).await else {
        return String::new();
    };
    let mut out = Vec::new();
    for pod in list.items {
        let name = pod.metadata.name.unwrap_or_default();
        let node = pod.spec.and_then(|s| s.node_name).unwrap_or_else(|| "(unscheduled)".into());
        let status = pod.status.unwrap_or_default();
        out.push(format!("  pod {name} on {node}: {}", status.phase.unwrap_or_default()));
        for c in status.container_statuses.unwrap_or_default() {
            let state = c.state.unwrap_or_default();
            let why = match (state.waiting, state.terminated) {
                (Some(w), _) => {
                    format!("waiting: {} {}", w.reason.unwrap_or_default(), w.message.unwrap_or_default())
                }
                (_, Some(t)) => {
                    format!("terminated: {} (exit {})", t.reason.unwrap_or_default(), t.exit_code)
                }
                _ => format!("running, ready={}", c.ready),
            };
            out.push(format!("    {}: {why}; restarts {}", c.name, c.restart_count));
        }
    }
    out.join("\n")
}

/// One node to launch: its name, role and GPUs.
struct NodeLaunch<'a> {
    node: &'a str,
    role: bubble::Role,
    gpus: &'a [u32],
}

fn spawn_launcher(
    args: &UpArgs,
    shared: &Shared,
    launch: NodeLaunch<'_>,
    image: &Path,
    address: Ipv4Addr,
    token_key: &str,
) -> Result<u32> {
    let NodeLaunch { node, role, gpus } = launch;
    let logs = cluster::state_base().join(&shared.name);
    image::create_private_dir(&logs)?;
    let log = logs.join(format!("launcher-{node}.log"));
    let file = std::fs::File::create(&log).map_err(|e| Error::io("create", log.display(), e))?;
    let err = file.try_clone().map_err(|e| Error::io("dup", log.display(), e))?;
    let exe = std::env::current_exe().map_err(|e| Error::io("find", "this program", e))?;
    let mut cmd = Command::new(exe);
    cmd.arg("bubble")
        .arg(format!("--cluster={}", shared.name))
        .arg(format!("--node={node}"))
        .arg(format!("--role={}", role.as_str()))
        .arg(format!("--address={address}"))
        .arg("--image")
        .arg(image);
    cmd.args(args.options.to_args());
    cmd.env(cluster::NODE_TOKEN_KEY_ENV, token_key);
    cmd.env(bubble::gpus::GPUS_ENV, gpus.iter().map(u32::to_string).collect::<Vec<_>>().join(","));
    // The state directory this command chose (and checked), not one chosen again.
    cmd.env("HPK_STATE_DIR", cluster::state_base());
    // Its own session: the launcher outlives `hpk up` and a closed terminal.
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    cmd.stdin(Stdio::null()).stdout(file).stderr(err);
    let child = cmd.spawn().map_err(|e| Error::io("start", "the bubble launcher", e))?;
    let pid = child.id();
    // Not waited for here; `hpk down` stops it by PID. Detach the handle.
    std::mem::forget(child);
    let list = shared.dir.join("launchers");
    let mut text = std::fs::read_to_string(&list).unwrap_or_default();
    text.push_str(&format!("{pid} {node}\n"));
    cluster::write_file(&list, text.as_bytes(), 0o644)?;
    Ok(pid)
}

fn check_launchers(shared: &Shared, pids: &[(String, u32)]) -> Result<()> {
    for (node, pid) in pids {
        if !process_alive(*pid) {
            let log = cluster::state_base().join(&shared.name).join(format!("launcher-{node}.log"));
            return Err(Error::Failed {
                what: format!("the bubble of {node}"),
                detail: format!("its launcher exited:\n{}", tail(&log, 25)),
            });
        }
    }
    Ok(())
}

/// Deletes the bubbles of `shared` whose crun state is still in `state` (checked private by
/// the caller), each with the crun of the image its launcher ran.
fn delete_bubbles(shared: &Shared, state: &Path) {
    let records: Vec<cluster::NodeRecord> = shared.nodes().into_iter().flatten().collect();
    let Ok(entries) = std::fs::read_dir(state) else { return };
    for entry in entries.flatten() {
        let node = entry.file_name().to_string_lossy().into_owned();
        let crun_root = entry.path().join("crun");
        let rootfs = records.iter().find(|r| r.node == node).and_then(|r| r.rootfs.clone());
        if let (true, Some(tools)) =
            (crun_root.is_dir(), rootfs.and_then(|r| HostTools::from_cache(&cluster::state_base(), &r).ok()))
        {
            let id = format!("hpk-{}-{node}", shared.name);
            let _ = bubble::crun(&tools, &crun_root).args(["delete", "--force", &id]).output();
        }
    }
}

/// The last lines of every log of every node of the cluster, to stderr.
fn print_log_tails(shared: &Shared) {
    let state = cluster::state_base().join(&shared.name);
    let Ok(nodes) = std::fs::read_dir(&state) else { return };
    for node in nodes.flatten() {
        let path = node.path();
        if path.extension().is_some_and(|e| e == "log") {
            eprintln!("--- {}:\n{}", path.display(), tail(&path, 8));
            continue;
        }
        let Ok(logs) = std::fs::read_dir(path.join("logs")) else { continue };
        let mut logs: Vec<PathBuf> = logs.flatten().map(|l| l.path()).collect();
        logs.sort();
        for log in logs {
            eprintln!("--- {}:\n{}", log.display(), tail(&log, 8));
        }
    }
}

/// PIDs from the cluster's launcher list.
fn launchers(shared: &Shared) -> Vec<u32> {
    std::fs::read_to_string(shared.dir.join("launchers"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect()
}

/// `hpk down`.
pub fn down(args: &NameArgs) -> Result<()> {
    let shared = Shared::new(&args.name)?;
    if !shared.dir.exists() && !cluster::state_base().join(&args.name).exists() {
        println!("cluster {} is not running (no {})", args.name, shared.dir.display());
        return Ok(());
    }
    down_cluster(&shared, true)
}

fn down_cluster(shared: &Shared, verbose: bool) -> Result<()> {
    let t0 = Instant::now();
    let pids: Vec<u32> =
        launchers(shared).into_iter().filter(|p| process_alive(*p) && is_launcher(*p)).collect();
    for pid in &pids {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(*pid as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    let deadline = Instant::now() + DOWN_BOUND;
    while pids.iter().any(|p| process_alive(*p)) && Instant::now() < deadline {
        reap_children();
        std::thread::sleep(Duration::from_millis(100));
    }
    for pid in pids.iter().filter(|p| process_alive(**p)) {
        eprintln!("launcher {pid} did not stop within {} s: killing it", DOWN_BOUND.as_secs());
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(*pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    reap_children();
    // An exited launcher whose parent is gone waits to be reaped by init, and until then still
    // pins its namespaces: done means gone from /proc (bounded).
    let deadline = Instant::now() + Duration::from_secs(10);
    while pids.iter().any(|p| Path::new(&format!("/proc/{p}")).exists()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    // What a killed launcher could not remove: its bubble (crun state in the node directory),
    // deleted with the crun of the image it ran. Only from a state directory that is still
    // this user's alone: one another user made at the same path (after a reboot or a /tmp
    // clean-up) is neither read, run from nor removed.
    let state = cluster::state_base().join(&shared.name);
    let mut leftovers = Vec::new();
    let verify = preflight::statefs::verify_private;
    match verify(&cluster::state_base()).and_then(|()| verify(&state)) {
        Ok(()) => {
            delete_bubbles(shared, &state);
            if let Err(e) = std::fs::remove_dir_all(&state) {
                leftovers.push(format!("{}: {e}", state.display()));
            }
        }
        // Nothing there (not even a link): nothing to delete.
        Err(_) if std::fs::symlink_metadata(&state).is_err() => {}
        Err(e) => leftovers.push(format!("{} left alone: {e}", state.display())),
    }
    // The shared directory last: the bubbles' records in it said what to delete.
    if let Err(e) = shared.remove() {
        leftovers.push(e.to_string());
    }
    if !leftovers.is_empty() {
        return Err(Error::Failed {
            what: "hpk down".into(),
            detail: format!("could not remove {}", leftovers.join("; ")),
        });
    }
    if verbose {
        println!(
            "cluster {} removed ({} bubble(s), {:.1} s)",
            shared.name,
            pids.len(),
            t0.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

fn reap_children() {
    use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
    while let Ok(status) = waitpid(None, Some(WaitPidFlag::WNOHANG)) {
        if status == WaitStatus::StillAlive {
            break;
        }
    }
}

/// Whether `pid` runs `hpk bubble` (a recycled PID is never signalled).
fn is_launcher(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| c.split(|b| *b == 0).any(|a| a == b"bubble"))
        .unwrap_or(false)
}

/// `hpk status`.
pub async fn status(args: &NameArgs) -> Result<()> {
    let shared = Shared::new(&args.name)?;
    if !shared.dir.exists() {
        println!("cluster {} is not running", args.name);
        return Ok(());
    }
    print_status(&shared).await;
    Ok(())
}

pub(crate) async fn print_status(shared: &Shared) {
    let api = std::fs::read_to_string(shared.apiserver_url()).unwrap_or_else(|_| "(not yet)".into());
    println!("cluster {}   API {}   kubeconfig {}", shared.name, api.trim(), shared.kubeconfig().display());
    let (mut ready, mut pods) =
        (std::collections::HashMap::new(), std::collections::HashMap::<String, usize>::new());
    if let Ok(client) = crate::init::client(&shared.kubeconfig()).await {
        if let Ok(list) = Api::<Node>::all(client.clone()).list(&ListParams::default()).await {
            for n in list.items {
                ready.insert(n.metadata.name.clone().unwrap_or_default(), is_ready(&n));
            }
        }
        if let Ok(list) = Api::<Pod>::all(client).list(&ListParams::default()).await {
            for p in list.items {
                if let Some(node) = p.spec.and_then(|s| s.node_name) {
                    *pods.entry(node).or_default() += 1;
                }
            }
        }
    }
    println!(
        "{:<16} {:<11} {:<8} {:<16} {:<8} {:<8} {:<12} {:<5}",
        "NODE", "ROLE", "STATUS", "ADDRESS", "KUBELET", "TUNNEL", "LAUNCHER", "PODS"
    );
    for record in shared.nodes() {
        match record {
            Ok(n) => {
                // A launcher on another host (a Slurm job's nodes) cannot be checked from here.
                let local = n.host == bubble::hostname();
                let status = match (!local || process_alive(n.launcher_pid), ready.get(&n.node)) {
                    (false, _) => "Gone",
                    (true, Some(true)) => "Ready",
                    (true, Some(false)) => "NotReady",
                    (true, None) => "Starting",
                };
                let port = |p: &str| n.port(p).map(|v| v.to_string()).unwrap_or_else(|| "-".into());
                println!(
                    "{:<16} {:<11} {:<8} {:<16} {:<8} {:<8} {:<12} {:<5}",
                    n.node,
                    n.role,
                    status,
                    n.address,
                    port("kubelet"),
                    format!("{}/udp", port("tunnel")),
                    if local {
                        format!("pid {}", n.launcher_pid)
                    } else {
                        format!("{}:{}", n.host, n.launcher_pid)
                    },
                    pods.get(&n.node).copied().unwrap_or(0)
                );
            }
            Err(e) => println!("(unreadable node record: {e})"),
        }
    }
}

pub(crate) fn is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// This host's IPv4 addresses on interfaces that are up, with each interface's name.
pub fn ipv4_addresses() -> Vec<(String, Ipv4Addr)> {
    use nix::net::if_::InterfaceFlags;
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else { return Vec::new() };
    addrs
        .filter(|a| a.flags.contains(InterfaceFlags::IFF_UP))
        .filter_map(|a| {
            let ip = a.address.as_ref()?.as_sockaddr_in()?.ip();
            Some((a.interface_name, ip))
        })
        .collect()
}

/// The first global IPv4 address of an interface that is up (not loopback, not link-local).
pub fn default_address() -> Result<Ipv4Addr> {
    ipv4_addresses()
        .into_iter()
        // Addresses on the loopback device are reachable only from this namespace's own
        // processes, never from a bubble.
        .filter(|(name, ip)| name != "lo" && !ip.is_loopback() && !ip.is_link_local())
        .map(|(_, ip)| ip)
        .next()
        .ok_or_else(|| Error::Prerequisite {
            what: "this machine has no global IPv4 address to publish the cluster on".into(),
            fix: "pass --address with one of this host's addresses".into(),
        })
}

pub(crate) fn step(what: &str) {
    println!("• {what} …");
}

pub(crate) fn done(what: &str) {
    println!("  ✓ {what}");
}

fn short(digest: &str) -> &str {
    digest.get(..19).unwrap_or(digest)
}
