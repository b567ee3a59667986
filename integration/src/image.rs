//! Test images built without Docker: deterministic gzip'd tar layers, an OCI image config and
//! an OCI image manifest, plus two ready-made images from Debian's `busybox-static`.
//!
//! Every byte is a function of the inputs (mtimes 0, owner root, entries sorted, no timestamps
//! in the config), so the same inputs always give the same digests. Pushing and pulling lives in
//! [`crate::registry::Client`].

use std::collections::BTreeMap;
use std::fmt;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use flate2::Compression;
use flate2::read::GzDecoder;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

/// Media type of an OCI image manifest.
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
/// Media type of an OCI image config.
pub const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
/// Media type of a gzip'd tar layer.
pub const OCI_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
/// Where Debian's `busybox-static` installs the binary the ready-made images carry.
pub const BUSYBOX: &str = "/bin/busybox";
/// The port the httpd image listens on.
pub const HTTPD_PORT: u16 = 8080;
/// The body of `/www/index.html` in the httpd image, for tests to compare against.
pub const HTTPD_INDEX: &str = "hpk test image: busybox httpd is serving\n";

/// The PATH an image's processes get, as in the usual base images.
const DEFAULT_PATH: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Result of the image builder.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong while building or checking an image.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A path in a layer is not a plain relative path.
    #[error("layer path {path:?}: {reason}")]
    InvalidPath {
        /// The path given.
        path: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Two entries of a layer have the same path.
    #[error("layer path {path:?} added twice")]
    DuplicatePath {
        /// The path given twice.
        path: String,
    },
    /// An entry's parent is a file or a symlink.
    #[error("layer path {path:?}: its parent {parent:?} is not a directory")]
    ParentNotDirectory {
        /// The entry.
        path: String,
        /// The parent that is not a directory.
        parent: String,
    },
    /// Writing the layer's tar or gzip stream failed.
    #[error("{action} layer entry {path:?}: {source}")]
    Archive {
        /// What was being done.
        action: &'static str,
        /// The entry, or the whole layer when empty.
        path: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// A host file the image needs could not be read or run.
    #[error("{action} {path}: {source}; is Debian's busybox-static installed?")]
    HostFile {
        /// What was being done.
        action: &'static str,
        /// The host file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// `busybox --list` failed.
    #[error("{path} --list exited with {status}: {stderr}")]
    BusyboxList {
        /// The busybox binary.
        path: PathBuf,
        /// Its exit status.
        status: std::process::ExitStatus,
        /// What it printed on stderr.
        stderr: String,
    },
    /// A JSON document could not be written or read.
    #[error("{what} JSON: {source}")]
    Json {
        /// Which document.
        what: &'static str,
        /// The underlying error.
        #[source]
        source: serde_json::Error,
    },
    /// A digest string is malformed or of an algorithm we don't support.
    #[error("digest {digest:?}: {reason}")]
    BadDigest {
        /// The string given.
        digest: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The config lists a different number of diff IDs than the manifest has layers.
    #[error("image config lists {diff_ids} diff IDs but the manifest has {layers} layers")]
    LayerCount {
        /// Layers in the manifest.
        layers: usize,
        /// Diff IDs in the config.
        diff_ids: usize,
    },
    /// An uncompressed layer does not hash to the config's diff ID.
    #[error("layer {index}: uncompressed content is {actual}, the config says {expected}")]
    DiffIdMismatch {
        /// The layer's position in the manifest.
        index: usize,
        /// The diff ID in the config.
        expected: Digest,
        /// The sha256 of the uncompressed layer.
        actual: Digest,
    },
}

/// A content digest, `sha256:<64 lowercase hex digits>`; the only algorithm we produce or accept.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Digest(String);

impl Digest {
    /// The sha256 digest of `data`.
    pub fn of(data: &[u8]) -> Self {
        Self(format!("sha256:{}", hex::encode(Sha256::digest(data))))
    }

    /// Parses `sha256:<hex>`.
    pub fn parse(s: &str) -> Result<Self> {
        let bad = |reason| Error::BadDigest { digest: s.to_owned(), reason };
        let hex = s.strip_prefix("sha256:").ok_or_else(|| bad("only sha256 digests are supported"))?;
        if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
            return Err(bad("expected 64 lowercase hex digits after sha256:"));
        }
        Ok(Self(s.to_owned()))
    }

    /// The whole digest, `sha256:<hex>`.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for Digest {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Self::parse(s)
    }
}

impl TryFrom<String> for Digest {
    type Error = Error;
    fn try_from(s: String) -> Result<Self> {
        Self::parse(&s)
    }
}

impl From<Digest> for String {
    fn from(d: Digest) -> Self {
        d.0
    }
}

/// An OCI content descriptor: what a manifest says about a blob.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    /// The blob's media type.
    pub media_type: String,
    /// The blob's digest.
    pub digest: Digest,
    /// The blob's size in bytes.
    pub size: u64,
}

