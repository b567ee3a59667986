//! The log stream end to end, on real files: what a client of `/containerLogs` receives.

use std::fs::OpenOptions;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use futures_util::{Stream, StreamExt, TryStreamExt};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use tokio::time::Instant;

use super::*;

type Logs = Pin<Box<dyn Stream<Item = io::Result<Bytes>> + Send>>;

/// One record as the runtime writes it, at second `second` of 2026-11-30T06:01.
fn rec(second: u32, source: &str, tag: &str, content: &str) -> String {
    format!("2026-11-30T06:01:{second:02}.000000001Z {source} {tag} {content}\n")
}

fn log_file(dir: &tempfile::TempDir, text: &str) -> PathBuf {
    let path = dir.path().join("0.log");
    std::fs::write(&path, text).unwrap();
    path
}

fn append(path: &Path, text: &str) {
    OpenOptions::new().append(true).open(path).unwrap().write_all(text.as_bytes()).unwrap();
}

/// For streams that must not ask: without `follow` the container's state does not matter.
fn not_asked() -> Running {
    Arc::new(|| -> BoxFuture<'static, bool> { panic!("running() asked without follow") })
}

/// A container whose state the test sets, counting the questions about it.
struct Container {
    running: Arc<AtomicBool>,
    asked: Arc<AtomicUsize>,
}

impl Container {
    fn new(running: bool) -> Self {
        Self { running: Arc::new(AtomicBool::new(running)), asked: Arc::default() }
    }

    fn running(&self) -> Running {
        let (running, asked) = (self.running.clone(), self.asked.clone());
        Arc::new(move || -> BoxFuture<'static, bool> {
            asked.fetch_add(1, Ordering::SeqCst);
            let answer = running.load(Ordering::SeqCst);
            Box::pin(async move { answer })
        })
    }

    fn stop(&self) {
        self.running.store(false, Ordering::SeqCst);
    }
}

async fn read_all(path: PathBuf, options: LogOptions) -> String {
    let chunks: Vec<Bytes> = stream(path, options, not_asked()).try_collect().await.unwrap();
    String::from_utf8(chunks.concat()).unwrap()
}

fn follow(path: PathBuf, options: LogOptions, container: &Container) -> Logs {
    Box::pin(stream(path, LogOptions { follow: true, ..options }, container.running()))
}

/// Reads until `expected` has arrived, failing after `within`.
async fn expect_text(logs: &mut Logs, expected: &str, within: Duration) {
    let deadline = Instant::now() + within;
    let mut text = String::new();
    while text.len() < expected.len() {
        match tokio::time::timeout_at(deadline, logs.next()).await {
            Ok(Some(chunk)) => text.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap()),
            Ok(None) => panic!("the stream ended after {text:?}, expected {expected:?}"),
            Err(_) => panic!("only {text:?} within {within:?}, expected {expected:?}"),
        }
    }
    assert_eq!(text, expected);
}

async fn expect_quiet(logs: &mut Logs, during: Duration) {
    if let Ok(item) = tokio::time::timeout(during, logs.next()).await {
        panic!("expected nothing, got {item:?}");
    }
}

async fn expect_end(logs: &mut Logs, within: Duration) {
    match tokio::time::timeout(within, logs.next()).await {
        Ok(None) => {}
        Ok(Some(item)) => panic!("expected the end, got {item:?}"),
        Err(_) => panic!("the stream did not end within {within:?}"),
    }
}

fn at(text: &str) -> OffsetDateTime {
    OffsetDateTime::parse(text, &Rfc3339).unwrap()
}

#[tokio::test]
async fn full_records_end_lines_partial_ones_join() {
    let dir = tempfile::tempdir().unwrap();
    let text = [
        rec(1, "stdout", "F", "hello"),
        rec(2, "stdout", "P", "wor"),
        rec(3, "stdout", "P", "ld"),
        rec(4, "stdout", "F", "!"),
        rec(5, "stderr", "F", ""),
        rec(6, "stderr", "F", "  spaced  "),
    ]
    .concat();
    let path = log_file(&dir, &text);
    assert_eq!(read_all(path, LogOptions::default()).await, "hello\nworld!\n\n  spaced  \n");
}

