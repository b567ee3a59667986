//! The real `crictl` drives the real `hpk-pod-runtime` (with the real hpk-pause and crun) and
//! an image from a real local registry: pull, images, runp, create, start, ps, logs, inspect,
//! stop, rm, stopp, rmp, rmi, and the errors of bad requests.

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crictl_runs_a_pod_from_the_local_registry() {
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
        let images = rt.ok(&["images"]);
        assert!(
            images.contains(&format!("{}/hpk/shell", registry.host_port())) && images.contains("v1"),
            "{images}"
        );
        let image_id = rt.ok(&["images", "-q"]);
        assert!(image.config.digest.as_str().ends_with(image_id.trim_start_matches("sha256:")), "{image_id}");

        let logs = tmp.path().join("logs/demo");
        let pod = write_json(
            &tmp.path().join("pod.json"),
            serde_json::json!({
                "metadata": {"name": "demo", "namespace": "default", "uid": "uid-1", "attempt": 0},
                "hostname": "demo-host",
                "log_directory": logs,
            }),
        );
        let pod_id = rt.ok(&["runp", &pod]);
        assert_eq!(rt.ok(&["pods", "-q"]), pod_id);
        // The same pod again is refused: its name is taken.
        assert!(rt.fails(&["runp", &pod]).contains("already exists"));

        let ctr = write_json(
            &tmp.path().join("ctr.json"),
            serde_json::json!({
                "metadata": {"name": "hello"},
                "image": {"image": reference},
                "command": ["sh", "-c", "echo hello from hpk; hostname; exec sleep 30"],
                "envs": [{"key": "GREETING", "value": "hi"}],
                "log_path": "hello/0.log",
            }),
        );
        let ctr_id = rt.ok(&["create", &pod_id, &ctr, &pod]);
        rt.ok(&["start", &ctr_id]);
        assert_eq!(rt.ok(&["ps", "-q"]), ctr_id);

        let deadline = Instant::now() + Duration::from_secs(15);
        let logs_out = loop {
            let out = rt.ok(&["logs", &ctr_id]);
            if out.contains("demo-host") {
                break out;
            }
            assert!(Instant::now() < deadline, "logs so far: {out}");
            std::thread::sleep(Duration::from_millis(100));
        };
        assert!(logs_out.contains("hello from hpk"), "{logs_out}");
        assert!(logs.join("hello/0.log").is_file());

        rt.ok(&["stop", "--timeout", "2", &ctr_id]);
        let inspect: serde_json::Value =
            serde_json::from_str(&rt.ok(&["inspect", &ctr_id])).expect("inspect JSON");
        assert_eq!(inspect["status"]["state"], "CONTAINER_EXITED", "{inspect}");
        assert_eq!(inspect["status"]["exitCode"], 143, "sleep ended by SIGTERM: {inspect}");

        rt.ok(&["rm", &ctr_id]);
        assert_eq!(rt.ok(&["ps", "-a", "-q"]), "");
        rt.ok(&["stopp", &pod_id]);
        rt.ok(&["rmp", &pod_id]);
        assert_eq!(rt.ok(&["pods", "-q"]), "");
        rt.ok(&["rmi", &reference]);
        assert_eq!(rt.ok(&["images", "-q"]), "");
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_clear_errors_and_leave_nothing() {
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
        assert!(rt.fails(&["pull", "Not A Reference!"]).to_lowercase().contains("reference"));
        let missing = format!("{}/hpk/nothing:v1", registry.host_port());
        assert!(rt.fails(&["pull", &missing]).contains("not found"));
        assert!(rt.fails(&["pull", "127.0.0.1:1/hpk/shell:v1"]).to_lowercase().contains("127.0.0.1:1"));
        assert_eq!(rt.ok(&["images", "-q"]), "");

        rt.ok(&["pull", &reference]);
        let pod = write_json(
            &tmp.path().join("pod.json"),
            serde_json::json!({
                "metadata": {"name": "bad", "namespace": "default", "uid": "uid-2", "attempt": 0},
                "log_directory": tmp.path().join("logs/bad"),
            }),
        );
        let pod_id = rt.ok(&["runp", &pod]);
        let container = |name: &str, extra: serde_json::Value| {
            let mut config = serde_json::json!({
                "metadata": {"name": name},
                "image": {"image": reference},
                "command": ["sh", "-c", "true"],
                "log_path": format!("{name}/0.log"),
            });
            if let (Some(c), Some(e)) = (config.as_object_mut(), extra.as_object()) {
                c.extend(e.clone());
            }
            write_json(&tmp.path().join(format!("{name}.json")), config)
        };
        let escaping = container("escape", serde_json::json!({"log_path": "../../etc/evil.log"}));
        assert!(rt.fails(&["create", &pod_id, &escaping, &pod]).contains("must stay inside"));
        let mount = container(
            "mount",
            serde_json::json!({"mounts": [{"container_path": "/data/../etc", "host_path": "/tmp"}]}),
        );
        assert!(rt.fails(&["create", &pod_id, &mount, &pod]).contains("without '..'"));
        let huge = container(
            "huge",
            serde_json::json!({"envs": [{"key": "BIG", "value": "x".repeat(4 * 1024 * 1024)}]}),
        );
        assert!(rt.fails(&["create", &pod_id, &huge, &pod]).contains("at most"));
        let no_image = container("noimage", serde_json::json!({"image": {"image": "127.0.0.1:1/none:v1"}}));
        assert!(rt.fails(&["create", &pod_id, &no_image, &pod]).contains("not found"));
        // Nothing of the refused containers exists.
        assert_eq!(rt.ok(&["ps", "-a", "-q"]), "");
        let leftovers =
            std::fs::read_dir(tmp.path().join("root/containers")).expect("containers dir").count();
        assert_eq!(leftovers, 0);
        rt.ok(&["rmp", "-f", &pod_id]);
    });
}
