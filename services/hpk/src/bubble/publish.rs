//! What a bubble publishes to the cluster's shared directory, published by its launcher
//! (review H5).
//!
//! Every bubble sees the shared directory read-only: a bubble taken over by a pod could
//! otherwise plant a kubeconfig with an `exec` plugin, which the user's kubectl would run on
//! the login node. A bubble that has something to publish writes its parts into the
//! `publish/` directory of its node directory, the `ready` file last. The launcher, outside the
//! bubble, reads each part once (no links followed, regular files of bounded size), checks it
//! (PEM of the expected kind), and only then writes the shared files itself:
//!
//! - controller: `ca.crt`, `client-ca.crt`, `apiserver` and `cert-signer` (the URLs are the
//!   launcher's own, from the address and the ports it bound), then `kubeconfig` last (its
//!   presence means the control plane is ready). The kubeconfig is written here from the
//!   published certificate and key: a client certificate and key, the
//!   expected server and the server CA, and nothing else — no `exec`, `auth-provider`, token
//!   or proxy can be in them.
//! - runtime: `runtime-ca.crt`, then `runtime-endpoint`.
//!
//! Nothing is written until every part has passed its check, so a bad part publishes nothing.

use std::io::Read;
use std::net::Ipv4Addr;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use nix::fcntl::{OFlag, openat};
use nix::sys::stat::{Mode, SFlag, fstat};

use super::Role;
use crate::cluster::{Shared, write_file};
use crate::error::{Error, Result};

/// The directory of the node directory the bubble publishes into.
pub const PUBLISH_DIR: &str = "publish";
/// Written last by the bubble: every part is there.
pub const READY: &str = "ready";
/// The largest part read: certificates and keys are a few kB.
const MAX_PART: u64 = 64 * 1024;

/// Where the launcher publishes to, and what it expects.
pub struct Target<'a> {
    /// The cluster's shared directory.
    pub shared: &'a Shared,
    /// The role of the bubble.
    pub role: Role,
    /// The address its ports are published on.
    pub address: Ipv4Addr,
    /// Its published ports by name.
    pub ports: &'a [(String, u16)],
}

impl Target<'_> {
    fn url(&self, port: &str) -> Result<String> {
        let (_, number) = self
            .ports
            .iter()
            .find(|(name, _)| name == port)
            .ok_or_else(|| Error::Invalid(format!("the bubble publishes no {port} port")))?;
        Ok(format!("https://{}:{number}", self.address))
    }
}

/// Publishes what the bubble of `node_dir` has made ready. `Ok(false)`: nothing yet (no
/// `ready` file, or a role that publishes nothing). An error names the part refused; nothing
/// has been written to the shared directory then.
pub fn try_publish(node_dir: &Path, target: &Target<'_>) -> Result<bool> {
    if matches!(target.role, Role::Worker) {
        return Ok(false);
    }
    let dir = match open_dir(&node_dir.join(PUBLISH_DIR)) {
        Ok(dir) => dir,
        Err(nix::errno::Errno::ENOENT) => return Ok(false),
        Err(e) => return Err(refused(PUBLISH_DIR, &format!("cannot open it: {e}"))),
    };
    match read_part(&dir, READY) {
        Err(Part::Missing) => return Ok(false),
        Err(Part::Refused(why)) => return Err(refused(READY, &why)),
        Ok(_) => {}
    }
    let read = |name: &str| {
        read_part(&dir, name).map_err(|e| match e {
            Part::Missing => refused(name, "missing, though the bubble said it was ready"),
            Part::Refused(why) => refused(name, &why),
        })
    };
    let cert =
        |name: &str| read(name).and_then(|bytes| pem_block(name, &bytes, &["CERTIFICATE"]).map(|()| bytes));
    let key = |name: &str| {
        read(name).and_then(|bytes| {
            pem_block(name, &bytes, &["PRIVATE KEY", "EC PRIVATE KEY", "RSA PRIVATE KEY"]).map(|()| bytes)
        })
    };
    let shared = &target.shared.dir;
    match target.role {
        Role::Controller => {
            let server_ca = cert("ca.crt")?;
            let client_ca = cert("client-ca.crt")?;
            let (admin_cert, admin_key) = (cert("admin.crt")?, key("admin.key")?);
            let api = target.url("apiserver")?;
            let signer = target.url("cert-signer")?;
            let name = format!("hpk-{}", target.shared.name);
            write_file(&shared.join("ca.crt"), &server_ca, 0o644)?;
            write_file(&shared.join("client-ca.crt"), &client_ca, 0o644)?;
            write_file(&shared.join("cert-signer"), format!("{signer}\n").as_bytes(), 0o644)?;
            // The user's credential beside the shared directory, where no bubble sees it; in
            // the directory only a link to it (review M4).
            let admin = kubeconfig(&name, &api, &server_ca, "admin", &admin_cert, &admin_key);
            write_file(&target.shared.kubeconfig_file(), admin.as_bytes(), 0o600)?;
            crate::cluster::write_link(&target.shared.kubeconfig(), &target.shared.kubeconfig_file())?;
            // Last: the other nodes start once it is there.
            write_file(&shared.join("apiserver"), api.as_bytes(), 0o644)?;
        }
        Role::Runtime => {
            let ca = cert("runtime-ca.crt")?;
            let endpoint = target.url("runtime")?;
            write_file(&shared.join("runtime-ca.crt"), &ca, 0o644)?;
            write_file(&shared.join("runtime-endpoint"), format!("{endpoint}\n").as_bytes(), 0o644)?;
        }
        Role::Worker => return Ok(false),
    }
    tracing::info!(role = target.role.as_str(), "the bubble's files published to the shared directory");
    Ok(true)
}

