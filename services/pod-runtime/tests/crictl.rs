//! The real `crictl` drives the real `hpk-pod-runtime` (with the real hpk-pause and crun) and
//! an image from a real local registry: pull, images, runp, create, start, ps, logs, inspect,
//! stop, rm, stopp, rmp, rmi, and the errors of bad requests.

mod support;

use std::time::{Duration, Instant};

use support::{CRICTL_TOOLS, Runtime, registry_with_shell_image, tools_present, write_json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crictl_runs_a_pod_from_the_local_registry() {
    if !tools_present(CRICTL_TOOLS) {
        return;
    }
    let (registry, reference, image) = registry_with_shell_image().await;

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
    if !tools_present(CRICTL_TOOLS) {
        return;
    }
    let (registry, reference, _) = registry_with_shell_image().await;
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
        // A command that is not in the image: the container starts and exits 127, the reason in
        // its log, as a shell would have it.
        let missing_cmd = container("nocmd", serde_json::json!({"command": ["no-such-command"]}));
        let cid = rt.ok(&["create", &pod_id, &missing_cmd, &pod]);
        rt.ok(&["start", &cid]);
        let inspect: serde_json::Value =
            serde_json::from_str(&rt.ok(&["inspect", &cid])).expect("inspect JSON");
        assert_eq!(inspect["status"]["state"], "CONTAINER_EXITED", "{inspect}");
        assert_eq!(inspect["status"]["exitCode"], 127, "{inspect}");
        // crictl prints the container's stderr records on its own stderr.
        let log = String::from_utf8_lossy(&rt.crictl(&["logs", &cid]).stderr).into_owned();
        assert!(log.contains("`no-such-command` not found"), "log: {log:?}");
        rt.ok(&["rm", &cid]);
        // Nothing of the refused containers exists.
        assert_eq!(rt.ok(&["ps", "-a", "-q"]), "");
        for dir in ["state/containers", "root/layers"] {
            let leftovers = std::fs::read_dir(tmp.path().join(dir)).expect("containers dir").count();
            assert_eq!(leftovers, 0, "{dir}");
        }
        rt.ok(&["rmp", "-f", &pod_id]);
    });
}

/// The mount points every container gets (`/proc`, `/dev`, `/sys`, the pod's `/etc/hosts`,
/// `hostname` and `resolv.conf`) come from a shared layer below the image where the image lacks
/// them, so a container that writes nothing leaves its writable layer empty; where an image has
/// a path, or hides it with a whiteout, the image's view is what the container sees. Once
/// created, the container's root is mounted in its own namespace only, not the runtime's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mount_points_the_image_lacks_are_not_made_in_the_writable_layer() {
    use hpk_integration::image::{ImageConfig, LayerBuilder, build_image, busybox_layer};
    if !tools_present(CRICTL_TOOLS) {
        return;
    }
    let (registry, plain, _) = registry_with_shell_image().await;
    // An image whose /etc is 0750 and whose top layer hides /etc/hostname (a whiteout).
    let mut top = LayerBuilder::new();
    top.dir("etc", 0o750).unwrap().file("etc/.wh.hostname", "", 0o644).unwrap();
    let config = ImageConfig {
        cmd: vec!["sh".to_owned()],
        env: vec!["PATH=/bin".to_owned()],
        ..ImageConfig::default()
    };
    let image = build_image(vec![busybox_layer().unwrap(), top.build().unwrap()], &config).unwrap();
    hpk_integration::registry::Client::new(&registry.url())
        .unwrap()
        .push("hpk/hidden", "v1", &image)
        .await
        .expect("push");
    let hidden = format!("{}/hpk/hidden:v1", registry.host_port());

    let tmp = tempfile::tempdir().expect("tempdir");
    let rt = tokio::task::block_in_place(|| Runtime::start(tmp.path(), &registry.host_port()));
    tokio::task::block_in_place(|| {
        let pod = write_json(
            &tmp.path().join("pod.json"),
            serde_json::json!({
                "metadata": {"name": "points", "namespace": "default", "uid": "uid-points", "attempt": 0},
                "hostname": "points-host",
                "log_directory": tmp.path().join("logs"),
            }),
        );
        let pod_id = rt.ok(&["runp", &pod]);
        let mut started = Vec::new();
        for (name, reference) in [("plain", &plain), ("hidden", &hidden)] {
            rt.ok(&["pull", reference]);
            let ctr = write_json(
                &tmp.path().join(format!("{name}.json")),
                serde_json::json!({
                    "metadata": {"name": name},
                    "image": {"image": reference},
                    "command": ["sh", "-c", "stat -c 'etc %a %u' /etc; echo \"name $(cat /etc/hostname)\"; ls -d /proc/self /sys/kernel; exec sleep 30"],
                    "log_path": format!("{name}.log"),
                }),
            );
            let id = rt.ok(&["create", &pod_id, &ctr, &pod]);
            rt.ok(&["start", &id]);
            started.push((name, id));
        }
        for (name, id) in &started {
            let deadline = Instant::now() + Duration::from_secs(15);
            let out = loop {
                let out = rt.ok(&["logs", id]);
                if out.contains("/sys/kernel") {
                    break out;
                }
                assert!(Instant::now() < deadline, "{name}: logs so far: {out}");
                std::thread::sleep(Duration::from_millis(100));
            };
            // The container's root is the container's own: the runtime's mount namespace,
            // which every later crun run copies, no longer holds it.
            let ours = std::fs::read_to_string(format!("/proc/{}/mountinfo", rt.pid())).expect("mountinfo");
            assert!(
                !ours.contains(id.as_str()),
                "{name}: the runtime still mounts the container's root: {ours}"
            );
            assert!(rt.ok(&["exec", "-s", id, "cat", "/etc/passwd"]).contains("root:x:0:0"), "{name}");
            let mode = if *name == "plain" { "etc 755 0" } else { "etc 750 0" };
            assert!(out.contains(mode), "{name}: the image's /etc shows: {out}");
            assert!(out.contains("name points-host"), "{name}: the pod's hostname is mounted: {out}");
            assert!(out.contains("/proc/self"), "{name}: {out}");
            // What the container's writable layer holds, relative to its `upper`.
            let upper = tmp.path().join("root/layers").join(id).join("upper");
            let mut made: Vec<String> = walk(&upper)
                .into_iter()
                .map(|p| p.strip_prefix(&upper).unwrap().display().to_string())
                .collect();
            made.sort();
            if *name == "plain" {
                assert!(
                    made.is_empty(),
                    "a container that wrote nothing left {made:?} in its writable layer"
                );
            } else {
                // The whiteout hides the shared layer's hostname: crun makes it, as without one.
                assert_eq!(
                    made,
                    ["etc", "etc/hostname"],
                    "the hidden mount point is made where it always was"
                );
            }
        }
        let points = tmp.path().join("state/mount-points");
        let layers: Vec<String> = std::fs::read_dir(&points)
            .expect("mount points")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(layers, ["v1-7"], "one layer, made once, for containers given the same mount points");
        for (_, id) in &started {
            rt.ok(&["rm", "-f", id]);
        }
        rt.ok(&["rmp", "-f", &pod_id]);
        let left = std::fs::read_dir(tmp.path().join("root/layers")).expect("layers").count();
        assert_eq!(left, 0, "the writable layers go with their containers");
    });
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut all = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        all.push(entry.path());
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            all.extend(walk(&entry.path()));
        }
    }
    all
}
