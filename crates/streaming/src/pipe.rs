//! Small adapters: [`ChannelReader`] (an `AsyncRead` over a channel of chunks) and the resize
//! stream decoder.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, ReadBuf};
use tokio::sync::mpsc;

use crate::backend::TerminalSize;

/// Longest JSON document accepted on a resize stream.
const MAX_RESIZE_DOC: usize = 4096;

/// An `AsyncRead` yielding the chunks sent on a channel; EOF once every sender is gone.
pub(crate) struct ChannelReader {
    rx: mpsc::Receiver<Bytes>,
    pending: Bytes,
}

impl ChannelReader {
    pub fn new(rx: mpsc::Receiver<Bytes>) -> Self {
        Self { rx, pending: Bytes::new() }
    }
}

impl AsyncRead for ChannelReader {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        while self.pending.is_empty() {
            match self.rx.poll_recv(cx) {
                Poll::Ready(Some(data)) => self.pending = data,
                Poll::Ready(None) => return Poll::Ready(Ok(())),
                Poll::Pending => return Poll::Pending,
            }
        }
        let n = self.pending.len().min(buf.remaining());
        buf.put_slice(&self.pending.split_to(n));
        Poll::Ready(Ok(()))
    }
}

/// Decodes the resize stream, a sequence of JSON `{"Width":..,"Height":..}` documents (as
/// Go's `json.Encoder` writes them), and forwards each size until EOF, bad input or the
/// backend dropping its receiver.
pub(crate) async fn forward_resizes<R: AsyncRead + Unpin>(mut stream: R, tx: mpsc::Sender<TerminalSize>) {
    let mut buf: Vec<u8> = Vec::new();
    let mut chunk = [0u8; 1024];
    loop {
        let n = match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        buf.extend_from_slice(&chunk[..n]);
        let mut docs = serde_json::Deserializer::from_slice(&buf).into_iter::<TerminalSize>();
        let mut consumed = 0;
        loop {
            match docs.next() {
                Some(Ok(size)) => {
                    consumed = docs.byte_offset();
                    if tx.send(size).await.is_err() {
                        return;
                    }
                }
                Some(Err(e)) if e.is_eof() => break,
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "invalid resize message; ignoring the resize stream");
                    return;
                }
                None => {
                    consumed = buf.len();
                    break;
                }
            }
        }
        buf.drain(..consumed);
        if buf.len() > MAX_RESIZE_DOC {
            tracing::debug!("resize message too long; ignoring the resize stream");
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn resize_documents_split_across_chunks_are_decoded() {
        let (tx, rx) = mpsc::channel(4);
        let (size_tx, mut size_rx) = mpsc::channel(4);
        let task = tokio::spawn(forward_resizes(ChannelReader::new(rx), size_tx));
        tx.send(Bytes::from_static(b"{\"Width\":80,\"Hei")).await.expect("send");
        tx.send(Bytes::from_static(b"ght\":24}\n{\"Width\":1,\"Height\":2}\n")).await.expect("send");
        assert_eq!(size_rx.recv().await, Some(TerminalSize { width: 80, height: 24 }));
        assert_eq!(size_rx.recv().await, Some(TerminalSize { width: 1, height: 2 }));
        tx.send(Bytes::from_static(b"garbage")).await.expect("send");
        assert_eq!(size_rx.recv().await, None);
        task.await.expect("join");
    }
}
