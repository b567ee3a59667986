//! Prometheus metrics: packets, bytes and drops per path (each pod's veth, the tunnel, each
//! peer), served as text over HTTP on a loopback address.
//!
//! Inside the bubble the loopback is the bubble's own, so nothing is exposed on a host
//! interface; the kubelet's authenticated `/metrics` endpoints can reach it from the bubble.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use hpk_proto::netforwarder::v1 as pb;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::link::Network;
use crate::service::Context;
use crate::{Error, Result};

/// Binds `addr` (loopback only) and serves `/metrics` until `shutdown`.
pub async fn serve<N: Network>(
    addr: SocketAddr,
    context: Arc<Context<N>>,
    shutdown: CancellationToken,
) -> Result<()> {
    if !addr.ip().is_loopback() {
        return Err(Error::Config(format!(
            "--metrics-address {addr}: metrics are served on a loopback address only (they are unauthenticated)"
        )));
    }
    let listener =
        TcpListener::bind(addr).await.map_err(|e| Error::io(format!("bind metrics on {addr}"), e))?;
    info!(address = %addr, "metrics on /metrics");
    tokio::spawn(async move {
        loop {
            let stream = tokio::select! {
                () = shutdown.cancelled() => return,
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => { warn!(error = %e, "metrics accept failed"); continue; }
                },
            };
            let context = context.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
                    let context = context.clone();
                    async move { Ok::<_, std::convert::Infallible>(answer(&req, &context).await) }
                });
                if let Err(e) = http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await {
                    tracing::debug!(error = %e, "metrics connection");
                }
            });
        }
    });
    Ok(())
}

async fn answer<N: Network, B>(req: &Request<B>, context: &Context<N>) -> Response<Full<Bytes>> {
    let reply = |status, body: String| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = status;
        r
    };
    if req.uri().path() != "/metrics" {
        return reply(StatusCode::NOT_FOUND, "only /metrics is served here\n".into());
    }
    match context.snapshot().await {
        Ok((stats, attached, free)) => {
            let mut r = reply(StatusCode::OK, render(&stats, attached, free));
            r.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static("text/plain; version=0.0.4"),
            );
            r
        }
        Err(e) => reply(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")),
    }
}

