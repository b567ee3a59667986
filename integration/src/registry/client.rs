//! Pushing and pulling images over the OCI distribution API, every digest checked.

use super::{Error, Result, http_client};
use crate::image::{self, Blob, Digest, Image, Manifest, OCI_MANIFEST};
use tracing::{debug, info};

/// What [`Client::pull`] fetched, every digest already checked.
#[derive(Debug, Clone)]
pub struct PulledImage {
    /// The manifest's digest.
    pub digest: Digest,
    /// The manifest's exact bytes.
    pub manifest_bytes: Vec<u8>,
    /// The parsed manifest.
    pub manifest: Manifest,
    /// The image config blob.
    pub config: Vec<u8>,
    /// The compressed layers, in manifest order.
    pub layers: Vec<Vec<u8>>,
}

/// A client of the OCI distribution API over plain HTTP.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
}

impl Client {
    /// A client for the registry at `base_url` (`http://host:port`).
    pub fn new(base_url: &str) -> Result<Self> {
        Ok(Self { http: http_client()?, base: base_url.trim_end_matches('/').to_owned() })
    }

    /// Whether `repo` already has the blob `digest`.
    pub async fn blob_exists(&self, repo: &str, digest: &Digest) -> Result<bool> {
        let url = self.url(repo, "blobs", digest.as_str())?;
        let resp = self.send("HEAD", &url, self.http.head(&url)).await?;
        match resp.status() {
            s if s.is_success() => Ok(true),
            reqwest::StatusCode::NOT_FOUND => Ok(false),
            _ => Err(refused("HEAD", &url, resp).await),
        }
    }

    /// Uploads `data` as blob `digest`: a POST opens the upload, a PUT with the digest closes
    /// it, and the registry refuses the PUT if `data` does not hash to `digest`.
    pub async fn push_blob(&self, repo: &str, digest: &Digest, data: &[u8]) -> Result<()> {
        let start = self.url(repo, "blobs", "uploads/")?;
        let resp = self.send("POST", &start, self.http.post(&start)).await?;
        if resp.status() != reqwest::StatusCode::ACCEPTED {
            return Err(refused("POST", &start, resp).await);
        }
        let location = header(&resp, "location").ok_or_else(|| Error::MissingHeader {
            method: "POST",
            url: start.clone(),
            header: "Location",
        })?;
        // The registry may answer with an absolute or a host-relative URL, with or without a
        // query of its own (the upload state).
        let mut put = if location.starts_with('/') { format!("{}{location}", self.base) } else { location };
        put.push(if put.contains('?') { '&' } else { '?' });
        put.push_str("digest=");
        put.push_str(digest.as_str());
        let req = self
            .http
            .put(&put)
            .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
            .body(data.to_vec());
        let resp = self.send("PUT", &put, req).await?;
        if resp.status() != reqwest::StatusCode::CREATED {
            return Err(refused("PUT", &put, resp).await);
        }
        debug!(repo, %digest, bytes = data.len(), "blob pushed");
        Ok(())
    }

    /// Stores `manifest` under `reference` (a tag) and returns its digest, checked against
    /// both the bytes sent and the registry's `Docker-Content-Digest`.
    pub async fn put_manifest(&self, repo: &str, reference: &str, manifest: &[u8]) -> Result<Digest> {
        let url = self.url(repo, "manifests", reference)?;
        let req =
            self.http.put(&url).header(reqwest::header::CONTENT_TYPE, OCI_MANIFEST).body(manifest.to_vec());
        let resp = self.send("PUT", &url, req).await?;
        if resp.status() != reqwest::StatusCode::CREATED {
            return Err(refused("PUT", &url, resp).await);
        }
        let expected = Digest::of(manifest);
        let answered = content_digest(&resp, "PUT", &url)?;
        if answered != expected {
            return Err(Error::DigestMismatch {
                url,
                what: "Docker-Content-Digest",
                expected,
                actual: answered,
            });
        }
        Ok(expected)
    }

