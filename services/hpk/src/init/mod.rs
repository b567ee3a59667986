//! Inside the bubble: `hpk bubble-init`.
//!
//! The bubble's first process is a small reaper (PID 1 of the bubble's PID namespace): it
//! starts `hpk bubble-init --supervise` with the same arguments, forwards SIGTERM/SIGINT to it,
//! reaps every orphan the runtime's shims and containers leave, and exits with the supervisor's
//! status. The supervisor ([`supervise`]) relays the published ports, starts the services in
//! dependency order with a readiness check each (every wait bounded, failing with what it saw),
//! restarts any that exits with back-off, and on SIGTERM stops them in reverse order.

pub mod capped_log;
mod controller;
mod listener_owner;
mod node;
mod ports;
mod relay;
mod runtime;
mod service_lb;
mod supervisor;
mod udp_relay;

use std::net::Ipv4Addr;
use std::path::PathBuf;

pub use controller::client;

use crate::bubble::{NodeOptions, Role};
use crate::error::{Error, Result};

/// `hpk bubble-init` arguments (set by the launcher).
#[derive(Debug, Clone, clap::Args)]
pub struct InitArgs {
    /// What every node of the cluster is started with.
    #[command(flatten)]
    pub options: NodeOptions,
    /// The cluster's name.
    #[arg(long)]
    pub cluster: String,
    /// This node's name.
    #[arg(long)]
    pub node: String,
    /// This bubble's role.
    #[arg(long, value_enum)]
    pub role: Role,
    /// The host address the published ports are bound on.
    #[arg(long)]
    pub address: Ipv4Addr,
    /// Published ports, `name=port,…`.
    #[arg(long, value_delimiter = ',')]
    pub ports: Vec<String>,
    /// A directory of HPK's on the host, which pods may not mount (repeatable; the launcher
    /// passes `~/.hpk` and the state directory).
    #[arg(long = "hidden-host-path", hide = true)]
    pub hidden_host_paths: Vec<std::path::PathBuf>,
    /// Run as the supervisor (the reaper starts it so).
    #[arg(long, hide = true)]
    pub supervise: bool,
}

impl InitArgs {
    /// The published port `name`.
    pub fn port(&self, name: &str) -> Result<u16> {
        self.ports
            .iter()
            .find_map(|p| p.split_once('=').filter(|(n, _)| *n == name).and_then(|(_, v)| v.parse().ok()))
            .ok_or_else(|| Error::Invalid(format!("--ports names no {name} port")))
    }
}

/// The inherited descriptor of published socket `name` (from `HPK_FDS`).
pub fn inherited_fd(name: &str) -> Result<i32> {
    std::env::var("HPK_FDS")
        .unwrap_or_default()
        .split(',')
        .find_map(|p| p.split_once('=').filter(|(n, _)| *n == name).and_then(|(_, v)| v.parse().ok()))
        .ok_or_else(|| Error::Invalid(format!("HPK_FDS names no descriptor for {name}")))
}

/// Makes the node directory a shared mount of the bubble's namespace. The pod runtime makes
/// its own namespace a slave of this one when it starts, so what the kubelet mounts beneath
/// the node directory later (an emptyDir's tmpfs) reaches it, and so the containers; mounts
/// are private here otherwise, and a container would see the directory beneath the tmpfs.
/// Before any service starts. A failure is reported, and the bubble goes on without.
fn share_node_dir() {
    use nix::mount::{MsFlags, mount};
    let dir = crate::bubble::spec::NODE_DIR;
    if let Err(e) = mount(None::<&str>, dir, None::<&str>, MsFlags::MS_REC | MsFlags::MS_SHARED, None::<&str>)
    {
        eprintln!(
            "hpk bubble-init: making {dir} a shared mount failed ({e}): emptyDir volumes of medium Memory will be directories on disk in containers"
        );
    }
}

/// The reaper: PID 1 of the bubble. It starts the supervisor with this process's own
/// arguments plus `--supervise`; returns the supervisor's exit code.
pub fn reap() -> Result<i32> {
    share_node_dir();
    use nix::sys::signal::{SigSet, SigmaskHow, Signal, kill, sigprocmask};
    use nix::sys::signalfd::{SfdFlags, SignalFd};
    use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
    let mut set = SigSet::empty();
    for s in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP, Signal::SIGCHLD] {
        set.add(s);
    }
    sigprocmask(SigmaskHow::SIG_BLOCK, Some(&set), None)
        .map_err(|e| Error::io("block", "signals", e.into()))?;
    let fd = SignalFd::with_flags(&set, SfdFlags::SFD_CLOEXEC)
        .map_err(|e| Error::io("create", "a signalfd", e.into()))?;
    let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("/usr/local/bin/hpk"));
    let mut cmd = std::process::Command::new(exe);
    cmd.args(std::env::args_os().skip(1)).arg("--supervise");
    // The mask is inherited across exec: the supervisor must get its signals.
    crate::fds::unblock_signals(&mut cmd);
    let child = cmd.spawn().map_err(|e| Error::io("start", "the bubble's supervisor", e))?;
    let supervisor = nix::unistd::Pid::from_raw(child.id() as i32);
    loop {
        let Ok(Some(info)) = fd.read_signal() else { continue };
        match Signal::try_from(info.ssi_signo as i32) {
            Ok(Signal::SIGCHLD) => loop {
                match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                    Ok(WaitStatus::Exited(pid, code)) if pid == supervisor => return Ok(code),
                    Ok(WaitStatus::Signaled(pid, signal, _)) if pid == supervisor => {
                        eprintln!("hpk bubble-init: the supervisor was killed by {signal}");
                        return Ok(128 + signal as i32);
                    }
                    Ok(WaitStatus::StillAlive) | Err(_) => break,
                    Ok(_) => {}
                }
            },
            Ok(signal) => {
                let _ = kill(supervisor, signal);
            }
            Err(_) => {}
        }
    }
}

