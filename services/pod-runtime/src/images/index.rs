//! The index of images: `index.json`, read on open and replaced atomically on every change.

use std::collections::{BTreeMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::error::{Error, Result};
use super::layout::{Layout, sync_dir};
use super::record::ImageRecord;
use super::reference::{Lookup, hex_of};

/// The version of the file's shape; a store refuses files of another.
const VERSION: u32 = 1;

#[derive(Serialize, Deserialize)]
struct IndexFile {
    version: u32,
    images: Vec<ImageRecord>,
}

/// The images, by ID, as last written to disk.
#[derive(Debug)]
pub(crate) struct Index {
    path: PathBuf,
    tmp: PathBuf,
    images: BTreeMap<String, ImageRecord>,
}

impl Index {
    /// Reads the index; a store without one is empty. A file that does not parse is an error,
    /// never silently replaced: it names what the store holds.
    pub(crate) fn load(layout: &Layout) -> Result<Self> {
        let path = layout.index();
        let images = match std::fs::read(&path) {
            Ok(bytes) => {
                let file: IndexFile = serde_json::from_slice(&bytes)
                    .map_err(|e| Error::Index { path: path.clone(), source: Arc::new(e) })?;
                if file.version != VERSION {
                    return Err(Error::BadManifest {
                        what: "image index",
                        digest: path.display().to_string(),
                        reason: format!("version {}, this store reads {VERSION}", file.version),
                    });
                }
                file.images.into_iter().map(|r| (r.id.clone(), r)).collect()
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => return Err(Error::io("reading", &path)(e)),
        };
        Ok(Self { path, tmp: layout.tmp(), images })
    }

    /// Every image.
    pub(crate) fn images(&self) -> impl Iterator<Item = &ImageRecord> {
        self.images.values()
    }

    /// The image `lookup` names.
    pub(crate) fn find(&self, lookup: &Lookup) -> Option<&ImageRecord> {
        match lookup {
            Lookup::Id(id) => self.images.get(id),
            Lookup::Tag(name) => self.images().find(|r| r.repo_tags.contains(name)),
            Lookup::Digest(name) => self.images().find(|r| r.repo_digests.contains(name)),
        }
    }

    /// Adds `record`, merging names if its ID is already known; a tag moves to the new image.
    /// Returns the record as stored. The file is written before memory changes, so a failed
    /// write leaves both as they were.
    pub(crate) fn add(&mut self, record: ImageRecord) -> Result<ImageRecord> {
        let mut next = self.images.clone();
        for other in next.values_mut().filter(|r| r.id != record.id) {
            other.repo_tags.retain(|t| !record.repo_tags.contains(t));
        }
        let stored = match next.remove(&record.id) {
            Some(mut old) => {
                merge(&mut old.repo_tags, record.repo_tags);
                merge(&mut old.repo_digests, record.repo_digests);
                merge(&mut old.content, record.content);
                ImageRecord {
                    repo_tags: old.repo_tags,
                    repo_digests: old.repo_digests,
                    content: old.content,
                    ..record
                }
            }
            None => record,
        };
        next.insert(stored.id.clone(), stored.clone());
        self.replace(next)?;
        Ok(stored)
    }

    /// Drops image `id`; returns it, or `None` if it was not there.
    pub(crate) fn remove(&mut self, id: &str) -> Result<Option<ImageRecord>> {
        let mut next = self.images.clone();
        let removed = next.remove(id);
        if removed.is_some() {
            self.replace(next)?;
        }
        Ok(removed)
    }

    /// The blob hexes and layer hexes some image still needs.
    pub(crate) fn referenced(&self) -> (HashSet<String>, HashSet<String>) {
        let blobs = self.images().flat_map(|r| &r.content).map(|d| hex_of(d).to_owned()).collect();
        let layers = self.images().flat_map(|r| &r.diff_ids).map(|d| hex_of(d).to_owned()).collect();
        (blobs, layers)
    }

    fn replace(&mut self, next: BTreeMap<String, ImageRecord>) -> Result<()> {
        let file = IndexFile { version: VERSION, images: next.values().cloned().collect() };
        write_atomic(&self.path, &self.tmp, &file)?;
        self.images = next;
        Ok(())
    }
}

fn merge(into: &mut Vec<String>, more: Vec<String>) {
    for m in more {
        if !into.contains(&m) {
            into.push(m);
        }
    }
}

/// Writes `value` as JSON to a temp file, syncs it, and renames it over `path`.
fn write_atomic(path: &Path, tmp_dir: &Path, value: &IndexFile) -> Result<()> {
    let json = serde_json::to_vec_pretty(value)
        .map_err(|e| Error::Index { path: path.to_owned(), source: Arc::new(e) })?;
    let mut tmp = tempfile::Builder::new()
        .prefix("index-")
        .tempfile_in(tmp_dir)
        .map_err(Error::io("creating a temp file in", tmp_dir))?;
    tmp.write_all(&json).and_then(|()| tmp.as_file().sync_all()).map_err(Error::io("writing", tmp.path()))?;
    tmp.persist(path).map_err(|e| Error::io("replacing", path)(e.error))?;
    sync_dir(path.parent().unwrap_or(Path::new("/")))
}
