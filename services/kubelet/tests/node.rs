//! The node module against the real control plane, as `system:node:node1`, with the real
//! hpk-pod-runtime as its CRI: registration, Ready within 5 s, the Lease, a restart that keeps
//! what others wrote, re-registration after deletion, and NotReady when the runtime stops.

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hpk_integration::controlplane::{ControlPlane, client_from_kubeconfig};
use hpk_kubelet::cri::Cri;
use hpk_kubelet::node::{self, NodeConfig};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Taint};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use tokio_util::sync::CancellationToken;

/// A child process killed (SIGKILL) and reaped by PID when dropped.
struct ChildGuard(Child);

impl ChildGuard {
    fn stop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let pid = nix::unistd::Pid::from_raw(i32::try_from(self.0.id()).expect("pid"));
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            let _ = self.0.wait();
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The binaries `cargo build -p hpk-pod-runtime` puts beside this test's directory
/// (target/debug), or why they are not there.
fn runtime_binaries() -> Option<(PathBuf, PathBuf)> {
    let exe = std::env::current_exe().expect("test executable");
    let dir = exe.parent().and_then(Path::parent).expect("target/debug");
    let (runtime, pause) = (dir.join("hpk-pod-runtime"), dir.join("hpk-pause"));
    if runtime.is_file() && pause.is_file() {
        return Some((runtime, pause));
    }
    let why = format!("no hpk-pod-runtime/hpk-pause in {} (cargo build -p hpk-pod-runtime)", dir.display());
    hpk_integration::skip(why);
    None
}

/// Starts the runtime on `dir/run/cri.sock` and connects once it answers `Version`.
async fn start_runtime(dir: &Path, runtime: &Path, pause: &Path) -> (ChildGuard, Cri) {
    let socket = dir.join("run/cri.sock");
    let log = std::fs::File::create(dir.join("runtime.log")).expect("log");
    let child = Command::new(runtime)
        .arg(format!("--socket={}", socket.display()))
        .arg(format!("--root={}", dir.join("root").display()))
        .arg(format!("--pause-binary={}", pause.display()))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start hpk-pod-runtime");
    let mut guard = ChildGuard(child);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(Some(status)) = guard.0.try_wait() {
            let log = std::fs::read_to_string(dir.join("runtime.log")).unwrap_or_default();
            panic!("runtime exited with {status}: {log}");
        }
        if let Ok(mut cri) = Cri::connect(&socket).await
            && cri.runtime.version(k8s_cri::v1::VersionRequest::default()).await.is_ok()
        {
            return (guard, cri);
        }
        assert!(Instant::now() < deadline, "the runtime did not answer Version within 20 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Polls `probe` every 100 ms until it returns something; fails after `timeout`.
async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    hpk_integration::eventually(what, timeout, &mut probe, String::new).await
}

fn ready_condition(node: &Node) -> Option<(String, String)> {
    let conditions = node.status.as_ref()?.conditions.as_ref()?;
    let ready = conditions.iter().find(|c| c.type_ == "Ready")?;
    Some((ready.status.clone(), ready.message.clone().unwrap_or_default()))
}

/// Waits until the Node's Ready condition has `status`; returns the Node and the message.
async fn wait_ready(nodes: &Api<Node>, status: &str, timeout: Duration) -> (Node, String) {
    eventually(&format!("Ready={status}"), timeout, || async {
        let node = nodes.get_opt("node1").await.ok()??;
        let (s, message) = ready_condition(&node)?;
        (s == status).then_some((node, message))
    })
    .await
}

fn config(ip: std::net::IpAddr, root_dir: &Path) -> NodeConfig {
    let env: HashMap<String, String> =
        [("SLURM_CPUS_ON_NODE", "3"), ("SLURM_MEM_PER_NODE", "2048"), ("CUDA_VISIBLE_DEVICES", "0,1")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
    NodeConfig {
        name: "node1".into(),
        internal_ip: ip,
        hostname: "node1-host".into(),
        kubelet_port: 10250,
        max_pods: 110,
        role: "worker".into(),
        taint: Some(Taint {
            key: "hpk.io/virtual-node".into(),
            value: Some("true".into()),
            effect: "NoSchedule".into(),
            ..Default::default()
        }),
        root_dir: root_dir.to_owned(),
        net_forwarder_socket: None,
        // This machine's disk may be fuller than the kubelet's default threshold.
        disk_pressure_percent: 1,
        env: Some(env),
        capacity: None,
        gpus: None,
    }
}

fn quantity(node: &Node, key: &str) -> Option<String> {
    node.status.as_ref()?.capacity.as_ref()?.get(key).map(|q| q.0.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_registers_keeps_its_lease_and_reports_readiness() {
    let _ = tracing_subscriber::fmt().with_test_writer().with_env_filter("hpk_kubelet=info").try_init();
    let Some(cp) = hpk_integration::skip_unless_available(ControlPlane::start(&["node1"]).await) else {
        return;
    };
    let Some((runtime_bin, pause_bin)) = runtime_binaries() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut runtime, cri) = start_runtime(dir.path(), &runtime_bin, &pause_bin).await;
    let as_node =
        client_from_kubeconfig(&cp.node_kubeconfig("node1").expect("kubeconfig")).await.expect("client");
    let admin = cp.admin_client().await.expect("admin");
    let nodes: Api<Node> = Api::all(admin.clone());
    let leases: Api<Lease> = Api::namespaced(admin.clone(), "kube-node-lease");
    let ip = std::net::IpAddr::V4(cp.network().host("node1").expect("node1").ip);
    let root_dir = dir.path().join("kubelet");
    std::fs::create_dir_all(&root_dir).expect("root dir");
    let config = config(ip, &root_dir);

    // Registration and the first Ready.
    let shutdown = CancellationToken::new();
    let started = Instant::now();
    let (state, task) =
        node::start(as_node.clone(), cri.clone(), config.clone(), shutdown.clone()).await.expect("start");
    let (node, _) = wait_ready(&nodes, "True", Duration::from_secs(5)).await;
    let latency = started.elapsed();
    eprintln!("node Ready=True {} ms after start()", latency.as_millis());
    assert!(latency < Duration::from_secs(5), "{latency:?}");
    assert!(state.borrow().ready, "{:?}", *state.borrow());
    assert_eq!(state.borrow().allocatable.millicpu, 3000);

    let labels = node.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels.get("node.hpk.io/role").map(String::as_str), Some("worker"));
    assert_eq!(labels.get("kubernetes.io/hostname").map(String::as_str), Some("node1-host"));
    assert_eq!(labels.get("kubernetes.io/os").map(String::as_str), Some("linux"));
    let status = node.status.clone().expect("status");
    let addresses: Vec<(String, String)> =
        status.addresses.clone().unwrap_or_default().into_iter().map(|a| (a.type_, a.address)).collect();
    assert!(addresses.contains(&("InternalIP".into(), ip.to_string())), "{addresses:?}");
    assert!(addresses.contains(&("Hostname".into(), "node1-host".into())), "{addresses:?}");
    assert_eq!(quantity(&node, "cpu").as_deref(), Some("3"));
    assert_eq!(quantity(&node, "memory").as_deref(), Some("2Gi"));
    assert_eq!(quantity(&node, "nvidia.com/gpu").as_deref(), Some("2"));
    assert_eq!(quantity(&node, "pods").as_deref(), Some("110"));
    assert_eq!(status.allocatable.as_ref().and_then(|a| a.get("cpu")).map(|q| q.0.as_str()), Some("3"));
    let port = status.daemon_endpoints.as_ref().and_then(|d| d.kubelet_endpoint.as_ref()).map(|e| e.port);
    assert_eq!(port, Some(10250));
    let info = status.node_info.clone().expect("nodeInfo");
    assert!(info.kubelet_version.starts_with("v1.35.4-hpk."), "{}", info.kubelet_version);
    assert!(info.container_runtime_version.starts_with("hpk-pod-runtime://"), "{info:?}");
    assert_eq!(info.operating_system, "linux");
    assert!(["amd64", "arm64"].contains(&info.architecture.as_str()), "{}", info.architecture);
    assert!(!info.boot_id.is_empty() && !info.kernel_version.is_empty(), "{info:?}");
    for kind in ["MemoryPressure", "DiskPressure", "PIDPressure"] {
        let c = status.conditions.as_ref().and_then(|cs| cs.iter().find(|c| c.type_ == kind).cloned());
        let c = c.unwrap_or_else(|| panic!("{kind} missing"));
        assert!(c.reason.is_some() && c.last_heartbeat_time.is_some() && c.last_transition_time.is_some());
    }
    let taints = node.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
    assert!(taints.iter().any(|t| t.key == "hpk.io/virtual-node" && t.effect == "NoSchedule"), "{taints:?}");

    // The Lease: held by the node, owned by it, renewed.
    let lease =
        eventually("the lease", Duration::from_secs(5), || async { leases.get_opt("node1").await.ok()? })
            .await;
    let spec = lease.spec.clone().expect("lease spec");
    assert_eq!(spec.holder_identity.as_deref(), Some("node1"));
    assert_eq!(spec.lease_duration_seconds, Some(40));
    let owner = lease.metadata.owner_references.clone().unwrap_or_default();
    assert_eq!(owner.first().map(|o| o.uid.clone()), node.metadata.uid.clone());
    let first_renewal = spec.renew_time.expect("renewTime").0;
    eventually("the lease renewed", Duration::from_secs(13), || async {
        let renewed = leases.get_opt("node1").await.ok()??.spec?.renew_time?.0;
        (renewed > first_renewal).then_some(())
    })
    .await;

    // What others write: the controller-manager's podCIDR, an annotation, a label.
    let pod_cidr = eventually("a podCIDR", Duration::from_secs(30), || async {
        nodes.get_opt("node1").await.ok()??.spec?.pod_cidr
    })
    .await;
    let others = serde_json::json!({"metadata": {
        "annotations": {"net.hpk.io/tunnel-endpoint": "10.250.0.99:4789"},
        "labels": {"example.org/rack": "r7"},
    }});
    nodes.patch("node1", &PatchParams::default(), &Patch::Merge(&others)).await.expect("annotate");

    // Shutdown ends the task.
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), task).await.expect("task ends").expect("join");

    // A restarted kubelet, now also waiting on a net-forwarder: Ready again, others' fields kept.
    let forwarder_socket = dir.path().join("forwarder/health.sock");
    let forwarder = serve_health(&forwarder_socket);
    let config = NodeConfig { net_forwarder_socket: Some(forwarder_socket.clone()), ..config };
    let shutdown = CancellationToken::new();
    let started = Instant::now();
    let (_state, task) =
        node::start(as_node.clone(), cri.clone(), config.clone(), shutdown.clone()).await.expect("restart");
    let (node, _) = wait_ready(&nodes, "True", Duration::from_secs(5)).await;
    eprintln!("after restart: Ready=True {} ms after start()", started.elapsed().as_millis());
    assert_eq!(node.spec.as_ref().and_then(|s| s.pod_cidr.clone()), Some(pod_cidr));
    let annotations = node.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(annotations.get("net.hpk.io/tunnel-endpoint").map(String::as_str), Some("10.250.0.99:4789"));
    let labels = node.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels.get("example.org/rack").map(String::as_str), Some("r7"));
    assert_eq!(labels.get("node.hpk.io/role").map(String::as_str), Some("worker"));
    let taints = node.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
    assert!(taints.iter().any(|t| t.key == "hpk.io/virtual-node"), "{taints:?}");

