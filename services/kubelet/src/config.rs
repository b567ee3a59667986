//! Command-line and environment configuration of `hpk-kubelet`.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use hpk_rpc::flags::parse_duration;

use k8s_openapi::api::core::v1::Taint;

/// `hpk-kubelet`: register the node and run the pods bound to it.
#[derive(Debug, Clone, clap::Args)]
#[command(group(clap::ArgGroup::new("runtime").required(true).args(["runtime_socket", "runtime_endpoint"])))]
pub struct KubeletArgs {
    /// Kubeconfig of the node's identity (`system:node:<name>`, group `system:nodes`). Without
    /// it, the in-cluster configuration (the pod's ServiceAccount), as a connector Deployment
    /// runs.
    #[arg(long, env = "HPK_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// The node's name; the host's name by default.
    #[arg(long, env = "HPK_NODE_NAME")]
    pub node_name: Option<String>,
    /// The host's address other nodes and the API server reach this node at (InternalIP).
    #[arg(long, env = "HPK_NODE_IP")]
    pub node_ip: IpAddr,
    /// The pod-runtime's CRI socket.
    #[arg(long, env = "HPK_RUNTIME_SOCKET")]
    pub runtime_socket: Option<PathBuf>,
    /// A pod-runtime on another machine, `https://HOST:PORT` (its `--listen`), reached with
    /// mutual TLS: connector mode. The node is named `hpk-connector` and tainted
    /// `hpk.io/connector=true:NoSchedule` unless --node-name or --register-with-taint say
    /// otherwise; its capacity is the runtime's allocation.
    #[arg(long, env = "HPK_RUNTIME_ENDPOINT", value_parser = parse_endpoint,
          requires_all = ["runtime_ca_file", "runtime_cert_file", "runtime_key_file"])]
    pub runtime_endpoint: Option<String>,
    /// The CA that signed the remote runtime's certificate.
    #[arg(long, env = "HPK_RUNTIME_CA_FILE", requires = "runtime_endpoint")]
    pub runtime_ca_file: Option<PathBuf>,
    /// The client certificate (PEM) presented to the remote runtime.
    #[arg(long, env = "HPK_RUNTIME_CERT_FILE", requires = "runtime_endpoint")]
    pub runtime_cert_file: Option<PathBuf>,
    /// Its key (PEM, 0600).
    #[arg(long, env = "HPK_RUNTIME_KEY_FILE", requires = "runtime_endpoint")]
    pub runtime_key_file: Option<PathBuf>,
    /// The name the remote runtime's certificate must carry; the endpoint's host by default.
    #[arg(long, env = "HPK_RUNTIME_SERVER_NAME", requires = "runtime_endpoint")]
    pub runtime_server_name: Option<String>,
    /// The net-forwarder's socket: the node is Ready only while it serves.
    #[arg(long, env = "HPK_NET_FORWARDER_SOCKET")]
    pub net_forwarder_socket: Option<PathBuf>,
    /// The kubelet's state: one directory per pod (volumes, /etc/hosts); created 0700.
    #[arg(long, env = "HPK_KUBELET_ROOT")]
    pub root_dir: PathBuf,
    /// A host directory no hostPath volume (nor hostPath or local PersistentVolume) may reach:
    /// a path inside it, or a parent of it such as `/`, is refused with a FailedMount event,
    /// links resolved. Repeat the flag (or separate with commas) for several; giving it
    /// replaces the defaults, HPK's own directories (/hpk, which holds the shared directory
    /// /hpk/shared, and /var/lib/hpk, the bubble's node directory), so list those again.
    #[arg(long = "forbidden-host-path", env = "HPK_FORBIDDEN_HOST_PATHS", value_delimiter = ',',
          default_values = crate::volumes::DEFAULT_FORBIDDEN, value_parser = parse_absolute)]
    pub forbidden_host_paths: Vec<PathBuf>,
    /// A host path hostPath volumes may reach (repeatable, or comma-separated): when any is
    /// given, a hostPath must lie inside one of them, its links resolved. HPK's bubbles pass
    /// what they bind from the host (the user's $HOME, the job's submit directory, --bind) and
    /// their local volume directory. None: every path not forbidden.
    #[arg(long = "allowed-host-path", env = "HPK_ALLOWED_HOST_PATHS", value_delimiter = ',',
          value_parser = parse_absolute)]
    pub allowed_host_paths: Vec<PathBuf>,
    /// A directory no hostPath may lie inside, though one may contain it (repeatable, or
    /// comma-separated): HPK's bubbles pass HPK's own directories on the host, which they
    /// cover when a bound path holds them.
    #[arg(long = "hidden-host-path", env = "HPK_HIDDEN_HOST_PATHS", value_delimiter = ',',
          value_parser = parse_absolute)]
    pub hidden_host_paths: Vec<PathBuf>,
    /// Where CDI specs are read from (repeatable, or comma-separated; lowest precedence
    /// first): their `nvidia.com/gpu` devices are the node's GPUs, one container's each.
    #[arg(long = "cdi-spec-dir", env = "HPK_CDI_SPEC_DIRS", value_delimiter = ',',
          default_values = hpk_cdi::SPEC_DIRS, value_parser = parse_absolute)]
    pub cdi_spec_dirs: Vec<PathBuf>,
    /// Where containers' logs go (`<namespace>_<pod>_<uid>/<container>/<n>.log`); by default
    /// `<root-dir>/pod-logs`.
    #[arg(long, env = "HPK_POD_LOGS_DIR")]
    pub pod_logs_dir: Option<PathBuf>,
    /// The kubelet API port published in the Node's status.daemonEndpoints.
    #[arg(long, env = "HPK_KUBELET_PORT", default_value_t = 10250)]
    pub kubelet_port: u16,
    /// The most pods this node runs.
    #[arg(long, env = "HPK_MAX_PODS", default_value_t = 110)]
    pub max_pods: u32,
    /// HPK's role label of the node (`node.hpk.io/role`).
    #[arg(long, env = "HPK_NODE_ROLE", default_value = "worker")]
    pub role: String,
    /// Register the node with this taint, KEY[=VALUE]:EFFECT (pods opt in by toleration or
    /// nodeName).
    #[arg(long, env = "HPK_REGISTER_WITH_TAINT", value_parser = parse_taint)]
    pub register_with_taint: Option<Taint>,
    /// Report DiskPressure (and get the NoSchedule taint) when less than this share, in percent,
    /// of the root directory's filesystem is free (the kubelet's `nodefs.available<10%`).
    #[arg(long, env = "HPK_DISK_PRESSURE_PERCENT", default_value_t = crate::node::conditions::DISK_AVAILABLE_MIN_PERCENT,
          value_parser = clap::value_parser!(u8).range(0..=100))]
    pub disk_pressure_percent: u8,
    /// Sysctls beyond the safe set that pods may set, comma-separated: names, or prefixes ending
    /// in `*` (`net.core.*`); a pod setting any other is rejected, `SysctlForbidden`.
    #[arg(long, env = "HPK_ALLOWED_UNSAFE_SYSCTLS", value_delimiter = ',')]
    pub allowed_unsafe_sysctls: Vec<String>,
    /// The cluster DNS service's address(es), for pods with dnsPolicy ClusterFirst.
    #[arg(long, env = "HPK_CLUSTER_DNS", value_delimiter = ',')]
    pub cluster_dns: Vec<IpAddr>,
    /// The cluster's DNS domain.
    #[arg(long, env = "HPK_CLUSTER_DOMAIN", default_value = "cluster.local")]
    pub cluster_domain: String,
    /// The resolver configuration pods with dnsPolicy Default get.
    #[arg(long, env = "HPK_RESOLV_CONF", default_value = "/etc/resolv.conf")]
    pub resolv_conf: PathBuf,
    /// Address the kubelet API (HTTPS on --kubelet-port) listens on; the node's address
    /// (--node-ip) by default.
    #[arg(long, env = "HPK_KUBELET_ADDRESS")]
    pub address: Option<IpAddr>,
    /// The kubelet API's serving certificate chain (PEM), instead of one from the cert-signer;
    /// read once at start.
    #[arg(long, env = "HPK_TLS_CERT_FILE", requires = "tls_private_key_file")]
    pub tls_cert_file: Option<PathBuf>,
    /// The private key of --tls-cert-file (PEM, must be 0600).
    #[arg(long, env = "HPK_TLS_PRIVATE_KEY_FILE", requires = "tls_cert_file")]
    pub tls_private_key_file: Option<PathBuf>,
    /// The cert-signer's URL (`https://HOST:PORT`): the serving certificate is requested from
    /// it for a key generated here (kept in memory only) and renewed before it expires.
    #[arg(long, env = "HPK_CERT_SIGNER_URL", conflicts_with_all = ["tls_cert_file", "cert_signer_address_file"])]
    pub cert_signer_url: Option<String>,
    /// Read the cert-signer's URL from this file (the signer's --address-file).
    #[arg(long, env = "HPK_CERT_SIGNER_ADDRESS_FILE", conflicts_with = "tls_cert_file")]
    pub cert_signer_address_file: Option<PathBuf>,
    /// The CA to pin for the cert-signer's TLS (the cluster's serving CA).
    #[arg(long, env = "HPK_SIGNER_CA_CERT")]
    pub cert_signer_ca: Option<PathBuf>,
    /// The cluster's node token (0600), which the cert-signer asks for.
    #[arg(long, env = "HPK_NODE_TOKEN_FILE")]
    pub node_token_file: Option<PathBuf>,
    /// The node's client certificate (`system:node:NAME`), presented to the cert-signer: the
    /// token enrols a node once, and every later request (a restart, a renewal) must show it.
    #[arg(long, env = "HPK_CERT_SIGNER_CLIENT_CERT", requires = "cert_signer_client_key")]
    pub cert_signer_client_cert: Option<PathBuf>,
    /// The key of --cert-signer-client-cert (0600).
    #[arg(long, env = "HPK_CERT_SIGNER_CLIENT_KEY", requires = "cert_signer_client_cert")]
    pub cert_signer_client_key: Option<PathBuf>,
    /// The API server's client CA: client certificates it signed are accepted on the kubelet
    /// API (user = CN, groups = O). Without it only bearer tokens are.
    #[arg(long, env = "HPK_CLIENT_CA_FILE")]
    pub client_ca_file: Option<PathBuf>,
    /// How long a bearer token's TokenReview answer is reused.
    #[arg(long, env = "HPK_TOKEN_CACHE_TTL", default_value = "2m", value_parser = parse_duration)]
    pub authentication_token_webhook_cache_ttl: Duration,
    /// How long an allowing SubjectAccessReview answer is reused.
    #[arg(long, env = "HPK_AUTHZ_ALLOWED_TTL", default_value = "5m", value_parser = parse_duration)]
    pub authorization_webhook_cache_authorized_ttl: Duration,
    /// How long a denying SubjectAccessReview answer is reused.
    #[arg(long, env = "HPK_AUTHZ_DENIED_TTL", default_value = "30s", value_parser = parse_duration)]
    pub authorization_webhook_cache_unauthorized_ttl: Duration,
    /// A container's log larger than this is rotated (`containerLogMaxSize`): a quantity,
    /// e.g. `10Mi`.
    #[arg(long, env = "HPK_CONTAINER_LOG_MAX_SIZE", default_value = "10Mi", value_parser = parse_size)]
    pub container_log_max_size: u64,
    /// Files kept per container log, the current one included (`containerLogMaxFiles`).
    #[arg(long, env = "HPK_CONTAINER_LOG_MAX_FILES", default_value_t = 5,
          value_parser = clap::value_parser!(u16).range(2..))]
    pub container_log_max_files: u16,
    /// How often container logs are checked for rotation (`containerLogMonitorInterval`).
    #[arg(long, env = "HPK_CONTAINER_LOG_MONITOR_INTERVAL", default_value = "10s", value_parser = parse_duration)]
    pub container_log_monitor_interval: Duration,
    /// Image garbage collection starts when the images' filesystem is used at or above this
    /// share, in percent (`imageGCHighThresholdPercent`; 100 turns it off).
    #[arg(long, env = "HPK_IMAGE_GC_HIGH_THRESHOLD", default_value_t = 85,
          value_parser = clap::value_parser!(u8).range(0..=100))]
    pub image_gc_high_threshold: u8,
    /// It frees down to this share (`imageGCLowThresholdPercent`; below the high threshold).
    #[arg(long, env = "HPK_IMAGE_GC_LOW_THRESHOLD", default_value_t = 80,
          value_parser = clap::value_parser!(u8).range(0..=100))]
    pub image_gc_low_threshold: u8,
    /// An image unused for less than this is never collected (`imageMinimumGCAge`).
    #[arg(long, env = "HPK_IMAGE_MINIMUM_GC_AGE", default_value = "2m", value_parser = duration_or_zero)]
    pub image_minimum_gc_age: Duration,
    /// An image unused for longer than this is collected whatever the disk
    /// (`imageMaximumGCAge`; by default, or 0, never).
    #[arg(long, env = "HPK_IMAGE_MAXIMUM_GC_AGE", value_parser = duration_or_zero)]
    pub image_maximum_gc_age: Option<Duration>,
    /// How often images are looked at for collection (upstream's fixed 5 minutes).
    #[arg(long, env = "HPK_IMAGE_GC_PERIOD", default_value = "5m", value_parser = parse_duration)]
    pub image_gc_period: Duration,
    /// Hard eviction thresholds (`evictionHard`): `memory.available<100Mi` by default, and
    /// `nodefs.available` at --disk-pressure-percent unless given here; percentages or
    /// quantities.
    #[arg(long, env = "HPK_EVICTION_HARD", default_value = "memory.available<100Mi",
          value_parser = crate::eviction::parse_thresholds)]
    pub eviction_hard: crate::eviction::Thresholds,
    /// How often memory and disk are checked for eviction (upstream's housekeeping, 10 s).
    #[arg(long, env = "HPK_EVICTION_INTERVAL", default_value = "10s", value_parser = parse_duration)]
    pub eviction_interval: Duration,
    /// Serve the kubelet's diagnostics (`hpk.kubelet.v1`) on this UNIX socket; by default
    /// `<root-dir>/kubelet.sock`.
    #[arg(long, env = "HPK_KUBELET_DIAGNOSTICS_SOCKET")]
    pub diagnostics_socket: Option<PathBuf>,
}

