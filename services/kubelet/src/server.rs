//! `run`: connect to the API and the runtime, register the node, run the pods, serve the
//! diagnostics; on shutdown stop without touching the pods (a restarted kubelet adopts them).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hpk_proto::kubelet::v1::kubelet_server::KubeletServer;
use tokio_util::sync::CancellationToken;

use crate::config::KubeletArgs;
use crate::cri::Cri;
use crate::cri_config::DnsSettings;
use crate::error::{Error, Result};
use crate::events::Events;
use crate::node::{self, NodeConfig};
use crate::objects::ApiObjects;
use crate::pods::{self, Context};

/// How long start-up waits for the runtime's socket to answer.
const RUNTIME_WAIT: Duration = Duration::from_secs(30);

/// Runs the kubelet until `shutdown`.
pub async fn run(args: KubeletArgs, shutdown: CancellationToken) -> Result<()> {
    let node_name = args.node_name()?;
    // The remote runtime's files first: a bad one refuses the start before anything is made.
    let remote = if args.connector() { Some(remote_credentials(&args)?) } else { None };
    hpk_rpc::unix::ensure_private_dir(&args.root_dir)?;
    let pods_dir = args.root_dir.join("pods");
    std::fs::create_dir_all(&pods_dir)
        .map_err(|e| Error::Config(format!("creating {}: {e}", pods_dir.display())))?;
    let logs_dir = args.pod_logs_dir();
    std::fs::create_dir_all(&logs_dir)
        .map_err(|e| Error::Config(format!("creating {}: {e}", logs_dir.display())))?;

    let client = client(&args).await?;
    let cri = connect_runtime(&args, remote, &shutdown).await?;
    let remote_capacity = match &cri.remote {
        Some(remote) => Some(remote_capacity(remote, args.max_pods).await?),
        None => None,
    };
    // A connector's host is whichever pod runs it: its name would change with each restart.
    let hostname = match args.connector() {
        true => node_name.clone(),
        false => nix::unistd::gethostname()
            .map(|h| h.to_string_lossy().into_owned())
            .unwrap_or_else(|_| node_name.clone()),
    };
    let api = crate::api::prepare(&args, &node_name, &hostname, &shutdown).await?;
    // The GPUs this node's runtime can give containers (not a remote runtime's: connector
    // mode gives none).
    let gpus = match cri.remote {
        Some(_) => crate::gpus::Gpus::default(),
        None => crate::gpus::Gpus::discover(&args.cdi_spec_dirs),
    };
    if gpus.count() > 0 {
        tracing::info!(gpus = gpus.count(), dirs = ?args.cdi_spec_dirs, "GPUs described by CDI specs");
    }
    // A remote runtime's allocation counts its own; here only what can be given is offered.
    let local_gpus = remote_capacity.is_none().then(|| i64::try_from(gpus.count()).unwrap_or(i64::MAX));
    let node_config = NodeConfig {
        name: node_name.clone(),
        internal_ip: args.node_ip,
        hostname: hostname.clone(),
        kubelet_port: args.kubelet_port,
        max_pods: args.max_pods,
        role: args.role.clone(),
        taint: args.taint(),
        root_dir: args.root_dir.clone(),
        net_forwarder_socket: args.net_forwarder_socket.clone(),
        disk_pressure_percent: args.disk_pressure_percent,
        env: None,
        capacity: remote_capacity,
        gpus: local_gpus,
    };
    let (node_state, node_task) = node::start(client.clone(), cri.clone(), node_config, shutdown.clone())
        .await
        .map_err(|e| Error::Node(e.to_string()))?;

    let ctx = Arc::new(Context {
        client: client.clone(),
        runtime: Arc::new(cri.clone()),
        cri,
        objects: ApiObjects::new(client.clone()),
        events: Events::new(client.clone(), &node_name),
        node_name,
        host_ip: args.node_ip.to_string(),
        pods_dir,
        logs_dir,
        dns: DnsSettings {
            cluster_dns: args.cluster_dns.iter().map(ToString::to_string).collect(),
            cluster_domain: args.cluster_domain.clone(),
            host_resolv_conf: args.resolv_conf.clone(),
        },
        node: node_state,
        admitted: Mutex::default(),
        summaries: Mutex::new(BTreeMap::new()),
        pods: Mutex::new(BTreeMap::new()),
        ids: id_mappings(),
        host_paths: crate::volumes::HostPaths {
            forbidden: args.forbidden_host_paths.clone(),
            allowed: args.allowed_host_paths.clone(),
            hidden: args.hidden_host_paths.clone(),
        },
        gpus,
        allowed_unsafe_sysctls: args.allowed_unsafe_sysctls.clone(),
    });
    let api = api.serve(&args, ctx.clone(), client.clone(), &shutdown);
    // Eviction watches this machine's memory and disk: not in connector mode.
    let eviction = (ctx.cri.remote.is_none()).then(|| {
        let mut thresholds = args.eviction_hard;
        thresholds.nodefs = thresholds
            .nodefs
            .or(Some(crate::eviction::Threshold::Percent(f64::from(args.disk_pressure_percent))));
        (crate::eviction::Policy { thresholds, interval: args.eviction_interval }, args.root_dir.clone())
    });
    let manager = tokio::spawn(pods::manager::run(ctx.clone(), eviction, shutdown.clone()));
    // Container logs lie on this machine unless the runtime is remote (connector mode).
    if ctx.cri.remote.is_none() {
        let policy = crate::log_rotation::Policy {
            max_size: args.container_log_max_size,
            max_files: usize::from(args.container_log_max_files),
            interval: args.container_log_monitor_interval,
        };
        tokio::spawn(crate::log_rotation::run(ctx.cri.runtime.clone(), policy, shutdown.clone()));
        let policy = crate::image_gc::Policy {
            high_percent: args.image_gc_high_threshold,
            low_percent: args.image_gc_low_threshold.min(args.image_gc_high_threshold),
            min_age: args.image_minimum_gc_age,
            max_age: args.image_maximum_gc_age.filter(|a| !a.is_zero()),
            period: args.image_gc_period,
        };
        tokio::spawn(crate::image_gc::run(
            ctx.cri.clone(),
            args.root_dir.clone(),
            policy,
            ctx.events.clone(),
            ctx.node_name.clone(),
            shutdown.clone(),
        ));
    }

    let listener = hpk_rpc::serve::Listener::unix(&args.diagnostics_socket())?;
    let services = hpk_rpc::serve::Services::new()
        .with(KubeletServer::new(crate::diag::Diagnostics::new(ctx)))
        .describe(hpk_proto::FILE_DESCRIPTOR_SET);
    let served = hpk_rpc::serve::serve(listener, services, shutdown.clone()).await;
    shutdown.cancel();
    match manager.await {
        Ok(Err(status)) => tracing::error!(error = %status.message(), "pod manager failed"),
        Err(error) => tracing::error!(%error, "pod manager panicked"),
        Ok(Ok(())) => {}
    }
    let _ = node_task.await;
    let _ = api.await;
    served?;
    Ok(())
}

