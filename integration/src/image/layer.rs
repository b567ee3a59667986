//! Layers: entries collected by path, written as a deterministic gzip'd tar.

use super::*;

/// A built layer: the gzip'd tar blob and the digest of the uncompressed tar (its diff ID).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layer {
    /// The compressed layer as pushed.
    pub blob: Blob,
    /// The sha256 of the uncompressed tar, as listed in the config's `rootfs.diff_ids`.
    pub diff_id: Digest,
}

#[derive(Debug, Clone)]
enum Entry {
    Dir { mode: u32 },
    File { data: Vec<u8>, mode: u32 },
    Symlink { target: String },
}

/// Collects a layer's entries; [`LayerBuilder::build`] writes them as a deterministic tar.gz.
///
/// Paths are relative to the image root (a leading `/` is ignored). Missing parent
/// directories are added with mode 0755.
#[derive(Debug, Clone, Default)]
pub struct LayerBuilder {
    // Sorted by path, so a parent always comes before its children and the tar is reproducible.
    entries: BTreeMap<String, Entry>,
    // Owners other than root (uid, gid), by path.
    owners: BTreeMap<String, (u32, u32)>,
}

impl LayerBuilder {
    /// An empty layer.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a directory.
    pub fn dir(&mut self, path: &str, mode: u32) -> Result<&mut Self> {
        self.insert(path, Entry::Dir { mode })
    }

    /// Adds a regular file.
    pub fn file(&mut self, path: &str, data: impl Into<Vec<u8>>, mode: u32) -> Result<&mut Self> {
        let data = data.into();
        self.insert(path, Entry::File { data, mode })
    }

    /// Adds a symbolic link pointing at `target` (taken verbatim, as `ln -s` would).
    pub fn symlink(&mut self, path: &str, target: &str) -> Result<&mut Self> {
        let target = target.to_owned();
        self.insert(path, Entry::Symlink { target })
    }

    /// Makes an entry added before owned by `uid`:`gid` (entries are root's otherwise), as
    /// real images have files of other users (nginx's 101, postgres' 999 …).
    pub fn chown(&mut self, path: &str, uid: u32, gid: u32) -> Result<&mut Self> {
        let path = normalize(path)?;
        if !self.entries.contains_key(&path) {
            return Err(Error::InvalidPath { path, reason: "chown of a path the layer does not have" });
        }
        self.owners.insert(path, (uid, gid));
        Ok(self)
    }

    fn insert(&mut self, path: &str, entry: Entry) -> Result<&mut Self> {
        let path = normalize(path)?;
        if self.entries.contains_key(&path) {
            return Err(Error::DuplicatePath { path });
        }
        self.entries.insert(path, entry);
        Ok(self)
    }

    /// Writes the tar (mtime 0, owners root unless [`Self::chown`]ed, sorted), hashes it, and
    /// gzips it.
    pub fn build(&self) -> Result<Layer> {
        let entries = self.with_parents()?;
        let mut tar = tar::Builder::new(Vec::new());
        for (path, entry) in &entries {
            let owner = self.owners.get(path).copied().unwrap_or((0, 0));
            append(&mut tar, path, entry, owner).map_err(|source| Error::Archive {
                action: "writing",
                path: path.clone(),
                source,
            })?;
        }
        let archive_err = |source| Error::Archive { action: "finishing", path: String::new(), source };
        let uncompressed = tar.into_inner().map_err(archive_err)?;
        let diff_id = Digest::of(&uncompressed);
        // A fixed mtime in the gzip header too; flate2 writes a fixed OS byte.
        let mut gz = flate2::GzBuilder::new().mtime(0).write(Vec::new(), Compression::default());
        gz.write_all(&uncompressed).map_err(archive_err)?;
        let compressed = gz.finish().map_err(archive_err)?;
        Ok(Layer { blob: Blob::new(OCI_LAYER_GZIP, compressed), diff_id })
    }

    /// The entries plus every missing parent directory; a parent that is not a directory is
    /// an error, since the tar would not unpack.
    fn with_parents(&self) -> Result<BTreeMap<String, Entry>> {
        let mut all = self.entries.clone();
        for path in self.entries.keys() {
            let mut parent = path.as_str();
            while let Some((p, _)) = parent.rsplit_once('/') {
                parent = p;
                match all.get(parent) {
                    None => {
                        all.insert(parent.to_owned(), Entry::Dir { mode: 0o755 });
                    }
                    Some(Entry::Dir { .. }) => {}
                    Some(_) => {
                        return Err(Error::ParentNotDirectory {
                            path: path.clone(),
                            parent: parent.to_owned(),
                        });
                    }
                }
            }
        }
        Ok(all)
    }
}

/// `a/b/c` from `/a/b/c` or `a/b/c/`; refuses anything that could escape the image root.
fn normalize(path: &str) -> Result<String> {
    let bad = |reason| Error::InvalidPath { path: path.to_owned(), reason };
    let trimmed = path.trim_start_matches('/').trim_end_matches('/');
    if trimmed.is_empty() {
        return Err(bad("empty, or the image root itself"));
    }
    for part in trimmed.split('/') {
        match part {
            "" => return Err(bad("empty component")),
            "." | ".." => return Err(bad("`.` and `..` are not allowed")),
            _ => {}
        }
    }
    Ok(trimmed.to_owned())
}

fn append(
    tar: &mut tar::Builder<Vec<u8>>,
    path: &str,
    entry: &Entry,
    (uid, gid): (u32, u32),
) -> io::Result<()> {
    let mut header = tar::Header::new_gnu();
    header.set_mtime(0);
    header.set_uid(u64::from(uid));
    header.set_gid(u64::from(gid));
    header.set_size(0);
    match entry {
        Entry::Dir { mode } => {
            header.set_entry_type(tar::EntryType::Directory);
            header.set_mode(*mode);
            tar.append_data(&mut header, format!("{path}/"), io::empty())
        }
        Entry::File { data, mode } => {
            header.set_entry_type(tar::EntryType::Regular);
            header.set_mode(*mode);
            header.set_size(data.len() as u64);
            tar.append_data(&mut header, path, data.as_slice())
        }
        Entry::Symlink { target } => {
            header.set_entry_type(tar::EntryType::Symlink);
            header.set_mode(0o777);
            tar.append_link(&mut header, path, target)
        }
    }
}
