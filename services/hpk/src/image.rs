//! The bubble image: an OCI image layout (a directory with `oci-layout`, `index.json` and
//! `blobs/sha256/…`, as `images/build.sh` writes it) or an oci-archive tar of one, unpacked
//! once per manifest into a root filesystem the bubbles share read-only.
//!
//! Every blob's digest is checked before it is used, and every layer's uncompressed digest
//! against the config's `diff_ids`; an image that fails a check is refused whole and nothing of
//! it is left behind (layers are unpacked into a temporary directory renamed into place).

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Component, Path, PathBuf};

use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

pub mod cache;

pub(crate) const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub(crate) const INDEX: &str = "application/vnd.oci.image.index.v1+json";
const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
/// Directories every bubble mounts something on; created in the root filesystem because the
/// bubbles run it read-only.
pub const MOUNT_POINTS: &[&str] =
    &["proc", "sys", "dev", "run", "tmp", "var/tmp", "var/lib/hpk", "hpk/shared", "etc"];

#[derive(Deserialize)]
pub(crate) struct Index {
    pub(crate) manifests: Vec<Descriptor>,
}

#[derive(Deserialize, Clone)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Descriptor {
    pub(crate) media_type: Option<String>,
    pub(crate) digest: String,
    pub(crate) size: u64,
    #[serde(default)]
    pub(crate) platform: Option<Platform>,
}

/// An index entry's platform.
#[derive(Deserialize, Clone)]
pub(crate) struct Platform {
    pub(crate) architecture: String,
    pub(crate) os: String,
    #[serde(default)]
    pub(crate) variant: Option<String>,
}

#[derive(Deserialize)]
pub(crate) struct Manifest {
    pub(crate) config: Descriptor,
    pub(crate) layers: Vec<Descriptor>,
}

#[derive(Deserialize)]
pub(crate) struct Config {
    #[serde(default)]
    pub(crate) architecture: Option<String>,
    #[serde(default)]
    pub(crate) os: Option<String>,
    #[serde(default)]
    pub(crate) variant: Option<String>,
    pub(crate) rootfs: RootFs,
}

#[derive(Deserialize)]
pub(crate) struct RootFs {
    pub(crate) diff_ids: Vec<String>,
}

/// An unpacked image, held in the cache (not collected) while this value lives.
#[derive(Debug, Clone)]
pub struct Unpacked {
    /// The manifest's digest (`sha256:…`).
    pub digest: String,
    /// The root filesystem.
    pub rootfs: PathBuf,
    /// The entry's shared lock.
    pub hold: cache::Hold,
}

/// Unpacks the image at `image` (layout directory or oci-archive tar) under `cache`, unless
/// that manifest is unpacked there already; returns the root filesystem.
pub fn unpack(image: &Path, cache: &Path) -> Result<Unpacked> {
    let bad = |reason: String| Error::Image { path: image.to_owned(), reason };
    let meta = std::fs::metadata(image)
        .map_err(|e| bad(format!("{e} (build it with `make images`, or pass --image)")))?;
    create_private_dir(cache)?;
    cache::sweep(cache);
    if meta.is_dir() {
        return unpack_layout(image, image, cache);
    }
    // An oci-archive: extract the layout into a temporary directory first.
    let staging = tempdir_in(cache, ".archive-")?;
    extract_archive(image, staging.path())?;
    unpack_layout(image, staging.path(), cache)
}

/// Extracts the oci-archive `image` (a tar of a layout) into the empty directory `dest`.
pub(crate) fn extract_archive(image: &Path, dest: &Path) -> Result<()> {
    let bad = |reason: String| Error::Image { path: image.to_owned(), reason };
    let file = File::open(image).map_err(|e| Error::io("open", image.display(), e))?;
    let mut archive = tar::Archive::new(BufReader::new(file));
    for entry in archive.entries().map_err(|e| bad(format!("not a tar archive: {e}")))? {
        let mut entry = entry.map_err(|e| bad(format!("corrupt archive: {e}")))?;
        let kind = entry.header().entry_type();
        if !(kind.is_file() || kind.is_dir()) {
            return Err(bad("an oci-archive holds only files and directories".into()));
        }
        let ok = entry.unpack_in(dest).map_err(|e| bad(format!("corrupt archive: {e}")))?;
        if !ok {
            return Err(bad("an archive entry points outside the layout".into()));
        }
    }
    Ok(())
}

