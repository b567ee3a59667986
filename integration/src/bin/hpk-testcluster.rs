//! `hpk-testcluster up|down`: the harness's cluster, for people.
//!
//! `up` starts the upstream control plane on a test host (plus node hosts, with `--hpk` an HPK
//! node on each: net-forwarder, pod-runtime, kubelet), prints how to use it, and keeps it
//! running until SIGINT/SIGTERM or `down`, then removes everything. `registry` and `slurm` give
//! `scripts/demo.sh` a registry host, or a whole Slurm cluster with a registry.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use hpk_integration::clusterdns;
use hpk_integration::controlplane::ControlPlane;
use hpk_integration::hpknode::{HpkNode, NodeOptions, PEER_READER_RBAC};
use hpk_integration::registry::{Registry, TestImages};

/// A throwaway upstream Kubernetes control plane in network namespaces (needs root).
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start the cluster and keep it running in the foreground until Ctrl-C or `down`.
    Up {
        /// Names of test hosts to create beside the control plane (for kubelets).
        #[arg(long, value_delimiter = ',', default_value = "node1")]
        nodes: Vec<String>,
        /// Also run an HPK node on each node host: hpk-net-forwarder (with the tunnel between
        /// the nodes), hpk-pod-runtime, hpk-kubelet (from the directory of this binary, `cargo
        /// build --workspace --bins`) and kube-proxy (nftables mode, for ClusterIP Services).
        /// The control-plane host gets a route to each node's pod CIDR.
        #[arg(long)]
        hpk: bool,
        /// With --hpk: also run a local registry holding the test images (busybox shell and
        /// httpd) and let the nodes pull from it; with `coredns` on PATH (scripts/setup.sh),
        /// also cluster DNS: CoreDNS from deploy/coredns.yaml as Service kube-dns.
        #[arg(long, requires = "hpk")]
        registry: bool,
        /// One more flag for every kubelet (repeatable), e.g. --kubelet-arg=--disk-pressure-percent=1.
        #[arg(long = "kubelet-arg", allow_hyphen_values = true)]
        kubelet_args: Vec<String>,
    },
    /// Stop the cluster an `up` started (SIGTERM to its PID) and wait until it has cleaned up.
    Down,
    /// A test host of its own (a network namespace on a private bridge) with a local registry
    /// holding the test images and CoreDNS, for `hpk up` run on that host (`scripts/demo.sh`).
    /// Writes shell variables to --env-file once ready; runs until SIGINT/SIGTERM.
    Registry {
        /// Where to write `HPK_DEMO_NETNS=…`, `HPK_DEMO_REGISTRY=…`, the image references.
        #[arg(long)]
        env_file: PathBuf,
    },
    /// A real Slurm cluster (slurmctld, one slurmd per test host, munge) with an unprivileged
    /// user, and a local registry holding the test images and CoreDNS on its login address, for
    /// `sbatch slurm/hpk.slurm` as that user (`scripts/demo.sh`). Writes shell variables to
    /// --env-file once ready; runs until SIGINT/SIGTERM, then removes it all.
    Slurm {
        /// How many compute nodes.
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=16))]
        nodes: u16,
        /// Where to write `HPK_DEMO_SLURM_CONF=…`, `HPK_DEMO_USER=…`, the image references.
        #[arg(long)]
        env_file: PathBuf,
    },
    /// Remove what killed harness runs left behind (processes in `hpkt-*` namespaces, the
    /// namespaces, `hpktb*` bridges; a Slurm's daemons, users and directories). Only while no
    /// test, `up`, `slurm` or demo is running.
    Sweep,
    /// An unauthenticated flood of idle connections against each target (review H2), as an
    /// attacker on the cluster network would send it; prints what each target did with them.
    Flood {
        /// `ADDR:PORT` to flood (repeatable).
        #[arg(long = "target", required = true)]
        targets: Vec<std::net::SocketAddr>,
        /// Connections kept open against each target.
        #[arg(long, default_value_t = 2000)]
        connections: usize,
        /// How long.
        #[arg(long, default_value_t = 60)]
        seconds: u64,
    },
}

