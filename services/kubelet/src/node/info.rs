//! `status.nodeInfo`: facts of the machine and the versions of the kubelet and its runtime.

use std::path::Path;

use k8s_openapi::api::core::v1::NodeSystemInfo;
use tracing::warn;

/// The version the kubelet reports: the Kubernetes release it speaks, with HPK's own version as
/// a semver pre-release tag so that tools parsing it as semver accept it.
pub const KUBELET_VERSION: &str = concat!("v1.35.4-hpk.", env!("CARGO_PKG_VERSION"));

/// The runtime's name in `containerRuntimeVersion`.
pub const RUNTIME_NAME: &str = "hpk-pod-runtime";

/// This build's architecture as Go names it, for `kubernetes.io/arch` and `nodeInfo`.
pub fn architecture() -> String {
    hpk_oci::platform::architecture()
}

/// `PRETTY_NAME` of an os-release file's text, unquoted.
pub fn pretty_name(os_release: &str) -> Option<String> {
    let value = os_release.lines().find_map(|l| l.trim().strip_prefix("PRETTY_NAME="))?;
    let value = value.trim();
    let unquoted = ['"', '\'']
        .iter()
        .find_map(|q| value.strip_prefix(*q).and_then(|v| v.strip_suffix(*q)))
        .unwrap_or(value);
    Some(unquoted.replace("\\\"", "\"")).filter(|v| !v.is_empty())
}

/// `containerRuntimeVersion` for the runtime's CRI `runtime_version`.
pub fn runtime_version(version: &str) -> String {
    format!("{RUNTIME_NAME}://{version}")
}

/// The machine's facts; what cannot be read is logged and left empty (or derived, for the
/// system UUID, which a VM or container often cannot read).
pub fn read(runtime_version_text: Option<&str>) -> NodeSystemInfo {
    let machine_id = first_line("/etc/machine-id").unwrap_or_default();
    let system_uuid = first_line("/sys/class/dmi/id/product_uuid").unwrap_or_else(|| machine_id.clone());
    let os_image = std::fs::read_to_string("/etc/os-release")
        .ok()
        .as_deref()
        .and_then(pretty_name)
        .unwrap_or_else(|| "Linux".to_owned());
    NodeSystemInfo {
        machine_id,
        system_uuid,
        boot_id: first_line("/proc/sys/kernel/random/boot_id").unwrap_or_default(),
        kernel_version: nix::sys::utsname::uname()
            .map(|u| u.release().to_string_lossy().into_owned())
            .unwrap_or_default(),
        os_image,
        container_runtime_version: runtime_version(runtime_version_text.unwrap_or("unknown")),
        kubelet_version: KUBELET_VERSION.to_owned(),
        kube_proxy_version: String::new(),
        operating_system: "linux".to_owned(),
        architecture: architecture(),
        ..Default::default()
    }
}

/// The first line of a small file, trimmed; `None` (debug-logged) when unreadable or empty.
fn first_line(path: &str) -> Option<String> {
    match std::fs::read_to_string(Path::new(path)) {
        Ok(text) => text.lines().next().map(|l| l.trim().to_owned()).filter(|l| !l.is_empty()),
        Err(e) => {
            // product_uuid is root-only on most machines: expected, hence no warning for it.
            if !path.starts_with("/sys/class/dmi") {
                warn!(path, error = %e, "cannot read a node fact");
            }
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn os_release_pretty_name() {
        let text = "NAME=\"Ubuntu\"\nPRETTY_NAME=\"Ubuntu 24.04.1 LTS\"\nID=ubuntu\n";
        assert_eq!(pretty_name(text).as_deref(), Some("Ubuntu 24.04.1 LTS"));
        assert_eq!(pretty_name("PRETTY_NAME=Alpine").as_deref(), Some("Alpine"));
        assert_eq!(pretty_name("PRETTY_NAME='Rocky 9'").as_deref(), Some("Rocky 9"));
        assert_eq!(pretty_name("NAME=x"), None);
        assert_eq!(pretty_name("PRETTY_NAME=\"\""), None);
    }

    #[test]
    fn kubelet_version_is_semver_with_a_v() {
        let rest = KUBELET_VERSION.strip_prefix("v1.35.4-hpk.").unwrap();
        assert!(!rest.is_empty());
        // Pre-release identifiers: non-empty, [0-9A-Za-z-], numeric ones without leading zeros.
        for id in format!("hpk.{rest}").split(['.']) {
            assert!(!id.is_empty() && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'), "{id}");
            if id.chars().all(|c| c.is_ascii_digit()) {
                assert!(id == "0" || !id.starts_with('0'), "{id}");
            }
        }
    }

    #[test]
    fn facts_of_this_machine() {
        let info = read(Some("0.1.0"));
        assert_eq!(info.container_runtime_version, "hpk-pod-runtime://0.1.0");
        assert_eq!(info.operating_system, "linux");
        assert!(!info.kernel_version.is_empty());
        assert_eq!(info.kube_proxy_version, "");
    }
}
