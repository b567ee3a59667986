//! The PodSandboxConfig: the pod's identity, hostname, log directory, DNS, ports, labels and
//! Linux options.

use std::collections::HashSet;
use std::path::Path;

use k8s_cri::v1::{LinuxPodSandboxConfig, PodSandboxConfig, PodSandboxMetadata, PortMapping, Protocol};
use k8s_openapi::api::core::v1::Pod;

use super::dns::{DnsSettings, pod_dns_config};
use super::{SpecError, security};

/// Longest hostname the kubelet gives a pod (a DNS label).
const MAX_HOSTNAME: usize = 63;
/// Longest FQDN a kernel hostname can hold.
const MAX_FQDN: usize = 64;

/// The PodSandboxConfig for `pod` (attempt `attempt`), and warnings worth an event on the pod
/// (DNS limits exceeded, ClusterFirst without a cluster DNS).
pub fn sandbox_config(
    pod: &Pod,
    attempt: u32,
    dns: &DnsSettings,
    logs_root: &Path,
) -> Result<(PodSandboxConfig, Vec<String>), SpecError> {
    let meta = &pod.metadata;
    let name = meta.name.clone().unwrap_or_default();
    let namespace = meta.namespace.clone().unwrap_or_else(|| "default".into());
    let uid = meta.uid.clone().unwrap_or_default();
    let spec = pod.spec.as_ref();
    let host_network = spec.and_then(|s| s.host_network).unwrap_or(false);
    let mut warnings = Vec::new();

    let mut labels: std::collections::HashMap<String, String> =
        meta.labels.iter().flatten().map(|(k, v)| (k.clone(), v.clone())).collect();
    labels.insert("io.kubernetes.pod.name".into(), name.clone());
    labels.insert("io.kubernetes.pod.namespace".into(), namespace.clone());
    labels.insert("io.kubernetes.pod.uid".into(), uid.clone());

    let config = PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: name.clone(),
            uid: uid.clone(),
            namespace: namespace.clone(),
            attempt,
        }),
        // A pod on the host's network has the node's hostname (the runtime's default).
        hostname: if host_network { String::new() } else { hostname(pod, &dns.cluster_domain)? },
        log_directory: logs_root.join(format!("{namespace}_{name}_{uid}")).display().to_string(),
        dns_config: Some(pod_dns_config(pod, dns, &mut warnings)?),
        port_mappings: port_mappings(pod),
        labels,
        annotations: meta.annotations.iter().flatten().map(|(k, v)| (k.clone(), v.clone())).collect(),
        linux: Some(LinuxPodSandboxConfig {
            security_context: Some(security::sandbox_security_context(pod)),
            sysctls: spec
                .and_then(|s| s.security_context.as_ref())
                .and_then(|sc| sc.sysctls.as_ref())
                .iter()
                .copied()
                .flatten()
                .map(|s| (crate::pods::admission::dotted_sysctl(&s.name), s.value.clone()))
                .collect(),
            ..LinuxPodSandboxConfig::default()
        }),
        windows: None,
    };
    Ok((config, warnings))
}

/// A DNS-1123 label: lower-case alphanumerics and `-`, starting and ending alphanumeric.
fn is_dns_label(s: &str) -> bool {
    let ok = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    !s.is_empty()
        && s.len() <= MAX_HOSTNAME
        && s.starts_with(ok)
        && s.ends_with(ok)
        && s.chars().all(|c| ok(c) || c == '-')
}

