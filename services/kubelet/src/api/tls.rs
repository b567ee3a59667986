//! The kubelet API's TLS: the serving certificate — from files, or requested from the
//! cert-signer for a key generated here and swapped in when renewed, without a restart — and
//! client certificates, accepted only when the API server's client CA signed them.

use std::path::Path;
use std::sync::{Arc, RwLock};

use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// Why a certificate, key or CA could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("reading {}: {source}", .path.display())]
    Read {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A private key others can read.
    #[error("{} has mode {mode:o}; a private key must be 0600", .path.display())]
    KeyNotPrivate {
        /// The key file.
        path: std::path::PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The serving certificate is not PEM.
    #[error("the serving certificate is not PEM: {0}")]
    CertNotPem(#[source] rustls_pki_types::pem::Error),
    /// The serving certificate file holds none.
    #[error("the serving certificate file holds no certificate")]
    NoCert,
    /// The key is not a PEM private key.
    #[error("the serving key is not a PEM private key: {0}")]
    KeyNotPem(#[source] rustls_pki_types::pem::Error),
    /// The certificate and key are not a pair.
    #[error("the serving certificate and key do not go together: {0}")]
    Mismatch(#[source] rustls::Error),
    /// The TLS configuration could not be built.
    #[error("TLS versions: {0}")]
    Versions(#[source] rustls::Error),
    /// The client CA is not PEM.
    #[error("the client CA is not PEM: {0}")]
    CaNotPem(#[source] rustls_pki_types::pem::Error),
    /// The client CA is no usable certificate.
    #[error("the client CA is not a usable certificate: {0}")]
    CaUnusable(#[source] rustls::Error),
    /// The client CA file holds none.
    #[error("the client CA file holds no certificate")]
    NoCa,
    /// The client verifier could not be built.
    #[error("client certificate verifier: {0}")]
    Verifier(#[source] rustls::server::VerifierBuilderError),
    /// A client certificate that does not parse.
    #[error("client certificate: {0}")]
    ClientCert(String),
    /// A client certificate without a common name.
    #[error("the client certificate has no common name")]
    NoCommonName,
}

/// The certificate the server presents; replaced whole when renewed.
#[derive(Debug)]
pub struct ServingCert {
    current: RwLock<Arc<CertifiedKey>>,
}

impl ServingCert {
    /// A serving certificate from PEM text (chain and key).
    pub fn from_pem(chain_pem: &[u8], key_pem: &[u8]) -> Result<Self, TlsError> {
        Ok(Self { current: RwLock::new(Arc::new(certified_key(chain_pem, key_pem)?)) })
    }

    /// Reads the chain and key files (the key must not be readable by others).
    pub fn from_files(cert: &Path, key: &Path) -> Result<Self, TlsError> {
        let read =
            |p: &Path| std::fs::read(p).map_err(|source| TlsError::Read { path: p.to_owned(), source });
        check_private(key)?;
        Self::from_pem(&read(cert)?, &read(key)?)
    }

    /// Presents `chain_pem`/`key_pem` from the next handshake on; the old certificate stays if
    /// the new one is unusable.
    pub fn replace(&self, chain_pem: &[u8], key_pem: &[u8]) -> Result<(), TlsError> {
        let key = Arc::new(certified_key(chain_pem, key_pem)?);
        *self.current.write().unwrap_or_else(std::sync::PoisonError::into_inner) = key;
        Ok(())
    }

    fn get(&self) -> Arc<CertifiedKey> {
        self.current.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}

impl ResolvesServerCert for ServingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.get())
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Parses a PEM chain and its key, and checks they belong together.
pub fn certified_key(chain_pem: &[u8], key_pem: &[u8]) -> Result<CertifiedKey, TlsError> {
    let chain = CertificateDer::pem_slice_iter(chain_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(TlsError::CertNotPem)?;
    if chain.is_empty() {
        return Err(TlsError::NoCert);
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(TlsError::KeyNotPem)?;
    CertifiedKey::from_der(chain, key, &provider()).map_err(TlsError::Mismatch)
}

/// The server's TLS configuration: `cert` presented; with `client_ca_pem`, a client may
/// present a certificate, which must chain to that CA (a certificate from another CA fails
/// the handshake); clients without one go on to token authentication.
pub fn server_config(cert: Arc<ServingCert>, client_ca_pem: Option<&[u8]>) -> Result<ServerConfig, TlsError> {
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Versions)?;
    let builder = match client_ca_pem {
        Some(pem) => {
            let mut roots = RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(pem) {
                roots.add(cert.map_err(TlsError::CaNotPem)?).map_err(TlsError::CaUnusable)?;
            }
            if roots.is_empty() {
                return Err(TlsError::NoCa);
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
                .allow_unauthenticated()
                .build()
                .map_err(TlsError::Verifier)?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_cert_resolver(cert);
    // HTTP/1.1 only: exec, attach and port-forward are HTTP/1.1 upgrades.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// Refuses a key file others can read.
pub fn check_private(path: &Path) -> Result<(), TlsError> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path).map_err(|source| TlsError::Read { path: path.to_owned(), source })?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(TlsError::KeyNotPrivate { path: path.to_owned(), mode });
    }
    Ok(())
}

/// The user a verified client certificate names: CN the user, each O a group.
pub fn certificate_user(der: &[u8]) -> Result<(String, Vec<String>), TlsError> {
    use x509_parser::prelude::FromDer;
    let (_, cert) = x509_parser::certificate::X509Certificate::from_der(der)
        .map_err(|e| TlsError::ClientCert(e.to_string()))?;
    let subject = cert.subject();
    let user = subject
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .filter(|cn| !cn.is_empty())
        .ok_or(TlsError::NoCommonName)?
        .to_owned();
    let groups = subject.iter_organization().filter_map(|o| o.as_str().ok()).map(str::to_owned).collect();
    Ok((user, groups))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert(cn: &str, orgs: &[&str]) -> (String, String) {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params = rcgen::CertificateParams::new(vec!["node1".to_owned()]).expect("params");
        params.distinguished_name.push(rcgen::DnType::CommonName, cn);
        for o in orgs {
            params.distinguished_name.push(rcgen::DnType::OrganizationName, *o);
        }
        let cert = params.self_signed(&key).expect("sign");
        (cert.pem(), key.serialize_pem())
    }

    #[test]
    fn user_and_groups_come_from_cn_and_o() {
        // (rcgen keeps one value per attribute type, so one O here.)
        let (pem, _) = cert("kube-apiserver-kubelet-client", &["system:masters"]);
        let der = CertificateDer::from_pem_slice(pem.as_bytes()).expect("der");
        let (user, groups) = certificate_user(&der).expect("user");
        assert_eq!(user, "kube-apiserver-kubelet-client");
        assert_eq!(groups, ["system:masters"]);
        let (pem, _) = cert("", &[]);
        let der = CertificateDer::from_pem_slice(pem.as_bytes()).expect("der");
        assert!(certificate_user(&der).is_err(), "no common name, no user");
    }

    #[test]
    fn a_key_of_another_certificate_is_refused_and_the_old_one_kept() {
        let (a_cert, a_key) = cert("a", &[]);
        let (b_cert, _) = cert("b", &[]);
        let serving = ServingCert::from_pem(a_cert.as_bytes(), a_key.as_bytes()).expect("a");
        let before = serving.get();
        let err = serving.replace(b_cert.as_bytes(), a_key.as_bytes()).expect_err("mismatch").to_string();
        assert!(err.contains("do not go together"), "{err}");
        assert!(Arc::ptr_eq(&before, &serving.get()));
        assert!(ServingCert::from_pem(b"garbage", a_key.as_bytes()).is_err());
        assert!(ServingCert::from_pem(a_cert.as_bytes(), b"garbage").is_err());
    }

    #[test]
    fn a_client_ca_without_certificates_is_refused() {
        let (a_cert, a_key) = cert("a", &[]);
        let serving = Arc::new(ServingCert::from_pem(a_cert.as_bytes(), a_key.as_bytes()).expect("a"));
        assert!(server_config(serving.clone(), Some(b"")).is_err());
        assert!(server_config(serving.clone(), Some(a_cert.as_bytes())).is_ok());
        assert!(server_config(serving, None).is_ok());
    }
}
