//! Serving a set of tonic services with health, reflection and graceful shutdown.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::CancellationToken;
use tonic::body::Body;
use tonic::server::NamedService;
use tonic::service::RoutesBuilder;
use tonic::transport::{Identity, Server, ServerTlsConfig};
use tonic_health::ServingStatus;
use tracing::{info, warn};

use crate::log_limit::LogLimit;
use crate::trace::TraceLayer;
use crate::{Error, Result, mtls};

/// How long in-flight requests may run after shutdown begins.
pub const DRAIN_DEADLINE: Duration = Duration::from_secs(10);

/// A bound listening socket, ready to serve.
pub enum Listener {
    /// A UNIX socket for peers in the same bubble; access is the socket's 0600 mode.
    Unix {
        /// The listening socket.
        listener: tokio::net::UnixListener,
        /// Its path, removed when serving ends.
        path: PathBuf,
    },
    /// TCP with TLS for peers in other bubbles.
    Tls {
        /// The listening socket.
        listener: tokio::net::TcpListener,
        /// The server's certificate and key.
        tls: ServerTlsConfig,
    },
    /// TCP with mutual TLS for peers on other machines: only clients with a certificate from
    /// the configured CA get past the handshake. `h2` sessions are gRPC; `http/1.1` sessions go
    /// to the handler, if there is one, else are closed.
    MutualTls {
        /// The listening socket.
        listener: tokio::net::TcpListener,
        /// Server certificate, client CA, ALPN.
        config: Arc<rustls::ServerConfig>,
        /// Where `http/1.1` sessions go.
        http1: Option<mtls::Http1Handler>,
    },
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unix { path, .. } => f.debug_struct("Unix").field("path", path).finish_non_exhaustive(),
            Self::Tls { listener, .. } => {
                f.debug_struct("Tls").field("addr", &listener.local_addr().ok()).finish_non_exhaustive()
            }
            Self::MutualTls { listener, http1, .. } => f
                .debug_struct("MutualTls")
                .field("addr", &listener.local_addr().ok())
                .field("http1", &http1.is_some())
                .finish_non_exhaustive(),
        }
    }
}

impl Listener {
    /// Binds a UNIX socket at `path` (see [`crate::unix::bind`]).
    pub fn unix(path: &Path) -> Result<Self> {
        Ok(Self::Unix { listener: crate::unix::bind(path)?, path: path.to_owned() })
    }

    /// Binds `addr` for TLS with the PEM certificate chain and key given. Port 0 picks a free
    /// port; [`Listener::local_addr`] tells which.
    pub async fn tls(addr: SocketAddr, cert_chain_pem: &[u8], key_pem: &[u8]) -> Result<Self> {
        let listener =
            tokio::net::TcpListener::bind(addr).await.map_err(|source| Error::Bind { addr, source })?;
        let tls = ServerTlsConfig::new().identity(Identity::from_pem(cert_chain_pem, key_pem));
        Ok(Self::Tls { listener, tls })
    }

    /// [`Listener::tls`] where a client may present a certificate, verified against the CA
    /// in `client_ca_pem` during the handshake (a request's `peer_certs()` then holds it); a
    /// client without one is served too.
    pub async fn tls_with_optional_client_ca(
        addr: SocketAddr,
        cert_chain_pem: &[u8],
        key_pem: &[u8],
        client_ca_pem: &[u8],
    ) -> Result<Self> {
        let listener =
            tokio::net::TcpListener::bind(addr).await.map_err(|source| Error::Bind { addr, source })?;
        let tls = ServerTlsConfig::new()
            .identity(Identity::from_pem(cert_chain_pem, key_pem))
            .client_ca_root(tonic::transport::Certificate::from_pem(client_ca_pem))
            .client_auth_optional(true);
        Ok(Self::Tls { listener, tls })
    }

    /// Binds `addr` for mutual TLS: the PEM certificate chain and key, and the CA whose
    /// client certificates are accepted — with `client_names`, only those whose subject common
    /// name is one of them. Port 0 picks a free port.
    pub async fn mutual_tls(
        addr: SocketAddr,
        cert_chain_pem: &[u8],
        key_pem: &[u8],
        client_ca_pem: &[u8],
        client_names: &[String],
    ) -> Result<Self> {
        let config = mtls::server_config(cert_chain_pem, key_pem, client_ca_pem, client_names)?;
        let listener =
            tokio::net::TcpListener::bind(addr).await.map_err(|source| Error::Bind { addr, source })?;
        Ok(Self::MutualTls { listener, config, http1: None })
    }

