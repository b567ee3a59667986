//! subPath mounts against the check-then-mount race of review H4: a container sharing a volume
//! swaps a directory of a subPath for a link to `/` while the runtime mounts it. Pinning (open
//! beneath the volume without links, bind from the descriptor) must never mount the host's
//! files; resolving by path, as crun does, demonstrably would.
//!
//! The attacker exchanges `d` (a directory) and `l` (a link to `/`) with `renameat2
//! (RENAME_EXCHANGE)` in a tight loop: `d` always exists and is a link half the time, a harder
//! race than `mv d d.real; ln -s / d`, whose gaps leave `d` missing. The races run for
//! `HPK_SUB_PATH_RACE_SECS` seconds (60 by default). They need root (mounts); without it they
//! say so and pass.

mod support;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hpk_pod_runtime::engine::Error;
use hpk_pod_runtime::engine::sub_path::{open_beneath, unpin};
use hpk_pod_runtime::runtime::SUB_PATH_ROOTS;
use support::{CRICTL_TOOLS, Runtime, registry_with_shell_image, tools_present, write_json};

fn race_time() -> Duration {
    let secs = std::env::var("HPK_SUB_PATH_RACE_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(60);
    Duration::from_secs(secs)
}

fn identity(path: &Path) -> std::io::Result<(u64, u64)> {
    std::fs::metadata(path).map(|m| (m.dev(), m.ino()))
}

/// A volume `vol` holding `d/etc/marker` and `l`, a link to `/`.
struct Volume {
    _tmp: tempfile::TempDir,
    base: PathBuf,
    root: PathBuf,
    /// `d/etc`'s device and inode: the only thing a pin of `d/etc` may show.
    inside: (u64, u64),
    /// The host's `/etc`.
    host: (u64, u64),
}

impl Volume {
    fn new() -> Self {
        let tmp = tempfile::tempdir().expect("tempdir");
        let base = std::fs::canonicalize(tmp.path()).expect("canonical");
        let root = base.join("vol");
        std::fs::create_dir_all(root.join("d/etc")).expect("mkdir");
        std::fs::write(root.join("d/etc/marker"), "inside the volume").expect("write");
        std::os::unix::fs::symlink("/", root.join("l")).expect("link");
        let inside = identity(&root.join("d/etc")).expect("stat");
        let host = identity(Path::new("/etc")).expect("stat /etc");
        assert_ne!(inside, host);
        Self { _tmp: tmp, base, root, inside, host }
    }

    /// Starts the attacker; stop it with the flag, join to get its number of swaps. It leaves
    /// `d` a directory.
    fn swap_until(&self, stop: Arc<AtomicBool>) -> JoinHandle<u64> {
        let root = self.root.clone();
        std::thread::spawn(move || {
            use rustix::fs::{Mode, OFlags, RenameFlags, renameat_with};
            let dir = rustix::fs::open(&root, OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).expect("open");
            let mut swaps = 0u64;
            while !stop.load(Ordering::Relaxed) {
                renameat_with(&dir, "d", &dir, "l", RenameFlags::EXCHANGE).expect("exchange");
                swaps += 1;
            }
            if std::fs::symlink_metadata(root.join("d")).expect("d").file_type().is_symlink() {
                renameat_with(&dir, "d", &dir, "l", RenameFlags::EXCHANGE).expect("exchange back");
            }
            swaps
        })
    }
}

/// Whether this process may mount (in a mount namespace of its own); says why not otherwise.
fn may_mount() -> bool {
    let probe = std::thread::spawn(|| nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS));
    match probe.join().expect("probe") {
        Ok(()) => true,
        Err(e) => {
            // The README's test command runs as root: there a refusal is a failure, not a skip.
            hpk_test_support::skip(format!(
                "mounting needs CAP_SYS_ADMIN (unshare of a mount namespace: {e})"
            ));
            false
        }
    }
}

