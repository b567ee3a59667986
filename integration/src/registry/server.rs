//! The registry process: Debian's `docker-registry` with a config, storage and log of its own.

use std::net::{IpAddr, SocketAddr, TcpListener};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use tracing::{debug, info, warn};

use super::{Error, Result, http_client};
use crate::process::Process;

/// The registry binary of Debian's `docker-registry` package.
pub const REGISTRY_BIN: &str = "docker-registry";

/// How long the registry may take to answer `GET /v2/`; it usually takes well under a second.
/// A response header naming the registry instance, so readiness is this registry's own.
const INSTANCE_HEADER: &str = "X-Hpk-Registry-Instance";
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Ports picked free can be taken by someone else before the registry binds them.
const PORT_ATTEMPTS: usize = 5;
/// How many log lines error messages carry.
const LOG_TAIL_LINES: usize = 40;

/// A running registry; dropping it stops the process and removes its config and storage.
#[derive(Debug)]
pub struct Registry {
    process: Process,
    addr: SocketAddr,
    /// Sent back by this registry (and no other) in [`INSTANCE_HEADER`].
    instance: String,
    // Dropped after the process is stopped (fields drop in declaration order).
    dir: tempfile::TempDir,
}

/// The registry binary's path, if it is installed.
pub fn find_registry() -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join(REGISTRY_BIN)).find(|p| p.is_file())
}

impl Registry {
    /// Starts a registry on `ip` (a free port is chosen), inside network namespace `netns` if
    /// given, and waits until it answers `GET /v2/`. With a namespace, `ip` must be reachable
    /// from the caller's namespace, since readiness is checked from here.
    pub async fn start(ip: IpAddr, netns: Option<&str>) -> Result<Self> {
        Self::start_with(ip, netns, None).await
    }

    /// [`Registry::start`] on `ip`, asking for HTTP basic credentials of the `htpasswd` file
    /// (bcrypt entries, `htpasswd -B`) for every request.
    pub async fn start_with_htpasswd(ip: IpAddr, htpasswd: &Path) -> Result<Self> {
        Self::start_with(ip, None, Some(htpasswd)).await
    }

    async fn start_with(ip: IpAddr, netns: Option<&str>, htpasswd: Option<&Path>) -> Result<Self> {
        if find_registry().is_none() {
            return Err(Error::NotInstalled);
        }
        let http = http_client()?;
        let mut attempt = 1;
        loop {
            let mut registry = Self::spawn(ip, netns, htpasswd)?;
            match registry.wait_ready(&http).await {
                Ok(()) => {
                    info!(url = %registry.url(), pid = registry.pid(), netns, "registry ready");
                    return Ok(registry);
                }
                // Someone took the port between our probe and the registry's bind: dropping
                // this one cleans it up, and the next try picks another port.
                Err(Error::Exited { ref log_tail, .. })
                    if attempt < PORT_ATTEMPTS && log_tail.contains("address already in use") =>
                {
                    warn!(attempt, addr = %registry.addr, "registry port taken; retrying");
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn spawn(ip: IpAddr, netns: Option<&str>, htpasswd: Option<&Path>) -> Result<Self> {
        let dir = tempfile::Builder::new().prefix("hpk-registry-").tempdir().map_err(|source| {
            Error::File { action: "creating a temp dir in", path: std::env::temp_dir(), source }
        })?;
        let addr = free_port(ip, netns.is_some())?;
        let storage = dir.path().join("storage");
        let config = dir.path().join("config.yml");
        // Which registry answers: another test's registry may hold the port this one picked
        // (both probed it free; the other bound first), and its 200 must not count as ours.
        let instance = dir.path().file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let mut yaml = config_yaml(addr, &storage, &instance);
        if let Some(file) = htpasswd {
            yaml.push_str(&htpasswd_yaml(file));
        }
        write(&config, yaml.as_bytes())?;
        let mut cmd = match netns {
            // `ip netns exec` execs the registry, so the child's PID is the registry's own.
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, REGISTRY_BIN]);
                c
            }
            None => Command::new(REGISTRY_BIN),
        };
        cmd.arg("serve").arg(&config);
        // REGISTRY_* variables override the config file; ours must be the whole truth.
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("REGISTRY_") {
                cmd.env_remove(key);
            }
        }
        let process = Process::spawn("docker-registry", cmd, &dir.path().join("registry.log"))?;
        debug!(pid = process.pid(), %addr, netns, "registry spawned");
        Ok(Self { process, addr, dir, instance })
    }