    /// Sends the `http/1.1` sessions of a mutual-TLS listener to `handler`; no effect on the
    /// other kinds.
    #[must_use]
    pub fn with_http1(mut self, handler: mtls::Http1Handler) -> Self {
        if let Self::MutualTls { http1, .. } = &mut self {
            *http1 = Some(handler);
        }
        self
    }

    /// The bound TCP address, or `None` for a UNIX socket.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        match self {
            Self::Unix { .. } => None,
            Self::Tls { listener, .. } | Self::MutualTls { listener, .. } => listener.local_addr().ok(),
        }
    }
}

/// The application services to serve, with what health and reflection need to know of them.
#[derive(Default)]
pub struct Services {
    routes: RoutesBuilder,
    names: Vec<&'static str>,
    descriptor_sets: Vec<&'static [u8]>,
    readiness: Option<crate::Readiness>,
}

impl Services {
    /// An empty set. Reflection lists every service of every registered descriptor set, so
    /// each server registers (with [`Services::describe`]) only the contracts it serves.
    pub fn new() -> Self {
        Self::default()
    }

    /// Health reports the services SERVING only while `readiness` is ready (without one: while
    /// the server runs).
    pub fn with_readiness(mut self, readiness: crate::Readiness) -> Self {
        self.readiness = Some(readiness);
        self
    }

    /// Adds a service; health reports it SERVING while the server runs (and is ready, see
    /// [`Services::with_readiness`]).
    pub fn with<S>(mut self, svc: S) -> Self
    where
        S: tower::Service<http::Request<Body>, Error = Infallible>
            + NamedService
            + Clone
            + Send
            + Sync
            + 'static,
        S::Response: axum::response::IntoResponse,
        S::Future: Send + 'static,
    {
        self.routes.add_service(svc);
        self.names.push(S::NAME);
        self
    }

    /// Registers an encoded `FileDescriptorSet` for reflection.
    pub fn describe(mut self, descriptor_set: &'static [u8]) -> Self {
        self.descriptor_sets.push(descriptor_set);
        self
    }
}

/// Serves `services` on `listener` until `shutdown` is cancelled, then stops accepting, reports
/// NOT_SERVING, and gives in-flight requests [`DRAIN_DEADLINE`] to finish. Every call runs in
/// an `rpc` span ([`crate::trace`]).
pub async fn serve(listener: Listener, services: Services, shutdown: CancellationToken) -> Result<()> {
    let Services { mut routes, names, descriptor_sets, readiness } = services;
    let (health, health_service) = tonic_health::server::health_reporter();
    for name in &names {
        health.set_service_status(*name, ServingStatus::Serving).await;
    }
    if let Some(readiness) = readiness {
        tokio::spawn(follow_readiness(readiness, health.clone(), names.clone(), shutdown.clone()));
    }
    let mut reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET);
    let mut reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET);
    for set in descriptor_sets {
        reflection_v1 = reflection_v1.register_encoded_file_descriptor_set(set);
        reflection_v1alpha = reflection_v1alpha.register_encoded_file_descriptor_set(set);
    }
    let reflection_v1 = reflection_v1.build_v1().map_err(|e| Error::Reflection(e.to_string()))?;
    let reflection_v1alpha =
        reflection_v1alpha.build_v1alpha().map_err(|e| Error::Reflection(e.to_string()))?;
    routes.add_service(health_service).add_service(reflection_v1).add_service(reflection_v1alpha);
    let routes = routes.routes();

    let stopping = {
        let shutdown = shutdown.clone();
        let health = health.clone();
        async move {
            shutdown.cancelled().await;
            for name in &names {
                health.set_service_status(*name, ServingStatus::NotServing).await;
            }
        }
    };

    match listener {
        Listener::Unix { listener, path } => {
            info!(socket = %path.display(), "serving gRPC on UNIX socket");
            let incoming = UnixListenerStream::new(listener);
            let result = drain(
                Server::builder()
                    .layer(TraceLayer)
                    .add_routes(routes)
                    .serve_with_incoming_shutdown(incoming, stopping),
                &shutdown,
            )
            .await;
            if let Err(e) = std::fs::remove_file(&path) {
                warn!(socket = %path.display(), error = %e, "could not remove socket");
            }
            result
        }
        Listener::Tls { listener, tls } => {
            let addr =
                listener.local_addr().map_err(|source| Error::io("local address", "tcp listener", source))?;
            info!(%addr, "serving gRPC over TLS");
            let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<tokio::net::TcpStream>>(64);
            let acceptor = tokio::spawn(accept_tcp(listener, tx, shutdown.clone()));
            let result = drain(
                bounded(Server::builder())
                    .tls_config(tls.timeout(mtls::HANDSHAKE_TIMEOUT))?
                    .layer(TraceLayer)
                    .add_routes(routes)
                    .serve_with_incoming_shutdown(tokio_stream::wrappers::ReceiverStream::new(rx), stopping),
                &shutdown,
            )
            .await;
            acceptor.abort();
            result
        }
        Listener::MutualTls { listener, config, http1 } => {
            let addr =
                listener.local_addr().map_err(|source| Error::io("local address", "tcp listener", source))?;
            info!(%addr, http1 = http1.is_some(), "serving gRPC over mutual TLS");
            let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<mtls::ServerStream>>(16);
            let acceptor = tokio::spawn(accept_mutual_tls(listener, config, http1, tx, shutdown.clone()));
            let result = drain(
                bounded(Server::builder())
                    .layer(TraceLayer)
                    .add_routes(routes)
                    .serve_with_incoming_shutdown(tokio_stream::wrappers::ReceiverStream::new(rx), stopping),
                &shutdown,
            )
            .await;
            acceptor.abort();
            result
        }
    }
}

