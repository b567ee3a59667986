//! The crun engine on the real crun: a sandbox held by the real hpk-pause, a container joining
//! it on an overlay root, its output in CRI log format, its exit reported by the pause.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hpk_pod_runtime::engine::{
    ContainerSpec, Crun, LogStream, MountNamespace, Overlay, SandboxSpec, copy_lines,
};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};

mod support;

use support::{PAUSE, tools_present};

/// A lower layer with busybox and the applets the test uses.
fn busybox_layer(dir: &Path) -> PathBuf {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).expect("mkdir");
    std::fs::copy("/bin/busybox", bin.join("busybox")).expect("copy busybox");
    for applet in ["sh", "echo", "hostname", "cat", "sleep", "tr"] {
        std::os::unix::fs::symlink("busybox", bin.join(applet)).expect("symlink");
    }
    for d in ["proc", "dev", "sys", "tmp"] {
        std::fs::create_dir_all(dir.join(d)).expect("mkdir");
    }
    dir.to_owned()
}

/// Force-deletes the test's containers if the test ends early, so no pause outlives it.
struct Cleanup<'a> {
    crun: &'a Crun,
    ids: &'a [&'a str],
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        for id in self.ids {
            let _ = self.crun.delete(id, true);
        }
    }
}

async fn next_event(lines: &mut tokio::io::Lines<BufReader<tokio::net::UnixStream>>) -> Value {
    let line = tokio::time::timeout(Duration::from_secs(15), lines.next_line())
        .await
        .expect("an event within 15 s")
        .expect("read event")
        .expect("events stream open");
    serde_json::from_str(&line).expect("event is JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_runs_in_a_sandbox_and_its_output_is_logged() {
    if !tools_present(&["crun", "nsenter", "unshare"]) {
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let ns = MountNamespace::prepare().expect("mount namespace");
    let crun = Crun::new(&tmp.path().join("crun")).with_prefix(ns.prefix());
    let _cleanup = Cleanup { crun: &crun, ids: &["c1", "sb1"] };

    // The sandbox: hpk-pause reports readiness, then exits, on its events socket.
    let events_dir = tmp.path().join("sb1-events");
    std::fs::create_dir_all(&events_dir).expect("mkdir");
    let listener = tokio::net::UnixListener::bind(events_dir.join("events.sock")).expect("listen");
    let sandbox = SandboxSpec {
        id: "sb1".into(),
        hostname: "pod-a".into(),
        pause_binary: PAUSE.into(),
        events_dir: events_dir.clone(),
        grace_seconds: 2,
        host_network: false,
        host_ipc: false,
        sysctls: Default::default(),
    };
    let sb_bundle = tmp.path().join("sb1");
    sandbox.write_bundle(&sb_bundle).expect("sandbox bundle");
    crun.create("sb1", &sb_bundle, hpk_pod_runtime::engine::Stdio3::null(), None).expect("create sandbox");
    crun.start("sb1").expect("start sandbox");
    let (stream, _) = tokio::time::timeout(Duration::from_secs(15), listener.accept())
        .await
        .expect("pause connects")
        .expect("accept");
    let mut events = BufReader::new(stream).lines();
    let ready = next_event(&mut events).await;
    assert_eq!(ready["ready"], true, "{ready}");
    let state = crun.state("sb1").expect("state").expect("known");
    assert_eq!(state.status, "running");

    // A container joining it, on an overlay of a busybox layer.
    let c_dir = tmp.path().join("c1");
    let overlay =
        Overlay::new(&c_dir, &tmp.path().join("c1-layer"), vec![busybox_layer(&tmp.path().join("layer"))])
            .expect("overlay");
    overlay.mount(&crun).expect("mount overlay");
    let spec = ContainerSpec {
        id: "c1".into(),
        rootfs: overlay.target.clone(),
        args: [
            "sh",
            "-c",
            "echo hello; echo oops >&2; hostname; tr '\\0' ' ' </proc/1/cmdline; echo; exit 3",
        ]
        .map(String::from)
        .to_vec(),
        env: vec!["PATH=/bin".into()],
        cwd: "/".into(),
        uid: 0,
        gid: 0,
        additional_gids: vec![],
        mounts: vec![],
        security: Default::default(),
        own_pid_namespace: false,
        readonly_rootfs: false,
        terminal: false,
    };
    let bundle = c_dir.join("bundle");
    spec.write_bundle(&bundle).expect("container bundle");
    let (out_r, out_w) = std::io::pipe().expect("pipe");
    let (err_r, err_w) = std::io::pipe().expect("pipe");
    let log_path = tmp.path().join("c1.log");
    let log = Arc::new(Mutex::new(std::fs::File::create(&log_path).expect("log")));
    let receiver = |r: std::io::PipeReader| {
        tokio::net::unix::pipe::Receiver::from_owned_fd(std::os::fd::OwnedFd::from(r)).expect("receiver")
    };
    let out_task = tokio::spawn(copy_lines(receiver(out_r), LogStream::Stdout, log.clone()));
    let err_task = tokio::spawn(copy_lines(receiver(err_r), LogStream::Stderr, log.clone()));
    let in_sandbox = crun.in_pid_namespace(state.pid);
    in_sandbox
        .create(
            "c1",
            &bundle,
            hpk_pod_runtime::engine::Stdio3 {
                stdin: std::process::Stdio::null(),
                stdout: out_w.into(),
                stderr: err_w.into(),
            },
            None,
        )
        .expect("create container");
    let init = in_sandbox.state("c1").expect("state").expect("known").pid;
    in_sandbox.start("c1").expect("start container");

    // The pause reaps the container's init (reparented to it) and reports the exit code.
    let exit = tokio::time::timeout(Duration::from_secs(15), events.next_line()).await;
    let Ok(Ok(Some(exit))) = exit else {
        panic!(
            "no exit event: {exit:?}\ncrun state: {:?}\ncrun.log: {}\nlog: {}",
            in_sandbox.state("c1"),
            std::fs::read_to_string(bundle.join("crun.log")).unwrap_or_default(),
            std::fs::read_to_string(&log_path).unwrap_or_default()
        );
    };
    let exit: Value = serde_json::from_str(&exit).expect("JSON");
    assert_eq!(exit["exit_code"], 3, "{exit}");
    assert_eq!(exit["pid"], init, "the exit is the container init's, by its PID in the sandbox");
    out_task.await.expect("join").expect("stdout copied");
    err_task.await.expect("join").expect("stderr copied");
    log.lock().expect("log").flush().expect("flush");
    let text = std::fs::read_to_string(&log_path).expect("read log");
    let records: Vec<(String, String, String)> = text
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.splitn(4, ' ').collect();
            (f[1].to_owned(), f[2].to_owned(), f.get(3).copied().unwrap_or_default().to_owned())
        })
        .collect();
    let has =
        |stream: &str, content: &str| records.iter().any(|(s, t, c)| s == stream && t == "F" && c == content);
    assert!(has("stdout", "hello"), "{text}");
    assert!(has("stderr", "oops"), "{text}");
    assert!(has("stdout", "pod-a"), "the container has the sandbox's hostname:\n{text}");
    assert!(records.iter().any(|(_, _, c)| c.contains("/hpk-pause")), "PID 1 is the pause:\n{text}");

    in_sandbox.delete("c1", true).expect("delete container");
    overlay.unmount(&crun).expect("unmount");
    crun.kill("sb1", "TERM").expect("stop sandbox");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while crun.state("sb1").expect("state").is_some_and(|s| s.status != "stopped") {
        assert!(std::time::Instant::now() < deadline, "pause did not stop on SIGTERM");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    crun.delete("sb1", true).expect("delete sandbox");
    assert!(crun.state("sb1").expect("state").is_none());
}
