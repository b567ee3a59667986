//! OCI runtime specs (config.json) for sandboxes and containers.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::{Error, Result};

/// Where the pause binary and the events socket appear inside a sandbox.
pub const PAUSE_PATH: &str = "/hpk-pause";
/// The directory holding the sandbox's events socket, inside the sandbox.
pub const EVENTS_DIR: &str = "/run/hpk";

/// The capabilities pod containers get by default, as containerd and CRI-O grant them.
const DEFAULT_CAPS: &[&str] = &[
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
];

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
    /// Bind mounts: host path, container path, read-only.
    pub mounts: Vec<(PathBuf, String, bool)>,
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
        let config = json!({
            "ociVersion": "1.0.2",
            "process": {
                "terminal": false,
                "user": {"uid": 0, "gid": 0},
                "args": [PAUSE_PATH, "--events", format!("{EVENTS_DIR}/events.sock"), "--grace", self.grace_seconds.to_string()],
                "env": ["PATH=/"],
                "cwd": "/",
                "noNewPrivileges": true,
                "capabilities": caps(&["CAP_KILL"]),
            },
            "root": {"path": "rootfs", "readonly": true},
            "hostname": self.hostname,
            "mounts": mounts,
            "linux": {
                "namespaces": [{"type": "pid"}, {"type": "network"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}],
                "maskedPaths": masked_paths(),
                "readonlyPaths": readonly_paths(),
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
        let mut mounts = vec![
            json!({"destination": "/proc", "type": "proc", "source": "proc"}),
            json!({"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]}),
            json!({"destination": "/dev/pts", "type": "devpts", "source": "devpts", "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]}),
            json!({"destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]}),
            json!({"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": ["nosuid", "noexec", "nodev"]}),
            json!({"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]}),
        ];
        mounts.extend(self.mounts.iter().map(|(host, dest, ro)| bind(host, dest, *ro)));
        let config = json!({
            "ociVersion": "1.0.2",
            "process": {
                "terminal": self.terminal,
                "user": {"uid": self.uid, "gid": self.gid},
                "args": self.args,
                "env": self.env,
                "cwd": self.cwd,
                "capabilities": caps(DEFAULT_CAPS),
                "noNewPrivileges": false,
            },
            "root": {"path": self.rootfs, "readonly": self.readonly_rootfs},
            "mounts": mounts,
            "linux": {
                "namespaces": [{"type": "mount"}, ns("network", "net"), ns("ipc", "ipc"), ns("uts", "uts"), ns("pid", "pid")],
                "maskedPaths": masked_paths(),
                "readonlyPaths": readonly_paths(),
            },
        });
        write_config(bundle, &config)
    }
}

fn caps(list: &[&str]) -> Value {
    json!({"bounding": list, "effective": list, "permitted": list})
}

fn bind(host: &Path, dest: &str, readonly: bool) -> Value {
    let mut options = vec!["rbind", "rprivate"];
    if readonly {
        options.push("ro");
    }
    json!({"destination": dest, "type": "bind", "source": host, "options": options})
}

fn masked_paths() -> Value {
    json!([
        "/proc/acpi",
        "/proc/kcore",
        "/proc/keys",
        "/proc/latency_stats",
        "/proc/timer_list",
        "/proc/timer_stats",
        "/proc/sched_debug",
        "/sys/firmware",
        "/proc/scsi"
    ])
}

fn readonly_paths() -> Value {
    json!(["/proc/asound", "/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"])
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
            mounts: vec![(tmp.path().join("vol"), "/data".into(), true)],
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
        assert_eq!(config["process"]["user"], json!({"uid": 1000, "gid": 1000}));
        assert_eq!(config["root"]["readonly"], json!(true));
        let data = config["mounts"]
            .as_array()
            .expect("mounts")
            .iter()
            .find(|m| m["destination"] == "/data")
            .expect("/data");
        assert!(data["options"].as_array().expect("options").contains(&json!("ro")));
    }

    #[test]
    fn ids_cannot_escape_directories() {
        for bad in ["", "..", "../x", "a/b", ".hidden", "a b"] {
            assert!(check_id(bad).is_err(), "{bad:?}");
        }
        check_id("pod-1_c.2").expect("fine");
    }
}
