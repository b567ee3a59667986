//! The OCI runtime configuration of a bubble (`config.json`): a rootless container with its own
//! user, PID, mount, network, IPC and UTS namespaces, the image's root filesystem read-only, and
//! what the services inside need to run containers of their own (measured in
//! ../shared/notes/crun-in-bubbles.md): all capabilities of its user namespace, no masked or
//! read-only paths, a fresh sysfs with the host's cgroup hierarchy bound back under it, the TUN
//! device, and writable `/run`, `/tmp` and node directory.

use std::path::Path;

use serde_json::{Value, json};

/// Where the node directory appears inside the bubble.
pub const NODE_DIR: &str = "/var/lib/hpk";
/// Where the cluster's shared directory appears inside the bubble.
pub const SHARED_DIR: &str = "/hpk/shared";
/// Where the node's local storage for pods (hostPath and local PersistentVolumes) is mounted:
/// the node directory's `volumes/`, apart from the node directory itself, which pods may not
/// reach (the kubelet refuses hostPath under it, review H5).
pub const LOCAL_VOLUMES_DIR: &str = "/var/local/hpk";

/// One ID mapping (container ID → host ID, count).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdMap {
    /// First ID inside.
    pub inside: u32,
    /// First ID on the host.
    pub outside: u32,
    /// How many.
    pub count: u32,
}

/// What varies between bubbles.
pub struct BubbleSpec<'a> {
    /// The unpacked image.
    pub rootfs: &'a Path,
    /// The bubble's hostname (the node name).
    pub hostname: &'a str,
    /// The command run as the bubble's first process.
    pub args: Vec<String>,
    /// Its environment (`KEY=value`).
    pub env: Vec<String>,
    /// The node directory (mounted at [`NODE_DIR`]).
    pub node_dir: &'a Path,
    /// The read-only view of the shared directory (mounted at [`SHARED_DIR`], read-only).
    pub shared_dir: &'a Path,
    /// The host's TUN device.
    pub tun: &'a Path,
    /// User and group mappings.
    pub uid_map: Vec<IdMap>,
    /// Group mappings.
    pub gid_map: Vec<IdMap>,
    /// The user's paths: (the launcher's view of the host path, where the bubble sees it,
    /// read-only).
    pub binds: Vec<(std::path::PathBuf, std::path::PathBuf, bool)>,
    /// The GPUs' device nodes and driver files ([`super::gpus`]).
    pub gpus: Vec<super::gpus::GpuBind>,
}

/// The ID mappings for a bubble started by `uid`/`gid`: the user is root inside; with a
/// subordinate range (`/etc/subuid`, `/etc/subgid`, used through newuidmap) IDs 1–65535 map
/// into it, so pods can run as other users. Without one, only root exists inside.
pub fn id_maps(
    uid: u32,
    gid: u32,
    sub_uids: Option<(u32, u32)>,
    sub_gids: Option<(u32, u32)>,
) -> (Vec<IdMap>, Vec<IdMap>) {
    let build = |id: u32, sub: Option<(u32, u32)>| {
        let mut maps = vec![IdMap { inside: 0, outside: id, count: 1 }];
        if let Some((start, count)) = sub {
            maps.push(IdMap { inside: 1, outside: start, count: count.min(65535) });
        }
        maps
    };
    (build(uid, sub_uids), build(gid, sub_gids))
}

/// The first subordinate range of `user` (name or numeric ID) in `file` (`/etc/subuid` format).
pub fn subordinate_range(file: &str, user: &str, id: u32) -> Option<(u32, u32)> {
    let text = std::fs::read_to_string(file).ok()?;
    text.lines().find_map(|line| {
        let mut parts = line.trim().split(':');
        let (who, start, count) = (parts.next()?, parts.next()?, parts.next()?);
        if who != user && who != id.to_string() {
            return None;
        }
        let (start, count) = (start.parse().ok()?, count.parse::<u32>().ok()?);
        (count > 0).then_some((start, count))
    })
}

