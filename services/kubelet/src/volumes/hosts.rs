//! The pod's `/etc/hosts`, written as the kubelet writes it: localhost, the pod's own name (and
//! FQDN with a subdomain), then the pod's `hostAliases`. A pod on the host's network gets the
//! node's own `/etc/hosts` instead (what the bubble sees there), with its `hostAliases` after
//! it, as upstream gives it.

use std::fmt::Write as _;
use std::fs::{self, OpenOptions, Permissions};
use std::io::Write as _;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{Container, Pod};

use super::VolumeError;

/// Where `/etc/hosts` is mounted in a container.
const ETC_HOSTS: &str = "/etc/hosts";

/// The file under the pod's directory.
const FILE: &str = "etc-hosts";

/// The node's hosts file, as the kubelet sees it (the bubble binds it read-only).
pub const NODE_ETC_HOSTS: &str = "/etc/hosts";

/// The most of the node's hosts file a hostNetwork pod's copy takes.
const MAX_NODE_HOSTS: u64 = 1 << 20;

/// The pod's hostname: `spec.hostname`, else its name cut to 63 characters (a DNS label).
pub fn hostname(pod: &Pod) -> String {
    if let Some(name) = pod.spec.as_ref().and_then(|s| s.hostname.as_deref()).filter(|h| !h.is_empty()) {
        return name.to_owned();
    }
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let cut: String = name.chars().take(63).collect();
    cut.trim_end_matches(['-', '.']).to_owned()
}

/// The text of the pod's `/etc/hosts`; `node_hosts` is the node's hosts file, which a pod on
/// the host's network gets instead of the kubelet's lines.
pub fn etc_hosts(pod: &Pod, pod_ip: &str, cluster_domain: &str, node_hosts: &str) -> String {
    let spec = pod.spec.as_ref();
    if spec.and_then(|s| s.host_network) == Some(true) {
        let mut text = node_hosts.to_owned();
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        host_aliases(pod, &mut text);
        return text;
    }
    let mut text = String::from(
        "# Kubernetes-managed hosts file.\n\
         127.0.0.1\tlocalhost\n\
         ::1\tlocalhost ip6-localhost ip6-loopback\n\
         fe00::0\tip6-localnet\n\
         fe00::0\tip6-mcastprefix\n\
         fe00::1\tip6-allnodes\n\
         fe00::2\tip6-allrouters\n",
    );
    let host = hostname(pod);
    if !pod_ip.is_empty() {
        let subdomain = spec.and_then(|s| s.subdomain.as_deref()).filter(|s| !s.is_empty());
        match subdomain {
            Some(sub) => {
                let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
                let domain = cluster_domain.trim_end_matches('.');
                let _ = writeln!(text, "{pod_ip}\t{host}.{sub}.{namespace}.svc.{domain}\t{host}");
            }
            None => {
                let _ = writeln!(text, "{pod_ip}\t{host}");
            }
        }
    }
    host_aliases(pod, &mut text);
    text
}

/// Appends the pod's `hostAliases` block to `text`.
fn host_aliases(pod: &Pod, text: &mut String) {
    let aliases = pod.spec.as_ref().and_then(|s| s.host_aliases.as_deref()).unwrap_or_default();
    if !aliases.is_empty() {
        text.push_str("\n# Entries added by HostAliases.\n");
        for alias in aliases {
            let names = alias.hostnames.as_deref().unwrap_or_default().join("\t");
            let _ = writeln!(text, "{}\t{names}", alias.ip);
        }
    }
}