/// A duration as `parse_duration` reads it, or zero (`0`, `0s`).
fn duration_or_zero(text: &str) -> Result<Duration, String> {
    match text {
        "0" | "0s" => Ok(Duration::ZERO),
        _ => parse_duration(text),
    }
}

impl KubeletArgs {
    /// Whether the runtime is on another machine (connector mode).
    pub fn connector(&self) -> bool {
        self.runtime_endpoint.is_some()
    }

    /// The taint the Node is registered with: the flag, else a connector's.
    pub fn taint(&self) -> Option<Taint> {
        self.register_with_taint.clone().or_else(|| {
            self.connector().then(|| Taint {
                key: CONNECTOR_TAINT_KEY.to_owned(),
                value: Some("true".to_owned()),
                effect: "NoSchedule".to_owned(),
                time_added: None,
            })
        })
    }

    /// The node's name: the flag, else `hpk-connector` in connector mode, else the host's name
    /// in lower case.
    pub fn node_name(&self) -> Result<String, FlagError> {
        let name = match &self.node_name {
            Some(name) => name.clone(),
            None if self.connector() => CONNECTOR_NODE_NAME.to_owned(),
            None => nix::unistd::gethostname().map_err(FlagError::Hostname)?.to_string_lossy().to_lowercase(),
        };
        if is_dns_subdomain(&name) { Ok(name) } else { Err(FlagError::NodeName(name)) }
    }

