//! Where a cluster's files live.
//!
//! - The **shared directory** `~/.hpk/<cluster>/` (`$HPK_HOME` instead of `~/.hpk`): what users
//!   and the other bubbles read — `kubeconfig`, a link to the user's admin kubeconfig
//!   `~/.hpk/<cluster>.kubeconfig` (0600, beside the directory: no bubble sees it), `ca.crt` (public), the
//!   endpoint files (`apiserver`, `cert-signer`: URLs) and `nodes/<node>.json` (each bubble's
//!   published ports and its launcher's PID). On a Slurm cluster this is the NFS home; no
//!   secret of the nodes' (a node token, the key they are made from, a private key) is ever
//!   written here: the cluster's node-token key reaches each launcher in its environment
//!   ([`NODE_TOKEN_KEY_ENV`]); a launcher leaves its node's own token in its node directory,
//!   and only the controller's launcher leaves the key there, for the cert-signer.
//! - The **node directory** `$HPK_STATE_DIR/<cluster>/<node>/` (default: the Slurm job's
//!   `$TMPDIR/hpk`, `/tmp/hpk-<uid>`, or `$XDG_RUNTIME_DIR/hpk`; node-local, 0700): the node's token, the bubble's bundle and crun state, the controller's CA keys and etcd
//!   data, the runtime's and kubelet's state, the logs. Removed when the bubble stops.
//! - The **image cache** `$HPK_STATE_DIR/images/`: unpacked root filesystems, shared by the
//!   bubbles of this machine, one per image manifest, each trusted only with this user's stamp
//!   and collected once no bubble holds it (`image::cache`).

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The default cluster name.
pub const DEFAULT_NAME: &str = "hpk";

/// A cluster's shared directory.
#[derive(Debug, Clone)]
pub struct Shared {
    /// The cluster's name.
    pub name: String,
    /// `~/.hpk/<name>`.
    pub dir: PathBuf,
}

impl Shared {
    /// The shared directory of cluster `name`; the name must be a DNS label (it prefixes node
    /// names).
    pub fn new(name: &str) -> Result<Self> {
        check_label(name, "cluster name")?;
        Ok(Self { name: name.to_owned(), dir: hpk_home()?.join(name) })
    }

    /// The admin kubeconfig as users name it: a symbolic link to [`Shared::kubeconfig_file`].
    /// Bubbles see the shared directory, and the link in it, but not what it points to.
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.join("kubeconfig")
    }

    /// The admin kubeconfig itself (0600), beside the shared directory and not in it: no
    /// bubble mounts it, so a pod that broke out into its bubble cannot read the user's
    /// credential (review M4, H5). `~/.hpk/<name>.kubeconfig`.
    pub fn kubeconfig_file(&self) -> PathBuf {
        let mut name = self.dir.file_name().unwrap_or_default().to_os_string();
        name.push(".kubeconfig");
        self.dir.with_file_name(name)
    }

    /// Removes the shared directory and the kubeconfig beside it; what is already gone is no
    /// error.
    pub fn remove(&self) -> Result<()> {
        match std::fs::remove_file(self.kubeconfig_file()) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io("remove", self.kubeconfig_file().display(), e)),
        }
        match std::fs::remove_dir_all(&self.dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io("remove", self.dir.display(), e)),
        }
    }

    /// The server CA's certificate: pins the API server, the cert-signer and kubelets.
    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// The API server's URL as every bubble and the user reach it.
    pub fn apiserver_url(&self) -> PathBuf {
        self.dir.join("apiserver")
    }

    /// The cert-signer's URL.
    pub fn signer_url(&self) -> PathBuf {
        self.dir.join("cert-signer")
    }

    /// Node endpoint files.
    pub fn nodes_dir(&self) -> PathBuf {
        self.dir.join("nodes")
    }

    /// The endpoint file of `node`.
    pub fn node_file(&self, node: &str) -> PathBuf {
        self.nodes_dir().join(format!("{node}.json"))
    }

    /// Every node's endpoint record, sorted by name; unreadable files are reported.
    pub fn nodes(&self) -> Vec<std::result::Result<NodeRecord, String>> {
        let Ok(entries) = std::fs::read_dir(self.nodes_dir()) else { return Vec::new() };
        let mut paths: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        paths.sort();
        paths
            .into_iter()
            .map(|p| {
                std::fs::read(&p)
                    .map_err(|e| e.to_string())
                    .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
                    .map_err(|e| format!("{}: {e}", p.display()))
            })
            .collect()
    }
}

