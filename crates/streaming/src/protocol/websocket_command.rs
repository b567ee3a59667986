//! exec/attach over WebSocket (`channel.k8s.io`, `v4.channel.k8s.io`, `v5.channel.k8s.io`):
//! every binary message starts with a channel byte (0 stdin, 1 stdout, 2 stderr, 3 error,
//! 4 resize); v5 adds `[255, channel]` to close a channel (the client's stdin EOF).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role, WebSocketConfig};

use super::StreamOpts;
use crate::backend::{BoxReader, BoxWriter, Io};
use crate::error::Result;
use crate::outq::{OutQueue, QueueWriter};
use crate::pipe::{ChannelReader, forward_resizes};
use crate::status::Outcome;

const STDIN: u8 = 0;
const STDOUT: u8 = 1;
const STDERR: u8 = 2;
const ERROR: u8 = 3;
const RESIZE: u8 = 4;
const CLOSE: u8 = 255;
/// Largest message accepted from the client.
const MAX_MESSAGE: usize = 16 * 1024 * 1024;
/// How long closing waits for the client's close frame.
const LINGER: Duration = Duration::from_secs(2);

pub(crate) fn config() -> WebSocketConfig {
    WebSocketConfig::default().max_message_size(Some(MAX_MESSAGE)).max_frame_size(Some(MAX_MESSAGE))
}

fn on_channel(channel: u8, data: &[u8]) -> Message {
    let mut b = BytesMut::with_capacity(data.len() + 1);
    b.put_u8(channel);
    b.put_slice(data);
    Message::Binary(b.freeze())
}

pub(crate) async fn serve<IO, F, Fut>(
    io: IO,
    version: u8,
    opts: StreamOpts,
    verb: &'static str,
    run: F,
) -> Result<()>
where
    IO: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    F: FnOnce(Io) -> Fut + Send,
    Fut: Future<Output = std::result::Result<i32, String>> + Send,
{
    let ws = WebSocketStream::from_raw_socket(io, Role::Server, Some(config())).await;
    let (mut sink, source) = ws.split();
    let (out, mut out_rx) = OutQueue::<Message>::new();
    let writer = tokio::spawn(async move {
        while let Some(q) = out_rx.recv().await {
            let last = matches!(q.msg, Message::Close(_));
            if let Err(e) = sink.send(q.msg).await {
                tracing::debug!(error = %e, "websocket write failed");
                return;
            }
            if last {
                return;
            }
        }
    });

    let (stdin_tx, stdin) = channel_pair(opts.stdin);
    let (resize_tx, resize) = if opts.tty {
        let (tx, rx) = mpsc::channel(16);
        let (size_tx, size_rx) = mpsc::channel(16);
        tokio::spawn(forward_resizes(ChannelReader::new(rx), size_tx));
        (Some(tx), Some(size_rx))
    } else {
        (None, None)
    };
    let reader = tokio::spawn(read_loop(source, version, stdin_tx, resize_tx));

    // Tell the client the streams are ready, as the kubelet does (an empty message).
    let ready = if opts.stdout {
        STDOUT
    } else if opts.stderr {
        STDERR
    } else {
        ERROR
    };
    out.send(on_channel(ready, &[]));

    let writer_for = |channel: u8, wanted: bool| {
        wanted.then(|| {
            let w = QueueWriter::new(
                out.clone(),
                move |b: Bytes| on_channel(channel, &b),
                None,
                Arc::new(AtomicBool::new(false)),
            );
            Box::new(w) as BoxWriter
        })
    };
    let io = Io {
        stdin: stdin.map(|r| Box::new(r) as BoxReader),
        stdout: writer_for(STDOUT, opts.stdout),
        stderr: writer_for(STDERR, opts.stderr),
        resize,
    };
    let mut reader = reader;
    // A client that goes away (close frame, reset, EOF) ends the session: the backend's
    // future is dropped, which ends what it started (an exec'd command is killed).
    let result = tokio::select! {
        result = run(io) => result,
        _ = &mut reader => {
            tracing::debug!(verb, "client gone before the session ended; session cancelled");
            drop(out);
            writer.abort();
            return Ok(());
        }
    };
    let outcome = Outcome::from_backend(result, verb);
    if let Some(payload) = outcome.payload(version >= 4) {
        out.send(on_channel(ERROR, &payload));
    }
    out.send(Message::Close(Some(CloseFrame { code: CloseCode::Normal, reason: "".into() })));
    drop(out);
    let _ = tokio::time::timeout(LINGER * 5, writer).await;
    if tokio::time::timeout(LINGER, &mut reader).await.is_err() {
        reader.abort();
    }
    Ok(())
}

fn channel_pair(wanted: bool) -> (Option<mpsc::Sender<Bytes>>, Option<ChannelReader>) {
    if !wanted {
        return (None, None);
    }
    let (tx, rx) = mpsc::channel(64);
    (Some(tx), Some(ChannelReader::new(rx)))
}

type Source<IO> = futures_util::stream::SplitStream<WebSocketStream<IO>>;

async fn read_loop<IO>(
    mut source: Source<IO>,
    version: u8,
    mut stdin: Option<mpsc::Sender<Bytes>>,
    mut resize: Option<mpsc::Sender<Bytes>>,
) where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    while let Some(msg) = source.next().await {
        let data = match msg {
            Ok(Message::Binary(data)) => data,
            Ok(Message::Close(_)) | Err(_) => break,
            // Text (base64 channel protocols) is not spoken; pings are answered by tungstenite.
            Ok(_) => continue,
        };
        let Some(&channel) = data.first() else { continue };
        if version >= 5 && channel == CLOSE {
            match data.get(1) {
                Some(&STDIN) if data.len() == 2 => stdin = None,
                Some(&RESIZE) if data.len() == 2 => resize = None,
                Some(_) if data.len() == 2 => {}
                _ => {
                    tracing::debug!("malformed close-channel message; closing the connection");
                    break;
                }
            }
            continue;
        }
        let target = match channel {
            STDIN => &stdin,
            RESIZE => &resize,
            _ => continue,
        };
        if let Some(tx) = target {
            // A gone reader (the backend dropped stdin) just discards.
            let _ = tx.send(data.slice(1..)).await;
        }
    }
}