    /// Where pod logs go.
    pub fn pod_logs_dir(&self) -> PathBuf {
        self.pod_logs_dir.clone().unwrap_or_else(|| self.root_dir.join("pod-logs"))
    }

    /// The diagnostics socket.
    pub fn diagnostics_socket(&self) -> PathBuf {
        self.diagnostics_socket.clone().unwrap_or_else(|| self.root_dir.join("kubelet.sock"))
    }
}

/// A flag's value that is not one.
#[derive(Debug, thiserror::Error)]
pub enum FlagError {
    /// The host's name could not be read.
    #[error("reading the hostname: {0}")]
    Hostname(#[source] nix::Error),
    /// A node name Kubernetes refuses.
    #[error("node name {0:?} is not a DNS-1123 subdomain")]
    NodeName(String),
    /// A size of nothing.
    #[error("{0:?}: a size must be more than nothing")]
    EmptySize(String),
    /// A size that is no quantity.
    #[error(transparent)]
    Size(#[from] crate::quantity::InvalidQuantity),
    /// A relative path.
    #[error("{0:?} is not an absolute path")]
    NotAbsolute(String),
    /// An endpoint that is no URI.
    #[error("{text:?}: {source}")]
    Uri {
        /// The flag's value.
        text: String,
        /// Why.
        #[source]
        source: http::uri::InvalidUri,
    },
    /// An endpoint other than `https://HOST:PORT`.
    #[error("{0:?} is not https://HOST:PORT")]
    NotHttpsPort(String),
    /// A taint without its effect.
    #[error("taint {0:?}: expected KEY[=VALUE]:EFFECT")]
    TaintForm(String),
    /// A taint's unknown effect.
    #[error("taint {0:?}: effect must be NoSchedule, PreferNoSchedule or NoExecute")]
    TaintEffect(String),
    /// A taint's invalid key.
    #[error("taint {text:?}: invalid key {key:?}")]
    TaintKey {
        /// The flag's value.
        text: String,
        /// The key.
        key: String,
    },
}

/// A connector's node name unless --node-name says otherwise.
pub const CONNECTOR_NODE_NAME: &str = "hpk-connector";
/// The key of the taint a connector's node carries unless --register-with-taint says otherwise.
pub const CONNECTOR_TAINT_KEY: &str = "hpk.io/connector";

/// An absolute path.
/// A positive size in bytes, as a quantity (`10Mi`, `65536`).
fn parse_size(text: &str) -> Result<u64, FlagError> {
    let q = k8s_openapi::apimachinery::pkg::api::resource::Quantity(text.to_owned());
    match crate::quantity::units(&q) {
        Ok(bytes) if bytes > 0 => Ok(bytes.unsigned_abs()),
        Ok(_) => Err(FlagError::EmptySize(text.to_owned())),
        Err(e) => Err(e.into()),
    }
}

fn parse_absolute(text: &str) -> Result<PathBuf, FlagError> {
    let path = PathBuf::from(text);
    if path.is_absolute() { Ok(path) } else { Err(FlagError::NotAbsolute(text.to_owned())) }
}

/// `https://HOST:PORT`, nothing else.
fn parse_endpoint(text: &str) -> Result<String, FlagError> {
    // A file's content (a runtime bubble's runtime-endpoint) ends with a newline.
    let text = text.trim();
    let uri: http::Uri = text.parse().map_err(|source| FlagError::Uri { text: text.to_owned(), source })?;
    let path_ok = uri.path_and_query().is_none_or(|p| p.as_str() == "/" || p.as_str().is_empty());
    match (uri.scheme_str(), uri.authority()) {
        (Some("https"), Some(authority)) if authority.port_u16().is_some() && path_ok => {
            Ok(format!("https://{authority}"))
        }
        _ => Err(FlagError::NotHttpsPort(text.to_owned())),
    }
}

/// Whether `name` is a DNS-1123 subdomain (lower case), as node names and DNS SANs must be.
pub fn is_dns_subdomain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// Parses `KEY[=VALUE]:EFFECT` as kubectl taint does.
pub fn parse_taint(text: &str) -> Result<Taint, FlagError> {
    let (kv, effect) = text.rsplit_once(':').ok_or_else(|| FlagError::TaintForm(text.to_owned()))?;
    if !matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
        return Err(FlagError::TaintEffect(text.to_owned()));
    }
    let (key, value) = match kv.split_once('=') {
        Some((k, v)) => (k, Some(v.to_owned())),
        None => (kv, None),
    };
    let key_ok = !key.is_empty()
        && key.len() <= 316
        && key.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'));
    if !key_ok {
        return Err(FlagError::TaintKey { text: text.to_owned(), key: key.to_owned() });
    }
    Ok(Taint { key: key.to_owned(), value, effect: effect.to_owned(), time_added: None })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: KubeletArgs,
    }