/// The bubble's ID mappings, logged; `None` (every ID taken as mapped) when unreadable.
fn id_mappings() -> Option<crate::idmap::IdMappings> {
    match crate::idmap::IdMappings::read() {
        Ok(ids) => {
            tracing::info!(uids = %ids.uids, gids = %ids.gids, one_id = ids.is_one_id(), "user and group IDs of this bubble");
            Some(ids)
        }
        Err(error) => {
            tracing::warn!(error = %crate::node::error_chain(&error), "ID mappings unknown; every ID is taken as mapped");
            None
        }
    }
}

async fn client(args: &KubeletArgs) -> Result<kube::Client> {
    let Some(kubeconfig) = &args.kubeconfig else {
        let bad = |reason: String| Error::Kubeconfig { path: "(in-cluster)".into(), reason };
        let config =
            kube::Config::incluster().map_err(|e| bad(format!("{e}; outside a pod, give --kubeconfig")))?;
        return kube::Client::try_from(config).map_err(|e| bad(e.to_string()));
    };
    let path = kubeconfig.display().to_string();
    let bad = |reason: String| Error::Kubeconfig { path: path.clone(), reason };
    let kubeconfig = kube::config::Kubeconfig::read_from(kubeconfig).map_err(|e| bad(e.to_string()))?;
    let config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
            .await
            .map_err(|e| bad(e.to_string()))?;
    kube::Client::try_from(config).map_err(|e| bad(e.to_string()))
}

