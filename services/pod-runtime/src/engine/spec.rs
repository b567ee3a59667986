//! OCI runtime specs (config.json) for sandboxes and containers.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::{Error, Result};
use hpk_oci::{DEFAULT_CAPS, DEFAULT_MASKED, DEFAULT_READONLY};

/// Where the pause binary and the events socket appear inside a sandbox.
pub const PAUSE_PATH: &str = "/hpk-pause";
/// The directory holding the sandbox's events socket, inside the sandbox.
pub const EVENTS_DIR: &str = "/run/hpk";

/// Who a container's process runs as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct User {
    /// Its user ID.
    pub uid: u32,
    /// Its primary group ID.
    pub gid: u32,
    /// Its supplementary group IDs.
    pub additional_gids: Vec<u32>,
}

/// A sandbox: hpk-pause in new PID, network, IPC, UTS and mount namespaces.
#[derive(Clone, Debug)]
pub struct SandboxSpec {
    /// Container ID for crun.
    pub id: String,
    /// The pod's hostname.
    pub hostname: String,
    /// The hpk-pause binary on the host, bind-mounted read-only.
    pub pause_binary: PathBuf,
    /// Host directory for the events socket, bind-mounted at [`EVENTS_DIR`].
    pub events_dir: PathBuf,
    /// Seconds the pause gives processes after SIGTERM.
    pub grace_seconds: u32,
    /// Share the host's network namespace (hostNetwork) instead of a new one.
    pub host_network: bool,
    /// Share the host's IPC namespace (hostIPC) instead of a new one.
    pub host_ipc: bool,
    /// Namespaced sysctls set in the sandbox's namespaces, as `name → value`.
    pub sysctls: std::collections::BTreeMap<String, String>,
}

/// How a bind mount sees mounts made later under its source (CRI `MountPropagation`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Propagation {
    /// Neither way (`rprivate`).
    #[default]
    Private,
    /// Host to container (`rslave`).
    HostToContainer,
    /// Both ways (`rshared`).
    Bidirectional,
}

/// A bind mount into a container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mount {
    /// The host path.
    pub host: PathBuf,
    /// Where it appears in the container.
    pub dest: String,
    /// Read-only.
    pub readonly: bool,
    /// Propagation of later mounts.
    pub propagation: Propagation,
}

/// A container's privileges: what the CRI security context asked for, resolved.
#[derive(Clone, Debug, PartialEq)]
pub struct Security {
    /// Capabilities (bounding, effective, permitted), `CAP_` names.
    pub capabilities: Vec<String>,
    /// `no_new_privs` for the process.
    pub no_new_privileges: bool,
    /// Paths masked in /proc and /sys.
    pub masked_paths: Vec<String>,
    /// Paths made read-only.
    pub readonly_paths: Vec<String>,
    /// Privileged: /sys writable (and, by the caller, every capability, nothing masked).
    pub privileged: bool,
    /// An OCI `linux.seccomp` object, when a profile applies.
    pub seccomp: Option<Value>,
}

impl Default for Security {
    fn default() -> Self {
        Self {
            capabilities: DEFAULT_CAPS.iter().map(|c| (*c).to_owned()).collect(),
            no_new_privileges: false,
            masked_paths: DEFAULT_MASKED.iter().map(|p| (*p).to_owned()).collect(),
            readonly_paths: DEFAULT_READONLY.iter().map(|p| (*p).to_owned()).collect(),
            privileged: false,
            seccomp: None,
        }
    }
}

/// A pod container joining a sandbox.
#[derive(Clone, Debug)]
pub struct ContainerSpec {
    /// Container ID for crun.
    pub id: String,
    /// The mounted root filesystem (an overlay).
    pub rootfs: PathBuf,
    /// Command and arguments.
    pub args: Vec<String>,
    /// `KEY=value` environment.
    pub env: Vec<String>,
    /// Working directory.
    pub cwd: String,
    /// User and group IDs.
    pub uid: u32,
    /// Primary group ID.
    pub gid: u32,
    /// Supplementary group IDs.
    pub additional_gids: Vec<u32>,
    /// Bind mounts.
    pub mounts: Vec<Mount>,
    /// Privileges.
    pub security: Security,
    /// A PID namespace of its own (CRI `NamespaceMode::CONTAINER`) instead of the pod's.
    pub own_pid_namespace: bool,
    /// Mount the root filesystem read-only.
    pub readonly_rootfs: bool,
    /// Whether the process gets a terminal (crun then needs a console socket).
    pub terminal: bool,
}

