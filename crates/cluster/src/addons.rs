//! What every HPK cluster runs besides our services, shared by the bubbles and the test
//! harness so that the two cannot drift apart: the cluster's address ranges, upstream
//! kube-proxy's flags (nftables mode), and the add-ons' manifests (`deploy/`): CoreDNS,
//! metrics-server, and the local-path provisioner with the cluster's StorageClasses.

use std::net::Ipv4Addr;
use std::path::Path;

use crate::error::{Error, Result};

/// The Service CIDR; its first address is the `kubernetes` Service.
pub const SERVICE_CIDR: &str = "10.96.0.0/16";
/// The pod CIDR node podCIDRs are cut from ([`NODE_CIDR_MASK`] each): 10.244.0.0-10.247.255.255,
/// room for 1,024 nodes of up to 254 pods (a /16 stopped at 256 nodes: docs/scale.md).
pub const CLUSTER_CIDR: &str = "10.244.0.0/14";
/// The prefix length of each node's podCIDR (the controller-manager's `--node-cidr-mask-size`).
pub const NODE_CIDR_MASK: u8 = 24;
/// The `kubernetes` Service's address.
pub const KUBERNETES_SERVICE_IP: &str = "10.96.0.1";
/// The cluster DNS Service's address (the kubelets' `--cluster-dns`).
pub const CLUSTER_DNS_IP: &str = "10.96.0.10";
/// The cluster domain (the kubelets' `--cluster-domain`).
pub const CLUSTER_DOMAIN: &str = "cluster.local";

/// kube-proxy's health endpoint on the node's loopback (200 once its rules are synced).
pub const KUBE_PROXY_HEALTHZ: &str = "127.0.0.1:10256";
/// kube-proxy's metrics on the node's loopback.
pub const KUBE_PROXY_METRICS: &str = "127.0.0.1:10249";
/// The identity kube-proxy authenticates as; the API server's bootstrap policy binds it to
/// ClusterRole `system:node-proxier`.
pub const KUBE_PROXY_USER: &str = "system:kube-proxy";

/// The flags for kube-proxy on node `node` (address `node_ip`) with `kubeconfig`: nftables
/// mode (Debian 12's nft 1.0.6 works: kube-proxy writes base-chain priorities as numbers), the
/// pod CIDR, health and metrics on loopback only, and no conntrack sysctls (global, or not
/// writable in a network namespace and a rootless bubble).
pub fn kube_proxy_args(node: &str, node_ip: Ipv4Addr, kubeconfig: &Path) -> Vec<String> {
    vec![
        "--proxy-mode=nftables".into(),
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--hostname-override={node}"),
        // Its idea of the node's primary address (NodePorts), not a listener.
        format!("--bind-address={node_ip}"),
        format!("--cluster-cidr={CLUSTER_CIDR}"),
        format!("--healthz-bind-address={KUBE_PROXY_HEALTHZ}"),
        format!("--metrics-bind-address={KUBE_PROXY_METRICS}"),
        "--conntrack-max-per-core=0".into(),
        "--conntrack-min=0".into(),
        "--conntrack-tcp-timeout-established=0".into(),
        "--conntrack-tcp-timeout-close-wait=0".into(),
        "--profiling=false".into(),
    ]
}

/// The CoreDNS image a cluster runs unless told otherwise (pulled by the nodes, through each
/// bubble's egress); `hpk up --coredns-image` names another, e.g. in a local registry.
pub const DEFAULT_COREDNS_IMAGE: &str = "registry.k8s.io/coredns/coredns:v1.12.1";

/// The CoreDNS manifest template (ServiceAccount, RBAC, Corefile, Deployment, Service
/// `kube-dns`).
pub const COREDNS_MANIFEST: &str = include_str!("../../../deploy/coredns.yaml");

/// The CoreDNS manifest for `image` with this cluster's addresses; an error names a
/// placeholder left unfilled.
pub fn coredns_manifest(image: &str) -> Result<String> {
    let text = COREDNS_MANIFEST
        .replace("${COREDNS_IMAGE}", image)
        .replace("${CLUSTER_DNS_IP}", CLUSTER_DNS_IP)
        .replace("${CLUSTER_DOMAIN}", CLUSTER_DOMAIN)
        .replace("${KUBERNETES_SERVICE_IP}", KUBERNETES_SERVICE_IP);
    all_filled("deploy/coredns.yaml", text)
}

