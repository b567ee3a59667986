//! `hpk image push --to REGISTRY/REPOSITORY:TAG IMAGE…`: images of one platform each (OCI
//! layouts or oci-archives, as `images/build.sh` writes them and the release bundle carries
//! them) pushed over the OCI distribution API as one image index that lists every platform, so
//! that each machine pulls its own (`make images push REGISTRY=…` pushes both architectures).
//!
//! Nothing is sent before every image is read and checked (each blob's digest and size, one
//! image per platform). The registry is then asked for push access; the blobs go up (those it
//! has already are skipped), then each platform's manifest by digest, and the index under the
//! tag last, so that a push that fails half-way never leaves the tag naming an image with parts
//! missing. The tag is read back and must name the index pushed.
//!
//! Credentials come from the usual file: `--authfile`, else `$REGISTRY_AUTH_FILE`, else
//! `$DOCKER_CONFIG/config.json`, else `~/.docker/config.json` (`auths` entries: `auth`,
//! `username`/`password` or `registrytoken`). Plain HTTP only with `--plain-http`, and
//! credentials over plain HTTP only to a loopback address.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine as _;
use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol};
use oci_client::errors::{OciDistributionError, OciErrorCode};
use oci_client::secrets::RegistryAuth;
use oci_client::{Reference, RegistryOperation};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::error::{Error, Result};
use crate::image::{self, Config, Descriptor, Index, Manifest};

use crate::image::{INDEX as OCI_INDEX, MANIFEST as OCI_MANIFEST};
/// A registry that does not accept a connection within this is unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// A transfer that stalls this long is broken.
const READ_TIMEOUT: Duration = Duration::from_secs(120);
/// Blobs are sent from their files in pieces of this size.
const CHUNK: usize = 1 << 20;

/// `hpk image` commands.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum ImageCmd {
    /// Push images of one platform each as one multi-platform image (an OCI image index).
    Push(PushArgs),
}

/// `hpk image push` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct PushArgs {
    /// Where to: REGISTRY[:PORT]/REPOSITORY[:TAG] (the tag defaults to `latest`).
    #[arg(long)]
    pub to: String,
    /// The images, one per platform: OCI layout directories or oci-archive files
    /// (e.g. target/images/hpk-bubble and target/images-arm64/hpk-bubble).
    #[arg(required = true)]
    pub images: Vec<PathBuf>,
    /// Speak plain HTTP to the registry (no TLS); credentials go only to a loopback address.
    #[arg(long)]
    pub plain_http: bool,
    /// PEM file of CA certificates to trust for the registry, besides the system's.
    #[arg(long)]
    pub ca_file: Option<PathBuf>,
    /// The credentials file (default: $REGISTRY_AUTH_FILE, else $DOCKER_CONFIG/config.json,
    /// else ~/.docker/config.json).
    #[arg(long)]
    pub authfile: Option<PathBuf>,
}

/// One platform's image, read from its layout and checked.
struct Local {
    /// Where it came from, for messages.
    source: PathBuf,
    /// The layout directory (a temporary one for an archive).
    layout: PathBuf,
    manifest: Vec<u8>,
    manifest_type: String,
    manifest_digest: String,
    /// The config first, then the layers.
    blobs: Vec<Descriptor>,
    platform: IndexPlatform,
}