/// Reports every service in `names`, and the server (`""`), SERVING or NOT_SERVING as
/// `readiness` changes, until shutdown (which reports NOT_SERVING itself).
async fn follow_readiness(
    readiness: crate::Readiness,
    health: tonic_health::server::HealthReporter,
    names: Vec<&'static str>,
    shutdown: CancellationToken,
) {
    let mut changes = readiness.subscribe();
    loop {
        let reason = changes.borrow_and_update().clone();
        if shutdown.is_cancelled() {
            return;
        }
        let status = match &reason {
            None => {
                info!("ready: health reports SERVING");
                ServingStatus::Serving
            }
            Some(why) => {
                warn!(reason = %why, "not ready: health reports NOT_SERVING");
                ServingStatus::NotServing
            }
        };
        for name in names.iter().copied().chain([""]) {
            health.set_service_status(name, status).await;
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            changed = changes.changed() => if changed.is_err() { return },
        }
    }
}

/// HTTP/2 keep-alive pings find a peer that went away, and a connection lives at most
/// [`MAX_CONNECTION_AGE`] (clients reconnect, which also spreads them after a restart).
fn bounded(builder: Server) -> Server {
    builder
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(20)))
        .max_connection_age(MAX_CONNECTION_AGE)
}

/// How long a TCP connection to a gRPC server lives before it is asked to go away.
pub const MAX_CONNECTION_AGE: Duration = Duration::from_secs(3600);

