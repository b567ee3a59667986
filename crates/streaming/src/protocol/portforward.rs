//! Port-forward over SPDY/3.1 (`portforward.k8s.io`): for every forwarded connection the client
//! opens an error stream and a data stream with the same `requestID` and `port` headers; the
//! data stream is copied to and from the backend's connection, failures are written on the
//! error stream.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::task::JoinSet;

use super::STREAM_CREATION_TIMEOUT;
use crate::backend::{Backend, PortForwardRequest};
use crate::error::Result;
use crate::spdy::frame::status;
use crate::spdy::{NewStream, Session, SpdyStream};

struct Pair {
    data: Option<SpdyStream>,
    error: Option<SpdyStream>,
    since: Instant,
}

pub(crate) async fn serve<IO>(io: IO, req: PortForwardRequest, backend: Arc<dyn Backend>) -> Result<()>
where
    IO: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (session, mut incoming) = Session::start(io);
    let mut pairs: HashMap<String, Pair> = HashMap::new();
    let mut forwards = JoinSet::new();
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    loop {
        tokio::select! {
            new = incoming.recv() => {
                let Some(new) = new else { break };
                let Some((request_id, is_data)) = check(&new) else {
                    tracing::debug!(stream = new.id(), "port-forward stream without valid port/streamType headers refused");
                    new.refuse(status::PROTOCOL_ERROR);
                    continue;
                };
                let pair = pairs.entry(request_id.clone()).or_insert_with(|| Pair { data: None, error: None, since: Instant::now() });
                let slot = if is_data { &mut pair.data } else { &mut pair.error };
                if slot.is_some() {
                    tracing::debug!(request_id, "duplicate port-forward stream refused");
                    new.refuse(status::PROTOCOL_ERROR);
                    continue;
                }
                *slot = Some(new.accept()?);
                if let Some(Pair { data: Some(_), error: Some(_), .. }) = pairs.get(&request_id)
                    && let Some(Pair { data: Some(data), error: Some(error), .. }) = pairs.remove(&request_id)
                {
                    forwards.spawn(forward(backend.clone(), req.sandbox_id.clone(), data, error));
                }
            }
            _ = tick.tick() => expire(&mut pairs).await,
            Some(_) = forwards.join_next(), if !forwards.is_empty() => {}
        }
    }
    forwards.abort_all();
    session.close().await;
    Ok(())
}

/// The pair key and stream kind, or `None` when the headers are missing or invalid.
fn check(new: &NewStream) -> Option<(String, bool)> {
    let h = new.headers();
    let port_ok = h.get("port").and_then(|p| p.parse::<u16>().ok()).is_some_and(|p| p > 0);
    let is_data = match h.get("streamtype") {
        Some("data") => true,
        Some("error") => false,
        _ => None?,
    };
    if !port_ok {
        return None;
    }
    // Clients without requestID: the error stream's id names the pair, the data stream
    // follows it (upstream's convention).
    let id = match h.get("requestid") {
        Some(id) if !id.is_empty() => id.to_string(),
        _ if is_data => new.id().saturating_sub(2).to_string(),
        _ => new.id().to_string(),
    };
    Some((id, is_data))
}

async fn expire(pairs: &mut HashMap<String, Pair>) {
    let expired: Vec<String> = pairs
        .iter()
        .filter(|(_, p)| p.since.elapsed() > STREAM_CREATION_TIMEOUT)
        .map(|(k, _)| k.clone())
        .collect();
    for id in expired {
        if let Some(Pair { error: Some(error), .. }) = pairs.remove(&id) {
            let mut w = error.writer;
            let msg = format!("timed out waiting for streams of request {id}");
            let _ = w.write_all(msg.as_bytes()).await;
        }
    }
}

async fn forward(backend: Arc<dyn Backend>, sandbox: String, data: SpdyStream, error: SpdyStream) {
    let port = data.headers.get("port").and_then(|p| p.parse::<u16>().ok()).unwrap_or_default();
    match backend.port_forward(&sandbox, port).await {
        Ok(conn) => {
            let (conn_rd, mut conn_wr) = tokio::io::split(conn);
            let SpdyStream { reader: mut data_rd, writer: mut data_wr, .. } = data;
            let upstream = async {
                let _ = tokio::io::copy(&mut data_rd, &mut conn_wr).await;
                let _ = conn_wr.shutdown().await;
            };
            let downstream = async {
                // Reads of up to one SPDY data chunk: tokio::io::copy's 8 KiB reads made four
                // times as many frames (and wake-ups) per byte.
                let mut conn_rd = tokio::io::BufReader::with_capacity(crate::outq::MAX_CHUNK, conn_rd);
                let _ = tokio::io::copy_buf(&mut conn_rd, &mut data_wr).await;
                let _ = data_wr.shutdown().await;
            };
            tokio::join!(upstream, downstream);
        }
        Err(msg) => {
            tracing::debug!(sandbox, port, error = %msg, "port-forward failed");
            let mut w = error.writer;
            let text = format!("error forwarding port {port} to pod {sandbox}, uid : {msg}");
            let _ = w.write_all(text.as_bytes()).await;
            let _ = w.shutdown().await;
            data.reset();
            return;
        }
    }
    let mut w = error.writer;
    let _ = w.shutdown().await;
}