#[tokio::test]
async fn timestamps_as_written_in_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let text = "2026-11-30T06:01:25.1Z stdout P a\n2026-11-30T07:01:25.120000000+01:00 stderr F b\n";
    let path = log_file(&dir, text);
    let options = LogOptions { timestamps: true, ..LogOptions::default() };
    assert_eq!(
        read_all(path, options).await,
        "2026-11-30T06:01:25.1Z a2026-11-30T07:01:25.120000000+01:00 b\n"
    );
}

#[tokio::test]
async fn one_stream_or_both() {
    let dir = tempfile::tempdir().unwrap();
    let text =
        [rec(1, "stdout", "F", "o1"), rec(2, "stderr", "F", "e1"), rec(3, "stdout", "F", "o2")].concat();
    let path = log_file(&dir, &text);
    let only = |stream| LogOptions { stream, ..LogOptions::default() };
    assert_eq!(read_all(path.clone(), only(LogStream::All)).await, "o1\ne1\no2\n");
    assert_eq!(read_all(path.clone(), only(LogStream::Stdout)).await, "o1\no2\n");
    assert_eq!(read_all(path, only(LogStream::Stderr)).await, "e1\n");
}

#[tokio::test]
async fn since_keeps_records_at_or_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let text =
        [rec(1, "stdout", "F", "one"), rec(2, "stdout", "F", "two"), rec(3, "stdout", "F", "three")].concat();
    let path = log_file(&dir, &text);
    let since = |time| LogOptions { since: Some(at(time)), ..LogOptions::default() };
    assert_eq!(read_all(path.clone(), since("2026-11-30T06:01:02.000000001Z")).await, "two\nthree\n");
    assert_eq!(read_all(path.clone(), since("2026-11-30T06:01:02.000000002Z")).await, "three\n");
    assert_eq!(read_all(path, since("2026-11-30T06:01:04Z")).await, "");
}

/// 10 000 records (about 480 KB, several 64 KiB chunks).
fn many_records() -> String {
    (0..10_000)
        .map(|i| rec(i % 60, if i % 2 == 0 { "stdout" } else { "stderr" }, "F", &format!("line {i}")))
        .collect()
}

#[tokio::test]
async fn tail_of_a_file_of_many_chunks() {
    let dir = tempfile::tempdir().unwrap();
    let path = log_file(&dir, &many_records());
    assert!(std::fs::metadata(&path).unwrap().len() > 6 * 64 * 1024);
    let tail = |n| LogOptions { tail_lines: Some(n), ..LogOptions::default() };
    assert_eq!(read_all(path.clone(), tail(3)).await, "line 9997\nline 9998\nline 9999\n");
    assert_eq!(read_all(path.clone(), tail(0)).await, "");
    let everything: String = (0..10_000).map(|i| format!("line {i}\n")).collect();
    assert_eq!(read_all(path.clone(), tail(10_000)).await, everything);
    assert_eq!(read_all(path.clone(), tail(20_000)).await, everything);
    assert_eq!(read_all(path.clone(), LogOptions::default()).await, everything);
    let stderr_tail = LogOptions { stream: LogStream::Stderr, ..tail(2) };
    assert_eq!(read_all(path, stderr_tail).await, "line 9997\nline 9999\n");
}

#[tokio::test]
async fn tail_counts_records_and_then_since_filters() {
    let dir = tempfile::tempdir().unwrap();
    let text = [
        rec(1, "stdout", "F", "one"),
        "not a record\n".to_owned(),
        rec(2, "stdout", "P", "tw"),
        rec(3, "stdout", "F", "o"),
        rec(4, "stdout", "F", "three"),
    ]
    .concat();
    let path = log_file(&dir, &text);
    let tail = |n| LogOptions { tail_lines: Some(n), ..LogOptions::default() };
    assert_eq!(read_all(path.clone(), tail(2)).await, "o\nthree\n");
    assert_eq!(read_all(path.clone(), tail(4)).await, "one\ntwo\nthree\n");
    let since = LogOptions { since: Some(at("2026-11-30T06:01:04Z")), ..tail(3) };
    assert_eq!(read_all(path, since).await, "three\n");
}