/// `spec.hostname` or the pod's name, cut to 63 characters (and then of trailing `-` and
/// `.`) as the kubelet does; the FQDN with `setHostnameAsFQDN` and a subdomain.
fn hostname(pod: &Pod, cluster_domain: &str) -> Result<String, SpecError> {
    let spec = pod.spec.as_ref();
    let bad = |hostname: &str, reason: String| SpecError::Hostname { hostname: hostname.into(), reason };
    let mut hostname = pod.metadata.name.clone().unwrap_or_default();
    if let Some(wanted) = spec.and_then(|s| s.hostname.as_deref()).filter(|h| !h.is_empty()) {
        if !is_dns_label(wanted) {
            return Err(bad(wanted, "not a valid DNS label".into()));
        }
        hostname = wanted.to_owned();
    }
    if hostname.len() > MAX_HOSTNAME {
        // Names are ASCII (the API server validates them); cut on a char boundary regardless.
        let mut cut = MAX_HOSTNAME;
        while !hostname.is_char_boundary(cut) {
            cut -= 1;
        }
        hostname = hostname[..cut].trim_end_matches(['-', '.']).to_owned();
        if hostname.is_empty() {
            return Err(bad(
                pod.metadata.name.as_deref().unwrap_or_default(),
                "nothing left after truncation".into(),
            ));
        }
    }
    let subdomain = spec.and_then(|s| s.subdomain.as_deref()).unwrap_or_default();
    if spec.and_then(|s| s.set_hostname_as_fqdn).unwrap_or(false) && !subdomain.is_empty() {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        let fqdn = format!("{hostname}.{subdomain}.{namespace}.svc.{cluster_domain}");
        if fqdn.len() > MAX_FQDN {
            let reason = format!(
                "FQDN {fqdn} is too long ({MAX_FQDN} characters is the max, {} characters requested)",
                fqdn.len()
            );
            return Err(bad(&hostname, reason));
        }
        return Ok(fqdn);
    }
    Ok(hostname)
}

