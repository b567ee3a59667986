//! Restart safety: `kill -9` the runtime with 10 pods running, start it again on the same state
//! directory, and everything is taken back — pods ready, containers running, output still
//! flowing into the logs, and a container that exited while no runtime ran shows its code.

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use support::{CRICTL_TOOLS, Runtime, registry_with_shell_image, tools_present, write_json};

const PODS: usize = 10;

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn inspect(rt: &Runtime, id: &str) -> serde_json::Value {
    serde_json::from_str(&rt.ok(&["inspect", id])).expect("inspect JSON")
}

fn log_lines(path: &Path) -> usize {
    std::fs::read_to_string(path).unwrap_or_default().lines().count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_runtime_takes_its_pods_back() {
    if !tools_present(CRICTL_TOOLS) {
        return;
    }
    let (registry, reference, _) = registry_with_shell_image().await;
    let tmp = tempfile::tempdir().expect("tempdir");
    let shared = tmp.path().join("shared");
    std::fs::create_dir(&shared).expect("shared dir");
    let logs = tmp.path().join("logs");
    tokio::task::block_in_place(|| {
        let rt = Runtime::start(tmp.path(), &registry.host_port());
        rt.ok(&["pull", &reference]);
        let mut pods = Vec::new();
        for i in 0..PODS {
            let pod = write_json(
                &tmp.path().join(format!("pod{i}.json")),
                serde_json::json!({
                    "metadata": {"name": format!("p{i}"), "namespace": "default", "uid": format!("uid-{i}"), "attempt": 0},
                    "log_directory": logs.join(format!("p{i}")),
                }),
            );
            // Pod 0 waits for a file and then exits 7; the others print a line every 50 ms.
            let command = if i == 0 {
                "echo waiting; while [ ! -e /shared/go ]; do sleep 0.05; done; echo bye; exit 7"
            } else {
                "i=0; while :; do echo tick $i; i=$((i+1)); sleep 0.05; done"
            };
            let ctr = write_json(
                &tmp.path().join(format!("ctr{i}.json")),
                serde_json::json!({
                    "metadata": {"name": "main"},
                    "image": {"image": reference},
                    "command": ["sh", "-c", command],
                    "mounts": [{"container_path": "/shared", "host_path": shared}],
                    "log_path": "main/0.log",
                }),
            );
            let pod_id = rt.ok(&["runp", &pod]);
            let ctr_id = rt.ok(&["create", &pod_id, &ctr, &pod]);
            rt.ok(&["start", &ctr_id]);
            pods.push((pod_id, ctr_id, logs.join(format!("p{i}/main/0.log"))));
        }
        wait_for("every container's first line", || pods.iter().all(|(_, _, log)| log_lines(log) > 0));
        rt.kill();

        // While no runtime runs: pod 0's container exits, the others keep logging.
        std::fs::write(shared.join("go"), b"").expect("go");
        let ticker = &pods[1].2;
        let before = log_lines(ticker);
        wait_for("pod 0's last line, written with no runtime", || {
            std::fs::read_to_string(&pods[0].2).unwrap_or_default().contains("stdout F bye")
        });
        wait_for("a ticker's log to grow with no runtime", || log_lines(ticker) > before + 3);

        let rt = Runtime::start(tmp.path(), &registry.host_port());
        // Pod 0's exit came from its pause's queue, not from guessing.
        assert!(
            rt.log()
                .contains("running_sandboxes: 10, stopped_sandboxes: 0, containers: 10, exits_replayed: 1"),
            "{}",
            rt.log()
        );
        let ready: Vec<String> =
            rt.ok(&["pods", "-q", "--state", "ready"]).lines().map(str::to_owned).collect();
        assert_eq!(ready.len(), PODS, "every pod is ready again: {ready:?}\n{}", rt.log());
        for (pod_id, _, _) in &pods {
            assert!(ready.contains(pod_id), "{pod_id} is listed");
        }
        let exited = inspect(&rt, &pods[0].1);
        assert_eq!(exited["status"]["state"], "CONTAINER_EXITED", "{exited}");
        assert_eq!(
            exited["status"]["exitCode"], 7,
            "the exit code from while the runtime was down: {exited}"
        );
        let running: Vec<String> =
            rt.ok(&["ps", "-q", "--state", "running"]).lines().map(str::to_owned).collect();
        assert_eq!(running.len(), PODS - 1, "{running:?}");
        for (_, ctr_id, _) in &pods[1..] {
            assert!(running.contains(ctr_id), "{ctr_id} is running");
        }

        // The taken-back containers work as before: exec, logs, stop with the right code.
        let (_, ctr_id, log) = &pods[2];
        assert_eq!(rt.ok(&["exec", "-s", ctr_id, "echo", "still here"]), "still here");
        let lines = log_lines(log);
        wait_for("the log to keep growing", || log_lines(log) > lines + 3);
        rt.ok(&["stop", "--timeout", "2", ctr_id]);
        let stopped = inspect(&rt, ctr_id);
        assert_eq!(stopped["status"]["exitCode"], 143, "ended by SIGTERM: {stopped}");
        for (pod_id, _, _) in &pods {
            rt.ok(&["rmp", "-f", pod_id]);
        }
        assert_eq!(rt.ok(&["pods", "-q"]), "");
        for dir in ["state/containers", "root/layers"] {
            let leftovers = std::fs::read_dir(tmp.path().join(dir)).expect("containers").count();
            assert_eq!(leftovers, 0, "removed containers leave nothing in {dir}");
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_created_state_is_removed_at_start() {
    if !tools_present(CRICTL_TOOLS) {
        return;
    }
    let (registry, _, _) = registry_with_shell_image().await;
    let tmp = tempfile::tempdir().expect("tempdir");
    // What a runtime killed in the middle of RunPodSandbox and CreateContainer leaves: a
    // directory without records.
    let sandbox = tmp.path().join("state/sandboxes").join("a".repeat(64));
    let container = tmp.path().join("state/containers").join("b".repeat(64));
    for dir in [&sandbox, &container] {
        std::fs::create_dir_all(dir.join("bundle")).expect("dir");
    }
    // And a record that does not parse.
    let broken = tmp.path().join("state/sandboxes").join("c".repeat(64));
    std::fs::create_dir_all(&broken).expect("dir");
    std::fs::write(broken.join("config.json"), b"{").expect("write");
    std::fs::write(broken.join("state.json"), b"{}").expect("write");
    tokio::task::block_in_place(|| {
        let rt = Runtime::start(tmp.path(), &registry.host_port());
        assert_eq!(rt.ok(&["pods", "-q"]), "");
        assert_eq!(rt.ok(&["ps", "-a", "-q"]), "");
        assert!(!sandbox.exists() && !container.exists() && !broken.exists(), "{}", rt.log());
        assert!(rt.log().contains("unreadable sandbox record"), "{}", rt.log());
    });
}
