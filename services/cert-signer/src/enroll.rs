//! Which nodes hold certificates, and who may ask for more (review H3).
//!
//! The node token enrols a node name once: its first certificate, of either profile. After
//! that, a certificate for that name is issued only to a caller presenting the node's current client certificate
//! (`CN=system:node:NAME, O=system:nodes`, from the client CA, checked in the TLS handshake),
//! and a caller presenting one obtains certificates for its own name only. So a leaked token
//! yields no certificate for a node that already joined. The record survives a restart of the
//! signer when it is kept in a file.

use std::collections::BTreeSet;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use x509_parser::oid_registry::{OID_X509_COMMON_NAME, OID_X509_ORGANIZATION_NAME};
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::{Error, Profile, Result};

/// Who is asking, as the TLS handshake proved it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Caller {
    /// Only the token.
    Token,
    /// The holder of node `NAME`'s client certificate.
    Node(String),
}

impl Caller {
    /// The caller a verified client certificate (DER) names: a node's identity, or, for any
    /// other certificate, nothing beyond the token.
    pub fn from_certificate(der: &[u8]) -> Self {
        let Ok((_, cert)) = X509Certificate::from_der(der) else { return Self::Token };
        let subject = cert.subject();
        let cn: Vec<&str> =
            subject.iter_by_oid(&OID_X509_COMMON_NAME).filter_map(|a| a.as_str().ok()).collect();
        let orgs: Vec<&str> =
            subject.iter_by_oid(&OID_X509_ORGANIZATION_NAME).filter_map(|a| a.as_str().ok()).collect();
        match (cn.as_slice(), orgs.contains(&"system:nodes")) {
            ([cn], true) => cn.strip_prefix("system:node:").map_or(Self::Token, |n| Self::Node(n.to_owned())),
            _ => Self::Token,
        }
    }
}

/// The nodes enrolled so far, by profile.
pub struct Enrolment {
    file: Option<PathBuf>,
    seen: Mutex<BTreeSet<(Profile, String)>>,
}

impl Enrolment {
    /// Starts from `file` (one `PROFILE NODE` line each) if given and present.
    pub fn load(file: Option<&Path>) -> Result<Self> {
        let mut seen = BTreeSet::new();
        if let Some(path) = file {
            match std::fs::read_to_string(path) {
                Ok(text) => {
                    for line in text.lines().filter(|l| !l.trim().is_empty()) {
                        let parsed = line.split_once(' ').and_then(|(profile, node)| {
                            let profile = match profile {
                                "serving" => Profile::Serving,
                                "client" => Profile::Client,
                                _ => return None,
                            };
                            Some((profile, node.to_owned()))
                        });
                        let entry = parsed.ok_or_else(|| {
                            Error::Config(format!("{}: unreadable line {line:?}", path.display()))
                        })?;
                        seen.insert(entry);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(Error::file("read", path, e)),
            }
        }
        Ok(Self { file: file.map(Path::to_owned), seen: Mutex::new(seen) })
    }

    /// Decides whether `caller` may have a `profile` certificate for `node`; `issue` makes it,
    /// and the node counts as enrolled once it has.
    pub fn admit<T>(
        &self,
        caller: &Caller,
        profile: Profile,
        node: &str,
        issue: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        let mut seen = self.seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let key = (profile, node.to_owned());
        match caller {
            Caller::Node(name) if name != node => {
                return Err(Error::OtherNode { caller: name.clone(), node: node.to_owned() });
            }
            Caller::Node(_) => {}
            Caller::Token => {
                if let Some((had, _)) = seen.iter().find(|(_, n)| n == node) {
                    return Err(Error::AlreadyEnrolled { node: node.to_owned(), profile: *had });
                }
            }
        }
        let issued = issue()?;
        if seen.insert(key) {
            self.record(profile, node)?;
        }
        Ok(issued)
    }

    fn record(&self, profile: Profile, node: &str) -> Result<()> {
        let Some(path) = &self.file else { return Ok(()) };
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| Error::file("open", path, e))?;
        writeln!(file, "{profile} {node}").map_err(|e| Error::file("write", path, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn issue() -> Result<()> {
        Ok(())
    }

    #[test]
    fn the_token_enrols_a_name_once_and_its_certificate_renews_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("enrolled");
        let enrolment = Enrolment::load(Some(&file)).expect("load");
        enrolment.admit(&Caller::Token, Profile::Client, "n1", issue).expect("first enrolment");
        let again = enrolment.admit(&Caller::Token, Profile::Client, "n1", issue).expect_err("token again");
        assert!(matches!(again, Error::AlreadyEnrolled { .. }), "{again}");
        // Nor another profile: the node has joined.
        let serving =
            enrolment.admit(&Caller::Token, Profile::Serving, "n1", issue).expect_err("serving by token");
        assert!(matches!(serving, Error::AlreadyEnrolled { .. }), "{serving}");
        // The node's certificate gets either.
        let node = Caller::Node("n1".into());
        enrolment.admit(&node, Profile::Client, "n1", issue).expect("renewal");
        enrolment.admit(&node, Profile::Serving, "n1", issue).expect("renewal");
        let other = enrolment.admit(&node, Profile::Client, "n2", issue).expect_err("another node");
        assert!(matches!(other, Error::OtherNode { .. }), "{other}");
        // A refused or failed issue enrols nothing.
        let failed =
            enrolment.admit(&Caller::Token, Profile::Client, "n3", || Err::<(), _>(Error::CaRequested));
        assert!(failed.is_err());
        enrolment.admit(&Caller::Token, Profile::Client, "n3", issue).expect("n3 still enrols");

        // A restarted signer remembers.
        let restarted = Enrolment::load(Some(&file)).expect("reload");
        let again = restarted.admit(&Caller::Token, Profile::Serving, "n1", issue).expect_err("remembered");
        assert!(matches!(again, Error::AlreadyEnrolled { .. }), "{again}");
        let mode =
            std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&file).expect("meta").permissions());
        assert_eq!(mode & 0o777, 0o600);
        std::fs::write(&file, "admin n1\n").expect("write");
        assert!(Enrolment::load(Some(&file)).is_err(), "a damaged record is refused");
    }

    #[test]
    fn only_a_node_certificate_names_a_node() {
        let params = |cn: &str, org: Option<&str>| {
            let mut p = rcgen::CertificateParams::default();
            p.distinguished_name.push(rcgen::DnType::CommonName, cn);
            if let Some(org) = org {
                p.distinguished_name.push(rcgen::DnType::OrganizationName, org);
            }
            let key = rcgen::KeyPair::generate().expect("key");
            p.self_signed(&key).expect("cert").der().to_vec()
        };
        assert_eq!(
            Caller::from_certificate(&params("system:node:n1", Some("system:nodes"))),
            Caller::Node("n1".into())
        );
        assert_eq!(Caller::from_certificate(&params("system:node:n1", None)), Caller::Token);
        assert_eq!(Caller::from_certificate(&params("hpk-admin", Some("system:masters"))), Caller::Token);
        assert_eq!(Caller::from_certificate(b"not a certificate"), Caller::Token);
    }
}
