//! GPUs in pods on `hpk up` (a test host, checked with the real kubectl), with GPUs the test
//! makes: character devices 195:N as NVIDIA's, and a driver root with a fake `libnvidia-ml`
//! and `nvidia-smi`, found through `HPK_NVIDIA_DEV_DIR` and `HPK_NVIDIA_DRIVER_ROOT`. `hpk up`
//! gives the machine's two GPUs to its worker; the Nodes offer what they have; a pod that asks
//! for `nvidia.com/gpu` gets exactly that many of its node's devices, the driver's files and
//! `NVIDIA_VISIBLE_DEVICES`/`CUDA_VISIBLE_DEVICES` numbered from 0; two pods never share one;
//! a pod without the request sees none; asking for more than a node has, or for any on the
//! node without GPUs, is refused at admission with the reason.

mod support;

use std::process::Command;
use std::time::Duration;

use support::{Env, eventually, prerequisites, text};

const CLUSTER: &str = "gpus";

/// Makes character device `path` (major, minor); false where this user may not.
fn mknod(path: &std::path::Path, major: u32, minor: u32) -> bool {
    Command::new("mknod")
        .arg(path)
        .args(["c", &major.to_string(), &minor.to_string()])
        .status()
        .is_ok_and(|s| s.success())
}

fn pod(name: &str, node: &str, gpus: Option<u32>, image: &str) -> String {
    let resources =
        gpus.map_or(String::new(), |n| format!("\n    resources: {{limits: {{nvidia.com/gpu: {n}}}}}"));
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  nodeName: {node}\n  \
         terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: {image}\n    \
         command: [sleep, '3600']{resources}\n"
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn pods_get_exactly_their_gpus() {
    let Some(image) = prerequisites() else { return };
    let fake = tempfile::Builder::new().prefix("hpk-gpus-").tempdir().expect("tempdir");
    let dev = fake.path().join("dev");
    std::fs::create_dir(&dev).expect("mkdir");
    if !(mknod(&dev.join("nvidia0"), 195, 0)
        && mknod(&dev.join("nvidia1"), 195, 1)
        && mknod(&dev.join("nvidiactl"), 195, 255))
    {
        hpk_test_support::skip("mknod needs CAP_MKNOD (CI runs as root)");
        return;
    }
    let driver = fake.path().join("driver");
    let lib = driver.join("usr/lib/x86_64-linux-gnu");
    std::fs::create_dir_all(&lib).expect("mkdir");
    std::fs::write(lib.join("libnvidia-ml.so.550.54.15"), "fake NVML\n").expect("write");
    std::os::unix::fs::symlink("libnvidia-ml.so.550.54.15", lib.join("libnvidia-ml.so.1")).expect("link");
    std::fs::create_dir_all(driver.join("usr/bin")).expect("mkdir");
    let smi = driver.join("usr/bin/nvidia-smi");
    std::fs::write(
        &smi,
        "#!/bin/sh\necho \"fake nvidia-smi: $(cat /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1)\"\n",
    )
    .expect("write");
    std::fs::set_permissions(&smi, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");

    let env = Env::start(image).await;
    let out = env
        .up_command(CLUSTER, 2)
        .env("HPK_NVIDIA_DEV_DIR", &dev)
        .env("HPK_NVIDIA_DRIVER_ROOT", &driver)
        .env_remove("CUDA_VISIBLE_DEVICES")
        .output()
        .expect("hpk up");
    assert!(out.status.success(), "hpk up: {}", text(&out));
    assert!(
        text(&out).contains("GPUs [0, 1]: gpus-1 [], gpus-2 [0, 1]"),
        "up says how it shared them: {}",
        text(&out)
    );
    let offered = |node: &str| {
        env.kubectl_ok(
            CLUSTER,
            &["get", "node", node, "-o", "jsonpath={.status.allocatable.nvidia\\.com/gpu}"],
        )
    };
    assert_eq!(offered("gpus-1"), "", "the controller offers none");
    assert_eq!(offered("gpus-2"), "2");

    let shell = env.shell.clone();
    env.apply(
        CLUSTER,
        &[
            pod("a", "gpus-2", Some(1), &shell),
            pod("b", "gpus-2", Some(1), &shell),
            pod("plain", "gpus-2", None, &shell),
        ]
        .join("---\n"),
    );
    let running = |name: &str| {
        eventually(&format!("pod {name} Running"), Duration::from_secs(120), || {
            let phase = env.kubectl_ok(CLUSTER, &["get", "pod", name, "-o", "jsonpath={.status.phase}"]);
            (phase == "Running").then_some(())
        })
    };
    for name in ["a", "b", "plain"] {
        running(name);
    }
    let exec = |name: &str, script: &str| env.kubectl_ok(CLUSTER, &["exec", name, "--", "sh", "-c", script]);
    let devices = |name: &str| exec(name, "ls /dev | grep '^nvidia[0-9]' || true");
    let (a, b) = (devices("a"), devices("b"));
    assert_eq!(a.lines().count(), 1, "pod a: {a}");
    assert_eq!(b.lines().count(), 1, "pod b: {b}");
    assert_ne!(a, b, "two pods share a GPU");
    let mut both: Vec<&str> = a.lines().chain(b.lines()).collect();
    both.sort_unstable();
    assert_eq!(both, ["nvidia0", "nvidia1"]);
    assert_eq!(devices("plain"), "", "a pod without the request sees a GPU");
    assert!(exec("plain", "ls /dev").lines().all(|l| !l.starts_with("nvidia")), "nor nvidiactl");
    // The device, its control device, the driver's files and the variables.
    let seen = exec(
        "a",
        "ls -l /dev/nvidia* | awk '{print $1, $5, $6}'; echo VISIBLE=$NVIDIA_VISIBLE_DEVICES/$CUDA_VISIBLE_DEVICES; nvidia-smi",
    );
    let minor = a.trim().trim_start_matches("nvidia");
    assert!(seen.contains("crw") && seen.contains(&format!("195, {minor}")), "{seen}");
    assert!(seen.contains("195, 255"), "nvidiactl: {seen}");
    assert!(seen.contains("VISIBLE=0/0"), "{seen}");
    assert!(seen.contains("fake nvidia-smi: fake NVML"), "the driver's tool and library: {seen}");

    // Over-asking, by pods bound to their node (no scheduler to hold them): refused by the
    // kubelet at admission, saying why; a third one-GPU pod on the full worker too.
    env.apply(
        CLUSTER,
        &[
            pod("on-controller", "gpus-1", Some(1), &shell),
            pod("third", "gpus-2", Some(1), &shell),
            pod("greedy", "gpus-2", Some(3), &shell),
        ]
        .join("---\n"),
    );
    for name in ["on-controller", "third", "greedy"] {
        let (phase, reason, message) =
            eventually(&format!("pod {name} refused"), Duration::from_secs(60), || {
                let out = env.kubectl_ok(
                    CLUSTER,
                    &[
                        "get",
                        "pod",
                        name,
                        "-o",
                        "jsonpath={.status.phase}|{.status.reason}|{.status.message}",
                    ],
                );
                let parts: Vec<String> = out.split('|').map(str::to_owned).collect();
                (parts.len() == 3 && parts[0] == "Failed")
                    .then(|| (parts[0].clone(), parts[1].clone(), parts[2].clone()))
            });
        assert_eq!(phase, "Failed");
        assert_eq!(reason, "UnexpectedAdmissionError", "{name}: {message}");
        assert!(message.contains("nvidia.com/gpu"), "{name}: {message}");
    }

    // Freed with its pod: another gets the device.
    env.kubectl_ok(CLUSTER, &["delete", "pod", "a", "--wait=true"]);
    env.apply(CLUSTER, &pod("next", "gpus-2", Some(1), &shell));
    running("next");
    assert_eq!(devices("next"), a, "the freed GPU");
    let out = env.down(CLUSTER);
    assert!(out.status.success(), "hpk down: {}", text(&out));
}
