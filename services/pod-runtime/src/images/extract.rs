//! Writing one layer's tar entries into a fresh directory, safely.
//!
//! The directory is new and ours alone, so checking with `lstat` and then acting is not racy.
//! Safety rests on three rules: an entry path is relative without `..`; every parent of an
//! entry must be a real directory of this layer (never a symlink, so no write goes through
//! one); the entry itself is created with calls that do not follow a final symlink
//! (`O_EXCL`, `symlink`, `mknod`, `linkat` without follow). Symlink targets may not climb
//! out of the layer root either, so the unpacked tree never points outside itself.
//!
//! Owners this bubble does not map, and device nodes it cannot make, are handled in
//! `owners.rs`: the entry stays ours with its intended owner recorded, a device is skipped.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs;
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use nix::sys::stat::{Mode, SFlag, UtimensatFlags, makedev, mknod, utimensat};
use nix::sys::time::TimeSpec;
use tar::EntryType;
use tracing::debug;

use super::error::{Error, Result};
use super::owners::{self, Unowned};
use super::whiteout;

/// Metadata of an entry, from its tar header.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Meta {
    pub(crate) mode: u32,
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    pub(crate) mtime: i64,
}

/// Writes entries under `root`, remembering what must be applied once all are written.
pub(crate) struct Extractor<'a> {
    pub(crate) root: &'a Path,
    pub(crate) layer: &'a str,
    as_root: bool,
    // Directory modes and times are applied last: a read-only directory would block its own
    // entries, and writing entries changes a directory's mtime.
    dirs: BTreeMap<PathBuf, (u32, Option<i64>)>,
    times: Vec<(PathBuf, i64)>,
    unowned: Unowned,
}

impl<'a> Extractor<'a> {
    /// An extractor into the empty directory `root` for the layer `layer` (its diff ID).
    pub(crate) fn new(root: &'a Path, layer: &'a str) -> Self {
        let as_root = nix::unistd::geteuid().is_root();
        Self { root, layer, as_root, dirs: BTreeMap::new(), times: Vec::new(), unowned: Unowned::default() }
    }

    /// Writes every entry of `archive`, then applies directory modes and all mtimes.
    pub(crate) fn run<R: Read>(mut self, archive: &mut tar::Archive<R>) -> Result<()> {
        let layer = self.layer;
        for entry in archive.entries().map_err(Error::unpack(layer, "reading", ""))? {
            let mut entry = entry.map_err(Error::unpack(layer, "reading", ""))?;
            self.entry(&mut entry)?;
        }
        self.finish()
    }

    fn entry<R: Read>(&mut self, entry: &mut tar::Entry<'_, R>) -> Result<()> {
        let kind = entry.header().entry_type();
        if matches!(kind, EntryType::XGlobalHeader | EntryType::XHeader) {
            return Ok(());
        }
        let raw = entry.path_bytes().into_owned();
        let shown = String::from_utf8_lossy(&raw).into_owned();
        let Some(rel) = self.safe_path(&raw, &shown)? else {
            return Ok(()); // the layer root itself; it is always 0755
        };
        let meta = self.meta(entry.header(), &shown)?;
        if let Some(name) = rel.file_name().and_then(|n| n.as_bytes().strip_prefix(b".wh.")) {
            return whiteout::apply(self, &rel, name, meta, &shown);
        }
        self.make_parents(&rel, &shown)?;
        let path = self.root.join(&rel);
        match kind {
            EntryType::Directory => self.directory(&rel, &path, meta, &shown),
            EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse => {
                self.file(entry, &rel, &path, meta, &shown)
            }
            EntryType::Symlink => {
                let target = entry.link_name_bytes().map(|t| t.into_owned()).unwrap_or_default();
                self.symlink(&rel, &path, &target, meta, &shown)
            }
            EntryType::Link => {
                let target = entry.link_name_bytes().map(|t| t.into_owned()).unwrap_or_default();
                self.hard_link(&path, &target, &shown)
            }
            EntryType::Char | EntryType::Block | EntryType::Fifo => {
                let (major, minor) = device_numbers(entry.header());
                self.device(kind, &rel, &path, makedev(major, minor), meta, &shown)
            }
            other => Err(Error::unpack(self.layer, "unpacking", &shown)(io::Error::other(format!(
                "unsupported tar entry type {other:?}"
            )))),
        }
    }