/// Every declared port of the pod's containers, as the kubelet maps them (a port without
/// `hostPort` has host port 0); a port name repeated within a container counts once.
fn port_mappings(pod: &Pod) -> Vec<PortMapping> {
    let mut out = Vec::new();
    for container in pod.spec.iter().flat_map(|s| &s.containers) {
        let mut names = HashSet::new();
        for port in container.ports.iter().flatten() {
            let protocol = port.protocol.as_deref().unwrap_or("TCP");
            let name = match &port.name {
                Some(name) if !name.is_empty() => name.clone(),
                _ => format!("{protocol}:{}", port.container_port),
            };
            if !names.insert(name) {
                continue;
            }
            out.push(PortMapping {
                protocol: match protocol {
                    "UDP" => Protocol::Udp,
                    "SCTP" => Protocol::Sctp,
                    _ => Protocol::Tcp,
                } as i32,
                container_port: port.container_port,
                host_port: port.host_port.unwrap_or(0),
                host_ip: port.host_ip.clone().unwrap_or_default(),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri_config::fixtures::pod;
    use k8s_cri::v1::NamespaceMode;
    use serde_json::json;
    use std::path::PathBuf;

    const HOST_RESOLV: &str = "# the host's\nnameserver 192.168.1.1\nnameserver 192.168.1.2\n\
                               search corp.example. lab.example .\noptions ndots:2 edns0\n";

    fn settings(dir: &tempfile::TempDir, cluster_dns: &[&str]) -> DnsSettings {
        let path = dir.path().join("resolv.conf");
        std::fs::write(&path, HOST_RESOLV).expect("write resolv.conf");
        DnsSettings {
            cluster_dns: cluster_dns.iter().map(|s| s.to_string()).collect(),
            cluster_domain: "cluster.local".into(),
            host_resolv_conf: path,
        }
    }

    fn config(spec: serde_json::Value, cluster_dns: &[&str]) -> (PodSandboxConfig, Vec<String>) {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut spec = spec;
        spec["containers"] = json!([{"name": "c", "image": "i"}]);
        sandbox_config(&pod(spec), 2, &settings(&dir, cluster_dns), Path::new("/logs")).expect("config")
    }

    fn dns(
        spec: serde_json::Value,
        cluster_dns: &[&str],
    ) -> (Vec<String>, Vec<String>, Vec<String>, Vec<String>) {
        let (config, warnings) = config(spec, cluster_dns);
        let dns = config.dns_config.expect("dns");
        (dns.servers, dns.searches, dns.options, warnings)
    }

    #[test]
    fn identity_log_directory_and_labels() {
        let mut p = pod(json!({"containers": [{"name": "c", "image": "i"}]}));
        p.metadata.labels = Some([("app".to_owned(), "web".to_owned())].into());
        p.metadata.annotations = Some([("note".to_owned(), "x".to_owned())].into());
        let dir = tempfile::tempdir().expect("tempdir");
        let (c, _) =
            sandbox_config(&p, 3, &settings(&dir, &["10.96.0.10"]), Path::new("/var/log/pods")).expect("ok");
        let meta = c.metadata.expect("metadata");
        assert_eq!(
            (meta.name.as_str(), meta.namespace.as_str(), meta.uid.as_str(), meta.attempt),
            ("web", "default", "uid-1", 3)
        );
        assert_eq!(c.log_directory, "/var/log/pods/default_web_uid-1");
        assert_eq!(c.hostname, "web");
        assert_eq!(c.labels["app"], "web");
        assert_eq!(c.labels["io.kubernetes.pod.name"], "web");
        assert_eq!(c.labels["io.kubernetes.pod.namespace"], "default");
        assert_eq!(c.labels["io.kubernetes.pod.uid"], "uid-1");
        assert_eq!(c.annotations["note"], "x");
    }

    #[test]
    fn cluster_first_uses_the_cluster_dns_then_the_host_searches() {
        let (servers, searches, options, warnings) = dns(json!({}), &["10.96.0.10"]);
        assert_eq!(servers, ["10.96.0.10"]);
        assert_eq!(
            searches,
            [
                "default.svc.cluster.local",
                "svc.cluster.local",
                "cluster.local",
                "corp.example",
                "lab.example"
            ]
        );
        assert_eq!(options, ["ndots:5"]);
        assert!(warnings.is_empty());
        let with_host_net = json!({"dnsPolicy": "ClusterFirstWithHostNet", "hostNetwork": true});
        assert_eq!(dns(with_host_net, &["10.96.0.10"]).0, ["10.96.0.10"]);
    }

    #[test]
    fn default_and_host_network_cluster_first_use_the_host_config() {
        for spec in
            [json!({"dnsPolicy": "Default"}), json!({"dnsPolicy": "ClusterFirst", "hostNetwork": true})]
        {
            let (servers, searches, options, warnings) = dns(spec, &["10.96.0.10"]);
            assert_eq!(servers, ["192.168.1.1", "192.168.1.2"]);
            assert_eq!(searches, ["corp.example", "lab.example"]);
            assert_eq!(options, ["ndots:2", "edns0"]);
            assert!(warnings.is_empty());
        }
    }

    #[test]
    fn cluster_first_without_cluster_dns_falls_back_with_a_warning() {
        let (servers, _, _, warnings) = dns(json!({}), &[]);
        assert_eq!(servers, ["192.168.1.1", "192.168.1.2"]);
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].contains("Falling back to \"Default\" policy"), "{warnings:?}");
    }

    #[test]
    fn none_takes_only_the_pod_dns_config_and_it_merges_everywhere() {
        let dns_config = json!({"nameservers": ["1.1.1.1"], "searches": ["my.example"],
                                "options": [{"name": "ndots", "value": "1"}, {"name": "rotate"}]});
        let (servers, searches, options, _) =
            dns(json!({"dnsPolicy": "None", "dnsConfig": dns_config}), &["10.96.0.10"]);
        assert_eq!(
            (servers, searches, options),
            (
                vec!["1.1.1.1".to_owned()],
                vec!["my.example".to_owned()],
                vec!["ndots:1".to_owned(), "rotate".to_owned()]
            )
        );

        let (servers, searches, options, _) = dns(json!({"dnsConfig": dns_config}), &["10.96.0.10"]);
        assert_eq!(servers, ["10.96.0.10", "1.1.1.1"]);
        assert_eq!(searches.last().map(String::as_str), Some("my.example"));
        assert_eq!(options, ["ndots:1", "rotate"], "the pod's ndots replaces the default in place");
    }

    #[test]
    fn too_many_nameservers_are_cut_with_a_warning() {
        let dns_config = json!({"nameservers": ["1.1.1.1", "8.8.8.8"]});
        let (servers, _, _, warnings) = dns(json!({"dnsPolicy": "Default", "dnsConfig": dns_config}), &[]);
        assert_eq!(servers, ["192.168.1.1", "192.168.1.2", "1.1.1.1"]);
        assert!(warnings.iter().any(|w| w.starts_with("Nameserver limits were exceeded")), "{warnings:?}");
    }

    #[test]
    fn an_unreadable_host_resolv_conf_is_an_error() {
        let p = pod(json!({"dnsPolicy": "Default", "containers": [{"name": "c", "image": "i"}]}));
        let settings = DnsSettings {
            host_resolv_conf: PathBuf::from("/nonexistent/resolv.conf"),
            ..DnsSettings::default()
        };
        let err = sandbox_config(&p, 0, &settings, Path::new("/logs")).expect_err("unreadable");
        assert!(err.to_string().contains("/nonexistent/resolv.conf"), "{err}");
    }

    #[test]
    fn hostname_is_spec_hostname_or_the_pod_name_cut_to_63() {
        assert_eq!(config(json!({"hostname": "db-0"}), &[]).0.hostname, "db-0");
        let long = format!("{}-{}", "a".repeat(62), "tail");
        let mut p = pod(json!({"containers": [{"name": "c", "image": "i"}]}));
        p.metadata.name = Some(long);
        assert_eq!(
            hostname(&p, "cluster.local").expect("ok"),
            "a".repeat(62),
            "cut to 63, trailing '-' trimmed"
        );
        let p = pod(json!({"hostname": "Not_A_Label", "containers": []}));
        assert!(matches!(hostname(&p, "cluster.local"), Err(SpecError::Hostname { .. })));
        let fqdn = json!({"hostname": "db-0", "subdomain": "db", "setHostnameAsFQDN": true});
        assert_eq!(config(fqdn, &[]).0.hostname, "db-0.db.default.svc.cluster.local");
        assert_eq!(config(json!({"hostNetwork": true}), &[]).0.hostname, "", "the node's own");
    }

    #[test]
    fn port_mappings_come_from_every_container_port() {
        let p = pod(json!({"containers": [
            {"name": "a", "image": "i", "ports": [
                {"containerPort": 80, "hostPort": 8080, "hostIP": "127.0.0.1"},
                {"containerPort": 53, "protocol": "UDP", "name": "dns"},
                {"containerPort": 54, "protocol": "UDP", "name": "dns"}]},
            {"name": "b", "image": "i", "ports": [{"containerPort": 9000, "protocol": "SCTP", "hostPort": 9000}]}]}));
        let dir = tempfile::tempdir().expect("tempdir");
        let (c, _) = sandbox_config(&p, 0, &settings(&dir, &[]), Path::new("/l")).expect("ok");
        let got: Vec<_> = c
            .port_mappings
            .iter()
            .map(|m| (m.protocol, m.container_port, m.host_port, m.host_ip.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                (Protocol::Tcp as i32, 80, 8080, "127.0.0.1"),
                (Protocol::Udp as i32, 53, 0, ""),
                (Protocol::Sctp as i32, 9000, 9000, "")
            ]
        );
    }

    #[test]
    fn linux_security_context_and_sysctls_come_from_the_pod() {
        let (c, _) = config(
            json!({"hostIPC": true, "shareProcessNamespace": true,
                   "securityContext": {"runAsUser": 1000, "runAsGroup": 3000, "fsGroup": 2000, "supplementalGroups": [4000],
                                       "sysctls": [{"name": "net.ipv4.ip_unprivileged_port_start", "value": "0"}]}}),
            &[],
        );
        let linux = c.linux.expect("linux");
        assert_eq!(linux.sysctls["net.ipv4.ip_unprivileged_port_start"], "0");
        let sc = linux.security_context.expect("security context");
        assert_eq!(sc.run_as_user.map(|v| v.value), Some(1000));
        assert_eq!(sc.run_as_group.map(|v| v.value), Some(3000));
        assert_eq!(sc.supplemental_groups, [2000, 4000]);
        let ns = sc.namespace_options.expect("namespaces");
        assert_eq!(
            (ns.network, ns.pid, ns.ipc),
            (NamespaceMode::Pod as i32, NamespaceMode::Pod as i32, NamespaceMode::Node as i32)
        );
        assert!(!sc.privileged);
    }
}
