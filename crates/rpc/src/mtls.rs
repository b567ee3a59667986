//! Mutual TLS: a server that takes only clients with a certificate from a given CA, and the
//! client configuration that presents one.
//!
//! One listening port serves two protocols, told apart by ALPN after the handshake: `h2` is
//! gRPC, `http/1.1` goes to an optional handler (the pod-runtime's streaming server for exec,
//! attach and port-forward). Both have passed the same client-certificate check before a byte
//! of either is read.

use std::sync::Arc;
use std::time::Duration;

use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// ALPN of gRPC.
pub const ALPN_H2: &[u8] = b"h2";
/// ALPN of the HTTP/1.1 upgrade requests of the streaming protocols.
pub const ALPN_HTTP1: &[u8] = b"http/1.1";

/// How long a client may take to complete its handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A TLS session a server accepted: the client has presented a certificate the CA signed.
pub type ServerStream = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;

/// Takes the `http/1.1` sessions of a mutual-TLS listener.
pub type Http1Handler = Arc<dyn Fn(ServerStream) + Send + Sync>;

/// Errors of building a TLS configuration from PEM.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM input holds nothing usable.
    #[error("{what}: {reason}")]
    Pem {
        /// Which input.
        what: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// rustls refused the combination.
    #[error("{what}: {source}")]
    Rustls {
        /// What was being built.
        what: &'static str,
        /// Its error.
        #[source]
        source: rustls::Error,
    },
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The certificates of a PEM input; an error names `what` when there is none or one is
/// malformed.
pub fn certificates(what: &'static str, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem { what, reason: e.to_string() })?;
    if certs.is_empty() {
        return Err(TlsError::Pem { what, reason: "no CERTIFICATE block".into() });
    }
    Ok(certs)
}

fn private_key(what: &'static str, pem: &[u8]) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| TlsError::Pem { what, reason: e.to_string() })
}

fn roots(what: &'static str, ca_pem: &[u8]) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in certificates(what, ca_pem)? {
        roots.add(cert).map_err(|source| TlsError::Rustls { what, source })?;
    }
    Ok(roots)
}

/// A server configuration that requires a client certificate signed by a CA of `client_ca_pem`
/// and offers `h2` and `http/1.1`. With `client_names`, the certificate's subject common name
/// must also be one of them (review M3: a CA may sign for others than the one client served).
pub fn server_config(
    cert_chain_pem: &[u8],
    key_pem: &[u8],
    client_ca_pem: &[u8],
    client_names: &[String],
) -> Result<Arc<ServerConfig>, TlsError> {
    let webpki = WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots("the client CA", client_ca_pem)?),
        provider(),
    )
    .build()
    .map_err(|e| TlsError::Pem { what: "the client CA", reason: e.to_string() })?;
    let verifier: Arc<dyn rustls::server::danger::ClientCertVerifier> = if client_names.is_empty() {
        webpki
    } else {
        Arc::new(PinnedNames { inner: webpki, names: client_names.to_vec() })
    };
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|source| TlsError::Rustls { what: "TLS versions", source })?
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            certificates("the server certificate", cert_chain_pem)?,
            private_key("the server key", key_pem)?,
        )
        .map_err(|source| TlsError::Rustls { what: "the server certificate and key", source })?;
    config.alpn_protocols = vec![ALPN_H2.to_vec(), ALPN_HTTP1.to_vec()];
    Ok(Arc::new(config))
}

/// The CA's verification, then the subject's common name checked against the names allowed.
#[derive(Debug)]
struct PinnedNames {
    inner: Arc<dyn rustls::server::danger::ClientCertVerifier>,
    names: Vec<String>,
}

/// The subject common name of a DER certificate.
pub fn common_name(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let cn = cert.subject().iter_common_name().next()?.as_str().ok()?.to_owned();
    Some(cn)
}

impl rustls::server::danger::ClientCertVerifier for PinnedNames {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn root_hint_subjects(&self) -> &[rustls::DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: rustls_pki_types::UnixTime,
    ) -> Result<rustls::server::danger::ClientCertVerified, rustls::Error> {
        let verified = self.inner.verify_client_cert(end_entity, intermediates, now)?;
        match common_name(end_entity) {
            Some(cn) if self.names.contains(&cn) => Ok(verified),
            Some(cn) => Err(rustls::Error::General(format!(
                "client certificate CN {cn:?} is not one this server serves ({})",
                self.names.join(", ")
            ))),
            None => Err(rustls::Error::General("client certificate has no common name".into())),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// A client configuration trusting only `ca_pem`, presenting `cert_pem`/`key_pem`, offering
/// the ALPN protocols given.
pub fn client_config(
    ca_pem: &[u8],
    cert_pem: &[u8],
    key_pem: &[u8],
    alpn: &[&[u8]],
) -> Result<Arc<ClientConfig>, TlsError> {
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|source| TlsError::Rustls { what: "TLS versions", source })?
        .with_root_certificates(roots("the server CA", ca_pem)?)
        .with_client_auth_cert(
            certificates("the client certificate", cert_pem)?,
            private_key("the client key", key_pem)?,
        )
        .map_err(|source| TlsError::Rustls { what: "the client certificate and key", source })?;
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

/// Reads a PEM file given by command-line flag `flag`; with `secret`, refuses one that the
/// group or others may read (a private key must be 0600 or 0400). Errors name the flag, the
/// path and the fix.
pub fn read_pem_file(flag: &str, path: &std::path::Path, secret: bool) -> Result<Vec<u8>, String> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).map_err(|e| format!("{flag} {}: {e}", path.display()))?;
    if secret && meta.mode() & 0o077 != 0 {
        return Err(format!(
            "{flag} {} has mode {:04o}; a private key must be readable by its owner only (chmod 0600)",
            path.display(),
            meta.mode() & 0o7777
        ));
    }
    std::fs::read(path).map_err(|e| format!("{flag} {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn a_key_others_may_read_is_refused_and_named() {
        let dir = tempfile::tempdir().expect("tmp");
        let key = dir.path().join("tls.key");
        std::fs::write(&key, "-----BEGIN PRIVATE KEY-----\n").expect("write");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let err = read_pem_file("--tls-private-key-file", &key, true).expect_err("0644 key");
        assert!(
            err.contains("--tls-private-key-file") && err.contains("0644") && err.contains("chmod 0600"),
            "{err}"
        );
        assert!(read_pem_file("--tls-cert-file", &key, false).is_ok(), "a certificate may be 0644");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o400)).expect("chmod");
        assert!(read_pem_file("--tls-private-key-file", &key, true).is_ok());
        let err = read_pem_file("--client-ca-file", &dir.path().join("gone"), false).expect_err("missing");
        assert!(err.contains("--client-ca-file") && err.contains("gone"), "{err}");
    }

    #[test]
    fn bad_pem_is_named() {
        let err = server_config(b"junk", b"junk", b"junk", &[]).expect_err("junk refused");
        assert!(err.to_string().contains("client CA"), "{err}");
        let err = client_config(b"", b"", b"", &[ALPN_H2]).expect_err("empty refused");
        assert!(err.to_string().contains("server CA"), "{err}");
    }
}
