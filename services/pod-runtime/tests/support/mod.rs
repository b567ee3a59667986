//! Shared by the pod-runtime's integration tests: tool checks, a running hpk-pod-runtime
//! driven through the real crictl, a local registry holding the busybox shell image.
#![allow(dead_code, missing_docs)] // each test binary uses a different part

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hpk_integration::registry::{Client, Registry};

/// The tools the crictl-driven tests need.
pub const CRICTL_TOOLS: &[&str] = &["crictl", "crun", "docker-registry", "nsenter", "unshare"];

/// A local registry on loopback holding the busybox shell image as `hpk/shell:v1`; returns it
/// with the image's reference and the image itself.
pub async fn registry_with_shell_image() -> (Registry, String, hpk_integration::image::Image) {
    let registry = Registry::start(IpAddr::V4(Ipv4Addr::LOCALHOST), None).await.expect("registry");
    let image = hpk_integration::image::shell_image().expect("shell image");
    Client::new(&registry.url()).expect("client").push("hpk/shell", "v1", &image).await.expect("push");
    let reference = format!("{}/hpk/shell:v1", registry.host_port());
    (registry, reference, image)
}

/// Pushes the busybox httpd image to `registry`; returns its reference.
pub async fn push_httpd_image(registry: &Registry) -> String {
    let image = hpk_integration::image::httpd_image().expect("httpd image");
    Client::new(&registry.url()).expect("client").push("hpk/httpd", "v1", &image).await.expect("push");
    format!("{}/hpk/httpd:v1", registry.host_port())
}

pub const RUNTIME: &str = env!("CARGO_BIN_EXE_hpk-pod-runtime");
pub const PAUSE: &str = env!("CARGO_BIN_EXE_hpk-pause");

/// Whether `tools` and busybox-static are present (see `hpk_integration::tools_present`).
pub fn tools_present(tools: &[&str]) -> bool {
    hpk_integration::tools_present(tools)
}

/// A running hpk-pod-runtime; on drop its pods are removed, then it gets SIGTERM and is reaped.
pub struct Runtime {
    child: Child,
    socket: PathBuf,
    log: PathBuf,
    /// Killed on purpose: its pods are left for the next runtime on the same directory.
    killed: bool,
}

impl Runtime {
    pub fn start(dir: &Path, registry: &str) -> Self {
        Self::start_with(dir, registry, &[])
    }

    /// Starts the runtime with `extra` arguments (e.g. `--engine apptainer`).
    pub fn start_with(dir: &Path, registry: &str, extra: &[&str]) -> Self {
        let socket = dir.join("run/cri.sock");
        let log = dir.join("runtime.log");
        let previous = std::fs::read_to_string(&log).unwrap_or_default();
        let log_file = std::fs::File::create(&log).expect("log");
        // A restarted runtime keeps the earlier run's log above its own.
        std::io::Write::write_all(&mut &log_file, previous.as_bytes()).expect("log");
        let child = Command::new(RUNTIME)
            .arg(format!("--socket={}", socket.display()))
            .arg(format!("--root={}", dir.join("root").display()))
            // Apart from the root, as in a bubble (its /run).
            .arg(format!("--state={}", dir.join("state").display()))
            .arg(format!("--pause-binary={PAUSE}"))
            .arg(format!("--insecure-registry={registry}"))
            .arg("--pod-grace-seconds=2")
            .args(extra)
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .expect("start hpk-pod-runtime");
        let mut runtime = Self { child, socket, log, killed: false };
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

    /// SIGKILLs the runtime, as a crash would, leaving its pods running.
    pub fn kill(mut self) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).expect("pid"));
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).expect("kill -9");
        self.child.wait().expect("reap");
        self.killed = true;
    }

    /// The runtime's PID (`/proc/PID/root` walks its private mount namespace).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The CRI socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// crictl against this runtime, for the caller to finish setting up.
    pub fn crictl_command(&self) -> Command {
        let endpoint = format!("unix://{}", self.socket.display());
        let mut cmd = Command::new("crictl");
        cmd.args(["--runtime-endpoint", &endpoint, "--image-endpoint", &endpoint, "--timeout", "30s"]);
        cmd
    }

    pub fn crictl(&self, args: &[&str]) -> std::process::Output {
        self.crictl_command().args(args).output().expect("run crictl")
    }

    /// Runs pod `name` with one container `main` running `command` (the image's own when
    /// empty) from `image`, logs under `dir/logs/name`; the container may have stdin (closed
    /// after the first attach) and a terminal. Returns (pod ID, container ID).
    pub fn run_pod(
        &self,
        dir: &Path,
        name: &str,
        image: &str,
        command: &[&str],
        stdin: bool,
        tty: bool,
    ) -> (String, String) {
        let pod = write_json(
            &dir.join(format!("{name}-pod.json")),
            serde_json::json!({
                "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"), "attempt": 0},
                "log_directory": dir.join("logs").join(name),
            }),
        );
        let mut config = serde_json::json!({
            "metadata": {"name": "main"},
            "image": {"image": image},
            "log_path": "main/0.log",
            "stdin": stdin,
            "stdin_once": stdin,
            "tty": tty,
        });
        if !command.is_empty() {
            config["command"] = serde_json::json!(command);
        }
        let ctr = write_json(&dir.join(format!("{name}-ctr.json")), config);
        let pod_id = self.ok(&["runp", &pod]);
        let ctr_id = self.ok(&["create", &pod_id, &ctr, &pod]);
        self.ok(&["start", &ctr_id]);
        (pod_id, ctr_id)
    }

    /// Runs crictl, asserting success; returns trimmed stdout.
    pub fn ok(&self, args: &[&str]) -> String {
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
    pub fn fails(&self, args: &[&str]) -> String {
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
        if self.killed {
            return;
        }
        // Sandboxes outlive the runtime by design; a test that failed midway must not leave its
        // pods running, so remove them all before stopping the runtime.
        let _ = self.crictl(&["rmp", "--all", "--force"]);
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).expect("pid")),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
    }
}

pub fn write_json(path: &Path, value: serde_json::Value) -> String {
    std::fs::write(path, serde_json::to_vec_pretty(&value).expect("json")).expect("write");
    path.display().to_string()
}
