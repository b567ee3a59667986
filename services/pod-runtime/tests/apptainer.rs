//! The Apptainer engine with the real crictl: a pod from a local registry, run by
//! `hpk-pod-runtime --engine apptainer` — pull, runp, create, start, logs, exec -s, stop, rmp,
//! rmi. Apptainer is an optional engine: without it on PATH the pod test is skipped with a
//! printed reason, even under HPK_REQUIRE_TOOLS=1, and what runs instead is the check that
//! asking for it without it fails clearly. The exact invocations are unit-tested in
//! `src/engine/apptainer/tests.rs` wherever the tests run.

mod support;

use std::time::{Duration, Instant};

use support::{CRICTL_TOOLS, PAUSE, RUNTIME, Runtime, registry_with_shell_image, tools_present, write_json};

fn apptainer_on_path() -> bool {
    hpk_pod_runtime::engine::on_path("apptainer")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crictl_runs_a_pod_with_the_apptainer_engine() {
    if !apptainer_on_path() {
        hpk_test_support::skip_optional(
            "apptainer not on PATH (HPK_REQUIRE_TOOLS does not require it; install Apptainer to run \
             this test — its invocations are unit-tested regardless)",
        );
        return;
    }
    if !tools_present(&["crictl", "docker-registry", "nsenter"]) {
        return;
    }
    let (registry, reference, _) = registry_with_shell_image().await;
    let tmp = tempfile::tempdir().expect("tempdir");
    let rt = tokio::task::block_in_place(|| {
        Runtime::start_with(tmp.path(), &registry.host_port(), &["--engine", "apptainer"])
    });
    tokio::task::block_in_place(|| {
        let info: serde_json::Value = serde_json::from_str(&rt.ok(&["info"])).expect("info JSON");
        assert_eq!(info["engine"], "apptainer", "{info}");

        rt.ok(&["pull", &reference]);
        let image_id = rt.ok(&["images", "-q"]);
        assert!(!image_id.is_empty());
        let sifs = std::fs::read_dir(tmp.path().join("root/apptainer/images")).expect("SIF cache").count();
        assert_eq!(sifs, 1, "one SIF in apptainer's cache");

        let logs = tmp.path().join("logs/app");
        let pod = write_json(
            &tmp.path().join("pod.json"),
            serde_json::json!({
                "metadata": {"name": "app", "namespace": "default", "uid": "uid-a", "attempt": 0},
                "hostname": "app-host",
                "log_directory": logs,
            }),
        );
        let pod_id = rt.ok(&["runp", &pod]);
        let ctr = write_json(
            &tmp.path().join("ctr.json"),
            serde_json::json!({
                "metadata": {"name": "hello"},
                "image": {"image": reference},
                "command": ["sh", "-c", "echo \"hello $GREETING\"; hostname; exec sleep 30"],
                "envs": [{"key": "GREETING", "value": "from apptainer"}],
                "log_path": "hello/0.log",
            }),
        );
        let ctr_id = rt.ok(&["create", &pod_id, &ctr, &pod]);
        rt.ok(&["start", &ctr_id]);
        let deadline = Instant::now() + Duration::from_secs(30);
        let out = loop {
            let out = rt.ok(&["logs", &ctr_id]);
            if out.contains("app-host") {
                break out;
            }
            assert!(Instant::now() < deadline, "logs so far: {out}\nruntime log:\n{}", rt.log());
            std::thread::sleep(Duration::from_millis(100));
        };
        assert!(out.contains("hello from apptainer"), "{out}");

        let exec = rt.ok(&["exec", "-s", &ctr_id, "sh", "-c", "echo \"in $GREETING\"; hostname"]);
        assert_eq!(exec, "in from apptainer\napp-host");

        rt.ok(&["stop", "--timeout", "5", &ctr_id]);
        let inspect: serde_json::Value =
            serde_json::from_str(&rt.ok(&["inspect", &ctr_id])).expect("inspect JSON");
        assert_eq!(inspect["status"]["state"], "CONTAINER_EXITED", "{inspect}");
        assert_ne!(inspect["status"]["exitCode"], 0, "ended by a signal: {inspect}");

        rt.ok(&["rm", &ctr_id]);
        rt.ok(&["stopp", &pod_id]);
        rt.ok(&["rmp", &pod_id]);
        assert_eq!(rt.ok(&["pods", "-q"]), "");
        rt.ok(&["rmi", &reference]);
        assert_eq!(rt.ok(&["images", "-q"]), "");
        let sifs = std::fs::read_dir(tmp.path().join("root/apptainer/images")).expect("SIF cache").count();
        assert_eq!(sifs, 0, "the SIF is removed with the image");
    });
}

/// `--engine apptainer` where apptainer is not installed: the runtime refuses to start and
/// says why, before it serves anything.
#[test]
fn asking_for_apptainer_without_it_fails_clearly() {
    if apptainer_on_path() {
        hpk_test_support::skipped("apptainer is on PATH; this checks the refusal without it");
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = std::process::Command::new(RUNTIME)
        .arg(format!("--socket={}", tmp.path().join("run/cri.sock").display()))
        .arg(format!("--root={}", tmp.path().join("root").display()))
        .arg(format!("--pause-binary={PAUSE}"))
        .args(["--engine", "apptainer"])
        .output()
        .expect("run hpk-pod-runtime");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--engine apptainer needs `apptainer` on PATH"), "{stderr}");
    assert!(!tmp.path().join("run/cri.sock").exists());
}

/// `--engine auto` is the default and reports what it chose: crun wherever crun is on PATH.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chosen_engine_is_reported_in_status() {
    if !tools_present(CRICTL_TOOLS) {
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    tokio::task::block_in_place(|| {
        let rt = Runtime::start(tmp.path(), "127.0.0.1:1");
        let info: serde_json::Value = serde_json::from_str(&rt.ok(&["info"])).expect("info JSON");
        assert_eq!(info["engine"], "crun", "{info}");
        assert!(rt.log().contains("engine=\"crun\""), "{}", rt.log());
    });
}
