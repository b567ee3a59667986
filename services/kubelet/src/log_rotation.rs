//! Container log rotation, as the upstream kubelet does it (`containerLogMaxSize`,
//! `containerLogMaxFiles`, `containerLogMonitorInterval`; review M6): every interval, each
//! running container's log file that has grown past the size is renamed to
//! `<log>.<YYYYMMDD-hhmmss>` and the runtime is asked to reopen it (CRI `ReopenContainerLog`),
//! and of the rotated files only the newest `max files − 1` are kept. A container that writes
//! without end then holds at most about `max files × max size` of the node's disk (plus what
//! it writes within one interval).
//!
//! `kubectl logs` reads the current file; `kubectl logs -f` goes on in the new file after a
//! rotation (`hpk_cri_logs`). Rotated files are not compressed. In connector mode the logs lie
//! on the runtime's machine, and nothing rotates them here.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_cri::v1 as cri;
use tokio_util::sync::CancellationToken;

/// What the rotation keeps.
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    /// A log larger than this is rotated.
    pub max_size: u64,
    /// Files per container log, the current one included (at least 2).
    pub max_files: usize,
    /// How often the logs are looked at.
    pub interval: Duration,
}

/// Why a log could not be rotated.
#[derive(Debug, thiserror::Error)]
pub enum RotateError {
    /// The log could not be looked at.
    #[error("inspecting {}: {source}", .path.display())]
    Inspect {
        /// The log.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The log could not be renamed.
    #[error("renaming {}: {source}", .path.display())]
    Rename {
        /// The log.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// An old rotated file could not be removed.
    #[error("removing {}: {source}", .path.display())]
    Remove {
        /// The rotated file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The runtime did not reopen the log; it was renamed back.
    #[error("the runtime did not reopen the log ({message}); left as it was")]
    NotReopened {
        /// The runtime's message.
        message: String,
    },
    /// The runtime did not reopen the log, and it could not be renamed back.
    #[error("the runtime did not reopen the log ({message}), and renaming it back failed: {source}")]
    NotRestored {
        /// The runtime's message.
        message: String,
        /// Why the rename back failed.
        #[source]
        source: std::io::Error,
    },
}

/// What one look at a log did.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Within its size.
    Kept,
    /// Renamed to the path given, and reopened.
    Rotated(PathBuf),
}

/// Rotates the logs of `runtime`'s running containers every `policy.interval` until
/// `shutdown`.
pub async fn run(
    runtime: cri::runtime_service_client::RuntimeServiceClient<tonic::transport::Channel>,
    policy: Policy,
    shutdown: CancellationToken,
) {
    let mut tick = tokio::time::interval(policy.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        if let Err(status) = rotate_all(runtime.clone(), policy).await {
            tracing::warn!(error = %status.message(), "container log rotation: listing the running containers failed");
        }
    }
}

async fn rotate_all(
    mut runtime: cri::runtime_service_client::RuntimeServiceClient<tonic::transport::Channel>,
    policy: Policy,
) -> Result<(), tonic::Status> {
    let running = cri::ContainerFilter {
        state: Some(cri::ContainerStateValue { state: cri::ContainerState::ContainerRunning as i32 }),
        ..Default::default()
    };
    let containers = runtime
        .list_containers(cri::ListContainersRequest { filter: Some(running) })
        .await?
        .into_inner()
        .containers;
    for container in containers {
        let status = match runtime
            .container_status(cri::ContainerStatusRequest {
                container_id: container.id.clone(),
                verbose: false,
            })
            .await
        {
            Ok(answer) => answer.into_inner().status,
            // Gone since the list: nothing to rotate.
            Err(_) => continue,
        };
        let Some(path) = status.map(|s| s.log_path).filter(|p| !p.is_empty()) else { continue };
        let id = container.id.clone();
        let mut reopen_client = runtime.clone();
        let reopen = || async move {
            reopen_client
                .reopen_container_log(cri::ReopenContainerLogRequest { container_id: id })
                .await
                .map(drop)
        };
        match rotate(Path::new(&path), policy, time::OffsetDateTime::now_utc(), reopen).await {
            Ok(Outcome::Rotated(to)) => {
                tracing::info!(container = %container.id, log = %path, rotated = %to.display(), "container log rotated");
            }
            Ok(Outcome::Kept) => {}
            Err(error) => {
                tracing::warn!(container = %container.id, log = %path, %error, "container log rotation failed")
            }
        }
    }
    Ok(())
}

/// Rotates the log at `path` if it is larger than the policy allows, then removes the
/// rotated files beyond the policy's count. `reopen` asks the runtime to write to a new file
/// at `path`; if it fails, the rename is undone (the runtime still writes the renamed file).
pub async fn rotate<F, Fut>(
    path: &Path,
    policy: Policy,
    now: time::OffsetDateTime,
    reopen: F,
) -> Result<Outcome, RotateError>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<(), tonic::Status>>,
{
    let size = match std::fs::metadata(path) {
        Ok(meta) => meta.len(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Outcome::Kept),
        Err(source) => return Err(RotateError::Inspect { path: path.to_owned(), source }),
    };
    // The old ones first: with the one made below, `max_files - 1` remain.
    prune(path, policy.max_files.saturating_sub(2))?;
    if size <= policy.max_size {
        return Ok(Outcome::Kept);
    }
    let rotated = rotated_name(path, now);
    std::fs::rename(path, &rotated)
        .map_err(|source| RotateError::Rename { path: path.to_owned(), source })?;
    if let Err(error) = reopen().await {
        // Put it back: the runtime's writer still holds that file, and the path must not be
        // left without it.
        let message = error.message().to_owned();
        return Err(match std::fs::rename(&rotated, path) {
            Ok(()) => RotateError::NotReopened { message },
            Err(source) => RotateError::NotRestored { message, source },
        });
    }
    Ok(Outcome::Rotated(rotated))
}

/// `<log>.<YYYYMMDD-hhmmss>`; if a file of that name exists (two rotations in a second), a
/// counter follows.
fn rotated_name(path: &Path, now: time::OffsetDateTime) -> PathBuf {
    let stamp = format!(
        "{:04}{:02}{:02}-{:02}{:02}{:02}",
        now.year(),
        u8::from(now.month()),
        now.day(),
        now.hour(),
        now.minute(),
        now.second()
    );
    let with = |suffix: &str| {
        let mut name = path.as_os_str().to_owned();
        name.push(format!(".{stamp}{suffix}"));
        PathBuf::from(name)
    };
    let mut candidate = with("");
    let mut n = 1;
    while std::fs::symlink_metadata(&candidate).is_ok() {
        candidate = with(&format!("-{n}"));
        n += 1;
    }
    candidate
}

/// The rotated files of the log at `path`, oldest first.
pub fn rotated_files(path: &Path) -> Vec<PathBuf> {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else { return Vec::new() };
    let prefix = format!("{}.", name.to_string_lossy());
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| {
                    let n = e.file_name().to_string_lossy().into_owned();
                    n.strip_prefix(&prefix).is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
                })
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default();
    // The stamp sorts by time (a counter sorts after its second's first file).
    found.sort();
    found
}

/// Removes the oldest rotated files of `path` until at most `keep` remain.
fn prune(path: &Path, keep: usize) -> Result<(), RotateError> {
    let files = rotated_files(path);
    let excess = files.len().saturating_sub(keep);
    for old in &files[..excess] {
        match std::fs::remove_file(old) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(RotateError::Remove { path: old.clone(), source }),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(max_size: u64, max_files: usize) -> Policy {
        Policy { max_size, max_files, interval: Duration::from_secs(10) }
    }

    fn at(second: u8) -> time::OffsetDateTime {
        // 2026-12-02 10:00:00 UTC
        time::OffsetDateTime::from_unix_timestamp(1_796_205_600 + i64::from(second)).expect("a time")
    }

    async fn reopened(path: PathBuf) -> Result<(), tonic::Status> {
        std::fs::write(&path, "").map_err(|e| tonic::Status::internal(e.to_string()))
    }

    #[tokio::test]
    async fn a_log_past_its_size_is_renamed_reopened_and_the_oldest_removed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("0.log");
        let p = policy(100, 3);
        std::fs::write(&log, vec![b'x'; 100]).expect("write");
        assert!(
            matches!(rotate(&log, p, at(0), || reopened(log.clone())).await, Ok(Outcome::Kept)),
            "at the size"
        );

        let mut made = Vec::new();
        for second in 1..=5 {
            std::fs::write(&log, vec![b'y'; 101]).expect("write");
            let outcome = rotate(&log, p, at(second), || reopened(log.clone())).await.expect("rotated");
            let Outcome::Rotated(to) = outcome else { panic!("not rotated: {outcome:?}") };
            assert_eq!(std::fs::metadata(&to).expect("rotated file").len(), 101);
            assert_eq!(std::fs::metadata(&log).expect("reopened").len(), 0);
            made.push(to);
        }
        assert!(made[0].to_string_lossy().ends_with("0.log.20261202-100001"), "{}", made[0].display());
        // The current file and the two newest rotated ones: three files, as asked.
        assert_eq!(rotated_files(&log), made[3..].to_vec());
        assert_eq!(std::fs::read_dir(dir.path()).expect("dir").count(), 3);
    }

    #[tokio::test]
    async fn a_failed_reopen_puts_the_log_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("0.log");
        std::fs::write(&log, vec![b'z'; 500]).expect("write");
        let err = rotate(&log, policy(100, 5), at(0), || async {
            Err(tonic::Status::failed_precondition("container 42 is not running"))
        })
        .await
        .expect_err("refused")
        .to_string();
        assert!(err.contains("not running") && err.contains("left as it was"), "{err}");
        assert_eq!(std::fs::metadata(&log).expect("back").len(), 500);
        assert!(rotated_files(&log).is_empty());
    }

    #[tokio::test]
    async fn two_rotations_in_one_second_keep_both_and_other_files_are_left_alone() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("1.log");
        // The container's earlier attempt and an unrelated file are not rotated files of this log.
        for other in ["0.log", "0.log.20261202-090000", "1.log.tmp", "10.log"] {
            std::fs::write(dir.path().join(other), "keep").expect("write");
        }
        for _ in 0..2 {
            std::fs::write(&log, vec![b'a'; 200]).expect("write");
            rotate(&log, policy(100, 5), at(7), || reopened(log.clone())).await.expect("rotated");
        }
        let names: Vec<String> = rotated_files(&log)
            .iter()
            .map(|p| p.file_name().expect("name").to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["1.log.20261202-100007", "1.log.20261202-100007-1"]);
        for other in ["0.log", "0.log.20261202-090000", "1.log.tmp", "10.log"] {
            assert!(dir.path().join(other).exists(), "{other} was touched");
        }
    }

    #[tokio::test]
    async fn a_missing_log_is_left_for_the_runtime() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("0.log");
        let outcome = rotate(&log, policy(1, 2), at(0), || async { panic!("nothing to reopen") }).await;
        assert!(matches!(outcome, Ok(Outcome::Kept)), "{outcome:?}");
    }
}
