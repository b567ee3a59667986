//! The kubelet's network probes: one attempt of an httpGet (`http.rs`, a small HTTP/1.1 client),
//! tcpSocket or grpc (`grpc.rs`, `grpc.health.v1.Health/Check`) probe, bounded by the probe's
//! timeout, its failure worded as upstream's Unhealthy events (`failure.rs`). The kubelet runs
//! them against a pod on its own node; in connector mode the remote runtime runs them for it
//! (`hpk.podruntime.v1.Remote/Probe`, mapped by `wire.rs`), on the side where the pod's address
//! is reachable.
//!
//! Exec probes are not here: they run through the runtime's CRI ExecSync, wherever it is.

mod failure;
mod grpc;
mod http;
pub mod wire;

use std::time::Duration;

pub use failure::ProbeFailure;

/// One network probe, its host and port resolved (the pod's IP unless the probe names a host;
/// a named port looked up in the container's ports).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// GET a path: 200–399 passes.
    HttpGet(HttpGet),
    /// Connect: a connection passes.
    TcpSocket {
        /// The host.
        host: String,
        /// The port, 1–65535.
        port: u16,
    },
    /// `grpc.health.v1.Health/Check`: SERVING passes.
    Grpc {
        /// The host.
        host: String,
        /// The port, 1–65535.
        port: u16,
        /// The service asked about; the server's overall health when empty.
        service: String,
    },
}

/// An httpGet probe, its port resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpGet {
    /// `HTTP` or `HTTPS` (any case).
    pub scheme: String,
    /// Where to connect.
    pub host: String,
    /// The port, 1–65535.
    pub port: u16,
    /// Path (and query); `/` is added in front when missing.
    pub path: String,
    /// The probe's httpHeaders; a `Host` header sets the request's Host.
    pub headers: Vec<(String, String)>,
}

/// Runs one attempt of `action` within `timeout`. `Ok(None)` passed; `Ok(Some(warning))`
/// passed with something to say (an HTTP redirect off the probed host, not followed:
/// upstream's ProbeWarning); `Err` failed, and says why.
pub async fn run(action: &Action, timeout: Duration) -> Result<Option<String>, ProbeFailure> {
    match action {
        Action::HttpGet(get) => http::probe(get.clone(), timeout).await,
        Action::TcpSocket { host, port } => tcp(host, *port, timeout).await.map(|()| None),
        Action::Grpc { host, port, service } => {
            grpc::probe(host, *port, service, timeout).await.map(|()| None)
        }
    }
}

/// `host:port`, with brackets around an IPv6 address.
pub fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") }
}

/// A connect error in Go's words (`connect: connection refused`), which is what users search for.
pub fn connect_error(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::ConnectionRefused => "connect: connection refused".into(),
        std::io::ErrorKind::HostUnreachable => "connect: no route to host".into(),
        std::io::ErrorKind::NetworkUnreachable => "connect: network is unreachable".into(),
        _ => format!("connect: {e}"),
    }
}

async fn tcp(host: &str, port: u16, timeout: Duration) -> Result<(), ProbeFailure> {
    let addr = join_host_port(host, port);
    match tokio::time::timeout(timeout, tokio::net::TcpStream::connect((host, port))).await {
        Ok(Ok(_stream)) => Ok(()),
        Ok(Err(e)) => Err(ProbeFailure::Dial { addr, cause: connect_error(&e) }),
        Err(_) => Err(ProbeFailure::DialTimeout { addr }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn tcp_passes_on_a_listener_and_says_why_not_elsewhere() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let tcp = |port| Action::TcpSocket { host: "127.0.0.1".into(), port };
        assert_eq!(run(&tcp(port), Duration::from_secs(1)).await, Ok(None));
        drop(listener);
        let refused = run(&tcp(port), Duration::from_secs(1)).await.expect_err("nothing listens");
        assert_eq!(refused.to_string(), format!("dial tcp 127.0.0.1:{port}: connect: connection refused"));
    }

    #[tokio::test]
    async fn an_unknown_scheme_is_refused_before_connecting() {
        let get = HttpGet {
            scheme: "FTP".into(),
            host: "127.0.0.1".into(),
            port: 1,
            path: "/".into(),
            headers: Vec::new(),
        };
        let failure = run(&Action::HttpGet(get), Duration::from_secs(1)).await.expect_err("ftp");
        assert_eq!(failure, ProbeFailure::UnsupportedScheme("FTP".into()));
    }

    #[test]
    fn ipv6_hosts_get_brackets() {
        assert_eq!(join_host_port("fd00::1", 80), "[fd00::1]:80");
        assert_eq!(join_host_port("10.0.0.1", 80), "10.0.0.1:80");
    }
}
