//! A server-side SPDY/3.1 session over any byte stream: the peer opens streams, this side
//! accepts or refuses them and reads and writes their data.
//!
//! Flow control: this side sends WINDOW_UPDATE (stream and session) as data is consumed, so a
//! peer that honours windows never stalls. It does not hold its own sending to the peer's
//! window: the only SPDY client of these protocols (moby/spdystream, used by client-go)
//! neither sends WINDOW_UPDATE nor enforces windows; TCP's backpressure bounds sending.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::codec::{FramedRead, FramedWrite};

use super::frame::{FLAG_FIN, FLAG_UNIDIRECTIONAL, Frame, FrameCodec, status};
use super::headers::{HeaderDecoder, HeaderEncoder, Headers, MAX_HEADER_BLOCK};
use crate::error::{Error, Result};
use crate::outq::{OutQueue, QueueWriter};

/// SPDY/3.1 initial flow-control window (stream and session).
pub const INITIAL_WINDOW: u32 = 64 * 1024;
/// Data frames buffered per stream before the session stops reading the connection.
const RECV_QUEUE: usize = 256;
/// New streams waiting for the handler before further ones are refused.
const ACCEPT_QUEUE: usize = 64;
/// How long closing waits for the peer to hang up after GOAWAY.
const LINGER: Duration = Duration::from_secs(2);

enum Out {
    Frame(Frame),
    /// Flush and close the connection's writing side.
    Shutdown,
}

#[derive(Default)]
struct Entry {
    /// Delivers the peer's data; `None` once the peer finished sending.
    tx: Option<mpsc::Sender<Bytes>>,
    reset: Arc<AtomicBool>,
    local_closed: bool,
}

struct Shared {
    streams: Mutex<HashMap<u32, Entry>>,
    out: OutQueue<Out>,
    encoder: Mutex<HeaderEncoder>,
    last_stream_id: Mutex<u32>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these locks leaves plain data behind; keep going.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Shared {
    fn send(&self, frame: Frame) {
        self.out.send(Out::Frame(frame));
    }

    fn reset(&self, stream_id: u32, status: u32) {
        if let Some(e) = lock(&self.streams).remove(&stream_id) {
            e.reset.store(true, Ordering::Release);
        }
        self.send(Frame::RstStream { stream_id, status });
    }

    /// Compresses and queues under one lock: header blocks must reach the peer in the order
    /// they went through the shared zlib stream.
    fn reply(&self, stream_id: u32, headers: &Headers) -> Result<()> {
        let mut enc = lock(&self.encoder);
        let header_block = enc.encode(headers)?;
        self.send(Frame::SynReply { stream_id, fin: false, header_block });
        Ok(())
    }

    fn local_finished(&self, stream_id: u32) {
        let mut streams = lock(&self.streams);
        if let Some(e) = streams.get_mut(&stream_id) {
            e.local_closed = true;
            if e.tx.is_none() {
                streams.remove(&stream_id);
            }
        }
    }
}

/// The handle of a running session: close it when done.
pub struct Session {
    shared: Arc<Shared>,
    reader: JoinHandle<()>,
    writer: JoinHandle<()>,
    /// Cancelled when the connection can no longer be read (EOF, error, a broken frame).
    gone: tokio_util::sync::CancellationToken,
}

/// A stream the peer opened, waiting to be accepted or refused.
pub struct NewStream {
    id: u32,
    headers: Headers,
    rx: mpsc::Receiver<Bytes>,
    reset: Arc<AtomicBool>,
    unidirectional: bool,
    shared: Arc<Shared>,
}

impl NewStream {
    /// The stream id.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// The headers of the SYN_STREAM (names lower-case).
    pub fn headers(&self) -> &Headers {
        &self.headers
    }

    /// Sends SYN_REPLY and returns the open stream.
    pub fn accept(self) -> Result<SpdyStream> {
        self.shared.reply(self.id, &Headers::new())?;
        let id = self.id;
        let writer = QueueWriter::new(
            self.shared.out.clone(),
            move |data| Out::Frame(Frame::Data { stream_id: id, fin: false, data }),
            (!self.unidirectional).then_some(Out::Frame(Frame::Data {
                stream_id: id,
                fin: true,
                data: Bytes::new(),
            })),
            self.reset.clone(),
        );
        Ok(SpdyStream {
            id,
            headers: self.headers,
            reader: StreamReader { id, rx: self.rx, pending: Bytes::new(), unacked: 0, shared: self.shared },
            writer: StreamWriter(writer),
        })
    }

