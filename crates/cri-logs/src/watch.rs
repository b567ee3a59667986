//! Waiting for a log file to change: inotify where it can be set up, a short poll otherwise.

use std::io;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::path::Path;
use std::time::Duration;

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::time::Instant;

/// How often the file is looked at when inotify is not available.
const POLL_EVERY: Duration = Duration::from_millis(50);

/// Wakes a follower when its file may have grown.
pub(super) enum Watcher {
    /// An inotify instance watching the file; owned here, so it closes with the stream.
    Inotify(AsyncFd<InotifyFd>),
    /// No inotify (e.g. the per-user instance limit was reached): wake every [`POLL_EVERY`].
    Poll,
}

/// The inotify instance as tokio needs it (nix gives `AsFd`, tokio wants `AsRawFd`).
pub(super) struct InotifyFd(Inotify);

impl AsRawFd for InotifyFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

impl Watcher {
    /// Watches `path`; set up before reading, so that no write after the last read is missed.
    pub(super) fn new(path: &Path) -> Self {
        match watch(path) {
            Ok(fd) => Self::Inotify(fd),
            Err(error) => {
                tracing::warn!(path = %path.display(), %error, "cannot watch the log file, polling it");
                Self::Poll
            }
        }
    }

    /// Returns when the file may have changed, or at `deadline` at the latest.
    pub(super) async fn wait_until(&mut self, deadline: Instant) -> io::Result<()> {
        match self {
            Self::Poll => {
                tokio::time::sleep_until(deadline.min(Instant::now() + POLL_EVERY)).await;
                Ok(())
            }
            Self::Inotify(fd) => tokio::time::timeout_at(deadline, changed(fd)).await.unwrap_or(Ok(())),
        }
    }
}

// tokio's safe constructors are deprecated (no I/O safety); the replacement is `unsafe`.
#[allow(unsafe_code)]
fn watch(path: &Path) -> io::Result<AsyncFd<InotifyFd>> {
    let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)?;
    // Writes, and the file going away or being replaced (then only the running check ends it).
    let events = AddWatchFlags::IN_MODIFY
        | AddWatchFlags::IN_CLOSE_WRITE
        | AddWatchFlags::IN_ATTRIB
        | AddWatchFlags::IN_MOVE_SELF
        | AddWatchFlags::IN_DELETE_SELF;
    inotify.add_watch(path, events)?;
    // SAFETY: `InotifyFd` owns the descriptor (an `OwnedFd` inside `Inotify`), so it stays open
    // and the same until the `AsyncFd` drops it, and `as_raw_fd` always returns it; nothing
    // here replaces the inner value through `get_mut`.
    Ok(unsafe { AsyncFd::register_with_interest(InotifyFd(inotify), Interest::READABLE) }?)
}

/// Waits for at least one event and consumes those queued; what they say does not matter,
/// the reader looks at the file anyway.
async fn changed(fd: &AsyncFd<InotifyFd>) -> io::Result<()> {
    loop {
        let mut ready = fd.readable().await?;
        match ready.try_io(|inner| inner.get_ref().0.read_events().map_err(io::Error::from)) {
            Ok(events) => return events.map(drop),
            Err(_would_block) => continue,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    #[tokio::test]
    async fn inotify_wakes_on_a_write_and_times_out_without_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("0.log");
        std::fs::write(&path, "").unwrap();
        let mut watcher = Watcher::new(&path);
        assert!(matches!(watcher, Watcher::Inotify(_)), "inotify should be available on Linux");

        let begin = Instant::now();
        watcher.wait_until(begin + Duration::from_millis(200)).await.unwrap();
        assert!(begin.elapsed() >= Duration::from_millis(200), "woke without a write");

        let mut file = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
        file.write_all(b"x").unwrap();
        let begin = Instant::now();
        watcher.wait_until(begin + Duration::from_secs(5)).await.unwrap();
        assert!(begin.elapsed() < Duration::from_secs(1), "a write did not wake the watcher");
    }

    #[tokio::test]
    async fn polling_wakes_often() {
        let begin = Instant::now();
        Watcher::Poll.wait_until(begin + Duration::from_secs(5)).await.unwrap();
        assert!(begin.elapsed() < Duration::from_secs(1));
    }
}