#[tokio::test]
async fn limit_bytes_cuts_mid_record() {
    let dir = tempfile::tempdir().unwrap();
    let path = log_file(&dir, &[rec(1, "stdout", "F", "hello"), rec(2, "stdout", "F", "world")].concat());
    let limit = |n| LogOptions { limit_bytes: Some(n), ..LogOptions::default() };
    assert_eq!(read_all(path.clone(), limit(8)).await, "hello\nwo");
    assert_eq!(read_all(path.clone(), limit(1)).await, "h");
    assert_eq!(read_all(path.clone(), limit(12)).await, "hello\nworld\n");
    assert_eq!(read_all(path.clone(), limit(1000)).await, "hello\nworld\n");
    let stamped = LogOptions { timestamps: true, ..limit(10) };
    assert_eq!(read_all(path, stamped).await, "2026-11-30");
}

#[tokio::test]
async fn a_last_line_without_newline_is_shown_when_not_following() {
    let dir = tempfile::tempdir().unwrap();
    let text = rec(1, "stdout", "F", "a") + "2026-11-30T06:01:02Z stdout F b";
    assert_eq!(read_all(log_file(&dir, &text), LogOptions::default()).await, "a\nb\n");
}

/// Collects what `tracing` writes, to count the warnings.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Self;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

#[tokio::test]
async fn malformed_lines_are_skipped_with_one_warning() {
    let captured = Captured::default();
    let subscriber = tracing_subscriber::fmt().with_writer(captured.clone()).with_ansi(false).finish();
    let _default = tracing::subscriber::set_default(subscriber);
    let dir = tempfile::tempdir().unwrap();
    let text = [
        "garbage at the start\n".to_owned(),
        rec(1, "stdout", "F", "kept"),
        "\n".to_owned(),
        "2026-11-30T06:01:02Z stdin F wrong stream\n".to_owned(),
        "yesterday stdout F bad time\n".to_owned(),
        rec(3, "stderr", "F", "also kept"),
        "\u{fffd} stdout X \u{0}\n".to_owned(),
    ]
    .concat();
    assert_eq!(read_all(log_file(&dir, &text), LogOptions::default()).await, "kept\nalso kept\n");
    let logged = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert_eq!(logged.matches("skipping log lines not in the CRI format").count(), 1, "{logged}");
    assert!(logged.contains("garbage at the start"), "{logged}");
}

#[tokio::test]
async fn a_missing_file_is_not_found() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("missing.log");
    match open(path.clone(), LogOptions::default(), not_asked()).await {
        Ok(_) => panic!("opened a file that does not exist"),
        Err(error) => assert_eq!(error.kind(), io::ErrorKind::NotFound),
    }
    let mut logs = Box::pin(stream(path, LogOptions::default(), not_asked()));
    assert_eq!(logs.next().await.unwrap().unwrap_err().kind(), io::ErrorKind::NotFound);
    assert!(logs.next().await.is_none());
}

#[tokio::test]
async fn follow_shows_appended_lines_promptly_and_ends_when_the_container_stops() {
    let dir = tempfile::tempdir().unwrap();
    let path = log_file(&dir, &rec(1, "stdout", "F", "before"));
    let container = Container::new(true);
    let mut logs = follow(path.clone(), LogOptions::default(), &container);
    expect_text(&mut logs, "before\n", Duration::from_secs(2)).await;

    append(&path, &rec(2, "stdout", "F", "after"));
    expect_text(&mut logs, "after\n", Duration::from_millis(500)).await;

    // A line still being written waits for its newline.
    append(&path, "2026-11-30T06:01:03Z stderr F incompl");
    expect_quiet(&mut logs, Duration::from_millis(300)).await;
    append(&path, "ete\n");
    expect_text(&mut logs, "incomplete\n", Duration::from_millis(500)).await;
    assert!(container.asked.load(Ordering::SeqCst) >= 1);

    container.stop();
    append(&path, &rec(4, "stdout", "F", "last words"));
    expect_text(&mut logs, "last words\n", Duration::from_secs(3)).await;
    expect_end(&mut logs, Duration::from_secs(3)).await;
}