/// A kubeconfig of one cluster, one user (a client certificate and key) and one context.
/// Every value from the bubble is base64: nothing in it can add YAML structure.
fn kubeconfig(cluster: &str, server: &str, ca: &[u8], user: &str, cert: &[u8], key: &[u8]) -> String {
    use base64::Engine as _;
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: {cluster}\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\n\
         users:\n- name: {user}\n  user:\n    client-certificate-data: {cert}\n    client-key-data: {key}\n\
         contexts:\n- name: {cluster}\n  context:\n    cluster: {cluster}\n    user: {user}\ncurrent-context: {cluster}\n",
        ca = b64(ca),
        cert = b64(cert),
        key = b64(key),
    )
}

fn refused(part: &str, why: &str) -> Error {
    Error::Failed { what: format!("publishing the bubble's {part}"), detail: format!("refused: {why}") }
}

enum Part {
    Missing,
    Refused(String),
}

fn open_dir(path: &Path) -> nix::Result<OwnedFd> {
    let fd = nix::fcntl::open(
        path,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    Ok(fd)
}

/// The whole of `name` in `dir`: a regular file (not a link, FIFO or device: the bubble owns
/// the directory) of at most [`MAX_PART`] bytes.
fn read_part(dir: &OwnedFd, name: &str) -> std::result::Result<Vec<u8>, Part> {
    let fd = openat(
        dir.as_fd(),
        name,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC | OFlag::O_NOCTTY,
        Mode::empty(),
    )
    .map_err(|e| match e {
        nix::errno::Errno::ENOENT => Part::Missing,
        nix::errno::Errno::ELOOP => Part::Refused("a symbolic link".into()),
        e => Part::Refused(format!("cannot open it: {e}")),
    })?;
    let stat = fstat(&fd).map_err(|e| Part::Refused(format!("cannot stat it: {e}")))?;
    if SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
        return Err(Part::Refused("not a regular file".into()));
    }
    if stat.st_size as u64 > MAX_PART {
        return Err(Part::Refused(format!("{} bytes, more than {MAX_PART}", stat.st_size)));
    }
    let mut bytes = Vec::new();
    std::fs::File::from(fd)
        .take(MAX_PART + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Part::Refused(format!("cannot read it: {e}")))?;
    if bytes.len() as u64 > MAX_PART {
        return Err(Part::Refused(format!("more than {MAX_PART} bytes")));
    }
    Ok(bytes)
}

/// Checks that `bytes` is exactly one PEM block of one of `labels`, whose body is base64 of a
/// DER SEQUENCE, with nothing but whitespace around it.
fn pem_block(part: &str, bytes: &[u8], labels: &[&str]) -> Result<()> {
    use base64::Engine as _;
    let bad = |why: &str| refused(part, why);
    let text = std::str::from_utf8(bytes).map_err(|_| bad("not text"))?.trim();
    let rest = text.strip_prefix("-----BEGIN ").ok_or_else(|| bad("not a PEM block"))?;
    let (label, rest) = rest.split_once("-----").ok_or_else(|| bad("not a PEM block"))?;
    if !labels.contains(&label) {
        return Err(bad(&format!("a PEM {label:?}, expected {}", labels.join(" or "))));
    }
    let body = rest
        .strip_suffix(&format!("-----END {label}-----"))
        .ok_or_else(|| bad("not one PEM block (its END line is not the last)"))?;
    if body.contains("-----") {
        return Err(bad("more than one PEM block"));
    }
    let der: String = body.split_whitespace().collect();
    let der =
        base64::engine::general_purpose::STANDARD.decode(der).map_err(|_| bad("its body is not base64"))?;
    if der.first() != Some(&0x30) {
        return Err(bad("its body is not DER"));
    }
    Ok(())
}

#[cfg(test)]
#[path = "publish_tests.rs"]
mod tests;