impl SandboxSpec {
    /// Writes the bundle (config.json and an empty rootfs) into `bundle`.
    pub fn write_bundle(&self, bundle: &Path) -> Result<()> {
        check_id(&self.id)?;
        let rootfs = bundle.join("rootfs");
        for dir in ["proc", "dev", "run/hpk", "usr"] {
            mkdir(&rootfs.join(dir))?;
        }
        // hpk-pause is a dynamically linked host binary: give it the host's libraries, read-only,
        // laid out as on a merged-/usr system (Debian 12 and later, every current distribution).
        let mut library_mounts = vec![bind(Path::new("/usr"), "/usr", true)];
        for link in ["lib", "lib64"] {
            let host = Path::new("/").join(link);
            if host.is_symlink() || !host.exists() {
                let target = rootfs.join(link);
                if !target.is_symlink() {
                    std::os::unix::fs::symlink(format!("usr/{link}"), &target)
                        .map_err(|e| Error::io("link", target, e))?;
                }
            } else {
                mkdir(&rootfs.join(link))?;
                library_mounts.push(bind(&host, &format!("/{link}"), true));
            }
        }
        std::fs::write(rootfs.join(PAUSE_PATH.trim_start_matches('/')), b"")
            .map_err(|e| Error::io("create", rootfs.join("hpk-pause"), e))?;
        let mut mounts = vec![
            json!({"destination": "/proc", "type": "proc", "source": "proc"}),
            json!({"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=64k"]}),
            bind(&self.pause_binary, PAUSE_PATH, true),
            bind(&self.events_dir, EVENTS_DIR, false),
        ];
        mounts.extend(library_mounts);
        let mut namespaces = vec![json!({"type": "pid"}), json!({"type": "uts"}), json!({"type": "mount"})];
        if !self.host_network {
            namespaces.push(json!({"type": "network"}));
        }
        if !self.host_ipc {
            namespaces.push(json!({"type": "ipc"}));
        }
        let config = json!({
            "ociVersion": "1.0.2",
            "process": {
                "terminal": false,
                "user": {"uid": 0, "gid": 0},
                "args": [PAUSE_PATH, "--events", format!("{EVENTS_DIR}/events.sock"), "--grace", self.grace_seconds.to_string()],
                "env": ["PATH=/"],
                "cwd": "/",
                "noNewPrivileges": true,
                "capabilities": caps_of(&["CAP_KILL"]),
            },
            "root": {"path": "rootfs", "readonly": true},
            "hostname": self.hostname,
            "mounts": mounts,
            "linux": {
                "namespaces": namespaces,
                "sysctl": self.sysctls,
                "maskedPaths": DEFAULT_MASKED,
                "readonlyPaths": DEFAULT_READONLY,
            },
        });
        write_config(bundle, &config)
    }
}

