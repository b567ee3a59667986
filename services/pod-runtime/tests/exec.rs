//! ExecSync through the real `crictl exec -s`: output, exit codes, the sandbox's hostname and
//! PID namespace, a command that does not exist, a timeout that leaves nothing running, and a
//! stopped container.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hpk_integration::registry::{Client, Registry};

const RUNTIME: &str = env!("CARGO_BIN_EXE_hpk-pod-runtime");
const PAUSE: &str = env!("CARGO_BIN_EXE_hpk-pause");

fn tools_present() -> bool {
    let on_path = |name: &str| {
        std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
    };
    let mut missing: Vec<&str> = ["crictl", "crun", "docker-registry", "nsenter", "unshare"]
        .into_iter()
        .filter(|t| !on_path(t))
        .collect();
    if !Path::new("/bin/busybox").is_file() {
        missing.push("busybox-static");
    }
    if missing.is_empty() {
        return true;
    }
    assert!(std::env::var("HPK_REQUIRE_TOOLS").as_deref() != Ok("1"), "missing {missing:?}");
    eprintln!("SKIPPED: missing {missing:?} (scripts/setup.sh installs them)");
    false
}

/// A running hpk-pod-runtime; SIGTERM and reaped on drop. Sandboxes it leaves are removed by
/// the test through crictl before that.
struct Runtime {
    child: Child,
    socket: PathBuf,
    log: PathBuf,
}

impl Runtime {
    fn start(dir: &Path, registry: &str) -> Self {
        let socket = dir.join("run/cri.sock");
        let log = dir.join("runtime.log");
        let child = Command::new(RUNTIME)
            .arg(format!("--socket={}", socket.display()))
            .arg(format!("--root={}", dir.join("root").display()))
            .arg(format!("--pause-binary={PAUSE}"))
            .arg(format!("--insecure-registry={registry}"))
            .arg("--pod-grace-seconds=2")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log"))
            .spawn()
            .expect("start hpk-pod-runtime");
        let mut runtime = Self { child, socket, log };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !runtime.crictl(&["version"]).status.success() {
            if let Ok(Some(status)) = runtime.child.try_wait() {
                panic!("runtime exited with {status}:\n{}", runtime.log());
            }
            assert!(Instant::now() < deadline, "runtime not serving within 20 s:\n{}", runtime.log());
            std::thread::sleep(Duration::from_millis(50));
        }
        runtime
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn crictl(&self, args: &[&str]) -> std::process::Output {
        let endpoint = format!("unix://{}", self.socket.display());
        Command::new("crictl")
            .args(["--runtime-endpoint", &endpoint, "--image-endpoint", &endpoint, "--timeout", "30s"])
            .args(args)
            .output()
            .expect("run crictl")
    }

    /// Runs crictl, asserting success; returns trimmed stdout.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.crictl(args);
        assert!(
            out.status.success(),
            "crictl {args:?} failed: {}\nruntime log:\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// Runs crictl, asserting failure; returns stderr.
    fn fails(&self, args: &[&str]) -> String {
        let out = self.crictl(args);
        assert!(
            !out.status.success(),
            "crictl {args:?} should fail: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).expect("pid")),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
    }
}

fn write_json(path: &Path, value: serde_json::Value) -> String {
    std::fs::write(path, serde_json::to_vec_pretty(&value).expect("json")).expect("write");
    path.display().to_string()
}

/// Host PIDs of processes whose command line is exactly `args`.
fn processes_running(args: &[&str]) -> Vec<u32> {
    let wanted: Vec<u8> = args.iter().flat_map(|a| a.bytes().chain([0])).collect();
    std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == wanted))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crictl_exec_runs_commands_in_the_container() {
    if !tools_present() {
        return;
    }
    let registry = Registry::start(IpAddr::V4(Ipv4Addr::LOCALHOST), None).await.expect("registry");
    let image = hpk_integration::image::shell_image().expect("shell image");
    Client::new(&registry.url()).expect("client").push("hpk/shell", "v1", &image).await.expect("push");
    let reference = format!("{}/hpk/shell:v1", registry.host_port());
    let tmp = tempfile::tempdir().expect("tempdir");
    let rt = tokio::task::block_in_place(|| Runtime::start(tmp.path(), &registry.host_port()));
    tokio::task::block_in_place(|| {
        rt.ok(&["pull", &reference]);
        let pod = write_json(
            &tmp.path().join("pod.json"),
            serde_json::json!({
                "metadata": {"name": "exec", "namespace": "default", "uid": "uid-exec", "attempt": 0},
                "hostname": "exec-host",
                "log_directory": tmp.path().join("logs/exec"),
            }),
        );
        let pod_id = rt.ok(&["runp", &pod]);
        let ctr = write_json(
            &tmp.path().join("ctr.json"),
            serde_json::json!({
                "metadata": {"name": "sleeper"},
                "image": {"image": reference},
                "command": ["sleep", "300"],
                "log_path": "sleeper/0.log",
            }),
        );
        let ctr_id = rt.ok(&["create", &pod_id, &ctr, &pod]);
        rt.ok(&["start", &ctr_id]);
        let short = &ctr_id[..12];

        assert_eq!(rt.ok(&["exec", "-s", short, "echo", "hi"]), "hi");

        // This crictl reports a non-zero exit as its own failure, quoting the code and stderr.
        let err = rt.fails(&["exec", "-s", &ctr_id, "sh", "-c", "echo out; echo err >&2; exit 7"]);
        assert!(err.contains("exited with 7: err"), "{err}");

        assert_eq!(rt.ok(&["exec", "-s", &ctr_id, "hostname"]), "exec-host");
        // One PID namespace per pod: the exec sees hpk-pause as PID 1.
        let init = rt.ok(&["exec", "-s", &ctr_id, "cat", "/proc/1/cmdline"]);
        assert!(init.contains("hpk-pause"), "{init:?}");

        // A command that is not in the image fails like it would in a shell, not the RPC.
        let err = rt.fails(&["exec", "-s", &ctr_id, "no-such-command"]);
        assert!(err.contains("exited with 127") && err.contains("`no-such-command` not found"), "{err}");

        let started = Instant::now();
        let err = rt.fails(&["exec", "-s", "--timeout", "1", &ctr_id, "sleep", "41"]);
        assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
        assert!(err.to_lowercase().contains("deadline"), "{err}");
        // The killed command is gone (give the kernel a moment to reap it).
        let deadline = Instant::now() + Duration::from_secs(5);
        while !processes_running(&["sleep", "41"]).is_empty() {
            assert!(Instant::now() < deadline, "sleep 41 still runs after the exec timed out");
            std::thread::sleep(Duration::from_millis(50));
        }
        // The container itself is untouched by the exec's timeout.
        assert_eq!(rt.ok(&["exec", "-s", &ctr_id, "echo", "still here"]), "still here");

        rt.ok(&["stop", "--timeout", "1", &ctr_id]);
        let err = rt.fails(&["exec", "-s", &ctr_id, "echo", "hi"]);
        assert!(err.contains("not running"), "{err}");
        assert!(rt.fails(&["exec", "-s", "no-such-container", "echo"]).contains("not found"));

        rt.ok(&["rm", &ctr_id]);
        rt.ok(&["stopp", &pod_id]);
        rt.ok(&["rmp", &pod_id]);
        assert_eq!(rt.ok(&["pods", "-q"]), "");
    });
}