    /// Pushes every blob the registry lacks, then the manifest as `repo:tag`; returns the
    /// manifest digest.
    pub async fn push(&self, repo: &str, tag: &str, image: &Image) -> Result<Digest> {
        for blob in image.blobs() {
            self.push_blob_once(repo, blob).await?;
        }
        let digest = self.put_manifest(repo, tag, &image.manifest).await?;
        info!(repo, tag, %digest, "image pushed");
        Ok(digest)
    }

    async fn push_blob_once(&self, repo: &str, blob: &Blob) -> Result<()> {
        if self.blob_exists(repo, &blob.digest).await? {
            debug!(repo, digest = %blob.digest, "blob already present");
            return Ok(());
        }
        self.push_blob(repo, &blob.digest, &blob.data).await
    }

    /// Fetches a manifest by tag or digest; returns its digest and exact bytes. A digest
    /// reference, and the registry's `Docker-Content-Digest`, must match the bytes.
    pub async fn get_manifest(&self, repo: &str, reference: &str) -> Result<(Digest, Vec<u8>)> {
        self.get_manifest_as(repo, reference, OCI_MANIFEST).await
    }

    /// Fetches an image index (a multi-platform image) by tag or digest, checked as
    /// [`Client::get_manifest`] checks a manifest.
    pub async fn get_index(&self, repo: &str, reference: &str) -> Result<(Digest, Vec<u8>)> {
        self.get_manifest_as(repo, reference, image::OCI_INDEX).await
    }

    async fn get_manifest_as(&self, repo: &str, reference: &str, accept: &str) -> Result<(Digest, Vec<u8>)> {
        let url = self.url(repo, "manifests", reference)?;
        let req = self.http.get(&url).header(reqwest::header::ACCEPT, accept);
        let resp = self.send("GET", &url, req).await?;
        if resp.status() == reqwest::StatusCode::NOT_FOUND {
            return Err(not_found("manifest", repo, reference, url));
        }
        if !resp.status().is_success() {
            return Err(refused("GET", &url, resp).await);
        }
        let answered = content_digest(&resp, "GET", &url)?;
        let bytes = body(&url, "GET", resp).await?;
        let actual = Digest::of(&bytes);
        let by_digest = Digest::parse(reference).ok();
        for (what, expected) in [("manifest", by_digest), ("Docker-Content-Digest", Some(answered))] {
            match expected {
                Some(expected) if expected != actual => {
                    return Err(Error::DigestMismatch { url, what, expected, actual });
                }
                _ => {}
            }
        }
        Ok((actual, bytes))
    }

    /// Fetches a blob and checks that it hashes to `digest`.
    pub async fn get_blob(&self, repo: &str, digest: &Digest) -> Result<Vec<u8>> {
        let url = self.url(repo, "blobs", digest.as_str())?;
        let resp = self.send("GET", &url, self.http.get(&url)).await?;
        if resp.status() == reqwest::StatusCode::NOT_FOUND {
            return Err(not_found("blob", repo, digest.as_str(), url));
        }
        if !resp.status().is_success() {
            return Err(refused("GET", &url, resp).await);
        }
        let bytes = body(&url, "GET", resp).await?;
        let actual = Digest::of(&bytes);
        if &actual != digest {
            return Err(Error::DigestMismatch { url, what: "blob", expected: digest.clone(), actual });
        }
        Ok(bytes)
    }

    /// Pulls `repo:reference` (a tag or a digest): the manifest, the config and every layer,
    /// checking each digest and size and that the layers unpack to the config's diff IDs.
    pub async fn pull(&self, repo: &str, reference: &str) -> Result<PulledImage> {
        let (digest, manifest_bytes) = self.get_manifest(repo, reference).await?;
        let url = self.url(repo, "manifests", reference)?;
        let manifest: Manifest = serde_json::from_slice(&manifest_bytes).map_err(|e| Error::BadManifest {
            url: url.clone(),
            reason: format!("not an OCI image manifest: {e}"),
        })?;
        if let Some(mt) = manifest.media_type.as_deref().filter(|mt| *mt != OCI_MANIFEST) {
            return Err(Error::BadManifest {
                url,
                reason: format!("media type {mt}, expected {OCI_MANIFEST}"),
            });
        }
        let config = self.get_sized(repo, &manifest.config).await?;
        let mut layers = Vec::with_capacity(manifest.layers.len());
        for layer in &manifest.layers {
            layers.push(self.get_sized(repo, layer).await?);
        }
        image::verify_diff_ids(&config, &layers)?;
        info!(repo, reference, %digest, layers = layers.len(), "image pulled");
        Ok(PulledImage { digest, manifest_bytes, manifest, config, layers })
    }

