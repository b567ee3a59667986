//! The bubble's services as child processes: each logged to its own file (rotated at 10 MiB,
//! one previous file kept: `capped_log.rs`), restarted with
//! back-off when it exits (1 s, doubling to 30 s; back to 1 s after a minute of running), and
//! stopped in reverse start order (SIGTERM, then SIGKILL after 10 s).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, watch};

use super::capped_log::{CappedLog, MAX_LOG_BYTES};
use crate::error::{Error, Result};

const STOP_GRACE: Duration = Duration::from_secs(10);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
const STABLE: Duration = Duration::from_secs(60);

/// The PID of each running service of this bubble: the relay hands connections only to
/// listeners these processes hold (review L5).
static RUNNING: Mutex<BTreeMap<String, u32>> = Mutex::new(BTreeMap::new());

/// The PIDs of the bubble's running services.
pub fn service_pids() -> Vec<u32> {
    RUNNING.lock().unwrap_or_else(std::sync::PoisonError::into_inner).values().copied().collect()
}

/// Records service `name`'s PID (None: not running) for [`service_pids`] and in `tx`.
fn note_pid(name: &str, tx: &watch::Sender<Option<u32>>, pid: Option<u32>) {
    let mut running = RUNNING.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    match pid {
        Some(pid) => running.insert(name.to_owned(), pid),
        None => running.remove(name),
    };
    let _ = tx.send(pid);
}

/// How to start one service.
#[derive(Debug, Clone)]
pub struct Service {
    /// Its name (and log file name).
    pub name: String,
    /// The program.
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
}

impl Service {
    /// A service running `program` with `args`.
    pub fn new(name: &str, program: &str, args: Vec<String>) -> Self {
        Self { name: name.into(), program: program.into(), args }
    }
}

struct Running {
    name: String,
    stop: Arc<Notify>,
    done: watch::Receiver<bool>,
    pid: watch::Receiver<Option<u32>>,
}

/// The started services.
pub struct Supervisor {
    logs: PathBuf,
    running: Vec<Running>,
}

impl Supervisor {
    /// A supervisor writing logs under `logs`.
    pub fn new(logs: PathBuf) -> Self {
        Self { logs, running: Vec::new() }
    }

    /// Starts `service` and keeps it running; returns once the first start succeeded.
    pub fn start(&mut self, service: Service) -> Result<()> {
        let log = open_log(&self.logs.join(format!("{}.log", service.name)))?;
        let stop = Arc::new(Notify::new());
        let (done_tx, done) = watch::channel(false);
        let (pid_tx, pid) = watch::channel(None);
        let first = spawn(&service, &log)?;
        note_pid(&service.name, &pid_tx, first.id());
        let name = service.name.clone();
        let stop2 = stop.clone();
        tokio::spawn(async move {
            let mut child = first;
            let mut backoff = Duration::from_secs(1);
            loop {
                let started = Instant::now();
                tokio::select! {
                    status = child.wait() => {
                        let status = status.map(|s| s.to_string()).unwrap_or_else(|e| e.to_string());
                        if started.elapsed() >= STABLE {
                            backoff = Duration::from_secs(1);
                        }
                        tracing::warn!(service = %service.name, %status, restart_in = ?backoff, "service exited; restarting");
                        note_pid(&service.name, &pid_tx, None);
                        tokio::select! {
                            () = tokio::time::sleep(backoff) => {}
                            () = stop2.notified() => break,
                        }
                        backoff = (backoff * 2).min(MAX_BACKOFF);
                        match spawn(&service, &log) {
                            Ok(c) => {
                                note_pid(&service.name, &pid_tx, c.id());
                                tracing::info!(service = %service.name, pid = ?c.id(), "service restarted");
                                child = c;
                            }
                            Err(e) => {
                                tracing::error!(service = %service.name, error = %e, "restart failed");
                                // Try again after the next back-off.
                                child = match placeholder().await { Some(c) => c, None => break };
                            }
                        }
                    }
                    () = stop2.notified() => {
                        stop_child(&mut child, &service.name).await;
                        break;
                    }
                }
            }
            note_pid(&service.name, &pid_tx, None);
            let _ = done_tx.send(true);
        });
        self.running.push(Running { name, stop, done, pid });
        Ok(())
    }

