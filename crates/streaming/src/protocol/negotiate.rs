//! The HTTP/1.1 upgrade handshake: which transport and subprotocol a request asks for, and
//! the `101 Switching Protocols` answer (or the error answer).

use http::header::{
    CONNECTION, HeaderMap, HeaderValue, SEC_WEBSOCKET_ACCEPT, SEC_WEBSOCKET_KEY, SEC_WEBSOCKET_PROTOCOL,
    SEC_WEBSOCKET_VERSION, UPGRADE,
};
use http::{Response, StatusCode};
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;

/// `X-Stream-Protocol-Version`: the SPDY subprotocol header (request and answer).
pub const STREAM_PROTOCOL_VERSION: &str = "x-stream-protocol-version";
/// `X-Accepted-Stream-Protocol-Versions`: what the server accepts, on a failed negotiation.
pub const ACCEPTED_STREAM_PROTOCOL_VERSIONS: &str = "x-accepted-stream-protocol-versions";

/// SPDY subprotocols for exec/attach, most preferred first.
pub const SPDY_REMOTE_COMMAND: [&str; 3] = ["v4.channel.k8s.io", "v3.channel.k8s.io", "v2.channel.k8s.io"];
/// SPDY subprotocol for port-forward.
pub const SPDY_PORT_FORWARD: [&str; 1] = ["portforward.k8s.io"];
/// WebSocket subprotocols for exec/attach.
pub const WEBSOCKET_REMOTE_COMMAND: [&str; 3] = ["v5.channel.k8s.io", "v4.channel.k8s.io", "channel.k8s.io"];
/// WebSocket subprotocol for port-forward (SPDY frames tunnelled in binary messages).
pub const WEBSOCKET_PORT_FORWARD: [&str; 1] = ["SPDY/3.1+portforward.k8s.io"];

/// The three streaming endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `/exec/<token>`.
    Exec,
    /// `/attach/<token>`.
    Attach,
    /// `/portforward/<token>`.
    PortForward,
}

/// A negotiated transport and subprotocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// SPDY/3.1 with `vN.channel.k8s.io` (N = 2, 3 or 4).
    SpdyRemoteCommand(u8),
    /// SPDY/3.1 with `portforward.k8s.io`.
    SpdyPortForward,
    /// WebSocket with `vN.channel.k8s.io` (N = 4 or 5) or `channel.k8s.io` (N = 1).
    WebSocketChannel(u8),
    /// WebSocket with `SPDY/3.1+portforward.k8s.io`.
    WebSocketSpdyTunnel,
}

impl Protocol {
    /// The subprotocol name as sent on the wire.
    pub fn name(self) -> &'static str {
        match self {
            Protocol::SpdyRemoteCommand(4) | Protocol::WebSocketChannel(4) => "v4.channel.k8s.io",
            Protocol::SpdyRemoteCommand(3) => "v3.channel.k8s.io",
            Protocol::SpdyRemoteCommand(_) => "v2.channel.k8s.io",
            Protocol::WebSocketChannel(5) => "v5.channel.k8s.io",
            Protocol::WebSocketChannel(_) => "channel.k8s.io",
            Protocol::SpdyPortForward => "portforward.k8s.io",
            Protocol::WebSocketSpdyTunnel => "SPDY/3.1+portforward.k8s.io",
        }
    }

    fn parse(name: &str) -> Option<Protocol> {
        Some(match name {
            "v4.channel.k8s.io" => Protocol::SpdyRemoteCommand(4),
            "v3.channel.k8s.io" => Protocol::SpdyRemoteCommand(3),
            "v2.channel.k8s.io" => Protocol::SpdyRemoteCommand(2),
            "portforward.k8s.io" => Protocol::SpdyPortForward,
            _ => return None,
        })
    }

    fn parse_websocket(name: &str) -> Option<Protocol> {
        Some(match name {
            "v5.channel.k8s.io" => Protocol::WebSocketChannel(5),
            "v4.channel.k8s.io" => Protocol::WebSocketChannel(4),
            "channel.k8s.io" => Protocol::WebSocketChannel(1),
            "SPDY/3.1+portforward.k8s.io" => Protocol::WebSocketSpdyTunnel,
            _ => return None,
        })
    }
}