/// The image manifest of this machine's platform in `layout`: index.json's only entry, or the
/// entry whose platform runs here. An entry that is itself an index (as `skopeo copy` writes a
/// multi-platform image into a layout) is followed, one level.
fn choose_manifest(image: &Path, layout: &Path, index: &Index, nested: bool) -> Result<Descriptor> {
    let bad = |reason: String| Error::Image { path: image.to_owned(), reason };
    let here = hpk_oci::platform::architecture();
    let chosen = match index.manifests.as_slice() {
        [] => return Err(bad("the image index lists no manifests".into())),
        [only] if only.platform.is_none() => only,
        entries => {
            let runs =
                |p: &Platform| hpk_oci::platform::runs_here(&p.os, &p.architecture, p.variant.as_deref());
            let Some(found) = entries.iter().find(|e| e.platform.as_ref().is_some_and(runs)) else {
                let offered: Vec<String> = entries
                    .iter()
                    .map(|e| match &e.platform {
                        Some(p) => hpk_oci::platform::name(&p.os, &p.architecture, p.variant.as_deref()),
                        None => "an entry without a platform".to_owned(),
                    })
                    .collect();
                return Err(bad(format!(
                    "no image for linux/{here} in it (it has: {}); use the {here} release \
                     (`make dist ARCH={here}`)",
                    offered.join(", ")
                )));
            };
            found
        }
    };
    match chosen.media_type.as_deref() {
        None | Some(MANIFEST | DOCKER_MANIFEST) => Ok(chosen.clone()),
        Some(INDEX | DOCKER_LIST) if !nested => {
            let inner: Index = serde_json::from_slice(&read_blob(layout, image, chosen)?)
                .map_err(|e| bad(format!("image index {}: {e}", chosen.digest)))?;
            choose_manifest(image, layout, &inner, true)
        }
        Some(kind) => Err(bad(format!("index.json names a {kind}, expected an image manifest"))),
    }
}

fn unpack_layout(image: &Path, layout: &Path, cache: &Path) -> Result<Unpacked> {
    let bad = |reason: String| Error::Image { path: image.to_owned(), reason };
    let index: Index = serde_json::from_slice(&read_small(&layout.join("index.json"), image)?)
        .map_err(|e| bad(format!("index.json: {e}")))?;
    let chosen = choose_manifest(image, layout, &index, false)?;
    let descriptor = &chosen;
    let manifest_bytes = read_blob(layout, image, descriptor)?;
    let manifest: Manifest =
        serde_json::from_slice(&manifest_bytes).map_err(|e| bad(format!("manifest: {e}")))?;
    let config: Config = serde_json::from_slice(&read_blob(layout, image, &manifest.config)?)
        .map_err(|e| bad(format!("config: {e}")))?;
    // An image of another architecture would fail later, at its first exec, with ENOEXEC.
    if let Some(arch) = &config.architecture {
        let os = config.os.as_deref().unwrap_or("linux");
        if !hpk_oci::platform::runs_here(os, arch, config.variant.as_deref()) {
            let here = hpk_oci::platform::architecture();
            return Err(bad(format!(
                "the image is for {}; this machine is linux/{here}: use the {here} release \
                 (`make dist ARCH={here}`)",
                hpk_oci::platform::name(os, arch, config.variant.as_deref())
            )));
        }
    }
    if config.rootfs.diff_ids.len() != manifest.layers.len() {
        return Err(bad(format!(
            "the config names {} layers, the manifest {}",
            config.rootfs.diff_ids.len(),
            manifest.layers.len()
        )));
    }
    let hex = hex_of(&descriptor.digest).map_err(bad)?;
    let done = cache.join(hex);
    let digest = descriptor.digest.clone();
    let ready = |hold| Unpacked { digest: digest.clone(), rootfs: done.join("rootfs"), hold };
    {
        let _cache = cache::lock_cache(cache)?;
        if cache::trusted(&done, &digest) {
            return Ok(ready(cache::hold(&done)?));
        }
        if std::fs::symlink_metadata(&done).is_ok() {
            // Not ours, or never finished: not trusted, and not in the way.
            tracing::warn!(entry = %done.display(), "an image cache entry without this user's stamp: replacing it");
            cache::remove_tree(&done);
            if std::fs::symlink_metadata(&done).is_ok() {
                return Err(bad(format!("cannot remove the untrusted cache entry {}", done.display())));
            }
        }
    }
    let staging = tempdir_in(cache, ".unpack-")?;
    let rootfs = staging.path().join("rootfs");
    std::fs::create_dir(&rootfs).map_err(|e| Error::io("create", rootfs.display(), e))?;
    for (layer, diff_id) in manifest.layers.iter().zip(&config.rootfs.diff_ids) {
        let path = blob_path(layout, &layer.digest).map_err(bad)?;
        check_digest(&path, &layer.digest, Some(layer.size)).map_err(bad)?;
        apply_layer(&path, &rootfs, diff_id).map_err(|e| bad(format!("layer {}: {e}", layer.digest)))?;
    }
    for dir in MOUNT_POINTS {
        let d = rootfs.join(dir);
        std::fs::create_dir_all(&d).map_err(|e| Error::io("create", d.display(), e))?;
    }
    for file in ["etc/resolv.conf", "etc/hosts", "etc/hostname", "etc/machine-id"] {
        let f = rootfs.join(file);
        if std::fs::symlink_metadata(&f).is_err() {
            std::fs::write(&f, "").map_err(|e| Error::io("create", f.display(), e))?;
        }
    }
    cache::stamp(staging.path(), &digest)?;
    let _cache = cache::lock_cache(cache)?;
    let staged = staging.keep();
    match std::fs::rename(&staged, &done) {
        Ok(()) => {}
        // Another launcher unpacked the same image meanwhile: use its copy.
        Err(_) if cache::trusted(&done, &digest) => cache::remove_tree(&staged),
        Err(e) => {
            cache::remove_tree(&staged);
            return Err(Error::io("rename", done.display(), e));
        }
    }
    let unpacked = ready(cache::hold(&done)?);
    for old in cache::collect(cache, hex) {
        tracing::info!(entry = %old.display(), "removed an image no bubble uses");
    }
    Ok(unpacked)
}

