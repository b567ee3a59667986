//! The mount namespace containers are made in.
//!
//! crun refuses every container on hybrid-cgroup hosts while the v2 hierarchy at
//! `/sys/fs/cgroup/unified` lists a controller, and overlay mounts of the runtime should not
//! leak into the host's namespace. So containers are made in a private mount namespace where
//! that hierarchy is hidden under a read-only tmpfs. In a bubble the bubble's own namespace is
//! that namespace; outside one (tests, a runtime run by hand) a holder process keeps one open.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{CgroupMode, Error, Result};

/// A process holding a private mount namespace prepared for crun; killed (by PID) on drop.
#[derive(Debug)]
pub struct MountNamespace {
    holder: Child,
}

impl MountNamespace {
    /// Starts the holder and waits until its namespace is prepared.
    pub fn prepare() -> Result<Self> {
        let hide = if CgroupMode::detect() == CgroupMode::Hybrid {
            "mount -t tmpfs -o ro,size=4k none /sys/fs/cgroup/unified && "
        } else {
            ""
        };
        // The holder marks readiness by creating a file only it can see (on a private tmpfs),
        // so the parent knows the namespace is complete before using it.
        let script =
            format!("mount -t tmpfs -o size=4k none /mnt && {hide}touch /mnt/ready && exec sleep infinity");
        let holder = Command::new("unshare")
            .args(["--mount", "--propagation", "slave", "sh", "-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| Error::io("start", "unshare --mount", e))?;
        let mut ns = Self { holder };
        let ready = PathBuf::from(format!("/proc/{}/root/mnt/ready", ns.holder.id()));
        let deadline = Instant::now() + Duration::from_secs(10);
        while !ready.exists() {
            if let Ok(Some(status)) = ns.holder.try_wait() {
                let mut stderr = String::new();
                if let Some(mut err) = ns.holder.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut err, &mut stderr);
                }
                return Err(Error::Command {
                    command: "unshare --mount".into(),
                    status: status.to_string(),
                    stderr,
                });
            }
            if Instant::now() > deadline {
                return Err(Error::NotReady("mount namespace holder not ready within 10 s"));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(ns)
    }

    /// The prefix that runs a program in this namespace.
    pub fn prefix(&self) -> Vec<String> {
        vec!["nsenter".into(), format!("--mount=/proc/{}/ns/mnt", self.holder.id()), "--".into()]
    }
}

impl Drop for MountNamespace {
    fn drop(&mut self) {
        let _ = self.holder.kill();
        let _ = self.holder.wait();
    }
}

/// Moves the calling process into a private mount namespace prepared for crun (hybrid cgroup
/// hierarchy hidden) and returns the host's cgroup mode as it was before. Call it before any
/// thread starts: unsharing the mount namespace fails in a multi-threaded process.
pub fn enter_private_mount_namespace() -> Result<CgroupMode> {
    let mode = CgroupMode::detect();
    use nix::mount::{MsFlags, mount};
    use nix::sched::{CloneFlags, unshare};
    let sys =
        |action: &'static str, path: &str, e: nix::Error| Error::io(action, path, std::io::Error::from(e));
    unshare(CloneFlags::CLONE_NEWNS).map_err(|e| sys("unshare the mount namespace for", "/", e))?;
    // Our overlay mounts must not propagate back to the host's namespace; the host's later mounts
    // (volumes a kubelet or a user mounts under a host path) still reach containers (rslave).
    mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_SLAVE, None::<&str>)
        .map_err(|e| sys("make a slave of the host's mounts", "/", e))?;
    if mode == CgroupMode::Hybrid {
        mount(Some("none"), "/sys/fs/cgroup/unified", Some("tmpfs"), MsFlags::MS_RDONLY, Some("size=4k"))
            .map_err(|e| sys("hide", "/sys/fs/cgroup/unified", e))?;
    }
    Ok(mode)
}