    /// Refuses the stream with RST_STREAM `status` (see [`super::frame::status`]).
    pub fn refuse(self, status: u32) {
        self.shared.reset(self.id, status);
    }
}

/// An accepted stream: its headers and both halves.
pub struct SpdyStream {
    /// Stream id.
    pub id: u32,
    /// SYN_STREAM headers.
    pub headers: Headers,
    /// What the peer sends on this stream.
    pub reader: StreamReader,
    /// What this side sends; shutting it down or dropping it sends FLAG_FIN.
    pub writer: StreamWriter,
}

impl SpdyStream {
    /// Ends the stream abnormally (RST_STREAM CANCEL).
    pub fn reset(self) {
        self.reader.shared.reset(self.id, status::CANCEL);
    }
}

/// The readable half of a stream; EOF when the peer sends FLAG_FIN or resets the stream.
pub struct StreamReader {
    id: u32,
    rx: mpsc::Receiver<Bytes>,
    pending: Bytes,
    unacked: u32,
    shared: Arc<Shared>,
}

impl StreamReader {
    fn ack(&mut self, n: usize, force: bool) {
        self.unacked += n as u32;
        if self.unacked > 0 && (force || self.unacked >= INITIAL_WINDOW / 2) {
            let delta = std::mem::take(&mut self.unacked);
            self.shared.send(Frame::WindowUpdate { stream_id: self.id, delta });
            self.shared.send(Frame::WindowUpdate { stream_id: 0, delta });
        }
    }
}

impl AsyncRead for StreamReader {
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
        let drained = self.pending.is_empty() && self.rx.is_empty();
        self.ack(n, drained);
        Poll::Ready(Ok(()))
    }
}

/// The writable half of a stream: one DATA frame per write, queued at once.
pub struct StreamWriter(QueueWriter<Out>);

impl AsyncWrite for StreamWriter {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

impl Session {
    /// Starts serving the SPDY session on `io`; new streams arrive on the returned receiver,
    /// which ends when the connection does.
    pub fn start<IO>(io: IO) -> (Session, mpsc::Receiver<NewStream>)
    where
        IO: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (rd, wr) = tokio::io::split(io);
        let (out, out_rx) = OutQueue::new();
        let shared = Arc::new(Shared {
            streams: Mutex::new(HashMap::new()),
            out,
            encoder: Mutex::new(HeaderEncoder::new()),
            last_stream_id: Mutex::new(0),
        });
        let (accept_tx, accept_rx) = mpsc::channel(ACCEPT_QUEUE);
        let writer =
            tokio::spawn(write_loop(FramedWrite::new(wr, FrameCodec::default()), out_rx, shared.clone()));
        let reader_shared = shared.clone();
        let gone = tokio_util::sync::CancellationToken::new();
        let reader_gone = gone.clone();
        let reader = tokio::spawn(async move {
            let _gone = reader_gone.drop_guard();
            let mut frames = FramedRead::new(rd, FrameCodec::default());
            if let Err(e) = read_loop(&mut frames, &reader_shared, &accept_tx).await {
                tracing::debug!(error = %e, "spdy session ended with an error");
                let status = match e {
                    Error::Io { .. } | Error::Connection(_) => status::INTERNAL_ERROR,
                    _ => status::PROTOCOL_ERROR,
                };
                let last_good_stream_id = *lock(&reader_shared.last_stream_id);
                reader_shared.send(Frame::GoAway { last_good_stream_id, status });
            }
            // The connection is gone for reading: every reader sees EOF, every writer fails.
            for (_, e) in lock(&reader_shared.streams).drain() {
                e.reset.store(true, Ordering::Release);
            }
        });
        (Session { shared, reader, writer, gone }, accept_rx)
    }

    /// Resolves once the connection can no longer be read: the peer closed or reset it, or
    /// sent something that ended the session.
    pub fn closed(&self) -> tokio_util::sync::WaitForCancellationFutureOwned {
        self.gone.clone().cancelled_owned()
    }

    /// Sends GOAWAY, flushes everything queued, closes the writing side and gives the peer a
    /// moment to hang up (so unread data from it does not turn the close into a reset).
    pub async fn close(self) {
        let last_good_stream_id = *lock(&self.shared.last_stream_id);
        self.shared.send(Frame::GoAway { last_good_stream_id, status: 0 });
        self.shared.out.send(Out::Shutdown);
        let _ = tokio::time::timeout(LINGER * 5, self.writer).await;
        let mut reader = self.reader;
        if tokio::time::timeout(LINGER, &mut reader).await.is_err() {
            reader.abort();
        }
    }
}

