//! Container root filesystems: an overlay of the image's layers with a writable layer of the
//! container's own.

use std::path::{Path, PathBuf};

use super::error::run;
use super::{Crun, Error, Result};

/// An overlay mount for one container.
#[derive(Clone, Debug)]
pub struct Overlay {
    /// Where it is mounted (the bundle's rootfs).
    pub target: PathBuf,
    upper: PathBuf,
    work: PathBuf,
    lowers: Vec<PathBuf>,
}

impl Overlay {
    /// An overlay mounted on `dir/rootfs`, its writable layer in `writable` (`upper`, `work`:
    /// one filesystem, as overlayfs needs), over `lowers`, top-most first; creates the three.
    pub fn new(dir: &Path, writable: &Path, lowers: Vec<PathBuf>) -> Result<Self> {
        let overlay = Self {
            target: Self::target_in(dir),
            upper: writable.join("upper"),
            work: writable.join("work"),
            lowers,
        };
        for d in [&overlay.target, &overlay.upper, &overlay.work] {
            std::fs::create_dir_all(d).map_err(|e| Error::io("create", d, e))?;
        }
        Ok(overlay)
    }

    /// Mounts it (through crun's prefix, so in the containers' mount namespace). `userxattr`
    /// makes overlayfs read whiteouts and opaque markers from `user.overlay.*`, which works
    /// inside a user namespace and as root alike.
    pub fn mount(&self, crun: &Crun) -> Result<()> {
        let lower = self.lowers.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(":");
        let options = format!(
            "lowerdir={lower},upperdir={},workdir={},userxattr",
            self.upper.display(),
            self.work.display()
        );
        if !crun.has_prefix() {
            // Our own mount namespace is the containers': mount here, without a process.
            use nix::mount::{MsFlags, mount};
            return mount(
                Some("overlay"),
                &self.target,
                Some("overlay"),
                MsFlags::empty(),
                Some(options.as_str()),
            )
            .map_err(|e| Error::io("mount an overlay on", &self.target, e.into()));
        }
        run(crun.prefixed("mount").args(["-t", "overlay", "overlay", "-o", &options]).arg(&self.target))
            .map(drop)
    }

    /// Where the overlay of a container whose directory is `dir` is mounted.
    fn target_in(dir: &Path) -> PathBuf {
        dir.join("rootfs")
    }

    /// Unmounts it; not mounted is fine.
    pub fn unmount(&self, crun: &Crun) -> Result<()> {
        unmount(&self.target, crun)
    }

    /// Unmounts the overlay of the container whose directory is `dir`; not mounted is fine.
    pub fn unmount_in(dir: &Path, crun: &Crun) -> Result<()> {
        unmount(&Self::target_in(dir), crun)
    }

    /// Takes the overlay of the container whose directory is `dir` out of our own mount
    /// namespace once `crun create` has made the container's, which holds its own copy of it
    /// (a private mount: the copies do not propagate to each other). Every mount namespace made
    /// later copies every mount of ours, and every container's init reads `/proc/mounts`
    /// (crun's SELinux check), so a mount kept here for each container made each crun run
    /// cost more the more containers the node had (`docs/benchmarks.md`). Not with a prefix:
    /// the containers' mount namespace is then another one, which keeps its mounts. Not
    /// mounted is fine.
    pub fn detach_in(dir: &Path, crun: &Crun) -> Result<()> {
        if crun.has_prefix() {
            return Ok(());
        }
        unmount_here(&Self::target_in(dir), nix::mount::MntFlags::MNT_DETACH)
    }
}

/// Unmounts `target` (through crun's prefix where it has one); not mounted is fine.
fn unmount(target: &Path, crun: &Crun) -> Result<()> {
    if !crun.has_prefix() {
        return unmount_here(target, nix::mount::MntFlags::empty());
    }
    match run(crun.prefixed("umount").arg(target)) {
        Err(Error::Command { stderr, .. }) if stderr.contains("not mounted") => Ok(()),
        other => other.map(drop),
    }
}

/// Unmounts `target` in our own mount namespace with `flags`; not mounted is fine.
fn unmount_here(target: &Path, flags: nix::mount::MntFlags) -> Result<()> {
    match nix::mount::umount2(target, flags) {
        // Not a mount point (never mounted, or mounted in a namespace that is gone).
        Ok(()) | Err(nix::errno::Errno::EINVAL | nix::errno::Errno::ENOENT) => Ok(()),
        Err(e) => Err(Error::io("unmount", target, e.into())),
    }
}