/// The node's hosts file (its first MiB); empty when it cannot be read.
fn node_etc_hosts() -> String {
    use std::io::Read as _;
    let mut bytes = Vec::new();
    match fs::File::open(NODE_ETC_HOSTS) {
        Ok(file) => {
            if let Err(error) = file.take(MAX_NODE_HOSTS).read_to_end(&mut bytes) {
                tracing::warn!(%error, "reading the node's /etc/hosts failed");
            }
        }
        Err(error) => tracing::warn!(%error, "the node's /etc/hosts cannot be read"),
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Writes the pod's `/etc/hosts` to `pod_dir/etc-hosts` (replacing it atomically) and returns
/// its mount on `/etc/hosts`; see [`wants_etc_hosts`] for which containers get it.
pub fn write_etc_hosts(
    pod: &Pod,
    pod_ip: &str,
    cluster_domain: &str,
    pod_dir: &Path,
) -> Result<cri::Mount, VolumeError> {
    let target = pod_dir.join(FILE);
    let tmp = pod_dir.join(format!(".{FILE}.tmp"));
    super::atomic::make_dir("", pod_dir)?;
    let _ = fs::remove_file(&tmp);
    let mut out = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(&tmp)
        .map_err(VolumeError::io("", "create", &tmp))?;
    let host_network = pod.spec.as_ref().and_then(|s| s.host_network) == Some(true);
    let node_hosts = if host_network { node_etc_hosts() } else { String::new() };
    out.write_all(etc_hosts(pod, pod_ip, cluster_domain, &node_hosts).as_bytes())
        .map_err(VolumeError::io("", "write", &tmp))?;
    fs::set_permissions(&tmp, Permissions::from_mode(0o644)).map_err(VolumeError::io("", "chmod", &tmp))?;
    fs::rename(&tmp, &target).map_err(VolumeError::io("", "rename", &tmp))?;
    Ok(cri::Mount {
        container_path: ETC_HOSTS.to_owned(),
        host_path: target.display().to_string(),
        ..cri::Mount::default()
    })
}

/// Whether `container` gets the pod's `/etc/hosts`: not when it mounts something there itself.
pub fn wants_etc_hosts(container: &Container) -> bool {
    !container.volume_mounts.iter().flatten().any(|m| Path::new(&m.mount_path) == Path::new(ETC_HOSTS))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web-0", "namespace": "shop"},
            "spec": spec,
        }))
        .expect("pod")
    }

    #[test]
    fn etc_hosts_has_localhost_the_pod_and_its_aliases() {
        let pod = pod(serde_json::json!({
            "containers": [{"name": "c", "image": "i"}],
            "hostname": "db", "subdomain": "cluster",
            "hostAliases": [{"ip": "10.1.2.3", "hostnames": ["foo.local", "bar.local"]},
                            {"ip": "10.1.2.4", "hostnames": ["baz"]}],
        }));
        let dir = tempfile::tempdir().expect("tempdir");
        let mount = write_etc_hosts(&pod, "10.244.0.9", "cluster.local", dir.path()).expect("written");
        assert_eq!(mount.container_path, "/etc/hosts");
        let text = fs::read_to_string(&mount.host_path).expect("read");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "# Kubernetes-managed hosts file.");
        assert!(lines.contains(&"127.0.0.1\tlocalhost"));
        assert!(lines.contains(&"::1\tlocalhost ip6-localhost ip6-loopback"));
        assert!(lines.contains(&"10.244.0.9\tdb.cluster.shop.svc.cluster.local\tdb"));
        let aliases = text.split("# Entries added by HostAliases.\n").nth(1).expect("alias block");
        assert_eq!(aliases, "10.1.2.3\tfoo.local\tbar.local\n10.1.2.4\tbaz\n");
        let mode = fs::metadata(&mount.host_path).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode, 0o644);
    }

    #[test]
    fn etc_hosts_without_subdomain_uses_the_pod_name() {
        let text = etc_hosts(&pod(serde_json::json!({"containers": []})), "10.0.0.1", "cluster.local", "x");
        assert!(text.ends_with("fe00::2\tip6-allrouters\n10.0.0.1\tweb-0\n"), "{text}");
        assert!(!text.contains("HostAliases"));
    }

    #[test]
    fn a_pod_on_the_hosts_network_gets_the_nodes_file_and_its_aliases() {
        let node = "127.0.0.1 localhost\n10.1.0.7 node-1";
        let plain = pod(serde_json::json!({"containers": [], "hostNetwork": true}));
        assert_eq!(etc_hosts(&plain, "10.1.0.7", "cluster.local", node), format!("{node}\n"));
        let aliased = pod(serde_json::json!({
            "containers": [], "hostNetwork": true,
            "hostAliases": [{"ip": "10.1.2.3", "hostnames": ["foo.local"]}],
        }));
        let text = etc_hosts(&aliased, "10.1.0.7", "cluster.local", node);
        assert_eq!(text, format!("{node}\n\n# Entries added by HostAliases.\n10.1.2.3\tfoo.local\n"));
        assert!(!text.contains("Kubernetes-managed"));
    }

    #[test]
    fn a_container_mounting_etc_hosts_keeps_its_own() {
        let mut container = Container { name: "c".into(), ..Container::default() };
        assert!(wants_etc_hosts(&container));
        container.volume_mounts = Some(vec![k8s_openapi::api::core::v1::VolumeMount {
            name: "h".into(),
            mount_path: "/etc/hosts".into(),
            ..Default::default()
        }]);
        assert!(!wants_etc_hosts(&container));
    }
}