/// The `config.json` for `spec`.
pub fn config(spec: &BubbleSpec<'_>) -> Value {
    let mut config = base_config(spec);
    if let Some(mounts) = config.pointer_mut("/mounts").and_then(Value::as_array_mut) {
        for (view, dest, readonly) in &spec.binds {
            let mut options = vec!["rbind", "nosuid", "nodev"];
            if *readonly {
                options.push("ro");
            }
            mounts.push(json!({"destination": dest, "type": "bind", "source": view, "options": options}));
        }
    }
    // GPUs: device nodes bound as they are (a device node needs a mount without nodev),
    // driver files read-only.
    if let Some(mounts) = config.pointer_mut("/mounts").and_then(Value::as_array_mut) {
        for gpu in &spec.gpus {
            let options: &[&str] = if gpu.device { &["bind"] } else { &["bind", "nosuid", "nodev", "ro"] };
            mounts.push(
                json!({"destination": gpu.dest, "type": "bind", "source": gpu.source, "options": options}),
            );
        }
    }
    // A TUN device elsewhere than /dev/net/tun (tests) is bound in place of the device node.
    if spec.tun != Path::new("/dev/net/tun")
        && let Some(mounts) = config.pointer_mut("/mounts").and_then(Value::as_array_mut)
    {
        mounts.push(
            json!({"destination": "/dev/net/tun", "type": "bind", "source": spec.tun, "options": ["bind"]}),
        );
    }
    config
}

/// The hard limit on open files of this process: the bubble's services hold a descriptor per
/// connection, so they get all the job allows.
fn nofile_hard() -> u64 {
    nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).map_or(1024, |(_, hard)| hard)
}

