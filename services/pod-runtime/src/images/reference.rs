//! Image references as CRI and containerd normalise them, digests, and credentials.

use std::fmt;

use sha2::{Digest as _, Sha256};

use super::error::{Error, Result};

/// A reference to pull, normalised: `busybox` is `docker.io/library/busybox:latest`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRef {
    registry: String,
    repository: String,
    tag: Option<String>,
    digest: Option<String>,
}

impl ImageRef {
    /// Parses and normalises `reference`. With both a tag and a digest the digest wins and the
    /// tag is dropped, as containerd does: the tag could name other content by now.
    pub fn parse(reference: &str) -> Result<Self> {
        let bad = |reason: String| Error::BadReference { reference: reference.to_owned(), reason };
        if is_hex64(reference) {
            return Err(bad("that is an image ID, not a reference".to_owned()));
        }
        let parsed = oci_client::Reference::try_from(reference).map_err(|e| bad(e.to_string()))?;
        let digest = match parsed.digest() {
            Some(d) => Some(check_digest(d).map_err(|_| bad("only sha256 digests are supported".into()))?),
            None => None,
        };
        let tag = if digest.is_some() { None } else { parsed.tag().map(str::to_owned) };
        Ok(Self {
            registry: parsed.registry().to_owned(),
            repository: parsed.repository().to_owned(),
            tag,
            digest: digest.map(str::to_owned),
        })
    }

    /// `registry/repository`.
    pub fn name(&self) -> String {
        format!("{}/{}", self.registry, self.repository)
    }

    /// The registry's host (and port), as written in the reference.
    pub fn registry(&self) -> &str {
        &self.registry
    }

    /// `name:tag`, when the reference has a tag.
    pub fn tagged(&self) -> Option<String> {
        self.tag.as_ref().map(|t| format!("{}:{t}", self.name()))
    }

    /// The digest, when the reference has one.
    pub fn digest(&self) -> Option<&str> {
        self.digest.as_deref()
    }

    /// `name@digest`.
    pub fn with_digest(&self, digest: &str) -> String {
        format!("{}@{digest}", self.name())
    }

    /// The same reference for the distribution client.
    pub(crate) fn to_oci(&self) -> oci_client::Reference {
        match &self.digest {
            Some(d) => {
                oci_client::Reference::with_digest(self.registry.clone(), self.repository.clone(), d.clone())
            }
            None => oci_client::Reference::with_tag(
                self.registry.clone(),
                self.repository.clone(),
                self.tag.clone().unwrap_or_else(|| "latest".to_owned()),
            ),
        }
    }
}

impl fmt::Display for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.digest, &self.tag) {
            (Some(d), _) => write!(f, "{}@{d}", self.name()),
            (None, Some(t)) => write!(f, "{}:{t}", self.name()),
            (None, None) => f.write_str(&self.name()),
        }
    }
}

/// How `status` and `remove` find an image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Lookup {
    /// By image ID, `sha256:<hex>`.
    Id(String),
    /// By `name:tag`.
    Tag(String),
    /// By `name@digest`.
    Digest(String),
}

impl Lookup {
    /// An image ID (`sha256:<hex>` or bare hex), else a reference normalised like a pull's.
    pub(crate) fn parse(s: &str) -> Result<Self> {
        if is_hex64(s) {
            return Ok(Self::Id(format!("sha256:{s}")));
        }
        if s.starts_with("sha256:") {
            return check_digest(s).map(|d| Self::Id(d.to_owned()));
        }
        let image = ImageRef::parse(s)?;
        Ok(match (image.digest(), image.tagged()) {
            (Some(d), _) => Self::Digest(image.with_digest(d)),
            (None, Some(tagged)) => Self::Tag(tagged),
            (None, None) => Self::Tag(format!("{}:latest", image.name())),
        })
    }
}

/// Checks that `s` is `sha256:<64 lowercase hex>`; digests become file names, so nothing else
/// may pass.
pub(crate) fn check_digest(s: &str) -> Result<&str> {
    match s.strip_prefix("sha256:") {
        Some(hex) if is_hex64(hex) => Ok(s),
        _ => Err(Error::BadReference {
            reference: s.to_owned(),
            reason: "not a sha256 digest (sha256:<64 lowercase hex digits>)".to_owned(),
        }),
    }
}

/// The hex part of a digest already checked by [`check_digest`].
pub(crate) fn hex_of(digest: &str) -> &str {
    digest.strip_prefix("sha256:").unwrap_or(digest)
}

