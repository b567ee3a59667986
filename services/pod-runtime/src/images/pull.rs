//! One pull: resolve the manifest, fetch and verify the blobs, unpack the layers, record the
//! image. Concurrent pulls of one reference are coalesced by the caller ([`super::ImageStore`]).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use tracing::{info, warn};

use super::error::{Error, Result};
use super::gc::{self, Lease};
use super::layout::sync_dir;
use super::manifest::{self, Descriptor, Parsed};
use super::record::{ImageRecord, parse_config};
use super::reference::{Credentials, ImageRef};
use super::registry::{Blob, Remote};
use super::store::Inner;
use super::unpack;

/// Pulls `image`; on failure, removes whatever it wrote that no image needs.
pub(crate) async fn pull(
    inner: &Arc<Inner>,
    image: &ImageRef,
    auth: Option<&Credentials>,
) -> Result<ImageRecord> {
    let result = pull_once(inner, image, auth).await;
    if let Err(error) = &result {
        warn!(image = %image, %error, "pull failed");
        let gc_inner = inner.clone();
        let collected = tokio::task::spawn_blocking(move || {
            gc::collect(&gc_inner.layout, &gc_inner.leases, &gc_inner.index)
        })
        .await;
        match collected {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => warn!(%error, "cleanup after a failed pull failed"),
            Err(error) => warn!(%error, "cleanup after a failed pull failed"),
        }
    }
    result
}

async fn pull_once(inner: &Arc<Inner>, image: &ImageRef, auth: Option<&Credentials>) -> Result<ImageRecord> {
    let started = Instant::now();
    let remote = Remote::new(image, auth, &inner.options.insecure_registries)?;
    let (manifests, config_desc, layers) = resolve(inner, &remote, image).await?;
    // Leased before looking at what is already there, so no collection can take it meanwhile.
    let mut lease = Lease::new(inner.leases.clone());
    for digest in manifests.iter().map(|(d, _)| d.as_str()).chain([config_desc.digest.as_str()]) {
        lease.blob(digest);
    }
    let config_blob = Blob { what: "config", digest: &config_desc.digest, size: config_desc.size };
    let config_path = fetch(inner, &remote, &config_blob).await?;
    let config_bytes = std::fs::read(&config_path).map_err(Error::io("reading", &config_path))?;
    let (config, diff_ids) = parse_config(&config_desc.digest, &config_bytes)?;
    if diff_ids.len() != layers.len() {
        return Err(Error::BadManifest {
            what: "config",
            digest: config_desc.digest.clone(),
            reason: format!("lists {} diff IDs, the manifest has {} layers", diff_ids.len(), layers.len()),
        });
    }
    let mut content: Vec<String> = manifests.iter().map(|(d, _)| d.clone()).collect();
    content.push(config_desc.digest.clone());
    for (layer, diff_id) in layers.iter().zip(&diff_ids) {
        lease.blob(&layer.digest);
        lease.layer(diff_id);
        if inner.layout.blob(&layer.digest).exists() {
            content.push(layer.digest.clone());
        }
        if inner.layout.layer(diff_id).exists() {
            continue; // shared with an image already here: neither downloaded nor unpacked
        }
        let blob = Blob { what: "layer", digest: &layer.digest, size: layer.size };
        let path = fetch(inner, &remote, &blob).await?;
        if !content.contains(&layer.digest) {
            content.push(layer.digest.clone());
        }
        let (layout, diff) = (inner.layout.clone(), diff_id.clone());
        let unpacked = tokio::task::spawn_blocking(move || unpack::unpack(&layout, &path, &diff))
            .await
            .map_err(|e| Error::task("unpacking a layer", e))??;
        if unpacked {
            inner.stats.layers_unpacked.fetch_add(1, Ordering::Relaxed);
        }
    }
    for (digest, bytes) in &manifests {
        write_blob(inner, digest, bytes)?;
    }
    let top = &manifests[0].0;
    let record = ImageRecord {
        id: config_desc.digest.clone(),
        manifest_digest: manifests[manifests.len() - 1].0.clone(),
        repo_tags: image.tagged().into_iter().collect(),
        repo_digests: vec![image.with_digest(top)],
        size: config_desc.size + layers.iter().map(|l| l.size).sum::<u64>(),
        diff_ids,
        layer_digests: layers.iter().map(|l| l.digest.clone()).collect(),
        content,
        config,
    };
    let stored = inner.index().add(record)?;
    // Only now, with the image in the index, may its content lose the lease.
    drop(lease);
    info!(image = %image, id = %stored.id, ms = started.elapsed().as_millis() as u64, "image pulled");
    Ok(stored)
}

