//! The `rpc` span and event of real calls through [`crate::serve`]: over a UNIX socket (unary
//! with the status in trailers, a trailers-only error, a stream the client abandons), over TLS
//! (the peer's address) and over mutual TLS (its certificate's name and address).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;
use tracing::Subscriber;
use tracing::field::{Field, Visit};
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// One event: the name of the span it happened in, and its fields.
#[derive(Clone, Debug)]
struct Captured {
    span: Option<String>,
    fields: BTreeMap<String, String>,
}

/// Keeps every event it sees.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<Captured>>>);

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_event(&self, event: &tracing::Event<'_>, ctx: Context<'_, S>) {
        let mut fields = BTreeMap::new();
        event.record(&mut Fields(&mut fields));
        let span = ctx.event_span(event).map(|span| span.name().to_owned());
        self.0.lock().expect("lock").push(Captured { span, fields });
    }
}

impl Capture {
    /// The `rpc completed` events so far.
    fn calls(&self) -> Vec<Captured> {
        let all = self.0.lock().expect("lock");
        all.iter()
            .filter(|e| e.fields.get("message").is_some_and(|m| m == "rpc completed"))
            .cloned()
            .collect()
    }

    /// Waits (bounded) for the `rpc completed` event of `method`: the server ends a call when
    /// its response ends, which may be just after the client has the answer.
    async fn call(&self, method: &str) -> Captured {
        let found = || {
            let call = self.calls().into_iter().find(|c| c.fields["method"] == method);
            async move { call }
        };
        let what = format!("the event of {method}");
        hpk_test_support::eventually(&what, Duration::from_secs(5), found, || format!("{:?}", self.calls()))
            .await
    }
}

/// A subscriber that captures what `hpk_rpc` logs at `level` and above.
fn capturing(level: LevelFilter) -> (Capture, impl Subscriber + Send + Sync) {
    let capture = Capture::default();
    let filter = Targets::new().with_target("hpk_rpc", level);
    (capture.clone(), tracing_subscriber::registry().with(capture.with_filter(filter)))
}

fn assert_call(call: &Captured, method: &str, peer: &str, code: &str) {
    assert_eq!(call.span.as_deref(), Some("rpc"), "{call:?}");
    assert_eq!(call.fields["method"], method, "{call:?}");
    assert_eq!(call.fields["peer"], peer, "{call:?}");
    assert_eq!(call.fields["code"], code, "{call:?}");
    let latency: f64 = call.fields["latency_ms"].parse().expect("latency_ms is a number");
    assert!((0.0..5000.0).contains(&latency), "{call:?}");
}

/// A server of health (and reflection) alone on a UNIX socket in a fresh directory.
async fn unix_server() -> (tempfile::TempDir, std::path::PathBuf, CancellationToken) {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o700)).expect("chmod");
    let socket = dir.path().join("s.sock");
    let shutdown = CancellationToken::new();
    let listener = crate::Listener::unix(&socket).expect("listen");
    tokio::spawn(crate::serve(listener, crate::Services::new(), shutdown.clone()));
    (dir, socket, shutdown)
}

async fn health(socket: &std::path::Path) -> HealthClient<tonic::transport::Channel> {
    HealthClient::new(crate::connect::unix(socket).await.expect("connect"))
}

// Current-thread runtimes: the server's tasks run on the test's thread, where the capturing
// subscriber is the default.

#[tokio::test]
async fn a_unary_call_and_a_trailers_only_error_carry_method_peer_code_and_latency() {
    let (capture, subscriber) = capturing(LevelFilter::DEBUG);
    let _default = tracing::subscriber::set_default(subscriber);
    let (_dir, socket, shutdown) = unix_server().await;
    let mut client = health(&socket).await;

    client.check(HealthCheckRequest { service: String::new() }).await.expect("server health");
    let call = capture.call("/grpc.health.v1.Health/Check").await;
    assert_call(&call, "/grpc.health.v1.Health/Check", "unix", "Ok");

    // An unknown service: NotFound before any message, the status in the response headers.
    let status = client.check(HealthCheckRequest { service: "no.such.v1.Service".into() }).await;
    assert_eq!(status.expect_err("unknown service").code(), tonic::Code::NotFound);
    let second = || {
        let calls = capture.calls();
        async move { (calls.len() >= 2).then_some(()) }
    };
    hpk_test_support::eventually("the second event", Duration::from_secs(5), second, || {
        format!("{:?}", capture.calls())
    })
    .await;
    assert_call(&capture.calls()[1], "/grpc.health.v1.Health/Check", "unix", "NotFound");
    assert_eq!(capture.calls().len(), 2, "one event per call");
    shutdown.cancel();
}

#[tokio::test]
async fn a_stream_the_client_abandons_ends_as_dropped() {
    let (capture, subscriber) = capturing(LevelFilter::DEBUG);
    let _default = tracing::subscriber::set_default(subscriber);
    let (_dir, socket, shutdown) = unix_server().await;
    let mut client = health(&socket).await;
    let mut watch =
        client.watch(HealthCheckRequest { service: String::new() }).await.expect("watch").into_inner();
    watch.message().await.expect("first status").expect("a message");
    assert!(capture.calls().is_empty(), "a stream in progress has not ended: {:?}", capture.calls());
    drop(watch);
    let call = capture.call("/grpc.health.v1.Health/Watch").await;
    assert_call(&call, "/grpc.health.v1.Health/Watch", "unix", "dropped");
    shutdown.cancel();
}