/// An OCI image manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    /// Always 2.
    pub schema_version: u32,
    /// [`OCI_MANIFEST`]; optional in the spec, so absent is accepted when reading.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    /// The image config blob.
    pub config: Descriptor,
    /// The layers, base first.
    pub layers: Vec<Descriptor>,
}

/// A blob with its media type and digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blob {
    /// The blob's media type.
    pub media_type: &'static str,
    /// The sha256 of `data`.
    pub digest: Digest,
    /// The content.
    pub data: Vec<u8>,
}

impl Blob {
    fn new(media_type: &'static str, data: Vec<u8>) -> Self {
        Self { media_type, digest: Digest::of(&data), data }
    }

    /// The descriptor a manifest uses to point at this blob.
    pub fn descriptor(&self) -> Descriptor {
        Descriptor {
            media_type: self.media_type.to_owned(),
            digest: self.digest.clone(),
            // usize always fits u64 on the platforms we build for.
            size: self.data.len() as u64,
        }
    }
}

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

    fn insert(&mut self, path: &str, entry: Entry) -> Result<&mut Self> {
        let path = normalize(path)?;
        if self.entries.contains_key(&path) {
            return Err(Error::DuplicatePath { path });
        }
        self.entries.insert(path, entry);
        Ok(self)
    }

    /// Writes the tar (mtime 0, uid/gid 0, sorted), hashes it, and gzips it.
    pub fn build(&self) -> Result<Layer> {
        let entries = self.with_parents()?;
        let mut tar = tar::Builder::new(Vec::new());
        for (path, entry) in &entries {
            append(&mut tar, path, entry).map_err(|source| Error::Archive {
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

fn append(tar: &mut tar::Builder<Vec<u8>>, path: &str, entry: &Entry) -> io::Result<()> {
    let mut header = tar::Header::new_gnu();
    header.set_mtime(0);
    header.set_uid(0);
    header.set_gid(0);
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

/// What a container runs, as settable in the image config.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImageConfig {
    /// `config.Entrypoint`.
    pub entrypoint: Vec<String>,
    /// `config.Cmd`.
    pub cmd: Vec<String>,
    /// `config.Env`, `NAME=value`.
    pub env: Vec<String>,
    /// `config.WorkingDir`.
    pub working_dir: Option<String>,
}

/// The OCI image config document; field order is fixed by the struct, so the JSON is stable.
#[derive(Serialize, Deserialize)]
struct ConfigFile {
    architecture: String,
    os: String,
    config: RuntimeConfig,
    rootfs: RootFs,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct RuntimeConfig {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    env: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    entrypoint: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    cmd: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    working_dir: Option<String>,
}

#[derive(Serialize, Deserialize)]
struct RootFs {
    #[serde(rename = "type")]
    kind: String,
    diff_ids: Vec<Digest>,
}

/// A complete image: layers, config and manifest, ready to push.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    /// The layers, base first.
    pub layers: Vec<Layer>,
    /// The image config blob.
    pub config: Blob,
    /// The manifest's exact bytes, as pushed.
    pub manifest: Vec<u8>,
    /// The sha256 of `manifest`: the image's identity in a registry.
    pub digest: Digest,
}

impl Image {
    /// Every blob the manifest references: the layers, then the config.
    pub fn blobs(&self) -> impl Iterator<Item = &Blob> {
        self.layers.iter().map(|l| &l.blob).chain([&self.config])
    }
}

/// Assembles an amd64/linux image from `layers` (base first) and `config`.
pub fn build_image(layers: Vec<Layer>, config: &ImageConfig) -> Result<Image> {
    let file = ConfigFile {
        architecture: "amd64".to_owned(),
        os: "linux".to_owned(),
        config: RuntimeConfig {
            env: config.env.clone(),
            entrypoint: config.entrypoint.clone(),
            cmd: config.cmd.clone(),
            working_dir: config.working_dir.clone(),
        },
        rootfs: RootFs {
            kind: "layers".to_owned(),
            diff_ids: layers.iter().map(|l| l.diff_id.clone()).collect(),
        },
    };
    let config_json =
        serde_json::to_vec(&file).map_err(|source| Error::Json { what: "image config", source })?;
    let config = Blob::new(OCI_CONFIG, config_json);
    let manifest = Manifest {
        schema_version: 2,
        media_type: Some(OCI_MANIFEST.to_owned()),
        config: config.descriptor(),
        layers: layers.iter().map(|l| l.blob.descriptor()).collect(),
    };
    let manifest =
        serde_json::to_vec(&manifest).map_err(|source| Error::Json { what: "image manifest", source })?;
    Ok(Image { digest: Digest::of(&manifest), layers, config, manifest })
}

/// Whether the host has the busybox the ready-made images need.
pub fn busybox_available() -> bool {
    Path::new(BUSYBOX).is_file()
}

/// The base layer of both ready-made images: the host's static busybox as `/bin/busybox`, a
/// symlink in `/bin` for every applet it lists, `/tmp`, and a root user in `/etc`.
pub fn busybox_layer() -> Result<Layer> {
    let path = Path::new(BUSYBOX);
    let host_err = |action| move |source| Error::HostFile { action, path: path.to_owned(), source };
    let binary = std::fs::read(path).map_err(host_err("reading"))?;
    let out = std::process::Command::new(path).arg("--list").output().map_err(host_err("running"))?;
    if !out.status.success() {
        return Err(Error::BusyboxList {
            path: path.to_owned(),
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    let mut layer = LayerBuilder::new();
    layer.file("bin/busybox", binary, 0o755)?;
    let list = String::from_utf8_lossy(&out.stdout);
    // A name with a slash would not be an applet; skip it rather than fail on an odd build.
    for applet in list.lines().map(str::trim) {
        if !applet.is_empty() && applet != "busybox" && !applet.contains('/') {
            layer.symlink(&format!("bin/{applet}"), "busybox")?;
        }
    }
    layer
        .dir("tmp", 0o1777)?
        .file("etc/passwd", "root:x:0:0:root:/root:/bin/sh\n", 0o644)?
        .file("etc/group", "root:x:0:\n", 0o644)?
        .dir("root", 0o700)?;
    layer.build()
}

/// A busybox shell image; its default command is `sh`.
pub fn shell_image() -> Result<Image> {
    let config = ImageConfig {
        cmd: vec!["sh".to_owned()],
        env: vec![DEFAULT_PATH.to_owned()],
        ..ImageConfig::default()
    };
    build_image(vec![busybox_layer()?], &config)
}

/// A busybox httpd serving [`HTTPD_INDEX`] at `/` on port [`HTTPD_PORT`]; the busybox base
/// layer is the shell image's, so a push after the shell image uploads only the `/www` layer.
pub fn httpd_image() -> Result<Image> {
    let mut www = LayerBuilder::new();
    www.dir("www", 0o755)?.file("www/index.html", HTTPD_INDEX, 0o644)?;
    let port = HTTPD_PORT.to_string();
    let config = ImageConfig {
        cmd: ["/bin/busybox", "httpd", "-f", "-p", port.as_str(), "-h", "/www"].map(str::to_owned).to_vec(),
        env: vec![DEFAULT_PATH.to_owned()],
        working_dir: Some("/www".to_owned()),
        ..ImageConfig::default()
    };
    build_image(vec![busybox_layer()?, www.build()?], &config)
}

fn unpack_err(source: io::Error) -> Error {
    Error::Archive { action: "reading", path: String::new(), source }
}

/// The paths in a gzip'd tar layer, in archive order, as the tar stores them.
pub fn layer_paths(compressed: &[u8]) -> Result<Vec<String>> {
    let mut archive = tar::Archive::new(GzDecoder::new(compressed));
    let mut paths = Vec::new();
    for entry in archive.entries().map_err(unpack_err)? {
        let entry = entry.map_err(unpack_err)?;
        let path = entry.path().map_err(unpack_err)?;
        paths.push(path.to_string_lossy().into_owned());
    }
    Ok(paths)
}

/// Checks that each compressed layer unpacks to the diff ID the config lists for it.
pub fn verify_diff_ids(config: &[u8], layers: &[Vec<u8>]) -> Result<()> {
    let file: ConfigFile =
        serde_json::from_slice(config).map_err(|source| Error::Json { what: "image config", source })?;
    let expected = file.rootfs.diff_ids;
    if expected.len() != layers.len() {
        return Err(Error::LayerCount { layers: layers.len(), diff_ids: expected.len() });
    }
    for (index, (layer, expected)) in layers.iter().zip(expected).enumerate() {
        let mut uncompressed = Vec::new();
        GzDecoder::new(layer.as_slice()).read_to_end(&mut uncompressed).map_err(unpack_err)?;
        let actual = Digest::of(&uncompressed);
        if actual != expected {
            return Err(Error::DiffIdMismatch { index, expected, actual });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> LayerBuilder {
        let mut l = LayerBuilder::new();
        l.file("/b/file.txt", "hello", 0o644)
            .expect("file")
            .symlink("a/link", "../b/file.txt")
            .expect("link");
        l
    }

    #[test]
    fn layer_is_sorted_with_parents_and_reproducible() {
        let one = sample().build().expect("build");
        let two = sample().build().expect("build");
        assert_eq!(one, two);
        assert_eq!(layer_paths(&one.blob.data).expect("paths"), ["a/", "a/link", "b/", "b/file.txt"]);
    }

    #[test]
    fn config_lists_diff_ids_and_verifies() {
        let layer = sample().build().expect("build");
        let image = build_image(vec![layer.clone()], &ImageConfig::default()).expect("image");
        verify_diff_ids(&image.config.data, std::slice::from_ref(&layer.blob.data)).expect("diff IDs match");
        let manifest: Manifest = serde_json::from_slice(&image.manifest).expect("manifest JSON");
        assert_eq!(manifest.layers[0].digest, layer.blob.digest);
        assert_eq!(manifest.config.digest, image.config.digest);
        let other = LayerBuilder::new().dir("x", 0o755).expect("dir").build().expect("build");
        assert!(matches!(
            verify_diff_ids(&image.config.data, &[other.blob.data]),
            Err(Error::DiffIdMismatch { index: 0, .. })
        ));
    }

    #[test]
    fn bad_paths_and_duplicates_are_refused() {
        let mut l = LayerBuilder::new();
        for bad in ["", "/", "a/../b", "a//b", "./a"] {
            assert!(matches!(l.dir(bad, 0o755), Err(Error::InvalidPath { .. })), "{bad}");
        }
        l.file("f", "x", 0o644).expect("file");
        assert!(matches!(l.dir("/f/", 0o755), Err(Error::DuplicatePath { .. })));
        l.file("f/g", "y", 0o644).expect("file under a file is caught at build");
        assert!(matches!(l.build(), Err(Error::ParentNotDirectory { .. })));
    }

    #[test]
    fn digests_parse_strictly() {
        let d = Digest::of(b"abc");
        assert_eq!(Digest::parse(d.as_str()).expect("own digest parses"), d);
        for bad in ["abc", "sha512:00", "sha256:ABC", "sha256:"] {
            assert!(Digest::parse(bad).is_err(), "{bad}");
        }
    }
}
