//! Image manifests and indexes, OCI and Docker v2: parsing, checking, choosing a platform.

use serde::Deserialize;

use super::error::{Error, Result};
use super::reference::check_digest;

/// Config media types of container images (anything else is an artifact we cannot run).
const CONFIG_TYPES: &[&str] =
    &["application/vnd.oci.image.config.v1+json", "application/vnd.docker.container.image.v1+json"];

/// A content descriptor.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Descriptor {
    pub(crate) media_type: String,
    pub(crate) digest: String,
    pub(crate) size: u64,
    #[serde(default)]
    pub(crate) platform: Option<Platform>,
}

/// The platform of an index entry.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Platform {
    pub(crate) architecture: String,
    pub(crate) os: String,
    #[serde(default)]
    pub(crate) variant: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Raw {
    schema_version: u32,
    #[serde(default)]
    media_type: Option<String>,
    #[serde(default)]
    config: Option<Descriptor>,
    #[serde(default)]
    layers: Option<Vec<Descriptor>>,
    #[serde(default)]
    manifests: Option<Vec<Descriptor>>,
}

/// What a manifest document turned out to be.
#[derive(Debug)]
pub(crate) enum Parsed {
    /// An image manifest: its config and layers, base first.
    Image { config: Descriptor, layers: Vec<Descriptor> },
    /// An image index (manifest list).
    Index(Vec<Descriptor>),
}

/// Parses manifest `digest`, checking every digest in it (they become file names) and that
/// its config and layers are of a container image we can unpack.
pub(crate) fn parse(digest: &str, bytes: &[u8]) -> Result<Parsed> {
    let bad = |what, reason: String| Error::BadManifest { what, digest: digest.to_owned(), reason };
    let raw: Raw =
        serde_json::from_slice(bytes).map_err(|e| bad("manifest", format!("not a manifest: {e}")))?;
    if raw.schema_version != 2 {
        return Err(bad("manifest", format!("schema version {}, only 2 is supported", raw.schema_version)));
    }
    let is_index = raw.manifests.is_some()
        || raw.media_type.as_deref().is_some_and(|t| t.contains("index") || t.contains("list"));
    if is_index {
        let entries = raw.manifests.unwrap_or_default();
        for e in &entries {
            check_digest(&e.digest)
                .map_err(|_| bad("image index", format!("entry digest {:?}", e.digest)))?;
        }
        return Ok(Parsed::Index(entries));
    }
    let (Some(config), Some(layers)) = (raw.config, raw.layers) else {
        return Err(bad("manifest", "has neither config and layers nor manifests".to_owned()));
    };
    if !CONFIG_TYPES.contains(&config.media_type.as_str()) {
        return Err(bad(
            "manifest",
            format!("config media type {} is not a container image's", config.media_type),
        ));
    }
    for d in std::iter::once(&config).chain(&layers) {
        check_digest(&d.digest).map_err(|_| bad("manifest", format!("descriptor digest {:?}", d.digest)))?;
    }
    if let Some(layer) = layers.iter().find(|l| !is_tar_layer(&l.media_type)) {
        return Err(Error::UnsupportedLayer {
            digest: layer.digest.clone(),
            media_type: layer.media_type.clone(),
        });
    }
    Ok(Parsed::Image { config, layers })
}

/// OCI and Docker layer types that are a tar, plain or gzip'd (zstd is not supported yet).
fn is_tar_layer(media_type: &str) -> bool {
    let known = media_type.starts_with("application/vnd.oci.image.layer.")
        || media_type.starts_with("application/vnd.docker.image.rootfs.");
    known
        && (media_type.ends_with(".tar")
            || media_type.ends_with("+gzip")
            || media_type.ends_with(".tar.gzip"))
}

/// The index entry of this machine's platform (linux and this build's architecture), or a
/// list of what the index offers instead.
pub(crate) fn select_platform(entries: &[Descriptor]) -> std::result::Result<&Descriptor, String> {
    select_for(entries, &hpk_oci::platform::architecture())
}

/// [`select_platform`] for a machine of architecture `host` (Go's name).
fn select_for<'a>(entries: &'a [Descriptor], host: &str) -> std::result::Result<&'a Descriptor, String> {
    let runs = |p: &Platform| hpk_oci::platform::runs_on(&p.os, &p.architecture, p.variant.as_deref(), host);
    entries.iter().find(|e| e.platform.as_ref().is_some_and(runs)).ok_or_else(|| {
        let offered: Vec<String> = entries
            .iter()
            .filter_map(|e| e.platform.as_ref())
            .map(|p| hpk_oci::platform::name(&p.os, &p.architecture, p.variant.as_deref()))
            .collect();
        if offered.is_empty() { "no platforms".to_owned() } else { offered.join(", ") }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(n: char) -> String {
        format!("sha256:{}", n.to_string().repeat(64))
    }

    #[test]
    fn image_manifests_and_indexes_parse() {
        let image = format!(
            r#"{{"schemaVersion":2,"config":{{"mediaType":"{}","digest":"{}","size":1}},
            "layers":[{{"mediaType":"application/vnd.docker.image.rootfs.diff.tar.gzip","digest":"{}","size":2}}]}}"#,
            CONFIG_TYPES[1],
            d('a'),
            d('b')
        );
        assert!(
            matches!(parse("m", image.as_bytes()), Ok(Parsed::Image { layers, .. }) if layers.len() == 1)
        );
        let index = format!(
            r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[
            {{"mediaType":"x","digest":"{}","size":1,"platform":{{"architecture":"arm64","os":"linux","variant":"v8"}}}},
            {{"mediaType":"x","digest":"{}","size":1,"platform":{{"architecture":"amd64","os":"linux"}}}}]}}"#,
            d('c'),
            d('e')
        );
        let Ok(Parsed::Index(entries)) = parse("i", index.as_bytes()) else { panic!("index") };
        assert_eq!(select_for(&entries, "amd64").expect("amd64").digest, d('e'));
        assert_eq!(select_for(&entries, "arm64").expect("arm64").digest, d('c'));
        assert_eq!(select_for(&entries[..1], "amd64").expect_err("none"), "linux/arm64/v8");
        assert_eq!(select_for(&entries[1..], "arm64").expect_err("none"), "linux/amd64");
        let here = select_platform(&entries).expect("this machine's");
        let expected = if cfg!(target_arch = "aarch64") { d('c') } else { d('e') };
        assert_eq!(here.digest, expected, "the entry of the architecture this runtime was built for");
    }

    #[test]
    fn unusable_manifests_are_refused() {
        let zstd = format!(
            r#"{{"schemaVersion":2,"config":{{"mediaType":"{}","digest":"{}","size":1}},
            "layers":[{{"mediaType":"application/vnd.oci.image.layer.v1.tar+zstd","digest":"{}","size":2}}]}}"#,
            CONFIG_TYPES[0],
            d('a'),
            d('b')
        );
        assert!(matches!(parse("m", zstd.as_bytes()), Err(Error::UnsupportedLayer { .. })));
        let path = format!(
            r#"{{"schemaVersion":2,"config":{{"mediaType":"{}","digest":"sha256:../x","size":1}},"layers":[]}}"#,
            CONFIG_TYPES[0]
        );
        assert!(matches!(parse("m", path.as_bytes()), Err(Error::BadManifest { .. })));
        assert!(matches!(parse("m", br#"{"schemaVersion":1}"#), Err(Error::BadManifest { .. })));
        assert!(matches!(parse("m", b"not json"), Err(Error::BadManifest { .. })));
    }
}