/// Below DEBUG the layer takes its short path (no span, nothing recorded): unary calls and
/// streams still pass through it whole.
#[tokio::test]
async fn at_info_level_calls_and_streams_pass_through_untraced() {
    // A global level filter, as the binaries' env filter is: DEBUG is off for every callsite.
    let _default = tracing::subscriber::set_default(tracing_subscriber::registry().with(LevelFilter::INFO));
    assert!(!tracing::enabled!(tracing::Level::DEBUG), "the layer must see DEBUG disabled");
    let (_dir, socket, shutdown) = unix_server().await;
    let mut client = health(&socket).await;
    let answer = client.check(HealthCheckRequest { service: String::new() }).await.expect("health");
    assert_eq!(
        answer.into_inner().status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
    let status = client.check(HealthCheckRequest { service: "no.such.v1.Service".into() }).await;
    assert_eq!(status.expect_err("unknown service").code(), tonic::Code::NotFound);
    let mut watch =
        client.watch(HealthCheckRequest { service: String::new() }).await.expect("watch").into_inner();
    watch.message().await.expect("first status").expect("a message");
    shutdown.cancel();
}

/// A CA: (certificate PEM, issuer).
fn ca(name: &str) -> (String, rcgen::Issuer<'static, rcgen::KeyPair>) {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    params.distinguished_name.push(rcgen::DnType::CommonName, name);
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let key = rcgen::KeyPair::generate().expect("key");
    let pem = params.self_signed(&key).expect("CA").pem();
    (pem, rcgen::Issuer::new(params, key))
}

/// A leaf of `issuer`: (certificate PEM, key PEM).
fn leaf(
    issuer: &rcgen::Issuer<'static, rcgen::KeyPair>,
    cn: &str,
    san: &str,
    usage: rcgen::ExtendedKeyUsagePurpose,
) -> (String, String) {
    let mut params = rcgen::CertificateParams::new(vec![san.to_owned()]).expect("params");
    params.distinguished_name.push(rcgen::DnType::CommonName, cn);
    params.extended_key_usages = vec![usage];
    let key = rcgen::KeyPair::generate().expect("key");
    (params.signed_by(&key, issuer).expect("leaf").pem(), key.serialize_pem())
}

/// Serves health on `listener`; one check through `channel` (connected to it by `connect`)
/// must pass; returns the `peer` of its event after checking the rest.
async fn peer_of_one_check<F>(capture: &Capture, listener: crate::Listener, connect: F) -> String
where
    F: std::future::Future<Output = crate::Result<tonic::transport::Channel>>,
{
    let shutdown = CancellationToken::new();
    tokio::spawn(crate::serve(listener, crate::Services::new(), shutdown.clone()));
    let channel = connect.await.expect("connect");
    HealthClient::new(channel).check(HealthCheckRequest { service: String::new() }).await.expect("health");
    let call = capture.call("/grpc.health.v1.Health/Check").await;
    let peer = call.fields["peer"].clone();
    assert_call(&call, "/grpc.health.v1.Health/Check", &peer, "Ok");
    shutdown.cancel();
    peer
}

#[tokio::test]
async fn over_tls_the_peer_is_the_address() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (server_ca, server_issuer) = ca("server CA");
    let (cert, key) = leaf(&server_issuer, "server", "127.0.0.1", rcgen::ExtendedKeyUsagePurpose::ServerAuth);
    let (capture, subscriber) = capturing(LevelFilter::DEBUG);
    let _default = tracing::subscriber::set_default(subscriber);
    let listener =
        crate::Listener::tls("127.0.0.1:0".parse().expect("addr"), cert.as_bytes(), key.as_bytes())
            .await
            .expect("listen");
    let url = format!("https://{}", listener.local_addr().expect("tcp"));
    let peer =
        peer_of_one_check(&capture, listener, crate::connect::tls(&url, server_ca.as_bytes(), None)).await;
    assert!(peer.starts_with("127.0.0.1:") && !peer.contains('@'), "{peer}");
}

#[tokio::test]
async fn over_mutual_tls_the_peer_is_the_certificate_name_at_the_address() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (server_ca, server_issuer) = ca("server CA");
    let (client_ca, client_issuer) = ca("client CA");
    let (cert, key) = leaf(&server_issuer, "server", "127.0.0.1", rcgen::ExtendedKeyUsagePurpose::ServerAuth);
    let (client_cert, client_key) =
        leaf(&client_issuer, "system:node:n1", "n1", rcgen::ExtendedKeyUsagePurpose::ClientAuth);
    let (capture, subscriber) = capturing(LevelFilter::DEBUG);
    let _default = tracing::subscriber::set_default(subscriber);
    let addr = "127.0.0.1:0".parse().expect("addr");
    let listener =
        crate::Listener::mutual_tls(addr, cert.as_bytes(), key.as_bytes(), client_ca.as_bytes(), &[])
            .await
            .expect("listen");
    let url = format!("https://{}", listener.local_addr().expect("tcp"));
    let connect = crate::connect::mutual_tls(
        &url,
        server_ca.as_bytes(),
        client_cert.as_bytes(),
        client_key.as_bytes(),
        None,
    );
    let peer = peer_of_one_check(&capture, listener, connect).await;
    let (name, from) = peer.split_once('@').expect("name@address");
    assert_eq!(name, "system:node:n1");
    assert!(from.starts_with("127.0.0.1:"), "{peer}");
}
