//! Reading a log file forward into the bytes a client receives, following it if asked.

use std::io::{self, SeekFrom};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use futures_util::{Stream, TryStreamExt, stream};
use tokio::fs::File;
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio::time::Instant;

use crate::options::LogOptions;
use crate::record::{Record, Render};
use crate::tail::{CHUNK, tail_start};
use crate::watch::Watcher;

/// Answers "is the container still running?"; asked only while following.
pub type Running = Arc<dyn Fn() -> BoxFuture<'static, bool> + Send + Sync>;

/// How often a follower asks [`Running`] while the file is quiet.
const RUNNING_EVERY: Duration = Duration::from_secs(1);

/// Opens the log file at `path` and returns its output as `options` ask. A missing file is an
/// error of kind [`io::ErrorKind::NotFound`] (HTTP 404). Nothing runs beside the returned
/// stream: dropping it closes the file and the watch.
pub async fn open(
    path: PathBuf,
    options: LogOptions,
    running: Running,
) -> io::Result<impl Stream<Item = io::Result<Bytes>> + Send + 'static> {
    let mut file = File::open(&path).await?;
    let watcher = options.follow.then(|| Watcher::new(&path));
    let render = Render::new(&options);
    if let Some(n) = options.tail_lines {
        let len = file.metadata().await?.len();
        let in_stream = |line: &[u8]| Record::parse(line).is_some_and(|record| render.in_stream(&record));
        // While following, a line still being written is left for the reader to wait on.
        let start = tail_start(&mut file, len, n, options.follow, in_stream).await?;
        file.seek(SeekFrom::Start(start)).await?;
    }
    let follow = watcher.map(|watcher| Follow { watcher, running, next_check: Instant::now() });
    let reader = Reader {
        file,
        pending: Vec::new(),
        lines: Lines { render, path, warned: false },
        left: options.limit_bytes,
        follow,
        done: options.limit_bytes == Some(0),
    };
    Ok(stream::unfold(reader, |mut reader| async move {
        let item = reader.next().await?;
        Some((item, reader))
    }))
}

/// [`open`] as one stream: when the file cannot be opened, its only item is that error.
pub fn stream(
    path: PathBuf,
    options: LogOptions,
    running: Running,
) -> impl Stream<Item = io::Result<Bytes>> + Send + 'static {
    stream::once(open(path, options, running)).try_flatten()
}

/// The state of one client's log stream.
struct Reader {
    file: File,
    /// Bytes read but not yet shown: the beginning of a line whose `\n` has not been read.
    pending: Vec<u8>,
    lines: Lines,
    /// Bytes the client may still receive (`limitBytes`).
    left: Option<u64>,
    /// Set while following; cleared when the container has stopped, to drain the rest.
    follow: Option<Follow>,
    done: bool,
}

impl Reader {
    /// The next bytes for the client; `None` at the end.
    async fn next(&mut self) -> Option<io::Result<Bytes>> {
        while !self.done {
            match self.step().await {
                Ok(Some(bytes)) => return Some(Ok(bytes)),
                Ok(None) => {}
                Err(error) => {
                    self.done = true;
                    return Some(Err(error));
                }
            }
        }
        None
    }

    /// Reads once, or waits once at the end of the file; returns what there is to send.
    async fn step(&mut self) -> io::Result<Option<Bytes>> {
        let mut out = Vec::new();
        if self.read_some().await? {
            self.complete_lines(&mut out);
        } else if self.follow.is_some() && self.rotated().await {
            // The kubelet rotated the log (renamed it, and the runtime reopened a new file at
            // the path), and the runtime has written to the new one, so it has stopped
            // writing to the old one: the rest of the old one first, then the new one.
            while self.read_some().await? {
                self.complete_lines(&mut out);
            }
            self.file = File::open(&self.lines.path).await?;
            if let Some(follow) = &mut self.follow {
                follow.watcher = Watcher::new(&self.lines.path);
            }
        } else if let Some(follow) = &mut self.follow {
            if follow.container_stopped().await {
                self.follow = None;
            } else {
                follow.wait().await?;
            }
        } else {
            // Without follow (or once the container stopped) a last line without `\n` is final.
            if !self.pending.is_empty() {
                self.lines.show(&self.pending, &mut out);
                self.pending.clear();
            }
            self.done = true;
        }
        Ok(self.limit(out))
    }

    /// Whether the path now names another file than the one being read (the log was rotated)
    /// and that file has content. Until the runtime writes there it may still write to the old
    /// one (it reopens on a signal), so an empty new file is not a rotation yet; nor is a path
    /// with no file (between the rename and the reopen).
    async fn rotated(&self) -> bool {
        use std::os::unix::fs::MetadataExt;
        let (Ok(open), Ok(now)) = (self.file.metadata().await, tokio::fs::metadata(&self.lines.path).await)
        else {
            return false;
        };
        (open.dev(), open.ino()) != (now.dev(), now.ino()) && now.len() > 0
    }

    /// Appends up to [`CHUNK`] bytes of the file to `pending`; false at the end of the file.
    async fn read_some(&mut self) -> io::Result<bool> {
        let old = self.pending.len();
        self.pending.resize(old + CHUNK, 0);
        let read = self.file.read(&mut self.pending[old..]).await;
        self.pending.truncate(old + *read.as_ref().unwrap_or(&0));
        Ok(read? > 0)
    }

    /// Shows every line of `pending` that has its `\n`, keeping the rest.
    fn complete_lines(&mut self, out: &mut Vec<u8>) {
        let mut start = 0;
        while let Some(newline) = self.pending[start..].iter().position(|&byte| byte == b'\n') {
            let end = start + newline + 1;
            self.lines.show(&self.pending[start..end], out);
            start = end;
        }
        self.pending.drain(..start);
    }

    /// Cuts `out` to what `limitBytes` still allows, ending the stream when that is used up.
    fn limit(&mut self, mut out: Vec<u8>) -> Option<Bytes> {
        if let Some(left) = &mut self.left {
            let len = out.len() as u64;
            if len >= *left {
                out.truncate(usize::try_from(*left).unwrap_or(usize::MAX));
                *left = 0;
                self.done = true;
            } else {
                *left -= len;
            }
        }
        (!out.is_empty()).then(|| Bytes::from(out))
    }
}

/// Turns lines of the file into output.
struct Lines {
    render: Render,
    path: PathBuf,
    /// A malformed line is reported once per stream, not once per line.
    warned: bool,
}

impl Lines {
    fn show(&mut self, line: &[u8], out: &mut Vec<u8>) {
        match Record::parse(line) {
            Some(record) if self.render.wants(&record) => self.render.write(&record, out),
            Some(_) => {}
            None if !self.warned => {
                self.warned = true;
                let start = String::from_utf8_lossy(&line[..line.len().min(120)]);
                tracing::warn!(path = %self.path.display(), line = %start, "skipping log lines not in the CRI format");
            }
            None => {}
        }
    }
}

/// What following needs: the wake-up and the running check.
struct Follow {
    watcher: Watcher,
    running: Running,
    /// When [`Running`] is next asked; at the first end of file, so a stopped container's
    /// log ends right away.
    next_check: Instant,
}

impl Follow {
    /// At the end of the file: whether the container has stopped, asked when due.
    async fn container_stopped(&mut self) -> bool {
        if Instant::now() < self.next_check {
            return false;
        }
        let running = (self.running)().await;
        self.next_check = Instant::now() + RUNNING_EVERY;
        !running
    }

    /// Until the file may have changed, or the next running check is due.
    async fn wait(&mut self) -> io::Result<()> {
        self.watcher.wait_until(self.next_check).await
    }
}
