//! The termination message, as the upstream kubelet gives it: each container's
//! `terminationMessagePath` (default `/dev/termination-log`) is bound to an empty file of the
//! pod's directory, writable by whichever user the container runs as. When the container ends,
//! the first 4 KiB of that file become `state.terminated.message`; with
//! `terminationMessagePolicy: FallbackToLogsOnError`, a container that failed without writing
//! one gets the tail of its log instead (the last 80 lines, at most 2 KiB).
//!
//! In connector mode the file would lie on the runtime's machine: no file is bound there, and
//! the message is what the runtime reports.

use std::fs::{self, OpenOptions, Permissions};
use std::io::{ErrorKind, Read};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use futures_util::StreamExt;
use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::Container;

/// Where a container's message goes when its spec names no path (the API's default).
pub const DEFAULT_PATH: &str = "/dev/termination-log";
/// The most of the file that becomes the message (upstream's limit).
pub const MAX_MESSAGE: u64 = 4096;
/// The log lines a fallback message is taken from.
pub const LOG_LINES: u64 = 80;
/// The most of those lines the fallback message keeps (the end).
pub const MAX_LOG_MESSAGE: usize = 2048;

/// The policy that falls back to the log.
const FALLBACK: &str = "FallbackToLogsOnError";

/// Why the file could not be made.
#[derive(Debug, thiserror::Error)]
#[error("termination message file {}: {action}: {source}", .path.display())]
pub struct FileError {
    path: PathBuf,
    action: &'static str,
    #[source]
    source: std::io::Error,
}

/// The path in the container its message is read from, unless it has none (an empty path) or
/// one of its volumes is mounted there already.
pub fn container_path(spec: &Container, mounts: &[cri::Mount]) -> Option<String> {
    let path = spec.termination_message_path.clone().unwrap_or_else(|| DEFAULT_PATH.to_owned());
    if path.is_empty() || mounts.iter().any(|m| Path::new(&m.container_path) == Path::new(&path)) {
        return None;
    }
    Some(path)
}

/// The file of attempt `attempt` of container `name`, beneath the pod's directory.
pub fn file(pod_dir: &Path, name: &str, attempt: u32) -> PathBuf {
    pod_dir.join("termination").join(format!("{name}.{attempt}"))
}

/// Makes the empty file attempt `attempt` of container `name` writes its message to, mode
/// 0666 as upstream makes it (the container may run as any user), and returns its mount at
/// `container_path`. Files of this container's attempts before the previous one are removed:
/// the runtime keeps only the current and the previous container.
pub fn prepare(
    pod_dir: &Path,
    name: &str,
    attempt: u32,
    container_path: &str,
) -> Result<cri::Mount, FileError> {
    let path = file(pod_dir, name, attempt);
    let dir = pod_dir.join("termination");
    let fail = |path: &Path, action| {
        let path = path.to_owned();
        move |source| FileError { path, action, source }
    };
    fs::create_dir_all(&dir).map_err(fail(&dir, "create"))?;
    forget_older(&dir, name, attempt);
    // A file left by an earlier kubelet for the same attempt starts empty again.
    match fs::remove_file(&path) {
        Err(e) if e.kind() != ErrorKind::NotFound => return Err(fail(&path, "remove")(e)),
        _ => {}
    }
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW)
        .mode(0o666)
        .open(&path)
        .map_err(fail(&path, "create"))?;
    // The umask took bits off; the container's user needs them.
    fs::set_permissions(&path, Permissions::from_mode(0o666)).map_err(fail(&path, "chmod"))?;
    Ok(cri::Mount {
        container_path: container_path.to_owned(),
        host_path: path.display().to_string(),
        ..cri::Mount::default()
    })
}

/// Removes the files of `name`'s attempts older than `attempt - 1`.
fn forget_older(dir: &Path, name: &str, attempt: u32) {
    let Ok(entries) = fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let Some(older) = file_name
            .to_str()
            .and_then(|f| f.strip_prefix(name))
            .and_then(|f| f.strip_prefix('.'))
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if older.saturating_add(1) < attempt {
            let _ = fs::remove_file(entry.path());
        }
    }
}

