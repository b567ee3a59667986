//! Pod start latency (RunPodSandbox → CreateContainer → StartContainer returned, image present)
//! over CRI against the release `hpk-pod-runtime`, sequential and 10 at a time, with the
//! sequential run split into its three calls; the same with a GPU (a CDI device: a character
//! device 195:0 the bench makes and a fake driver's three files, from a spec the runtime reads)
//! and without, alternating in one run; the runtime's RSS with 100 pods; memory per sleeping
//! pod with 250 pods.
//!
//! Run (as root, with crun, docker-registry and busybox-static installed):
//! `cargo bench -p hpk-pod-runtime --bench pods`. With `HPK_BENCH_SAMPLES=FILE` every sample
//! is also appended to FILE (`measurement<TAB>milliseconds`), to pool runs and compare builds;
//! `HPK_BENCH_POD_RUNTIME=PATH` runs another build of the runtime. The runtime starts without
//! cargo's `LD_LIBRARY_PATH` (`HPK_BENCH_KEEP_LD_LIBRARY_PATH=1` keeps it), as in a bubble.
//!
//! The runtime's root is a temporary directory (`TMPDIR`: the node's disk, as the bubble's node
//! directory is). Its `--state` goes where the bubble puts it, on a tmpfs: a fresh directory in
//! `/dev/shm`, or in `HPK_BENCH_STATE=DIR`; `HPK_BENCH_STATE=root` leaves it in the root (the
//! runtime's default, and the only choice for a build without `--state`).

use std::net::{IpAddr, Ipv4Addr};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hpk_integration::registry::{Client, Registry};
use k8s_cri::v1 as cri;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use tonic::transport::Channel;

/// The runtime under test: this build's, or `HPK_BENCH_POD_RUNTIME` (another build's, to
/// compare with on the same machine).
fn runtime_binary() -> String {
    std::env::var("HPK_BENCH_POD_RUNTIME").unwrap_or_else(|_| env!("CARGO_BIN_EXE_hpk-pod-runtime").into())
}
const PAUSE: &str = env!("CARGO_BIN_EXE_hpk-pause");

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio");
    runtime.block_on(run());
}

/// Where the runtime's `--state` goes (see the module's comment); `None`: in its root.
fn state_dir() -> Option<tempfile::TempDir> {
    let base = match std::env::var("HPK_BENCH_STATE") {
        Ok(v) if v == "root" => return None,
        Ok(dir) => std::path::PathBuf::from(dir),
        Err(_) => "/dev/shm".into(),
    };
    Some(tempfile::Builder::new().prefix("hpk-bench-state").tempdir_in(&base).expect("state directory"))
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(self.0.id()).expect("pid")),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.0.wait();
    }
}

