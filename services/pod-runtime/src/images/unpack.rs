//! Unpacking a layer blob into `layers/<diff-id>/`: once, verified, and atomically.

use std::fs::{self, File};
use std::io::{self, BufRead, BufReader, Read};
use std::os::fd::AsFd;
use std::path::Path;

use flate2::bufread::MultiGzDecoder;
use sha2::{Digest as _, Sha256};
use tracing::{debug, info};

use super::error::{Error, Result};
use super::extract::Extractor;
use super::layout::{Layout, sync_dir};

/// The gzip magic bytes; layers are sniffed rather than trusted by media type, since
/// registries and tools disagree on the Docker and OCI names.
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// Unpacks the layer in `blob` to `layers/<hex of diff_id>` unless it is already there.
/// Returns whether this call unpacked it.
///
/// Entries go to a temp dir under `tmp/`; the uncompressed stream must hash to `diff_id`; only
/// then is the directory synced and renamed into place. On any failure the temp dir is
/// removed, so a layer directory either is complete and verified or does not exist.
/// Blocking: call from a blocking task.
pub(crate) fn unpack(layout: &Layout, blob: &Path, diff_id: &str) -> Result<bool> {
    let dest = layout.layer(diff_id);
    if fs::symlink_metadata(&dest).is_ok() {
        debug!(layer = diff_id, "layer already unpacked");
        return Ok(false);
    }
    let tmp = layout.temp_dir("layer-")?;
    let file = File::open(blob).map_err(Error::io("opening", blob))?;
    let mut reader = BufReader::new(file);
    let head = reader.fill_buf().map_err(Error::io("reading", blob))?;
    let stream: Box<dyn Read> =
        if head.starts_with(&GZIP_MAGIC) { Box::new(MultiGzDecoder::new(reader)) } else { Box::new(reader) };
    let mut hashing = HashingReader { inner: stream, hasher: Sha256::new() };
    Extractor::new(tmp.path(), diff_id).run(&mut tar::Archive::new(&mut hashing))?;
    // The diff ID covers the whole stream, including padding after the end-of-archive blocks.
    io::copy(&mut hashing, &mut io::sink()).map_err(Error::unpack(diff_id, "reading", ""))?;
    let actual = format!("sha256:{}", hex::encode(hashing.hasher.finalize()));
    if actual != diff_id {
        return Err(Error::DigestMismatch { what: "layer diff ID", expected: diff_id.to_owned(), actual });
    }
    // Everything on disk before the rename, so a crash cannot leave a complete-looking layer
    // with missing data.
    let dir = File::open(tmp.path()).map_err(Error::io("opening", tmp.path()))?;
    nix::unistd::syncfs(dir.as_fd()).map_err(|e| Error::io("syncing", tmp.path())(e.into()))?;
    match fs::rename(tmp.path(), &dest) {
        Ok(()) => tmp.keep(),
        // Another pull unpacked the same layer meanwhile; ours is removed with `tmp`.
        Err(_) if fs::symlink_metadata(&dest).is_ok() => return Ok(false),
        Err(e) => return Err(Error::io("moving into place", &dest)(e)),
    }
    sync_dir(&layout.layers())?;
    info!(layer = diff_id, "layer unpacked");
    Ok(true)
}

/// Hashes everything read through it.
struct HashingReader<R> {
    inner: R,
    hasher: Sha256,
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

#[cfg(test)]
mod one_id_tests;
#[cfg(test)]
mod tests;
