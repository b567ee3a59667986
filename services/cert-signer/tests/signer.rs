//! The real `hpk-cert-signer` binary, started on an ephemeral port, used through the real client.

mod support;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use hpk_cert_signer::Profile;
use hpk_cert_signer::client::{CertRequest, build_csr};
use hpk_proto::certsigner::v1::SignRequest;
use hpk_proto::certsigner::v1::cert_signer_client::CertSignerClient;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, pem::PemObject};
use support::{Pki, Signer, init_crypto, token_for};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use x509_parser::prelude::*;

fn serving_request(node: &str, sans: &[&str]) -> CertRequest {
    CertRequest {
        node_name: node.into(),
        profile: Profile::Serving,
        sans: sans.iter().map(|s| s.parse().expect("SAN")).collect(),
    }
}

fn parse_leaf(chain_pem: &str) -> Vec<u8> {
    let (_, pem) = parse_x509_pem(chain_pem.as_bytes()).expect("PEM chain");
    pem.contents
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serving_certificate_chains_to_the_ca_and_serves_tls() {
    init_crypto();
    let pki = Pki::new();
    let signer = Signer::start(&pki, &[]);
    let creds = signer
        .client("node-1")
        .await
        .request(&serving_request("node-1", &["node-1.hpk", "10.0.0.7"]))
        .await
        .expect("sign");

    let der = parse_leaf(&creds.chain_pem);
    let (_, cert) = X509Certificate::from_der(&der).expect("certificate");
    // Exactly the SANs asked for.
    let san = cert.subject_alternative_name().expect("SAN ext").expect("SANs present").value;
    let names: Vec<String> = san
        .general_names
        .iter()
        .map(|name| match name {
            GeneralName::IPAddress(b) if b.len() == 4 => {
                format!("IP:{}", std::net::Ipv4Addr::new(b[0], b[1], b[2], b[3]))
            }
            GeneralName::DNSName(dns) => format!("DNS:{dns}"),
            other => format!("unexpected {other}"),
        })
        .collect();
    assert_eq!(names, ["DNS:node-1.hpk", "IP:10.0.0.7"]);
    // serverAuth only, never a CA.
    let eku = cert.extended_key_usage().expect("EKU ext").expect("EKU present").value;
    assert!(eku.server_auth && !eku.client_auth && !eku.any && eku.other.is_empty());
    assert!(!cert.is_ca());
    let subject = cert.subject().to_string();
    assert!(subject.contains("CN=system:node:node-1") && subject.contains("O=system:nodes"), "{subject}");
    // Validity within the 7-day default cap.
    let expires_in = cert.validity().not_after.timestamp() - unix_now();
    assert!(expires_in <= 7 * 86_400 && expires_in > 7 * 86_400 - 60, "expires in {expires_in} s");

    // A rustls server with it completes a handshake with a client that trusts only the CA and
    // checks the SAN.
    let (addr, server) = tls_echo_server(&creds.chain_pem, &creds.key_pem).await;
    let reply = tls_roundtrip(addr, &creds.ca_pem, "node-1.hpk").await.expect("handshake with matching SAN");
    assert_eq!(reply, b"ping");
    let wrong = tls_roundtrip(addr, &creds.ca_pem, "node-2.hpk").await;
    assert!(wrong.is_err(), "a name not in the SANs must fail verification");
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificate_is_the_node_identity_for_client_auth_only() {
    init_crypto();
    let pki = Pki::new();
    let signer = Signer::start(&pki, &[]);
    let request = CertRequest { node_name: "node-2".into(), profile: Profile::Client, sans: vec![] };
    let creds = signer.client("node-2").await.request(&request).await.expect("sign");
    let der = parse_leaf(&creds.chain_pem);
    let (_, cert) = X509Certificate::from_der(&der).expect("certificate");
    let eku = cert.extended_key_usage().expect("EKU ext").expect("EKU present").value;
    assert!(eku.client_auth && !eku.server_auth);
    assert!(cert.subject_alternative_name().expect("parse").is_none(), "client certificates have no SANs");
    // Issued by the client CA, not the serving CA.
    let client_ca = std::fs::read_to_string(&pki.client_ca_cert).expect("client CA");
    assert_eq!(creds.ca_pem, client_ca);
    let ca_der = parse_leaf(&client_ca);
    let (_, ca) = X509Certificate::from_der(&ca_der).expect("CA");
    cert.verify_signature(Some(ca.public_key())).expect("signed by the client CA");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_bad_request_gets_its_code_and_the_server_keeps_serving() {
    init_crypto();
    let pki = Pki::new();
    let signer = Signer::start(&pki, &[]);
    let channel = hpk_rpc::connect::tls(&signer.url, &signer.ca_pem, None).await.expect("channel");
    let key = KeyPair::generate().expect("key");
    let good_csr = build_csr(&serving_request("n1", &["n1"]), &key).expect("csr");

    let mut ca_params = CertificateParams::default();
    ca_params.distinguished_name.push(DnType::CommonName, "system:node:n1");
    ca_params.distinguished_name.push(DnType::OrganizationName, "system:nodes");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_csr = ca_params.serialize_request(&key).expect("CA csr").pem().expect("pem");

    let (n1, n2) = (token_for("n1"), token_for("n2"));
    let (n1, n2) = (Some(n1.as_str()), Some(n2.as_str()));
    let cases: Vec<(&str, Option<&str>, SignRequest, tonic::Code)> = vec![
        ("no token", None, req("n1", &good_csr), tonic::Code::Unauthenticated),
        (
            "a token of the wrong form",
            Some("Bearer not-the-token-0123456789"),
            req("n1", &good_csr),
            tonic::Code::Unauthenticated,
        ),
        ("another node's token", n2, req("n1", &good_csr), tonic::Code::Unauthenticated),
        ("n1's token for n2", n1, req("n2", &good_csr), tonic::Code::Unauthenticated),
        ("CN of another node", n2, req("n2", &good_csr), tonic::Code::PermissionDenied),
        (
            "SAN kubernetes.default.svc",
            n1,
            req("n1", &build_csr(&serving_request("n1", &["kubernetes.default.svc"]), &key).expect("csr")),
            tonic::Code::PermissionDenied,
        ),
        ("CSR asking for a CA", n1, req("n1", &ca_csr), tonic::Code::PermissionDenied),
        ("garbage PEM", n1, req("n1", "-----BEGIN GARBAGE-----\n!!\n"), tonic::Code::InvalidArgument),
        ("10 MB request", n1, req("n1", &"A".repeat(10 * 1024 * 1024)), tonic::Code::OutOfRange),
    ];
    for (i, (name, token, request, code)) in cases.into_iter().enumerate() {
        let mut client = CertSignerClient::new(channel.clone()).max_encoding_message_size(64 * 1024 * 1024);
        let mut request = tonic::Request::new(request);
        if let Some(token) = token {
            let value =
                if token.starts_with("Bearer ") { token.to_owned() } else { format!("Bearer {token}") };
            request.metadata_mut().insert("authorization", value.parse().expect("header"));
        }
        let status = client.sign_kubelet_serving_certificate(request).await.expect_err(name);
        assert_eq!(status.code(), code, "{name}: {}", status.message());
        assert!(!status.message().is_empty(), "{name}: the message must say what is wrong");

        // The next good request on a fresh connection still succeeds (for a node of its own:
        // the token enrols each name once).
        let node = format!("ok{i}");
        let creds = signer.client(&node).await.request(&serving_request(&node, &[&node])).await;
        assert!(creds.is_ok(), "after {name}: {:?}", creds.err());
    }
    // Every decision is in the log, with the verdict.
    let log = signer.log();
    for verdict in ["issued", "unauthenticated", "denied"] {
        assert!(log.contains(&format!("verdict=\"{verdict}\"")), "no {verdict} decision in the log:\n{log}");
    }
}

fn req(node: &str, csr: &str) -> SignRequest {
    SignRequest { node_name: node.into(), csr_pem: csr.into() }
}

fn unix_now() -> i64 {
    i64::try_from(SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).expect("clock").as_secs())
        .expect("fits")
}

async fn tls_echo_server(
    chain_pem: &str,
    key_pem: &str,
) -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(chain_pem.as_bytes()).collect::<Result<_, _>>().expect("certs");
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).expect("key");
    let config =
        rustls::ServerConfig::builder().with_no_client_auth().with_single_cert(certs, key).expect("config");
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let task = tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                if let Ok(mut tls) = acceptor.accept(tcp).await {
                    let mut buf = [0u8; 4];
                    if tls.read_exact(&mut buf).await.is_ok() {
                        let _ = tls.write_all(&buf).await;
                        let _ = tls.shutdown().await;
                    }
                }
            });
        }
    });
    (addr, task)
}

