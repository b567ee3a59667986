//! The state directory (`HPK_STATE_DIR`, else chosen by [`choose_base`]: the Slurm job's own
//! `$TMPDIR`, `/tmp/hpk-<uid>`, or `$XDG_RUNTIME_DIR/hpk`): node directories with CA keys and
//! etcd, the image cache, every container's overlay. It must be this user's alone, on a
//! node-local filesystem that allows exec and user extended attributes and has room.

use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Free space the state filesystem needs by default (the unpacked bubble image is about
/// 0.5 GiB; pod images and their containers' layers come on top). `HPK_STATE_MIN_FREE_MB`
/// sets another figure.
const MIN_FREE_MB: u64 = 1024;

/// Filesystems that are shared between machines, by `statfs` magic number: secrets and etcd
/// must not be written there (anyone who can claim this user's UID on another client could
/// read them, and they travel the network in clear), and they are slow for etcd besides.
const NETWORK_FILESYSTEMS: &[(i64, &str)] = &[
    (0x6969, "NFS"),
    (0x0BD0_0BD0, "Lustre"),
    (0x4750_4653, "GPFS (IBM Storage Scale)"),
    (0x1983_0326, "BeeGFS"),
    (0x00C3_6400, "CephFS"),
    (0xFF53_4D42, "CIFS"),
    (0xFE53_4D42, "SMB"),
    (0x517B, "SMB"),
    (0x5346_414F, "AFS"),
    (0x6B41_4653, "AFS"),
    (0x0102_1997, "9p"),
    (0xAAD7_AAEA, "PanFS"),
    (0x0116_1970, "GFS2"),
    (0x7461_636F, "OCFS2"),
];
const FUSE_MAGIC: i64 = 0x6573_5546;
/// FUSE filesystems that reach over the network, by their subtype (`fuse.<subtype>` in
/// /proc/self/mountinfo).
const NETWORK_FUSE: &[&str] =
    &["sshfs", "ceph-fuse", "glusterfs", "s3fs", "rclone", "gcsfuse", "quobyte", "lustre"];

/// Where the state directory may be, as the environment says: see [`choose_base`].
#[derive(Debug, Clone, Default)]
pub struct BaseCandidates {
    /// The job's own temporary directory (`$TMPDIR` inside a Slurm job), made for the job by
    /// the site and this user's by construction.
    pub job_tmpdir: Option<PathBuf>,
    /// `$XDG_RUNTIME_DIR` (`/run/user/<uid>`, made by the login manager, 0700, memory-backed).
    pub runtime_dir: Option<PathBuf>,
    /// `/tmp/hpk-<uid>`: shared with every user of the node, so checked.
    pub tmp: PathBuf,
}

impl BaseCandidates {
    /// The candidates of this process's environment, for host UID `uid`.
    pub fn from_env(uid: u32) -> Self {
        let abs = |name: &str| std::env::var_os(name).map(PathBuf::from).filter(|p| p.is_absolute());
        let in_job = std::env::var_os("SLURM_JOB_ID").is_some_and(|id| !id.is_empty());
        Self {
            job_tmpdir: abs("TMPDIR").filter(|_| in_job),
            runtime_dir: abs("XDG_RUNTIME_DIR"),
            tmp: PathBuf::from(format!("/tmp/hpk-{uid}")),
        }
    }
}

/// The state directory when `HPK_STATE_DIR` does not name one (review C1):
///
/// 1. `<job tmpdir>/hpk`, where a Slurm job has a temporary directory of its own that is this
///    user's alone (not a link, no one else may write it, parents safe) on a node-local
///    filesystem: no other user can have made anything in it;
/// 2. `/tmp/hpk-<uid>` if it does not exist yet, or is this user's alone ([`verify_private`]):
///    on disk, so the image cache and the pods' layers do not take the node's memory;
/// 3. `<XDG_RUNTIME_DIR>/hpk` when another user holds `/tmp/hpk-<uid>` (who would deny the
///    node to this user, and whose directory is never used), if the runtime directory is this
///    user's alone;
/// 4. otherwise `/tmp/hpk-<uid>`, which the preflight then refuses, naming its owner and the
///    fix.
///
/// A runtime directory that already holds this user's state wins over an absent `/tmp` one,
/// so that `hpk down` finds what `hpk up` made there.
pub fn choose_base(c: &BaseCandidates) -> PathBuf {
    let ours_alone = |dir: &Path| verify_private(dir).is_ok();
    if let Some(job) = &c.job_tmpdir
        && !["/", "/tmp", "/var/tmp", "/dev/shm"].iter().any(|shared| job == Path::new(shared))
        && ours_alone(job)
        && !is_network(job)
    {
        return job.join("hpk");
    }
    let runtime = c.runtime_dir.as_ref().filter(|dir| ours_alone(dir)).map(|dir| dir.join("hpk"));
    let exists = |dir: &Path| std::fs::symlink_metadata(dir).is_ok();
    match runtime {
        _ if exists(&c.tmp) && ours_alone(&c.tmp) => c.tmp.clone(),
        Some(runtime) if exists(&runtime) && ours_alone(&runtime) => runtime,
        _ if !exists(&c.tmp) => c.tmp.clone(),
        Some(runtime) if !exists(&runtime) => runtime,
        _ => c.tmp.clone(),
    }
}

fn is_network(dir: &Path) -> bool {
    check_local(dir).is_err()
}

/// Checks the state directory, creating it (mode 0700) if it does not exist.
pub fn check(state: &Path) -> Result<()> {
    ensure_private(state)?;
    check_local(state)?;
    check_exec(state)?;
    check_xattrs(state)?;
    check_free(state)
}

fn refuse(state: &Path, what: String, fix: &str) -> Error {
    Error::Prerequisite {
        what: format!("the state directory {}: {what}", state.display()),
        fix: format!(
            "{fix}; set HPK_STATE_DIR to a directory of yours on a node-local filesystem (e.g. /tmp, /var/tmp or a local scratch disk)"
        ),
    }
}

/// The directory exists, is a real directory (not a link), is owned by this user and no one
/// else may write it (then it is made 0700) — or it did not exist and is made so, 0700.
/// Nothing below it can then be swapped or read by another user.
pub fn ensure_private(dir: &Path) -> Result<()> {
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent).map_err(|e| Error::io("create", parent.display(), e))?;
        check_ancestors(dir, parent)?;
    }
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => return Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(Error::io("create", dir.display(), e)),
    }
    owned_and_closed(dir, true)
}

