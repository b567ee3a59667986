//! The events channel: a UNIX stream socket or FIFO the runtime created, written without
//! blocking the reaper, reopened after the runtime restarts.

use std::collections::VecDeque;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use tracing::{debug, info, warn};

use super::event::Event;
use super::supervisor::EventSink;
use super::{Error, Result};

/// Events kept while the runtime is away; beyond this the oldest are dropped (the runtime
/// re-adopting a sandbox must reconcile with `/proc` anyway).
const MAX_PENDING: usize = 1024;

/// Writes [`Event`] lines to the runtime.
///
/// Every connection starts with a ready line. Writes never block: what the peer does not take
/// stays queued. When the channel breaks (the runtime restarted) the pause keeps running; the
/// next event, or a SIGHUP, opens the path again and delivers what is queued.
///
/// A FIFO must already be open for reading when the pause opens it (the runtime opens its end
/// read-write, so it neither waits for a writer nor sees end-of-file between pauses).
#[derive(Debug)]
pub struct EventsChannel {
    path: PathBuf,
    own_pid: i32,
    conn: Option<File>,
    pending: VecDeque<Event>,
    /// Bytes of the first pending line already written on `conn`.
    written: usize,
    dropped: u64,
}

impl EventsChannel {
    /// Opens `path` and sends the ready line. Failing here is fatal: the runtime waits for it.
    pub fn connect(path: &Path, own_pid: i32) -> Result<Self> {
        let conn = open(path).map_err(|source| Error::Events { path: path.to_owned(), source })?;
        let mut channel = Self {
            path: path.to_owned(),
            own_pid,
            conn: None,
            pending: VecDeque::new(),
            written: 0,
            dropped: 0,
        };
        channel.attach(conn);
        channel.flush();
        Ok(channel)
    }

    /// Whether a connection is open (it may still turn out broken on the next write).
    pub fn is_connected(&self) -> bool {
        self.conn.is_some()
    }

    /// Events not yet delivered.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    fn attach(&mut self, conn: File) {
        self.conn = Some(conn);
        self.written = 0;
        // One ready line, first, on each connection.
        self.pending.retain(|event| !matches!(event, Event::Ready { .. }));
        let queued = self.pending.len();
        self.pending.push_front(Event::Ready { pid: self.own_pid, queued });
    }

    fn try_open(&mut self) -> bool {
        match open(&self.path) {
            Ok(conn) => {
                info!(path = %self.path.display(), "events channel open");
                self.attach(conn);
                true
            }
            Err(error) => {
                debug!(path = %self.path.display(), %error, "events channel still closed");
                false
            }
        }
    }

    fn disconnect(&mut self) {
        self.conn = None;
        // A line cut short went to a dead peer: the next connection gets it whole.
        self.written = 0;
    }

    /// Writes queued lines until done or the peer's buffer is full.
    fn write_pending(&mut self) -> io::Result<()> {
        let Some(conn) = self.conn.as_mut() else {
            return Ok(());
        };
        while let Some(event) = self.pending.front() {
            let line = event.to_line();
            match conn.write(&line.as_bytes()[self.written..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    self.written += n;
                    if self.written == line.len() {
                        self.pending.pop_front();
                        self.written = 0;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

impl EventSink for EventsChannel {
    fn send(&mut self, event: Event) {
        if self.pending.len() >= MAX_PENDING {
            // Never drop a line half written on the live connection: that would garble it.
            let oldest = usize::from(self.written > 0);
            self.pending.remove(oldest);
            self.dropped += 1;
            warn!(dropped = self.dropped, "events channel backlog full; dropped the oldest");
        }
        self.pending.push_back(event);
        self.flush();
    }

    fn reconnect(&mut self) {
        self.disconnect();
        self.try_open();
        self.flush();
    }

    fn flush(&mut self) {
        if self.pending.is_empty() || (self.conn.is_none() && !self.try_open()) {
            return;
        }
        if let Err(error) = self.write_pending() {
            warn!(path = %self.path.display(), %error, "events channel broken; will reopen");
            self.disconnect();
            // The runtime may already listen again at the same path: one immediate retry.
            if self.try_open()
                && let Err(error) = self.write_pending()
            {
                warn!(%error, "events channel broken again");
                self.disconnect();
            }
        }
    }
}

/// Opens the channel without blocking: a socket is connected, anything else (a FIFO, a file, a
/// tty) is opened for appending. A FIFO without a reader fails with ENXIO instead of waiting.
fn open(path: &Path) -> io::Result<File> {
    if fs::metadata(path)?.file_type().is_socket() {
        let stream = UnixStream::connect(path)?;
        stream.set_nonblocking(true)?;
        return Ok(File::from(OwnedFd::from(stream)));
    }
    OpenOptions::new().append(true).custom_flags(nix::libc::O_NONBLOCK).open(path)
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader};
    use std::os::unix::net::UnixListener;

    use super::*;
    use crate::pause::ChildExit;

    fn read_event(reader: &mut impl BufRead) -> Event {
        let mut line = String::new();
        reader.read_line(&mut line).expect("read a line");
        Event::from_line(&line).expect("a valid event line")
    }

    #[test]
    fn queued_events_follow_a_fresh_ready_line_after_the_peer_comes_back() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("events.sock");
        let listener = UnixListener::bind(&path).expect("bind");
        let mut channel = EventsChannel::connect(&path, 5).expect("connect");
        let (first, _) = listener.accept().expect("accept");
        let mut first = BufReader::new(first);
        assert_eq!(read_event(&mut first), Event::Ready { pid: 5, queued: 0 });

        // The runtime goes away: the socket closes and its file is gone.
        drop((first, listener));
        fs::remove_file(&path).expect("remove socket");
        channel.send(Event::Exit(ChildExit::exited(6, 1)));
        assert!(!channel.is_connected());
        assert_eq!(channel.pending(), 1);

        let listener = UnixListener::bind(&path).expect("bind again");
        channel.send(Event::Exit(ChildExit::exited(7, 2)));
        let (second, _) = listener.accept().expect("accept");
        let mut second = BufReader::new(second);
        assert_eq!(read_event(&mut second), Event::Ready { pid: 5, queued: 2 });
        assert_eq!(read_event(&mut second), Event::Exit(ChildExit::exited(6, 1)));
        assert_eq!(read_event(&mut second), Event::Exit(ChildExit::exited(7, 2)));
        assert_eq!(channel.pending(), 0);
    }

    #[test]
    fn a_missing_path_is_an_error_at_start() {
        let dir = tempfile::tempdir().expect("temp dir");
        let err = EventsChannel::connect(&dir.path().join("nope"), 1).expect_err("no such path");
        assert!(err.to_string().contains("nope"), "{err}");
    }
}