fn pid_file() -> PathBuf {
    let uid = nix::unistd::geteuid().as_raw();
    std::env::temp_dir().join(format!("hpk-testcluster-{uid}.pid"))
}

/// What `up --hpk` adds.
struct HpkOptions {
    registry: bool,
    kubelet_args: Vec<String>,
}

async fn up(nodes: Vec<String>, hpk: Option<HpkOptions>) -> anyhow::Result<()> {
    let pid_file = pid_file();
    if let Ok(pid) = std::fs::read_to_string(&pid_file)
        && PathBuf::from(format!("/proc/{}", pid.trim())).exists()
    {
        bail!("a test cluster is already up (pid {}); run `hpk-testcluster down` first", pid.trim());
    }
    let shutdown = hpk_rpc::shutdown::on_signal().context("signal handlers")?;
    let names: Vec<&str> = nodes.iter().map(String::as_str).collect();
    let started = Instant::now();
    let cp = ControlPlane::start(&names).await?;
    std::fs::write(&pid_file, std::process::id().to_string()).context("write pid file")?;
    println!("control plane ready in {:.1} s at {}", started.elapsed().as_secs_f64(), cp.api_url());
    println!("  export KUBECONFIG={}", cp.admin_kubeconfig().display());
    println!("  kubectl: {}", cp.bin_dir().join("kubectl").display());
    for host in cp.network().hosts() {
        println!("  host {:<14} {:<15} ip netns exec {} ...", host.name, host.ip.to_string(), host.netns);
    }
    let registry = match hpk.as_ref().is_some_and(|o| o.registry) {
        true => Some(start_registry(&cp).await?),
        false => None,
    };
    // Cluster DNS needs the registry (for its image) and the coredns binary.
    let dns = registry.is_some()
        && match clusterdns::coredns_binary() {
            Ok(_) => true,
            Err(e) => {
                println!("  no cluster DNS: {e}");
                false
            }
        };
    let hpk_nodes = match hpk {
        Some(mut options) => {
            let insecure = registry.as_ref().map(Registry::host_port);
            if dns {
                options.kubelet_args.push(format!("--cluster-dns={}", clusterdns::CLUSTER_DNS_IP));
            }
            start_hpk_nodes(&cp, &names, insecure, options.kubelet_args).await?
        }
        None => Vec::new(),
    };
    if let Some(registry) = registry.as_ref().filter(|_| dns && !hpk_nodes.is_empty()) {
        let image = clusterdns::deploy(&cp, registry).await?;
        clusterdns::wait_ready(&cp, Duration::from_secs(120)).await?;
        println!("  cluster DNS ready: kube-dns at {} ({image})", clusterdns::CLUSTER_DNS_IP);
    }
    println!("stop with Ctrl-C or `hpk-testcluster down`");
    shutdown.cancelled().await;
    if !hpk_nodes.is_empty() {
        // The kubelets terminate the pods properly before the nodes go.
        let _ = cp.kubectl().args(["delete", "pods", "--all", "--all-namespaces", "--timeout=60s"]).output();
    }
    drop(hpk_nodes);
    drop(registry);
    drop(cp);
    let _ = std::fs::remove_file(&pid_file);
    println!("test cluster removed");
    Ok(())
}

/// A registry on the test network's gateway with the test images; prints their references.
async fn start_registry(cp: &ControlPlane) -> anyhow::Result<Registry> {
    let registry = Registry::start(std::net::IpAddr::V4(cp.network().gateway()), None).await?;
    let images = TestImages::push(&registry, false).await?;
    println!(
        "  registry {}: images {} (busybox sh), {} (httpd on 8080)",
        registry.host_port(),
        images.shell,
        images.httpd
    );
    Ok(registry)
}

