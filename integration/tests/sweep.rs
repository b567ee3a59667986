//! `hpk-testcluster sweep` removes what a run killed with SIGKILL (so no Drop ran) left behind.
//! Its own test binary, so no other harness runs while it sweeps.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_hpk-testcluster");

/// Each test sweeps everything of the harness: one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn sweep_removes_what_a_killed_run_left() {
    if hpk_integration::skip_unless_available(hpk_integration::controlplane::bin_dir()).is_none() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
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
    // A killed component waits as a zombie until init reaps it: gone is not running.
    for pid in pids.split_whitespace() {
        let pid: i32 = pid.parse().expect("pid");
        assert!(!hpk_integration::process::is_running(pid), "component {pid} still runs");
    }
    let temp_left: Vec<_> = std::fs::read_dir(std::env::temp_dir())
        .expect("tmp")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("hpk-testcluster-"))
        .collect();
    assert!(temp_left.is_empty(), "{temp_left:?}");
}

#[test]
fn sweep_removes_a_killed_slurm() {
    if !hpk_integration::tools_present(&["slurmctld", "slurmd", "munged", "docker-registry"])
        || hpk_integration::skip_unless_available(hpk_integration::clusterdns::coredns_binary()).is_none()
    {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let env_dir = tempfile::tempdir().expect("tempdir");
    let env_file = env_dir.path().join("env");
    let mut slurm = Command::new(BIN)
        .args(["slurm", "--nodes", "1", "--env-file"])
        .arg(&env_file)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start hpk-testcluster slurm");
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while !env_file.is_file() {
        assert!(std::time::Instant::now() < deadline, "hpk-testcluster slurm did not get ready");
        assert!(slurm.try_wait().expect("wait").is_none(), "hpk-testcluster slurm exited");
        std::thread::sleep(Duration::from_millis(100));
    }
    let vars = std::fs::read_to_string(&env_file).expect("env");
    let var = |name: &str| {
        vars.lines().find_map(|l| l.strip_prefix(&format!("{name}="))).map(str::to_owned).expect(name)
    };
    let (user, conf) = (var("HPK_DEMO_USER"), var("HPK_DEMO_SLURM_CONF"));
    let dir = std::path::Path::new(&conf).parent().expect("the cluster's directory").to_owned();
    slurm.kill().expect("SIGKILL");
    slurm.wait().expect("reap");
    let daemons = || -> Vec<String> {
        std::fs::read_dir("/proc")
            .expect("/proc")
            .flatten()
            .filter_map(|e| {
                let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
                let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
                cmdline.contains(&dir.display().to_string()).then_some(cmdline)
            })
            .collect()
    };
    let known = |name: &str| nix::unistd::User::from_name(name).ok().flatten().is_some();
    assert!(
        !daemons().is_empty() && known(&user) && dir.exists(),
        "SIGKILL leaves Slurm, its user and files"
    );
    let id = user.strip_prefix("hpke2e").expect("a harness user");
    let cgroups: Vec<std::path::PathBuf> = ["freezer", "memory", "devices"]
        .iter()
        .map(|c| std::path::Path::new("/sys/fs/cgroup").join(c).join(format!("hpkt-{id}-node1")))
        .collect();
    assert!(cgroups.iter().all(|c| c.is_dir()), "SIGKILL leaves the nodes' cgroups");

    let out = Command::new(BIN).arg("sweep").output().expect("sweep");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let left = daemons();
    assert!(left.is_empty(), "still running: {left:?}");
    assert!(!known(&user), "user {user} remains");
    assert!(!dir.exists(), "{} remains", dir.display());
    for cgroup in &cgroups {
        assert!(!cgroup.exists(), "{} remains", cgroup.display());
    }
}