/// What a bubble publishes about itself in `nodes/<node>.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeRecord {
    /// The node's name.
    pub node: String,
    /// `controller` or `worker`.
    pub role: String,
    /// The host address every published port is bound on.
    pub address: Ipv4Addr,
    /// The launcher's PID (on `host`).
    pub launcher_pid: u32,
    /// The host the launcher runs on.
    pub host: String,
    /// The node directory on that host.
    pub state_dir: PathBuf,
    /// The unpacked bubble image on that host, whose crun runs the bubble (`hpk shell`, the
    /// clean-up of `hpk down`); absent in records of older launchers.
    #[serde(default)]
    pub rootfs: Option<PathBuf>,
    /// Published ports: `kubelet`, `tunnel` (UDP), and on the controller `apiserver`,
    /// `cert-signer`.
    pub ports: Vec<(String, u16)>,
}

impl NodeRecord {
    /// The published port named `name`.
    pub fn port(&self, name: &str) -> Option<u16> {
        self.ports.iter().find(|(n, _)| n == name).map(|(_, p)| *p)
    }
}

/// `$HPK_HOME`, else `~/.hpk`.
pub fn hpk_home() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("HPK_HOME") {
        return Ok(PathBuf::from(dir));
    }
    let home = std::env::var_os("HOME").ok_or_else(|| Error::Prerequisite {
        what: "HOME is not set".into(),
        fix: "set HOME, or HPK_HOME to the directory for cluster files".into(),
    })?;
    Ok(PathBuf::from(home).join(".hpk"))
}

/// `$HPK_STATE_DIR`, else the one [`crate::preflight::statefs::choose_base`] chooses (the
/// Slurm job's `$TMPDIR/hpk`, `/tmp/hpk-<uid>`, or `$XDG_RUNTIME_DIR/hpk` when another user
/// holds that): node-local state. Chosen once per process, before it enters a user namespace.
pub fn state_base() -> PathBuf {
    if let Some(dir) = std::env::var_os("HPK_STATE_DIR") {
        return PathBuf::from(dir);
    }
    static CHOSEN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    CHOSEN
        .get_or_init(|| {
            let candidates = crate::preflight::statefs::BaseCandidates::from_env(host_uid());
            crate::preflight::statefs::choose_base(&candidates)
        })
        .clone()
}

/// This user's UID as the host knows it: taken at the first call, which the launcher makes
/// before it enters a user namespace of its own (where it is 0).
pub fn host_uid() -> u32 {
    static UID: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *UID.get_or_init(|| nix::unistd::getuid().as_raw())
}

/// The node directory of `node` in cluster `cluster`.
pub fn node_dir(cluster: &str, node: &str) -> PathBuf {
    state_base().join(cluster).join(node)
}

/// The image cache.
pub fn image_cache() -> PathBuf {
    state_base().join("images")
}

/// Fails unless `value` is a DNS-1123 label (lower case, digits, '-', ≤ 63).
pub fn check_label(value: &str, what: &str) -> Result<()> {
    let ok = !value.is_empty()
        && value.len() <= 63
        && value.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !value.starts_with('-')
        && !value.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "{what} {value:?} must be a DNS label: lower-case letters, digits and '-', at most 63"
        )))
    }
}

/// The environment variable that hands the cluster's node-token key to each launcher. `hpk up`
/// and `hpk slurm job` set it for the launchers they start (Slurm carries a step's environment
/// to its nodes over its own authenticated channel). A launcher writes its node's own token
/// ([`NODE_TOKEN_FILE`], made from the key) into its node-local node directory; only the
/// controller's launcher also writes the key ([`NODE_TOKEN_KEY_FILE`]), for the cert-signer.
/// So a token taken from a worker's bubble obtains certificates for that node only (review
/// H3). Nothing of it is written to the shared directory (review M4), and the launcher's own
/// host-side programs do not inherit it.
pub const NODE_TOKEN_KEY_ENV: &str = "HPK_NODE_TOKEN_KEY";