/// Starts an HPK node on each node host and waits until every one is Ready.
async fn start_hpk_nodes(
    cp: &ControlPlane,
    names: &[&str],
    insecure_registry: Option<String>,
    kubelet_args: Vec<String>,
) -> anyhow::Result<Vec<HpkNode>> {
    let bin_dir = std::env::current_exe().context("own path")?.parent().context("own directory")?.to_owned();
    let mut apply = cp.kubectl().args(["apply", "-f", "-"]).stdin(std::process::Stdio::piped()).spawn()?;
    std::io::Write::write_all(&mut apply.stdin.take().context("stdin")?, PEER_READER_RBAC.as_bytes())?;
    anyhow::ensure!(apply.wait()?.success(), "kubectl apply of the node RBAC failed");
    let node_options =
        NodeOptions { bin_dir, insecure_registry, tunnel: true, kubelet_args, kube_proxy: true };
    let mut nodes = Vec::new();
    for name in names {
        let node = HpkNode::start(cp, name, &cp.dir().join("hpk").join(name), &node_options)?;
        println!("  HPK node {name}: logs and state in {}", node.dir().display());
        nodes.push(node);
    }
    let admin = cp.admin_client().await?;
    let api: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(admin);
    let deadline = Instant::now() + Duration::from_secs(120);
    for name in names {
        loop {
            let ready = api
                .get_opt(name)
                .await
                .ok()
                .flatten()
                .and_then(|n| n.status?.conditions)
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            if ready {
                println!("  node {name} Ready");
                break;
            }
            if Instant::now() > deadline {
                let logs: Vec<String> = nodes.iter().map(HpkNode::logs).collect();
                bail!("node {name} not Ready within 120 s\n{}", logs.join("\n"));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    for node in &mut nodes {
        node.wait_kube_proxy(Duration::from_secs(60))?;
    }
    for route in cp.route_pod_cidrs().await? {
        println!("  control-plane host: route {route}");
    }
    println!("  kube-proxy (nftables) synced on every node");
    Ok(nodes)
}

async fn registry_host(env_file: PathBuf) -> anyhow::Result<()> {
    let shutdown = hpk_rpc::shutdown::on_signal().context("signal handlers")?;
    let network = hpk_integration::netns::TestNetwork::create(&["demo"])?;
    let host = network.host("demo").context("the demo host")?.clone();
    let registry = Registry::start(std::net::IpAddr::V4(host.ip), Some(&host.netns)).await?;
    let images = TestImages::push(&registry, true).await?;
    let coredns = images.coredns.unwrap_or_default();
    let metrics_server = images.metrics_server.unwrap_or_default();
    let local_path = images.local_path_provisioner.unwrap_or_default();
    let r = registry.host_port();
    let vars = format!(
        "HPK_DEMO_NETNS={}\nHPK_DEMO_ADDRESS={}\nHPK_DEMO_REGISTRY={r}\nHPK_DEMO_SHELL={}\n\
         HPK_DEMO_HTTPD={}\nHPK_DEMO_COREDNS={coredns}\nHPK_DEMO_METRICS_SERVER={metrics_server}\n\
         HPK_DEMO_LOCAL_PATH={local_path}\n",
        host.netns, host.ip, images.shell, images.httpd
    );
    std::fs::write(&env_file, vars).with_context(|| format!("write {}", env_file.display()))?;
    println!(
        "demo host {} ({}), registry {r} with hpk/shell:v1, hpk/httpd:v1, hpk/coredns:v1, hpk/metrics-server:v1, \
         hpk/local-path-provisioner:v1",
        host.netns, host.ip
    );
    shutdown.cancelled().await;
    drop(registry);
    drop(network);
    let _ = std::fs::remove_file(&env_file);
    Ok(())
}

/// A real Slurm cluster of `nodes` test hosts (`hpk_integration::slurm`) with an unprivileged
/// user, and a local registry on its login address holding the test images and CoreDNS; writes
/// shell variables to `env_file` once ready and runs until SIGINT/SIGTERM, then removes it all.
async fn slurm_cluster(nodes: usize, env_file: PathBuf) -> anyhow::Result<()> {
    use hpk_integration::slurm::{SlurmCluster, SlurmOptions};
    let shutdown = hpk_rpc::shutdown::on_signal().context("signal handlers")?;
    let slurm = SlurmCluster::start(SlurmOptions { nodes, ..SlurmOptions::default() })?;
    let registry = Registry::start(std::net::IpAddr::V4(slurm.login_address()), None).await?;
    let images = TestImages::push(&registry, true).await?;
    let coredns = images.coredns.unwrap_or_default();
    let metrics_server = images.metrics_server.unwrap_or_default();
    let local_path = images.local_path_provisioner.unwrap_or_default();
    let r = registry.host_port();
    let user = slurm.user();
    let vars = format!(
        "HPK_DEMO_SLURM_CONF={}\nHPK_DEMO_USER={}\nHPK_DEMO_HOME={}\nHPK_DEMO_LOGIN={}\n\
         HPK_DEMO_REGISTRY={r}\nHPK_DEMO_SHELL={}\nHPK_DEMO_HTTPD={}\nHPK_DEMO_COREDNS={coredns}\n\
         HPK_DEMO_METRICS_SERVER={metrics_server}\nHPK_DEMO_LOCAL_PATH={local_path}\n",
        slurm.conf().display(),
        user.name,
        user.home.display(),
        slurm.login_address(),
        images.shell,
        images.httpd
    );
    std::fs::write(&env_file, vars).with_context(|| format!("write {}", env_file.display()))?;
    let names: Vec<String> = slurm.nodes().iter().map(|n| format!("{} ({})", n.name, n.ip)).collect();
    println!(
        "Slurm: login node {} (slurmctld), compute nodes {}, partition {}, user {} (home {}); registry {r}",
        slurm.login_address(),
        names.join(", "),
        slurm.partition(),
        user.name,
        user.home.display()
    );
    shutdown.cancelled().await;
    // The node-local state HPK keeps for the user (its image cache): the user goes with Slurm.
    let state = PathBuf::from(format!("/tmp/hpk-{}", user.uid));
    drop(registry);
    drop(slurm);
    let _ = std::fs::remove_dir_all(state);
    let _ = std::fs::remove_file(&env_file);
    Ok(())
}

fn down() -> anyhow::Result<()> {
    let pid_file = pid_file();
    let text = std::fs::read_to_string(&pid_file)
        .with_context(|| format!("no cluster is up ({} missing)", pid_file.display()))?;
    let pid: i32 = text.trim().parse().context("pid file")?;
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    if !comm.starts_with("hpk-testcluster") {
        let _ = std::fs::remove_file(&pid_file);
        bail!("process {pid} is not hpk-testcluster any more; removed the stale pid file");
    }
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGTERM)
        .context("signal")?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while PathBuf::from(format!("/proc/{pid}")).exists() {
        if Instant::now() > deadline {
            bail!("hpk-testcluster (pid {pid}) still running after 60 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    println!("test cluster stopped");
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    hpk_rpc::limits::raise_nofile_or_warn();
    // kube-rs logs every refused connection at ERROR while the API server starts; readiness
    // polling expects those.
    hpk_rpc::telemetry::init_with_default(hpk_rpc::telemetry::LogFormat::Plain, "info,kube_client=off");
    let result = match Cli::parse().command {
        Command::Up { nodes, hpk, registry, kubelet_args } => {
            let hpk = hpk.then_some(HpkOptions { registry, kubelet_args });
            up(nodes, hpk).await
        }
        Command::Down => down(),
        Command::Flood { targets, connections, seconds } => {
            for report in
                hpk_integration::flood::run(&targets, connections, Duration::from_secs(seconds)).await
            {
                println!("{report}");
            }
            Ok(())
        }
        Command::Registry { env_file } => registry_host(env_file).await,
        Command::Slurm { nodes, env_file } => slurm_cluster(usize::from(nodes), env_file).await,
        Command::Sweep => hpk_integration::netns::sweep()
            .and_then(|mut removed| {
                removed.extend(hpk_integration::slurm::sweep()?);
                Ok(removed)
            })
            .map_err(Into::into)
            .map(|removed| {
                for thing in &removed {
                    println!("removed {thing}");
                }
                println!("{} left-overs removed", removed.len());
            }),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hpk-testcluster: {e:#}");
            ExitCode::FAILURE
        }
    }
}