/// The remote runtime's allocation as the node's capacity.
async fn remote_capacity(remote: &crate::cri::Remote, max_pods: u32) -> Result<node::Resources> {
    let bad = |reason: String| Error::Runtime { socket: remote.stream.authority.clone(), reason };
    let answer = remote
        .api
        .clone()
        .allocation(hpk_proto::podruntime::v1::AllocationRequest {})
        .await
        .map_err(|status| bad(format!("asking for its allocation: {}", status.message())))?
        .into_inner();
    let resources = resources_from(&answer.capacity, max_pods).map_err(|e| bad(e.to_string()))?;
    tracing::info!(source = %answer.source, ?resources, "the remote runtime's allocation");
    Ok(resources)
}

/// What is wrong with a remote runtime's allocation.
#[derive(Debug, thiserror::Error)]
enum AllocationError {
    /// A resource every node needs is missing.
    #[error("its allocation gives no {0}")]
    Missing(&'static str),
    /// A quantity does not parse.
    #[error("its allocation's {name}: {source}")]
    Quantity {
        /// The resource.
        name: String,
        /// Why.
        #[source]
        source: crate::quantity::InvalidQuantity,
    },
    /// Nothing would fit.
    #[error("its allocation has no room for pods: cpu {millicpu}m, memory {memory}, pods {pods}")]
    NoRoom {
        /// Millicores.
        millicpu: i64,
        /// Bytes.
        memory: i64,
        /// Pods.
        pods: i64,
    },
}

/// Resources from quantities as the runtime's allocation gives them. CPU and memory must be
/// there; pods is the smaller of the runtime's and --max-pods.
fn resources_from(
    capacity: &std::collections::HashMap<String, String>,
    max_pods: u32,
) -> std::result::Result<node::Resources, AllocationError> {
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    let get =
        |name: &'static str, required: bool| -> std::result::Result<Option<Quantity>, AllocationError> {
            match capacity.get(name) {
                Some(value) => Ok(Some(Quantity(value.clone()))),
                None if required => Err(AllocationError::Missing(name)),
                None => Ok(None),
            }
        };
    let bad = |name: &str, source| AllocationError::Quantity { name: name.to_owned(), source };
    let units = |name: &'static str| -> std::result::Result<i64, AllocationError> {
        get(name, false)?.map_or(Ok(0), |q| crate::quantity::units(&q).map_err(|e| bad(name, e)))
    };
    let millicpu =
        crate::quantity::millicores(&get("cpu", true)?.unwrap_or_default()).map_err(|e| bad("cpu", e))?;
    let memory =
        crate::quantity::units(&get("memory", true)?.unwrap_or_default()).map_err(|e| bad("memory", e))?;
    let pods = match get("pods", false)? {
        Some(q) => crate::quantity::units(&q).map_err(|e| bad("pods", e))?.min(i64::from(max_pods)),
        None => i64::from(max_pods),
    };
    if millicpu <= 0 || memory <= 0 || pods <= 0 {
        return Err(AllocationError::NoRoom { millicpu, memory, pods });
    }
    Ok(node::Resources {
        millicpu,
        memory,
        ephemeral_storage: units("ephemeral-storage")?,
        gpus: units(node::resources::GPU_RESOURCE)?,
        pods,
    })
}

