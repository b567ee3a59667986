//! `hpk-testcluster up|down`: the harness's cluster, for people.
//!
//! `up` starts the upstream control plane on a test host (plus node hosts), prints how to use it,
//! and keeps it running until SIGINT/SIGTERM or `down`, then removes everything.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use hpk_integration::controlplane::ControlPlane;

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
    },
    /// Stop the cluster an `up` started (SIGTERM to its PID) and wait until it has cleaned up.
    Down,
    /// Remove what killed harness runs left behind (processes in `hpkt-*` namespaces, the
    /// namespaces, `hpktb*` bridges). Only while no test or `up` is running.
    Sweep,
}

fn pid_file() -> PathBuf {
    let uid = nix::unistd::geteuid().as_raw();
    std::env::temp_dir().join(format!("hpk-testcluster-{uid}.pid"))
}

async fn up(nodes: Vec<String>) -> anyhow::Result<()> {
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
    println!("stop with Ctrl-C or `hpk-testcluster down`");
    shutdown.cancelled().await;
    drop(cp);
    let _ = std::fs::remove_file(&pid_file);
    println!("test cluster removed");
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
    // kube-rs logs every refused connection at ERROR while the API server starts; readiness
    // polling expects those.
    hpk_rpc::telemetry::init_with_default(hpk_rpc::telemetry::LogFormat::Plain, "info,kube_client=off");
    let result = match Cli::parse().command {
        Command::Up { nodes } => up(nodes).await,
        Command::Down => down(),
        Command::Sweep => hpk_integration::netns::sweep().map_err(Into::into).map(|removed| {
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