    fn parse(extra: &[&str]) -> Result<KubeletArgs, clap::Error> {
        use clap::Parser;
        let base = ["hpk-kubelet", "--node-ip=10.0.0.1", "--runtime-socket=/run/cri.sock", "--root-dir=/r"];
        Cli::try_parse_from(base.iter().chain(extra)).map(|cli| cli.args)
    }

    #[test]
    fn forbidden_host_paths_default_to_hpks_directories() {
        let defaults = parse(&[]).expect("parse").forbidden_host_paths;
        assert_eq!(defaults, [PathBuf::from("/hpk"), PathBuf::from("/var/lib/hpk")]);
        let given = parse(&["--forbidden-host-path=/hpk", "--forbidden-host-path=/scratch/admin,/opt/site"])
            .expect("parse")
            .forbidden_host_paths;
        assert_eq!(given, ["/hpk", "/scratch/admin", "/opt/site"].map(PathBuf::from));
        let err = parse(&["--forbidden-host-path=hpk"]).expect_err("relative").to_string();
        assert!(err.contains("not an absolute path"), "{err}");
    }

    #[test]
    fn container_log_rotation_takes_upstreams_defaults_and_refuses_nonsense() {
        let defaults = parse(&[]).expect("defaults");
        assert_eq!(defaults.container_log_max_size, 10 << 20);
        assert_eq!(defaults.container_log_max_files, 5);
        assert_eq!(defaults.container_log_monitor_interval, Duration::from_secs(10));
        assert_eq!((defaults.image_gc_high_threshold, defaults.image_gc_low_threshold), (85, 80));
        assert_eq!(defaults.image_minimum_gc_age, Duration::from_secs(120));
        assert_eq!(defaults.image_maximum_gc_age, None);
        assert!(parse(&["--image-gc-high-threshold=101"]).is_err());
        let given = parse(&["--image-minimum-gc-age=0s", "--image-maximum-gc-age=1h"]).expect("given");
        assert_eq!(
            (given.image_minimum_gc_age, given.image_maximum_gc_age),
            (Duration::ZERO, Some(Duration::from_secs(3600)))
        );
        assert!(parse(&["--image-minimum-gc-age=soon"]).is_err());
        let given = parse(&["--container-log-max-size=64Ki", "--container-log-max-files=2"]).expect("given");
        assert_eq!((given.container_log_max_size, given.container_log_max_files), (64 << 10, 2));
        for bad in
            ["--container-log-max-size=0", "--container-log-max-size=ten", "--container-log-max-files=1"]
        {
            assert!(parse(&[bad]).is_err(), "{bad} was taken");
        }
    }