/// A node's token in its node directory (0600), where the bubble's services read it.
pub const NODE_TOKEN_FILE: &str = "node-token";

/// The cluster's node-token key in the controller's node directory (0600), for the cert-signer.
pub const NODE_TOKEN_KEY_FILE: &str = "node-token-key";

/// A new node-token key: 32 random bytes in hexadecimal.
pub fn new_node_token_key() -> Result<String> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)
        .map_err(|e| Error::io("generate", "the node-token key", std::io::Error::other(e.to_string())))?;
    Ok(hex::encode(bytes))
}

/// The node-token key a launcher was given in [`NODE_TOKEN_KEY_ENV`] (`value`): 64 hexadecimal
/// digits.
pub fn parse_node_token_key(value: Option<std::ffi::OsString>) -> Result<String> {
    let value = value.ok_or_else(|| {
        Error::Invalid(format!(
            "{NODE_TOKEN_KEY_ENV} is not set: a controller or worker bubble needs the cluster's node-token key, which `hpk up` and `hpk slurm job` hand to the launchers they start"
        ))
    })?;
    match value.into_string() {
        Ok(key) if hpk_rpc::node_token::well_formed(key.as_bytes()) => Ok(key),
        _ => Err(Error::Invalid(format!(
            "{NODE_TOKEN_KEY_ENV} is not a node-token key (64 hexadecimal digits)"
        ))),
    }
}

/// Node `node`'s token under the cluster's `key`: what the cert-signer expects of it.
pub fn node_token(key: &str, node: &str) -> String {
    hpk_rpc::node_token::derive(key.as_bytes(), node)
}

/// Writes `contents` to `path` atomically (a temporary file renamed over it) with `mode`.
pub fn write_file(path: &Path, contents: &[u8], mode: u32) -> Result<()> {
    Ok(hpk_cluster::files::write_file(path, contents, mode)?)
}

/// Makes `path` a symbolic link to `target` atomically (a link made beside it, renamed over
/// whatever was there).
pub fn write_link(path: &Path, target: &Path) -> Result<()> {
    let tmp = path.with_extension(format!("link{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp).map_err(|e| Error::io("link", tmp.display(), e))?;
    std::fs::rename(&tmp, path).map_err(|e| Error::io("rename", path.display(), e))
}

/// A cluster's lifetime when nothing bounds it (`hpk up`): certificates are made for this.
pub const DEFAULT_LIFETIME: std::time::Duration = std::time::Duration::from_secs(30 * 86_400);

/// Parses a lifetime: `<number><unit>`, unit s, m, h or d (`90m`, `12h`, `30d`).
pub fn parse_lifetime(text: &str) -> std::result::Result<std::time::Duration, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let n: u64 = number.parse().map_err(|_| format!("{text:?}: expected a number and a unit, e.g. 12h"))?;
    let scale = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("{text:?}: the unit must be s, m, h or d")),
    };
    match n.checked_mul(scale) {
        Some(0) => Err(format!("{text:?}: a lifetime must be longer than nothing")),
        Some(secs) if secs <= 10 * 365 * 86_400 => Ok(std::time::Duration::from_secs(secs)),
        _ => Err(format!("{text:?}: longer than ten years")),
    }
}

/// The time a Slurm job has left, from squeue's `%L` (`[days-]hours:minutes:seconds`,
/// `minutes:seconds`); `None` for UNLIMITED, NOT_SET and anything unreadable.
pub fn parse_slurm_time_left(text: &str) -> Option<std::time::Duration> {
    let text = text.trim();
    let (days, rest) = match text.split_once('-') {
        Some((d, rest)) => (d.parse::<u64>().ok()?, rest),
        None => (0, text),
    };
    let parts: Vec<u64> = rest.split(':').map(str::parse).collect::<std::result::Result<_, _>>().ok()?;
    let (h, m, s) = match parts[..] {
        [h, m, s] => (h, m, s),
        [m, s] if days == 0 => (0, m, s),
        _ => return None,
    };
    Some(std::time::Duration::from_secs(((days * 24 + h) * 60 + m) * 60 + s))
}

