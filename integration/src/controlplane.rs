//! The upstream control plane on a test host: etcd, kube-apiserver, kube-controller-manager and
//! kube-scheduler, each its own process, from the multi-call binary `controlplane/build.sh` makes.

use std::net::IpAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ServiceAccount;
use kube::Api;

use crate::netns::{Host, TestNetwork};
use crate::pki::{ClusterPki, write_kubeconfig};
use crate::process::Process;
use crate::{Error, Result};

pub use hpk_cluster::addons::{CLUSTER_CIDR, SERVICE_CIDR};
/// The API server's port on its host.
pub const API_PORT: u16 = 6443;
const READY_TIMEOUT: Duration = Duration::from_secs(90);

/// Where the control-plane binaries are: `$HPK_CONTROLPLANE_BIN_DIR`, else the cache the test
/// command builds into (`$HPK_CACHE_DIR/controlplane/bin`, `~/.cache/hpk/controlplane/bin`), else
/// `integration/controlplane/bin` of this checkout.
pub fn bin_dir() -> Result<PathBuf> {
    let mut candidates = Vec::new();
    if let Some(dir) = std::env::var_os("HPK_CONTROLPLANE_BIN_DIR") {
        candidates.push(PathBuf::from(dir));
    }
    let cache = std::env::var_os("HPK_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/hpk")));
    if let Some(cache) = cache {
        candidates.push(cache.join("controlplane/bin"));
    }
    candidates.push(Path::new(env!("CARGO_MANIFEST_DIR")).join("controlplane/bin"));
    candidates.iter().find(|d| d.join("kube-apiserver").is_file()).cloned().ok_or_else(|| Error::Missing {
        what: "the control-plane binaries (kube-apiserver)".into(),
        hint: format!(
            "run integration/controlplane/build.sh or scripts/setup.sh; looked in {}",
            candidates.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", ")
        ),
    })
}

/// A running control plane. Dropping it stops every process, removes the test network and
/// deletes every file, also while a test panics.
pub struct ControlPlane {
    components: Vec<Process>,
    bin_dir: PathBuf,
    pki: ClusterPki,
    host: Host,
    api_url: String,
    admin_kubeconfig: PathBuf,
    network: TestNetwork,
    signer: std::sync::Mutex<Option<(Process, CertSigner)>>,
    dir: tempfile::TempDir,
}

/// The cluster's hpk-cert-signer on the control-plane host, as kubelets reach it.
#[derive(Clone, Debug)]
pub struct CertSigner {
    /// The file holding its URL (`https://IP:PORT`).
    pub address_file: PathBuf,
    /// The CA to pin for its TLS (the server CA).
    pub ca: PathBuf,
    /// Where node tokens are written ([`CertSigner::token_file`]).
    pub dir: PathBuf,
    /// The cluster's node-token key, each node's token is made from.
    pub token_key: String,
}

impl CertSigner {
    /// A file (0600) holding node `node`'s token, as its launcher leaves it: good for that
    /// node's certificates only.
    pub fn token_file(&self, node: &str) -> Result<PathBuf> {
        let path = self.dir.join(format!("{node}.token"));
        crate::pki::write_secret(&path, &hpk_rpc::node_token::derive(self.token_key.as_bytes(), node))?;
        Ok(path)
    }

    /// Node `node`'s token.
    pub fn token(&self, node: &str) -> String {
        hpk_rpc::node_token::derive(self.token_key.as_bytes(), node)
    }
}

