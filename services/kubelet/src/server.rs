//! `run`: connect to the API and the runtime, register the node, run the pods, serve the
//! diagnostics; on shutdown stop without touching the pods (a restarted kubelet adopts them).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hpk_proto::kubelet::v1::kubelet_server::KubeletServer;
use tokio_util::sync::CancellationToken;

use crate::config::KubeletArgs;
use crate::cri::Cri;
use crate::error::{Error, Result};
use crate::events::Events;
use crate::node::{self, NodeConfig};
use crate::objects::ApiObjects;
use crate::pods::{self, Context};
use crate::spec::DnsSettings;

/// How long start-up waits for the runtime's socket to answer.
const RUNTIME_WAIT: Duration = Duration::from_secs(30);

/// Runs the kubelet until `shutdown`.
pub async fn run(args: KubeletArgs, shutdown: CancellationToken) -> Result<()> {
    let node_name = args.node_name().map_err(Error::Config)?;
    hpk_rpc::unix::ensure_private_dir(&args.root_dir)?;
    let pods_dir = args.root_dir.join("pods");
    std::fs::create_dir_all(&pods_dir)
        .map_err(|e| Error::Config(format!("creating {}: {e}", pods_dir.display())))?;
    let logs_dir = args.pod_logs_dir();
    std::fs::create_dir_all(&logs_dir)
        .map_err(|e| Error::Config(format!("creating {}: {e}", logs_dir.display())))?;

    let client = client(&args).await?;
    let cri = connect_runtime(&args, &shutdown).await?;
    let hostname = nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_else(|_| node_name.clone());
    let api = crate::api::prepare(&args, &node_name, &hostname, &shutdown).await?;
    let node_config = NodeConfig {
        name: node_name.clone(),
        internal_ip: args.node_ip,
        hostname: hostname.clone(),
        kubelet_port: args.kubelet_port,
        max_pods: args.max_pods,
        role: args.role.clone(),
        taint: args.register_with_taint.clone(),
        root_dir: args.root_dir.clone(),
        net_forwarder_socket: args.net_forwarder_socket.clone(),
        disk_pressure_percent: args.disk_pressure_percent,
        env: None,
    };
    let (node_state, node_task) = node::start(client.clone(), cri.clone(), node_config, shutdown.clone())
        .await
        .map_err(|e| Error::Node(e.to_string()))?;

    let ctx = Arc::new(Context {
        client: client.clone(),
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
    });
    let api = api.serve(&args, ctx.clone(), client.clone(), &shutdown);
    let manager = tokio::spawn(pods::manager::run(ctx.clone(), shutdown.clone()));

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

async fn client(args: &KubeletArgs) -> Result<kube::Client> {
    let path = args.kubeconfig.display().to_string();
    let bad = |reason: String| Error::Kubeconfig { path: path.clone(), reason };
    let kubeconfig = kube::config::Kubeconfig::read_from(&args.kubeconfig).map_err(|e| bad(e.to_string()))?;
    let config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
            .await
            .map_err(|e| bad(e.to_string()))?;
    kube::Client::try_from(config).map_err(|e| bad(e.to_string()))
}

/// Connects to the runtime, waiting a bounded time for its socket to answer `Version`.
async fn connect_runtime(args: &KubeletArgs, shutdown: &CancellationToken) -> Result<Cri> {
    let socket = args.runtime_socket.display().to_string();
    let deadline = tokio::time::Instant::now() + RUNTIME_WAIT;
    let mut last = String::new();
    while tokio::time::Instant::now() < deadline && !shutdown.is_cancelled() {
        match Cri::connect(&args.runtime_socket).await {
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
