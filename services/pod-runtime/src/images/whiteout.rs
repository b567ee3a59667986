//! OCI whiteouts in the form overlayfs reads when mounted with `userxattr`.
//!
//! `.wh.<name>` (delete `<name>` of the layers below) becomes a 0/0 character device named
//! `<name>`; `.wh..wh..opq` (hide everything below in this directory) becomes the xattr
//! `user.overlay.opaque=y` on the directory. The runtime mounts overlays with `userxattr` so
//! that this works inside a user namespace; `trusted.overlay.*` would need real root and is
//! not written.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::errno::Errno;
use nix::sys::stat::{Mode, SFlag, makedev, mknod};
use tracing::debug;

use super::error::{Error, Result};
use super::extract::{Extractor, Meta};

/// The xattr that marks a directory opaque for overlayfs with `userxattr`.
pub const OPAQUE_XATTR: &str = "user.overlay.opaque";
/// The file name of an opaque marker, `.wh..wh..opq`, without its `.wh.` prefix.
const OPAQUE: &[u8] = b".wh..opq";

/// Applies the whiteout entry `rel`, whose file name is `.wh.` + `name`.
pub(crate) fn apply(x: &mut Extractor<'_>, rel: &Path, name: &[u8], meta: Meta, shown: &str) -> Result<()> {
    x.make_parents(rel, shown)?;
    let dir = x.root.join(rel.parent().unwrap_or(Path::new("")));
    if name == OPAQUE {
        return xattr::set(&dir, OPAQUE_XATTR, b"y").map_err(Error::unpack(x.layer, "marking opaque", shown));
    }
    if name.starts_with(b".wh.") {
        // Other `.wh..wh.` names are aufs bookkeeping (hard-link dirs); overlayfs has no use
        // for them.
        debug!(layer = x.layer, path = shown, "aufs metadata skipped");
        return Ok(());
    }
    if name.is_empty() || name == b"." || name == b".." {
        return Err(x.unsafe_path(shown, "whiteout names no file"));
    }
    let path = dir.join(OsStr::from_bytes(name));
    x.clear(&path, false, shown)?;
    match mknod(&path, SFlag::S_IFCHR, Mode::empty(), makedev(0, 0)) {
        Ok(()) => x.chown(&path, meta, shown),
        Err(source @ (Errno::EPERM | Errno::EACCES)) => {
            Err(Error::WhiteoutNotPermitted { layer: x.layer.to_owned(), path: shown.to_owned(), source })
        }
        Err(e) => Err(Error::unpack(x.layer, "creating whiteout", shown)(e.into())),
    }
}
