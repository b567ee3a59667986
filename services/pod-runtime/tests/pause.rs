//! The real `hpk-pause` binary: readiness, exit reports, orphan reaping, SIGTERM forwarding,
//! the grace period, a runtime that goes away and comes back, and life as PID 1 of a new PID
//! namespace (root and `unshare` needed; skipped with a reason otherwise).

use std::fs::{self, File};
use std::io::{BufRead, BufReader};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use hpk_pod_runtime::pause::{ChildExit, Event};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tempfile::TempDir;

/// How long anything in these tests may take before it counts as hung.
const PATIENCE: Duration = Duration::from_secs(10);

/// The runtime's side: a listening socket in a temp dir.
struct Runtime {
    dir: TempDir,
    listener: Option<UnixListener>,
}

impl Runtime {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let listener = UnixListener::bind(dir.path().join("events.sock")).expect("bind");
        Self { dir, listener: Some(listener) }
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("events.sock")
    }

    /// Waits for the pause to connect.
    fn accept(&self) -> Events {
        let listener = self.listener.as_ref().expect("listening").try_clone().expect("clone listener");
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || tx.send(listener.accept()));
        let (stream, _) = rx.recv_timeout(PATIENCE).expect("hpk-pause did not connect").expect("accept");
        stream.set_read_timeout(Some(PATIENCE)).expect("timeout");
        Events(BufReader::new(stream))
    }

    /// The runtime stops: its socket closes and its file disappears.
    fn stop(&mut self) {
        self.listener = None;
        fs::remove_file(self.socket()).expect("remove socket");
    }

    /// The runtime is back, listening at the same path.
    fn restart(&mut self) {
        self.listener = Some(UnixListener::bind(self.socket()).expect("bind again"));
    }
}

/// One connection's events.
struct Events(BufReader<UnixStream>);

impl Events {
    fn next(&mut self) -> Event {
        let mut line = String::new();
        let n = self.0.read_line(&mut line).expect("an event within 10 s");
        assert!(n > 0, "events channel closed by hpk-pause");
        Event::from_line(&line).unwrap_or_else(|e| panic!("bad event line {line:?}: {e}"))
    }

    fn ready(&mut self) -> i32 {
        match self.next() {
            Event::Ready { pid, .. } => pid,
            other => panic!("expected the ready line, got {other:?}"),
        }
    }

    fn exit(&mut self) -> ChildExit {
        match self.next() {
            Event::Exit(exit) => exit,
            other => panic!("expected an exit, got {other:?}"),
        }
    }

    /// The exits of `pids`, in whatever order they come (other exits are skipped).
    fn exits_of(&mut self, pids: &[i32]) -> Vec<ChildExit> {
        let mut found: Vec<ChildExit> = Vec::new();
        while found.len() < pids.len() {
            let exit = self.exit();
            if pids.contains(&exit.pid) {
                found.push(exit);
            }
        }
        found.sort_by_key(|exit| pids.iter().position(|pid| *pid == exit.pid));
        found
    }
}

/// A running `hpk-pause` (or `unshare` running it), killed if a test leaves it behind.
struct Pause {
    child: Child,
    stdout: mpsc::Receiver<String>,
    log: PathBuf,
}

impl Pause {
    fn start(program: &str, args: &[&str], log: PathBuf) -> Self {
        let mut child = Command::new(program)
            .args(args)
            .env("HPK_LOG", "debug")
            .stdout(Stdio::piped())
            .stderr(File::create(&log).expect("log file"))
            .spawn()
            .expect("start hpk-pause");
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self { child, stdout: rx, log }
    }

    /// `hpk-pause --events <runtime> [extra] -- sh -c <script> [script args]`.
    fn sh(runtime: &Runtime, extra: &[&str], script: &str, script_args: &[&str]) -> Self {
        let socket = runtime.socket();
        let mut args = vec!["--events", socket.to_str().expect("utf-8 temp path")];
        args.extend(extra);
        args.extend(["--", "sh", "-c", script]);
        args.extend(script_args);
        Self::start(env!("CARGO_BIN_EXE_hpk-pause"), &args, runtime.dir.path().join("pause.log"))
    }

    fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).expect("pids fit in i32")
    }

    /// The next line the command printed.
    fn line(&self) -> String {
        self.stdout.recv_timeout(PATIENCE).expect("the command printed nothing")
    }

    fn pid_line(&self) -> i32 {
        let line = self.line();
        line.trim().parse().unwrap_or_else(|_| panic!("not a pid: {line:?}"))
    }

    fn signal(&self, signal: Signal) {
        kill(Pid::from_raw(self.pid()), signal).expect("signal hpk-pause");
    }

    fn is_running(&mut self) -> bool {
        self.child.try_wait().expect("try_wait").is_none()
    }

    /// Waits for the process to exit: a bounded poll, as std has no wait with a timeout.
    fn wait(&mut self) -> ExitStatus {
        self.wait_for(PATIENCE).expect("hpk-pause did not exit")
    }

    fn wait_for(&mut self, patience: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + patience;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// SIGTERM, then expect a clean exit.
    fn stop(mut self) {
        self.signal(Signal::SIGTERM);
        let status = self.wait();
        assert_eq!(status.code(), Some(0), "hpk-pause exit status {status}");
    }
}

impl Drop for Pause {
    fn drop(&mut self) {
        if thread::panicking() {
            let log = fs::read_to_string(&self.log).unwrap_or_default();
            eprintln!("--- hpk-pause log ---\n{log}---");
        }
        if self.is_running() {
            // Our own child, by its PID: SIGTERM first so it takes its children along.
            let _ = kill(Pid::from_raw(self.pid()), Signal::SIGTERM);
            if self.wait_for(Duration::from_secs(3)).is_none() {
                let _ = self.child.kill();
                let _ = self.child.wait();
            }
        }
    }
}