#[tokio::test]
async fn follow_goes_on_in_the_new_file_after_a_rotation_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = log_file(&dir, &rec(1, "stdout", "F", "first"));
    let container = Container::new(true);
    let mut logs = follow(path.clone(), LogOptions::default(), &container);
    expect_text(
        &mut logs,
        "first
",
        Duration::from_secs(2),
    )
    .await;

    // The kubelet renames the file and the runtime makes a new, empty one at the path; until
    // the runtime's writer reopens, it still writes to the old file.
    let rotated = dir.path().join("0.log.20261202-101010");
    std::fs::rename(&path, &rotated).unwrap();
    std::fs::write(&path, "").unwrap();
    append(&rotated, &rec(2, "stdout", "F", "late in the old file"));
    expect_text(
        &mut logs,
        "late in the old file
",
        Duration::from_secs(2),
    )
    .await;
    // Then it writes to the new one only.
    append(&path, &rec(3, "stdout", "F", "in the new file"));
    expect_text(
        &mut logs,
        "in the new file
",
        Duration::from_secs(3),
    )
    .await;
    append(&path, &rec(4, "stdout", "F", "and on"));
    expect_text(
        &mut logs,
        "and on
",
        Duration::from_millis(500),
    )
    .await;

    container.stop();
    expect_end(&mut logs, Duration::from_secs(3)).await;
}

#[tokio::test]
async fn following_a_stopped_container_shows_the_file_and_ends() {
    let dir = tempfile::tempdir().unwrap();
    let path = log_file(&dir, &(rec(1, "stdout", "F", "a") + "2026-11-30T06:01:02Z stdout F b"));
    let container = Container::new(false);
    let mut logs = follow(path, LogOptions::default(), &container);
    expect_text(&mut logs, "a\nb\n", Duration::from_secs(2)).await;
    expect_end(&mut logs, Duration::from_secs(2)).await;
    assert_eq!(container.asked.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn follow_with_tail_zero_shows_only_new_records_and_drops_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let text = [rec(1, "stdout", "F", "old"), rec(2, "stdout", "F", "older")].concat()
        + "2026-11-30T06:01:03Z stdout F ha";
    let path = log_file(&dir, &text);
    let container = Container::new(true);
    let options = LogOptions { tail_lines: Some(0), ..LogOptions::default() };
    let mut logs = follow(path.clone(), options, &container);
    expect_quiet(&mut logs, Duration::from_millis(300)).await;
    append(&path, "lf\n");
    expect_text(&mut logs, "half\n", Duration::from_millis(500)).await;
    append(&path, &rec(4, "stdout", "F", "new"));
    expect_text(&mut logs, "new\n", Duration::from_millis(500)).await;

    // Nothing outlives the stream: its `running` closure is the only other owner of the flag.
    assert_eq!(Arc::strong_count(&container.running), 2);
    drop(logs);
    assert_eq!(Arc::strong_count(&container.running), 1);
}

#[tokio::test]
async fn follow_with_tail_starts_at_complete_records() {
    let dir = tempfile::tempdir().unwrap();
    let text = [rec(1, "stdout", "F", "one"), rec(2, "stdout", "F", "two")].concat()
        + "2026-11-30T06:01:03Z stdout F thr";
    let path = log_file(&dir, &text);
    let container = Container::new(true);
    let mut logs =
        follow(path.clone(), LogOptions { tail_lines: Some(1), ..LogOptions::default() }, &container);
    expect_text(&mut logs, "two\n", Duration::from_secs(2)).await;
    append(&path, "ee\n");
    expect_text(&mut logs, "three\n", Duration::from_millis(500)).await;
}

#[tokio::test]
async fn limit_bytes_ends_a_follow() {
    let dir = tempfile::tempdir().unwrap();
    let path = log_file(&dir, &rec(1, "stdout", "F", "abc"));
    let container = Container::new(true);
    let mut logs =
        follow(path.clone(), LogOptions { limit_bytes: Some(6), ..LogOptions::default() }, &container);
    expect_text(&mut logs, "abc\n", Duration::from_secs(2)).await;
    append(&path, &rec(2, "stdout", "F", "defgh"));
    expect_text(&mut logs, "de", Duration::from_millis(500)).await;
    expect_end(&mut logs, Duration::from_millis(500)).await;
}