async fn write_loop<W: AsyncWrite + Unpin>(
    mut sink: FramedWrite<W, FrameCodec>,
    mut rx: mpsc::UnboundedReceiver<crate::outq::Queued<Out>>,
    shared: Arc<Shared>,
) {
    while let Some(q) = rx.recv().await {
        let frame = match q.msg {
            Out::Frame(f) => f,
            Out::Shutdown => break,
        };
        let fin_of = match &frame {
            Frame::Data { stream_id, fin: true, .. } => Some(*stream_id),
            _ => None,
        };
        if let Err(e) = sink.feed(frame).await {
            tracing::debug!(error = %e, "spdy write failed");
            return;
        }
        if let Some(id) = fin_of {
            shared.local_finished(id);
        }
        if rx.is_empty() && sink.flush().await.is_err() {
            return;
        }
    }
    let _ = sink.flush().await;
    let _ = sink.get_mut().shutdown().await;
}

async fn read_loop<R: AsyncRead + Unpin>(
    frames: &mut FramedRead<R, FrameCodec>,
    shared: &Arc<Shared>,
    accept: &mpsc::Sender<NewStream>,
) -> Result<()> {
    let mut decoder = HeaderDecoder::new(MAX_HEADER_BLOCK);
    let mut going_away = false;
    while let Some(frame) = frames.next().await {
        match frame? {
            Frame::SynStream { stream_id, flags, header_block, .. } => {
                // Decode first: the zlib stream must see every block, even of refused streams.
                let headers = decoder.decode(&header_block)?;
                on_syn_stream(shared, accept, stream_id, flags, headers, going_away)?;
            }
            Frame::Data { stream_id, fin, data } => on_data(shared, stream_id, fin, data).await,
            Frame::RstStream { stream_id, .. } => {
                if let Some(e) = lock(&shared.streams).remove(&stream_id) {
                    e.reset.store(true, Ordering::Release);
                }
            }
            Frame::Headers { stream_id, fin, header_block } => {
                decoder.decode(&header_block)?;
                if fin {
                    on_data(shared, stream_id, true, Bytes::new()).await;
                }
            }
            Frame::Ping { id } if id % 2 == 1 => shared.send(Frame::Ping { id }),
            Frame::GoAway { .. } => going_away = true,
            Frame::SynReply { stream_id, .. } => {
                return Err(Error::Protocol(format!(
                    "SYN_REPLY for stream {stream_id}, which this server never opened"
                )));
            }
            // Our own pings' answers, settings, window updates (see the module doc), unknown types.
            Frame::Ping { .. }
            | Frame::Settings { .. }
            | Frame::WindowUpdate { .. }
            | Frame::Unknown { .. } => {}
        }
    }
    Ok(())
}

fn on_syn_stream(
    shared: &Arc<Shared>,
    accept: &mpsc::Sender<NewStream>,
    stream_id: u32,
    flags: u8,
    headers: Headers,
    going_away: bool,
) -> Result<()> {
    {
        let mut last = lock(&shared.last_stream_id);
        if stream_id.is_multiple_of(2) || stream_id <= *last {
            return Err(Error::Protocol(format!("SYN_STREAM with stream id {stream_id} after {}", *last)));
        }
        *last = stream_id;
    }
    if going_away {
        shared.send(Frame::RstStream { stream_id, status: status::REFUSED_STREAM });
        return Ok(());
    }
    let fin = flags & FLAG_FIN != 0;
    let (tx, rx) = mpsc::channel(RECV_QUEUE);
    let reset = Arc::new(AtomicBool::new(false));
    let unidirectional = flags & FLAG_UNIDIRECTIONAL != 0;
    let entry = Entry { tx: (!fin).then_some(tx), reset: reset.clone(), local_closed: unidirectional };
    lock(&shared.streams).insert(stream_id, entry);
    let new = NewStream { id: stream_id, headers, rx, reset, unidirectional, shared: shared.clone() };
    if accept.try_send(new).is_err() {
        tracing::debug!(stream_id, "spdy stream refused: handler busy or gone");
        shared.reset(stream_id, status::REFUSED_STREAM);
    }
    Ok(())
}

async fn on_data(shared: &Arc<Shared>, stream_id: u32, fin: bool, data: Bytes) {
    let tx = {
        let mut streams = lock(&shared.streams);
        let Some(entry) = streams.get_mut(&stream_id) else {
            if stream_id > *lock(&shared.last_stream_id) {
                shared.send(Frame::RstStream { stream_id, status: status::INVALID_STREAM });
            }
            return;
        };
        let tx = entry.tx.clone();
        if fin {
            entry.tx = None;
            if entry.local_closed {
                streams.remove(&stream_id);
            }
        }
        tx
    };
    let len = data.len() as u32;
    if len == 0 {
        return;
    }
    let delivered = match tx {
        Some(tx) => tx.send(data).await.is_ok(),
        None => false,
    };
    if !delivered {
        // Nobody reads this stream: acknowledge the bytes so a flow-controlled peer goes on.
        shared.send(Frame::WindowUpdate { stream_id, delta: len });
        shared.send(Frame::WindowUpdate { stream_id: 0, delta: len });
    }
}