/// The manifests fetched (the reference's first, then the platform's if it was an index),
/// with the config and layers of the image manifest.
async fn resolve(
    inner: &Inner,
    remote: &Remote,
    image: &ImageRef,
) -> Result<(Vec<(String, Vec<u8>)>, Descriptor, Vec<Descriptor>)> {
    let (bytes, digest) = remote.manifest(None).await?;
    inner.stats.manifests_fetched.fetch_add(1, Ordering::Relaxed);
    let parsed = manifest::parse(&digest, &bytes)?;
    let mut manifests = vec![(digest.clone(), bytes)];
    let entries = match parsed {
        Parsed::Image { config, layers } => return Ok((manifests, config, layers)),
        Parsed::Index(entries) => entries,
    };
    let entry = manifest::select_platform(&entries).map_err(|available| Error::NoPlatform {
        reference: image.to_string(),
        digest: digest.clone(),
        available,
    })?;
    let (bytes, platform_digest) = remote.manifest(Some(&entry.digest)).await?;
    inner.stats.manifests_fetched.fetch_add(1, Ordering::Relaxed);
    if bytes.len() as u64 != entry.size {
        return Err(Error::SizeMismatch {
            what: "manifest",
            digest: entry.digest.clone(),
            expected: entry.size,
            actual: bytes.len() as u64,
        });
    }
    let parsed = manifest::parse(&platform_digest, &bytes)?;
    manifests.push((platform_digest.clone(), bytes));
    match parsed {
        Parsed::Image { config, layers } => Ok((manifests, config, layers)),
        Parsed::Index(_) => Err(Error::BadManifest {
            what: "image index",
            digest: platform_digest,
            reason: format!("its linux/{} entry is another index", hpk_oci::platform::architecture()),
        }),
    }
}

/// The path of blob `blob` in the store, downloading and verifying it first if missing.
async fn fetch(inner: &Inner, remote: &Remote, blob: &Blob<'_>) -> Result<PathBuf> {
    let dest = inner.layout.blob(blob.digest);
    if dest.exists() {
        return Ok(dest); // verified when it was written
    }
    let tmp = inner.layout.temp_dir("blob-")?;
    let part = tmp.path().join("data");
    let bytes = remote.blob(blob, &part).await?;
    tokio::fs::rename(&part, &dest).await.map_err(Error::io("moving into place", &dest))?;
    sync_dir(&inner.layout.blobs())?;
    inner.stats.blobs_downloaded.fetch_add(1, Ordering::Relaxed);
    inner.stats.bytes_downloaded.fetch_add(bytes, Ordering::Relaxed);
    Ok(dest)
}

/// Stores already-verified `bytes` as blob `digest`.
fn write_blob(inner: &Inner, digest: &str, bytes: &[u8]) -> Result<()> {
    let dest = inner.layout.blob(digest);
    if dest.exists() {
        return Ok(());
    }
    let tmp = inner.layout.temp_dir("blob-")?;
    let part = tmp.path().join("data");
    std::fs::write(&part, bytes).map_err(Error::io("writing", &part))?;
    std::fs::rename(&part, &dest).map_err(Error::io("moving into place", &dest))
}
