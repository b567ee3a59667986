//! Mount sources inside a volume, opened without following links and bound from the open file
//! (review H4, the CVE-2021-25741 class).
//!
//! A subPath is a path inside a volume that a container sharing the volume may change. Checking
//! the path and then handing it to crun leaves a window in which such a container swaps a
//! component for a link to `/`, and crun, resolving the path again, follows it. Here the path is
//! walked one component at a time, each opened relative to the one before with
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`, so a link anywhere is refused (missing
//! directories are made with `mkdirat` on the way, 0755). The file found is then bound from its
//! descriptor (`open_tree` + `move_mount`) onto a staging point in the container's directory,
//! which only the runtime writes; crun binds that staging point, and no rename in the volume can
//! change what it shows.

use std::fs::{self, DirBuilder, OpenOptions};
use std::io::ErrorKind;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};

use rustix::fs::{CWD, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;
use rustix::mount::{MoveMountFlags, OpenTreeFlags, UnmountFlags};

use super::{Error, Result};

/// How often a component is tried again when a rename elsewhere made `openat2` give up.
const RETRIES: usize = 8;

/// A file or directory found beneath a volume's root without following a link, held open (an
/// `O_PATH` descriptor) so that what it names cannot change until it is pinned.
#[derive(Debug)]
pub struct Beneath {
    fd: OwnedFd,
    dir: bool,
    /// `root/relative`, for messages.
    shown: PathBuf,
}

/// Opens `relative` beneath the directory `root` (itself opened as given, links followed: it is
/// the volume, named by the kubelet). No component of `relative` may be a link, `..` or
/// absolute; a missing one is created as a directory (0755), as the kubelet creates a missing
/// subPath.
pub fn open_beneath(root: &Path, relative: &Path) -> Result<Beneath> {
    let shown = root.join(relative);
    let escapes = relative.components().any(|c| !matches!(c, Component::Normal(_)));
    if escapes {
        return Err(Error::PathEscapes { path: relative.display().to_string(), base: root.to_owned() });
    }
    let mut current =
        rustix::fs::open(root, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
            .map_err(|e| Error::io("open the volume", root, e.into()))?;
    let mut dir = true;
    let parts: Vec<_> = relative.components().collect();
    for (i, part) in parts.iter().enumerate() {
        let Component::Normal(name) = part else { continue };
        let last = i + 1 == parts.len();
        let at = || parts[..=i].iter().collect::<PathBuf>().display().to_string();
        let (next, is_dir) = open_component(&current, name, last).map_err(|failure| match failure {
            Failure::Link(found) => Error::SubPathLink {
                root: root.to_owned(),
                path: relative.display().to_string(),
                at: at(),
                found,
            },
            Failure::Io(action, e) => Error::io(action, root.join(at()), e),
        })?;
        current = next;
        dir = is_dir;
    }
    Ok(Beneath { fd: current, dir, shown })
}

/// Why one component could not be opened.
enum Failure {
    /// It is a link (or a file where a directory must be): what it is, in words.
    Link(&'static str),
    /// Any other error, with what was being done.
    Io(&'static str, std::io::Error),
}

/// Opens `name` in `parent` without following it (it must be a directory unless it is the
/// `last` component), creating it as a directory when missing. Returns it and whether it is one.
fn open_component(parent: &OwnedFd, name: &std::ffi::OsStr, last: bool) -> Result<(OwnedFd, bool), Failure> {
    let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
    // Not O_DIRECTORY: what the component is comes from the descriptor itself, not from a
    // second look that a swap may already have made wrong.
    let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    for _ in 0..RETRIES {
        match rustix::fs::openat2(parent, name, flags, Mode::empty(), resolve) {
            Ok(fd) => {
                // O_PATH | O_NOFOLLOW opens a link itself rather than failing.
                let kind = kind_of(&fd).map_err(|e| Failure::Io("inspect", e.into()))?;
                return match kind {
                    FileType::Symlink => Err(Failure::Link("a symbolic link")),
                    FileType::Directory => Ok((fd, true)),
                    _ if last => Ok((fd, false)),
                    _ => Err(Failure::Link("not a directory")),
                };
            }
            Err(Errno::NOENT) => match rustix::fs::mkdirat(parent, name, Mode::from_raw_mode(0o755)) {
                Ok(()) => return made_dir(parent, name),
                // Made meanwhile by someone else: open whatever it is.
                Err(Errno::EXIST) => continue,
                Err(e) => return Err(Failure::Io("create", e.into())),
            },
            // Not expected with O_PATH | O_NOFOLLOW on one component, but a link all the same.
            Err(Errno::LOOP) => return Err(Failure::Link("a symbolic link")),
            Err(Errno::AGAIN | Errno::INTR) => continue,
            Err(e) => return Err(Failure::Io("open", e.into())),
        }
    }
    Err(Failure::Io("open", std::io::Error::other("it kept changing while being opened")))
}

/// Opens the directory just made and gives it 0755 whatever the umask took away.
fn made_dir(parent: &OwnedFd, name: &std::ffi::OsStr) -> Result<(OwnedFd, bool), Failure> {
    let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = match rustix::fs::openat2(parent, name, flags, Mode::empty(), resolve) {
        Ok(fd) => fd,
        // Replaced by a link or a file between mkdirat and here.
        Err(Errno::LOOP | Errno::NOTDIR) => return Err(Failure::Link("no longer the directory just made")),
        Err(e) => return Err(Failure::Io("open", e.into())),
    };
    rustix::fs::fchmod(&fd, Mode::from_raw_mode(0o755)).map_err(|e| Failure::Io("chmod", e.into()))?;
    Ok((fd, true))
}

fn kind_of(fd: &OwnedFd) -> rustix::io::Result<FileType> {
    rustix::fs::fstat(fd).map(|s| FileType::from_raw_mode(s.st_mode))
}

impl Beneath {
    /// Whether it is a directory.
    pub fn is_dir(&self) -> bool {
        self.dir
    }

    /// Its device and inode numbers.
    pub fn identity(&self) -> Result<(u64, u64)> {
        let stat = rustix::fs::fstat(&self.fd).map_err(|e| Error::io("inspect", &self.shown, e.into()))?;
        Ok((stat.st_dev, stat.st_ino))
    }

    /// Binds what it holds (with the mounts below it) onto `staging`, made here as a directory
    /// or an empty file to match. `staging` must not exist; on error it is gone again.
    pub fn pin(&self, staging: &Path) -> Result<()> {
        let made = if self.dir {
            DirBuilder::new().mode(0o700).create(staging)
        } else {
            OpenOptions::new().write(true).create_new(true).mode(0o600).open(staging).map(drop)
        };
        made.map_err(|e| Error::io("create the staging point", staging, e))?;
        let bound = rustix::mount::open_tree(
            &self.fd,
            "",
            OpenTreeFlags::OPEN_TREE_CLONE
                | OpenTreeFlags::OPEN_TREE_CLOEXEC
                | OpenTreeFlags::AT_EMPTY_PATH
                | OpenTreeFlags::AT_RECURSIVE,
        )
        .and_then(|tree| {
            rustix::mount::move_mount(&tree, "", CWD, staging, MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH)
        });
        if let Err(e) = bound {
            let _ = remove_point(staging);
            return Err(Error::io("bind (from its descriptor)", &self.shown, e.into()));
        }
        Ok(())
    }
}

/// Unmounts the staging point `staging` (detached, so nothing reaches the volume through it any
/// more) and removes it; neither mounted nor present is fine. Never removes more than the empty
/// point itself: if something is still mounted there, that is an error.
pub fn unpin(staging: &Path) -> Result<()> {
    match rustix::mount::unmount(staging, UnmountFlags::DETACH | UnmountFlags::NOFOLLOW) {
        // Not a mount point (never pinned, or pinned in a mount namespace that is gone).
        Ok(()) | Err(Errno::INVAL | Errno::NOENT) => {}
        Err(e) => return Err(Error::io("unmount", staging, e.into())),
    }
    remove_point(staging).map_err(|e| Error::io("remove", staging, e))
}

fn remove_point(path: &Path) -> std::io::Result<()> {
    let removed = match fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => fs::remove_dir(path),
        Ok(_) => fs::remove_file(path),
        Err(e) => Err(e),
    };
    match removed {
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};

    use super::*;

    fn volume() -> (tempfile::TempDir, PathBuf) {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path().join("vol");
        fs::create_dir(&root).expect("mkdir");
        (tmp, root)
    }

    fn identity_of(path: &Path) -> (u64, u64) {
        let meta = fs::metadata(path).expect("stat");
        (meta.dev(), meta.ino())
    }

    #[test]
    fn existing_paths_open_and_missing_directories_are_made() {
        let (_tmp, root) = volume();
        fs::create_dir_all(root.join("a/b")).expect("mkdir");
        fs::write(root.join("a/b/file"), "x").expect("write");
        let file = open_beneath(&root, Path::new("a/b/file")).expect("file");
        assert!(!file.is_dir());
        assert_eq!(file.identity().expect("id"), identity_of(&root.join("a/b/file")));
        let dir = open_beneath(&root, Path::new("a/b")).expect("dir");
        assert!(dir.is_dir());

        let made = open_beneath(&root, Path::new("a/new/deeper")).expect("made");
        assert!(made.is_dir());
        for path in [root.join("a/new"), root.join("a/new/deeper")] {
            let meta = fs::symlink_metadata(&path).expect("made");
            assert!(meta.is_dir(), "{}", path.display());
            assert_eq!(meta.permissions().mode() & 0o777, 0o755, "{}", path.display());
        }
        assert_eq!(made.identity().expect("id"), identity_of(&root.join("a/new/deeper")));
    }

    #[test]
    fn links_anywhere_on_the_path_are_refused() {
        let (tmp, root) = volume();
        let outside = tmp.path().join("outside");
        fs::create_dir_all(outside.join("x")).expect("mkdir");
        fs::create_dir_all(root.join("real/x")).expect("mkdir");
        symlink(&outside, root.join("out")).expect("link");
        symlink("real", root.join("inside")).expect("link");
        symlink("/", root.join("slash")).expect("link");
        fs::write(root.join("file"), "x").expect("write");
        for (path, at, found) in [
            ("out/x", "out", "a symbolic link"),
            ("inside/x", "inside", "a symbolic link"),
            ("slash/etc", "slash", "a symbolic link"),
            ("slash", "slash", "a symbolic link"),
            ("real/x/../../out", "", ""),
            ("file/x", "file", "not a directory"),
        ] {
            let err = open_beneath(&root, Path::new(path)).expect_err(path);
            match (&err, found) {
                (Error::SubPathLink { at: a, found: f, .. }, _) => {
                    assert_eq!((a.as_str(), *f), (at, found), "{path}: {err}");
                }
                (Error::PathEscapes { .. }, "") => {}
                _ => panic!("{path}: {err:?}"),
            }
        }
        let err = open_beneath(&root, Path::new("out/x")).expect_err("link");
        assert!(err.to_string().contains("\"out\" is a symbolic link"), "{err}");
        assert!(!outside.join("x/new").exists());
        assert!(matches!(open_beneath(&root, Path::new("/etc")), Err(Error::PathEscapes { .. })));
        assert!(
            matches!(open_beneath(&tmp.path().join("gone"), Path::new("x")), Err(Error::Io { .. })),
            "a missing volume is an error"
        );
    }

    #[test]
    fn nothing_is_created_through_a_link() {
        let (tmp, root) = volume();
        let outside = tmp.path().join("outside");
        fs::create_dir(&outside).expect("mkdir");
        symlink(&outside, root.join("d")).expect("link");
        assert!(open_beneath(&root, Path::new("d/new")).is_err());
        assert_eq!(fs::read_dir(&outside).expect("read").count(), 0, "made nothing outside");
    }
}
