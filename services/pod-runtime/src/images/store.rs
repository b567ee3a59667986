//! [`ImageStore`]: the public face of the store.

use std::collections::HashMap;
use std::fmt;
use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use nix::fcntl::{Flock, FlockArg};
use tokio::sync::OnceCell;
use tracing::info;

use super::error::{Error, Result};
use super::fsinfo::{self, FsInfo};
use super::gc::{self, Leases};
use super::index::Index;
use super::layout::Layout;
use super::pull;
use super::record::ImageRecord;
use super::reference::{Credentials, ImageRef, Lookup};

/// How the store reaches registries.
#[derive(Debug, Clone, Default)]
pub struct StoreOptions {
    /// Registries spoken to over plain HTTP, as `host[:port]` the way references name them
    /// (Docker Hub, which no one should list, is `index.docker.io`).
    pub insecure_registries: Vec<String>,
}

/// What the store has done since it was opened; for metrics and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PullStats {
    /// Manifests and indexes fetched from registries.
    pub manifests_fetched: u64,
    /// Blobs (configs and layers) downloaded and verified.
    pub blobs_downloaded: u64,
    /// Bytes of those blobs.
    pub bytes_downloaded: u64,
    /// Layers unpacked into `layers/`.
    pub layers_unpacked: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) manifests_fetched: AtomicU64,
    pub(crate) blobs_downloaded: AtomicU64,
    pub(crate) bytes_downloaded: AtomicU64,
    pub(crate) layers_unpacked: AtomicU64,
}

/// A pull in flight, shared by every caller asking for the same reference and credentials.
type InFlight = Arc<OnceCell<Result<ImageRecord>>>;

/// The shared state behind an [`ImageStore`].
pub(crate) struct Inner {
    pub(crate) layout: Layout,
    pub(crate) options: StoreOptions,
    pub(crate) index: Mutex<Index>,
    pub(crate) leases: Arc<Leases>,
    pub(crate) stats: Counters,
    inflight: Mutex<HashMap<String, InFlight>>,
    // Held for the store's lifetime: one store per root.
    _lock: Flock<std::fs::File>,
}

impl Inner {
    /// The index; a panic while it was held cannot have torn it (it is replaced whole).
    pub(crate) fn index(&self) -> MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The OCI image store of the crun engine. Cheap to clone; clones share one store.
#[derive(Clone)]
pub struct ImageStore {
    inner: Arc<Inner>,
}

impl fmt::Debug for ImageStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ImageStore").field("root", &self.inner.layout.root()).finish_non_exhaustive()
    }
}

impl ImageStore {
    /// Opens (or creates) the store at `root`, reaching every registry over HTTPS.
    pub fn open(root: &Path) -> Result<Self> {
        Self::open_with(root, StoreOptions::default())
    }