    fn meta(&self, header: &tar::Header, shown: &str) -> Result<Meta> {
        let err = || Error::unpack(self.layer, "reading the header of", shown);
        let id = |v: io::Result<u64>| {
            v.and_then(|v| u32::try_from(v).map_err(|_| io::Error::other("id above 2^32")))
        };
        Ok(Meta {
            mode: header.mode().map_err(err())? & 0o7777,
            uid: id(header.uid()).map_err(err())?,
            gid: id(header.gid()).map_err(err())?,
            mtime: header.mtime().map(|t| i64::try_from(t).unwrap_or(i64::MAX)).map_err(err())?,
        })
    }

    /// The entry's path relative to the layer root; `None` for the root itself.
    pub(crate) fn safe_path(&self, raw: &[u8], shown: &str) -> Result<Option<PathBuf>> {
        if raw.starts_with(b"/") {
            return Err(self.unsafe_path(shown, "absolute paths are not allowed in a layer"));
        }
        let mut rel = PathBuf::new();
        for part in raw.split(|b| *b == b'/') {
            match part {
                b"" | b"." => {}
                b".." => return Err(self.unsafe_path(shown, "`..` components are not allowed in a layer")),
                name => rel.push(OsStr::from_bytes(name)),
            }
        }
        Ok((!rel.as_os_str().is_empty()).then_some(rel))
    }

    pub(crate) fn unsafe_path(&self, shown: &str, reason: &'static str) -> Error {
        Error::UnsafePath { layer: self.layer.to_owned(), path: shown.to_owned(), reason }
    }