/// The directory exists and is this user's alone, as [`ensure_private`] leaves it, and so are
/// its parents; nothing is created or changed. For what reads a state directory another run
/// made (`hpk down`, `hpk shell`): after a reboot or a `/tmp` clean-up another user may have
/// made that path, and nothing HPK runs may come from it then.
pub fn verify_private(dir: &Path) -> Result<()> {
    if let Some(parent) = dir.parent() {
        check_ancestors(dir, parent)?;
    }
    owned_and_closed(dir, false)
}

/// `dir` is a real directory of this user's that no one else may write; with `close`, one
/// that others may read is made 0700.
fn owned_and_closed(dir: &Path, close: bool) -> Result<()> {
    let meta = std::fs::symlink_metadata(dir).map_err(|e| Error::io("inspect", dir.display(), e))?;
    let uid = nix::unistd::getuid().as_raw();
    let problem = if meta.file_type().is_symlink() {
        Some("is a symbolic link".to_owned())
    } else if !meta.is_dir() {
        Some("is not a directory".to_owned())
    } else if meta.uid() != uid {
        Some(format!("belongs to UID {}, not to you (UID {uid})", meta.uid()))
    } else if meta.mode() & 0o022 != 0 {
        Some(format!("has mode {:04o}: other users may change it", meta.mode() & 0o7777))
    } else {
        None
    };
    match problem {
        // Ours, and no one else could have written into it: closed to others from now on.
        None if close && meta.mode() & 0o077 != 0 => {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                .map_err(|e| Error::io("chmod 0700", dir.display(), e))
        }
        None => Ok(()),
        Some(p) => Err(refuse(
            dir,
            format!("{p}, so another user could replace what HPK runs"),
            "remove it if it is yours (`chmod 0700` it if it is and you trust its content)",
        )),
    }
}

/// No directory above `dir` lets another user rename what is in it: each is root's or ours,
/// or, if others may write it, root's with the sticky bit (as /tmp is).
fn check_ancestors(dir: &Path, parent: &Path) -> Result<()> {
    let uid = nix::unistd::getuid().as_raw();
    let parent = parent.canonicalize().map_err(|e| Error::io("resolve", parent.display(), e))?;
    for ancestor in parent.ancestors() {
        let meta = std::fs::metadata(ancestor).map_err(|e| Error::io("inspect", ancestor.display(), e))?;
        let others_write = meta.mode() & 0o022 != 0;
        let sticky_root = meta.mode() & 0o1000 != 0 && meta.uid() == 0;
        if (meta.uid() != 0 && meta.uid() != uid) || (others_write && !sticky_root) {
            return Err(refuse(
                dir,
                format!(
                    "{} above it (UID {}, mode {:04o}) lets other users rename what it holds",
                    ancestor.display(),
                    meta.uid(),
                    meta.mode() & 0o7777
                ),
                "choose a directory whose parents only you and root may change",
            ));
        }
    }
    Ok(())
}