#[test]
fn pinning_never_mounts_the_host_while_a_link_is_swapped_in() {
    if !may_mount() {
        return;
    }
    let volume = Arc::new(Volume::new());
    let stop = Arc::new(AtomicBool::new(false));
    let attacker = volume.swap_until(stop.clone());
    let (pinned, refused, by_path) =
        (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let defender = {
        let (volume, pinned, refused, by_path) =
            (volume.clone(), pinned.clone(), refused.clone(), by_path.clone());
        std::thread::spawn(move || {
            use nix::mount::{MsFlags, mount};
            // This thread's mounts stay in a namespace of its own.
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS).expect("unshare");
            mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)
                .expect("private");
            let staging = volume.base.join("staging");
            let deadline = Instant::now() + race_time();
            while Instant::now() < deadline {
                // What a resolver by path (crun's) would find right now.
                if identity(&volume.root.join("d/etc")).is_ok_and(|id| id == volume.host) {
                    by_path.fetch_add(1, Ordering::Relaxed);
                }
                match open_beneath(&volume.root, Path::new("d/etc")) {
                    Ok(source) => {
                        source.pin(&staging).expect("pin");
                        let shown = identity(&staging).expect("stat the pin");
                        assert_eq!(shown, volume.inside, "a pin showed something other than d/etc");
                        let marker = std::fs::read_to_string(staging.join("marker")).expect("marker");
                        assert_eq!(marker, "inside the volume");
                        unpin(&staging).expect("unpin");
                        pinned.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(Error::SubPathLink { at, .. }) => {
                        assert_eq!(at, "d");
                        refused.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => panic!("unexpected error: {e}"),
                }
            }
            assert!(!staging.exists(), "the last staging point was removed");
        })
    };
    let outcome = defender.join();
    stop.store(true, Ordering::Relaxed);
    let swaps = attacker.join().expect("attacker");
    outcome.expect("the defender failed (see above)");
    let (pinned, refused, by_path) =
        (pinned.load(Ordering::Relaxed), refused.load(Ordering::Relaxed), by_path.load(Ordering::Relaxed));
    eprintln!(
        "{swaps} swaps: {pinned} pins, all of d/etc; {refused} refused; by path the host's /etc {by_path} times"
    );
    assert!(pinned > 0 && refused > 0, "both outcomes happen under the race");
    assert!(by_path > 0, "the race is real: resolving by path reached the host's /etc");
    assert_eq!(
        std::fs::read_to_string(volume.root.join("d/etc/marker")).expect("marker"),
        "inside the volume"
    );
}

/// A pod sandbox for `rt`, and the container config writer for it.
fn sandbox(rt: &Runtime, dir: &Path, name: &str) -> (String, String) {
    let pod = write_json(
        &dir.join(format!("{name}-pod.json")),
        serde_json::json!({
            "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"), "attempt": 0},
            "log_directory": dir.join("logs").join(name),
        }),
    );
    let pod_id = rt.ok(&["runp", &pod]);
    (pod_id, pod)
}

/// A container config mounting `root/relative` at `/data` as a subPath of the volume `root`.
fn sub_path_container(dir: &Path, name: &str, image: &str, root: &Path, relative: &str) -> String {
    write_json(
        &dir.join(format!("{name}.json")),
        serde_json::json!({
            "metadata": {"name": name},
            "image": {"image": image},
            "command": ["sh", "-c", "stat -c 'seen %d %i' /data; cat /data/marker; echo; ls /data"],
            "log_path": format!("{name}/0.log"),
            "mounts": [{"container_path": "/data", "host_path": root.join(relative)}],
            "annotations": {SUB_PATH_ROOTS: serde_json::json!({"/data": root}).to_string()},
        }),
    )
}

