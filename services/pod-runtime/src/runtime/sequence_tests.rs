//! The runtime's create, start, stop, remove and recover sequences against the recording fake
//! engine: the calls each makes, in order, and that a failure at any engine step leaves
//! nothing behind — no engine object, no mount, no directory, no record, no state.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_cri::v1 as cri;

use super::{Config, Runtime};
use crate::engine::CgroupMode;
use crate::engine::fake::FakeEngine;
use crate::images::{ImageRecord, ImageStore};

const IMAGE: &str = "registry.test/app:1";
const DIGEST: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";

/// A runtime over `root` with `engine`, and a shim that holds the output FIFOs for 30 s (or until
/// the runtime kills it on remove).
fn runtime(root: &Path, engine: &Arc<FakeEngine>) -> Arc<Runtime> {
    runtime_with_store(root, engine, "images")
}

/// The same, its image store in `root/store` (one runtime holds a store at a time, and the
/// runtime a test restarts lives on in its tasks).
fn runtime_with_store(root: &Path, engine: &Arc<FakeEngine>, store: &str) -> Arc<Runtime> {
    let shim = root.join("shim.sh");
    std::fs::write(
        &shim,
        "#!/bin/sh\n\
         while [ $# -gt 0 ]; do case \"$1\" in --stdout) out=$2;; --stderr) err=$2;; esac; shift; done\n\
         exec 3<>\"$out\" 4<>\"$err\"\n\
         echo ready\n\
         i=0; while [ $i -lt 30 ]; do sleep 1; i=$((i+1)); done\n",
    )
    .expect("shim");
    std::fs::set_permissions(&shim, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
    let config = Config {
        root: root.join("state"),
        // Apart, as the bubble has them (its /run), so that each test checks both places.
        state: root.join("volatile"),
        pause_binary: "/nonexistent/hpk-pause".into(),
        pause_grace_seconds: 1,
        cgroup_mode: CgroupMode::V2,
        shim_binary: shim,
        network: None,
        pod_logs_root: None,
        cdi_spec_dirs: Vec::new(),
        on_pod_removed: None,
    };
    let images = ImageStore::open(&root.join(store)).expect("store");
    let runtime = Runtime::new(config, engine.clone(), images).expect("runtime");
    let record = ImageRecord {
        id: DIGEST.into(),
        manifest_digest: DIGEST.into(),
        repo_tags: vec![IMAGE.into()],
        repo_digests: vec![format!("registry.test/app@{DIGEST}")],
        size: 1,
        diff_ids: vec![],
        layer_digests: vec![],
        content: vec![],
        config: Default::default(),
    };
    runtime.images.add_record(record).expect("image record");
    runtime
}

fn sandbox_config(name: &str) -> cri::PodSandboxConfig {
    cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: name.into(),
            namespace: "default".into(),
            uid: format!("uid-{name}"),
            attempt: 0,
        }),
        hostname: name.into(),
        ..Default::default()
    }
}

fn container_config(name: &str) -> cri::ContainerConfig {
    cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata { name: name.into(), attempt: 0 }),
        image: Some(cri::ImageSpec { image: IMAGE.into(), ..Default::default() }),
        command: vec!["/app".into()],
        ..Default::default()
    }
}

/// The entries of a directory of the runtime's state (sandboxes, containers, ev).
fn entries(runtime: &Runtime, dir: &str) -> Vec<PathBuf> {
    let base = if dir == "layers" { &runtime.config.root } else { &runtime.config.state };
    std::fs::read_dir(base.join(dir)).map(|r| r.flatten().map(|e| e.path()).collect()).unwrap_or_default()
}

/// Nothing of any sandbox or container is left: in the engine, on disk, in the state.
async fn assert_nothing_left(runtime: &Runtime, engine: &FakeEngine, after: &str) {
    assert_eq!(engine.held(), (0, 0, 0), "engine objects (sandboxes, containers, roots) after {after}");
    for dir in ["sandboxes", "containers", "layers", "ev"] {
        assert!(entries(runtime, dir).is_empty(), "{dir} after {after}: {:?}", entries(runtime, dir));
    }
    let state = runtime.state.lock().await;
    assert!(state.sandboxes.is_empty() && state.containers.is_empty(), "state after {after}");
}

async fn container_state(runtime: &Runtime, id: &str) -> (cri::ContainerState, i32) {
    let state = runtime.state.lock().await;
    let c = &state.containers[id];
    (c.state, c.exit_code)
}

