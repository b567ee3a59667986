//! Seccomp through the real crun (review M6): a RuntimeDefault container runs under
//! containerd's profile — ordinary work runs, `unshare -U` (a user namespace, which needs
//! CAP_SYS_ADMIN under the profile) fails with EPERM, in the container's own process and in an
//! exec — while a container asking for Unconfined, or naming no profile, runs without a filter.

mod support;

use std::time::{Duration, Instant};

use support::{CRICTL_TOOLS, Runtime, registry_with_shell_image, tools_present, write_json};

/// The container's first lines, then it sleeps for the execs.
const SCRIPT: &str =
    "grep Seccomp: /proc/self/status; unshare -U true 2>&1; echo \"unshare exited $?\"; exec sleep 300";

/// Creates and starts container `name` in the pod with the CRI `security_context`; returns its
/// ID once its script has printed.
fn start(
    rt: &Runtime,
    dir: &std::path::Path,
    pod: &(String, String),
    name: &str,
    reference: &str,
    security_context: serde_json::Value,
) -> String {
    let config = serde_json::json!({
        "metadata": {"name": name},
        "image": {"image": reference},
        "command": ["sh", "-c", SCRIPT],
        "log_path": format!("{name}/0.log"),
        "linux": {"security_context": security_context},
    });
    let ctr = write_json(&dir.join(format!("{name}.json")), config);
    let id = rt.ok(&["create", &pod.0, &ctr, &pod.1]);
    rt.ok(&["start", &id]);
    let deadline = Instant::now() + Duration::from_secs(15);
    while !rt.ok(&["logs", &id]).contains("unshare exited") {
        assert!(Instant::now() < deadline, "{name} printed: {}\n{}", rt.ok(&["logs", &id]), rt.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_default_refuses_a_user_namespace_and_unconfined_allows_it() {
    if !tools_present(CRICTL_TOOLS) {
        return;
    }
    let (registry, reference, _) = registry_with_shell_image().await;
    let tmp = tempfile::tempdir().expect("tempdir");
    let rt = tokio::task::block_in_place(|| Runtime::start(tmp.path(), &registry.host_port()));
    tokio::task::block_in_place(|| {
        rt.ok(&["pull", &reference]);
        let pod_json = write_json(
            &tmp.path().join("pod.json"),
            serde_json::json!({
                "metadata": {"name": "seccomp", "namespace": "default", "uid": "uid-seccomp", "attempt": 0},
                "log_directory": tmp.path().join("logs"),
            }),
        );
        let pod = (rt.ok(&["runp", &pod_json]), pod_json);

        let run = |name: &str, security_context: serde_json::Value| {
            start(&rt, tmp.path(), &pod, name, &reference, security_context)
        };
        // profile_type 0 is RuntimeDefault (an empty profile says the same).
        let confined = run("confined", serde_json::json!({"seccomp": {"profile_type": 0}}));
        let log = rt.ok(&["logs", &confined]);
        assert!(log.contains("Seccomp:\t2"), "filtered: {log}");
        assert!(log.contains("Operation not permitted") && log.contains("unshare exited 1"), "{log}");
        // An exec runs under the same filter; ordinary work (fork, pipes, files) runs.
        let err = rt.fails(&["exec", "-s", &confined, "unshare", "-U", "true"]);
        assert!(err.contains("Operation not permitted"), "{err}");
        assert_eq!(rt.ok(&["exec", "-s", &confined, "sh", "-c", "echo a > /tmp/f; cat /tmp/f | wc -l"]), "1");

        // A container running as another user (crun loads the filter before it gives up its
        // capabilities) is filtered the same.
        let nobody = run(
            "nobody",
            serde_json::json!({"seccomp": {"profile_type": 0}, "run_as_user": {"value": 65534}}),
        );
        let log = rt.ok(&["logs", &nobody]);
        assert!(log.contains("Seccomp:\t2") && log.contains("Operation not permitted"), "{log}");

        // profile_type 1 is Unconfined.
        let unconfined = run("unconfined", serde_json::json!({"seccomp": {"profile_type": 1}}));
        let log = rt.ok(&["logs", &unconfined]);
        assert!(log.contains("Seccomp:\t0") && log.contains("unshare exited 0"), "{log}");
        rt.ok(&["exec", "-s", &unconfined, "unshare", "-U", "true"]);

        // No profile at all is the CRI's nil profile: unconfined (the kubelet sends
        // RuntimeDefault for a pod that names none).
        let nil = run("nil", serde_json::json!({}));
        assert!(rt.ok(&["logs", &nil]).contains("Seccomp:\t0"));

        rt.ok(&["stopp", &pod.0]);
        rt.ok(&["rmp", &pod.0]);
    });
}