impl ControlPlane {
    /// Starts the control plane on a test host named `controlplane`, beside test hosts named
    /// `nodes`, and waits until it is ready to take pods.
    pub async fn start(nodes: &[&str]) -> Result<Self> {
        let bin_dir = bin_dir()?;
        let mut names = vec!["controlplane"];
        names.extend_from_slice(nodes);
        let network = TestNetwork::create(&names)?;
        let host = network.host("controlplane").cloned().expect("created above");
        let dir = tempfile::Builder::new()
            .prefix("hpk-testcluster-")
            .tempdir()
            .map_err(|e| Error::io("create", "temp dir", e))?;
        let service_ip: IpAddr = "10.96.0.1".parse().expect("literal");
        // A test cluster lives minutes; its certificates a day.
        let pki = ClusterPki::generate(
            &dir.path().join("pki"),
            "hpk-test",
            &[IpAddr::V4(host.ip)],
            service_ip,
            hpk_cluster::pki::Validity::for_lifetime(Duration::from_secs(3600)),
        )?;
        let api_url = format!("https://{}:{API_PORT}", host.ip);
        let admin_kubeconfig = dir.path().join("admin.kubeconfig");
        let admin = pki.client_cert("admin", "hpk-admin", &["system:masters"])?;
        write_kubeconfig(&admin_kubeconfig, &api_url, &pki.server_ca().cert, "admin", &admin)?;
        let mut cp = Self {
            components: Vec::new(),
            bin_dir,
            pki,
            host,
            api_url,
            admin_kubeconfig,
            network,
            signer: std::sync::Mutex::new(None),
            dir,
        };
        cp.launch().await?;
        Ok(cp)
    }

