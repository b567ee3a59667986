//! The real-cluster test harness.
//!
//! - [`netns`]: test hosts — network namespaces joined by a bridge on a private subnet of our own.
//! - [`pki`]: the cluster's certificates, generated with rcgen.
//! - [`controlplane`]: etcd, kube-apiserver, kube-controller-manager and kube-scheduler (the
//!   upstream ones, built by `controlplane/build.sh`), each its own process on a test host.
//! - [`registry`] and [`image`]: a local OCI registry and test images built without Docker.
//! - [`hpknode`]: an HPK node (net-forwarder, pod-runtime, kubelet) on a test host.
//! - [`kubeproxy`] and [`clusterdns`]: ClusterIP Services (upstream kube-proxy, nftables mode)
//!   and cluster DNS (CoreDNS from `deploy/coredns.yaml`) for the HPK nodes.
//! - [`slurm`]: a real Slurm cluster (munged, slurmctld, one slurmd per test host) and a user
//!   of its own who submits jobs.
//!
//! Everything a harness object creates it removes when dropped, also while a test panics.

pub mod clusterdns;
pub mod connector;
pub mod controlplane;
mod error;
pub mod flood;
pub mod hpknode;
pub mod image;
pub mod kubeproxy;
pub mod netns;
pub mod pki;
pub mod process;
pub mod registry;
pub mod slurm;

pub use error::{Error, Result};
// What every crate's tests share (waiting, skips, manifests), for tests that already use the
// harness.
pub use hpk_test_support::{eventually, eventually_blocking, manifest, skip};

/// `found`'s value; or, when a prerequisite is missing ([`Error::Missing`]), `None` after
/// [`hpk_test_support::skip`] (which fails the test under `HPK_REQUIRE_TOOLS=1`). Any other
/// error fails the test: a harness that breaks is not a machine that lacks a tool.
pub fn skip_unless_available<T>(found: Result<T>) -> Option<T> {
    match found {
        Ok(value) => Some(value),
        Err(e @ Error::Missing { .. }) => {
            hpk_test_support::skip(e);
            None
        }
        Err(e) => panic!("the harness failed (not a missing prerequisite): {e}"),
    }
}

/// Whether `tools` are on PATH and busybox-static (the test images' shell) is installed; when
/// not, [`hpk_test_support::skip`]s naming what is missing (failing under `HPK_REQUIRE_TOOLS=1`).
pub fn tools_present(tools: &[&str]) -> bool {
    let mut missing = hpk_test_support::missing_tools(tools);
    if !std::path::Path::new(image::BUSYBOX).is_file() {
        missing.push("busybox-static");
    }
    if missing.is_empty() {
        return true;
    }
    hpk_test_support::skip(format!("missing {missing:?} (scripts/setup.sh installs them)"));
    false
}

/// The release bundle the Slurm suite submits from (`make dist PROFILE=debug` writes it to
/// `target/dist/hpk-<version>.tar.gz`, of the binaries and image the tests run; or
/// `HPK_BUNDLE`). A missing bundle skips with the reason printed, or fails under
/// `HPK_REQUIRE_TOOLS=1`.
pub fn release_bundle() -> Option<std::path::PathBuf> {
    let path = std::env::var_os("HPK_BUNDLE").map(std::path::PathBuf::from).unwrap_or_else(|| {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join(format!("../target/dist/hpk-{}.tar.gz", env!("CARGO_PKG_VERSION")))
    });
    if path.is_file() {
        return Some(path);
    }
    hpk_test_support::skip(format!("no release bundle at {} (make dist PROFILE=debug)", path.display()));
    None
}

/// The hpk-bubble image the tests run (`make images` builds it into `target/images/`; or
/// `HPK_IMAGE`). A missing image skips with the reason printed, or fails under
/// `HPK_REQUIRE_TOOLS=1`.
pub fn bubble_image() -> Option<std::path::PathBuf> {
    let path = std::env::var_os("HPK_IMAGE").map(std::path::PathBuf::from).unwrap_or_else(|| {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/images/hpk-bubble")
    });
    if path.join("index.json").is_file() {
        return Some(path);
    }
    hpk_test_support::skip(format!("no hpk-bubble image at {} (make images)", path.display()));
    None
}