#[derive(Serialize, Clone, PartialEq, Eq, Debug)]
struct IndexPlatform {
    architecture: String,
    os: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    variant: Option<String>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct IndexEntry<'a> {
    media_type: &'a str,
    digest: &'a str,
    size: usize,
    platform: &'a IndexPlatform,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct IndexDoc<'a> {
    schema_version: u32,
    media_type: &'a str,
    manifests: Vec<IndexEntry<'a>>,
}

/// What a push did.
#[derive(Debug)]
pub struct Pushed {
    /// The reference pushed to.
    pub reference: String,
    /// The index's digest.
    pub index_digest: String,
    /// Each platform (`linux/arm64`) with its manifest's digest, in the index's order.
    pub platforms: Vec<(String, String)>,
    /// Blobs sent.
    pub sent: usize,
    /// Blobs skipped because the registry had them.
    pub skipped: usize,
}

/// Runs `hpk image push`.
pub async fn run(args: &PushArgs) -> Result<i32> {
    let pushed = push(args).await?;
    for (platform, digest) in &pushed.platforms {
        println!("{platform}\t{digest}");
    }
    println!(
        "pushed {} (index {}; {} blobs sent, {} already there)",
        pushed.reference, pushed.index_digest, pushed.sent, pushed.skipped
    );
    Ok(0)
}

/// Pushes `args.images` as one index to `args.to`.
pub async fn push(args: &PushArgs) -> Result<Pushed> {
    let target: Reference = args
        .to
        .parse()
        .map_err(|e| Error::Invalid(format!("--to {}: not an image reference: {e}", args.to)))?;
    if target.digest().is_some() {
        return Err(Error::Invalid(format!("--to {}: names a digest; push to a tag", args.to)));
    }
    // Everything is read and checked before the registry hears from us.
    let staging = image::tempdir_in(&std::env::temp_dir(), ".hpk-push-")?;
    let mut images = Vec::new();
    for (i, path) in args.images.iter().enumerate() {
        for local in read_image(path, &staging.path().join(i.to_string()))? {
            if let Some(other) = images.iter().find(|o: &&Local| o.platform == local.platform) {
                return Err(Error::Invalid(format!(
                    "{} and {} are both {}: give one image per platform",
                    other.source.display(),
                    local.source.display(),
                    platform_name(&local.platform)
                )));
            }
            images.push(local);
        }
    }
    let index = index_document(&images)?;
    let index_digest = sha256(&index);

    let registry = target.resolve_registry().to_owned();
    let (auth, auth_source) = credentials(&registry, args.authfile.as_deref())?;
    check_clear_text(args.plain_http, &auth, auth_source.as_deref(), &registry)?;
    let remote =
        Remote { client: client(args, &registry)?, auth, auth_source, registry, plain_http: args.plain_http };

    remote
        .client
        .auth(&target, &remote.auth, RegistryOperation::Push)
        .await
        .map_err(|e| remote.error("logging in for push", e))?;
    let (mut sent, mut skipped) = (0, 0);
    for local in &images {
        for blob in &local.blobs {
            let exists = remote
                .client
                .blob_exists(&target, &blob.digest)
                .await
                .map_err(|e| remote.error("checking which blobs it has", e))?;
            if exists {
                skipped += 1;
                continue;
            }
            let path = image::blob_path(&local.layout, &blob.digest)
                .map_err(|reason| Error::Image { path: local.source.clone(), reason })?;
            remote
                .client
                .push_blob_stream(&target, file_stream(path), &blob.digest, Some(blob.size))
                .await
                .map_err(|e| remote.error("receiving a blob", e))?;
            sent += 1;
        }
        let by_digest = target.clone_with_digest(local.manifest_digest.clone());
        let content_type = local.manifest_type.parse().map_err(|_| Error::Image {
            path: local.source.clone(),
            reason: format!("manifest media type {:?}", local.manifest_type),
        })?;
        remote
            .client
            .push_manifest_raw(&by_digest, local.manifest.clone(), content_type)
            .await
            .map_err(|e| remote.error("receiving a manifest", e))?;
    }
    let tagged = Reference::with_tag(
        target.registry().to_owned(),
        target.repository().to_owned(),
        target.tag().unwrap_or("latest").to_owned(),
    );
    remote
        .client
        .push_manifest_raw(&tagged, index.clone(), OCI_INDEX.parse().expect("a valid header value"))
        .await
        .map_err(|e| remote.error("receiving the index", e))?;
    // The tag must now name what was pushed (a registry that rewrote it, or a concurrent push
    // to the same tag, would show here).
    let (back, _) = remote
        .client
        .pull_manifest_raw(&tagged, &remote.auth, &[OCI_INDEX])
        .await
        .map_err(|e| remote.error("reading the tag back", e))?;
    let back_digest = sha256(&back);
    if back_digest != index_digest {
        return Err(Error::Registry {
            registry: remote.registry.clone(),
            detail: format!(
                "the tag {tagged} names {back_digest} after the push, not the index pushed ({index_digest})"
            ),
        });
    }
    Ok(Pushed {
        reference: tagged.to_string(),
        index_digest,
        platforms: images.iter().map(|i| (platform_name(&i.platform), i.manifest_digest.clone())).collect(),
        sent,
        skipped,
    })
}

/// The images in `path` (a layout, or an oci-archive extracted into `scratch`), each checked:
/// manifest, config and every layer against their digests and sizes.
fn read_image(path: &Path, scratch: &Path) -> Result<Vec<Local>> {
    let bad = |reason: String| Error::Image { path: path.to_owned(), reason };
    let meta = std::fs::metadata(path).map_err(|e| bad(e.to_string()))?;
    let layout = if meta.is_dir() {
        path.to_owned()
    } else {
        std::fs::create_dir(scratch).map_err(|e| Error::io("create", scratch.display(), e))?;
        image::extract_archive(path, scratch)?;
        scratch.to_owned()
    };
    let index: Index = serde_json::from_slice(&image::read_small(&layout.join("index.json"), path)?)
        .map_err(|e| bad(format!("index.json: {e}")))?;
    if index.manifests.is_empty() {
        return Err(bad("index.json lists no manifests".into()));
    }
    let mut images = Vec::new();
    for entry in &index.manifests {
        let manifest_type = entry.media_type.clone().unwrap_or_else(|| OCI_MANIFEST.to_owned());
        if manifest_type.contains("index") || manifest_type.contains("list") {
            return Err(bad(format!(
                "index.json names an image index ({}); give each platform's layout instead",
                entry.digest
            )));
        }
        let manifest = image::read_blob(&layout, path, entry)?;
        let parsed: Manifest =
            serde_json::from_slice(&manifest).map_err(|e| bad(format!("manifest {}: {e}", entry.digest)))?;
        let config: Config = serde_json::from_slice(&image::read_blob(&layout, path, &parsed.config)?)
            .map_err(|e| bad(format!("config {}: {e}", parsed.config.digest)))?;
        let (Some(architecture), Some(os)) = (config.architecture, config.os) else {
            return Err(bad(format!(
                "config {} names no architecture and os: its platform is unknown",
                parsed.config.digest
            )));
        };
        if config.rootfs.diff_ids.len() != parsed.layers.len() {
            return Err(bad(format!(
                "the config names {} layers, the manifest {}",
                config.rootfs.diff_ids.len(),
                parsed.layers.len()
            )));
        }
        for layer in &parsed.layers {
            let file = image::blob_path(&layout, &layer.digest).map_err(bad)?;
            image::check_digest(&file, &layer.digest, Some(layer.size)).map_err(bad)?;
        }
        let mut blobs = vec![parsed.config.clone()];
        blobs.extend(parsed.layers.iter().cloned());
        images.push(Local {
            source: path.to_owned(),
            layout: layout.clone(),
            manifest_type,
            manifest_digest: entry.digest.clone(),
            manifest,
            blobs,
            platform: IndexPlatform { architecture, os, variant: config.variant },
        });
    }
    Ok(images)
}

/// The OCI image index of `images`, in the order given.
fn index_document(images: &[Local]) -> Result<Vec<u8>> {
    let doc = IndexDoc {
        schema_version: 2,
        media_type: OCI_INDEX,
        manifests: images
            .iter()
            .map(|i| IndexEntry {
                media_type: &i.manifest_type,
                digest: &i.manifest_digest,
                size: i.manifest.len(),
                platform: &i.platform,
            })
            .collect(),
    };
    serde_json::to_vec(&doc).map_err(|e| Error::Invalid(format!("the image index: {e}")))
}

fn platform_name(p: &IndexPlatform) -> String {
    hpk_oci::platform::name(&p.os, &p.architecture, p.variant.as_deref())
}

fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// The blob at `path` as a stream of pieces, read as they are sent.
fn file_stream(
    path: PathBuf,
) -> impl futures_util::Stream<Item = std::result::Result<bytes::Bytes, OciDistributionError>> + Send + 'static
{
    use tokio::io::AsyncReadExt;
    futures_util::stream::unfold(None::<tokio::fs::File>, move |file| {
        let path = path.clone();
        async move {
            let mut file = match file {
                Some(f) => f,
                None => match tokio::fs::File::open(&path).await {
                    Ok(f) => f,
                    Err(e) => return Some((Err(OciDistributionError::IoError(e)), None)),
                },
            };
            let mut buf = vec![0u8; CHUNK];
            match file.read(&mut buf).await {
                Ok(0) => None,
                Ok(n) => {
                    buf.truncate(n);
                    Some((Ok(bytes::Bytes::from(buf)), Some(file)))
                }
                Err(e) => Some((Err(OciDistributionError::IoError(e)), None)),
            }
        }
    })
}

/// The client: HTTPS (the system's roots, plus `--ca-file`), or plain HTTP when asked.
fn client(args: &PushArgs, registry: &str) -> Result<oci_client::Client> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut extra_root_certificates = Vec::new();
    if let Some(ca) = &args.ca_file {
        let data = std::fs::read(ca).map_err(|e| Error::io("read", ca.display(), e))?;
        extra_root_certificates.push(Certificate { encoding: CertificateEncoding::Pem, data });
    }
    let config = ClientConfig {
        protocol: if args.plain_http { ClientProtocol::Http } else { ClientProtocol::Https },
        extra_root_certificates,
        // One PUT per blob, streamed from its file (a chunked upload would be one request
        // per piece).
        use_monolithic_push: true,
        connect_timeout: Some(CONNECT_TIMEOUT),
        read_timeout: Some(READ_TIMEOUT),
        ..ClientConfig::default()
    };
    oci_client::Client::try_from(config).map_err(|e| Error::Registry {
        registry: registry.to_owned(),
        detail: format!("cannot make a client: {}", chain(&e)),
    })
}

