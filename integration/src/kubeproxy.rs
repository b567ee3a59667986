//! Upstream kube-proxy (from the control-plane binary) in nftables mode on a node's test host:
//! ClusterIP Services for the node's pods, whose traffic is routed through the host's network
//! namespace, where kube-proxy's DNAT applies.
//!
//! What the flags settle, measured on Debian 12 (nft 1.0.6, kernel 6.x):
//! - nftables mode works with Debian's nft as is: kube-proxy v1.35.4 builds with knftables
//!   v0.0.21, which writes base-chain priorities as numbers (`dstnat` → `-100`), so nft 1.0.6's
//!   refusal of `priority dstnat` on an output hook is never hit.
//! - Nothing listens on a host interface: health and metrics on the namespace's loopback.
//! - The conntrack tuning kube-proxy does by default (`nf_conntrack_max`, TCP timeouts) writes
//!   sysctls that are global or unwritable in a network namespace (and in a rootless bubble);
//!   zero values leave them alone.
//! - `--cluster-cidr` only masquerades traffic to a ClusterIP from outside the pod CIDR; pods
//!   reaching a Service whose endpoints are not pods (the `kubernetes` Service → the API
//!   server) keep their pod address, so the endpoint's host needs a route back to the pod
//!   CIDRs (see [`crate::controlplane::ControlPlane::route_pod_cidrs`]) or egress NAT.

use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::controlplane::ControlPlane;
use crate::netns::Host;
use crate::pki::write_kubeconfig;
use crate::process::Process;
use crate::{Error, Result};

pub use hpk_cluster::addons::{
    KUBE_PROXY_HEALTHZ as HEALTHZ_ADDRESS, KUBE_PROXY_METRICS as METRICS_ADDRESS, KUBE_PROXY_USER as USER,
};

/// The flags for kube-proxy on node `node` (the product's, [`hpk_cluster::addons::kube_proxy_args`]).
pub fn args(node: &str, node_ip: Ipv4Addr, kubeconfig: &Path) -> Vec<String> {
    hpk_cluster::addons::kube_proxy_args(node, node_ip, kubeconfig)
}

/// Writes the kubeconfig kube-proxy uses (a `system:kube-proxy` client certificate from the
/// cluster's client CA), once per cluster; returns its path.
pub fn kubeconfig(cp: &ControlPlane) -> Result<std::path::PathBuf> {
    let path = cp.dir().join("kube-proxy.kubeconfig");
    if !path.is_file() {
        let cert = cp.pki().client_cert("kube-proxy", USER, &[])?;
        write_kubeconfig(&path, cp.api_url(), &cp.pki().server_ca().cert, "kube-proxy", &cert)?;
    }
    Ok(path)
}

/// Starts kube-proxy on `host` (a node of `cp`), its log at `log`.
pub fn start(cp: &ControlPlane, host: &Host, log: &Path) -> Result<Process> {
    let kubeconfig = kubeconfig(cp)?;
    let mut cmd = host.command(cp.bin_dir().join("kube-proxy"));
    cmd.args(args(&host.name, host.ip, &kubeconfig));
    Process::spawn("kube-proxy", cmd, log)
}

/// Whether kube-proxy on `host` answers its health check (its rules are synced).
pub fn healthy(host: &Host) -> bool {
    Command::new("ip")
        .args(["netns", "exec", &host.netns, "curl", "-fsS", "--max-time", "2", "-o", "/dev/null"])
        .arg(format!("http://{HEALTHZ_ADDRESS}/healthz"))
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Waits until kube-proxy on `host` is healthy, failing early if it exits.
pub fn wait_healthy(process: &mut Process, host: &Host, within: Duration) -> Result<()> {
    let deadline = Instant::now() + within;
    loop {
        process.check_alive()?;
        if healthy(host) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(Error::NotReady {
                what: format!("kube-proxy on {}", host.name),
                seconds: within.as_secs(),
                detail: process.log_tail(30),
            });
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