/// Starts container `id` and waits for its log: what it printed, and the device and inode
/// numbers of its `/data` as it saw them.
fn run_and_read(rt: &Runtime, id: &str) -> (String, Option<(u64, u64)>) {
    rt.ok(&["start", id]);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let inspect: serde_json::Value =
            serde_json::from_str(&rt.ok(&["inspect", id])).expect("inspect JSON");
        if inspect["status"]["state"] == "CONTAINER_EXITED" {
            break;
        }
        assert!(Instant::now() < deadline, "container {id} still runs: {inspect}\n{}", rt.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = rt.ok(&["logs", id]);
    let seen = out.lines().find_map(|l| l.strip_prefix("seen ")).and_then(|l| {
        let (dev, ino) = l.split_once(' ')?;
        Some((dev.parse().ok()?, ino.parse().ok()?))
    });
    (out, seen)
}

/// The staging point of the container's first mount, seen in the runtime's mount namespace.
fn staging_of(rt: &Runtime, runtime_state: &Path, id: &str) -> PathBuf {
    let inner = runtime_state.join("containers").join(id).join("sub-paths/0");
    PathBuf::from(format!("/proc/{}/root{}", rt.pid(), inner.display()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sub_path_mount_shows_the_volume_and_goes_with_its_container() {
    if !tools_present(CRICTL_TOOLS) {
        return;
    }
    let (registry, reference, _) = registry_with_shell_image().await;
    let volume = Volume::new();
    let dir = volume.base.join("rt");
    std::fs::create_dir_all(&dir).expect("mkdir");
    let rt = tokio::task::block_in_place(|| Runtime::start(&dir, &registry.host_port()));
    tokio::task::block_in_place(|| {
        rt.ok(&["pull", &reference]);
        let (pod_id, pod) = sandbox(&rt, &dir, "sub");
        let ctr = sub_path_container(&dir, "reader", &reference, &volume.root, "d/etc");
        let id = rt.ok(&["create", &pod_id, &ctr, &pod]);
        let staging = staging_of(&rt, &dir.join("state"), &id);
        assert_eq!(identity(&staging).expect("staging point"), volume.inside);
        let (logs, seen) = run_and_read(&rt, &id);
        assert!(logs.contains("inside the volume\nmarker"), "{logs}");
        assert_eq!(seen, Some(volume.inside), "{logs}");
        rt.ok(&["rm", "--force", &id]);
        assert!(!staging.exists() && !staging.parent().expect("parent").exists(), "released");
        assert_eq!(
            std::fs::read_to_string(volume.root.join("d/etc/marker")).expect("kept"),
            "inside the volume"
        );

        // A missing subPath is made (0755) in the volume; a link on the way is refused and
        // nothing of the container is left.
        let made = sub_path_container(&dir, "made", &reference, &volume.root, "new/dir");
        let id = rt.ok(&["create", &pod_id, &made, &pod]);
        assert!(volume.root.join("new/dir").is_dir());
        rt.ok(&["rm", &id]);
        let linked = sub_path_container(&dir, "linked", &reference, &volume.root, "l/etc");
        let err = rt.fails(&["create", &pod_id, &linked, &pod]);
        assert!(err.contains("\\\"l\\\" is a symbolic link"), "{err}");
        assert_eq!(rt.ok(&["ps", "-a", "-q"]), "");
        let left = std::fs::read_dir(dir.join("state/containers")).expect("containers").count();
        assert_eq!(left, 0, "a refused create leaves no container directory");
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_kubelets_stored_files_are_pinned_too() {
    if !tools_present(CRICTL_TOOLS) {
        return;
    }
    let (registry, reference, _) = registry_with_shell_image().await;
    let volume = Volume::new();
    let dir = volume.base.join("rt");
    // What PutFiles stores for a connector's pod: a configMap volume and /etc/hosts.
    let stored = dir.join("root/pod-files/uid-remote");
    std::fs::create_dir_all(stored.join("volumes/cfg")).expect("mkdir");
    std::fs::write(stored.join("volumes/cfg/key"), "shipped").expect("write");
    std::fs::write(stored.join("etc-hosts"), "127.0.0.1 shipped-host\n").expect("write");
    let rt = tokio::task::block_in_place(|| Runtime::start(&dir, &registry.host_port()));
    tokio::task::block_in_place(|| {
        rt.ok(&["pull", &reference]);
        let (pod_id, pod) = sandbox(&rt, &dir, "remote");
        let ctr = write_json(
            &dir.join("stored.json"),
            serde_json::json!({
                "metadata": {"name": "stored"},
                "image": {"image": reference},
                "command": ["sh", "-c", "cat /config/key; echo; cat /etc/hosts"],
                "log_path": "stored/0.log",
                "mounts": [
                    {"container_path": "/config", "host_path": stored.join("volumes/cfg"), "readonly": true},
                    {"container_path": "/etc/hosts", "host_path": stored.join("etc-hosts")},
                ],
            }),
        );
        let id = rt.ok(&["create", &pod_id, &ctr, &pod]);
        let points = PathBuf::from(format!(
            "/proc/{}/root{}",
            rt.pid(),
            dir.join("state/containers").join(&id).join("sub-paths").display()
        ));
        assert!(points.join("0").is_dir() && points.join("1").is_file(), "a directory and a file pinned");
        let (logs, _) = run_and_read(&rt, &id);
        assert!(logs.contains("shipped") && logs.contains("shipped-host"), "{logs}");
        rt.ok(&["rm", &id]);
        assert!(!points.exists());
        // A link in a stored tree (planted by a container in a writable copy) is refused.
        std::fs::remove_dir_all(stored.join("volumes/cfg")).expect("rm");
        std::os::unix::fs::symlink("/etc", stored.join("volumes/cfg")).expect("link");
        let err = rt.fails(&["create", &pod_id, &ctr, &pod]);
        assert!(err.contains("is a symbolic link"), "{err}");
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_runtime_removes_a_sub_path_container_and_keeps_the_volume() {
    if !tools_present(CRICTL_TOOLS) {
        return;
    }
    let (registry, reference, _) = registry_with_shell_image().await;
    let volume = Volume::new();
    let dir = volume.base.join("rt");
    std::fs::create_dir_all(&dir).expect("mkdir");
    let first = tokio::task::block_in_place(|| Runtime::start(&dir, &registry.host_port()));
    let (pod_id, pod, id) = tokio::task::block_in_place(|| {
        first.ok(&["pull", &reference]);
        let (pod_id, pod) = sandbox(&first, &dir, "restart");
        let ctr = sub_path_container(&dir, "kept", &reference, &volume.root, "d/etc");
        let id = first.ok(&["create", &pod_id, &ctr, &pod]);
        (pod_id, pod, id)
    });
    // Its staging point was mounted in the killed runtime's namespace; the new one has only
    // the empty point, which must go without anything being removed through it.
    tokio::task::block_in_place(|| first.kill());
    let rt = tokio::task::block_in_place(|| Runtime::start(&dir, &registry.host_port()));
    tokio::task::block_in_place(|| {
        let points = dir.join("state/containers").join(&id).join("sub-paths");
        assert!(points.join("0").is_dir(), "the staging point is still there");
        rt.ok(&["rm", &id]);
        assert!(!points.exists(), "removed with its container");
        assert_eq!(
            std::fs::read_to_string(volume.root.join("d/etc/marker")).expect("kept"),
            "inside the volume"
        );
        let ctr = sub_path_container(&dir, "again", &reference, &volume.root, "d/etc");
        let again = rt.ok(&["create", &pod_id, &ctr, &pod]);
        let (logs, seen) = run_and_read(&rt, &again);
        assert_eq!(seen, Some(volume.inside), "{logs}");
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_container_never_mounts_the_host_while_a_link_is_swapped_in() {
    if !tools_present(CRICTL_TOOLS) || !may_mount() {
        return;
    }
    let (registry, reference, _) = registry_with_shell_image().await;
    let volume = Volume::new();
    let dir = volume.base.join("rt");
    std::fs::create_dir_all(&dir).expect("mkdir");
    let rt = tokio::task::block_in_place(|| Runtime::start(&dir, &registry.host_port()));
    tokio::task::block_in_place(|| {
        rt.ok(&["pull", &reference]);
        let (pod_id, pod) = sandbox(&rt, &dir, "race");
        let ctr = sub_path_container(&dir, "racer", &reference, &volume.root, "d/etc");
        let stop = Arc::new(AtomicBool::new(false));
        let attacker = volume.swap_until(stop.clone());
        let (mut created, mut refused, mut wrong) = (0u32, 0u32, None);
        let deadline = Instant::now() + race_time();
        while Instant::now() < deadline && wrong.is_none() {
            let out = rt.crictl(&["create", &pod_id, &ctr, &pod]);
            if out.status.success() {
                let id = String::from_utf8_lossy(&out.stdout).trim().to_owned();
                // The staging point in the runtime's namespace, and /data in the container.
                let staged = identity(&staging_of(&rt, &dir.join("state"), &id)).ok();
                let (logs, seen) = run_and_read(&rt, &id);
                rt.ok(&["rm", "--force", &id]);
                match (staged, seen) {
                    (Some(a), Some(b)) if a == volume.inside && b == volume.inside => created += 1,
                    other => {
                        let head: Vec<&str> = logs.lines().take(3).collect();
                        wrong = Some(format!(
                            "container {id} got (staged, seen) {other:?}, not d/etc {:?}; it printed {head:?}",
                            volume.inside
                        ));
                    }
                }
            } else {
                let err = String::from_utf8_lossy(&out.stderr).into_owned();
                match err.contains("\\\"d\\\" is a symbolic link") {
                    true => refused += 1,
                    false => wrong = Some(format!("unexpected error: {err}")),
                }
            }
        }
        // The attacker stops before any assertion: the volume must outlive it.
        stop.store(true, Ordering::Relaxed);
        let swaps = attacker.join().expect("attacker");
        assert!(wrong.is_none(), "{}\n{}", wrong.unwrap_or_default(), rt.log());
        eprintln!("{swaps} swaps: {created} containers ran, all on d/etc; {refused} creates refused");
        assert!(created > 0 && refused > 0, "both outcomes happen under the race");
        assert_eq!(rt.ok(&["ps", "-a", "-q"]), "");
    });
}