    /// The PID of service `name`, while it runs.
    pub fn pid(&self, name: &str) -> Option<u32> {
        self.running.iter().find(|r| r.name == name).and_then(|r| *r.pid.borrow())
    }

    /// Fails if service `name` is not running (exited and not yet restarted), with its log.
    pub fn check_running(&self, name: &str) -> Result<()> {
        if self.pid(name).is_some() {
            return Ok(());
        }
        Err(Error::Failed {
            what: name.into(),
            detail: format!(
                "exited while starting; log:\n{}",
                crate::bubble::tail(&self.logs.join(format!("{name}.log")), 20)
            ),
        })
    }

    /// Stops every service, last started first.
    pub async fn stop_all(&mut self) {
        while let Some(mut r) = self.running.pop() {
            r.stop.notify_one();
            let _ = r.done.wait_for(|d| *d).await;
            tracing::info!(service = %r.name, "stopped");
        }
    }
}

/// A service's log, shared by its stdout and stderr copiers and kept across restarts.
type SharedLog = Arc<std::sync::Mutex<CappedLog>>;

fn open_log(log: &std::path::Path) -> Result<SharedLog> {
    let file = CappedLog::open(log, MAX_LOG_BYTES).map_err(|e| Error::io("open", log.display(), e))?;
    Ok(Arc::new(std::sync::Mutex::new(file)))
}

/// Starts the service with its stdout and stderr piped into `log` (through the supervisor, so
/// that the file can be rotated under it).
fn spawn(service: &Service, log: &SharedLog) -> Result<tokio::process::Child> {
    let mut child = tokio::process::Command::new(&service.program)
        .args(&service.args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| Error::io("start", &service.name, e))?;
    if let Some(out) = child.stdout.take() {
        tokio::spawn(copy_into(out, log.clone()));
    }
    if let Some(err) = child.stderr.take() {
        tokio::spawn(copy_into(err, log.clone()));
    }
    Ok(child)
}

/// Copies what the service writes into its log until the service closes the pipe.
async fn copy_into(mut from: impl tokio::io::AsyncRead + Unpin, log: SharedLog) {
    use tokio::io::AsyncReadExt;
    let mut buf = vec![0u8; 16 * 1024];
    while let Ok(n @ 1..) = from.read(&mut buf).await {
        let mut log = log.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // A full disk must not stop the service: what cannot be written is lost, and the
        // pipe keeps draining.
        let _ = log.write(&buf[..n]);
    }
}

/// A child that exits at once, standing in for a service whose restart failed so the loop
/// waits one more back-off.
async fn placeholder() -> Option<tokio::process::Child> {
    tokio::process::Command::new("true").spawn().ok()
}

async fn stop_child(child: &mut tokio::process::Child, name: &str) {
    if let Some(pid) = child.id() {
        let _ =
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGTERM);
    }
    if tokio::time::timeout(STOP_GRACE, child.wait()).await.is_err() {
        tracing::warn!(service = %name, "no exit {} s after SIGTERM: killing it", STOP_GRACE.as_secs());
        let _ = child.kill().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_service_that_logs_without_end_holds_at_most_two_capped_files() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut supervisor = Supervisor::new(tmp.path().to_owned());
        // 25 MB on stdout, then a last line on stderr; then it stays up.
        let script = "head -c 25000000 /dev/zero | tr '\\0' x; echo; echo all written >&2; exec sleep 60";
        supervisor.start(Service::new("chatty", "sh", vec!["-c".into(), script.into()])).expect("start");
        let log = tmp.path().join("chatty.log");
        let deadline = Instant::now() + Duration::from_secs(30);
        while !std::fs::read_to_string(&log).unwrap_or_default().contains("all written") {
            assert!(Instant::now() < deadline, "the last line never reached the log");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let size = |p: &std::path::Path| std::fs::metadata(p).expect("log").len();
        assert!(size(&log) <= MAX_LOG_BYTES, "current log {} bytes", size(&log));
        assert!(size(&CappedLog::previous(&log)) <= MAX_LOG_BYTES);
        assert!(size(&CappedLog::previous(&log)) > MAX_LOG_BYTES / 2, "the previous file is kept");
        assert_eq!(std::fs::read_dir(tmp.path()).expect("dir").count(), 2, "two files, no more");
        supervisor.check_running("chatty").expect("still running");
        supervisor.stop_all().await;
    }
}
