//! `SPDY/3.1+portforward.k8s.io`: client-go's port-forward over WebSocket sends the bytes of a
//! SPDY connection as binary WebSocket messages. This turns such a connection back into a
//! byte stream for the SPDY session.

use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role};

use super::websocket_command::config;
use crate::outq::MAX_CHUNK;

/// Bytes buffered between the WebSocket and the SPDY session in each direction.
const BUFFER: usize = 256 * 1024;

/// A byte stream carrying what the client tunnels in binary messages; closing it closes the
/// WebSocket normally.
pub(crate) async fn spdy_over_websocket<IO>(io: IO) -> DuplexStream
where
    IO: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let ws = WebSocketStream::from_raw_socket(io, Role::Server, Some(config())).await;
    let (mut sink, mut source) = ws.split();
    let (ours, theirs) = tokio::io::duplex(BUFFER);
    let (mut from_session, mut to_session) = tokio::io::split(theirs);
    tokio::spawn(async move {
        let mut buf = vec![0u8; MAX_CHUNK];
        loop {
            match from_session.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if sink.send(Message::Binary(bytes::Bytes::copy_from_slice(&buf[..n]))).await.is_err() {
                        return;
                    }
                }
            }
        }
        let _ =
            sink.send(Message::Close(Some(CloseFrame { code: CloseCode::Normal, reason: "".into() }))).await;
    });
    tokio::spawn(async move {
        while let Some(msg) = source.next().await {
            match msg {
                Ok(Message::Binary(data)) => {
                    if to_session.write_all(&data).await.is_err() {
                        break;
                    }
                }
                Ok(Message::Close(_)) | Err(_) => break,
                Ok(Message::Text(_)) => {
                    tracing::debug!("text message on a SPDY tunnel; closing");
                    break;
                }
                Ok(_) => {}
            }
        }
        let _ = to_session.shutdown().await;
    });
    ours
}