    /// Polls `GET /v2/` until it answers 200, the process exits, or the deadline passes.
    async fn wait_ready(&mut self, http: &reqwest::Client) -> Result<()> {
        let url = format!("{}/v2/", self.url());
        let start = Instant::now();
        let mut pause = Duration::from_millis(20);
        loop {
            if let Some(status) = self.process.exit_status() {
                return Err(Error::Exited { addr: self.addr, status, log_tail: self.log_tail() });
            }
            match http.get(&url).timeout(Duration::from_secs(2)).send().await {
                // With credentials required, an anonymous GET is answered 401.
                Ok(r)
                    if (r.status() == reqwest::StatusCode::OK
                        || r.status() == reqwest::StatusCode::UNAUTHORIZED)
                        && r.headers()
                            .get(INSTANCE_HEADER)
                            .is_some_and(|v| v.as_bytes() == self.instance.as_bytes()) =>
                {
                    return Ok(());
                }
                Ok(r) if r.status() == reqwest::StatusCode::OK => {
                    debug!(addr = %self.addr, "another registry answers on our port");
                }
                Ok(r) => debug!(status = %r.status(), "registry not ready"),
                Err(e) => debug!(error = %e, "registry not ready"),
            }
            if start.elapsed() > READY_TIMEOUT {
                return Err(Error::NotReady {
                    addr: self.addr,
                    waited: start.elapsed(),
                    log_tail: self.log_tail(),
                });
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(250));
        }
    }

    /// `http://<host:port>`, the base of every API URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.host_port())
    }

    /// `host:port` as image references use it (IPv6 in brackets).
    pub fn host_port(&self) -> String {
        self.addr.to_string()
    }

    /// The address the registry listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The registry's process ID.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// The temp dir holding the config, the storage and the log.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The last lines of the registry's log, for error messages.
    pub fn log_tail(&self) -> String {
        self.process.log_tail(LOG_TAIL_LINES)
    }
}

/// A port on `ip` that is free now, found by binding port 0 and letting go of it. An address
/// inside another namespace cannot be bound here, so there we probe the unspecified address of
/// the same family; a clash is still caught by the retry in [`Registry::start`].
fn free_port(ip: IpAddr, in_netns: bool) -> Result<SocketAddr> {
    let probe = match (in_netns, ip) {
        (false, _) => ip,
        (true, IpAddr::V4(_)) => IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
        (true, IpAddr::V6(_)) => IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
    };
    let listener = TcpListener::bind((probe, 0)).map_err(|source| Error::PickPort { ip, source })?;
    let port = listener.local_addr().map_err(|source| Error::PickPort { ip, source })?.port();
    Ok(SocketAddr::new(ip, port))
}

fn write(path: &Path, data: &[u8]) -> Result<()> {
    std::fs::write(path, data).map_err(|source| Error::File {
        action: "writing",
        path: path.to_owned(),
        source,
    })
}

/// The registry's config: plain HTTP on `addr` only, no debug or metrics listener, no proxying
/// to an upstream, deletes allowed so tests can clean up.
fn config_yaml(addr: SocketAddr, storage: &Path, instance: &str) -> String {
    // JSON strings are valid YAML double-quoted scalars, so this quotes any path safely.
    let quote = |s: &str| serde_json::Value::from(s).to_string();
    format!(
        "version: 0.1
log:
  level: info
  formatter: text
  accesslog:
    disabled: false
storage:
  filesystem:
    rootdirectory: {storage}
  delete:
    enabled: true
  maintenance:
    uploadpurging:
      enabled: false
http:
  addr: {addr}
  net: tcp
  draintimeout: 1s
  headers:
    X-Content-Type-Options: [nosniff]
    {INSTANCE_HEADER}: [{instance}]
  debug:
    addr: \"\"
    prometheus:
      enabled: false
health:
  storagedriver:
    enabled: false
",
        storage = quote(&storage.to_string_lossy()),
        addr = quote(&addr.to_string()),
    )
}

/// The config's section asking for the credentials of an htpasswd file.
fn htpasswd_yaml(file: &Path) -> String {
    let quote = |s: &str| serde_json::Value::from(s).to_string();
    format!("auth:\n  htpasswd:\n    realm: hpk-test\n    path: {}\n", quote(&file.to_string_lossy()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_listens_only_where_told() {
        let addr: SocketAddr = "127.0.0.1:5123".parse().expect("address");
        let yaml = config_yaml(addr, Path::new("/tmp/x y/storage"), "hpk-registry-abc");
        assert!(yaml.contains("addr: \"127.0.0.1:5123\""));
        assert!(yaml.contains("rootdirectory: \"/tmp/x y/storage\""));
        assert!(yaml.contains("debug:\n    addr: \"\""));
        assert!(!yaml.contains("proxy"));
        assert!(yaml.contains("X-Hpk-Registry-Instance: [hpk-registry-abc]"), "{yaml}");
    }
}