/// Accepts TCP connections for a TLS listener; tonic completes each handshake on a task of its
/// own within [`mtls::HANDSHAKE_TIMEOUT`]. An accept error (out of descriptors) backs off rather
/// than spinning, as tonic's own accept loop would.
async fn accept_tcp(
    listener: tokio::net::TcpListener,
    incoming: tokio::sync::mpsc::Sender<std::io::Result<tokio::net::TcpStream>>,
    shutdown: CancellationToken,
) {
    loop {
        let stream = tokio::select! {
            () = shutdown.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(error) => {
                    warn!(%error, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        // Small request/response RPCs stall ~40 ms per call on Nagle + delayed ACK without this.
        let _ = stream.set_nodelay(true);
        if incoming.send(Ok(stream)).await.is_err() {
            return;
        }
    }
}

/// Accepts TCP connections and completes their TLS handshakes (bounded, each on its own
/// task, so a slow client holds up no other): `h2` sessions go to `grpc`, `http/1.1` ones to
/// the handler. A client without an acceptable certificate is refused in the handshake, and
/// logged with its address.
async fn accept_mutual_tls(
    listener: tokio::net::TcpListener,
    config: Arc<rustls::ServerConfig>,
    http1: Option<mtls::Http1Handler>,
    grpc: tokio::sync::mpsc::Sender<std::io::Result<mtls::ServerStream>>,
    shutdown: CancellationToken,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    // Any client can fail a handshake at will: a few lines every 10 s, then a count.
    let refused = Arc::new(LogLimit::default());
    let timed_out = Arc::new(LogLimit::default());
    loop {
        let (stream, peer) = tokio::select! {
            () = shutdown.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    warn!(%error, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        // Small request/response RPCs stall ~40 ms per call on Nagle + delayed ACK without this.
        let _ = stream.set_nodelay(true);
        let (acceptor, http1, grpc) = (acceptor.clone(), http1.clone(), grpc.clone());
        let (refused, timed_out) = (refused.clone(), timed_out.clone());
        tokio::spawn(async move {
            let session = match tokio::time::timeout(mtls::HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(session)) => session,
                Ok(Err(error)) => {
                    if let Some(dropped) = refused.admit() {
                        if let Some(summary) = refused.summary(dropped) {
                            warn!(dropped, "{summary}");
                        }
                        warn!(%peer, %error, "refused a TLS client");
                    }
                    return;
                }
                Err(_) => {
                    if let Some(dropped) = timed_out.admit() {
                        if let Some(summary) = timed_out.summary(dropped) {
                            warn!(dropped, "{summary}");
                        }
                        warn!(%peer, "a TLS client did not complete its handshake in time");
                    }
                    return;
                }
            };
            let alpn = session.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
            match (alpn.as_deref(), http1) {
                (Some(mtls::ALPN_HTTP1), Some(handler)) => handler(session),
                (Some(mtls::ALPN_HTTP1), None) => {
                    warn!(%peer, "closing an http/1.1 session: this listener serves gRPC only");
                }
                _ => {
                    let _ = grpc.send(Ok(session)).await;
                }
            }
        });
    }
}

/// Runs the server future; once shutdown starts, bounds the drain by [`DRAIN_DEADLINE`].
async fn drain(
    server: impl std::future::Future<Output = Result<(), tonic::transport::Error>>,
    shutdown: &CancellationToken,
) -> Result<()> {
    tokio::pin!(server);
    // Biased: once shutdown is asked for, it wins over a server that the closed incoming stream
    // has just ended, so the drain is always logged.
    tokio::select! {
        biased;
        () = shutdown.cancelled() => {}
        result = &mut server => return Ok(result?),
    }
    info!("shutting down: no new connections, draining in-flight requests");
    match tokio::time::timeout(DRAIN_DEADLINE, server).await {
        Ok(result) => Ok(result?),
        Err(_) => Err(Error::DrainTimeout(DRAIN_DEADLINE)),
    }
}

#[cfg(test)]
mod readiness_tests {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_server::Health;

    use super::*;

    async fn status(service: &tonic_health::server::HealthService, name: &str) -> i32 {
        let request = tonic::Request::new(HealthCheckRequest { service: name.into() });
        service.check(request).await.map(|r| r.into_inner().status).unwrap_or(-1)
    }

    #[tokio::test]
    async fn every_named_service_and_the_server_follow_readiness() {
        let health = tonic_health::server::HealthReporter::new();
        let service = tonic_health::server::HealthService::from_health_reporter(health.clone());
        let readiness = crate::Readiness::new();
        let shutdown = CancellationToken::new();
        let names = vec!["hpk.a.v1.A", "hpk.b.v1.B"];
        let task = tokio::spawn(follow_readiness(readiness.clone(), health, names.clone(), shutdown.clone()));
        let all = |want: ServingStatus| {
            let service = &service;
            let names = &names;
            async move {
                let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
                loop {
                    let mut ok = true;
                    for name in names.iter().copied().chain([""]) {
                        ok &= status(service, name).await == want as i32;
                    }
                    if ok {
                        return;
                    }
                    assert!(tokio::time::Instant::now() < deadline, "not all {want:?}");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        };
        all(ServingStatus::Serving).await;
        readiness.set_not_ready("no routes");
        all(ServingStatus::NotServing).await;
        readiness.set_ready();
        all(ServingStatus::Serving).await;
        shutdown.cancel();
        task.await.expect("the task ends at shutdown");
    }
}
