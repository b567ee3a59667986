//! Connector mode's remote side on a test host: hpk-net-forwarder with a fixed pod CIDR and
//! hpk-pod-runtime serving CRI over mutual TLS on the host's address (`--listen`), as an HPC
//! allocation would run them for a kubelet in another cluster. The credentials come from the
//! harness's real hpk-cert-signer: the runtime's serving certificate (server CA) and the
//! connector's client certificate (client CA, `system:node:<connector>`), which the runtime
//! accepts through `--client-ca-file`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::controlplane::ControlPlane;
use crate::netns::Host;
use crate::process::Process;
use crate::{Error, Result};

/// The port the runtime listens on, in its test host's own namespace.
pub const PORT: u16 = 7443;

/// What a connector needs to reach the runtime.
#[derive(Clone, Debug)]
pub struct Credentials {
    /// `https://IP:PORT`.
    pub endpoint: String,
    /// The CA of the runtime's certificate (the cluster's server CA).
    pub ca: PathBuf,
    /// The connector's client certificate and key (0600).
    pub cert: PathBuf,
    /// Its key.
    pub key: PathBuf,
}

/// A certificate from the harness's hpk-cert-signer through `hpk-cert-signer request`, as an
/// operator gets one: `profile` `serving` (server CA, `sans`) or `client` (client CA,
/// `system:node:<node>`). Written to `<dir>/<file>.crt` and `.key` (0600); returns both paths.
pub fn issue(
    cp: &ControlPlane,
    bin_dir: &Path,
    node: &str,
    profile: &str,
    sans: &[String],
    dir: &Path,
    file: &str,
) -> Result<(PathBuf, PathBuf)> {
    let signer = cp.cert_signer(bin_dir)?;
    let (cert, key) = (dir.join(format!("{file}.crt")), dir.join(format!("{file}.key")));
    let mut cmd = Command::new(bin_dir.join("hpk-cert-signer"));
    cmd.arg("request")
        .arg("--server-file")
        .arg(&signer.address_file)
        .arg("--ca-cert")
        .arg(&signer.ca)
        .arg("--token-file")
        .arg(&signer.token_file)
        .args(["--node-name", node, "--profile", profile])
        .arg("--cert-out")
        .arg(&cert)
        .arg("--key-out")
        .arg(&key);
    if !sans.is_empty() {
        cmd.arg(format!("--san={}", sans.join(",")));
    }
    let out = cmd.output().map_err(|e| Error::io("run", "hpk-cert-signer request", e))?;
    if !out.status.success() {
        return Err(Error::Missing {
            what: format!("a {profile} certificate for {node}"),
            hint: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    Ok((cert, key))
}

/// The remote side's processes; on drop every pod is removed, then both stop.
pub struct RemoteRuntime {
    runtime: Option<Process>,
    net_forwarder: Option<Process>,
    host: Host,
    runtime_cmd: Vec<String>,
    socket: PathBuf,
    dir: PathBuf,
    runs: u32,
    /// The link's credentials.
    pub credentials: Credentials,
}

impl RemoteRuntime {
    /// Starts the net-forwarder (pods get addresses of `pod_cidr`) and the runtime on test host
    /// `name` of `cp`, state under `dir`; the client certificate is issued for node
    /// `connector`.
    pub fn start(
        cp: &ControlPlane,
        name: &str,
        dir: &Path,
        bin_dir: &Path,
        insecure_registry: Option<&str>,
        pod_cidr: &str,
        connector: &str,
    ) -> Result<Self> {
        let host = cp.network().host(name).cloned().ok_or_else(|| Error::Missing {
            what: format!("test host {name}"),
            hint: "create it with the control plane".into(),
        })?;
        let mkdir = |d: &Path| {
            std::fs::create_dir_all(d).map_err(|e| Error::io("create", d.display().to_string(), e))
        };
        mkdir(&dir.join("nf"))?;
        mkdir(&dir.join("runtime"))?;
        mkdir(&dir.join("certs"))?;
        let certs = dir.join("certs");
        let (serving_cert, serving_key) =
            issue(cp, bin_dir, name, "serving", &[host.ip.to_string()], &certs, "runtime")?;
        let (cert, key) = issue(cp, bin_dir, connector, "client", &[], &certs, "connector")?;
        let signer = cp.cert_signer(bin_dir)?;
        let nf_socket = dir.join("nf/run/nf.sock");
        let mut nf = host.command(bin_dir.join("hpk-net-forwarder"));
        nf.arg("serve")
            .arg("--socket")
            .arg(&nf_socket)
            .arg("--state-dir")
            .arg(dir.join("nf/state"))
            .arg(format!("--pod-cidr={pod_cidr}"));
        let net_forwarder = Process::spawn("hpk-net-forwarder", nf, &dir.join("net-forwarder.log"))?;

        let socket = dir.join("runtime/run/cri.sock");
        let listen = SocketAddr::new(host.ip.into(), PORT);
        // nsenter, not `ip netns exec`: that one mounts a fresh /sys without the cgroup
        // hierarchy crun needs.
        let mut runtime_cmd = vec![
            format!("--net=/run/netns/{}", host.netns),
            "--".into(),
            bin_dir.join("hpk-pod-runtime").display().to_string(),
            format!("--socket={}", socket.display()),
            format!("--root={}", dir.join("runtime/root").display()),
            format!("--pause-binary={}", bin_dir.join("hpk-pause").display()),
            format!("--net-forwarder-socket={}", nf_socket.display()),
            format!("--listen={listen}"),
            format!("--tls-cert-file={}", serving_cert.display()),
            format!("--tls-private-key-file={}", serving_key.display()),
            format!("--client-ca-file={}", cp.pki().client_ca().cert.display()),
        ];
        if let Some(registry) = insecure_registry {
            runtime_cmd.push(format!("--insecure-registry={registry}"));
        }
        let credentials =
            Credentials { endpoint: format!("https://{listen}"), ca: signer.ca.clone(), cert, key };
        let mut remote = Self {
            runtime: None,
            net_forwarder: Some(net_forwarder),
            host,
            runtime_cmd,
            socket,
            dir: dir.to_owned(),
            runs: 0,
            credentials,
        };
        remote.start_runtime()?;
        Ok(remote)
    }

    /// Starts the runtime (again); its log is `runtime-<n>.log`, n counting from 1.
    pub fn start_runtime(&mut self) -> Result<()> {
        let mut cmd = Command::new("nsenter");
        cmd.args(&self.runtime_cmd)
            .env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()));
        self.runs += 1;
        let log = self.dir.join(format!("runtime-{}.log", self.runs));
        self.runtime = Some(Process::spawn("hpk-pod-runtime", cmd, &log)?);
        Ok(())
    }

    /// Stops the runtime with SIGTERM: its listener is gone, its pods keep running.
    pub fn stop_runtime(&mut self) {
        if let Some(mut runtime) = self.runtime.take() {
            runtime.stop();
        }
    }

    /// The test host.
    pub fn host(&self) -> &Host {
        &self.host
    }

    /// The runtime's UNIX socket (crictl, for the test's own checks).
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The tails of both logs, for failure messages.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for (name, p) in [("runtime", &self.runtime), ("net-forwarder", &self.net_forwarder)] {
            if let Some(p) = p {
                out.push_str(&format!("--- {name} on {}:\n{}\n", self.host.name, p.log_tail(40)));
            }
        }
        out
    }
}

impl Drop for RemoteRuntime {
    fn drop(&mut self) {
        if self.runtime.is_none() {
            // Pods outlive their runtime: start it once more to remove them.
            let _ = self.start_runtime();
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
            while !self.socket.exists() && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
        }
        crate::hpknode::remove_all_pods(&self.socket, &self.host.name);
        self.runtime.take();
        self.net_forwarder.take();
    }
}
