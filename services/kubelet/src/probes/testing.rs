//! Test fixtures: targets on 127.0.0.1, a tiny HTTP(S) server and a gRPC health server.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Probe};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;

use super::Target;
use crate::cri::fake::FakeCri;

/// A target at 127.0.0.1 for `container` (JSON); its runtime is a fake without containers.
pub fn target(container: serde_json::Value) -> Target {
    Target {
        pod_ip: Some(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        container_id: "c1".into(),
        container: serde_json::from_value::<Container>(container).expect("a container"),
        cri: Arc::new(FakeCri::default()),
        sandbox_id: "s1".into(),
        remote: None,
    }
}

/// A probe from JSON.
pub fn probe(json: serde_json::Value) -> Probe {
    serde_json::from_value(json).expect("a probe")
}

/// What the HTTP server saw: each request's head.
pub type Seen = Arc<Mutex<Vec<String>>>;

/// An HTTP server on 127.0.0.1 answering by path: `/ok` 200, `/fail` 500, `/away` 301 to
/// another host, `/here` 302 to `/fail`, `/hop` 302 to `/ok`, `/loop` 302 to itself, `/slow`
/// after 5 s; with `tls`, HTTPS with a self-signed certificate.
pub async fn http_server(tls: bool) -> (SocketAddr, Seen) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let seen = Seen::default();
    let acceptor = tls.then(tls_acceptor);
    let log = seen.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (log, acceptor) = (log.clone(), acceptor.clone());
            tokio::spawn(async move {
                match acceptor {
                    Some(acceptor) => {
                        if let Ok(stream) = acceptor.accept(stream).await {
                            answer(stream, log).await;
                        }
                    }
                    None => answer(stream, log).await,
                }
            });
        }
    });
    (addr, seen)
}

async fn answer<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S, seen: Seen) {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let path = head.split_whitespace().nth(1).unwrap_or("/").to_owned();
    seen.lock().expect("lock").push(head);
    let (status, location) = match path.split('?').next().unwrap_or_default() {
        "/ok" => ("200 OK", None),
        "/away" => ("301 Moved Permanently", Some("http://elsewhere.invalid/")),
        "/here" => ("302 Found", Some("/fail")),
        "/hop" => ("302 Found", Some("ok")),
        "/loop" => ("302 Found", Some("/loop")),
        "/slow" => {
            tokio::time::sleep(Duration::from_secs(5)).await;
            ("200 OK", None)
        }
        _ => ("500 Internal Server Error", None),
    };
    let location = location.map(|l| format!("Location: {l}\r\n")).unwrap_or_default();
    let reply = format!("HTTP/1.1 {status}\r\n{location}Content-Length: 2\r\nConnection: close\r\n\r\nhi");
    let _ = stream.write_all(reply.as_bytes()).await;
    let _ = stream.shutdown().await;
}

fn tls_acceptor() -> tokio_rustls::TlsAcceptor {
    let certified = rcgen::generate_simple_self_signed(vec!["pod.invalid".to_owned()]).expect("certificate");
    let key = rustls_pki_types::PrivateKeyDer::Pkcs8(certified.signing_key.serialize_der().into());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(vec![certified.cert.der().clone()], key)
        .expect("server config");
    tokio_rustls::TlsAcceptor::from(Arc::new(config))
}

/// A port on 127.0.0.1 that nothing listens on (bound, then released).
pub async fn closed_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    listener.local_addr().expect("addr").port()
}

/// A gRPC health server on 127.0.0.1: the server itself and `up` SERVING, `down` NOT_SERVING.
pub async fn grpc_server() -> SocketAddr {
    use tonic_health::ServingStatus;
    let (reporter, service) = tonic_health::server::health_reporter();
    reporter.set_service_status("up", ServingStatus::Serving).await;
    reporter.set_service_status("down", ServingStatus::NotServing).await;
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    tokio::spawn(async move {
        // Holding the reporter keeps the statuses.
        let _reporter = reporter;
        let _ = tonic::transport::Server::builder().add_service(service).serve_with_incoming(incoming).await;
    });
    addr
}
