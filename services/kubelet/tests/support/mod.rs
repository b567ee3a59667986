//! A real node for the kubelet's tests: the upstream control plane (hpk-integration), a local
//! registry with the busybox images, and on test host `node1` (its own network namespace) the
//! real hpk-net-forwarder, hpk-pod-runtime (crun) and hpk-kubelet, each a process of its own.
#![allow(dead_code, missing_docs)] // each test binary uses a different part

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hpk_integration::controlplane::{ControlPlane, client_from_kubeconfig};
use hpk_integration::hpknode::{HpkNode, NodeOptions};
use hpk_integration::registry::{Registry, TestImages};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;

pub const KUBELET: &str = env!("CARGO_BIN_EXE_hpk-kubelet");
pub const NODE: &str = "node1";

/// Whether the tools the node needs are present; prints why not, or fails under
/// HPK_REQUIRE_TOOLS=1.
pub fn tools_present() -> bool {
    hpk_integration::tools_present(&["crun", "docker-registry", "ip", "nsenter", "crictl", "curl", "tmux"])
}

/// The cluster with one HPK node.
pub struct Cluster {
    // Field order is drop order: the node's processes before the registry and control plane.
    pub node: HpkNode,
    pub registry: Registry,
    pub shell: String,
    pub httpd: String,
    pub admin: kube::Client,
    pub cp: ControlPlane,
    pub dir: tempfile::TempDir,
}

impl Cluster {
    /// Starts everything and waits until node1 is Ready; `None` (skipped, with the reason
    /// printed) when a prerequisite is missing.
    pub async fn start() -> Option<Self> {
        Self::start_with_cert_validity(None).await
    }

    /// [`Self::start`] with the cluster's cert-signer issuing certificates valid for
    /// `validity` (e.g. `30s`), so the kubelet renews its serving certificate during a test.
    pub async fn start_with_cert_validity(validity: Option<&str>) -> Option<Self> {
        Self::start_with(validity, &[]).await
    }

    /// [`Self::start_with_cert_validity`] with more test hosts beside node1 (nothing runs on
    /// them yet).
    pub async fn start_with(validity: Option<&str>, more_hosts: &[&str]) -> Option<Self> {
        Self::start_with_kubelet_args(validity, more_hosts, &[]).await
    }

    /// [`Self::start_with`] with more of the kubelet's flags.
    pub async fn start_with_kubelet_args(
        validity: Option<&str>,
        more_hosts: &[&str],
        kubelet_args: &[&str],
    ) -> Option<Self> {
        if !tools_present() {
            return None;
        }
        let hosts: Vec<&str> = std::iter::once(NODE).chain(more_hosts.iter().copied()).collect();
        let cp = hpk_integration::skip_unless_available(ControlPlane::start(&hosts).await)?;
        let admin = cp.admin_client().await.expect("admin client");
        let registry = Registry::start(IpAddr::V4(cp.network().gateway()), None).await.expect("registry");
        let images = TestImages::push(&registry, false).await.expect("test images");
        let (shell, httpd) = (images.shell, images.httpd);
        let dir = tempfile::Builder::new().prefix("hpk-kubelet-test-").tempdir().expect("tempdir");
        let options = NodeOptions {
            bin_dir: Path::new(KUBELET).parent().expect("bin dir").to_owned(),
            insecure_registry: Some(registry.host_port()),
            tunnel: false,
            kubelet_args: [
                "--cluster-dns=10.96.0.10",
                // This machine's disk may be fuller than the default 10 % threshold allows.
                "--disk-pressure-percent=1",
            ]
            .iter()
            .chain(kubelet_args)
            .map(|a| (*a).to_owned())
            .collect(),
            kube_proxy: false,
        };
        cp.cert_signer_with_validity(&options.bin_dir, validity).expect("cert-signer");
        let node = HpkNode::start(&cp, NODE, &dir.path().join("node1"), &options).expect("node1");
        let cluster = Self { node, registry, shell, httpd, admin, cp, dir };
        cluster.wait_ready(Duration::from_secs(60)).await;
        Some(cluster)
    }