/// The filesystem's name if it is shared between machines.
pub fn network_filesystem(magic: i64, fuse_subtype: Option<&str>) -> Option<String> {
    if let Some((_, name)) = NETWORK_FILESYSTEMS.iter().find(|(m, _)| *m == magic) {
        return Some((*name).to_owned());
    }
    let sub = fuse_subtype.filter(|_| magic == FUSE_MAGIC)?;
    NETWORK_FUSE.contains(&sub).then(|| format!("fuse.{sub}"))
}

fn check_local(state: &Path) -> Result<()> {
    let stat = nix::sys::statfs::statfs(state).map_err(|e| Error::io("statfs", state.display(), e.into()))?;
    #[allow(clippy::unnecessary_cast)] // the field's type differs between C libraries
    let magic = stat.filesystem_type().0 as i64;
    let subtype = mount_fstype(state).and_then(|t| t.strip_prefix("fuse.").map(str::to_owned));
    match network_filesystem(magic, subtype.as_deref()) {
        None => Ok(()),
        Some(name) => Err(refuse(
            state,
            format!(
                "is on {name}, a network filesystem: CA keys, node keys and etcd would be readable from other machines"
            ),
            "keep state on the node itself",
        )),
    }
}

/// The filesystem type of the mount holding `path` (the longest mount point above it), from
/// /proc/self/mountinfo.
fn mount_fstype(path: &Path) -> Option<String> {
    let path = path.canonicalize().ok()?;
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let point = PathBuf::from(unescape(fields.get(4)?));
            let sep = fields.iter().position(|f| *f == "-")?;
            let fstype = fields.get(sep + 1)?;
            path.starts_with(&point).then(|| (point.components().count(), (*fstype).to_owned()))
        })
        .max_by_key(|(depth, _)| *depth)
        .map(|(_, t)| t)
}