struct Remote {
    client: oci_client::Client,
    auth: RegistryAuth,
    auth_source: Option<PathBuf>,
    registry: String,
    plain_http: bool,
}

impl Remote {
    /// A client error in words a user can act on.
    fn error(&self, doing: &str, e: OciDistributionError) -> Error {
        let registry = self.registry.clone();
        let credentials = match (&self.auth, &self.auth_source) {
            (RegistryAuth::Anonymous, Some(file)) => {
                format!("no credentials (none for it in {})", file.display())
            }
            (RegistryAuth::Anonymous, None) => "no credentials (no credentials file)".to_owned(),
            (_, Some(file)) => format!("the credentials in {}", file.display()),
            (_, None) => "the credentials given".to_owned(),
        };
        let refused = |detail: String| Error::Registry {
            registry: registry.clone(),
            detail: format!("refused {doing} with {credentials}: {detail}; nothing was tagged"),
        };
        let detail = chain(&e);
        match &e {
            OciDistributionError::RequestError(r) if r.is_connect() || r.is_timeout() => Error::Registry {
                registry: registry.clone(),
                detail: format!(
                    "cannot reach it ({doing}): {detail}{}; nothing was pushed",
                    if self.plain_http { "" } else { " (a registry without TLS needs --plain-http)" }
                ),
            },
            OciDistributionError::UnauthorizedError { .. }
            | OciDistributionError::AuthenticationFailure(_) => refused(detail),
            OciDistributionError::ServerError { code: 401 | 403, .. } => refused(detail),
            OciDistributionError::RequestError(r)
                if r.status().is_some_and(|s| s.as_u16() == 401 || s.as_u16() == 403) =>
            {
                refused(detail)
            }
            OciDistributionError::RegistryError { envelope, .. }
                if envelope
                    .errors
                    .iter()
                    .any(|c| matches!(c.code, OciErrorCode::Unauthorized | OciErrorCode::Denied)) =>
            {
                refused(detail)
            }
            _ => Error::Registry { registry, detail: format!("{doing}: {detail}; nothing was tagged") },
        }
    }
}

