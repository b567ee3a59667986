//! TLS listeners on a host port time out handshakes: silent clients and clients that stall
//! mid-handshake are closed, and a genuine client is served while they are there (review H2:
//! 300 silent connections to the cert-signer were held for 45 s, none closed).

use std::time::{Duration, Instant};

use hpk_rpc::mtls::HANDSHAKE_TIMEOUT;
use rcgen::{CertificateParams, KeyPair};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

/// Reads until the server closes `conn` (end of stream or reset); the time it took.
async fn closed_after(mut conn: TcpStream, started: Instant) -> Option<Duration> {
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout(HANDSHAKE_TIMEOUT * 2, conn.read(&mut buf)).await {
            Ok(Ok(0) | Err(_)) => return Some(started.elapsed()),
            Ok(Ok(_)) => {}
            Err(_) => return None,
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn silent_and_stalled_tls_clients_are_closed_and_a_real_one_is_served() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let key = KeyPair::generate().expect("key");
    let cert = CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .expect("params")
        .self_signed(&key)
        .expect("cert");
    let listener = hpk_rpc::Listener::tls(
        "127.0.0.1:0".parse().expect("addr"),
        cert.pem().as_bytes(),
        key.serialize_pem().as_bytes(),
    )
    .await
    .expect("listener");
    let addr = listener.local_addr().expect("tcp");
    let shutdown = CancellationToken::new();
    tokio::spawn(hpk_rpc::serve(listener, hpk_rpc::Services::new(), shutdown.clone()));

    let started = Instant::now();
    let mut waiting = Vec::new();
    for i in 0..300 {
        let mut conn = TcpStream::connect(addr).await.expect("connect");
        if i % 2 == 1 {
            // The first bytes of a ClientHello record, then nothing.
            conn.write_all(&[0x16, 0x03, 0x01]).await.expect("write");
        }
        waiting.push(tokio::spawn(closed_after(conn, started)));
    }

    // While they wait, a genuine client is served.
    let channel = hpk_rpc::connect::tls(&format!("https://{addr}"), cert.pem().as_bytes(), None)
        .await
        .expect("connect");
    let status = HealthClient::new(channel)
        .check(HealthCheckRequest { service: String::new() })
        .await
        .expect("health");
    assert_eq!(status.into_inner().status, 1, "SERVING");

    for (i, waiting) in waiting.into_iter().enumerate() {
        let after = waiting.await.expect("join");
        let after = after
            .unwrap_or_else(|| panic!("connection {i} was still open after {:?}", HANDSHAKE_TIMEOUT * 2));
        assert!(
            after >= HANDSHAKE_TIMEOUT - Duration::from_secs(1),
            "connection {i} closed after {after:?}, before its time"
        );
    }
    shutdown.cancel();
}