    #[test]
    fn dns_subdomains() {
        for good in ["node1", "gpu-07.cluster.local", "a"] {
            assert!(is_dns_subdomain(good), "{good}");
        }
        for bad in ["", "Node1", "node_1", "-a", "a-", "a..b", &"x".repeat(64)] {
            assert!(!is_dns_subdomain(bad), "{bad}");
        }
    }

    #[test]
    fn endpoints_are_https_with_a_port() {
        assert_eq!(parse_endpoint("https://10.1.2.3:7443").ok().as_deref(), Some("https://10.1.2.3:7443"));
        assert_eq!(
            parse_endpoint("https://gpu-01.hpc:7443/").ok().as_deref(),
            Some("https://gpu-01.hpc:7443")
        );
        assert_eq!(parse_endpoint("https://10.1.2.3:7443\n").ok().as_deref(), Some("https://10.1.2.3:7443"));
        for bad in ["http://10.1.2.3:7443", "https://10.1.2.3", "10.1.2.3:7443", "https://h:1/x", ""] {
            assert!(parse_endpoint(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn taints_parse_like_kubectls() {
        let t = parse_taint("hpk.io/virtual=true:NoSchedule").expect("taint");
        assert_eq!(
            (t.key.as_str(), t.value.as_deref(), t.effect.as_str()),
            ("hpk.io/virtual", Some("true"), "NoSchedule")
        );
        let t = parse_taint("dedicated:NoExecute").expect("taint");
        assert_eq!((t.key.as_str(), t.value, t.effect.as_str()), ("dedicated", None, "NoExecute"));
        assert!(parse_taint("x=y").is_err(), "no effect");
        assert!(parse_taint("x=y:Sometimes").is_err(), "unknown effect");
        assert!(parse_taint("=y:NoSchedule").is_err(), "empty key");
    }
}
