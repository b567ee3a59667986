//! Where the store keeps things on disk, and the file operations every part shares.
//!
//! ```text
//! <root>/              0700, locked (flock on .lock) by one store at a time
//!   index.json         the images, replaced atomically
//!   blobs/sha256/<hex> verified content: manifests, configs, compressed layers
//!   layers/<hex>/      one unpacked layer per diff ID, shared by every image that has it
//!   tmp/               downloads and unpacks in progress; emptied on open
//! ```
//! `tmp/` is on the same filesystem as `blobs/` and `layers/`, so a finished download or
//! unpack appears with one `rename`, never half-written.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tracing::warn;

use super::error::{Error, Result};
use super::reference::hex_of;

/// The store's directories.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    root: PathBuf,
}

impl Layout {
    /// Creates the directories (0700) if missing and empties `tmp/`.
    pub(crate) fn create(root: &Path) -> Result<Self> {
        let layout = Self { root: root.to_owned() };
        for dir in [root.to_owned(), layout.blobs(), layout.layers(), layout.tmp()] {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&dir)
                .map_err(Error::io("creating", &dir))?;
        }
        // The root may have existed with looser permissions; layers hold setuid binaries.
        fs::set_permissions(root, fs::Permissions::from_mode(0o700))
            .map_err(Error::io("chmod 0700", root))?;
        Ok(layout)
    }

    /// Removes what a crashed or cancelled pull left in `tmp/`; call with the lock held.
    pub(crate) fn clear_tmp(&self) -> Result<()> {
        let tmp = self.tmp();
        for entry in fs::read_dir(&tmp).map_err(Error::io("listing", &tmp))? {
            let path = entry.map_err(Error::io("listing", &tmp))?.path();
            force_remove(&path).map_err(Error::io("removing leftover", &path))?;
        }
        Ok(())
    }

    /// The store's root.
    pub(crate) fn root(&self) -> &Path {
        &self.root
    }

    /// `blobs/sha256`.
    pub(crate) fn blobs(&self) -> PathBuf {
        self.root.join("blobs").join("sha256")
    }

    /// `layers`.
    pub(crate) fn layers(&self) -> PathBuf {
        self.root.join("layers")
    }

    /// `tmp`.
    pub(crate) fn tmp(&self) -> PathBuf {
        self.root.join("tmp")
    }

    /// `index.json`.
    pub(crate) fn index(&self) -> PathBuf {
        self.root.join("index.json")
    }

    /// `.lock`.
    pub(crate) fn lock(&self) -> PathBuf {
        self.root.join(".lock")
    }

    /// Where blob `digest` (already checked) lives.
    pub(crate) fn blob(&self, digest: &str) -> PathBuf {
        self.blobs().join(hex_of(digest))
    }

    /// Where the layer with `diff_id` (already checked) is unpacked.
    pub(crate) fn layer(&self, diff_id: &str) -> PathBuf {
        self.layers().join(hex_of(diff_id))
    }

    /// A fresh, uniquely named directory under `tmp/`, removed when dropped unless kept.
    pub(crate) fn temp_dir(&self, prefix: &str) -> Result<TempTree> {
        let tmp = self.tmp();
        let dir = tempfile::Builder::new()
            .prefix(prefix)
            .tempdir_in(&tmp)
            .map_err(Error::io("creating a temp dir in", &tmp))?;
        Ok(TempTree(Some(dir.keep())))
    }
}

/// A directory tree under `tmp/` that is removed on drop (also when a pull fails or is
/// cancelled) unless [`TempTree::keep`] was called after it was renamed into place.
#[derive(Debug)]
pub(crate) struct TempTree(Option<PathBuf>);

impl TempTree {
    /// The directory.
    pub(crate) fn path(&self) -> &Path {
        self.0.as_deref().unwrap_or(Path::new(""))
    }

    /// Forgets the directory: it was moved and is no longer ours to remove.
    pub(crate) fn keep(mut self) {
        self.0 = None;
    }
}

impl Drop for TempTree {
    fn drop(&mut self) {
        if let Some(path) = self.0.take()
            && let Err(error) = force_remove(&path)
        {
            warn!(path = %path.display(), %error, "temp dir not removed");
        }
    }
}

/// Removes a file or a whole tree without following symlinks. Layers may hold directories
/// without write permission, which block `remove_dir_all` for a non-root user: on failure the
/// tree's directories are made writable and the removal is retried.
pub(crate) fn force_remove(path: &Path) -> io::Result<()> {
    let meta = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if !meta.is_dir() {
        return fs::remove_file(path);
    }
    match fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(_) => {
            make_dirs_writable(path)?;
            fs::remove_dir_all(path)
        }
    }
}

fn make_dirs_writable(dir: &Path) -> io::Result<()> {
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?;
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        // `file_type` does not follow symlinks.
        if entry.file_type()?.is_dir() {
            make_dirs_writable(&entry.path())?;
        }
    }
    Ok(())
}

/// Flushes a directory's entries (a rename into it) to disk.
pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    fs::File::open(dir).and_then(|d| d.sync_all()).map_err(Error::io("syncing", dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn force_remove_handles_read_only_dirs_and_symlinks() {
        let dir = tempfile::tempdir().expect("tempdir");
        let outside = dir.path().join("outside");
        fs::create_dir(&outside).expect("mkdir");
        fs::write(outside.join("keep"), "x").expect("write");
        let tree = dir.path().join("tree");
        fs::create_dir_all(tree.join("ro/sub")).expect("mkdir");
        fs::write(tree.join("ro/sub/f"), "x").expect("write");
        std::os::unix::fs::symlink(&outside, tree.join("ro/link")).expect("symlink");
        fs::set_permissions(tree.join("ro/sub"), fs::Permissions::from_mode(0o555)).expect("chmod");
        fs::set_permissions(tree.join("ro"), fs::Permissions::from_mode(0o555)).expect("chmod");
        force_remove(&tree).expect("removed");
        assert!(!tree.exists());
        assert!(outside.join("keep").exists(), "followed a symlink");
        force_remove(&tree).expect("absent is fine");
    }

    #[test]
    fn temp_trees_vanish_unless_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let layout = Layout::create(&dir.path().join("store")).expect("layout");
        let t = layout.temp_dir("x-").expect("temp");
        let path = t.path().to_owned();
        fs::write(path.join("f"), "x").expect("write");
        drop(t);
        assert!(!path.exists());
        let t = layout.temp_dir("x-").expect("temp");
        let path = t.path().to_owned();
        t.keep();
        assert!(path.exists());
        layout.clear_tmp().expect("clear");
        assert!(!path.exists());
    }
}
