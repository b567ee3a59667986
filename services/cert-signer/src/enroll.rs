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
    /// The record, opened for appending at the first enrolment and kept open.
    open: Mutex<Option<std::fs::File>>,
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
        Ok(Self { file: file.map(Path::to_owned), open: Mutex::new(None), seen: Mutex::new(seen) })
    }

    /// Decides whether `caller` may have a `profile` certificate for `node`; `issue` makes it,
    /// and the node counts as enrolled once it has. The name is reserved before `issue` runs
    /// (and freed again if it fails), so requests for other names sign at the same time while
    /// two token requests for one name cannot both pass.
    pub fn admit<T>(
        &self,
        caller: &Caller,
        profile: Profile,
        node: &str,
        issue: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        let key = (profile, node.to_owned());
        let new = {
            let mut seen = self.seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            match caller {
                Caller::Node(name) if name != node => {
                    return Err(Error::OtherNode { caller: name.clone(), node: node.to_owned() });
                }
                Caller::Node(_) => {}
                Caller::Token => {
                    for had in [Profile::Serving, Profile::Client] {
                        if seen.contains(&(had, node.to_owned())) {
                            return Err(Error::AlreadyEnrolled { node: node.to_owned(), profile: had });
                        }
                    }
                }
            }
            seen.insert(key.clone())
        };
        match issue() {
            Ok(issued) => {
                if new {
                    // On failure the name stays taken: nothing was handed out, and a name
                    // whose record could not be written must not be enrolled a second time
                    // after a restart.
                    self.record(profile, node)?;
                }
                Ok(issued)
            }
            Err(e) => {
                if new {
                    self.seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&key);
                }
                Err(e)
            }
        }
    }

    /// Appends `PROFILE NODE` as one write to the record, kept open: no line is left
    /// half-written by a crash between writes.
    fn record(&self, profile: Profile, node: &str) -> Result<()> {
        let Some(path) = &self.file else { return Ok(()) };
        let mut open = self.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if open.is_none() {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .mode(0o600)
                .open(path)
                .map_err(|e| Error::file("open", path, e))?;
            *open = Some(file);
        }
        let file = open.as_mut().ok_or_else(|| Error::Config(format!("{}: not open", path.display())))?;
        file.write_all(format!("{profile} {node}\n").as_bytes()).map_err(|e| Error::file("write", path, e))
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

    /// Counts this thread in at `gate` and waits (at most 10 s, then fails) until `n` are in:
    /// a barrier that cannot hang a test.
    fn meet(gate: &std::sync::atomic::AtomicUsize, n: usize) {
        use std::sync::atomic::Ordering;
        gate.fetch_add(1, Ordering::SeqCst);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while gate.load(Ordering::SeqCst) < n {
            assert!(std::time::Instant::now() < deadline, "only {} of {n} met", gate.load(Ordering::SeqCst));
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    #[test]
    fn names_sign_at_once_but_one_name_is_enrolled_by_one_request_only() {
        use std::sync::atomic::AtomicUsize;
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("enrolled");
        let enrolment = Enrolment::load(Some(&file)).expect("load");
        // Eight requests for eight names are all inside `issue` at the same moment, so no
        // lock is held while signing.
        let all_in = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for i in 0..8 {
                let (enrolment, all_in) = (&enrolment, &all_in);
                s.spawn(move || {
                    let name = format!("n{i}");
                    enrolment
                        .admit(&Caller::Token, Profile::Client, &name, || {
                            meet(all_in, 8);
                            Ok(())
                        })
                        .expect("enrolled");
                });
            }
        });
        // Seven more requests for one name while the first is still signing: all refused.
        let (signing, answered) = (AtomicUsize::new(0), AtomicUsize::new(0));
        std::thread::scope(|s| {
            let (enrolment, signing, answered) = (&enrolment, &signing, &answered);
            s.spawn(move || {
                enrolment
                    .admit(&Caller::Token, Profile::Serving, "same", || {
                        meet(signing, 2);
                        meet(answered, 2);
                        Ok(())
                    })
                    .expect("the first");
            });
            meet(signing, 2);
            for _ in 0..7 {
                let refused = enrolment.admit(&Caller::Token, Profile::Serving, "same", issue);
                assert!(matches!(refused, Err(Error::AlreadyEnrolled { .. })), "{refused:?}");
            }
            meet(answered, 2);
        });
        // Whole lines, one per enrolment.
        let text = std::fs::read_to_string(&file).expect("record");
        let mut lines: Vec<&str> = text.lines().collect();
        lines.sort_unstable();
        let mut want: Vec<String> = (0..8).map(|i| format!("client n{i}")).collect();
        want.push("serving same".into());
        want.sort();
        assert_eq!(lines, want);
        assert!(Enrolment::load(Some(&file)).is_ok());
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
