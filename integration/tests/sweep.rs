//! `hpk-testcluster sweep` removes what a run killed with SIGKILL (so no Drop ran) left behind.
//! Its own test binary, so no other harness runs while it sweeps.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_hpk-testcluster");

#[test]
fn sweep_removes_what_a_killed_run_left() {
    if hpk_integration::skip_unless_available(hpk_integration::controlplane::bin_dir()).is_none() {
        return;
    }
    let mut up = Command::new(BIN)
        .args(["up", "--nodes", "node1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start hpk-testcluster up");
    let stdout = up.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut namespaces = Vec::new();
    loop {
        let line = rx.recv_timeout(Duration::from_secs(120)).expect("hpk-testcluster up did not get ready");
        // "  host NAME IP ip netns exec NAMESPACE ..."
        if let Some(ns) = line.split_whitespace().skip_while(|w| *w != "exec").nth(1) {
            namespaces.push(ns.to_owned());
        }
        if line.starts_with("stop with") {
            break;
        }
    }
    assert_eq!(namespaces.len(), 2, "control plane and node1");

    up.kill().expect("SIGKILL");
    up.wait().expect("reap");
    let listed = hpk_integration::netns::ip(&["netns", "list"]).expect("list");
    let pids = hpk_integration::netns::ip(&["netns", "pids", &namespaces[0]]).expect("pids");
    assert!(namespaces.iter().all(|ns| listed.contains(ns.as_str())), "SIGKILL leaves the namespaces");
    assert!(!pids.trim().is_empty(), "SIGKILL leaves the components running");

    let out = Command::new(BIN).arg("sweep").output().expect("sweep");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let listed = hpk_integration::netns::ip(&["netns", "list"]).expect("list");
    for ns in &namespaces {
        assert!(!listed.contains(ns.as_str()), "{ns} remains");
    }
    for pid in pids.split_whitespace() {
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists(), "component {pid} still runs");
    }
    let temp_left: Vec<_> = std::fs::read_dir(std::env::temp_dir())
        .expect("tmp")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("hpk-testcluster-"))
        .collect();
    assert!(temp_left.is_empty(), "{temp_left:?}");
}
