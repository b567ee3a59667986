//! What the store knows about an image: its record in the index and its parsed config.

use std::collections::BTreeMap;

use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};

use super::error::{Error, Result};
use super::reference::check_digest;

/// One image in the store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageRecord {
    /// The image ID: the digest of its config, `sha256:<hex>`.
    pub id: String,
    /// The digest of its (platform) image manifest.
    pub manifest_digest: String,
    /// `registry/repository:tag` names it was pulled by.
    pub repo_tags: Vec<String>,
    /// `registry/repository@digest` names; the digest is what the reference resolved to (an
    /// image index for multi-platform images).
    pub repo_digests: Vec<String>,
    /// Bytes of the config and the compressed layers, as the manifest lists them.
    pub size: u64,
    /// The layers' diff IDs (digests of the uncompressed tars), base first.
    pub diff_ids: Vec<String>,
    /// The compressed layers' digests, base first.
    pub layer_digests: Vec<String>,
    /// Every blob the store keeps for this image (index, manifest, config, layers).
    pub content: Vec<String>,
    /// What a container of this image runs.
    pub config: ImageConfig,
}

/// The runtime part of an image config, as a container's defaults.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageConfig {
    /// `Entrypoint`.
    pub entrypoint: Vec<String>,
    /// `Cmd`.
    pub cmd: Vec<String>,
    /// `Env`, `NAME=value`.
    pub env: Vec<String>,
    /// `WorkingDir`, if set.
    pub working_dir: Option<String>,
    /// `User` (`uid`, `uid:gid`, or names), if set.
    pub user: Option<String>,
    /// `ExposedPorts` keys, like `8080/tcp`.
    pub exposed_ports: Vec<String>,
    /// `Volumes` keys.
    pub volumes: Vec<String>,
    /// `Labels`.
    pub labels: BTreeMap<String, String>,
    /// `StopSignal`, if set.
    pub stop_signal: Option<String>,
    /// The image's OS, e.g. `linux`.
    pub os: String,
    /// The image's architecture, e.g. `amd64`.
    pub architecture: String,
}

#[derive(Deserialize)]
struct ConfigFile {
    #[serde(default)]
    architecture: String,
    #[serde(default)]
    os: String,
    #[serde(default)]
    config: Option<RunConfig>,
    rootfs: RootFs,
}

// Every field may be absent or `null` in real images, hence the Options.
#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase")]
struct RunConfig {
    user: Option<String>,
    exposed_ports: Option<BTreeMap<String, IgnoredAny>>,
    env: Option<Vec<String>>,
    entrypoint: Option<Vec<String>>,
    cmd: Option<Vec<String>>,
    volumes: Option<BTreeMap<String, IgnoredAny>>,
    working_dir: Option<String>,
    labels: Option<BTreeMap<String, String>>,
    stop_signal: Option<String>,
}

#[derive(Deserialize)]
struct RootFs {
    #[serde(rename = "type")]
    kind: String,
    diff_ids: Vec<String>,
}

/// Parses the config blob `digest`: the runtime defaults and the diff IDs, each checked to be
/// a sha256 digest (they become directory names).
pub(crate) fn parse_config(digest: &str, bytes: &[u8]) -> Result<(ImageConfig, Vec<String>)> {
    let bad = |reason: String| Error::BadManifest { what: "config", digest: digest.to_owned(), reason };
    let file: ConfigFile =
        serde_json::from_slice(bytes).map_err(|e| bad(format!("not an image config: {e}")))?;
    if file.rootfs.kind != "layers" {
        return Err(bad(format!("rootfs type {:?}, expected \"layers\"", file.rootfs.kind)));
    }
    for id in &file.rootfs.diff_ids {
        check_digest(id).map_err(|_| bad(format!("diff ID {id:?} is not a sha256 digest")))?;
    }
    let run = file.config.unwrap_or_default();
    let empty_to_none = |s: Option<String>| s.filter(|s| !s.is_empty());
    let config = ImageConfig {
        entrypoint: run.entrypoint.unwrap_or_default(),
        cmd: run.cmd.unwrap_or_default(),
        env: run.env.unwrap_or_default(),
        working_dir: empty_to_none(run.working_dir),
        user: empty_to_none(run.user),
        exposed_ports: run.exposed_ports.unwrap_or_default().into_keys().collect(),
        volumes: run.volumes.unwrap_or_default().into_keys().collect(),
        labels: run.labels.unwrap_or_default(),
        stop_signal: empty_to_none(run.stop_signal),
        os: file.os,
        architecture: file.architecture,
    };
    Ok((config, file.rootfs.diff_ids))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIFF: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";

    #[test]
    fn config_with_nulls_and_maps_parses() {
        let json = format!(
            r#"{{"architecture":"amd64","os":"linux","config":{{"User":"1000:1000","ExposedPorts":{{"8080/tcp":{{}}}},
            "Env":["PATH=/bin"],"Entrypoint":null,"Cmd":["sh"],"WorkingDir":"","Labels":{{"a":"b"}},
            "Volumes":{{"/data":{{}}}},"StopSignal":"SIGQUIT"}},"rootfs":{{"type":"layers","diff_ids":["{DIFF}"]}}}}"#
        );
        let (config, diff_ids) = parse_config("sha256:x", json.as_bytes()).expect("parses");
        assert_eq!(diff_ids, [DIFF]);
        assert_eq!(config.cmd, ["sh"]);
        assert!(config.entrypoint.is_empty());
        assert_eq!(config.working_dir, None);
        assert_eq!(config.user.as_deref(), Some("1000:1000"));
        assert_eq!(config.exposed_ports, ["8080/tcp"]);
        assert_eq!(config.volumes, ["/data"]);
        assert_eq!(config.labels.get("a").map(String::as_str), Some("b"));
        assert_eq!(config.stop_signal.as_deref(), Some("SIGQUIT"));
    }

    #[test]
    fn diff_ids_that_are_not_digests_are_refused() {
        let json = r#"{"rootfs":{"type":"layers","diff_ids":["sha256:../../escape"]}}"#;
        let err = parse_config("sha256:x", json.as_bytes()).expect_err("path-like diff ID");
        assert!(matches!(err, Error::BadManifest { what: "config", .. }), "{err}");
        let json = r#"{"rootfs":{"type":"other","diff_ids":[]}}"#;
        assert!(parse_config("sha256:x", json.as_bytes()).is_err());
    }
}