async fn tls_roundtrip(addr: std::net::SocketAddr, ca_pem: &str, name: &str) -> std::io::Result<Vec<u8>> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.expect("CA cert")).expect("add root");
    }
    let config = rustls::ClientConfig::builder().with_root_certificates(roots).with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let mut tls = connector.connect(ServerName::try_from(name.to_owned()).expect("name"), tcp).await?;
    tls.write_all(b"ping").await?;
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), tls.read_to_end(&mut buf)).await??;
    Ok(buf)
}

/// Review H3: the token enrols a node once; after that only the node's current client
/// certificate, verified in the TLS handshake, gets it more, and only for its own name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_enrols_a_node_once_and_its_certificate_renews_it() {
    init_crypto();
    let pki = Pki::new();
    let signer = Signer::start(&pki, &[]);
    let client_request =
        |node: &str| CertRequest { node_name: node.into(), profile: Profile::Client, sans: vec![] };
    let first = signer.client("n1").await.request(&client_request("n1")).await.expect("enrolment");

    // The token alone, again, for either profile: refused.
    for request in [client_request("n1"), serving_request("n1", &["n1"])] {
        let refused =
            signer.client("n1").await.request(&request).await.expect_err("the token enrolled n1 already");
        assert!(
            matches!(&refused, hpk_signer_client::Error::Refused(s) if s.code() == tonic::Code::PermissionDenied && s.message().contains("already has")),
            "{refused}"
        );
    }
    // With n1's certificate: both profiles, again and again.
    let as_n1 = signer.client("n1").await.as_node(&first).await.expect("connect as n1");
    let renewed = as_n1.clone().request(&client_request("n1")).await.expect("client renewal");
    as_n1.clone().request(&serving_request("n1", &["n1"])).await.expect("serving certificate");
    let as_renewed = as_n1.as_node(&renewed).await.expect("connect with the renewed certificate");
    as_renewed.clone().request(&client_request("n1")).await.expect("renewal with the renewed certificate");
    // Not for another node, whether or not it has enrolled: n1's token is n1's only, and with
    // the other node's token (both of them leaked) n1's certificate still gets nothing for it.
    signer.client("n2").await.request(&client_request("n2")).await.expect("n2 enrols");
    for other in ["n2", "n1x"] {
        let refused = as_renewed.clone().request(&client_request(other)).await.expect_err("another node");
        assert!(
            matches!(&refused, hpk_signer_client::Error::Refused(s) if s.code() == tonic::Code::Unauthenticated && s.message().contains("not the token of the node")),
            "{refused}"
        );
        let mut with_their_token = signer.client(other).await.as_node(&renewed).await.expect("connect as n1");
        let refused = with_their_token.request(&client_request(other)).await.expect_err("another node");
        assert!(
            matches!(&refused, hpk_signer_client::Error::Refused(s) if s.code() == tonic::Code::PermissionDenied && s.message().contains("n1's")),
            "{refused}"
        );
    }
}