/// A successful negotiation: the protocol to serve and the answer to send.
#[derive(Debug, Clone)]
pub struct Negotiated {
    /// What to serve once the connection is upgraded.
    pub protocol: Protocol,
    websocket_accept: Option<String>,
}

impl Negotiated {
    /// The `101 Switching Protocols` answer (headers only).
    pub fn switching_protocols(&self) -> Response<()> {
        let mut res = Response::new(());
        *res.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        let h = res.headers_mut();
        h.insert(CONNECTION, HeaderValue::from_static("Upgrade"));
        let name = HeaderValue::from_static(self.protocol.name());
        match &self.websocket_accept {
            Some(accept) => {
                h.insert(UPGRADE, HeaderValue::from_static("websocket"));
                if let Ok(v) = HeaderValue::from_str(accept) {
                    h.insert(SEC_WEBSOCKET_ACCEPT, v);
                }
                h.insert(SEC_WEBSOCKET_PROTOCOL, name);
            }
            None => {
                h.insert(UPGRADE, HeaderValue::from_static("SPDY/3.1"));
                h.insert(STREAM_PROTOCOL_VERSION, name);
            }
        }
        res
    }
}

/// A request that cannot be upgraded: the status and message to answer with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// 400 Bad Request.
    pub status: StatusCode,
    /// A message a person can act on (names the supported protocols).
    pub message: String,
    /// Sent back as `X-Accepted-Stream-Protocol-Versions`.
    pub accepted: Vec<&'static str>,
}

