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

mod binary;
mod busybox;
mod layer;

pub use binary::{static_binary_image, static_binary_image_from};
pub use busybox::{
    BUSYBOX, HTTPD_INDEX, HTTPD_PORT, OWNERS, busybox_available, busybox_layer, httpd_image, owners_image,
    shell_image,
};
pub use layer::{Layer, LayerBuilder};

/// Media type of an OCI image manifest.
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
/// The media type of an OCI image index (several platforms' manifests).
pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
/// Media type of an OCI image config.
pub const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
/// Media type of a gzip'd tar layer.
pub const OCI_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

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
    /// The binary of a one-binary image could not be read.
    #[error("reading {path}: {source}")]
    Binary {
        /// The binary.
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
