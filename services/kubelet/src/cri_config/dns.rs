//! The pod's DNS config from its dnsPolicy and dnsConfig, as the kubelet forms it.

use std::path::{Path, PathBuf};

use k8s_cri::v1::DnsConfig;
use k8s_openapi::api::core::v1::{Pod, PodDNSConfig};

use super::SpecError;

/// How this node resolves names: the cluster DNS service and the host's resolv.conf.
#[derive(Clone, Debug, Default)]
pub struct DnsSettings {
    /// The cluster DNS service's addresses (`--cluster-dns`); empty when there is none.
    pub cluster_dns: Vec<String>,
    /// The cluster's domain (`cluster.local`); empty for none.
    pub cluster_domain: String,
    /// The resolv.conf whose servers, searches and options `dnsPolicy: Default` pods get (and
    /// whose searches ClusterFirst pods get after the cluster's); an empty path means none
    /// (pods then resolve through 127.0.0.1, as the kubelet does with `--resolv-conf=""`).
    pub host_resolv_conf: PathBuf,
}

const MAX_NAMESERVERS: usize = 3;
const MAX_SEARCHES: usize = 32;
const MAX_SEARCH_LINE: usize = 2048;
const MAX_SEARCH_LEN: usize = 253;

/// Servers, searches and options from a resolv.conf text.
fn parse_resolv_conf(text: &str) -> DnsConfig {
    let mut dns = DnsConfig::default();
    for line in text.lines() {
        if line.starts_with([';', '#']) {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        match fields.first() {
            Some(&"nameserver") if fields.len() > 1 => dns.servers.push(fields[1].to_owned()),
            // The last search line wins; `.` and trailing dots are dropped so a domain counts once.
            Some(&"search") => {
                dns.searches = fields[1..]
                    .iter()
                    .filter(|s| **s != ".")
                    .map(|s| s.trim_end_matches('.').to_owned())
                    .collect();
            }
            Some(&"options") => dns.options = merge_options(&dns.options, fields[1..].iter().copied()),
            _ => {}
        }
    }
    dns
}

fn host_config(path: &Path) -> Result<DnsConfig, SpecError> {
    if path.as_os_str().is_empty() {
        return Ok(DnsConfig {
            servers: vec!["127.0.0.1".into()],
            searches: vec![".".into()],
            options: vec![],
        });
    }
    let text = std::fs::read_to_string(path)
        .map_err(|source| SpecError::ResolvConf { path: path.to_owned(), source })?;
    Ok(parse_resolv_conf(&text))
}

/// `existing` with `more` appended, each name once: a later `name[:value]` replaces the
/// earlier one in its place.
fn merge_options<'a>(existing: &[String], more: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let mut out = existing.to_vec();
    for option in more {
        let name = option.split_once(':').map_or(option, |(n, _)| n);
        let same = |o: &String| o.split_once(':').map_or(o.as_str(), |(n, _)| n) == name;
        match out.iter_mut().find(|o| same(o)) {
            Some(slot) => *slot = option.to_owned(),
            None => out.push(option.to_owned()),
        }
    }
    out
}

fn push_unique(list: &mut Vec<String>, more: impl IntoIterator<Item = String>) {
    for item in more {
        if !list.contains(&item) {
            list.push(item);
        }
    }
}

fn append_pod_config(dns: &mut DnsConfig, pod_config: &PodDNSConfig) {
    push_unique(&mut dns.servers, pod_config.nameservers.iter().flatten().cloned());
    push_unique(&mut dns.searches, pod_config.searches.iter().flatten().cloned());
    let options: Vec<String> = pod_config
        .options
        .iter()
        .flatten()
        .filter_map(|o| {
            let name = o.name.as_deref()?;
            Some(match o.value.as_deref() {
                Some(value) if !value.is_empty() => format!("{name}:{value}"),
                _ => name.to_owned(),
            })
        })
        .collect();
    dns.options = merge_options(&dns.options, options.iter().map(String::as_str));
}

/// Cuts servers and searches to what resolvers accept, saying what was cut.
fn fit_limits(dns: &mut DnsConfig, warnings: &mut Vec<String>) {
    if dns.servers.len() > MAX_NAMESERVERS {
        dns.servers.truncate(MAX_NAMESERVERS);
        warnings.push(format!(
            "Nameserver limits were exceeded, some nameservers have been omitted, the applied nameserver line \
             is: {}",
            dns.servers.join(" ")
        ));
    }
    let mut exceeded = dns.searches.len() > MAX_SEARCHES;
    dns.searches.truncate(MAX_SEARCHES);
    let before = dns.searches.len();
    dns.searches.retain(|s| s.len() <= MAX_SEARCH_LEN);
    exceeded |= dns.searches.len() != before;
    while dns.searches.join(" ").len() > MAX_SEARCH_LINE {
        dns.searches.pop();
        exceeded = true;
    }
    if exceeded {
        warnings.push(format!(
            "Search Line limits were exceeded, some search paths have been omitted, the applied search line \
             is: {}",
            dns.searches.join(" ")
        ));
    }
}

