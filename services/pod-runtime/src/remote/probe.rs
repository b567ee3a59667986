//! Remote/Probe: one attempt of a network probe of a sandbox, run here for a kubelet on another
//! machine (connector mode), with `hpk-probe`'s clients, the kubelet's own. Only the sandbox's
//! own address may be probed.

use std::net::IpAddr;

use hpk_proto::podruntime::v1 as pb;

use super::{Error, Result};
use crate::runtime::Runtime;

/// The most probes running at once; more are refused (RESOURCE_EXHAUSTED) rather than queued.
pub const MAX_RUNNING: usize = 512;

/// Checks `request` and runs its attempt: the answer carries the probe's outcome, failed
/// included. The request's host must be one of the sandbox's IPs.
pub async fn run(runtime: &Runtime, request: &pb::ProbeRequest) -> Result<pb::ProbeResponse> {
    let (action, timeout) = hpk_probe::wire::parse(request).map_err(Error::Invalid)?;
    let status = runtime.sandbox_status(&request.pod_sandbox_id).await?;
    let network = status.network.unwrap_or_default();
    let own: Vec<&str> = std::iter::once(network.ip.as_str())
        .chain(network.additional_ips.iter().map(|ip| ip.ip.as_str()))
        .filter(|ip| !ip.is_empty())
        .collect();
    check_host(hpk_probe::wire::host(&action), &own, &status.id)?;
    Ok(hpk_probe::wire::response(&hpk_probe::run(&action, timeout).await))
}

/// Whether `host` is one of the sandbox's addresses `own` (compared as addresses, so that
/// `fd00::05` is `fd00::5`).
fn check_host(host: &str, own: &[&str], sandbox: &str) -> Result<()> {
    let parsed = host.parse::<IpAddr>().ok();
    let is_own =
        own.iter().any(|ip| *ip == host || (parsed.is_some() && ip.parse::<IpAddr>().ok() == parsed));
    if is_own {
        return Ok(());
    }
    Err(Error::Invalid(if own.is_empty() {
        format!("sandbox {sandbox} has no IP address to probe")
    } else {
        format!(
            "host {host:.256?} is not an address of sandbox {sandbox} ({}): a remote runtime probes its pods' own addresses only",
            own.join(", ")
        )
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_sandboxs_own_addresses_are_probed() {
        assert!(check_host("10.244.0.5", &["10.244.0.5"], "s").is_ok());
        assert!(check_host("fd00::05", &["10.244.0.5", "fd00::5"], "s").is_ok());
        let other = check_host("169.254.169.254", &["10.244.0.5"], "s").expect_err("another host");
        assert_eq!(
            other.to_string(),
            "host \"169.254.169.254\" is not an address of sandbox s (10.244.0.5): a remote runtime probes its pods' own addresses only"
        );
        let name = check_host("localhost", &["10.244.0.5"], "s").expect_err("a name");
        assert!(matches!(name, Error::Invalid(_)), "{name:?}");
        let none = check_host("10.244.0.5", &[], "s").expect_err("no address");
        assert_eq!(none.to_string(), "sandbox s has no IP address to probe");
    }
}