    async fn launch(&mut self) -> Result<()> {
        let started = Instant::now();
        let d = self.dir.path().to_owned();
        let ip = self.host.ip.to_string();

        // The control-plane host's own loopback, with TLS and client certificates as in a bubble.
        self.spawn(
            "etcd",
            &hpk_cluster::controlplane::etcd_args(&self.pki, "controlplane", &d.join("etcd")),
        )?;

        let mut apiserver_args =
            hpk_cluster::controlplane::apiserver_args(&self.pki, &d.join("apiserver"), &ip, &ip, API_PORT);
        // Straight to an aggregated API's endpoints: the control-plane host runs no kube-proxy.
        apiserver_args.push("--enable-aggregator-routing=true".into());
        self.spawn("kube-apiserver", &apiserver_args)?;
        let admin = self.admin_client().await?;
        self.wait_ready("kube-apiserver /readyz", || {
            let admin = admin.clone();
            async move { get_text(&admin, "/readyz").await.map(|body| body.trim() == "ok") }
        })
        .await?;

        let cm_kubeconfig = d.join("controller-manager.kubeconfig");
        let cm = self.pki.client_cert("controller-manager", "system:kube-controller-manager", &[])?;
        write_kubeconfig(
            &cm_kubeconfig,
            &self.api_url,
            &self.pki.server_ca().cert,
            "controller-manager",
            &cm,
        )?;
        let server_ca = self.pki.server_ca().clone();
        let cm_args = hpk_cluster::controlplane::controller_manager_args(
            &self.pki,
            &cm_kubeconfig,
            &d.join("controller-manager"),
            &ip,
        );
        self.spawn("kube-controller-manager", &cm_args)?;

        let sched_kubeconfig = d.join("scheduler.kubeconfig");
        let sched = self.pki.client_cert("scheduler", "system:kube-scheduler", &[])?;
        write_kubeconfig(&sched_kubeconfig, &self.api_url, &server_ca.cert, "scheduler", &sched)?;
        let sched_args =
            hpk_cluster::controlplane::scheduler_args(&sched_kubeconfig, &d.join("scheduler"), &ip);
        self.spawn("kube-scheduler", &sched_args)?;

        for (what, port) in [("kube-controller-manager /healthz", 10257), ("kube-scheduler /healthz", 10259)]
        {
            let probe = insecure_client(&format!("https://{ip}:{port}"))?;
            self.wait_ready(what, || {
                let probe = probe.clone();
                async move { get_text(&probe, "/healthz").await.map(|body| body.trim() == "ok") }
            })
            .await?;
        }
        // Admission refuses pods in a namespace until its default ServiceAccount exists.
        let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), "default");
        self.wait_ready("the default ServiceAccount", || {
            let accounts = accounts.clone();
            async move { accounts.get_opt("default").await.map(|sa| sa.is_some()).map_err(|e| e.to_string()) }
        })
        .await?;
        tracing::info!(api = %self.api_url, seconds = started.elapsed().as_secs_f64(), "control plane ready");
        Ok(())
    }

    fn spawn(&mut self, component: &str, args: &[String]) -> Result<()> {
        let mut cmd = self.host.command(self.bin_dir.join(component));
        cmd.args(args);
        let log = self.dir.path().join(format!("{component}.log"));
        self.components.push(Process::spawn(component, cmd, &log)?);
        Ok(())
    }

    /// Polls `probe` every 100 ms until it says ready, failing early if a component exits.
    async fn wait_ready<F, Fut>(&mut self, what: &str, mut probe: F) -> Result<()>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<bool, String>>,
    {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            for component in &mut self.components {
                component.check_alive()?;
            }
            let last = match probe().await {
                Ok(true) => return Ok(()),
                Ok(false) => "answered, not ready".to_owned(),
                Err(e) => e,
            };
            if Instant::now() >= deadline {
                let logs = self
                    .components
                    .iter()
                    .map(|c| format!("--- {}:\n{}", c.name(), c.log_tail(10)))
                    .collect::<Vec<_>>();
                return Err(Error::NotReady {
                    what: what.into(),
                    seconds: READY_TIMEOUT.as_secs(),
                    detail: format!("{last}\n{}", logs.join("\n")),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A kube-rs client with cluster-admin rights.
    pub async fn admin_client(&self) -> Result<kube::Client> {
        client_from_kubeconfig(&self.admin_kubeconfig).await
    }

    /// The admin kubeconfig (0600).
    pub fn admin_kubeconfig(&self) -> &Path {
        &self.admin_kubeconfig
    }

    /// `kubectl` from the same release, using the admin kubeconfig.
    pub fn kubectl(&self) -> Command {
        let mut cmd = Command::new(self.bin_dir.join("kubectl"));
        cmd.arg(format!("--kubeconfig={}", self.admin_kubeconfig.display()));
        cmd
    }

    /// `kubectl apply -f -` of `manifest` as cluster admin.
    pub fn apply(&self, manifest: &str) -> Result<()> {
        let mut cmd = self.kubectl();
        cmd.args(["apply", "-f", "-"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let shown = format!("{cmd:?}");
        let mut child = cmd.spawn().map_err(|e| Error::io("run", &shown, e))?;
        let written =
            std::io::Write::write_all(&mut child.stdin.take().expect("stdin is piped"), manifest.as_bytes());
        let out = child.wait_with_output().map_err(|e| Error::io("run", &shown, e))?;
        written.map_err(|e| Error::io("write to", &shown, e))?;
        if !out.status.success() {
            return Err(Error::Command {
                command: shown,
                status: out.status.to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            });
        }
        Ok(())
    }

    /// The directory holding the control-plane binaries.
    pub fn bin_dir(&self) -> &Path {
        &self.bin_dir
    }

    /// The API server's URL.
    pub fn api_url(&self) -> &str {
        &self.api_url
    }

    /// The control-plane host.
    pub fn host(&self) -> &Host {
        &self.host
    }

    /// The test network (the control-plane host and the node hosts).
    pub fn network(&self) -> &TestNetwork {
        &self.network
    }

    /// The cluster PKI.
    pub fn pki(&self) -> &ClusterPki {
        &self.pki
    }

    /// The harness's temporary directory (PKI, logs, etcd data).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// PIDs of the running components, by name.
    pub fn pids(&self) -> Vec<(String, u32)> {
        self.components.iter().map(|c| (c.name().to_owned(), c.pid())).collect()
    }

    /// Issues a client certificate for node `name` (`system:node:<name>`, `O=system:nodes`) and
    /// writes a kubeconfig with it; returns the kubeconfig's path.
    pub fn node_kubeconfig(&self, name: &str) -> Result<PathBuf> {
        self.node_credentials(name).map(|(kubeconfig, _)| kubeconfig)
    }

    /// [`Self::node_kubeconfig`], with the node's client certificate and key.
    pub fn node_credentials(&self, name: &str) -> Result<(PathBuf, crate::pki::CertFiles)> {
        let files = self.pki.client_cert(
            &format!("node-{name}"),
            &format!("system:node:{name}"),
            &["system:nodes"],
        )?;
        let path = self.dir.path().join(format!("node-{name}.kubeconfig"));
        write_kubeconfig(
            &path,
            &self.api_url,
            &self.pki.server_ca().cert,
            &format!("system:node:{name}"),
            &files,
        )?;
        Ok((path, files))
    }
}

impl ControlPlane {
    /// Writes a kubeconfig (0600) that authenticates with bearer `token` (a ServiceAccount's,
    /// as a pod would use it in the cluster) as `user`; returns its path.
    pub fn token_kubeconfig(&self, user: &str, token: &str) -> Result<PathBuf> {
        let path = self.dir.path().join(format!("{user}.kubeconfig"));
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: hpk-test\n  cluster:\n    server: {server}\n    certificate-authority: {ca}\n\
             users:\n- name: {user}\n  user:\n    token: {token}\n\
             contexts:\n- name: hpk-test\n  context:\n    cluster: hpk-test\n    user: {user}\ncurrent-context: hpk-test\n",
            server = self.api_url,
            ca = self.pki.server_ca().cert.display(),
        );
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| Error::io("create", path.display(), e))?;
        std::io::Write::write_all(&mut file, text.as_bytes())
            .map_err(|e| Error::io("write", path.display(), e))?;
        Ok(path)
    }

    /// Routes every Node's podCIDR from the control-plane host via the Node's InternalIP, as a
    /// flat node network would: pods reaching the API server through the `kubernetes` Service
    /// (kube-proxy DNATs without masquerading pod sources) and the API server reaching pods
    /// (aggregated APIs, webhooks) both need it. Returns the routes as `CIDR via IP`; Nodes
    /// without a podCIDR yet are left out.
    pub async fn route_pod_cidrs(&self) -> Result<Vec<String>> {
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(self.admin_client().await?);
        let mut routes = Vec::new();
        for node in nodes.list(&Default::default()).await? {
            let cidr = node.spec.as_ref().and_then(|s| s.pod_cidr.clone());
            let ip = node
                .status
                .as_ref()
                .and_then(|s| s.addresses.as_ref())
                .and_then(|a| a.iter().find(|a| a.type_ == "InternalIP").map(|a| a.address.clone()));
            let (Some(cidr), Some(ip)) = (cidr, ip) else { continue };
            crate::netns::ip(&["-n", &self.host.netns, "route", "replace", &cidr, "via", &ip])?;
            routes.push(format!("{cidr} via {ip}"));
        }
        Ok(routes)
    }
}

impl ControlPlane {
    /// The cluster's cert-signer (`hpk-cert-signer serve` from `rust_bin_dir`) on the
    /// control-plane host, started on first use: it signs kubelet serving certificates with
    /// the kubelet CA, which the API server's `--kubelet-certificate-authority` trusts (its own TLS
    /// certificate is from the server CA, which clients pin).
    pub fn cert_signer(&self, rust_bin_dir: &Path) -> Result<CertSigner> {
        self.cert_signer_with_validity(rust_bin_dir, None)
    }

    /// [`Self::cert_signer`], the signer started (if this is the first use) with
    /// `--max-validity=<max_validity>`, e.g. `30s`, so that renewals happen within a test.
    pub fn cert_signer_with_validity(
        &self,
        rust_bin_dir: &Path,
        max_validity: Option<&str>,
    ) -> Result<CertSigner> {
        let mut slot = self.signer.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((_, signer)) = slot.as_ref() {
            return Ok(signer.clone());
        }
        let d = self.dir.path().join("cert-signer");
        std::fs::create_dir_all(&d).map_err(|e| Error::io("create", d.display(), e))?;
        let token_key_file = d.join("node-token-key");
        let mut key = [0u8; 32];
        getrandom::fill(&mut key)
            .map_err(|e| Error::io("generate", "the node-token key", std::io::Error::other(e.to_string())))?;
        let token_key = hex::encode(key);
        crate::pki::write_secret(&token_key_file, &token_key)?;
        let address_file = d.join("address");
        let (kubelet_ca, client_ca) = (self.pki.kubelet_ca(), self.pki.client_ca());
        let p = |path: &Path| path.display().to_string();
        let mut cmd = self.host.command(rust_bin_dir.join("hpk-cert-signer"));
        cmd.arg("serve")
            .arg(format!("--listen={}:0", self.host.ip))
            .arg(format!("--address-file={}", p(&address_file)))
            .arg(format!("--tls-cert-file={}", p(&self.pki.cert_signer.cert)))
            .arg(format!("--tls-private-key-file={}", p(&self.pki.cert_signer.key)))
            .arg(format!("--serving-ca-cert={}", p(&kubelet_ca.cert)))
            .arg(format!("--serving-ca-key={}", p(&kubelet_ca.key)))
            .arg(format!("--client-ca-cert={}", p(&client_ca.cert)))
            .arg(format!("--client-ca-key={}", p(&client_ca.key)))
            .arg(format!("--token-key-file={}", p(&token_key_file)))
            .arg(format!("--shared-dir={}", p(&d.join("shared"))))
            .arg(format!("--apiserver-san={}", self.host.ip));
        if let Some(validity) = max_validity {
            cmd.arg(format!("--max-validity={validity}"));
        }
        let mut process = Process::spawn("hpk-cert-signer", cmd, &self.dir.path().join("cert-signer.log"))?;
        let deadline = Instant::now() + Duration::from_secs(20);
        while !address_file.is_file() {
            process.check_alive()?;
            if Instant::now() >= deadline {
                return Err(Error::NotReady {
                    what: "hpk-cert-signer".into(),
                    seconds: 20,
                    detail: process.log_tail(20),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let signer = CertSigner { address_file, ca: self.pki.server_ca().cert.clone(), dir: d, token_key };
        *slot = Some((process, signer.clone()));
        Ok(signer)
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        if let Some((mut signer, _)) =
            self.signer.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take()
        {
            signer.stop();
        }
        // Reverse start order: the scheduler and controller-manager before the API server,
        // etcd last. The network and the directory go after, as fields drop.
        while let Some(mut component) = self.components.pop() {
            component.stop();
        }
    }
}

/// A client from a kubeconfig file.
pub async fn client_from_kubeconfig(path: &Path) -> Result<kube::Client> {
    let kubeconfig =
        kube::config::Kubeconfig::read_from(path).map_err(|e| Error::Kubeconfig(e.to_string()))?;
    let config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
            .await
            .map_err(|e| Error::Kubeconfig(e.to_string()))?;
    Ok(kube::Client::try_from(config)?)
}

/// A client for a component's self-signed health endpoint (anonymous, like kubelet probes).
fn insecure_client(url: &str) -> Result<kube::Client> {
    let mut config = kube::Config::new(url.parse().map_err(|e| Error::Kubeconfig(format!("{url}: {e}")))?);
    config.accept_invalid_certs = true;
    Ok(kube::Client::try_from(config)?)
}

async fn get_text(client: &kube::Client, path: &str) -> Result<String, String> {
    let request = http::Request::get(path).body(Vec::new()).map_err(|e| e.to_string())?;
    client.request_text(request).await.map_err(|e| e.to_string())
}
