//! An HPK node on a test host: the real hpk-net-forwarder, hpk-pod-runtime (crun) and
//! hpk-kubelet, each a process of its own in the host's network namespace, beside a
//! [`ControlPlane`]. The kubelet's tests and `hpk-testcluster up --hpk` use it. (The bubble
//! launcher of DESIGN.md runs the same three inside a rootless bubble; here they run as root in
//! the test host's namespace.)

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use crate::controlplane::ControlPlane;
use crate::netns::Host;
use crate::process::Process;
use crate::{Error, Result};

/// The RBAC the net-forwarder needs to follow the other Nodes (Kubernetes 1.35 lets a node read
/// only its own Node): get/list/watch on nodes for group `system:nodes`.
pub const PEER_READER_RBAC: &str = "apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: hpk:node-peer-reader
rules:
- apiGroups: [\"\"]
  resources: [nodes]
  verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: hpk:node-peer-reader
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: hpk:node-peer-reader
subjects:
- apiGroup: rbac.authorization.k8s.io
  kind: Group
  name: system:nodes
";

/// How to start a node.
#[derive(Clone, Debug)]
pub struct NodeOptions {
    /// Where hpk-net-forwarder, hpk-pod-runtime, hpk-pause and hpk-kubelet are.
    pub bin_dir: PathBuf,
    /// A registry the runtime may reach over plain HTTP (`host:port`).
    pub insecure_registry: Option<String>,
    /// Whether the node's pods reach the other nodes' pods through the net-forwarder's tunnel
    /// on the host's test address (each net-forwarder makes its key pair in memory and
    /// publishes the public key on its Node, as in production).
    pub tunnel: bool,
    /// More kubelet flags.
    pub kubelet_args: Vec<String>,
    /// Also run upstream kube-proxy (nftables mode) in the host's namespace, so the node's
    /// pods reach ClusterIP Services ([`crate::kubeproxy`]).
    pub kube_proxy: bool,
}

/// One HPK node's processes; on drop the kubelet stops first, then every pod is removed, then
/// the runtime and the net-forwarder stop.
pub struct HpkNode {
    kubelet: Option<Process>,
    kube_proxy: Option<Process>,
    runtime: Option<Process>,
    net_forwarder: Option<Process>,
    host: Host,
    bin_dir: PathBuf,
    runtime_socket: PathBuf,
    kubelet_args: Vec<String>,
    dir: PathBuf,
    kubelet_started: Option<Instant>,
    kubelet_runs: u32,
}

impl HpkNode {
    /// Starts the node's three services on test host `name` of `cp`, state under `dir`.
    pub fn start(cp: &ControlPlane, name: &str, dir: &Path, options: &NodeOptions) -> Result<Self> {
        let host = cp.network().host(name).cloned().ok_or_else(|| Error::NotFound {
            what: format!("test host {name}"),
            hint: "create it with the control plane".into(),
        })?;
        for binary in ["hpk-net-forwarder", "hpk-pod-runtime", "hpk-pause", "hpk-kubelet", "hpk-cert-signer"]
        {
            if !options.bin_dir.join(binary).is_file() {
                return Err(Error::Missing {
                    what: options.bin_dir.join(binary).display().to_string(),
                    hint: "cargo build --workspace --bins".into(),
                });
            }
        }
        let mkdir = |d: PathBuf| {
            std::fs::create_dir_all(&d).map_err(|e| Error::io("create", d.display().to_string(), e))
        };
        mkdir(dir.join("nf"))?;
        mkdir(dir.join("runtime"))?;
        let (kubeconfig, node_client) = cp.node_credentials(name)?;
        let nf_socket = dir.join("nf/run/nf.sock");
        let mut nf = host.command(options.bin_dir.join("hpk-net-forwarder"));
        nf.arg("serve")
            .arg("--socket")
            .arg(&nf_socket)
            .arg("--state-dir")
            .arg(dir.join("nf/state"))
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["--node-name", name]);
        if options.tunnel {
            nf.arg("--tunnel-listen").arg(format!("{}:0", host.ip));
        }
        let net_forwarder = Process::spawn("hpk-net-forwarder", nf, &dir.join("net-forwarder.log"))?;

        let runtime_socket = dir.join("runtime/run/cri.sock");
        // nsenter, not `ip netns exec`: that one mounts a fresh /sys without the cgroup
        // hierarchy crun needs. The runtime's namespace matters for its streaming server.
        let mut rt = Command::new("nsenter");
        rt.arg(format!("--net=/run/netns/{}", host.netns))
            .arg("--")
            .arg(options.bin_dir.join("hpk-pod-runtime"))
            .arg(format!("--socket={}", runtime_socket.display()))
            .arg(format!("--root={}", dir.join("runtime/root").display()))
            .arg(format!("--pause-binary={}", options.bin_dir.join("hpk-pause").display()))
            .arg(format!("--net-forwarder-socket={}", nf_socket.display()));
        if let Some(registry) = &options.insecure_registry {
            rt.arg(format!("--insecure-registry={registry}"));
        }
        let runtime = Process::spawn("hpk-pod-runtime", rt, &dir.join("runtime.log"))?;

        // The kubelet API's serving certificate comes from the cluster's cert-signer; the API
        // server's client certificate is accepted through the client CA.
        let signer = cp.cert_signer(&options.bin_dir)?;
        let mut kubelet_args = vec![
            format!("--cert-signer-address-file={}", signer.address_file.display()),
            format!("--cert-signer-ca={}", signer.ca.display()),
            format!("--node-token-file={}", signer.token_file(name)?.display()),
            format!("--cert-signer-client-cert={}", node_client.cert.display()),
            format!("--cert-signer-client-key={}", node_client.key.display()),
            format!("--client-ca-file={}", cp.pki().client_ca().cert.display()),
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--node-name={name}"),
            format!("--node-ip={}", host.ip),
            format!("--runtime-socket={}", runtime_socket.display()),
            format!("--net-forwarder-socket={}", nf_socket.display()),
            format!("--root-dir={}", dir.join("kubelet").display()),
        ];
        kubelet_args.extend(options.kubelet_args.iter().cloned());
        let kube_proxy = match options.kube_proxy {
            true => Some(crate::kubeproxy::start(cp, &host, &dir.join("kube-proxy.log"))?),
            false => None,
        };
        let mut node = Self {
            kubelet: None,
            kube_proxy,
            runtime: Some(runtime),
            net_forwarder: Some(net_forwarder),
            host,
            bin_dir: options.bin_dir.clone(),
            runtime_socket,
            kubelet_args,
            dir: dir.to_owned(),
            kubelet_started: None,
            kubelet_runs: 0,
        };
        node.start_kubelet()?;
        Ok(node)
    }

    /// Starts (or restarts) the kubelet; its log is `kubelet-<n>.log`, n counting from 1.
    pub fn start_kubelet(&mut self) -> Result<()> {
        let mut cmd = self.host.command(self.bin_dir.join("hpk-kubelet"));
        cmd.args(&self.kubelet_args)
            .env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()));
        self.kubelet_runs += 1;
        let log = self.dir.join(format!("kubelet-{}.log", self.kubelet_runs));
        self.kubelet_started = Some(Instant::now());
        self.kubelet = Some(Process::spawn("hpk-kubelet", cmd, &log)?);
        Ok(())
    }

    /// SIGKILLs the kubelet, as a crash would (its pods keep running).
    pub fn kill_kubelet(&mut self) {
        if let Some(mut kubelet) = self.kubelet.take() {
            if let Ok(pid) = i32::try_from(kubelet.pid()) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            kubelet.stop(); // reaps
        }
    }

    /// The kubelet's PID, while it runs.
    pub fn kubelet_pid(&self) -> Option<u32> {
        self.kubelet.as_ref().map(Process::pid)
    }

    /// When the kubelet was last started.
    pub fn kubelet_started(&self) -> Option<Instant> {
        self.kubelet_started
    }

    /// The node's state directory (`kubelet/`, `runtime/`, `nf/`, the logs).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The runtime's CRI socket.
    pub fn runtime_socket(&self) -> &Path {
        &self.runtime_socket
    }

    /// Waits until the node's kube-proxy has synced its rules (`/healthz` answers 200); an
    /// error if the node runs none or it exits.
    pub fn wait_kube_proxy(&mut self, within: std::time::Duration) -> Result<()> {
        let host = self.host.clone();
        let process = self.kube_proxy.as_mut().ok_or_else(|| Error::NotFound {
            what: format!("kube-proxy on {}", host.name),
            hint: "start the node with NodeOptions::kube_proxy".into(),
        })?;
        crate::kubeproxy::wait_healthy(process, &host, within)
    }

    /// The test host the node runs on.
    pub fn host(&self) -> &Host {
        &self.host
    }

    /// The tails of the three logs, for failure messages.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for (name, p) in [
            ("kubelet", &self.kubelet),
            ("runtime", &self.runtime),
            ("net-forwarder", &self.net_forwarder),
            ("kube-proxy", &self.kube_proxy),
        ] {
            if let Some(p) = p {
                out.push_str(&format!("--- {name} on {}:\n{}\n", self.host.name, p.log_tail(40)));
            }
        }
        out
    }
}

impl Drop for HpkNode {
    fn drop(&mut self) {
        // The kubelet first (it would re-create what is removed), then every pod through
        // crictl (from scripts/setup.sh), then the runtime and the net-forwarder.
        self.kubelet.take();
        if self.runtime.is_some() {
            remove_all_pods(&self.runtime_socket, &self.host.name);
        }
        self.runtime.take();
        self.net_forwarder.take();
        // Its rules go with the host's namespace.
        self.kube_proxy.take();
    }
}

/// Stops and removes every pod sandbox of the runtime on `socket` through crictl (from
/// scripts/setup.sh), as a node's teardown does before the runtime stops.
pub fn remove_all_pods(socket: &Path, host: &str) {
    let endpoint = format!("unix://{}", socket.display());
    for args in [&["stopp", "--all"][..], &["rmp", "--all", "--force"][..]] {
        let removed = Command::new("crictl")
            .args(["--runtime-endpoint", &endpoint, "--image-endpoint", &endpoint, "--timeout", "30s"])
            .args(args)
            .output();
        if removed.is_err() {
            tracing::warn!(node = %host, "crictl missing: the node's pods were not removed");
            break;
        }
    }
}