/// Applies one layer (gzip'd or plain tar) to `root`, with OCI whiteouts, checking that its
/// uncompressed content hashes to `diff_id`.
fn apply_layer(path: &Path, root: &Path, diff_id: &str) -> std::result::Result<(), String> {
    let mut file = File::open(path).map_err(|e| e.to_string())?;
    let mut magic = [0u8; 2];
    let gzip = file.read_exact(&mut magic).is_ok() && magic == [0x1f, 0x8b];
    let file = File::open(path).map_err(|e| e.to_string())?;
    let reader: Box<dyn Read> = if gzip {
        Box::new(flate2::read::GzDecoder::new(BufReader::new(file)))
    } else {
        Box::new(BufReader::new(file))
    };
    let mut hashing = HashingReader { inner: reader, hash: Sha256::new() };
    let mut archive = tar::Archive::new(&mut hashing);
    archive.set_preserve_permissions(true);
    archive.set_preserve_ownerships(false);
    archive.set_unpack_xattrs(false);
    archive.set_overwrite(true);
    for entry in archive.entries().map_err(|e| e.to_string())? {
        let mut entry = entry.map_err(|e| e.to_string())?;
        let name = entry.path().map_err(|e| e.to_string())?.into_owned();
        let relative = safe_relative(&name)?;
        let Some(base) = relative.file_name().and_then(|b| b.to_str()).map(str::to_owned) else {
            continue; // the layer's root directory itself
        };
        // Links an earlier layer made are followed inside the root only, never to the host: a
        // whiteout or a replacement under `a/` where `a -> /home/user` acts on the root's
        // `/home/user`, if there is one (review finding L6).
        let parent = crate::hosttools::resolve_in_root(root, relative.parent().unwrap_or(Path::new("")))
            .filter(|p| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir()));
        if base == ".wh..wh..opq" {
            if let Some(children) = parent.as_ref().and_then(|p| std::fs::read_dir(p).ok()) {
                for child in children.flatten() {
                    remove_any(&child.path())?;
                }
            }
            continue;
        }
        if let Some(hidden) = base.strip_prefix(".wh.") {
            if let Some(parent) = &parent {
                remove_any(&parent.join(hidden))?;
            }
            continue;
        }
        let kind = entry.header().entry_type();
        if kind.is_character_special() || kind.is_block_special() || kind.is_fifo() {
            continue; // device nodes come from the bubble's /dev, never from a layer
        }
        // An entry replaces whatever a lower layer had there, unless both are directories.
        if let Some(target) = parent.map(|p| p.join(&base))
            && let Ok(existing) = std::fs::symlink_metadata(&target)
            && !(existing.is_dir() && kind.is_dir())
        {
            remove_any(&target)?;
        }
        let unpacked = entry.unpack_in(root).map_err(|e| format!("{}: {e}", relative.display()))?;
        if !unpacked {
            return Err(format!("{} points outside the root filesystem", relative.display()));
        }
    }
    // Read what tar leaves unread (padding), so the digest covers the whole stream.
    std::io::copy(&mut hashing, &mut std::io::sink()).map_err(|e| e.to_string())?;
    let got = format!("sha256:{}", hex::encode(hashing.hash.finalize()));
    if got != diff_id {
        return Err(format!("uncompressed digest {got}, the config says {diff_id}"));
    }
    Ok(())
}