async fn run() {
    let registry = Registry::start(IpAddr::V4(Ipv4Addr::LOCALHOST), None).await.expect("registry");
    let image = hpk_integration::image::shell_image().expect("image");
    Client::new(&registry.url()).expect("client").push("hpk/shell", "v1", &image).await.expect("push");
    let reference = format!("{}/hpk/shell:v1", registry.host_port());

    let tmp = tempfile::tempdir().expect("tempdir");
    let socket = tmp.path().join("run/cri.sock");
    let cdi_dir = fake_gpu(tmp.path());
    let state = state_dir();
    match &state {
        Some(dir) => {
            println!("runtime root in {}, its --state in {}", tmp.path().display(), dir.path().display())
        }
        None => println!("runtime root and state in {}", tmp.path().display()),
    }
    let mut command = Command::new(runtime_binary());
    // cargo puts the build's directories on LD_LIBRARY_PATH, and crun would search them all for
    // each of its libraries on every run (about 140 failed opens a run); a bubble's runtime has
    // no such path. HPK_BENCH_KEEP_LD_LIBRARY_PATH=1 keeps it.
    if std::env::var_os("HPK_BENCH_KEEP_LD_LIBRARY_PATH").is_none() {
        command.env_remove("LD_LIBRARY_PATH");
    }
    if let Some(dir) = &state {
        command.arg(format!("--state={}", dir.path().display()));
    }
    let server = Server(
        command
            .arg(format!("--socket={}", socket.display()))
            .arg(format!("--root={}", tmp.path().join("root").display()))
            .arg(format!("--pause-binary={PAUSE}"))
            .arg(format!("--insecure-registry={}", registry.host_port()))
            .arg("--pod-grace-seconds=1")
            .arg(format!("--cdi-spec-dir={}", cdi_dir.display()))
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(tmp.path().join("runtime.log")).expect("log"))
            .spawn()
            .expect("start runtime"),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let channel = loop {
        if let Ok(channel) = hpk_rpc::connect::unix(&socket).await {
            let mut probe = RuntimeServiceClient::new(channel.clone());
            if probe.version(cri::VersionRequest::default()).await.is_ok() {
                break channel;
            }
        }
        assert!(
            Instant::now() < deadline,
            "runtime not serving:\n{}",
            std::fs::read_to_string(tmp.path().join("runtime.log")).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let mut images = ImageServiceClient::new(channel.clone());
    images
        .pull_image(cri::PullImageRequest {
            image: Some(cri::ImageSpec { image: reference.clone(), ..Default::default() }),
            ..Default::default()
        })
        .await
        .expect("pull");

    let mut ids = Vec::new();
    let mut sequential = Vec::new();
    let mut phases: [Vec<Duration>; 3] = Default::default();
    for i in 0..100 {
        let (started, id) = start_pod(channel.clone(), reference.clone(), format!("seq-{i}"), None).await;
        sequential.push(started.total());
        for (samples, phase) in phases.iter_mut().zip(started.phases) {
            samples.push(phase);
        }
        ids.push(id);
    }
    // With a GPU and without, alternating, so that both see the same machine.
    let (mut with_gpu, mut without_gpu) = (Vec::new(), Vec::new());
    for i in 0..100 {
        let gpu = (i % 2 == 1).then(|| "nvidia.com/gpu=0".to_owned());
        let (started, id) =
            start_pod(channel.clone(), reference.clone(), format!("gpu-{i}"), gpu.clone()).await;
        if gpu.is_some() {
            with_gpu.push(started.total())
        } else {
            without_gpu.push(started.total())
        }
        ids.push(id);
    }
    let rss_100 = rss_kib(server.0.id());
    let mut concurrent = Vec::new();
    for batch in 0..10 {
        let tasks: Vec<_> = (0..10)
            .map(|i| {
                tokio::spawn(start_pod(channel.clone(), reference.clone(), format!("par-{batch}-{i}"), None))
            })
            .collect();
        for task in tasks {
            let (started, id) = task.await.expect("task");
            concurrent.push(started.total());
            ids.push(id);
        }
    }
    let available_200 = mem_available_kib();
    for i in 0..50 {
        ids.push(start_pod(channel.clone(), reference.clone(), format!("more-{i}"), None).await.1);
    }
    let available_250 = mem_available_kib();
    let rss_250 = rss_kib(server.0.id());

    println!("| measurement | n | p50 | p99 | max |");
    println!("|---|---|---|---|---|");
    row("RunPodSandbox → container running, sequential", &mut sequential);
    for (name, samples) in ["RunPodSandbox", "CreateContainer", "StartContainer"].iter().zip(&mut phases) {
        row(&format!("  of which {name}, sequential"), samples);
    }
    row("RunPodSandbox → container running, 10 at a time", &mut concurrent);
    row("RunPodSandbox → container running, sequential, no GPU (alternating)", &mut without_gpu);
    row("RunPodSandbox → container running, sequential, one CDI GPU (alternating)", &mut with_gpu);
    println!();
    println!("runtime RSS with 100 pods: {:.1} MiB; with 250 pods: {:.1} MiB", mib(rss_100), mib(rss_250));
    let per_pod = available_200.saturating_sub(available_250) as f64 / 50.0;
    println!(
        "memory per sleeping pod (MemAvailable drop over pods 201–250, pause + sleep + page cache): {per_pod:.0} KiB"
    );

    let mut runtime = RuntimeServiceClient::new(channel);
    let removal = Instant::now();
    for id in &ids {
        runtime
            .remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: id.clone() })
            .await
            .expect("remove");
    }
    println!("removing {} pods took {:.1} s", ids.len(), removal.elapsed().as_secs_f64());
    drop(server);
}

/// How long each of a pod start's three calls took.
struct Started {
    phases: [Duration; 3],
}

impl Started {
    fn total(&self) -> Duration {
        self.phases.iter().sum()
    }
}