    async fn get_sized(&self, repo: &str, desc: &image::Descriptor) -> Result<Vec<u8>> {
        let data = self.get_blob(repo, &desc.digest).await?;
        let actual = data.len() as u64;
        if actual != desc.size {
            return Err(Error::SizeMismatch {
                url: self.url(repo, "blobs", desc.digest.as_str())?,
                expected: desc.size,
                actual,
            });
        }
        Ok(data)
    }

    fn url(&self, repo: &str, kind: &str, rest: &str) -> Result<String> {
        check_repo(repo)?;
        Ok(format!("{}/v2/{repo}/{kind}/{rest}", self.base))
    }

    async fn send(
        &self,
        method: &'static str,
        url: &str,
        req: reqwest::RequestBuilder,
    ) -> Result<reqwest::Response> {
        req.send().await.map_err(|source| Error::Http { method, url: url.to_owned(), source })
    }
}

/// Repository names as the distribution spec allows them: lowercase path components of
/// `[a-z0-9]` joined by `.`, `_`, `-` separators.
fn check_repo(name: &str) -> Result<()> {
    let bad = |reason| Error::BadName { name: name.to_owned(), reason };
    if name.is_empty() || name.len() > 255 {
        return Err(bad("must be 1 to 255 characters"));
    }
    for part in name.split('/') {
        let edges_ok = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
        if !edges_ok(part.chars().next()) || !edges_ok(part.chars().last()) {
            return Err(bad("each path component must start and end with [a-z0-9]"));
        }
        let allowed = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-".contains(c);
        if !part.chars().all(allowed) {
            return Err(bad("only [a-z0-9._-] and `/` are allowed"));
        }
    }
    Ok(())
}

fn header(resp: &reqwest::Response, name: &str) -> Option<String> {
    resp.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned)
}

fn content_digest(resp: &reqwest::Response, method: &'static str, url: &str) -> Result<Digest> {
    header(resp, "docker-content-digest")
        .and_then(|v| Digest::parse(&v).ok())
        .ok_or_else(|| Error::MissingHeader { method, url: url.to_owned(), header: "Docker-Content-Digest" })
}

async fn body(url: &str, method: &'static str, resp: reqwest::Response) -> Result<Vec<u8>> {
    let bytes = resp.bytes().await.map_err(|source| Error::Http { method, url: url.to_owned(), source })?;
    Ok(bytes.to_vec())
}

fn not_found(what: &'static str, repo: &str, reference: &str, url: String) -> Error {
    Error::NotFound { what, repo: repo.to_owned(), reference: reference.to_owned(), url }
}

/// The error for an unexpected status, carrying the registry's error document.
async fn refused(method: &'static str, url: &str, resp: reqwest::Response) -> Error {
    let status = resp.status().as_u16();
    let body = match resp.text().await {
        Ok(text) if !text.trim().is_empty() => text.trim().to_owned(),
        Ok(_) => "(empty body)".to_owned(),
        Err(e) => format!("(body unreadable: {e})"),
    };
    Error::Refused { method, url: url.to_owned(), status, body }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repository_names_are_checked() {
        for ok in ["hpk/shell", "a", "a.b_c-d/e0"] {
            check_repo(ok).expect(ok);
        }
        for bad in ["", "Shell", "a//b", "-a", "a/", "a b"] {
            assert!(check_repo(bad).is_err(), "{bad}");
        }
    }
}