fn safe_relative(name: &Path) -> std::result::Result<PathBuf, String> {
    let mut out = PathBuf::new();
    for part in name.components() {
        match part {
            Component::Normal(p) => out.push(p),
            Component::CurDir | Component::RootDir => {}
            Component::ParentDir | Component::Prefix(_) => {
                return Err(format!("{} leaves the root filesystem", name.display()));
            }
        }
    }
    Ok(out)
}

fn remove_any(path: &Path) -> std::result::Result<(), String> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path).map_err(|e| format!("{}: {e}", path.display())),
        Ok(_) => std::fs::remove_file(path).map_err(|e| format!("{}: {e}", path.display())),
        Err(_) => Ok(()),
    }
}

struct HashingReader<R> {
    inner: R,
    hash: Sha256,
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }
}

pub(crate) fn read_small(path: &Path, image: &Path) -> Result<Vec<u8>> {
    let bad = |reason: String| Error::Image { path: image.to_owned(), reason };
    let meta = std::fs::metadata(path).map_err(|e| bad(format!("{}: {e}", path.display())))?;
    if meta.len() > 4 << 20 {
        return Err(bad(format!("{} is {} bytes, too large for metadata", path.display(), meta.len())));
    }
    std::fs::read(path).map_err(|e| bad(format!("{}: {e}", path.display())))
}

pub(crate) fn read_blob(layout: &Path, image: &Path, descriptor: &Descriptor) -> Result<Vec<u8>> {
    let bad = |reason: String| Error::Image { path: image.to_owned(), reason };
    let path = blob_path(layout, &descriptor.digest).map_err(bad)?;
    let bytes = read_small(&path, image)?;
    check_bytes(&bytes, &descriptor.digest, Some(descriptor.size)).map_err(bad)?;
    Ok(bytes)
}

pub(crate) fn hex_of(digest: &str) -> std::result::Result<&str, String> {
    match digest.strip_prefix("sha256:") {
        Some(h) if h.len() == 64 && h.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) => {
            Ok(h)
        }
        _ => Err(format!("{digest:?} is not a sha256 digest")),
    }
}

pub(crate) fn blob_path(layout: &Path, digest: &str) -> std::result::Result<PathBuf, String> {
    Ok(layout.join("blobs/sha256").join(hex_of(digest)?))
}

pub(crate) fn check_bytes(bytes: &[u8], digest: &str, size: Option<u64>) -> std::result::Result<(), String> {
    if let Some(size) = size
        && bytes.len() as u64 != size
    {
        return Err(format!("blob {digest} has {} bytes, the descriptor says {size}", bytes.len()));
    }
    let got = format!("sha256:{}", hex::encode(Sha256::digest(bytes)));
    if got != digest {
        return Err(format!("blob {digest} hashes to {got}: corrupt"));
    }
    Ok(())
}

pub(crate) fn check_digest(path: &Path, digest: &str, size: Option<u64>) -> std::result::Result<(), String> {
    let mut file = File::open(path).map_err(|e| format!("blob {digest}: {e}"))?;
    let mut hash = Sha256::new();
    let n = std::io::copy(&mut file, &mut hash).map_err(|e| format!("blob {digest}: {e}"))?;
    if let Some(size) = size
        && n != size
    {
        return Err(format!("blob {digest} has {n} bytes, the descriptor says {size}"));
    }
    let got = format!("sha256:{}", hex::encode(hash.finalize()));
    if got != digest {
        return Err(format!("blob {digest} hashes to {got}: corrupt"));
    }
    Ok(())
}