/// A fake GPU under `dir`: character device 195:0, a driver's library (a file and a link to it)
/// and tool, and a CDI spec `nvidia.com/gpu=0` naming them, in `dir/cdi`, which it returns.
fn fake_gpu(dir: &std::path::Path) -> std::path::PathBuf {
    let gpu = dir.join("gpu");
    std::fs::create_dir_all(gpu.join("lib")).expect("mkdir");
    nix::sys::stat::mknod(
        &gpu.join("nvidia0"),
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o666),
        nix::sys::stat::makedev(195, 0),
    )
    .expect("mknod (run as root)");
    for file in ["lib/libnvidia-ml.so.550.54.15", "lib/libcuda.so.550.54.15", "nvidia-smi"] {
        std::fs::write(gpu.join(file), "fake").expect("write");
    }
    let spec = serde_json::json!({
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": [{"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0", "hostPath": gpu.join("nvidia0")}]}}],
        "containerEdits": {
            "env": ["NVIDIA_DRIVER_CAPABILITIES=compute,utility"],
            "mounts": [
                {"hostPath": gpu.join("lib/libnvidia-ml.so.550.54.15"), "containerPath": "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", "options": ["ro", "bind"]},
                {"hostPath": gpu.join("lib/libcuda.so.550.54.15"), "containerPath": "/usr/lib/x86_64-linux-gnu/libcuda.so.1", "options": ["ro", "bind"]},
                {"hostPath": gpu.join("nvidia-smi"), "containerPath": "/usr/bin/nvidia-smi", "options": ["ro", "bind"]}
            ]
        }
    });
    let cdi = dir.join("cdi");
    std::fs::create_dir_all(&cdi).expect("mkdir");
    std::fs::write(cdi.join("gpu.json"), spec.to_string()).expect("write spec");
    cdi
}

/// Starts one pod with a sleeping container (with CDI device `gpu`, if any); returns the calls'
/// latencies and the sandbox ID.
async fn start_pod(
    channel: Channel,
    reference: String,
    name: String,
    gpu: Option<String>,
) -> (Started, String) {
    let mut runtime = RuntimeServiceClient::new(channel);
    let config = cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: name.clone(),
            namespace: "bench".into(),
            uid: name,
            attempt: 0,
        }),
        ..Default::default()
    };
    let start = Instant::now();
    let sandbox = runtime
        .run_pod_sandbox(cri::RunPodSandboxRequest { config: Some(config.clone()), ..Default::default() })
        .await
        .expect("run sandbox")
        .into_inner()
        .pod_sandbox_id;
    let sandboxed = Instant::now();
    let container = cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata { name: "sleep".into(), attempt: 0 }),
        image: Some(cri::ImageSpec { image: reference, ..Default::default() }),
        command: vec!["sleep".into(), "3600".into()],
        cdi_devices: gpu.into_iter().map(|name| cri::CdiDevice { name }).collect(),
        ..Default::default()
    };
    let id = runtime
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: sandbox.clone(),
            config: Some(container),
            sandbox_config: Some(config),
        })
        .await
        .expect("create")
        .into_inner()
        .container_id;
    let created = Instant::now();
    runtime.start_container(cri::StartContainerRequest { container_id: id }).await.expect("start");
    let phases = [sandboxed - start, created - sandboxed, created.elapsed()];
    (Started { phases }, sandbox)
}

fn row(name: &str, samples: &mut [Duration]) {
    record_samples(name, samples);
    samples.sort();
    let pick = |q: f64| samples[((samples.len() as f64 * q).ceil() as usize).saturating_sub(1)];
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "| {name} | {} | {:.1} ms | {:.1} ms | {:.1} ms |",
        samples.len(),
        ms(pick(0.5)),
        ms(pick(0.99)),
        ms(*samples.last().expect("samples"))
    );
}

/// Appends `samples` to `$HPK_BENCH_SAMPLES`, if set.
fn record_samples(name: &str, samples: &[Duration]) {
    let Some(path) = std::env::var_os("HPK_BENCH_SAMPLES") else { return };
    let lines: String =
        samples.iter().map(|d| format!("{}\t{:.3}\n", name.trim(), d.as_secs_f64() * 1e3)).collect();
    let mut file =
        std::fs::OpenOptions::new().create(true).append(true).open(path).expect("open samples file");
    std::io::Write::write_all(&mut file, lines.as_bytes()).expect("write samples");
}

fn rss_kib(pid: u32) -> u64 {
    status_field(&format!("/proc/{pid}/status"), "VmRSS:")
}

fn mem_available_kib() -> u64 {
    status_field("/proc/meminfo", "MemAvailable:")
}

fn status_field(path: &str, field: &str) -> u64 {
    let text = std::fs::read_to_string(path).expect("read /proc");
    text.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("field present")
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}