/// The message of an ended container: what it wrote to its file (`file`, when one was bound),
/// else, with the fallback policy and a failure (`exit_code` not 0, and not a container that
/// could not run), the tail of its log at `log_path`.
pub async fn message(
    spec: &Container,
    file: Option<&Path>,
    exit_code: i32,
    reason: &str,
    log_path: &str,
) -> String {
    if let Some(file) = file {
        let written = read_file(file);
        if !written.is_empty() {
            return written;
        }
    }
    let fallback = spec.termination_message_policy.as_deref() == Some(FALLBACK)
        && exit_code != 0
        && reason != "ContainerCannotRun"
        && !log_path.is_empty();
    if !fallback {
        return String::new();
    }
    log_tail(Path::new(log_path)).await
}

/// The first [`MAX_MESSAGE`] bytes of `path`, never following a link; empty when it is gone.
fn read_file(path: &Path) -> String {
    let Ok(file) = OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(path) else {
        return String::new();
    };
    let mut bytes = Vec::new();
    if file.take(MAX_MESSAGE).read_to_end(&mut bytes).is_err() {
        return String::new();
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The last [`LOG_LINES`] lines of the CRI log at `path`, cut to their last
/// [`MAX_LOG_MESSAGE`] bytes.
async fn log_tail(path: &Path) -> String {
    let options = hpk_cri_logs::LogOptions { tail_lines: Some(LOG_LINES), ..Default::default() };
    let never: hpk_cri_logs::Running = std::sync::Arc::new(|| Box::pin(async { false }));
    let Ok(stream) = hpk_cri_logs::open(path.to_owned(), options, never).await else {
        return String::new();
    };
    let mut bytes = Vec::new();
    let mut stream = std::pin::pin!(stream);
    while let Some(Ok(chunk)) = stream.next().await {
        bytes.extend_from_slice(&chunk);
        // Only the end is kept: drop what can no longer be part of it.
        if bytes.len() > 2 * MAX_LOG_MESSAGE {
            bytes.drain(..bytes.len() - MAX_LOG_MESSAGE);
        }
    }
    let start = bytes.len().saturating_sub(MAX_LOG_MESSAGE);
    let text = String::from_utf8_lossy(&bytes[start..]).into_owned();
    // A cut through a character leaves a replacement character first; drop it.
    text.strip_prefix('\u{FFFD}').map(str::to_owned).unwrap_or(text)
}

/// The runtime's message, with the container's own after it.
pub fn combine(runtime: &str, own: &str) -> String {
    match (runtime.is_empty(), own.is_empty()) {
        (_, true) => runtime.to_owned(),
        (true, false) => own.to_owned(),
        (false, false) => format!("{runtime}: {own}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(extra: serde_json::Value) -> Container {
        let mut value = serde_json::json!({"name": "app", "image": "busybox"});
        if let (Some(fields), Some(more)) = (value.as_object_mut(), extra.as_object()) {
            fields.extend(more.clone());
        }
        serde_json::from_value(value).expect("container")
    }

    #[test]
    fn the_path_is_the_default_the_specs_or_none() {
        assert_eq!(container_path(&spec(serde_json::json!({})), &[]).as_deref(), Some(DEFAULT_PATH));
        let custom = spec(serde_json::json!({"terminationMessagePath": "/tmp/msg"}));
        assert_eq!(container_path(&custom, &[]).as_deref(), Some("/tmp/msg"));
        let empty = spec(serde_json::json!({"terminationMessagePath": ""}));
        assert_eq!(container_path(&empty, &[]), None, "an empty path binds nothing");
        let volume = cri::Mount { container_path: "/tmp/msg/".into(), ..cri::Mount::default() };
        assert_eq!(container_path(&custom, &[volume]), None, "a volume mounted there wins");
    }

    #[test]
    fn the_file_is_empty_writable_by_all_and_older_attempts_go() {
        let dir = tempfile::tempdir().expect("tempdir");
        for attempt in 0..3 {
            prepare(dir.path(), "app", attempt, DEFAULT_PATH).expect("prepare");
        }
        prepare(dir.path(), "app-2", 0, DEFAULT_PATH).expect("another container");
        fs::write(file(dir.path(), "app", 2), "written before a restart").expect("write");
        let mount = prepare(dir.path(), "app", 2, "/dev/custom").expect("again");
        assert_eq!(mount.container_path, "/dev/custom");
        assert!(!mount.readonly);
        let path = file(dir.path(), "app", 2);
        assert_eq!(mount.host_path, path.display().to_string());
        let meta = fs::metadata(&path).expect("metadata");
        assert_eq!(meta.permissions().mode() & 0o777, 0o666);
        assert_eq!(meta.len(), 0, "the same attempt starts empty again");
        let mut left: Vec<String> = fs::read_dir(dir.path().join("termination"))
            .expect("list")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["app-2.0", "app.1", "app.2"], "the previous attempt's file is kept");
    }

    #[test]
    fn a_link_planted_at_the_file_is_not_followed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let secret = dir.path().join("secret");
        fs::write(&secret, "do not read").expect("write");
        fs::create_dir_all(dir.path().join("termination")).expect("mkdir");
        let path = file(dir.path(), "app", 0);
        std::os::unix::fs::symlink(&secret, &path).expect("symlink");
        assert_eq!(read_file(&path), "", "a link is not read");
        prepare(dir.path(), "app", 0, DEFAULT_PATH).expect("prepare replaces the link");
        assert!(!fs::symlink_metadata(&path).expect("metadata").file_type().is_symlink());
        assert_eq!(fs::read_to_string(&secret).expect("read"), "do not read");
    }

    fn log(dir: &Path, lines: &[&str]) -> String {
        let path = dir.join("0.log");
        let text: String =
            lines.iter().map(|l| format!("2026-12-03T10:00:00.000000000Z stdout F {l}\n")).collect();
        fs::write(&path, text).expect("log");
        path.display().to_string()
    }

    #[tokio::test]
    async fn the_file_wins_then_the_log_only_on_failure_with_the_policy() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log_path = log(dir.path(), &["first", "DONE"]);
        let fallback = spec(serde_json::json!({"terminationMessagePolicy": "FallbackToLogsOnError"}));
        let plain = spec(serde_json::json!({"terminationMessagePolicy": "File"}));
        let msg = file(dir.path(), "app", 0);
        prepare(dir.path(), "app", 0, DEFAULT_PATH).expect("prepare");

        assert_eq!(message(&fallback, Some(&msg), 1, "Error", &log_path).await, "first\nDONE\n");
        assert_eq!(
            message(&fallback, Some(&msg), 0, "Completed", &log_path).await,
            "",
            "success: no fallback"
        );
        assert_eq!(message(&plain, Some(&msg), 1, "Error", &log_path).await, "", "policy File: no fallback");
        assert_eq!(message(&fallback, Some(&msg), 1, "ContainerCannotRun", &log_path).await, "");

        fs::write(&msg, "OK").expect("write");
        assert_eq!(message(&fallback, Some(&msg), 1, "Error", &log_path).await, "OK", "the file wins");
        assert_eq!(message(&plain, Some(&msg), 0, "Completed", &log_path).await, "OK");
        assert_eq!(message(&plain, None, 0, "Completed", &log_path).await, "", "no file bound");
    }

    #[tokio::test]
    async fn messages_are_bounded() {
        let dir = tempfile::tempdir().expect("tempdir");
        let msg = file(dir.path(), "app", 0);
        prepare(dir.path(), "app", 0, DEFAULT_PATH).expect("prepare");
        fs::write(&msg, "x".repeat(10_000)).expect("write");
        let plain = spec(serde_json::json!({}));
        assert_eq!(message(&plain, Some(&msg), 0, "Completed", "").await.len(), 4096);

        let lines: Vec<String> = (0..200).map(|i| format!("line {i:03} {}", "y".repeat(20))).collect();
        let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
        let log_path = log(dir.path(), &refs);
        fs::write(&msg, "").expect("empty");
        let fallback = spec(serde_json::json!({"terminationMessagePolicy": "FallbackToLogsOnError"}));
        let tail = message(&fallback, Some(&msg), 2, "Error", &log_path).await;
        assert!(tail.len() <= MAX_LOG_MESSAGE, "{}", tail.len());
        assert!(tail.ends_with("line 199 yyyyyyyyyyyyyyyyyyyy\n"), "{tail}");
        assert!(!tail.contains("line 119 "), "only the last 80 lines: {tail}");

        let short: Vec<String> = (0..100).map(|i| format!("l{i}")).collect();
        let refs: Vec<&str> = short.iter().map(String::as_str).collect();
        let log_path = log(dir.path(), &refs);
        let tail = message(&fallback, Some(&msg), 2, "Error", &log_path).await;
        assert!(tail.starts_with("l20\n") && tail.ends_with("l99\n"), "{tail}");
    }

    #[test]
    fn the_runtimes_message_comes_first() {
        assert_eq!(combine("", ""), "");
        assert_eq!(combine("oom", ""), "oom");
        assert_eq!(combine("", "DONE"), "DONE");
        assert_eq!(combine("oom", "DONE"), "oom: DONE");
    }
}