/// Creates `dir` (and any missing parents, 0700) and makes it private (review C1): `dir` must be
/// a directory of this user's and not a link; it is checked and made 0700 through one
/// descriptor, so nothing can be swapped in between. Links in the part of the path that exists
/// already (`/home` → `/export/home`) are followed where only their directory's owner could
/// have put them; a link in a directory others may write (`/tmp`) is followed only if it is
/// this user's. Below that part, nothing this makes is a link: the directories are made
/// relative to their parent's descriptor (`mkdirat`, `O_NOFOLLOW`).
pub fn create_private_dir(dir: &Path) -> Result<()> {
    use nix::fcntl::{OFlag, openat};
    use nix::sys::stat::{Mode, fchmod, fstat, mkdirat};

    let fail = |action: &'static str, e: nix::Error| Error::io(action, dir.display(), e.into());
    let refuse = |why: String| Error::Invalid(format!("{}: {why}", dir.display()));
    // The path below the longest ancestor that exists; `dir` itself is always opened from its
    // parent, so that a link there is seen.
    let mut missing: Vec<&std::ffi::OsStr> = Vec::new();
    let mut existing = dir;
    loop {
        let name = match existing.components().next_back() {
            Some(Component::Normal(name)) => name,
            _ => return Err(refuse("must end in a plain name (no `.`, `..` or root)".into())),
        };
        missing.push(name);
        existing = existing.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        match std::fs::symlink_metadata(existing) {
            Ok(_) => break,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io("inspect", existing.display(), e)),
        }
    }
    let me = nix::unistd::geteuid().as_raw();
    let mut prefix = PathBuf::new();
    for part in existing.components() {
        prefix.push(part);
        let meta =
            std::fs::symlink_metadata(&prefix).map_err(|e| Error::io("inspect", prefix.display(), e))?;
        let owner = std::os::unix::fs::MetadataExt::uid(&meta);
        if meta.file_type().is_symlink() && owner != me {
            let parent = prefix.parent().unwrap_or(Path::new("/"));
            let open = std::fs::metadata(parent)
                .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o022 != 0)
                .map_err(|e| Error::io("inspect", parent.display(), e))?;
            if open {
                return Err(refuse(format!(
                    "{} is a link of UID {owner}'s in a directory others may write: not followed",
                    prefix.display()
                )));
            }
        }
    }
    let flags = OFlag::O_DIRECTORY | OFlag::O_CLOEXEC | OFlag::O_RDONLY;
    let mut fd: std::os::fd::OwnedFd =
        File::open(existing).map_err(|e| Error::io("open", existing.display(), e))?.into();
    for name in missing.into_iter().rev() {
        match mkdirat(&fd, name, Mode::S_IRWXU) {
            Ok(()) | Err(nix::Error::EEXIST) => {}
            Err(e) => return Err(fail("create", e)),
        }
        fd = openat(&fd, name, flags | OFlag::O_NOFOLLOW, Mode::empty()).map_err(|e| match e {
            nix::Error::ELOOP | nix::Error::ENOTDIR => {
                refuse(format!("{} is a link or not a directory", name.to_string_lossy()))
            }
            e => fail("open", e),
        })?;
    }
    let stat = fstat(&fd).map_err(|e| fail("inspect", e))?;
    if stat.st_uid != me {
        return Err(refuse(format!(
            "belongs to UID {}, not to this user ({me}); remove it or choose another directory",
            stat.st_uid
        )));
    }
    fchmod(&fd, Mode::S_IRWXU).map_err(|e| fail("chmod", e))
}

/// A temporary directory under `parent`, removed on drop unless kept.
pub(crate) struct TempDir(Option<PathBuf>);

impl TempDir {
    pub(crate) fn path(&self) -> &Path {
        self.0.as_deref().unwrap_or(Path::new("/nonexistent"))
    }

    fn keep(mut self) -> PathBuf {
        self.0.take().unwrap_or_default()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            cache::remove_tree(&p);
        }
    }
}

pub(crate) fn tempdir_in(parent: &Path, prefix: &str) -> Result<TempDir> {
    let dir = cache::staging_name(parent, prefix)?;
    std::fs::create_dir(&dir).map_err(|e| Error::io("create", dir.display(), e))?;
    Ok(TempDir(Some(dir)))
}

#[cfg(test)]
#[path = "image_tests.rs"]
mod tests;
