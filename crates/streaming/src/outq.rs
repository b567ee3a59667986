//! The outgoing queue shared by every writer of one connection, and [`QueueWriter`], an
//! `AsyncWrite` that turns each write into one queued message.
//!
//! The queue is unbounded so that end-of-stream markers can be queued from `Drop` without
//! overtaking data; a byte budget (a semaphore) bounds the data in flight instead.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use tokio::io::AsyncWrite;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::PollSemaphore;

/// Bytes of data queued but not yet written to the connection, per connection.
const BUDGET: usize = 1024 * 1024;
/// Largest payload of one queued message.
pub(crate) const MAX_CHUNK: usize = 32 * 1024;

/// A queued message and the budget it holds until written.
pub(crate) struct Queued<M> {
    pub msg: M,
    pub _permit: Option<OwnedSemaphorePermit>,
}

/// Sending side of a connection's outgoing queue.
pub(crate) struct OutQueue<M> {
    tx: mpsc::UnboundedSender<Queued<M>>,
    budget: Arc<Semaphore>,
}

impl<M> Clone for OutQueue<M> {
    fn clone(&self) -> Self {
        Self { tx: self.tx.clone(), budget: self.budget.clone() }
    }
}

impl<M> OutQueue<M> {
    /// A queue and the receiver its writer task drains.
    pub fn new() -> (Self, mpsc::UnboundedReceiver<Queued<M>>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Self { tx, budget: Arc::new(Semaphore::new(BUDGET)) }, rx)
    }

    /// Queues a control message (outside the byte budget). False when the connection is gone.
    pub fn send(&self, msg: M) -> bool {
        self.tx.send(Queued { msg, _permit: None }).is_ok()
    }
}

/// An `AsyncWrite` sending each write as one message on an [`OutQueue`].
pub(crate) struct QueueWriter<M> {
    queue: OutQueue<M>,
    sem: PollSemaphore,
    make: Box<dyn Fn(Bytes) -> M + Send + Sync>,
    finish: Option<M>,
    reset: Arc<AtomicBool>,
}

impl<M> QueueWriter<M> {
    /// A writer wrapping data with `make`, queueing `finish` (if any) on shutdown or drop,
    /// and failing with `BrokenPipe` once `reset` is set.
    pub fn new(
        queue: OutQueue<M>,
        make: impl Fn(Bytes) -> M + Send + Sync + 'static,
        finish: Option<M>,
        reset: Arc<AtomicBool>,
    ) -> Self {
        let sem = PollSemaphore::new(queue.budget.clone());
        Self { queue, sem, make: Box::new(make), finish, reset }
    }

    fn broken(what: &str) -> io::Error {
        io::Error::new(io::ErrorKind::BrokenPipe, format!("stream {what}"))
    }
}

// Nothing is pinned structurally: the queued message type need not be `Unpin`.
impl<M> Unpin for QueueWriter<M> {}

impl<M: Send + 'static> AsyncWrite for QueueWriter<M> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if self.reset.load(Ordering::Acquire) {
            return Poll::Ready(Err(Self::broken("was reset by the client")));
        }
        if self.queue.tx.is_closed() {
            return Poll::Ready(Err(Self::broken("connection is closed")));
        }
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let n = buf.len().min(MAX_CHUNK);
        let Some(permit) = ready!(self.sem.poll_acquire_many(cx, n as u32)) else {
            return Poll::Ready(Err(Self::broken("connection is closed")));
        };
        let msg = (self.make)(Bytes::copy_from_slice(&buf[..n]));
        if self.queue.tx.send(Queued { msg, _permit: Some(permit) }).is_err() {
            return Poll::Ready(Err(Self::broken("connection is closed")));
        }
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Every write is queued at once and the writer task flushes whenever the queue runs dry.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Some(msg) = self.finish.take() {
            self.queue.send(msg);
        }
        Poll::Ready(Ok(()))
    }
}

impl<M> Drop for QueueWriter<M> {
    fn drop(&mut self) {
        if let Some(msg) = self.finish.take() {
            let _ = self.queue.tx.send(Queued { msg, _permit: None });
        }
    }
}