    // The net-forwarder stops: NotReady, naming it; back when it serves again.
    forwarder.cancel();
    let (_, message) = wait_ready(&nodes, "False", Duration::from_secs(15)).await;
    assert!(message.contains("net-forwarder"), "{message}");
    let forwarder = serve_health(&forwarder_socket);
    let (node, _) = wait_ready(&nodes, "True", Duration::from_secs(15)).await;

    // Deleted while running: registered again on the next round.
    let old_uid = node.metadata.uid.clone();
    nodes.delete("node1", &DeleteParams::default()).await.expect("delete");
    let node = eventually("re-registration", Duration::from_secs(20), || async {
        let node = nodes.get_opt("node1").await.ok()??;
        let (status, _) = ready_condition(&node)?;
        (node.metadata.uid != old_uid && status == "True").then_some(node)
    })
    .await;
    let new_uid = node.metadata.uid.clone();
    eventually("the lease owned by the new Node", Duration::from_secs(15), || async {
        let lease = leases.get_opt("node1").await.ok()??;
        let owner = lease.metadata.owner_references?.first()?.uid.clone();
        (Some(owner) == new_uid).then_some(())
    })
    .await;

    // The runtime stops: NotReady, naming it.
    let stopped = Instant::now();
    runtime.stop();
    let (_, message) = wait_ready(&nodes, "False", Duration::from_secs(15)).await;
    eprintln!("Ready=False {} ms after the runtime stopped: {message}", stopped.elapsed().as_millis());
    assert!(message.contains("runtime"), "{message}");

    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), task).await.expect("task ends").expect("join");
    forwarder.cancel();
}

/// A gRPC server with nothing but health (SERVING) on `socket`, as the net-forwarder has;
/// cancelling the token stops it.
fn serve_health(socket: &Path) -> CancellationToken {
    let stop = CancellationToken::new();
    let listener = hpk_rpc::Listener::unix(socket).expect("health socket");
    tokio::spawn(hpk_rpc::serve(listener, hpk_rpc::Services::new(), stop.clone()));
    stop
}