/// The Prometheus text exposition of one snapshot.
pub fn render(stats: &pb::StatsResponse, attached: usize, free: u32) -> String {
    let mut out = String::new();
    let mut family = |name: &str, kind: &str, help: &str, samples: Vec<(String, u64)>| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (labels, value) in samples {
            let _ = writeln!(out, "{name}{labels} {value}");
        }
    };
    family(
        "hpk_net_attachments",
        "gauge",
        "Pod sandboxes attached to the pod network.",
        vec![(String::new(), attached as u64)],
    );
    family(
        "hpk_net_free_addresses",
        "gauge",
        "Addresses still free in the node's pod CIDR.",
        vec![(String::new(), free.into())],
    );
    let pods = |f: fn(&pb::InterfaceStats) -> [(&'static str, u64); 2]| {
        stats
            .interfaces
            .iter()
            .flat_map(|i| {
                f(i).map(|(dir, v)| {
                    (format!("{{sandbox=\"{}\",direction=\"{dir}\"}}", escape(&i.sandbox_id)), v)
                })
            })
            .collect()
    };
    // The bubble side's rx is traffic from the pod (the pod's tx), and the other way round.
    family(
        "hpk_net_pod_packets_total",
        "counter",
        "Packets on each pod's link; direction is the pod's.",
        pods(|i| [("tx", i.rx_packets), ("rx", i.tx_packets)]),
    );
    family(
        "hpk_net_pod_bytes_total",
        "counter",
        "Bytes on each pod's link; direction is the pod's.",
        pods(|i| [("tx", i.rx_bytes), ("rx", i.tx_bytes)]),
    );
    family(
        "hpk_net_pod_dropped_total",
        "counter",
        "Packets dropped on each pod's link.",
        pods(|i| [("tx", i.rx_dropped + i.rx_errors), ("rx", i.tx_dropped + i.tx_errors)]),
    );
    let Some(t) = &stats.tunnel else { return out };
    family(
        "hpk_net_tunnel_packets_total",
        "counter",
        "Pod packets through the tunnel to and from other nodes.",
        vec![(r#"{direction="tx"}"#.into(), t.tx_packets), (r#"{direction="rx"}"#.into(), t.rx_packets)],
    );
    family(
        "hpk_net_tunnel_bytes_total",
        "counter",
        "Pod bytes through the tunnel (before its overhead).",
        vec![(r#"{direction="tx"}"#.into(), t.tx_bytes), (r#"{direction="rx"}"#.into(), t.rx_bytes)],
    );
    family(
        "hpk_net_tunnel_dropped_total",
        "counter",
        "Tunnel packets and datagrams dropped, by reason.",
        vec![
            (r#"{direction="rx",reason="auth"}"#.into(), t.rx_dropped_auth),
            (r#"{direction="rx",reason="replay"}"#.into(), t.rx_dropped_replay),
            (r#"{direction="rx",reason="malformed"}"#.into(), t.rx_dropped_malformed),
            (r#"{direction="rx",reason="spoofed"}"#.into(), t.rx_dropped_spoofed),
            (r#"{direction="rx",reason="incomplete"}"#.into(), t.rx_dropped_incomplete),
            (r#"{direction="rx",reason="error"}"#.into(), t.rx_dropped_error),
            (r#"{direction="tx",reason="no_route"}"#.into(), t.tx_dropped_no_route),
            (r#"{direction="tx",reason="error"}"#.into(), t.tx_dropped_error),
        ],
    );
    family(
        "hpk_net_peers_refused_total",
        "counter",
        "Other nodes not routed: malformed, overlapping, or sharing an endpoint or key.",
        vec![(String::new(), t.peers_refused)],
    );
    let peers = |f: fn(&pb::PeerStats) -> [(&'static str, u64); 2]| {
        t.peers
            .iter()
            .flat_map(|p| {
                f(p).map(|(dir, v)| (format!("{{node=\"{}\",direction=\"{dir}\"}}", escape(&p.node)), v))
            })
            .collect()
    };
    family(
        "hpk_net_peer_packets_total",
        "counter",
        "Pod packets through the tunnel, per other node.",
        peers(|p| [("tx", p.tx_packets), ("rx", p.rx_packets)]),
    );
    family(
        "hpk_net_peer_bytes_total",
        "counter",
        "Pod bytes through the tunnel, per other node.",
        peers(|p| [("tx", p.tx_bytes), ("rx", p.rx_bytes)]),
    );
    out
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_path() {
        let stats = pb::StatsResponse {
            interfaces: vec![pb::InterfaceStats {
                sandbox_id: "s1".into(),
                rx_packets: 3,
                tx_packets: 4,
                rx_bytes: 300,
                tx_bytes: 400,
                ..Default::default()
            }],
            tunnel: Some(pb::TunnelStats {
                tx_packets: 7,
                rx_dropped_auth: 2,
                rx_dropped_spoofed: 3,
                peers: vec![pb::PeerStats { node: "n\"2".into(), tx_packets: 5, ..Default::default() }],
                ..Default::default()
            }),
            not_ready: String::new(),
        };
        let text = render(&stats, 1, 250);
        for line in [
            "hpk_net_attachments 1",
            "hpk_net_free_addresses 250",
            r#"hpk_net_pod_packets_total{sandbox="s1",direction="tx"} 3"#,
            r#"hpk_net_pod_bytes_total{sandbox="s1",direction="rx"} 400"#,
            r#"hpk_net_tunnel_packets_total{direction="tx"} 7"#,
            r#"hpk_net_tunnel_dropped_total{direction="rx",reason="auth"} 2"#,
            r#"hpk_net_tunnel_dropped_total{direction="rx",reason="spoofed"} 3"#,
            r#"hpk_net_peer_packets_total{node="n\"2",direction="tx"} 5"#,
            "# TYPE hpk_net_tunnel_dropped_total counter",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
        let without = render(&pb::StatsResponse::default(), 0, 1);
        assert!(!without.contains("tunnel"), "no tunnel metrics without a tunnel");
    }
}
