//! Leases on content an in-flight pull is using, and the garbage collector that removes blobs
//! and layers no image needs and no pull holds.
//!
//! Why leases: a pull writes blobs and layers before its image is in the index. Without them a
//! concurrent `remove` (or a failed pull cleaning up) would see that content as unreferenced and
//! delete it under the pull's feet. The collector decides under the lease lock, with a snapshot
//! of the index taken under that lock too; a pull commits its image before it drops its leases,
//! so every piece of content is always either leased or referenced while it is needed.

use std::collections::HashMap;
use std::fs;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tracing::{debug, info};

use super::error::{Error, Result};
use super::index::Index;
use super::layout::{Layout, force_remove};
use super::reference::hex_of;

/// Content held by in-flight pulls: key (`blob:<hex>` or `layer:<hex>`) to holder count.
#[derive(Debug, Default)]
pub(crate) struct Leases(Mutex<HashMap<String, usize>>);

impl Leases {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, usize>> {
        // The map is updated in single statements, so a panic elsewhere cannot leave it torn.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// What one pull holds; released on drop.
#[derive(Debug)]
pub(crate) struct Lease {
    leases: Arc<Leases>,
    keys: Vec<String>,
}

impl Lease {
    /// An empty lease on `leases`.
    pub(crate) fn new(leases: Arc<Leases>) -> Self {
        Self { leases, keys: Vec::new() }
    }

    /// Holds blob `digest` until this lease is dropped.
    pub(crate) fn blob(&mut self, digest: &str) {
        self.hold(format!("blob:{}", hex_of(digest)));
    }

    /// Holds layer `diff_id` until this lease is dropped.
    pub(crate) fn layer(&mut self, diff_id: &str) {
        self.hold(format!("layer:{}", hex_of(diff_id)));
    }

    fn hold(&mut self, key: String) {
        *self.leases.lock().entry(key.clone()).or_default() += 1;
        self.keys.push(key);
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut map = self.leases.lock();
        for key in self.keys.drain(..) {
            if let Some(n) = map.get_mut(&key) {
                *n -= 1;
                if *n == 0 {
                    map.remove(&key);
                }
            }
        }
    }
}

/// What a collection removed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Collected {
    pub(crate) blobs: usize,
    pub(crate) layers: usize,
}

/// Removes every blob and layer that no image in `index` references and no lease holds.
/// Blocking: call from a blocking task. Victims are renamed into `tmp/` under the locks (fast)
/// and deleted after (slow for big layers).
pub(crate) fn collect(layout: &Layout, leases: &Leases, index: &Mutex<Index>) -> Result<Collected> {
    let trash = layout.temp_dir("gc-")?;
    let mut collected = Collected::default();
    {
        let held = leases.lock();
        let (blobs, layers) = index.lock().unwrap_or_else(PoisonError::into_inner).referenced();
        let dirs = [(layout.blobs(), "blob", &blobs), (layout.layers(), "layer", &layers)];
        for (dir, kind, referenced) in dirs {
            for entry in fs::read_dir(&dir).map_err(Error::io("listing", &dir))? {
                let entry = entry.map_err(Error::io("listing", &dir))?;
                let name = entry.file_name().to_string_lossy().into_owned();
                if referenced.contains(&name) || held.contains_key(&format!("{kind}:{name}")) {
                    continue;
                }
                let from = entry.path();
                let to = trash.path().join(format!("{kind}-{name}"));
                fs::rename(&from, &to).map_err(Error::io("moving to the trash", &from))?;
                debug!(kind, name, "unreferenced content collected");
                match kind {
                    "blob" => collected.blobs += 1,
                    _ => collected.layers += 1,
                }
            }
        }
    }
    let path = trash.path().to_owned();
    trash.keep();
    force_remove(&path).map_err(Error::io("removing", &path))?;
    if collected != Collected::default() {
        info!(blobs = collected.blobs, layers = collected.layers, "garbage collected");
    }
    Ok(collected)
}