    /// Waits until node1's Ready condition is True.
    pub async fn wait_ready(&self, within: Duration) -> Duration {
        let started = Instant::now();
        loop {
            if self.node_condition("Ready").await.as_deref() == Some("True") {
                return started.elapsed();
            }
            assert!(started.elapsed() < within, "node1 not Ready within {within:?}\n{}", self.node.logs());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The status of node1's condition `kind`.
    pub async fn node_condition(&self, kind: &str) -> Option<String> {
        let node = Api::<Node>::all(self.admin.clone()).get_opt(NODE).await.ok()??;
        node.status?.conditions?.into_iter().find(|c| c.type_ == kind).map(|c| c.status)
    }

    pub fn pods(&self, namespace: &str) -> Api<Pod> {
        Api::namespaced(self.admin.clone(), namespace)
    }

    /// What the cluster and the node show, for failure messages.
    pub fn dump(&self) -> String {
        let run = |args: &[&str]| {
            self.cp
                .kubectl()
                .args(args)
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default()
        };
        let waiting = r#"{range .items[*]}{.metadata.name}{": "}{range .status.containerStatuses[*]}{.state.waiting.message}{" "}{end}{"\n"}{end}"#;
        format!(
            "--- kubectl get pods,nodes -o wide:\n{}\n--- waiting messages:\n{}\n--- kubectl describe node:\n{}\n{}",
            run(&["get", "pods,nodes", "-o", "wide"]),
            run(&["get", "pods", "-o", &format!("jsonpath={waiting}")]),
            run(&["describe", "node", NODE]),
            self.node.logs()
        )
    }

    /// `kubectl` as cluster admin; a call still running after 3 minutes fails the test.
    pub fn kubectl(&self, args: &[&str]) -> String {
        let out = hpk_test_support::output_within(self.cp.kubectl().args(args), Duration::from_secs(180));
        assert!(out.status.success(), "kubectl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `kubectl apply -f -` of `manifest`.
    pub fn apply(&self, manifest: &str) {
        let mut child = self
            .cp
            .kubectl()
            .args(["apply", "-f", "-"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("kubectl");
        std::io::Write::write_all(&mut child.stdin.take().expect("stdin"), manifest.as_bytes())
            .expect("write");
        let out = child.wait_with_output().expect("kubectl apply");
        assert!(out.status.success(), "kubectl apply: {}\n{manifest}", String::from_utf8_lossy(&out.stderr));
    }

    /// The lines a container of pod `namespace/name` wrote to stdout/stderr so far (from the
    /// CRI log files the kubelet asked the runtime for).
    pub fn container_log(&self, pod: &Pod, container: &str) -> String {
        let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
        let name = pod.metadata.name.as_deref().unwrap_or("");
        let uid = pod.metadata.uid.as_deref().unwrap_or("");
        let dir = self.node.dir().join("kubelet/pod-logs").join(format!("{ns}_{name}_{uid}")).join(container);
        let mut files: Vec<PathBuf> =
            std::fs::read_dir(&dir).map(|d| d.flatten().map(|e| e.path()).collect()).unwrap_or_default();
        files.sort();
        let mut text = String::new();
        for file in files {
            for line in std::fs::read_to_string(&file).unwrap_or_default().lines() {
                // CRI log format: TIMESTAMP STREAM TAG TEXT
                let mut parts = line.splitn(4, ' ');
                let text_part = parts.nth(3).unwrap_or("");
                text.push_str(text_part);
                text.push('\n');
            }
        }
        text
    }
}

/// Polls `check` every 200 ms until it returns `Some`, failing with `what` and the node's logs
/// after `within`.
pub async fn eventually<T, F, Fut>(cluster: &Cluster, what: &str, within: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    hpk_integration::eventually(what, within, &mut check, || cluster.dump()).await
}

/// The admin client for a kubeconfig (re-exported for tests).
pub async fn client(path: &Path) -> kube::Client {
    client_from_kubeconfig(path).await.expect("client")
}