impl Rejection {
    fn new(message: String, accepted: &[&'static str]) -> Self {
        Self { status: StatusCode::BAD_REQUEST, message, accepted: accepted.to_vec() }
    }

    /// The answer to send: the message as plain text.
    pub fn into_response(self) -> Response<String> {
        let mut res = Response::new(format!("{}\n", self.message));
        *res.status_mut() = self.status;
        let h = res.headers_mut();
        h.insert(http::header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
        for p in self.accepted {
            h.append(ACCEPTED_STREAM_PROTOCOL_VERSIONS, HeaderValue::from_static(p));
        }
        res
    }
}

fn values(headers: &HeaderMap, name: impl http::header::AsHeaderName) -> impl Iterator<Item = &str> {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|v| !v.is_empty())
}

fn has_token(headers: &HeaderMap, name: http::header::HeaderName, token: &str) -> bool {
    values(headers, name).any(|v| v.eq_ignore_ascii_case(token))
}

/// Decides how to upgrade a request for `endpoint`, from its headers.
pub fn negotiate(headers: &HeaderMap, endpoint: Endpoint) -> Result<Negotiated, Rejection> {
    let (spdy, websocket): (&[&'static str], &[&'static str]) = match endpoint {
        Endpoint::Exec | Endpoint::Attach => (&SPDY_REMOTE_COMMAND, &WEBSOCKET_REMOTE_COMMAND),
        Endpoint::PortForward => (&SPDY_PORT_FORWARD, &WEBSOCKET_PORT_FORWARD),
    };
    let all: Vec<&'static str> = spdy.iter().chain(websocket).copied().collect();
    if !has_token(headers, CONNECTION, "upgrade") {
        return Err(Rejection::new(
            format!(
                "unable to upgrade: the request is not an HTTP/1.1 upgrade (Connection: Upgrade); \
                 use Upgrade: SPDY/3.1 with X-Stream-Protocol-Version one of {spdy:?}, or Upgrade: websocket with \
                 Sec-WebSocket-Protocol one of {websocket:?}"
            ),
            &all,
        ));
    }
    if has_token(headers, UPGRADE, "websocket") {
        return negotiate_websocket(headers, websocket);
    }
    if values(headers, UPGRADE).any(|v| v.to_ascii_lowercase().contains("spdy/3.1")) {
        let offered: Vec<&str> = values(headers, STREAM_PROTOCOL_VERSION).collect();
        let chosen = offered.iter().find(|p| spdy.contains(p)).and_then(|p| Protocol::parse(p));
        return match chosen {
            Some(protocol) => Ok(Negotiated { protocol, websocket_accept: None }),
            None => Err(Rejection::new(
                format!(
                    "unable to upgrade: unable to negotiate protocol: client supports {offered:?} in \
                     X-Stream-Protocol-Version, server accepts {spdy:?}"
                ),
                spdy,
            )),
        };
    }
    Err(Rejection::new(
        format!(
            "unable to upgrade: unsupported Upgrade {:?}; supported: SPDY/3.1 with {spdy:?}, websocket with {websocket:?}",
            values(headers, UPGRADE).collect::<Vec<_>>()
        ),
        &all,
    ))
}

fn negotiate_websocket(headers: &HeaderMap, supported: &[&'static str]) -> Result<Negotiated, Rejection> {
    let Some(key) = headers.get(SEC_WEBSOCKET_KEY) else {
        return Err(Rejection::new(
            "unable to upgrade: websocket request without Sec-WebSocket-Key".into(),
            supported,
        ));
    };
    if headers.get(SEC_WEBSOCKET_VERSION).and_then(|v| v.to_str().ok()) != Some("13") {
        return Err(Rejection::new(
            "unable to upgrade: only websocket version 13 is supported".into(),
            supported,
        ));
    }
    let offered: Vec<&str> = values(headers, SEC_WEBSOCKET_PROTOCOL).collect();
    let chosen = offered.iter().find(|p| supported.contains(p)).and_then(|p| Protocol::parse_websocket(p));
    match chosen {
        Some(protocol) => {
            Ok(Negotiated { protocol, websocket_accept: Some(derive_accept_key(key.as_bytes())) })
        }
        None => Err(Rejection::new(
            format!(
                "unable to upgrade: requested websocket protocol(s) {offered:?} are not supported; supports {supported:?}"
            ),
            supported,
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in pairs {
            h.append(*n, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn spdy_picks_the_first_client_protocol_the_server_knows() {
        let h = headers(&[
            ("connection", "Upgrade"),
            ("upgrade", "SPDY/3.1"),
            ("x-stream-protocol-version", "v5.channel.k8s.io"),
            ("x-stream-protocol-version", "v4.channel.k8s.io, v3.channel.k8s.io"),
        ]);
        let n = negotiate(&h, Endpoint::Exec).expect("negotiated");
        assert_eq!(n.protocol, Protocol::SpdyRemoteCommand(4));
        let res = n.switching_protocols();
        assert_eq!(res.status(), StatusCode::SWITCHING_PROTOCOLS);
        assert_eq!(res.headers()["x-stream-protocol-version"], "v4.channel.k8s.io");
    }

    #[test]
    fn websocket_answers_with_accept_key_and_protocol() {
        let h = headers(&[
            ("connection", "Upgrade"),
            ("upgrade", "websocket"),
            ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
            ("sec-websocket-version", "13"),
            ("sec-websocket-protocol", "v5.channel.k8s.io"),
        ]);
        let res = negotiate(&h, Endpoint::Attach).expect("negotiated").switching_protocols();
        assert_eq!(res.headers()["sec-websocket-accept"], "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
        assert_eq!(res.headers()["sec-websocket-protocol"], "v5.channel.k8s.io");
    }

    #[test]
    fn unsupported_requests_are_rejected_with_the_supported_list() {
        let plain = negotiate(&HeaderMap::new(), Endpoint::Exec).expect_err("no upgrade");
        assert_eq!(plain.status, StatusCode::BAD_REQUEST);
        assert!(plain.message.contains("v4.channel.k8s.io"), "{}", plain.message);
        let h = headers(&[
            ("connection", "upgrade"),
            ("upgrade", "SPDY/3.1"),
            ("x-stream-protocol-version", "v9"),
        ]);
        let r = negotiate(&h, Endpoint::PortForward).expect_err("unknown protocol");
        assert_eq!(r.accepted, vec!["portforward.k8s.io"]);
        assert_eq!(r.into_response().headers()["x-accepted-stream-protocol-versions"], "portforward.k8s.io");
    }
}
