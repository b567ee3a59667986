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

/// The certificate the server presents; replaced whole when renewed.
#[derive(Debug)]
pub struct ServingCert {
    current: RwLock<Arc<CertifiedKey>>,
}

impl ServingCert {
    /// A serving certificate from PEM text (chain and key).
    pub fn from_pem(chain_pem: &[u8], key_pem: &[u8]) -> Result<Self, String> {
        Ok(Self { current: RwLock::new(Arc::new(certified_key(chain_pem, key_pem)?)) })
    }

    /// Reads the chain and key files (the key must not be readable by others).
    pub fn from_files(cert: &Path, key: &Path) -> Result<Self, String> {
        let read = |p: &Path| std::fs::read(p).map_err(|e| format!("reading {}: {e}", p.display()));
        check_private(key)?;
        Self::from_pem(&read(cert)?, &read(key)?)
    }

    /// Presents `chain_pem`/`key_pem` from the next handshake on; the old certificate stays if
    /// the new one is unusable.
    pub fn replace(&self, chain_pem: &[u8], key_pem: &[u8]) -> Result<(), String> {
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
pub fn certified_key(chain_pem: &[u8], key_pem: &[u8]) -> Result<CertifiedKey, String> {
    let chain = CertificateDer::pem_slice_iter(chain_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("the serving certificate is not PEM: {e}"))?;
    if chain.is_empty() {
        return Err("the serving certificate file holds no certificate".into());
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem)
        .map_err(|e| format!("the serving key is not a PEM private key: {e}"))?;
    CertifiedKey::from_der(chain, key, &provider())
        .map_err(|e| format!("the serving certificate and key do not go together: {e}"))
}

/// The server's TLS configuration: `cert` presented; with `client_ca_pem`, a client may
/// present a certificate, which must chain to that CA (a certificate from another CA fails
/// the handshake); clients without one go on to token authentication.
pub fn server_config(cert: Arc<ServingCert>, client_ca_pem: Option<&[u8]>) -> Result<ServerConfig, String> {
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS versions: {e}"))?;
    let builder = match client_ca_pem {
        Some(pem) => {
            let mut roots = RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(pem) {
                let cert = cert.map_err(|e| format!("the client CA is not PEM: {e}"))?;
                roots.add(cert).map_err(|e| format!("the client CA is not a usable certificate: {e}"))?;
            }
            if roots.is_empty() {
                return Err("the client CA file holds no certificate".into());
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
                .allow_unauthenticated()
                .build()
                .map_err(|e| format!("client certificate verifier: {e}"))?;
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
pub fn check_private(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(format!("{} has mode {mode:o}; a private key must be 0600", path.display()));
    }
    Ok(())
}

/// The user a verified client certificate names: CN the user, each O a group.
pub fn certificate_user(der: &[u8]) -> Result<(String, Vec<String>), String> {
    use x509_parser::prelude::FromDer;
    let (_, cert) = x509_parser::certificate::X509Certificate::from_der(der)
        .map_err(|e| format!("client certificate: {e}"))?;
    let subject = cert.subject();
    let user = subject
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .filter(|cn| !cn.is_empty())
        .ok_or_else(|| "the client certificate has no common name".to_owned())?
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
        let err = serving.replace(b_cert.as_bytes(), a_key.as_bytes()).expect_err("mismatch");
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