/// Reads the remote runtime's credentials; the key must be 0600.
fn remote_credentials(args: &KubeletArgs) -> Result<crate::cri::RemoteCredentials> {
    let read = |flag: &str, path: &Option<std::path::PathBuf>, secret: bool| -> Result<Vec<u8>> {
        let path = path.as_ref().ok_or_else(|| Error::Config(format!("--runtime-endpoint needs {flag}")))?;
        hpk_rpc::mtls::read_pem_file(flag, path, secret).map_err(Error::Config)
    };
    let creds = crate::cri::RemoteCredentials {
        ca: read("--runtime-ca-file", &args.runtime_ca_file, false)?,
        cert: read("--runtime-cert-file", &args.runtime_cert_file, false)?,
        key: read("--runtime-key-file", &args.runtime_key_file, true)?,
        server_name: args.runtime_server_name.clone(),
    };
    // Parsed now, so a file that is no certificate or key is named at start.
    hpk_rpc::mtls::client_config(&creds.ca, &creds.cert, &creds.key, &[])
        .map_err(|e| Error::Config(format!("the remote runtime's credentials: {e}")))?;
    Ok(creds)
}

/// Connects to the runtime, waiting a bounded time for it to answer `Version`.
async fn connect_runtime(
    args: &KubeletArgs,
    remote: Option<crate::cri::RemoteCredentials>,
    shutdown: &CancellationToken,
) -> Result<Cri> {
    let socket = match (&args.runtime_socket, &args.runtime_endpoint) {
        (_, Some(endpoint)) => endpoint.clone(),
        (Some(path), None) => path.display().to_string(),
        (None, None) => return Err(Error::Config("give --runtime-socket or --runtime-endpoint".into())),
    };
    let deadline = tokio::time::Instant::now() + RUNTIME_WAIT;
    let mut last = String::new();
    while tokio::time::Instant::now() < deadline && !shutdown.is_cancelled() {
        let connected = match &remote {
            Some(creds) => Cri::connect_remote(&socket, creds),
            None => Cri::connect(std::path::Path::new(&socket)).await,
        };
        match connected {
            Ok(cri) => {
                let mut runtime = cri.runtime.clone();
                match runtime.version(k8s_cri::v1::VersionRequest { version: String::new() }).await {
                    Ok(v) => {
                        let v = v.into_inner();
                        tracing::info!(runtime = %v.runtime_name, version = %v.runtime_version, "runtime connected");
                        return Ok(cri);
                    }
                    Err(status) => last = status.message().to_owned(),
                }
            }
            Err(error) => last = error.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(Error::Runtime { socket, reason: format!("no answer within {}s: {last}", RUNTIME_WAIT.as_secs()) })
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::resources_from;

    fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn a_remote_allocation_becomes_the_nodes_capacity() {
        let r = resources_from(
            &map(&[
                ("cpu", "4"),
                ("memory", "16Gi"),
                ("pods", "200"),
                ("ephemeral-storage", "100Gi"),
                ("nvidia.com/gpu", "2"),
            ]),
            110,
        )
        .expect("resources");
        assert_eq!((r.millicpu, r.memory, r.pods, r.gpus), (4000, 16 << 30, 110, 2));
        assert_eq!(r.ephemeral_storage, 100 << 30);
        let r = resources_from(&map(&[("cpu", "500m"), ("memory", "1Gi")]), 110).expect("resources");
        assert_eq!((r.millicpu, r.pods, r.gpus, r.ephemeral_storage), (500, 110, 0, 0));
    }

    #[test]
    fn a_bad_allocation_is_refused_by_name() {
        let err = resources_from(&map(&[("memory", "1Gi")]), 110).expect_err("no cpu").to_string();
        assert!(err.contains("cpu"), "{err}");
        let err = resources_from(&map(&[("cpu", "lots"), ("memory", "1Gi")]), 110)
            .expect_err("bad cpu")
            .to_string();
        assert!(err.contains("cpu"), "{err}");
        let err =
            resources_from(&map(&[("cpu", "0"), ("memory", "1Gi")]), 110).expect_err("no room").to_string();
        assert!(err.contains("no room"), "{err}");
    }
}