/// mountinfo's octal escapes (`\040` for a space).
pub(crate) fn unescape(field: &str) -> String {
    let mut out = Vec::new();
    let bytes = field.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && let Some(code) = field.get(i + 1..i + 4).and_then(|o| u8::from_str_radix(o, 8).ok())
        {
            out.push(code);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn statvfs(state: &Path) -> Result<nix::sys::statvfs::Statvfs> {
    nix::sys::statvfs::statvfs(state).map_err(|e| Error::io("statvfs", state.display(), e.into()))
}

fn check_exec(state: &Path) -> Result<()> {
    if statvfs(state)?.flags().contains(nix::sys::statvfs::FsFlags::ST_NOEXEC) {
        return Err(refuse(
            state,
            "is on a filesystem mounted noexec: the bubble's programs run from there".into(),
            "use a filesystem mounted with exec",
        ));
    }
    Ok(())
}

fn check_xattrs(state: &Path) -> Result<()> {
    let dir = scratch_dir(state)?;
    let file = dir.path().join("xattr");
    std::fs::write(&file, b"").map_err(|e| Error::io("write", file.display(), e))?;
    match rustix::fs::lsetxattr(&file, "user.hpk.preflight", b"1", rustix::fs::XattrFlags::empty()) {
        Ok(()) => Ok(()),
        Err(e) => Err(refuse(
            state,
            format!(
                "its filesystem does not take user extended attributes ({e}): overlayfs keeps whiteouts in them inside a user namespace, and image ownership is recorded in them"
            ),
            "use ext4, xfs, btrfs or tmpfs (Linux 6.6 or newer for tmpfs)",
        )),
    }
}

fn check_free(state: &Path) -> Result<()> {
    let min_mb =
        std::env::var("HPK_STATE_MIN_FREE_MB").ok().and_then(|v| v.parse().ok()).unwrap_or(MIN_FREE_MB);
    let stat = statvfs(state)?;
    #[allow(clippy::unnecessary_cast)] // the fields' types differ between C libraries
    let free = (stat.blocks_available() as u64).saturating_mul(stat.fragment_size() as u64);
    if free / (1 << 20) < min_mb {
        return Err(refuse(
            state,
            format!("has {} MiB free, less than the {min_mb} MiB a bubble needs", free >> 20),
            "free some space there (HPK_STATE_MIN_FREE_MB sets the minimum)",
        ));
    }
    Ok(())
}

/// A fresh directory for a check under `state`, removed with everything in it when dropped.
pub fn scratch_dir(state: &Path) -> Result<Scratch> {
    let mut bytes = [0u8; 6];
    getrandom::fill(&mut bytes)
        .map_err(|e| Error::io("generate", "a name", std::io::Error::other(e.to_string())))?;
    let dir = state.join(format!(".preflight-{}", hex::encode(bytes)));
    std::fs::DirBuilder::new().mode(0o700).create(&dir).map_err(|e| Error::io("create", dir.display(), e))?;
    Ok(Scratch(dir))
}

/// See [`scratch_dir`].
pub struct Scratch(PathBuf);

impl Scratch {
    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // An overlay's `work/work` is left mode 0: opened up first.
        crate::image::cache::remove_tree(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn network_filesystems_are_known_by_magic_and_fuse_subtype() {
        assert_eq!(network_filesystem(0x6969, None).as_deref(), Some("NFS"));
        assert_eq!(network_filesystem(0x0BD0_0BD0, None).as_deref(), Some("Lustre"));
        assert_eq!(network_filesystem(0x4750_4653, None).as_deref(), Some("GPFS (IBM Storage Scale)"));
        assert_eq!(network_filesystem(0x1983_0326, None).as_deref(), Some("BeeGFS"));
        assert_eq!(network_filesystem(0x00C3_6400, None).as_deref(), Some("CephFS"));
        assert_eq!(network_filesystem(FUSE_MAGIC, Some("sshfs")).as_deref(), Some("fuse.sshfs"));
        assert_eq!(network_filesystem(FUSE_MAGIC, Some("fuse-overlayfs")), None);
        // ext4, xfs, tmpfs, btrfs
        for local in [0xEF53, 0x5846_5342, 0x0102_1994, 0x9123_683E] {
            assert_eq!(network_filesystem(local, None), None, "{local:#x}");
        }
    }

    #[test]
    fn a_directory_of_another_user_or_open_to_others_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let base = tempfile::tempdir().expect("tempdir");
        let fresh = base.path().join("new/state");
        ensure_private(&fresh).expect("made");
        let mode = std::fs::metadata(&fresh).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        ensure_private(&fresh).expect("ours, private: accepted again");
        std::fs::set_permissions(&fresh, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        ensure_private(&fresh).expect("ours, readable by others: closed");
        assert_eq!(std::fs::metadata(&fresh).expect("stat").permissions().mode() & 0o777, 0o700);
        std::fs::set_permissions(&fresh, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let err = ensure_private(&fresh).expect_err("world-writable").to_string();
        assert!(err.contains("mode 0777"), "{err}");
        std::fs::set_permissions(&fresh, std::fs::Permissions::from_mode(0o770)).expect("chmod");
        assert!(ensure_private(&fresh).is_err(), "group-writable");
        let link = base.path().join("link");
        std::os::unix::fs::symlink(&fresh, &link).expect("symlink");
        assert!(ensure_private(&link).expect_err("a link").to_string().contains("symbolic link"));
        if nix::unistd::getuid().is_root() {
            let open = base.path().join("open");
            std::fs::create_dir(&open).expect("mkdir");
            std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).expect("chmod");
            let err = ensure_private(&open.join("state")).expect_err("a parent others may write").to_string();
            assert!(err.contains("lets other users rename"), "{err}");
            std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
            ensure_private(&open.join("state")).expect("a sticky parent of root's, as /tmp");
            let theirs = base.path().join("theirs");
            std::fs::create_dir(&theirs).expect("mkdir");
            std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o700)).expect("chmod");
            std::os::unix::fs::chown(&theirs, Some(61001), Some(61001)).expect("chown");
            let err = ensure_private(&theirs).expect_err("another user's").to_string();
            assert!(err.contains("belongs to UID 61001"), "{err}");
        } else {
            hpk_test_support::skip("in part: other users' directories need root to make");
        }
    }

    #[test]
    fn the_state_directory_is_one_no_other_user_made() {
        use std::os::unix::fs::PermissionsExt;
        let base = tempfile::tempdir().expect("tempdir");
        let dir = |name: &str, mode: u32| {
            let path = base.path().join(name);
            std::fs::create_dir(&path).expect("mkdir");
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
            path
        };
        let job = dir("job", 0o700);
        let runtime = dir("run-user", 0o700);
        let tmp = base.path().join("hpk-1000");
        let c = |job: Option<&Path>, runtime: Option<&Path>| BaseCandidates {
            job_tmpdir: job.map(Path::to_path_buf),
            runtime_dir: runtime.map(Path::to_path_buf),
            tmp: tmp.clone(),
        };

        // The job's own directory first; one another user could write is passed over.
        assert_eq!(choose_base(&c(Some(&job), Some(&runtime))), job.join("hpk"));
        let open_job = dir("open-job", 0o777);
        assert_eq!(choose_base(&c(Some(&open_job), Some(&runtime))), tmp);
        // Outside a job: /tmp/hpk-<uid> while no one else holds it (on disk, not in memory).
        assert_eq!(choose_base(&c(None, Some(&runtime))), tmp);
        assert_eq!(choose_base(&c(None, None)), tmp);
        // Held by someone else (open to others here; another UID below): the runtime directory,
        // which only the login manager and this user can have made.
        std::fs::create_dir(&tmp).expect("mkdir");
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        assert_eq!(choose_base(&c(None, Some(&runtime))), runtime.join("hpk"));
        // A runtime directory that is not this user's alone is no way out: the preflight then
        // refuses /tmp/hpk-<uid>, naming its owner.
        let open_runtime = dir("open-run", 0o777);
        assert_eq!(choose_base(&c(None, Some(&open_runtime))), tmp);
        assert_eq!(choose_base(&c(None, None)), tmp);
        // State already in the runtime directory is found again (`hpk down` after `hpk up`),
        // even once the other user's /tmp directory is gone.
        std::fs::create_dir(runtime.join("hpk")).expect("mkdir");
        std::fs::set_permissions(runtime.join("hpk"), std::fs::Permissions::from_mode(0o700)).expect("chmod");
        std::fs::remove_dir(&tmp).expect("rmdir");
        assert_eq!(choose_base(&c(None, Some(&runtime))), runtime.join("hpk"));
        // This user's own /tmp directory wins over it.
        std::fs::create_dir(&tmp).expect("mkdir");
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        assert_eq!(choose_base(&c(None, Some(&runtime))), tmp);

        if nix::unistd::getuid().is_root() {
            std::os::unix::fs::chown(&tmp, Some(61001), Some(61001)).expect("chown");
            assert_eq!(choose_base(&c(None, Some(&runtime))), runtime.join("hpk"));
            std::os::unix::fs::chown(&job, Some(61001), Some(61001)).expect("chown");
            assert_eq!(choose_base(&c(Some(&job), Some(&runtime))), runtime.join("hpk"));
        } else {
            hpk_test_support::skip("in part: other users' directories need root to make");
        }
    }

    #[test]
    fn verifying_changes_nothing_and_refuses_what_ensuring_refuses() {
        use std::os::unix::fs::PermissionsExt;
        let base = tempfile::tempdir().expect("tempdir");
        let dir = base.path().join("state");
        assert!(verify_private(&dir).is_err(), "a missing directory is not made");
        assert!(!dir.exists());
        ensure_private(&dir).expect("made");
        verify_private(&dir).expect("ours, 0700");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        verify_private(&dir).expect("ours, readable by others");
        assert_eq!(std::fs::metadata(&dir).expect("stat").permissions().mode() & 0o777, 0o755, "unchanged");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        assert!(verify_private(&dir).expect_err("world-writable").to_string().contains("mode 0777"));
        let link = base.path().join("link");
        std::os::unix::fs::symlink(&dir, &link).expect("symlink");
        assert!(verify_private(&link).expect_err("a link").to_string().contains("symbolic link"));
        if nix::unistd::getuid().is_root() {
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).expect("chmod");
            std::os::unix::fs::chown(&dir, Some(61001), Some(61001)).expect("chown");
            let err = verify_private(&dir).expect_err("another user's").to_string();
            assert!(err.contains("belongs to UID 61001"), "{err}");
        } else {
            hpk_test_support::skip("in part: another user's directory needs root to make");
        }
    }

    #[test]
    fn mountinfo_escapes_are_decoded() {
        assert_eq!(unescape(r"/mnt/with\040space"), "/mnt/with space");
        assert_eq!(unescape("/plain"), "/plain");
        assert_eq!(unescape("/home/a\\040b/c\\011d"), "/home/a b/c\td");
        assert_eq!(unescape("/odd\\09"), "/odd\\09", "not three octal digits: kept");
    }
}
