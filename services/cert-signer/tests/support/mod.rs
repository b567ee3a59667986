//! Test fixtures: a throwaway PKI and the real `hpk-cert-signer` binary started on it.
#![allow(dead_code, missing_docs)] // each test binary uses a different part

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hpk_cert_signer::client::SignerClient;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};

pub const BIN: &str = env!("CARGO_BIN_EXE_hpk-cert-signer");
/// The cluster's node-token key; each node's token is made from it ([`Pki::token_for`]).
pub const TOKEN_KEY: &str = "test-node-token-key-0123456789abcdef";

/// Installs the process-wide rustls provider (ring), as the binaries do.
pub fn init_crypto() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Two CAs and a node-token key in a temporary directory laid out like a controller: keys in
/// `local/` (node-local storage), the public CAs in `home/.hpk/` (the shared directory).
pub struct Pki {
    pub dir: tempfile::TempDir,
    pub serving_ca_cert: PathBuf,
    pub serving_ca_key: PathBuf,
    pub client_ca_cert: PathBuf,
    pub client_ca_key: PathBuf,
    pub token_key_file: PathBuf,
    pub shared_dir: PathBuf,
}

impl Pki {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let local = dir.path().join("local");
        let shared_dir = dir.path().join("home/.hpk");
        std::fs::create_dir_all(&local).expect("mkdir local");
        std::fs::create_dir_all(&shared_dir).expect("mkdir shared");
        let (serving_ca_cert, serving_ca_key) = write_ca(&local, &shared_dir, "serving-ca", "hpk-serving-ca");
        let (client_ca_cert, client_ca_key) = write_ca(&local, &shared_dir, "client-ca", "hpk-client-ca");
        let token_key_file = local.join("node-token-key");
        write_mode(&token_key_file, format!("{TOKEN_KEY}\n").as_bytes(), 0o600);
        Self {
            dir,
            serving_ca_cert,
            serving_ca_key,
            client_ca_cert,
            client_ca_key,
            token_key_file,
            shared_dir,
        }
    }

    /// Node `node`'s token.
    pub fn token_for(&self, node: &str) -> String {
        token_for(node)
    }

    /// A node-local file (0600) holding node `node`'s token, as a launcher leaves it.
    pub fn token_file_for(&self, node: &str) -> PathBuf {
        let path = self.dir.path().join("local").join(format!("{node}.token"));
        write_mode(&path, format!("{}\n", token_for(node)).as_bytes(), 0o600);
        path
    }

    pub fn serving_ca_pem(&self) -> Vec<u8> {
        std::fs::read(&self.serving_ca_cert).expect("read CA")
    }

    /// The arguments of `hpk-cert-signer serve` for this PKI on an ephemeral loopback port.
    pub fn serve_args(&self) -> Vec<String> {
        let p = |p: &Path| p.display().to_string();
        vec![
            "serve".into(),
            "--listen=127.0.0.1:0".into(),
            format!("--address-file={}", p(&self.address_file())),
            format!("--serving-ca-cert={}", p(&self.serving_ca_cert)),
            format!("--serving-ca-key={}", p(&self.serving_ca_key)),
            format!("--client-ca-cert={}", p(&self.client_ca_cert)),
            format!("--client-ca-key={}", p(&self.client_ca_key)),
            format!("--token-key-file={}", p(&self.token_key_file)),
            format!("--shared-dir={}", p(&self.shared_dir)),
            "--apiserver-san=10.96.0.1".into(),
        ]
    }

    pub fn address_file(&self) -> PathBuf {
        self.shared_dir.join("cert-signer.url")
    }
}

/// Node `node`'s token under [`TOKEN_KEY`].
pub fn token_for(node: &str) -> String {
    hpk_rpc::node_token::derive(TOKEN_KEY.as_bytes(), node)
}

fn write_ca(local: &Path, shared: &Path, file: &str, cn: &str) -> (PathBuf, PathBuf) {
    let key = KeyPair::generate().expect("CA key");
    let mut params = CertificateParams::default();
    params.distinguished_name.push(DnType::CommonName, cn);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages =
        vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    let cert = params.self_signed(&key).expect("self-signed CA");
    let cert_path = shared.join(format!("{file}.crt"));
    let key_path = local.join(format!("{file}.key"));
    write_mode(&cert_path, cert.pem().as_bytes(), 0o644);
    write_mode(&key_path, key.serialize_pem().as_bytes(), 0o600);
    (cert_path, key_path)
}

pub fn write_mode(path: &Path, contents: &[u8], mode: u32) {
    std::fs::write(path, contents).expect("write fixture");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod fixture");
}

/// A running `hpk-cert-signer serve`, stopped with SIGTERM when dropped.
pub struct Signer {
    child: Child,
    pub url: String,
    pub ca_pem: Vec<u8>,
    log: PathBuf,
}

impl Signer {
    pub fn start(pki: &Pki, extra: &[&str]) -> Self {
        let log = pki.dir.path().join(format!("signer-{}.log", std::process::id()));
        let _ = std::fs::remove_file(pki.address_file());
        let child = Command::new(BIN)
            .args(pki.serve_args())
            .args(extra)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("spawn hpk-cert-signer");
        let mut signer = Self { child, url: String::new(), ca_pem: pki.serving_ca_pem(), log };
        signer.url = signer.wait_for_address(&pki.address_file());
        signer
    }

    /// Readiness: the signer writes its address file only once it listens.
    fn wait_for_address(&mut self, file: &Path) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(url) = std::fs::read_to_string(file) {
                return url.trim().to_owned();
            }
            if let Some(status) = self.child.try_wait().expect("wait") {
                panic!("signer exited with {status} before listening:\n{}", self.log());
            }
            assert!(Instant::now() < deadline, "signer did not listen within 20 s:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A client with node `node`'s token.
    pub async fn client(&self, node: &str) -> SignerClient {
        SignerClient::connect(&self.url, &self.ca_pem, &token_for(node), None)
            .await
            .expect("connect to signer")
    }

    /// Sends SIGTERM and waits for the exit status.
    pub fn stop(&mut self) -> std::process::ExitStatus {
        terminate(&mut self.child)
    }
}

impl Drop for Signer {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            terminate(&mut self.child);
        }
    }
}

/// SIGTERM, then up to 15 s for a graceful exit, then SIGKILL.
pub fn terminate(child: &mut Child) -> std::process::ExitStatus {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    let pid = Pid::from_raw(i32::try_from(child.id()).expect("pid fits"));
    let _ = kill(pid, Signal::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait().expect("wait") {
            return status;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    child.wait().expect("wait after kill")
}

/// Resident set size of a process in KiB, from /proc.
pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read /proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc status")
}