impl ContainerSpec {
    /// Writes config.json into `bundle`; the root filesystem is [`ContainerSpec::rootfs`].
    pub fn write_bundle(&self, bundle: &Path) -> Result<()> {
        check_id(&self.id)?;
        mkdir(bundle)?;
        // crun runs in the sandbox's PID namespace with its /proc (Crun::in_pid_namespace), where
        // the pause is PID 1.
        let ns = |kind: &str, name: &str| json!({"type": kind, "path": format!("/proc/1/ns/{name}")});
        let sys_options: &[&str] = if self.security.privileged {
            &["nosuid", "noexec", "nodev", "rw"]
        } else {
            &["nosuid", "noexec", "nodev", "ro"]
        };
        let mut mounts = vec![
            json!({"destination": "/proc", "type": "proc", "source": "proc"}),
            json!({"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]}),
            json!({"destination": "/dev/pts", "type": "devpts", "source": "devpts", "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]}),
            json!({"destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]}),
            json!({"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": ["nosuid", "noexec", "nodev"]}),
            json!({"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": sys_options}),
        ];
        mounts.extend(self.mounts.iter().map(bind_mount));
        let caps: Vec<&str> = self.security.capabilities.iter().map(String::as_str).collect();
        let pid = if self.own_pid_namespace { json!({"type": "pid"}) } else { ns("pid", "pid") };
        let mut linux = json!({
            "namespaces": [{"type": "mount"}, ns("network", "net"), ns("ipc", "ipc"), ns("uts", "uts"), pid],
            "maskedPaths": self.security.masked_paths,
            "readonlyPaths": self.security.readonly_paths,
        });
        if let Some(seccomp) = &self.security.seccomp {
            linux["seccomp"] = seccomp.clone();
        }
        // crun makes the container's whole tree private before its mounts unless told
        // otherwise, and a bind of a private mount receives nothing: a mount that asks for
        // propagation needs the tree to allow it (as containerd sets it).
        let propagations: Vec<Propagation> = self.mounts.iter().map(|m| m.propagation).collect();
        if propagations.contains(&Propagation::Bidirectional) {
            linux["rootfsPropagation"] = json!("rshared");
        } else if propagations.contains(&Propagation::HostToContainer) {
            linux["rootfsPropagation"] = json!("rslave");
        }
        let config = json!({
            "ociVersion": "1.0.2",
            "process": {
                "terminal": self.terminal,
                "user": {"uid": self.uid, "gid": self.gid, "additionalGids": self.additional_gids},
                "args": self.args,
                "env": self.env,
                "cwd": self.cwd,
                "capabilities": caps_of(&caps),
                "noNewPrivileges": self.security.no_new_privileges,
            },
            "root": {"path": self.rootfs, "readonly": self.readonly_rootfs},
            "mounts": mounts,
            "linux": linux,
        });
        write_config(bundle, &config)
    }
}

fn caps_of(list: &[&str]) -> Value {
    json!({"bounding": list, "effective": list, "permitted": list})
}

fn bind(host: &Path, dest: &str, readonly: bool) -> Value {
    bind_mount(&Mount {
        host: host.to_owned(),
        dest: dest.to_owned(),
        readonly,
        propagation: Propagation::Private,
    })
}

fn bind_mount(m: &Mount) -> Value {
    let propagation = match m.propagation {
        Propagation::Private => "rprivate",
        Propagation::HostToContainer => "rslave",
        Propagation::Bidirectional => "rshared",
    };
    let mut options = vec!["rbind", propagation];
    if m.readonly {
        options.push("ro");
    }
    json!({"destination": m.dest, "type": "bind", "source": m.host, "options": options})
}

fn mkdir(path: &Path) -> Result<()> {
    std::fs::create_dir_all(path).map_err(|e| Error::io("create", path, e))
}

fn write_config(bundle: &Path, config: &Value) -> Result<()> {
    let path = bundle.join("config.json");
    let text = serde_json::to_vec_pretty(config).map_err(|e| Error::Parse(e.to_string()))?;
    std::fs::write(&path, text).map_err(|e| Error::io("write", path, e))
}

/// Container IDs become directory names and crun IDs: no separators, no dot-dot.
pub fn check_id(id: &str) -> Result<()> {
    let ok = !id.is_empty()
        && id.len() <= 128
        && !id.starts_with('.')
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    if ok { Ok(()) } else { Err(Error::BadId(id.to_owned())) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_joins_the_pause_namespaces_and_gets_its_own_mounts() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let spec = ContainerSpec {
            id: "c1".into(),
            rootfs: tmp.path().join("rootfs"),
            args: vec!["sh".into()],
            env: vec!["A=b".into()],
            cwd: "/".into(),
            uid: 1000,
            gid: 1000,
            additional_gids: vec![5],
            mounts: vec![Mount {
                host: tmp.path().join("vol"),
                dest: "/data".into(),
                readonly: true,
                propagation: Propagation::HostToContainer,
            }],
            security: Security::default(),
            own_pid_namespace: false,
            readonly_rootfs: true,
            terminal: false,
        };
        spec.write_bundle(tmp.path()).expect("bundle");
        let config: Value =
            serde_json::from_slice(&std::fs::read(tmp.path().join("config.json")).expect("read"))
                .expect("json");
        let namespaces = config["linux"]["namespaces"].as_array().expect("namespaces");
        assert_eq!(namespaces[0], json!({"type": "mount"}));
        assert!(namespaces.contains(&json!({"type": "network", "path": "/proc/1/ns/net"})));
        assert!(namespaces.contains(&json!({"type": "pid", "path": "/proc/1/ns/pid"})));
        assert_eq!(config["process"]["user"], json!({"uid": 1000, "gid": 1000, "additionalGids": [5]}));
        assert_eq!(config["root"]["readonly"], json!(true));
        let data = config["mounts"]
            .as_array()
            .expect("mounts")
            .iter()
            .find(|m| m["destination"] == "/data")
            .expect("/data");
        assert_eq!(data["options"], json!(["rbind", "rslave", "ro"]));
        assert_eq!(config["linux"]["rootfsPropagation"], "rslave");
    }

    #[test]
    fn ids_cannot_escape_directories() {
        for bad in ["", "..", "../x", "a/b", ".hidden", "a b"] {
            assert!(check_id(bad).is_err(), "{bad:?}");
        }
        check_id("pod-1_c.2").expect("fine");
    }
}
