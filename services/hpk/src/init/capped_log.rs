//! A service's log file with a size cap (review M6): past [`MAX_LOG_BYTES`] the file becomes
//! `<name>.log.1` (replacing the one before) and a new one starts, so a service that logs
//! without end — or a peer that makes it — holds at most twice the cap on the node's disk.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// Size at which a service's log is rotated.
pub const MAX_LOG_BYTES: u64 = 10 * 1024 * 1024;

/// An append-only log file rotated at a size.
#[derive(Debug)]
pub struct CappedLog {
    path: PathBuf,
    max: u64,
    file: File,
    size: u64,
}

impl CappedLog {
    /// Opens (or creates) `path` for appending, rotating once it would pass `max` bytes.
    pub fn open(path: &Path, max: u64) -> io::Result<Self> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        let size = file.metadata()?.len();
        Ok(Self { path: path.to_owned(), max, file, size })
    }

    /// The previous file: `<path>.1`.
    pub fn previous(path: &Path) -> PathBuf {
        let mut name = path.as_os_str().to_owned();
        name.push(".1");
        PathBuf::from(name)
    }

    /// Appends `buf`, rotating first if it would take the file past the cap (a file holding
    /// nothing yet takes `buf` whole, however large).
    pub fn write(&mut self, buf: &[u8]) -> io::Result<()> {
        if self.size > 0 && self.size + buf.len() as u64 > self.max {
            self.rotate()?;
        }
        self.file.write_all(buf)?;
        self.size += buf.len() as u64;
        Ok(())
    }

    /// The bubble's own log (`logs/bubble.log` in the node directory), capped, when this
    /// process's stderr is that file as the launcher opened it (review M6): the supervisor of
    /// a long-lived bubble would otherwise grow it without end. `None` elsewhere.
    pub fn for_bubble_stderr() -> Option<std::sync::Mutex<Self>> {
        use std::os::unix::fs::MetadataExt;
        let path = Path::new(crate::bubble::spec::NODE_DIR).join("logs/bubble.log");
        let stderr = nix::sys::stat::fstat(std::os::fd::AsFd::as_fd(&std::io::stderr())).ok()?;
        let file = std::fs::metadata(&path).ok()?;
        #[allow(clippy::unnecessary_cast)] // the fields' types differ between C libraries
        let same = stderr.st_dev as u64 == file.dev() && stderr.st_ino as u64 == file.ino();
        if !same {
            return None;
        }
        Self::open(&path, MAX_LOG_BYTES).ok().map(std::sync::Mutex::new)
    }

    fn rotate(&mut self) -> io::Result<()> {
        std::fs::rename(&self.path, Self::previous(&self.path))?;
        self.file = OpenOptions::new().create(true).append(true).open(&self.path)?;
        self.size = 0;
        Ok(())
    }
}

impl Write for CappedLog {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        CappedLog::write(self, buf)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn past_the_cap_the_log_moves_to_dot_one_and_starts_again() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join("svc.log");
        let mut log = CappedLog::open(&path, 100).expect("open");
        for i in 0..1000 {
            log.write(format!("line {i:04}\n").as_bytes()).expect("write");
        }
        let current = std::fs::read_to_string(&path).expect("current");
        let previous = std::fs::read_to_string(CappedLog::previous(&path)).expect("previous");
        assert!(current.len() <= 100 && previous.len() <= 100, "{} and {}", current.len(), previous.len());
        assert!(current.ends_with("line 0999\n"), "the newest lines are kept: {current}");
        // Whole lines (writes) only: the previous file ends where the current one starts.
        let first_current: u32 = current[5..9].parse().expect("number");
        assert!(previous.ends_with(&format!("line {:04}\n", first_current - 1)), "{previous}");
        let files = std::fs::read_dir(tmp.path()).expect("dir").count();
        assert_eq!(files, 2, "one previous file is kept, no more");
    }

    #[test]
    fn an_existing_log_counts_towards_the_cap() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join("svc.log");
        std::fs::write(&path, "x".repeat(90)).expect("write");
        let mut log = CappedLog::open(&path, 100).expect("open");
        log.write(b"0123456789").expect("fits");
        assert!(!CappedLog::previous(&path).exists());
        log.write(b"!").expect("rotates");
        assert_eq!(std::fs::read(CappedLog::previous(&path)).expect("previous").len(), 100);
        assert_eq!(std::fs::read_to_string(&path).expect("current"), "!");
        // A write larger than the cap still lands, alone in its file.
        log.write(&[b'y'; 250]).expect("big");
        assert_eq!(std::fs::read(&path).expect("current").len(), 250);
    }
}
