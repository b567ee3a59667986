//! Cluster DNS: CoreDNS from the product manifest `deploy/coredns.yaml`, its image built without
//! Docker from the static `coredns` binary `scripts/setup.sh` builds, pushed to the harness's
//! registry. Needs kube-proxy on the nodes (the `kube-dns` Service, and CoreDNS reaching the
//! API server through the `kubernetes` Service).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;

use crate::controlplane::ControlPlane;
use crate::registry::{Client, Registry};
use crate::{Error, Result};

pub use hpk_cluster::addons::{
    CLUSTER_DNS_IP, CLUSTER_DOMAIN, COREDNS_MANIFEST as MANIFEST, KUBERNETES_SERVICE_IP,
};

/// The product's CoreDNS manifest ([`hpk_cluster::addons::coredns_manifest`]) for `image`.
pub fn manifest(image: &str) -> Result<String> {
    Ok(hpk_cluster::addons::coredns_manifest(image)?)
}

/// The `metrics-server` binary on PATH (`scripts/setup.sh` builds it into the tools cache).
pub fn metrics_server_binary() -> Result<PathBuf> {
    setup_tool("metrics-server")
}

/// The `local-path-provisioner` binary on PATH (`scripts/setup.sh` builds it into the tools
/// cache).
pub fn local_path_provisioner_binary() -> Result<PathBuf> {
    setup_tool("local-path-provisioner")
}

/// The `coredns` binary on PATH (`scripts/setup.sh` builds it into the tools cache).
pub fn coredns_binary() -> Result<PathBuf> {
    setup_tool("coredns")
}

/// Upstream's `agnhost` test binary of the pinned release (static), which `scripts/setup.sh`
/// builds with the e2e suite into `$HPK_CACHE_DIR/e2e/bin` (default `~/.cache/hpk`).
pub fn agnhost_binary() -> Result<PathBuf> {
    let cache = std::env::var_os("HPK_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/hpk")))
        .unwrap_or_default();
    let path = cache.join("e2e/bin/agnhost");
    if path.is_file() {
        Ok(path)
    } else {
        Err(Error::Missing {
            what: format!("agnhost at {}", path.display()),
            hint: "scripts/setup.sh builds it with the e2e suite (integration/e2e/build.sh)".into(),
        })
    }
}

/// Program `name` on PATH, or [`Error::Missing`] saying that `scripts/setup.sh` builds it.
fn setup_tool(name: &str) -> Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).map(|d| d.join(name)).find(|p| p.is_file()).ok_or_else(|| Error::Missing {
        what: format!("{name} on PATH"),
        hint: "scripts/setup.sh builds it into ~/.cache/hpk/tools/bin".into(),
    })
}

/// Builds the CoreDNS image, pushes it to `registry` and applies the manifest; returns the
/// image reference. Does not wait: see [`wait_ready`].
pub async fn deploy(cp: &ControlPlane, registry: &Registry) -> Result<String> {
    let binary = coredns_binary()?;
    let image = crate::image::static_binary_image_from(&binary)?;
    // The tag names the binary, so a rebuilt coredns is never hidden behind a cached tag.
    let tag = format!("sha-{}", &image.layers[0].diff_id.as_str()["sha256:".len()..][..12]);
    let client = Client::new(&registry.url()).map_err(Box::new)?;
    client.push("hpk/coredns", &tag, &image).await.map_err(Box::new)?;
    let reference = format!("{}/hpk/coredns:{tag}", registry.host_port());
    cp.apply(&manifest(&reference)?)?;
    Ok(reference)
}

/// Waits until every CoreDNS replica is ready.
pub async fn wait_ready(cp: &ControlPlane, within: Duration) -> Result<()> {
    let deployments: Api<Deployment> = Api::namespaced(cp.admin_client().await?, "kube-system");
    let deadline = Instant::now() + within;
    loop {
        let status = deployments.get_opt("coredns").await?.and_then(|d| Some((d.spec?.replicas, d.status?)));
        let last = match status {
            Some((wanted, status)) if status.ready_replicas.unwrap_or(0) >= wanted.unwrap_or(1) => {
                return Ok(());
            }
            Some((wanted, status)) => {
                format!("{} of {} replicas ready", status.ready_replicas.unwrap_or(0), wanted.unwrap_or(1))
            }
            None => "no Deployment kube-system/coredns".into(),
        };
        if Instant::now() >= deadline {
            return Err(Error::NotReady { what: "CoreDNS".into(), seconds: within.as_secs(), detail: last });
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_placeholder_is_filled() {
        let text = manifest("registry:5000/hpk/coredns:x").expect("manifest");
        assert!(text.contains("image: registry:5000/hpk/coredns:x"), "{text}");
        assert!(text.contains("clusterIP: 10.96.0.10"), "{text}");
        assert!(text.contains("kubernetes cluster.local in-addr.arpa"), "{text}");
        let forwards = text.lines().filter(|l| l.trim_start().starts_with("forward")).count();
        assert_eq!(forwards, 0, "no query may leave the cluster: {text}");
    }
}
