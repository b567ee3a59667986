//! ReopenContainerLog: after the kubelet rotates a container's log away, output continues in a
//! new file at the same path; a stopped container's log is not recreated.

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use k8s_cri::v1 as cri;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use support::{CRICTL_TOOLS, Runtime, registry_with_shell_image, tools_present, write_json};

fn wait_for_lines(path: &Path, what: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.contains("stdout F line") {
            return text;
        }
        assert!(Instant::now() < deadline, "no output in {what} ({})", path.display());
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reopened_logs_continue_in_a_new_file() {
    if !tools_present(CRICTL_TOOLS) {
        return;
    }
    let (registry, reference, _) = registry_with_shell_image().await;
    let tmp = tempfile::tempdir().expect("tempdir");
    let rt = tokio::task::block_in_place(|| Runtime::start(tmp.path(), &registry.host_port()));
    let logs = tmp.path().join("logs/rotate");
    let (pod_id, ctr_id) = tokio::task::block_in_place(|| {
        rt.ok(&["pull", &reference]);
        let pod = write_json(
            &tmp.path().join("pod.json"),
            serde_json::json!({
                "metadata": {"name": "rotate", "namespace": "default", "uid": "uid-3", "attempt": 0},
                "log_directory": logs,
            }),
        );
        let pod_id = rt.ok(&["runp", &pod]);
        let ctr = write_json(
            &tmp.path().join("ctr.json"),
            serde_json::json!({
                "metadata": {"name": "ticker"},
                "image": {"image": reference},
                "command": ["sh", "-c", "i=0; while :; do echo line $i; i=$((i+1)); sleep 0.05; done"],
                "log_path": "ticker/0.log",
            }),
        );
        let ctr_id = rt.ok(&["create", &pod_id, &ctr, &pod]);
        rt.ok(&["start", &ctr_id]);
        (pod_id, ctr_id)
    });
    let current = logs.join("ticker/0.log");
    let rotated = logs.join("ticker/0.log.20261129");
    tokio::task::block_in_place(|| wait_for_lines(&current, "the first log"));
    std::fs::rename(&current, &rotated).expect("rotate");

    let channel = hpk_rpc::connect::unix(rt.socket()).await.expect("connect");
    let mut client = RuntimeServiceClient::new(channel);
    client
        .reopen_container_log(cri::ReopenContainerLogRequest { container_id: ctr_id.clone() })
        .await
        .expect("reopen");
    tokio::task::block_in_place(|| wait_for_lines(&current, "the reopened log"));
    let rotated_len = std::fs::metadata(&rotated).expect("rotated").len();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        std::fs::metadata(&rotated).expect("rotated").len(),
        rotated_len,
        "the old file stops growing"
    );

    tokio::task::block_in_place(|| rt.ok(&["stop", "--timeout", "1", &ctr_id]));
    std::fs::remove_file(&current).expect("remove");
    let status = client
        .reopen_container_log(cri::ReopenContainerLogRequest { container_id: ctr_id.clone() })
        .await
        .expect_err("a stopped container's log is not reopened");
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    assert!(!current.exists(), "no new log file for a stopped container");
    tokio::task::block_in_place(|| rt.ok(&["rmp", "-f", &pod_id]));
}

/// A container that ends right after writing a lot: once the runtime says it exited, its log
/// holds all of its output (the kubelet reads it then: `kubectl logs` of a finished Job, the
/// termination message's fallback to the log). Its last output is still in the pipe, on its
/// way through the shim, when the process ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exited_containers_log_holds_all_its_output() {
    if !tools_present(CRICTL_TOOLS) {
        return;
    }
    let (registry, reference, _) = registry_with_shell_image().await;
    let tmp = tempfile::tempdir().expect("tempdir");
    let rt = tokio::task::block_in_place(|| Runtime::start(tmp.path(), &registry.host_port()));
    tokio::task::block_in_place(|| {
        rt.ok(&["pull", &reference]);
        let pod = write_json(
            &tmp.path().join("pod.json"),
            serde_json::json!({
                "metadata": {"name": "burst", "namespace": "default", "uid": "uid-4", "attempt": 0},
                "log_directory": tmp.path().join("logs/burst"),
            }),
        );
        let pod_id = rt.ok(&["runp", &pod]);
        for attempt in 0..10 {
            let ctr = write_json(
                &tmp.path().join("ctr.json"),
                serde_json::json!({
                    "metadata": {"name": "burst", "attempt": attempt},
                    "image": {"image": reference},
                    "command": ["seq", "1", "50000"],
                    "log_path": format!("burst/{attempt}.log"),
                }),
            );
            let id = rt.ok(&["create", &pod_id, &ctr, &pod]);
            rt.ok(&["start", &id]);
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let inspect: serde_json::Value =
                    serde_json::from_str(&rt.ok(&["inspect", &id])).expect("inspect JSON");
                if inspect["status"]["state"] == "CONTAINER_EXITED" {
                    break;
                }
                assert!(Instant::now() < deadline, "container {id} still runs: {inspect}");
                std::thread::sleep(Duration::from_millis(5));
            }
            let log = std::fs::read_to_string(tmp.path().join(format!("logs/burst/burst/{attempt}.log")))
                .expect("the log");
            let lines = log.lines().count();
            let last = log.lines().last().unwrap_or_default().to_owned();
            assert!(
                lines == 50_000 && last.ends_with(" stdout F 50000"),
                "attempt {attempt}: {lines} of 50000 lines in the log when the container was seen exited; the last: {last:?}"
            );
            rt.ok(&["rm", &id]);
        }
    });
}