/// An error with its sources, `a: b: c`.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let next = s.to_string();
        if !text.contains(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        source = s.source();
    }
    text
}

/// Credentials go over plain HTTP only to this machine.
fn check_clear_text(
    plain_http: bool,
    auth: &RegistryAuth,
    source: Option<&Path>,
    registry: &str,
) -> Result<()> {
    if plain_http && !matches!(auth, RegistryAuth::Anonymous) && !is_loopback(registry) {
        return Err(Error::Invalid(format!(
            "--plain-http would send the credentials for {registry} (from {}) in clear text; \
             use TLS (--ca-file for a private CA)",
            source.map_or("?".into(), |p| p.display().to_string())
        )));
    }
    Ok(())
}

/// Whether `registry` (`host[:port]`) is a loopback address or `localhost`.
fn is_loopback(registry: &str) -> bool {
    let host = match registry.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(rest),
        None => registry.rsplit_once(':').map_or(registry, |(h, _)| h),
    };
    host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct AuthFile {
    #[serde(default)]
    auths: std::collections::BTreeMap<String, AuthEntry>,
    #[serde(default)]
    creds_store: Option<String>,
    #[serde(default)]
    cred_helpers: std::collections::BTreeMap<String, String>,
}

#[derive(Deserialize, Default)]
struct AuthEntry {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
    #[serde(default)]
    identitytoken: Option<String>,
    #[serde(default)]
    registrytoken: Option<String>,
}