/// The supervisor. Returns the exit code.
pub async fn supervise(args: InitArgs) -> Result<i32> {
    let shutdown = tokio_util_shutdown()?;
    relay::start(&args)?;
    egress_nat().await?;
    let mut sup = supervisor::Supervisor::new(PathBuf::from(crate::bubble::spec::NODE_DIR).join("logs"));
    let result = async {
        match args.role {
            Role::Controller => {
                controller::start(&args, &mut sup).await?;
                node::start(&args, &mut sup).await
            }
            Role::Worker => node::start(&args, &mut sup).await,
            Role::Runtime => runtime::start(&args, &mut sup).await,
        }
    };
    let outcome = tokio::select! {
        r = result => r,
        () = shutdown.notified() => {
            tracing::info!("stop requested while starting");
            sup.stop_all().await;
            return Ok(0);
        }
    };
    if let Err(e) = outcome {
        tracing::error!(error = %e, "the bubble could not start");
        eprintln!("hpk bubble-init: {e}");
        sup.stop_all().await;
        return Ok(e.exit_code());
    }
    tracing::info!(node = %args.node, "bubble ready: every service started");
    shutdown.notified().await;
    tracing::info!("stopping the services");
    sup.stop_all().await;
    Ok(0)
}

/// Pods reach the world (and the API server at the host's address) through slirp4netns, which
/// answers only the bubble's own address: traffic from the pod CIDR leaving by `tap0` is
/// masqueraded to it.
async fn egress_nat() -> Result<()> {
    use tokio::io::AsyncWriteExt;
    let rules = format!(
        "table ip hpk-egress {{\n  chain postrouting {{\n    type nat hook postrouting priority 100; policy accept;\n    \
         oifname \"tap0\" ip saddr {} masquerade\n  }}\n}}\n",
        crate::addons::CLUSTER_CIDR
    );
    let mut child = tokio::process::Command::new("nft")
        .args(["-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| Error::io("run", "nft (egress NAT)", e))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(rules.as_bytes()).await.map_err(|e| Error::io("write", "nft rules", e))?;
    }
    let out = child.wait_with_output().await.map_err(|e| Error::io("run", "nft (egress NAT)", e))?;
    if !out.status.success() {
        return Err(Error::Failed {
            what: "the pods' egress NAT (nft)".into(),
            detail: String::from_utf8_lossy(&out.stderr).into(),
        });
    }
    Ok(())
}

/// A notification fired on the first SIGTERM, SIGINT or SIGHUP.
fn tokio_util_shutdown() -> Result<std::sync::Arc<tokio::sync::Notify>> {
    use tokio::signal::unix::{SignalKind, signal};
    let notify = std::sync::Arc::new(tokio::sync::Notify::new());
    let mut signals = Vec::new();
    for kind in [SignalKind::terminate(), SignalKind::interrupt(), SignalKind::hangup()] {
        signals.push(signal(kind).map_err(|e| Error::io("listen for", "signals", e))?);
    }
    let n = notify.clone();
    tokio::spawn(async move {
        let [a, b, c] = &mut signals[..] else { return };
        tokio::select! {
            _ = a.recv() => {}
            _ = b.recv() => {}
            _ = c.recv() => {}
        }
        n.notify_one();
    });
    Ok(notify)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        init: super::InitArgs,
    }

    #[test]
    fn a_kubelet_argument_takes_one_value_and_later_flags_stay_ours() {
        let cli = Cli::try_parse_from([
            "hpk",
            "--cluster=c",
            "--node=n",
            "--role=worker",
            "--address=10.0.0.1",
            "--ports=kubelet=1,tunnel=2",
            "--kubelet-arg=--disk-pressure-percent=1",
            "--insecure-registry=10.0.0.1:5000",
        ])
        .expect("parse");
        assert_eq!(cli.init.options.kubelet_args, ["--disk-pressure-percent=1"]);
        assert_eq!(cli.init.options.insecure_registries, ["10.0.0.1:5000"]);
        assert_eq!(cli.init.port("tunnel").expect("tunnel"), 2);
    }
}