/// Waits until `pid` no longer exists (a zombie still does: this means reaped).
fn wait_gone(pid: i32) {
    let deadline = Instant::now() + PATIENCE;
    while Path::new(&format!("/proc/{pid}")).exists() {
        assert!(Instant::now() < deadline, "{pid} was not reaped");
        thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn ready_then_the_exit_code_of_the_command() {
    let runtime = Runtime::new();
    let started = Instant::now();
    let pause = Pause::sh(&runtime, &[], "echo $$; exit 3", &[]);
    let mut events = runtime.accept();
    assert_eq!(events.ready(), pause.pid());
    eprintln!("startup to ready: {:?}", started.elapsed());
    let sh = pause.pid_line();
    assert_eq!(events.exit(), ChildExit::exited(sh, 3));
    pause.stop();
}

#[test]
fn an_orphan_is_adopted_reaped_and_reported() {
    let runtime = Runtime::new();
    let pause = Pause::sh(&runtime, &[], "sleep 0.1 & echo $$ $!; exit 0", &[]);
    let mut events = runtime.accept();
    events.ready();
    let pids: Vec<i32> = pause.line().split_whitespace().map(|pid| pid.parse().expect("a pid")).collect();
    let (sh, sleep) = (pids[0], pids[1]);
    assert_eq!(events.exit(), ChildExit::exited(sh, 0));
    assert_eq!(events.exit(), ChildExit::exited(sleep, 0));
    wait_gone(sleep);
    pause.stop();
}

#[test]
fn a_child_killed_by_a_signal_reports_the_signal() {
    let runtime = Runtime::new();
    let pause = Pause::sh(&runtime, &[], "echo $$; kill -KILL $$", &[]);
    let mut events = runtime.accept();
    events.ready();
    let sh = pause.pid_line();
    assert_eq!(events.exit(), ChildExit::killed(sh, 9));
    pause.stop();
}

#[test]
fn the_command_starts_with_no_signal_blocked_or_ignored() {
    let runtime = Runtime::new();
    let pause = Pause::sh(&runtime, &[], r#"exec grep -E "^Sig(Blk|Ign)" /proc/self/status"#, &[]);
    let mut events = runtime.accept();
    events.ready();
    let mask = |line: String, field: &str| {
        let hex = line.strip_prefix(field).unwrap_or_else(|| panic!("{line:?} is not {field}"));
        u64::from_str_radix(hex.trim(), 16).expect("a hex mask")
    };
    let blocked = mask(pause.line(), "SigBlk:");
    let ignored = mask(pause.line(), "SigIgn:");
    // HUP, INT, PIPE, ALRM, TERM, CHLD: blocked or ignored by the pause, never by its children.
    let ours = (1 << 0) | (1 << 1) | (1 << 12) | (1 << 13) | (1 << 14) | (1 << 16);
    assert_eq!(blocked, 0, "blocked signals {blocked:#x}");
    assert_eq!(ignored & ours, 0, "ignored signals {ignored:#x}");
    pause.stop();
}

#[test]
fn sigterm_is_forwarded_and_the_pause_exits_0_after_the_child() {
    let runtime = Runtime::new();
    let script = r#"trap "exit 7" TERM; echo $$; while :; do sleep 0.1; done"#;
    let mut pause = Pause::sh(&runtime, &[], script, &[]);
    let mut events = runtime.accept();
    events.ready();
    let sh = pause.pid_line(); // printed after the trap is set
    let asked = Instant::now();
    pause.signal(Signal::SIGTERM);
    assert_eq!(events.exits_of(&[sh]), [ChildExit::exited(sh, 7)]);
    assert_eq!(pause.wait().code(), Some(0));
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "took {:?}: the default grace of 10 s ran out instead",
        asked.elapsed()
    );
}

#[test]
fn after_the_grace_period_a_child_ignoring_sigterm_is_killed() {
    let runtime = Runtime::new();
    let script = r#"trap "" TERM; echo $$; while :; do sleep 0.1; done"#;
    let mut pause = Pause::sh(&runtime, &["--grace", "1"], script, &[]);
    let mut events = runtime.accept();
    events.ready();
    let sh = pause.pid_line();
    let asked = Instant::now();
    pause.signal(Signal::SIGTERM);
    assert_eq!(events.exits_of(&[sh]), [ChildExit::killed(sh, 9)]);
    let waited = asked.elapsed();
    assert_eq!(pause.wait().code(), Some(0));
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(5),
        "SIGKILL after {waited:?}, expected about 1 s"
    );
}

#[test]
fn reaping_goes_on_while_the_runtime_is_away_and_reports_reach_it_when_back() {
    let mut runtime = Runtime::new();
    let fifos = [runtime.dir.path().join("f1"), runtime.dir.path().join("f2")];
    for fifo in &fifos {
        nix::unistd::mkfifo(fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("fifo");
    }
    // Two subshells, each waiting for a line on its FIFO, orphaned when sh exits.
    let script = r#"(read x < "$0"; exit 4) & echo $!; (read y < "$1"; exit 6) & echo $!; exit 0"#;
    let fifo_args: Vec<&str> = fifos.iter().map(|f| f.to_str().expect("utf-8")).collect();
    let mut pause = Pause::sh(&runtime, &[], script, &fifo_args);
    let mut events = runtime.accept();
    events.ready();
    let (first, second) = (pause.pid_line(), pause.pid_line());
    events.exit(); // sh itself

    runtime.stop();
    drop(events);
    fs::write(&fifos[0], "go\n").expect("release the first subshell");
    wait_gone(first);
    assert!(pause.is_running(), "hpk-pause exited without its runtime");

    runtime.restart();
    fs::write(&fifos[1], "go\n").expect("release the second subshell");
    let mut events = runtime.accept();
    assert_eq!(events.ready(), pause.pid());
    assert_eq!(events.exit(), ChildExit::exited(first, 4));
    assert_eq!(events.exit(), ChildExit::exited(second, 6));
    pause.stop();
}

#[test]
fn sighup_reopens_the_events_channel() {
    let mut runtime = Runtime::new();
    let pause = Pause::sh(&runtime, &[], "echo $$", &[]);
    let mut events = runtime.accept();
    events.ready();
    let sh = pause.pid_line();
    assert_eq!(events.exit(), ChildExit::exited(sh, 0));
    runtime.stop();
    runtime.restart();
    pause.signal(Signal::SIGHUP);
    let mut events = runtime.accept();
    assert_eq!(events.ready(), pause.pid());
    pause.stop();
}

#[test]
fn a_fifo_works_as_the_events_channel() {
    let runtime = Runtime::new();
    let fifo = runtime.dir.path().join("events.fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("fifo");
    // The runtime opens its end first, read-write: the open does not wait for a writer and
    // reads wait for data instead of seeing end-of-file while no pause has it open.
    let reader = File::options().read(true).write(true).open(&fifo).expect("open the fifo");
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(reader).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let next = || {
        let line = rx.recv_timeout(PATIENCE).expect("an event within 10 s");
        Event::from_line(&line).unwrap_or_else(|e| panic!("bad event line {line:?}: {e}"))
    };
    let pause = Pause::start(
        env!("CARGO_BIN_EXE_hpk-pause"),
        &["--events", fifo.to_str().expect("utf-8 temp path"), "--", "sh", "-c", "echo $$; exit 5"],
        runtime.dir.path().join("pause.log"),
    );
    assert_eq!(next(), Event::Ready { pid: pause.pid(), queued: 0 });
    let sh = pause.pid_line();
    assert_eq!(next(), Event::Exit(ChildExit::exited(sh, 5)));
    pause.stop();
}

#[test]
fn a_closed_stderr_does_not_stop_the_pause() {
    let runtime = Runtime::new();
    let socket = runtime.socket();
    let mut child = Command::new(env!("CARGO_BIN_EXE_hpk-pause"))
        .args(["--events", socket.to_str().expect("utf-8 temp path"), "--log", "debug"])
        .args(["--", "sh", "-c", "read x; exit 9"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start hpk-pause");
    let mut events = runtime.accept();
    events.ready();
    drop(child.stderr.take()); // nobody reads the pause's log any more
    drop(child.stdin.take()); // sh reads end-of-file and exits, which the pause logs
    assert_eq!(events.exit().exit_code, Some(9));
    let pause = Pause { child, stdout: mpsc::channel().1, log: runtime.dir.path().join("none") };
    pause.stop();
}

#[test]
fn exit_codes_say_what_happened() {
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_hpk-pause")).args(args).output().expect("run hpk-pause")
    };
    let version = run(&["--version"]);
    assert_eq!(version.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&version.stdout).starts_with("hpk-pause "));
    assert_eq!(run(&["--help"]).status.code(), Some(0));
    assert_eq!(run(&["--no-such-flag"]).status.code(), Some(2));
    assert_eq!(run(&["--grace", "soon"]).status.code(), Some(2));
    let missing = run(&["--events", "/nonexistent/events.sock"]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("/nonexistent/events.sock"));
}

/// Whether we can make PID namespaces: root and `unshare` on PATH.
fn unshare_available() -> hpk_integration::Result<PathBuf> {
    let missing =
        |hint: &str| hpk_integration::Error::Missing { what: "unshare as root".into(), hint: hint.into() };
    if !nix::unistd::geteuid().is_root() {
        return Err(missing("run the tests as root (we are not)"));
    }
    std::env::var_os("PATH")
        .and_then(|path| {
            std::env::split_paths(&path).map(|dir| dir.join("unshare")).find(|candidate| candidate.is_file())
        })
        .ok_or_else(|| missing("install util-linux"))
}

#[test]
fn as_pid1_of_a_new_pid_namespace_orphans_are_reaped_and_sigterm_reaches_everyone() {
    let Some(unshare) = hpk_integration::skip_unless_available(unshare_available()) else {
        return;
    };
    let runtime = Runtime::new();
    let socket = runtime.socket();
    let mut pause = Pause::start(
        unshare.to_str().expect("utf-8 path"),
        &[
            "--pid",
            "--fork",
            "--mount-proc",
            "--kill-child",
            env!("CARGO_BIN_EXE_hpk-pause"),
            "--events",
            socket.to_str().expect("utf-8 temp path"),
            "--",
            "sh",
            "-c",
            "sleep 0.2 & sleep 30 & echo $$ $!; exit 0",
        ],
        runtime.dir.path().join("pause.log"),
    );
    let mut events = runtime.accept();
    assert_eq!(events.ready(), 1, "hpk-pause is PID 1 of its namespace");
    let line = pause.line();
    assert_eq!(line, "2 4", "sh and the long sleep as the namespace numbers them");
    assert_eq!(events.exit(), ChildExit::exited(2, 0));
    assert_eq!(events.exit(), ChildExit::exited(3, 0), "the orphaned short sleep");

    // SIGTERM goes to the pause itself (unshare's child), which sends it to the whole namespace.
    let children = format!("/proc/{0}/task/{0}/children", pause.pid());
    let host_pid: i32 = fs::read_to_string(&children)
        .expect("unshare's children")
        .trim()
        .parse()
        .expect("one child: hpk-pause");
    kill(Pid::from_raw(host_pid), Signal::SIGTERM).expect("signal hpk-pause");
    assert_eq!(events.exit(), ChildExit::killed(4, 15));
    assert_eq!(pause.wait().code(), Some(0), "unshare passes on the pause's status");
}