/// The credentials for `registry` and the file they came from: `explicit`, else
/// `$REGISTRY_AUTH_FILE`, else `$DOCKER_CONFIG/config.json`, else `~/.docker/config.json`. A
/// file named by the flag or `REGISTRY_AUTH_FILE` must exist; the default ones may not.
fn credentials(registry: &str, explicit: Option<&Path>) -> Result<(RegistryAuth, Option<PathBuf>)> {
    let env = |name| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    let (file, required) = match (explicit, env("REGISTRY_AUTH_FILE")) {
        (Some(f), _) => (f.to_owned(), true),
        (None, Some(f)) => (f, true),
        (None, None) => match (env("DOCKER_CONFIG"), env("HOME")) {
            (Some(dir), _) => (dir.join("config.json"), false),
            (None, Some(home)) => (home.join(".docker/config.json"), false),
            (None, None) => return Ok((RegistryAuth::Anonymous, None)),
        },
    };
    let text = match std::fs::read(&file) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => {
            return Ok((RegistryAuth::Anonymous, None));
        }
        Err(e) => return Err(Error::io("read the credentials file", file.display(), e)),
    };
    let parsed: AuthFile = serde_json::from_slice(&text)
        .map_err(|e| Error::Invalid(format!("credentials file {}: {e}", file.display())))?;
    let auth =
        auth_for(&parsed, registry).map_err(|why| Error::Invalid(format!("{}: {why}", file.display())))?;
    Ok((auth, Some(file)))
}

/// `registry`'s entry of `file`, as the client's credentials.
fn auth_for(file: &AuthFile, registry: &str) -> std::result::Result<RegistryAuth, String> {
    let wanted = canonical_host(registry);
    let entry = file.auths.iter().find(|(key, _)| canonical_host(key) == wanted).map(|(_, e)| e);
    let helper = file.cred_helpers.iter().find(|(key, _)| canonical_host(key) == wanted).map(|(_, h)| h);
    let Some(entry) = entry else {
        return match helper {
            Some(h) => Err(format!(
                "credentials for {registry} are kept by the helper docker-credential-{h}, which hpk does \
                 not run; put them in an `auths` entry (e.g. `REGISTRY_AUTH_FILE=… podman login`)"
            )),
            None => Ok(RegistryAuth::Anonymous),
        };
    };
    if let Some(encoded) = entry.auth.as_deref().filter(|a| !a.is_empty()) {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(encoded.trim())
            .map_err(|e| format!("the `auth` of {registry} is not base64: {e}"))?;
        let text =
            String::from_utf8(decoded).map_err(|_| format!("the `auth` of {registry} is not UTF-8"))?;
        let (user, password) =
            text.split_once(':').ok_or_else(|| format!("the `auth` of {registry} is not user:password"))?;
        return Ok(RegistryAuth::Basic(user.to_owned(), password.to_owned()));
    }
    if let (Some(user), Some(password)) = (&entry.username, &entry.password) {
        return Ok(RegistryAuth::Basic(user.clone(), password.clone()));
    }
    if let Some(token) = entry.registrytoken.as_deref().filter(|t| !t.is_empty()) {
        return Ok(RegistryAuth::Bearer(token.to_owned()));
    }
    if entry.identitytoken.as_deref().is_some_and(|t| !t.is_empty()) {
        return Err(format!(
            "the entry of {registry} holds an identity token (OAuth2), which hpk does not support yet; \
             log in with a username and password"
        ));
    }
    match helper.or(file.creds_store.as_ref()) {
        Some(h) => Err(format!(
            "credentials for {registry} are kept by the helper docker-credential-{h}, which hpk does not \
             run; put them in an `auths` entry (e.g. `REGISTRY_AUTH_FILE=… podman login`)"
        )),
        None => Err(format!("the entry of {registry} holds no credentials")),
    }
}

/// A registry key as the file may spell it (`https://host/v1/`, `host`, `docker.io`), reduced
/// to the host and port; Docker Hub's names are one.
fn canonical_host(key: &str) -> String {
    let key = key.strip_prefix("https://").or_else(|| key.strip_prefix("http://")).unwrap_or(key);
    let host = key.split('/').next().unwrap_or(key).to_ascii_lowercase();
    match host.as_str() {
        "docker.io" | "index.docker.io" | "registry-1.docker.io" => "docker.io".to_owned(),
        _ => host,
    }
}

#[cfg(test)]
#[path = "push_tests.rs"]
mod tests;