    /// Opens (or creates) the store at `root` with `options`. Fails with [`Error::Locked`] if
    /// another store has `root` open.
    pub fn open_with(root: &Path, options: StoreOptions) -> Result<Self> {
        // reqwest (under oci-client) takes the process's rustls provider; ring is the
        // workspace's. Already installed (by us or the binary) is fine.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let layout = Layout::create(root)?;
        let lock_path = layout.lock();
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&lock_path)
            .map_err(Error::io("opening", &lock_path))?;
        let lock = Flock::lock(file, FlockArg::LockExclusiveNonblock).map_err(|(_, errno)| match errno {
            nix::errno::Errno::EWOULDBLOCK => Error::Locked { path: root.to_owned() },
            e => Error::io("locking", &lock_path)(e.into()),
        })?;
        layout.clear_tmp()?;
        let index = Index::load(&layout)?;
        info!(root = %root.display(), images = index.images().count(), "image store opened");
        let inner = Inner {
            layout,
            options,
            index: Mutex::new(index),
            leases: Arc::default(),
            stats: Counters::default(),
            inflight: Mutex::default(),
            _lock: lock,
        };
        // A crash between unpacking and recording an image leaves content no image needs.
        gc::collect(&inner.layout, &inner.leases, &inner.index)?;
        Ok(Self { inner: Arc::new(inner) })
    }

    /// The store's root directory.
    pub fn root(&self) -> &Path {
        self.inner.layout.root()
    }

    /// Pulls `reference` (e.g. `busybox`, `host:5000/repo:tag`, `repo@sha256:…`) unless a pull
    /// of it with the same credentials is already running, in which case this waits for that
    /// one and returns its result.
    pub async fn pull(&self, reference: &str, auth: Option<Credentials>) -> Result<ImageRecord> {
        let image = ImageRef::parse(reference)?;
        let key = format!("{image} {}", Credentials::fingerprint(auth.as_ref()));
        let cell = self.inflight().entry(key.clone()).or_default().clone();
        let result = cell.get_or_init(|| pull::pull(&self.inner, &image, auth.as_ref())).await.clone();
        let mut inflight = self.inflight();
        if inflight.get(&key).is_some_and(|c| Arc::ptr_eq(c, &cell)) {
            inflight.remove(&key);
        }
        result
    }

    fn inflight(&self) -> MutexGuard<'_, HashMap<String, InFlight>> {
        self.inner.inflight.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Every image in the store.
    pub fn list(&self) -> Vec<ImageRecord> {
        self.inner.index().images().cloned().collect()
    }

    /// The image with this ID (`sha256:<hex>` or bare hex) or reference (normalised, so
    /// `busybox` finds `docker.io/library/busybox:latest`); `None` if there is none or the
    /// string is neither.
    pub fn status(&self, reference_or_id: &str) -> Option<ImageRecord> {
        let lookup = Lookup::parse(reference_or_id).ok()?;
        self.inner.index().find(&lookup).cloned()
    }

    /// Records `image` as if pulled (its layers are not there): for tests of the runtime.
    #[cfg(test)]
    pub(crate) fn add_record(&self, image: ImageRecord) -> Result<ImageRecord> {
        self.inner.index().add(image)
    }

    /// Removes the image (all its names) and the blobs and layers no other image uses. An
    /// image that is not there is not an error: CRI's `RemoveImage` is idempotent.
    pub async fn remove(&self, reference_or_id: &str) -> Result<()> {
        let lookup = Lookup::parse(reference_or_id)?;
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || {
            let mut index = inner.index();
            let Some(id) = index.find(&lookup).map(|r| r.id.clone()) else {
                return Ok(());
            };
            index.remove(&id)?;
            drop(index);
            info!(image = %id, "image removed");
            gc::collect(&inner.layout, &inner.leases, &inner.index).map(|_| ())
        })
        .await
        .map_err(|e| Error::task("removing an image", e))?
    }

    /// The unpacked layers of `image`, top-most first, as overlayfs' `lowerdir=` lists them.
    pub fn layers(&self, image: &ImageRecord) -> Vec<PathBuf> {
        image.diff_ids.iter().rev().map(|d| self.inner.layout.layer(d)).collect()
    }

    /// Bytes and inodes the store uses, for CRI's `ImageFsInfo`.
    pub async fn fs_info(&self) -> Result<FsInfo> {
        let root = self.inner.layout.root().to_owned();
        tokio::task::spawn_blocking(move || fsinfo::measure(&root))
            .await
            .map_err(|e| Error::task("measuring the image store", e))?
    }

    /// What the store has done since it was opened.
    pub fn stats(&self) -> PullStats {
        let s = &self.inner.stats;
        PullStats {
            manifests_fetched: s.manifests_fetched.load(Ordering::Relaxed),
            blobs_downloaded: s.blobs_downloaded.load(Ordering::Relaxed),
            bytes_downloaded: s.bytes_downloaded.load(Ordering::Relaxed),
            layers_unpacked: s.layers_unpacked.load(Ordering::Relaxed),
        }
    }
}