/// The metrics-server image a cluster runs unless told otherwise (the version
/// `scripts/setup.sh` builds from the Go module proxy for the tests);
/// `hpk up --metrics-server-image` names another.
pub const DEFAULT_METRICS_SERVER_IMAGE: &str = "registry.k8s.io/metrics-server/metrics-server:v0.9.0";

/// The metrics-server manifest template (RBAC, the kubelet CA, Deployment, Service, APIService
/// `v1beta1.metrics.k8s.io`).
pub const METRICS_SERVER_MANIFEST: &str = include_str!("../../../deploy/metrics-server.yaml");

/// The metrics-server manifest for `image`, verifying kubelets with `kubelet_ca` (PEM); an
/// error names a placeholder left unfilled or a CA that is no PEM certificate.
pub fn metrics_server_manifest(image: &str, kubelet_ca: &str) -> Result<String> {
    if !kubelet_ca.contains("-----BEGIN CERTIFICATE-----") {
        return Err(Error::Invalid("the kubelet CA for metrics-server is no PEM certificate".into()));
    }
    let ca: String =
        kubelet_ca.lines().filter(|l| !l.trim().is_empty()).map(|l| format!("    {l}\n")).collect();
    let text = METRICS_SERVER_MANIFEST
        .replace("${METRICS_SERVER_IMAGE}", image)
        .replace("${KUBERNETES_SERVICE_IP}", KUBERNETES_SERVICE_IP)
        .replace("${KUBELET_CA}\n", &ca);
    all_filled("deploy/metrics-server.yaml", text)
}

/// The local-path provisioner image a cluster runs unless told otherwise (the version
/// `scripts/setup.sh` builds from the Go module proxy for the tests, as K3s ships it);
/// `hpk up --local-path-provisioner-image` names another.
pub const DEFAULT_LOCAL_PATH_PROVISIONER_IMAGE: &str = "docker.io/rancher/local-path-provisioner:v0.0.30";

/// The image of the provisioner's helper pods, which make and remove each volume's directory
/// (`/bin/sh`, `mkdir`, `rm`); `hpk up --local-path-helper-image` names another.
pub const DEFAULT_LOCAL_PATH_HELPER_IMAGE: &str = "docker.io/library/busybox:1.37";

/// The default StorageClass: node-local volumes.
pub const LOCAL_STORAGE_CLASS: &str = "local-path";
/// The StorageClass of shared volumes (ReadWriteMany; removed with their claim).
pub const SHARED_STORAGE_CLASS: &str = "hpk-shared";
/// The StorageClass of shared volumes kept when their claim goes (reclaim policy Retain), at
/// a path named after the claim, `retained/<namespace>/<claim>`, which a later cluster's claim
/// of the same name finds again.
pub const SHARED_RETAIN_STORAGE_CLASS: &str = "hpk-shared-retain";

/// The local-path provisioner's manifest template (RBAC, its configuration, Deployment, the
/// default StorageClass).
pub const LOCAL_PATH_MANIFEST: &str = include_str!("../../../deploy/local-path-provisioner.yaml");

/// What the local-path provisioner is deployed with.
#[derive(Debug, Clone, Copy)]
pub struct LocalPath<'a> {
    /// The provisioner's image.
    pub image: &'a str,
    /// Its helper pods' image.
    pub helper_image: &'a str,
    /// Where node-local volumes are made, as every node (and so every pod) sees it.
    pub node_dir: &'a str,
    /// The directory shared volumes are made in, at the same path on every node; without it
    /// there are no shared StorageClasses.
    pub shared_dir: Option<&'a str>,
}