/// Waits for the container to be marked exited (the fake's pause reports it on its channel).
async fn exited(runtime: &Runtime, id: &str) -> i32 {
    for _ in 0..500 {
        if let (cri::ContainerState::ContainerExited, code) = container_state(runtime, id).await {
            return code;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("container {id} never exited");
}

#[tokio::test]
async fn a_pod_runs_and_goes_in_the_engine_calls_a_kubelet_expects() {
    let dir = tempfile::tempdir().expect("tempdir");
    let engine = Arc::new(FakeEngine::default());
    let runtime = runtime(dir.path(), &engine);

    let sandbox = runtime.run_sandbox(sandbox_config("web")).await.expect("run sandbox");
    let container = runtime.create_container(&sandbox, container_config("app")).await.expect("create");
    assert_eq!(container_state(&runtime, &container).await.0, cri::ContainerState::ContainerCreated);
    runtime.start_container(&container).await.expect("start");
    assert_eq!(container_state(&runtime, &container).await.0, cri::ContainerState::ContainerRunning);
    engine.exit(&container, 3);
    assert_eq!(exited(&runtime, &container).await, 3, "the exit the pause reported");
    runtime.stop_sandbox(&sandbox).await.expect("stop sandbox");
    runtime.remove_sandbox(&sandbox).await.expect("remove sandbox");

    assert_eq!(
        engine.calls(),
        [
            "start_sandbox",
            "sandbox_pid",
            "loopback_up",
            "prepare_root",
            "create_container",
            "start_container",
            // stop: the pause is running, so TERM, then it is seen gone
            "sandbox_state",
            "kill_sandbox",
            "sandbox_state",
            // remove stops again (already stopped), then removes the container and the sandbox
            "sandbox_state",
            "delete_container",
            "unmount",
            "delete_sandbox",
        ]
    );
    assert_nothing_left(&runtime, &engine, "remove").await;
}

#[tokio::test]
async fn stopping_a_running_container_terms_it_and_a_zero_timeout_kills() {
    let dir = tempfile::tempdir().expect("tempdir");
    let engine = Arc::new(FakeEngine::default());
    let runtime = runtime(dir.path(), &engine);
    let sandbox = runtime.run_sandbox(sandbox_config("web")).await.expect("run sandbox");

    let graceful = runtime.create_container(&sandbox, container_config("a")).await.expect("create a");
    runtime.start_container(&graceful).await.expect("start a");
    runtime.stop_container(&graceful, 30).await.expect("stop a");
    assert_eq!(exited(&runtime, &graceful).await, 128 + 15);

    let killed = runtime.create_container(&sandbox, container_config("b")).await.expect("create b");
    runtime.start_container(&killed).await.expect("start b");
    runtime.stop_container(&killed, 0).await.expect("stop b");
    assert_eq!(exited(&runtime, &killed).await, 128 + 9);
    let calls = engine.calls();
    assert!(
        calls.contains(&"kill_container".to_owned()) && calls.contains(&"kill_container_kill".to_owned())
    );
    assert_eq!(calls.iter().filter(|c| c.starts_with("kill_container")).count(), 2, "{calls:?}");

    // Stopping again, or an unknown container, succeeds and signals nothing.
    runtime.stop_container(&killed, 0).await.expect("stop again");
    runtime.stop_container("nonexistent", 0).await.expect("stop unknown");
    assert_eq!(engine.calls().len(), calls.len());
    runtime.remove_sandbox(&sandbox).await.expect("remove");
    assert_nothing_left(&runtime, &engine, "remove").await;
}

/// A failure at each engine step of RunPodSandbox: the request fails with the engine's reason,
/// and nothing half-made stays.
#[tokio::test]
async fn a_sandbox_that_fails_at_any_step_leaves_nothing() {
    for step in ["start_sandbox", "sandbox_pid", "loopback_up"] {
        let dir = tempfile::tempdir().expect("tempdir");
        let engine = Arc::new(FakeEngine::default());
        let runtime = runtime(dir.path(), &engine);
        engine.fail(step);
        let err = runtime.run_sandbox(sandbox_config("web")).await.expect_err(step);
        assert!(err.to_string().contains(step), "{step}: {err}");
        assert_eq!(engine.calls().last().map(String::as_str), Some("delete_sandbox"), "{step}");
        assert_nothing_left(&runtime, &engine, step).await;
        // The same pod can be asked for again.
        engine.pass();
        let id = runtime.run_sandbox(sandbox_config("web")).await.expect("run again");
        runtime.remove_sandbox(&id).await.expect("remove");
        assert_nothing_left(&runtime, &engine, "a second try").await;
    }
}

/// A failure at each engine step of CreateContainer: nothing of the container stays, and the
/// sandbox is untouched.
#[tokio::test]
async fn a_container_that_fails_at_any_step_leaves_nothing() {
    for step in ["prepare_root", "create_container"] {
        let dir = tempfile::tempdir().expect("tempdir");
        let engine = Arc::new(FakeEngine::default());
        let runtime = runtime(dir.path(), &engine);
        let sandbox = runtime.run_sandbox(sandbox_config("web")).await.expect("run sandbox");
        engine.fail(step);
        let err = runtime.create_container(&sandbox, container_config("app")).await.expect_err(step);
        assert!(err.to_string().contains(step), "{step}: {err}");
        assert_eq!(engine.held(), (1, 0, 0), "{step}: only the sandbox");
        assert!(entries(&runtime, "containers").is_empty(), "{step}: {:?}", entries(&runtime, "containers"));
        assert!(runtime.state.lock().await.containers.is_empty());
        engine.pass();
        let id = runtime.create_container(&sandbox, container_config("app")).await.expect("create again");
        runtime.remove_container(&id).await.expect("remove container");
        runtime.remove_sandbox(&sandbox).await.expect("remove sandbox");
        assert_nothing_left(&runtime, &engine, step).await;
    }
}

/// A start that fails leaves the container created (the kubelet removes it); removing it then
/// leaves nothing. A remove that fails keeps everything for the retry, which then succeeds.
#[tokio::test]
async fn failed_starts_and_removes_keep_what_a_retry_needs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let engine = Arc::new(FakeEngine::default());
    let runtime = runtime(dir.path(), &engine);
    let sandbox = runtime.run_sandbox(sandbox_config("web")).await.expect("run sandbox");
    let container = runtime.create_container(&sandbox, container_config("app")).await.expect("create");
    engine.fail("start_container");
    runtime.start_container(&container).await.expect_err("start fails");
    assert_eq!(container_state(&runtime, &container).await.0, cri::ContainerState::ContainerCreated);

    engine.fail("delete_container");
    runtime.remove_container(&container).await.expect_err("remove fails");
    assert_eq!(engine.held(), (1, 1, 1), "kept for the retry");
    assert!(runtime.state.lock().await.containers.contains_key(&container));
    engine.fail("delete_sandbox");
    runtime.remove_sandbox(&sandbox).await.expect_err("remove sandbox fails");
    assert!(runtime.state.lock().await.sandboxes.contains_key(&sandbox), "kept for the retry");

    engine.pass();
    runtime.remove_sandbox(&sandbox).await.expect("remove sandbox again");
    assert_nothing_left(&runtime, &engine, "the retries").await;
}

/// A restarted runtime: a create it never finished (a directory without records) is removed
/// with what the engine may hold of it and its writable layer, and so is a writable layer whose
/// container's directory is gone (a state tmpfs that did not outlive its bubble); a sandbox
/// whose pause is gone is not ready, and its running container exited with it; both can then
/// be removed.
#[tokio::test]
async fn recovery_removes_half_made_containers_and_marks_dead_sandboxes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let engine = Arc::new(FakeEngine::default());
    let first = runtime(dir.path(), &engine);
    let sandbox = first.run_sandbox(sandbox_config("web")).await.expect("run sandbox");
    let container = first.create_container(&sandbox, container_config("app")).await.expect("create");
    first.start_container(&container).await.expect("start");
    engine.pause_dies_unseen(&sandbox);
    let half = first.config.state.join("containers").join("f".repeat(64));
    std::fs::create_dir_all(half.join("bundle")).expect("half-made container");
    let half_layer = first.writable_dir(&"f".repeat(64));
    std::fs::create_dir_all(half_layer.join("upper")).expect("its writable layer");
    let orphan = first.writable_dir(&"e".repeat(64));
    std::fs::create_dir_all(orphan.join("upper/tmp")).expect("a layer without a container");
    let kept_layer = first.writable_dir(&container);
    assert!(kept_layer.join("upper").is_dir(), "the container's writable layer is under the root");
    drop(first);

    let second = runtime_with_store(dir.path(), &engine, "images-2");
    let before = engine.calls().len();
    let found = second.recover().await.expect("recover");
    assert_eq!(
        (found.running_sandboxes, found.stopped_sandboxes, found.containers, found.removed),
        (0, 1, 1, 2)
    );
    assert!(!half.exists(), "the half-made container's directory");
    assert!(!half_layer.exists(), "the half-made container's writable layer");
    assert!(!orphan.exists(), "the writable layer no container has");
    assert!(kept_layer.join("upper").is_dir(), "the recovered container keeps its writable layer");
    assert_eq!(engine.calls()[before..], ["delete_container", "unmount", "sandbox_state"]);
    {
        let state = second.state.lock().await;
        assert!(!state.sandboxes[&sandbox].ready);
        let c = &state.containers[&container];
        assert_eq!((c.state, c.exit_code), (cri::ContainerState::ContainerExited, 137));
        assert!(c.reason.contains("while hpk-pod-runtime was down"), "{}", c.reason);
    }
    second.remove_sandbox(&sandbox).await.expect("remove");
    assert_nothing_left(&second, &engine, "recovery and remove").await;
}