/// The pod's DNS config; warnings (for events) are appended to `warnings`.
pub(super) fn pod_dns_config(
    pod: &Pod,
    settings: &DnsSettings,
    warnings: &mut Vec<String>,
) -> Result<DnsConfig, SpecError> {
    let spec = pod.spec.as_ref();
    let host_network = spec.and_then(|s| s.host_network).unwrap_or(false);
    let policy = spec.and_then(|s| s.dns_policy.as_deref()).unwrap_or("ClusterFirst");
    let cluster = match policy {
        "None" => None,
        "ClusterFirstWithHostNet" => Some(true),
        // ClusterFirst on the host's network resolves as the host does.
        "ClusterFirst" => Some(!host_network),
        _ => Some(false),
    };
    let mut dns = match cluster {
        None => DnsConfig::default(),
        Some(true) if !settings.cluster_dns.is_empty() => {
            let host = host_config(&settings.host_resolv_conf)?;
            let mut searches = Vec::new();
            let domain = &settings.cluster_domain;
            if !domain.is_empty() {
                let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
                searches = vec![format!("{namespace}.svc.{domain}"), format!("svc.{domain}"), domain.clone()];
            }
            push_unique(&mut searches, host.searches.into_iter().filter(|s| s != "."));
            DnsConfig { servers: settings.cluster_dns.clone(), searches, options: vec!["ndots:5".into()] }
        }
        Some(true) => {
            warnings.push(format!(
                "kubelet does not have ClusterDNS IP configured and cannot create Pod using {policy:?} policy. \
                 Falling back to \"Default\" policy."
            ));
            host_config(&settings.host_resolv_conf)?
        }
        Some(false) => host_config(&settings.host_resolv_conf)?,
    };
    if let Some(pod_config) = spec.and_then(|s| s.dns_config.as_ref()) {
        append_pod_config(&mut dns, pod_config);
    }
    fit_limits(&mut dns, warnings);
    Ok(dns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolv_conf_parses_as_the_kubelet_reads_it() {
        let dns = parse_resolv_conf(
            "; comment\n# comment\nnameserver 10.0.0.1\nnameserver\nsearch old.example\n\
             search a.example. . b.example\noptions ndots:2 timeout:1\noptions ndots:3 rotate\ndomain x\n",
        );
        assert_eq!(dns.servers, ["10.0.0.1"]);
        assert_eq!(dns.searches, ["a.example", "b.example"], "the last search line wins");
        assert_eq!(dns.options, ["ndots:3", "timeout:1", "rotate"]);
    }

    #[test]
    fn no_host_resolv_conf_means_localhost() {
        let dns = host_config(Path::new("")).expect("no file is fine");
        assert_eq!((dns.servers, dns.searches), (vec!["127.0.0.1".to_owned()], vec![".".to_owned()]));
    }

    #[test]
    fn search_paths_are_cut_to_resolver_limits() {
        let mut warnings = Vec::new();
        let mut dns = DnsConfig {
            searches: (0..40).map(|i| format!("d{i}.example")).collect(),
            ..DnsConfig::default()
        };
        fit_limits(&mut dns, &mut warnings);
        assert_eq!(dns.searches.len(), MAX_SEARCHES);
        assert!(warnings[0].starts_with("Search Line limits were exceeded"), "{warnings:?}");

        let mut warnings = Vec::new();
        let long = "x".repeat(250);
        let mut dns = DnsConfig {
            searches: vec![
                "y".repeat(300),
                "ok.example".into(),
                long.clone(),
                long.clone(),
                long.clone(),
                long.clone(),
                long.clone(),
                long.clone(),
                long.clone(),
                long.clone(),
                long.clone(),
            ],
            ..DnsConfig::default()
        };
        fit_limits(&mut dns, &mut warnings);
        assert_eq!(dns.searches[0], "ok.example", "a path over 253 characters is dropped");
        assert!(dns.searches.join(" ").len() <= MAX_SEARCH_LINE);
        assert_eq!(warnings.len(), 1);

        let mut warnings = Vec::new();
        let mut dns =
            DnsConfig { servers: vec!["a".into()], searches: vec!["b".into()], ..DnsConfig::default() };
        fit_limits(&mut dns, &mut warnings);
        assert!(warnings.is_empty());
    }
}
