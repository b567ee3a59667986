//! A mutual-TLS listener: gRPC and an HTTP/1.1 handler on one port, for clients with a
//! certificate from the configured CA only.

use std::sync::Arc;
use std::time::Duration;

use hpk_rpc::mtls::{self, ALPN_HTTP1};
use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair};
use rustls_pki_types::ServerName;
use rustls_pki_types::pem::PemObject;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

struct Ca {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl Ca {
    fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let key = KeyPair::generate().expect("key");
        let cert = params.self_signed(&key).expect("CA");
        Self { pem: cert.pem(), issuer: Issuer::new(params, key) }
    }

    /// A leaf for `sans` with `usage`; (certificate PEM, key PEM).
    fn leaf(&self, cn: &str, sans: &[&str], usage: ExtendedKeyUsagePurpose) -> (String, String) {
        let mut params =
            CertificateParams::new(sans.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>()).expect("params");
        params.distinguished_name.push(DnType::CommonName, cn);
        params.extended_key_usages = vec![usage];
        let key = KeyPair::generate().expect("key");
        let cert = params.signed_by(&key, &self.issuer).expect("leaf");
        (cert.pem(), key.serialize_pem())
    }
}

struct Server {
    addr: std::net::SocketAddr,
    ca: Ca,
    shutdown: CancellationToken,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// A server whose HTTP/1.1 handler answers every session with one fixed line.
async fn start(client_ca: &Ca) -> Server {
    start_pinned(client_ca, &[]).await
}

async fn start_pinned(client_ca: &Ca, names: &[String]) -> Server {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let ca = Ca::new("server CA");
    let (cert, key) = ca.leaf("runtime", &["127.0.0.1"], ExtendedKeyUsagePurpose::ServerAuth);
    let handler: mtls::Http1Handler = Arc::new(|mut session| {
        tokio::spawn(async move {
            let mut buf = [0u8; 1024];
            let _ = session.read(&mut buf).await;
            let _ = session.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 6\r\n\r\nhttp1\n").await;
            let _ = session.shutdown().await;
        });
    });
    let listener = hpk_rpc::Listener::mutual_tls(
        "127.0.0.1:0".parse().expect("addr"),
        cert.as_bytes(),
        key.as_bytes(),
        client_ca.pem.as_bytes(),
        names,
    )
    .await
    .expect("listener")
    .with_http1(handler);
    let addr = listener.local_addr().expect("tcp");
    let shutdown = CancellationToken::new();
    tokio::spawn(hpk_rpc::serve(listener, hpk_rpc::Services::new(), shutdown.clone()));
    Server { addr, ca, shutdown }
}

async fn health(server: &Server, cert: &str, key: &str) -> Result<i32, String> {
    let channel = tokio::time::timeout(
        Duration::from_secs(10),
        hpk_rpc::connect::mutual_tls(
            &format!("https://{}", server.addr),
            server.ca.pem.as_bytes(),
            cert.as_bytes(),
            key.as_bytes(),
            None,
        ),
    )
    .await
    .map_err(|_| "connect timed out".to_owned())?
    .map_err(|e| format!("connect: {e}"))?;
    let answer = HealthClient::new(channel)
        .check(HealthCheckRequest { service: String::new() })
        .await
        .map_err(|e| format!("health: {e}"))?;
    Ok(answer.into_inner().status)
}

#[tokio::test]
async fn grpc_and_http1_share_the_port_for_a_client_the_ca_signed() {
    let client_ca = Ca::new("client CA");
    let server = start(&client_ca).await;
    let (cert, key) = client_ca.leaf("system:node:hpk-connector", &[], ExtendedKeyUsagePurpose::ClientAuth);
    assert_eq!(health(&server, &cert, &key).await, Ok(1), "SERVING");

    let config =
        mtls::client_config(server.ca.pem.as_bytes(), cert.as_bytes(), key.as_bytes(), &[ALPN_HTTP1])
            .expect("client config");
    let tcp = tokio::net::TcpStream::connect(server.addr).await.expect("connect");
    let mut tls = tokio_rustls::TlsConnector::from(config)
        .connect(ServerName::try_from("127.0.0.1").expect("name"), tcp)
        .await
        .expect("handshake");
    tls.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n").await.expect("write");
    let mut answer = String::new();
    tls.read_to_string(&mut answer).await.expect("read");
    assert!(answer.starts_with("HTTP/1.1 200 OK") && answer.ends_with("http1\n"), "{answer:?}");
}

#[tokio::test]
async fn a_client_without_a_certificate_is_refused() {
    let client_ca = Ca::new("client CA");
    let server = start(&client_ca).await;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pki_types::CertificateDer::pem_slice_iter(server.ca.pem.as_bytes()) {
        roots.add(cert.expect("pem")).expect("root");
    }
    let config = rustls::ClientConfig::builder().with_root_certificates(roots).with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(server.addr).await.expect("connect");
    // TLS 1.3: the client finishes first, then learns of the refusal on its first read.
    let outcome = async {
        let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(ServerName::try_from("127.0.0.1").expect("name"), tcp)
            .await?;
        tls.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n").await?;
        let mut answer = Vec::new();
        tls.read_to_end(&mut answer).await?;
        Ok::<_, std::io::Error>(answer)
    }
    .await;
    match outcome {
        Err(e) => assert!(
            e.to_string().contains("CertificateRequired") || e.to_string().contains("certificate"),
            "{e}"
        ),
        Ok(answer) => panic!("a client without a certificate got an answer: {answer:?}"),
    }
}

#[tokio::test]
async fn a_certificate_from_another_ca_is_refused() {
    let client_ca = Ca::new("client CA");
    let server = start(&client_ca).await;
    let other = Ca::new("another CA");
    let (cert, key) = other.leaf("system:node:hpk-connector", &[], ExtendedKeyUsagePurpose::ClientAuth);
    let refused = health(&server, &cert, &key).await.expect_err("refused");
    assert!(refused.contains("connect") || refused.contains("health"), "{refused}");
    // The server still serves a client it trusts.
    let (cert, key) = client_ca.leaf("system:node:hpk-connector", &[], ExtendedKeyUsagePurpose::ClientAuth);
    assert_eq!(health(&server, &cert, &key).await, Ok(1));
}

/// Review M3: with the client's name pinned, another certificate of the same CA (every
/// kubelet's, the admin's) is refused in the handshake; the pinned one is served.
#[tokio::test]
async fn with_a_pinned_name_another_certificate_of_the_same_ca_is_refused() {
    let client_ca = Ca::new("client CA");
    let server = start_pinned(&client_ca, &["hpk-connector".to_owned()]).await;
    for other in ["system:node:node-1", "hpk-admin", "hpk-connector-x", ""] {
        let (cert, key) = client_ca.leaf(other, &[], ExtendedKeyUsagePurpose::ClientAuth);
        let refused = health(&server, &cert, &key).await;
        assert!(refused.is_err(), "CN {other:?} was served: {refused:?}");
    }
    let (cert, key) = client_ca.leaf("hpk-connector", &[], ExtendedKeyUsagePurpose::ClientAuth);
    assert_eq!(health(&server, &cert, &key).await, Ok(1));
}
