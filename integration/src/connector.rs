//! Connector mode's remote side on a test host: a runtime bubble (`hpk bubble --role
//! runtime`) — hpk-net-forwarder with a fixed pod CIDR and hpk-pod-runtime serving CRI over
//! mutual TLS on the port the bubble publishes — as a user would run it in an HPC allocation
//! for a kubelet in another cluster. The runtime's certificate is the bubble's own (its
//! `runtime-ca.crt`); the connector's client certificate comes from the harness's real
//! hpk-cert-signer (client profile, `system:node:<connector>`), whose CA the bubble is told to
//! accept.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::controlplane::ControlPlane;
use crate::netns::Host;
use crate::process::Process;
use crate::{Error, Result};

/// What a connector needs to reach the runtime.
#[derive(Clone, Debug)]
pub struct Credentials {
    /// `https://IP:PORT`.
    pub endpoint: String,
    /// The file the bubble wrote it to (`runtime-endpoint`, with its newline), as a user
    /// puts it into the connector's Secret.
    pub endpoint_file: PathBuf,
    /// The CA of the runtime's certificate (the bubble's own, from its `runtime-ca.crt`).
    pub ca: PathBuf,
    /// The connector's client certificate (from the harness's client CA).
    pub cert: PathBuf,
    /// Its key (0600).
    pub key: PathBuf,
}

/// A runtime bubble (`hpk bubble --role runtime`) on a test host, as a user would run it in
/// an allocation: rootless crun, its own network namespace, the port published on the host's
/// address. Dropped: SIGTERM, and the launcher removes what it made.
pub struct RuntimeBubble {
    launcher: Option<Process>,
    host: Host,
    /// The bubble's service logs (`<state>/<cluster>/<node>/logs`).
    logs_dir: PathBuf,
    /// The link's credentials.
    pub credentials: Credentials,
}

impl RuntimeBubble {
    /// Starts the bubble on test host `name` of `cp` (`hpk` and `image` as built; pods get
    /// addresses of `pod_cidr`), accepting client certificates of the cluster's client CA, and
    /// waits until it publishes its endpoint; the client certificate is issued for node
    /// `connector`. `home` and `state` become `HPK_HOME` and `HPK_STATE_DIR`.
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        cp: &ControlPlane,
        name: &str,
        hpk: &Path,
        image: &Path,
        (home, state): (&Path, &Path),
        insecure_registry: Option<&str>,
        pod_cidr: &str,
        connector: &str,
    ) -> Result<Self> {
        let host = cp.network().host(name).cloned().ok_or_else(|| Error::NotFound {
            what: format!("test host {name}"),
            hint: "create it with the control plane".into(),
        })?;
        let bin_dir = hpk.parent().unwrap_or(Path::new("."));
        let certs = home.join("connector-certs");
        std::fs::create_dir_all(&certs).map_err(|e| Error::io("create", certs.display().to_string(), e))?;
        let (cert, key) = issue(cp, bin_dir, connector, "client", &[], &certs, "connector", None)?;
        let cluster = "connector".to_owned();
        // nsenter, not `ip netns exec`: that one mounts a fresh /sys without the cgroup
        // hierarchy crun binds into the bubble.
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net=/run/netns/{}", host.netns))
            .arg("--")
            .arg(hpk)
            .args(["bubble", "--role=runtime", &format!("--cluster={cluster}"), &format!("--node={name}")])
            .arg(format!("--address={}", host.ip))
            .arg(format!("--image={}", image.display()))
            .arg(format!("--client-ca-file={}", cp.pki().client_ca().cert.display()))
            .arg(format!("--pod-cidr={pod_cidr}"))
            .env("HPK_HOME", home)
            .env("HPK_STATE_DIR", state)
            .env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()));
        if let Some(registry) = insecure_registry {
            cmd.arg(format!("--insecure-registry={registry}"));
        }
        let mut launcher =
            Process::spawn("hpk bubble --role runtime", cmd, &home.join("runtime-bubble.log"))?;
        let shared = home.join(&cluster);
        let endpoint_file = shared.join("runtime-endpoint");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        let endpoint = loop {
            if let Ok(text) = std::fs::read_to_string(&endpoint_file)
                && text.ends_with('\n')
            {
                break text.trim().to_owned();
            }
            launcher.check_alive()?;
            if std::time::Instant::now() > deadline {
                return Err(Error::NotReady {
                    what: endpoint_file.display().to_string(),
                    seconds: 120,
                    detail: launcher.log_tail(40),
                });
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        };
        let credentials =
            Credentials { endpoint, endpoint_file, ca: shared.join("runtime-ca.crt"), cert, key };
        let logs_dir = state.join(&cluster).join(name).join("logs");
        Ok(Self { launcher: Some(launcher), host, logs_dir, credentials })
    }

    /// The published port.
    pub fn port(&self) -> u16 {
        self.credentials.endpoint.rsplit(':').next().and_then(|p| p.parse().ok()).unwrap_or(0)
    }

    /// The test host.
    pub fn host(&self) -> &Host {
        &self.host
    }

    /// The launcher's log and the bubble's service logs, for failure messages.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        if let Some(launcher) = &self.launcher {
            out.push_str(&format!("--- runtime bubble launcher:\n{}\n", launcher.log_tail(30)));
        }
        for service in ["hpk-pod-runtime", "hpk-net-forwarder"] {
            let text =
                std::fs::read_to_string(self.logs_dir.join(format!("{service}.log"))).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            out.push_str(&format!(
                "--- {service} in the bubble:\n{}\n",
                lines[lines.len().saturating_sub(30)..].join("\n")
            ));
        }
        out
    }

    /// Stops the bubble: SIGTERM, and the launcher's own bounded teardown (its services'
    /// grace periods) is waited for, up to a minute, before anything is killed.
    pub fn stop(&mut self) {
        if let Some(mut launcher) = self.launcher.take() {
            if let Ok(pid) = i32::try_from(launcher.pid()) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGTERM,
                );
            }
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
            while launcher.exit_status().is_none() && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            launcher.stop();
        }
    }
}

impl Drop for RuntimeBubble {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A certificate from the harness's hpk-cert-signer through `hpk-cert-signer request`, as an
/// operator gets one: `profile` `serving` (kubelet CA, `sans`) or `client` (client CA,
/// `system:node:<node>`). Written to `<dir>/<file>.crt` and `.key` (0600); returns both paths.
/// The token enrols a node once: a node that has a certificate presents it (`current`).
#[allow(clippy::too_many_arguments)]
pub fn issue(
    cp: &ControlPlane,
    bin_dir: &Path,
    node: &str,
    profile: &str,
    sans: &[String],
    dir: &Path,
    file: &str,
    current: Option<(&Path, &Path)>,
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
        .arg(signer.token_file(node)?)
        .args(["--node-name", node, "--profile", profile])
        .arg("--cert-out")
        .arg(&cert)
        .arg("--key-out")
        .arg(&key);
    if !sans.is_empty() {
        cmd.arg(format!("--san={}", sans.join(",")));
    }
    if let Some((cert, key)) = current {
        cmd.arg("--client-cert").arg(cert).arg("--client-key").arg(key);
    }
    let out = cmd.output().map_err(|e| Error::io("run", "hpk-cert-signer request", e))?;
    if !out.status.success() {
        return Err(Error::Command {
            command: format!("hpk-cert-signer request (a {profile} certificate for {node})"),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    Ok((cert, key))
}