fn base_config(spec: &BubbleSpec<'_>) -> Value {
    let caps: Vec<&str> = hpk_oci::ALL_CAPS.to_vec();
    let maps = |m: &[IdMap]| {
        m.iter()
            .map(|m| json!({"containerID": m.inside, "hostID": m.outside, "size": m.count}))
            .collect::<Vec<_>>()
    };
    let bind = |source: &Path, dest: &str, ro: bool| {
        let mut options = vec!["rbind", "nosuid", "nodev"];
        if ro {
            options.push("ro");
        }
        json!({"destination": dest, "type": "bind", "source": source, "options": options})
    };
    let device = |path: &str, major: u32, minor: u32| json!({"path": path, "type": "c", "major": major, "minor": minor, "fileMode": 0o666, "uid": 0, "gid": 0});
    json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": {"uid": 0, "gid": 0},
            "args": spec.args,
            "env": spec.env,
            "cwd": "/",
            "capabilities": {
                "bounding": caps, "effective": caps, "permitted": caps, "inheritable": caps, "ambient": caps
            },
            // The launcher raised its soft limit to the hard one; the bubble starts with both.
            "rlimits": [{"type": "RLIMIT_NOFILE", "soft": nofile_hard(), "hard": nofile_hard()}],
            "noNewPrivileges": false
        },
        "root": {"path": spec.rootfs, "readonly": true},
        "hostname": spec.hostname,
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
            {"destination": "/dev/pts", "type": "devpts", "source": "devpts", "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]},
            {"destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]},
            {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": ["nosuid", "noexec", "nodev"]},
            {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev"]},
            bind(Path::new("/sys/fs/cgroup"), "/sys/fs/cgroup", false),
            {"destination": "/run", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "mode=755"]},
            {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "mode=1777"]},
            {"destination": "/var/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "mode=1777"]},
            bind(spec.node_dir, NODE_DIR, false),
            bind(&spec.node_dir.join("volumes"), LOCAL_VOLUMES_DIR, false),
            // Read-only, and locked so (see bubble::bind_shared_read_only); the launcher
            // publishes what the bubble has to share (bubble::publish).
            bind(spec.shared_dir, SHARED_DIR, true),
            bind(&spec.node_dir.join("etc/resolv.conf"), "/etc/resolv.conf", true),
            bind(&spec.node_dir.join("etc/hosts"), "/etc/hosts", true),
            bind(&spec.node_dir.join("etc/machine-id"), "/etc/machine-id", true),
        ],
        "linux": {
            "namespaces": [
                {"type": "user"}, {"type": "pid"}, {"type": "mount"},
                {"type": "network"}, {"type": "ipc"}, {"type": "uts"}
            ],
            "uidMappings": maps(&spec.uid_map),
            "gidMappings": maps(&spec.gid_map),
            "devices": [
                device("/dev/null", 1, 3), device("/dev/zero", 1, 5), device("/dev/full", 1, 7),
                device("/dev/random", 1, 8), device("/dev/urandom", 1, 9), device("/dev/tty", 5, 0),
                {"path": "/dev/net/tun", "type": "c", "major": 10, "minor": 200, "fileMode": 0o666, "uid": 0, "gid": 0},
            ],
            "maskedPaths": [],
            "readonlyPaths": []
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_maps_to_the_user_and_subordinate_ids_follow() {
        let (uids, gids) = id_maps(1000, 1000, Some((100_000, 65_536)), None);
        assert_eq!(
            uids,
            vec![
                IdMap { inside: 0, outside: 1000, count: 1 },
                IdMap { inside: 1, outside: 100_000, count: 65_535 }
            ]
        );
        assert_eq!(gids, vec![IdMap { inside: 0, outside: 1000, count: 1 }]);
    }

    #[test]
    fn subordinate_ranges_are_found_by_name_or_id() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("subuid");
        std::fs::write(&file, "alice:100000:65536\n1001:200000:10\nbob:300000:0\n").expect("write");
        let f = file.to_str().expect("utf-8");
        assert_eq!(subordinate_range(f, "alice", 1000), Some((100_000, 65_536)));
        assert_eq!(subordinate_range(f, "carol", 1001), Some((200_000, 10)));
        assert_eq!(subordinate_range(f, "bob", 1002), None, "an empty range is no range");
        assert_eq!(subordinate_range("/nonexistent", "alice", 1000), None);
    }

    #[test]
    fn the_root_filesystem_is_read_only_and_nothing_is_masked() {
        let spec = BubbleSpec {
            binds: Vec::new(),
            gpus: Vec::new(),
            rootfs: Path::new("/images/x/rootfs"),
            hostname: "hpk-1",
            args: vec!["/usr/local/bin/hpk".into(), "bubble-init".into()],
            env: vec!["PATH=/usr/bin".into()],
            node_dir: Path::new("/tmp/hpk-0/c/hpk-1"),
            shared_dir: Path::new("/root/.hpk/c"),
            tun: Path::new("/dev/net/tun"),
            uid_map: vec![IdMap { inside: 0, outside: 0, count: 1 }],
            gid_map: vec![IdMap { inside: 0, outside: 0, count: 1 }],
        };
        let c = config(&spec);
        assert_eq!(c["root"]["readonly"], true);
        assert_eq!(c["hostname"], "hpk-1");
        assert_eq!(c["linux"]["maskedPaths"], json!([]));
        assert_eq!(c["linux"]["namespaces"].as_array().map(Vec::len), Some(6));
        let dests: Vec<&str> = c["mounts"]
            .as_array()
            .expect("mounts")
            .iter()
            .filter_map(|m| m["destination"].as_str())
            .collect();
        for d in ["/proc", "/sys", "/sys/fs/cgroup", "/run", NODE_DIR, SHARED_DIR, "/etc/resolv.conf"] {
            assert!(dests.contains(&d), "{d} missing from {dests:?}");
        }
        assert!(!dests.contains(&"/dev/net/tun"), "the real device comes through linux.devices");
        // The bubble starts with all the open files the launcher may have (review H2).
        let hard =
            nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).expect("getrlimit").1;
        assert_eq!(c["process"]["rlimits"], json!([{"type": "RLIMIT_NOFILE", "soft": hard, "hard": hard}]));
    }
}