/// The local-path provisioner's manifest: [`LOCAL_STORAGE_CLASS`] (the default) always,
/// [`SHARED_STORAGE_CLASS`] and [`SHARED_RETAIN_STORAGE_CLASS`] with a shared directory.
/// An error names a placeholder left unfilled or a directory that is not an absolute path.
pub fn local_path_manifest(options: &LocalPath<'_>) -> Result<String> {
    for dir in std::iter::once(options.node_dir).chain(options.shared_dir) {
        if !dir.starts_with('/') || dir.contains('\n') {
            return Err(Error::Invalid(format!("a volume directory must be an absolute path: {dir:?}")));
        }
    }
    let node_paths = serde_json::json!({"nodePathMap": [
        {"node": "DEFAULT_PATH_FOR_NON_LISTED_NODES", "paths": [options.node_dir]}
    ]});
    let mut classes = serde_json::Map::new();
    classes.insert(LOCAL_STORAGE_CLASS.into(), node_paths);
    let mut shared_classes = String::new();
    if let Some(dir) = options.shared_dir {
        for (class, policy, pattern) in [
            (SHARED_STORAGE_CLASS, "Delete", None),
            (SHARED_RETAIN_STORAGE_CLASS, "Retain", Some("retained/{{ .PVC.Namespace }}/{{ .PVC.Name }}")),
        ] {
            classes.insert(class.into(), serde_json::json!({"sharedFileSystemPath": dir}));
            shared_classes.push_str(&format!(
                "---\napiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata:\n  name: {class}\n\
                 provisioner: rancher.io/local-path\nvolumeBindingMode: Immediate\nreclaimPolicy: {policy}\n"
            ));
            if let Some(pattern) = pattern {
                shared_classes.push_str(&format!("parameters:\n  pathPattern: {pattern:?}\n"));
            }
        }
    }
    let config = serde_json::json!({"storageClassConfigs": classes});
    let config = serde_json::to_string_pretty(&config)
        .map_err(|e| Error::Invalid(format!("the local-path configuration: {e}")))?;
    let config: String = config.lines().map(|l| format!("    {l}\n")).collect();
    let text = LOCAL_PATH_MANIFEST
        .replace("${LOCAL_PATH_PROVISIONER_IMAGE}", options.image)
        .replace("${LOCAL_PATH_HELPER_IMAGE}", options.helper_image)
        .replace("${KUBERNETES_SERVICE_IP}", KUBERNETES_SERVICE_IP)
        .replace("${LOCAL_PATH_NODE_DIR}", options.node_dir)
        .replace("    ${LOCAL_PATH_CONFIG}\n", &config);
    all_filled("deploy/local-path-provisioner.yaml", text + &shared_classes)
}

