//! Identifying a pod's network namespace, so a restarted net-forwarder can tell whether the
//! namespace it recorded still exists or was replaced by another at the same path.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// The (device, inode) of an nsfs file: the identity of a namespace for as long as it exists.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetnsId {
    /// `st_dev` of the namespace file.
    pub dev: u64,
    /// `st_ino` of the namespace file: the namespace's inode number.
    pub ino: u64,
}

impl NetnsId {
    /// The identity of an open namespace file.
    pub fn of(file: &File) -> std::io::Result<Self> {
        let meta = file.metadata()?;
        Ok(NetnsId { dev: meta.dev(), ino: meta.ino() })
    }

    /// Whether `path` still names this namespace (false when it is gone or another one).
    pub fn is_at(&self, path: &Path) -> bool {
        std::fs::metadata(path).is_ok_and(|m| m.dev() == self.dev && m.ino() == self.ino)
    }
}