    /// Makes sure every parent of `rel` is a real directory, creating missing ones.
    pub(crate) fn make_parents(&mut self, rel: &Path, shown: &str) -> Result<()> {
        let mut cur = PathBuf::new();
        for part in rel.parent().into_iter().flat_map(Path::components) {
            cur.push(part);
            let path = self.root.join(&cur);
            match fs::symlink_metadata(&path) {
                Ok(m) if m.file_type().is_dir() => {}
                Ok(_) => return Err(self.unsafe_path(shown, "a parent is a symlink or not a directory")),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    mkdir(&path).map_err(Error::unpack(self.layer, "creating the parent of", shown))?;
                    self.dirs.entry(cur.clone()).or_insert((0o755, None));
                }
                Err(e) => return Err(Error::unpack(self.layer, "inspecting the parent of", shown)(e)),
            }
        }
        Ok(())
    }

    /// Removes whatever is at `path` (a later entry replaces an earlier one), except a
    /// directory when `keep_dir`.
    pub(crate) fn clear(&self, path: &Path, keep_dir: bool, shown: &str) -> Result<bool> {
        match fs::symlink_metadata(path) {
            Ok(m) if keep_dir && m.file_type().is_dir() => Ok(true),
            Ok(_) => super::layout::force_remove(path).map(|()| false).map_err(Error::unpack(
                self.layer,
                "replacing",
                shown,
            )),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(Error::unpack(self.layer, "inspecting", shown)(e)),
        }
    }

    fn directory(&mut self, rel: &Path, path: &Path, meta: Meta, shown: &str) -> Result<()> {
        if self.clear(path, true, shown)? {
            // Declared again: the owner it is given now is the one that counts.
            owners::forget(path);
        } else {
            mkdir(path).map_err(Error::unpack(self.layer, "creating", shown))?;
        }
        self.chown(path, meta, shown)?;
        self.dirs.insert(rel.to_owned(), (meta.mode, Some(meta.mtime)));
        Ok(())
    }

    fn file<R: Read>(
        &mut self,
        data: &mut R,
        rel: &Path,
        path: &Path,
        meta: Meta,
        shown: &str,
    ) -> Result<()> {
        self.clear(path, false, shown)?;
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(Error::unpack(self.layer, "creating", shown))?;
        io::copy(data, &mut file).map_err(Error::unpack(self.layer, "writing", shown))?;
        // chown before chmod: chown clears setuid and setgid bits.
        if let Err(e) = std::os::unix::fs::fchown(&file, Some(meta.uid), Some(meta.gid)) {
            self.chown_failed(e, path, meta, shown)?;
        }
        file.set_permissions(fs::Permissions::from_mode(meta.mode)).map_err(Error::unpack(
            self.layer,
            "setting the mode of",
            shown,
        ))?;
        self.times.push((rel.to_owned(), meta.mtime));
        Ok(())
    }

    fn symlink(&mut self, rel: &Path, path: &Path, target: &[u8], meta: Meta, shown: &str) -> Result<()> {
        if target.is_empty() {
            return Err(self.unsafe_path(shown, "symlink without a target"));
        }
        // Depth of the directory the target is resolved from; an absolute target starts at the
        // layer root, which is the container's root.
        let mut depth = if target.starts_with(b"/") { 0 } else { rel.components().count() - 1 };
        for part in target.split(|b| *b == b'/') {
            match part {
                b"" | b"." => {}
                b".." => {
                    depth = depth.checked_sub(1).ok_or_else(|| {
                        self.unsafe_path(shown, "symlink target climbs out of the layer root")
                    })?;
                }
                _ => depth += 1,
            }
        }
        self.clear(path, false, shown)?;
        std::os::unix::fs::symlink(OsStr::from_bytes(target), path).map_err(Error::unpack(
            self.layer,
            "creating symlink",
            shown,
        ))?;
        self.chown(path, meta, shown)?;
        self.times.push((rel.to_owned(), meta.mtime));
        Ok(())
    }

    fn hard_link(&mut self, path: &Path, target: &[u8], shown: &str) -> Result<()> {
        let target_shown = String::from_utf8_lossy(target).into_owned();
        let Some(target_rel) = self.safe_path(target, &target_shown)? else {
            return Err(self.unsafe_path(shown, "hard link to the layer root"));
        };
        let target_path = self.root.join(&target_rel);
        if !self.is_real_path(&target_rel) || target_path.is_dir() {
            return Err(self.unsafe_path(shown, "hard link target is not a file earlier in this layer"));
        }
        if target_path == path {
            return Ok(());
        }
        self.clear(path, false, shown)?;
        // std's hard_link is linkat without AT_SYMLINK_FOLLOW: a symlink target is linked
        // itself, never followed.
        fs::hard_link(&target_path, path).map_err(Error::unpack(self.layer, "creating hard link", shown))
    }

    fn device(
        &mut self,
        kind: EntryType,
        rel: &Path,
        path: &Path,
        dev: u64,
        meta: Meta,
        shown: &str,
    ) -> Result<()> {
        let flag = match kind {
            EntryType::Char => SFlag::S_IFCHR,
            EntryType::Block => SFlag::S_IFBLK,
            _ => SFlag::S_IFIFO,
        };
        self.clear(path, false, shown)?;
        match mknod(path, flag, Mode::from_bits_truncate(meta.mode), dev) {
            Ok(()) => {}
            // Without root, or as root of a user namespace (a bubble), devices cannot be made;
            // containerd skips them the same way. FIFOs can always be made.
            Err(nix::errno::Errno::EPERM) if flag != SFlag::S_IFIFO => {
                self.unowned.device_skipped(shown);
                return Ok(());
            }
            Err(e) => return Err(Error::unpack(self.layer, "creating device", shown)(e.into())),
        }
        self.chown(path, meta, shown)?;
        // mknod applied the umask; the mode asked for is set after the owner, as for files.
        fs::set_permissions(path, fs::Permissions::from_mode(meta.mode)).map_err(Error::unpack(
            self.layer,
            "setting the mode of",
            shown,
        ))?;
        self.times.push((rel.to_owned(), meta.mtime));
        Ok(())
    }

    /// Sets the owner of `path` itself (never a symlink's target).
    pub(crate) fn chown(&mut self, path: &Path, meta: Meta, shown: &str) -> Result<()> {
        match std::os::unix::fs::lchown(path, Some(meta.uid), Some(meta.gid)) {
            Ok(()) => Ok(()),
            Err(e) => self.chown_failed(e, path, meta, shown),
        }
    }

    fn chown_failed(&mut self, e: io::Error, path: &Path, meta: Meta, shown: &str) -> Result<()> {
        use nix::errno::Errno;
        match e.raw_os_error().map(Errno::from_raw) {
            // Without root, files stay ours: the numbers cannot be kept, and that is expected.
            Some(Errno::EPERM) if !self.as_root => Ok(()),
            // The ID is not mapped in this user namespace (a bubble of one ID): the entry stays
            // ours, its owner is recorded (see `owners.rs`).
            Some(Errno::EINVAL) => self.unowned.keep(path, meta).map_err(Error::unpack(
                self.layer,
                "recording the owner of",
                shown,
            )),
            _ => Err(Error::unpack(self.layer, "setting the owner of", shown)(e)),
        }
    }

    /// Whether `rel` exists and neither it nor a parent is a symlink.
    fn is_real_path(&self, rel: &Path) -> bool {
        let mut cur = self.root.to_path_buf();
        let parts: Vec<Component<'_>> = rel.components().collect();
        for (i, part) in parts.iter().enumerate() {
            cur.push(part);
            match fs::symlink_metadata(&cur) {
                Ok(m) if i + 1 == parts.len() || m.file_type().is_dir() => {}
                _ => return false,
            }
        }
        true
    }

    /// Applies mtimes, then directory modes deepest first (a directory without `x` would hide
    /// its children from a non-root user).
    fn finish(mut self) -> Result<()> {
        for (rel, mtime) in std::mem::take(&mut self.times) {
            // A later entry may have replaced this one, or a parent, with a symlink.
            if self.is_real_path(&rel) {
                self.set_mtime(&rel, mtime)?;
            }
        }
        let mut dirs: Vec<_> = std::mem::take(&mut self.dirs).into_iter().collect();
        dirs.sort_by_key(|(rel, _)| std::cmp::Reverse(rel.components().count()));
        for (rel, (mode, mtime)) in dirs {
            let path = self.root.join(&rel);
            let is_dir = fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_dir());
            if !is_dir || !self.is_real_path(&rel) {
                continue;
            }
            let shown = rel.display().to_string();
            fs::set_permissions(&path, fs::Permissions::from_mode(mode)).map_err(Error::unpack(
                self.layer,
                "setting the mode of",
                &shown,
            ))?;
            if let Some(mtime) = mtime {
                self.set_mtime(&rel, mtime)?;
            }
        }
        fs::set_permissions(self.root, fs::Permissions::from_mode(0o755)).map_err(Error::unpack(
            self.layer,
            "setting the mode of",
            "/",
        ))?;
        self.unowned.report(self.layer);
        debug!(layer = self.layer, "layer entries written");
        Ok(())
    }

    fn set_mtime(&self, rel: &Path, mtime: i64) -> Result<()> {
        let t = TimeSpec::new(mtime, 0);
        let path = self.root.join(rel);
        utimensat(nix::fcntl::AT_FDCWD, &path, &t, &t, UtimensatFlags::NoFollowSymlink).map_err(|e| {
            Error::unpack(self.layer, "setting the mtime of", &rel.display().to_string())(e.into())
        })
    }
}

fn mkdir(path: &Path) -> io::Result<()> {
    fs::DirBuilder::new().mode(0o700).create(path)
}

fn device_numbers(header: &tar::Header) -> (u64, u64) {
    let major = header.device_major().ok().flatten().unwrap_or(0);
    let minor = header.device_minor().ok().flatten().unwrap_or(0);
    (u64::from(major), u64::from(minor))
}