#[cfg(test)]
mod lifetime_tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn lifetimes_parse_with_a_unit_and_nothing_else() {
        assert_eq!(parse_lifetime("90m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_lifetime("30d"), Ok(Duration::from_secs(30 * 86_400)));
        for bad in ["", "12", "h", "0s", "12x", "-1h", "99999d"] {
            assert!(parse_lifetime(bad).is_err(), "{bad:?} was accepted");
        }
    }

    /// Review L17: a secret is written into a new file made with its final mode (never into
    /// one that was there, whatever its mode or wherever a link there points), then renamed
    /// over the old one.
    #[test]
    fn secrets_are_written_with_their_final_mode_never_through_what_was_there() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("node-token");
        let staging = path.with_extension(format!("tmp{}", std::process::id()));
        let mode = |p: &Path| std::fs::symlink_metadata(p).expect("stat").permissions().mode() & 0o777;
        // What a killed run left at the staging name: a file anyone may read, then a link to a
        // file of the user's elsewhere.
        std::fs::write(&staging, "left").expect("write");
        std::fs::set_permissions(&staging, std::fs::Permissions::from_mode(0o666)).expect("chmod");
        write_file(&path, b"secret-1", 0o600).expect("write over a left file");
        assert_eq!((std::fs::read(&path).expect("read"), mode(&path)), (b"secret-1".to_vec(), 0o600));
        let elsewhere = dir.path().join("elsewhere");
        std::fs::write(&elsewhere, "mine").expect("write");
        std::os::unix::fs::symlink(&elsewhere, &staging).expect("symlink");
        write_file(&path, b"secret-2", 0o600).expect("write over a left link");
        assert_eq!(std::fs::read_to_string(&elsewhere).expect("read"), "mine", "written through the link");
        assert_eq!((std::fs::read(&path).expect("read"), mode(&path)), (b"secret-2".to_vec(), 0o600));
        // An existing file of a wider mode is replaced, not rewritten in place.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        write_file(&path, b"secret-3", 0o600).expect("replace");
        assert_eq!(mode(&path), 0o600);
        assert!(!staging.exists() && std::fs::symlink_metadata(&staging).is_err(), "nothing left staged");
    }

    #[test]
    fn node_token_keys_are_made_random_and_read_only_whole() {
        let (a, b) = (new_node_token_key().expect("key"), new_node_token_key().expect("key"));
        assert_ne!(a, b);
        assert_eq!(parse_node_token_key(Some(a.clone().into())).expect("a made key"), a);
        let err = parse_node_token_key(None).expect_err("unset").to_string();
        assert!(err.contains(NODE_TOKEN_KEY_ENV) && err.contains("hpk up"), "{err}");
        for bad in ["", "abc", &format!("{a}0"), &format!("{}g", &a[..63]), &format!("{a}\n")] {
            assert!(parse_node_token_key(Some(bad.into())).is_err(), "{bad:?} was taken");
        }
        // Each node's token is its own, and none is the key.
        assert_ne!(node_token(&a, "n1"), node_token(&a, "n2"));
        assert_ne!(node_token(&a, "n1"), node_token(&b, "n1"));
        assert_ne!(node_token(&a, "n1"), a);
    }

    #[test]
    fn slurm_time_left_reads_every_form_squeue_prints() {
        assert_eq!(parse_slurm_time_left("1-02:03:04"), Some(Duration::from_secs(93_784)));
        assert_eq!(parse_slurm_time_left("02:03:04"), Some(Duration::from_secs(7384)));
        assert_eq!(parse_slurm_time_left("03:04"), Some(Duration::from_secs(184)));
        for none in ["UNLIMITED", "NOT_SET", "INVALID", ""] {
            assert_eq!(parse_slurm_time_left(none), None, "{none:?}");
        }
    }
}
