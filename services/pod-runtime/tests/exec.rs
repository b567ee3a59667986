//! ExecSync through the real `crictl exec -s`: output, exit codes, the sandbox's hostname and
//! PID namespace, a command that does not exist, a timeout that leaves nothing running, and a
//! stopped container.

mod support;

use std::time::{Duration, Instant};

use support::{CRICTL_TOOLS, Runtime, registry_with_shell_image, tools_present, write_json};

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
