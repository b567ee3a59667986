//! Owners a layer's entries cannot have in this bubble, and device nodes it cannot make.
//!
//! With one mapped ID, chown to any other ID fails with EINVAL (there is no such user here),
//! yet most images own files by other users (nginx 101, postgres 999, agnhost 1000/50000). As
//! containers/storage does for rootless pulls (`ignore_chown_errors`), the entry then stays
//! ours and its intended owner and mode are recorded in `user.containers.override_stat`
//! (`UID:GID:0MODE`, read by fuse-overlayfs and containers/storage), where the file system
//! takes user xattrs: on regular files and directories (never on symlinks, devices or FIFOs).
//! Device nodes cannot be made in a user namespace at all; containerd skips them the same way.
//! Each layer tells what it did once, with counts, not once per file.

use std::fs;
use std::io;
use std::path::Path;

use nix::errno::Errno;
use tracing::warn;

use super::extract::Meta;

/// The xattr that holds an entry's intended `UID:GID:0MODE` when the entry could not be
/// given its owner.
pub const OVERRIDE_XATTR: &str = "user.containers.override_stat";

/// What a layer's owners and devices became, told once the layer is written.
#[derive(Debug, Default)]
pub(crate) struct Unowned {
    /// Entries left owned by the runtime's user.
    kept: usize,
    /// Of those, the ones whose intended owner is in [`OVERRIDE_XATTR`].
    recorded: usize,
    /// The file system refused user xattrs; none are tried after that.
    no_xattrs: bool,
    /// Device nodes not created, and the first of them.
    devices: usize,
    first_device: Option<String>,
}

impl Unowned {
    /// `path` keeps the runtime's owner; records the owner and mode `meta` asked for where the
    /// entry's type and the file system allow.
    pub(crate) fn keep(&mut self, path: &Path, meta: Meta) -> io::Result<()> {
        self.kept += 1;
        if self.no_xattrs {
            return Ok(());
        }
        // User xattrs exist on regular files and directories only (xattr(7)).
        if !fs::symlink_metadata(path).is_ok_and(|m| m.is_file() || m.is_dir()) {
            return Ok(());
        }
        match xattr::set(path, OVERRIDE_XATTR, override_value(meta).as_bytes()) {
            Ok(()) => {
                self.recorded += 1;
                Ok(())
            }
            Err(e) if e.raw_os_error().map(Errno::from_raw) == Some(Errno::EOPNOTSUPP) => {
                self.no_xattrs = true;
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// The device node `shown` was not created.
    pub(crate) fn device_skipped(&mut self, shown: &str) {
        self.devices += 1;
        self.first_device.get_or_insert_with(|| shown.to_owned());
    }

    /// Logs what this layer could not keep: one line each for owners and devices.
    pub(crate) fn report(&self, layer: &str) {
        if self.kept > 0 {
            warn!(
                layer,
                entries = self.kept,
                recorded = self.recorded,
                xattrs_supported = !self.no_xattrs,
                xattr = OVERRIDE_XATTR,
                "owners not mapped in this bubble: entries kept owned by the runtime's user, intended owners recorded in the xattr"
            );
        }
        if let Some(first) = &self.first_device {
            warn!(
                layer,
                devices = self.devices,
                first = %first,
                "device nodes skipped: a user namespace cannot create them"
            );
        }
    }
}

/// `UID:GID:0MODE` as containers/storage writes it, the mode in octal with the setuid, setgid
/// and sticky bits.
pub(crate) fn override_value(meta: Meta) -> String {
    format!("{}:{}:0{:o}", meta.uid, meta.gid, meta.mode & 0o7777)
}

/// Removes a recorded owner from `path`, which is about to be given one anew.
pub(crate) fn forget(path: &Path) {
    let _ = xattr::remove(path, OVERRIDE_XATTR);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_value_is_containers_storage_format() {
        let meta = |mode| Meta { mode, uid: 1000, gid: 50000, mtime: 0 };
        assert_eq!(override_value(meta(0o755)), "1000:50000:0755");
        assert_eq!(override_value(meta(0o2775)), "1000:50000:02775");
        assert_eq!(override_value(meta(0o4755)), "1000:50000:04755");
        assert_eq!(override_value(meta(0o640)), "1000:50000:0640");
    }

    #[test]
    fn kept_files_and_dirs_record_their_owner_and_symlinks_are_skipped() {
        let dir = tempfile::tempdir_in("/var/tmp").expect("tempdir on the root disk");
        let (file, sub, link) = (dir.path().join("f"), dir.path().join("d"), dir.path().join("l"));
        fs::write(&file, b"x").expect("file");
        fs::create_dir(&sub).expect("dir");
        std::os::unix::fs::symlink("f", &link).expect("link");
        let mut unowned = Unowned::default();
        let meta = Meta { mode: 0o2775, uid: 101, gid: 101, mtime: 0 };
        for path in [&file, &sub, &link] {
            unowned.keep(path, meta).expect("kept");
        }
        assert_eq!(unowned.kept, 3);
        if unowned.no_xattrs {
            hpk_test_support::skipped("/var/tmp takes no user xattrs");
            return;
        }
        assert_eq!(unowned.recorded, 2, "the symlink has none");
        for path in [&file, &sub] {
            let value = xattr::get(path, OVERRIDE_XATTR).expect("read");
            assert_eq!(value.as_deref(), Some(&b"101:101:02775"[..]), "{}", path.display());
        }
        forget(&sub);
        assert_eq!(xattr::get(&sub, OVERRIDE_XATTR).expect("read"), None);
    }
}
