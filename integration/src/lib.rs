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

/// Whether a test that lacks a prerequisite must fail (the README's test command sets
/// `HPK_REQUIRE_TOOLS=1`) rather than skip. Prints why when it skips.
pub fn skip_unless_available<T>(found: Result<T>) -> Option<T> {
    match found {
        Ok(value) => Some(value),
        Err(e) if std::env::var("HPK_REQUIRE_TOOLS").as_deref() != Ok("1") => {
            eprintln!("SKIPPED: {e}");
            None
        }
        Err(e) => panic!("prerequisite missing (HPK_REQUIRE_TOOLS=1): {e}"),
    }
}

/// Whether `tools` are on PATH and busybox-static (the test images' shell) is installed.
/// Prints what is missing and returns false (the test then skips), or panics when
/// HPK_REQUIRE_TOOLS=1 (the test command sets it, after `scripts/setup.sh` installed them).
pub fn tools_present(tools: &[&str]) -> bool {
    let on_path = |name: &str| {
        std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
    };
    let mut missing: Vec<&str> = tools.iter().copied().filter(|t| !on_path(t)).collect();
    if !std::path::Path::new(image::BUSYBOX).is_file() {
        missing.push("busybox-static");
    }
    if missing.is_empty() {
        return true;
    }
    assert!(std::env::var("HPK_REQUIRE_TOOLS").as_deref() != Ok("1"), "missing {missing:?}");
    eprintln!("SKIPPED: missing {missing:?} (scripts/setup.sh installs them)");
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
    let why = format!("no release bundle at {} (make dist PROFILE=debug)", path.display());
    assert!(std::env::var("HPK_REQUIRE_TOOLS").as_deref() != Ok("1"), "{why}");
    eprintln!("SKIPPED: {why}");
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
    let why = format!("no hpk-bubble image at {} (make images)", path.display());
    assert!(std::env::var("HPK_REQUIRE_TOOLS").as_deref() != Ok("1"), "{why}");
    eprintln!("SKIPPED: {why}");
    None
}