/// `text`, unless a `${…}` placeholder of template `name` is left in it.
fn all_filled(name: &str, text: String) -> Result<String> {
    match text.find("${") {
        Some(at) => Err(Error::Invalid(format!(
            "{name} has a placeholder without a value: {}}}",
            text[at..].split('}').next().unwrap_or("${")
        ))),
        None => Ok(text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_placeholder_is_filled() {
        let text = coredns_manifest("registry:5000/hpk/coredns:x").expect("manifest");
        assert!(text.contains("image: registry:5000/hpk/coredns:x"), "{text}");
        assert!(text.contains(CLUSTER_DNS_IP) && text.contains(CLUSTER_DOMAIN), "{text}");
        assert!(!text.contains("${"), "{text}");
    }

    #[test]
    fn metrics_server_gets_its_image_and_the_kubelet_ca_as_yaml() {
        let ca = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
        let text = metrics_server_manifest("registry:5000/hpk/metrics-server:x", ca).expect("manifest");
        assert!(text.contains("image: registry:5000/hpk/metrics-server:x"), "{text}");
        assert!(!text.contains("${"), "{text}");
        // The CA as the ConfigMap's block scalar: every line indented under `ca.crt: |`.
        assert!(
            text.contains(
                "  ca.crt: |\n    -----BEGIN CERTIFICATE-----\n    MIIB\n    -----END CERTIFICATE-----\n---\n"
            ),
            "{text}"
        );
        assert!(text.contains("kind: APIService"), "{text}");
        let err = metrics_server_manifest("i", "not a certificate").expect_err("no PEM").to_string();
        assert!(err.contains("no PEM certificate"), "{err}");
    }

    #[test]
    fn local_path_has_the_default_class_and_the_shared_ones_only_with_a_shared_directory() {
        let options = LocalPath {
            image: "registry:5000/hpk/local-path-provisioner:x",
            helper_image: "registry:5000/hpk/shell:v1",
            node_dir: "/var/local/hpk/local-path",
            shared_dir: None,
        };
        let text = local_path_manifest(&options).expect("manifest");
        assert!(text.contains("image: registry:5000/hpk/local-path-provisioner:x"), "{text}");
        assert!(text.contains("image: registry:5000/hpk/shell:v1"), "the helper pod's image: {text}");
        assert!(!text.contains("${"), "{text}");
        assert!(text.contains("storageclass.kubernetes.io/is-default-class: \"true\""), "{text}");
        // The configuration as the ConfigMap's block scalar, the node's path in it.
        assert!(text.contains("  config.json: |\n    {\n      \"storageClassConfigs\": {\n"), "{text}");
        assert!(text.contains("\"/var/local/hpk/local-path\""), "{text}");
        assert!(!text.contains(SHARED_STORAGE_CLASS) && !text.contains("sharedFileSystemPath"), "{text}");

        let shared = LocalPath { shared_dir: Some("/scratch/me/\"vols\""), ..options };
        let text = local_path_manifest(&shared).expect("manifest");
        assert_eq!(
            text.matches("\"sharedFileSystemPath\": \"/scratch/me/\\\"vols\\\"\"").count(),
            2,
            "{text}"
        );
        assert!(
            text.contains("  name: hpk-shared\nprovisioner: rancher.io/local-path\nvolumeBindingMode: Immediate\nreclaimPolicy: Delete\n"),
            "{text}"
        );
        assert!(
            text.contains("  name: hpk-shared-retain\nprovisioner: rancher.io/local-path\nvolumeBindingMode: Immediate\nreclaimPolicy: Retain\nparameters:\n  pathPattern: \"retained/{{ .PVC.Namespace }}/{{ .PVC.Name }}\"\n"),
            "{text}"
        );
        assert_eq!(text.matches("kind: StorageClass").count(), 3, "{text}");

        let relative = LocalPath { shared_dir: Some("scratch"), ..options };
        let err = local_path_manifest(&relative).expect_err("relative").to_string();
        assert!(err.contains("absolute path"), "{err}");
    }

    /// (first, last) address of a CIDR, host bits checked zero.
    fn range(cidr: &str) -> (u32, u32, u8) {
        let (network, prefix) = cidr.split_once('/').expect("a CIDR");
        let network = u32::from(network.parse::<Ipv4Addr>().expect("an address"));
        let prefix: u8 = prefix.parse().expect("a prefix");
        assert_eq!(network & (u32::MAX >> prefix), 0, "{cidr}: host bits zero");
        (network, network | (u32::MAX >> prefix), prefix)
    }

    #[test]
    fn the_pod_range_holds_a_thousand_nodes_of_110_pods_apart_from_the_services() {
        let (first, last, prefix) = range(CLUSTER_CIDR);
        let nodes = 1u32 << (NODE_CIDR_MASK - prefix);
        let pods_per_node = (1u32 << (32 - NODE_CIDR_MASK)) - 2;
        assert!(nodes >= 1000 && pods_per_node >= 110, "{nodes} nodes of {pods_per_node} pods");
        let (s_first, s_last, _) = range(SERVICE_CIDR);
        assert!(last < s_first || s_last < first, "{CLUSTER_CIDR} and {SERVICE_CIDR} overlap");
    }

    #[test]
    fn kube_proxy_listens_on_loopback_only() {
        let args = kube_proxy_args("n1", Ipv4Addr::new(10, 0, 0, 1), Path::new("/k"));
        for listener in args.iter().filter(|a| a.contains("bind-address") && !a.starts_with("--bind-address"))
        {
            assert!(listener.contains("=127.0.0.1:"), "{listener}");
        }
        assert!(args.contains(&"--proxy-mode=nftables".to_owned()));
    }
}