fn is_hex64(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// `sha256:<hex>` of `data`.
pub(crate) fn sha256_digest(data: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(data)))
}

/// Registry credentials, as the CRI `AuthConfig` carries them.
#[derive(Clone, PartialEq, Eq)]
pub enum Credentials {
    /// HTTP basic: `username`/`password` (CRI's `auth` field is these, base64'd).
    Basic {
        /// The user name.
        username: String,
        /// The password.
        password: String,
    },
    /// A bearer token for the registry itself (`registry_token`).
    RegistryToken(String),
    /// An OAuth2 refresh token to exchange at the registry's token service (`identity_token`).
    IdentityToken(String),
}

impl Credentials {
    /// A fingerprint that tells credentials apart without holding them, so that only pulls with
    /// the same credentials share one download.
    pub(crate) fn fingerprint(auth: Option<&Self>) -> String {
        let secret = match auth {
            None => return "anonymous".to_owned(),
            Some(Self::Basic { username, password }) => format!("basic\0{username}\0{password}"),
            Some(Self::RegistryToken(t)) => format!("registry\0{t}"),
            Some(Self::IdentityToken(t)) => format!("identity\0{t}"),
        };
        sha256_digest(secret.as_bytes())
    }
}

// Never print secrets, not even in debug logs.
impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Basic { username, .. } => write!(f, "Basic({username:?}, <redacted>)"),
            Self::RegistryToken(_) => f.write_str("RegistryToken(<redacted>)"),
            Self::IdentityToken(_) => f.write_str("IdentityToken(<redacted>)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_normalise_like_containerd() {
        let cases = [
            ("busybox", "docker.io/library/busybox:latest"),
            ("busybox:1.36", "docker.io/library/busybox:1.36"),
            ("library/busybox", "docker.io/library/busybox:latest"),
            ("index.docker.io/library/busybox", "docker.io/library/busybox:latest"),
            ("127.0.0.1:5000/hpk/shell:v1", "127.0.0.1:5000/hpk/shell:v1"),
            ("localhost/x", "localhost/x:latest"),
        ];
        for (given, want) in cases {
            assert_eq!(ImageRef::parse(given).expect(given).to_string(), want, "{given}");
        }
        let d = format!("sha256:{}", "a".repeat(64));
        let both = ImageRef::parse(&format!("busybox:1@{d}")).expect("tag and digest");
        assert_eq!(both.to_string(), format!("docker.io/library/busybox@{d}"));
        assert_eq!(both.tagged(), None);
    }

    #[test]
    fn bad_references_are_refused() {
        for bad in ["", "Busybox", "a b", "busybox@sha256:abc", "busybox@md5:00", &"a".repeat(64), "x:"] {
            assert!(matches!(ImageRef::parse(bad), Err(Error::BadReference { .. })), "{bad:?}");
        }
    }

    #[test]
    fn lookups_tell_ids_from_references() {
        let hex = "b".repeat(64);
        assert_eq!(Lookup::parse(&hex).expect("hex"), Lookup::Id(format!("sha256:{hex}")));
        assert_eq!(Lookup::parse(&format!("sha256:{hex}")).expect("id"), Lookup::Id(format!("sha256:{hex}")));
        assert_eq!(
            Lookup::parse("busybox").expect("tag"),
            Lookup::Tag("docker.io/library/busybox:latest".into())
        );
        assert_eq!(
            Lookup::parse(&format!("busybox@sha256:{hex}")).expect("digest"),
            Lookup::Digest(format!("docker.io/library/busybox@sha256:{hex}"))
        );
        assert!(Lookup::parse("sha256:short").is_err());
    }

    #[test]
    fn digests_are_strict() {
        assert!(check_digest(&sha256_digest(b"x")).is_ok());
        for bad in ["sha256:../../etc", "sha512:00", &format!("sha256:{}", "A".repeat(64))] {
            assert!(check_digest(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn credentials_are_redacted_and_told_apart() {
        let basic = Credentials::Basic { username: "u".into(), password: "hunter2".into() };
        assert!(!format!("{basic:?}").contains("hunter2"));
        let other = Credentials::Basic { username: "u".into(), password: "other".into() };
        assert_ne!(Credentials::fingerprint(Some(&basic)), Credentials::fingerprint(Some(&other)));
        assert_ne!(Credentials::fingerprint(None), Credentials::fingerprint(Some(&basic)));
    }
}
