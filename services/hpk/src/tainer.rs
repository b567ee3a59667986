//! `hpktainer run IMAGE [COMMAND…]` inside a bubble (`hpk tainer run` too): an ad-hoc container
//! through the bubble's pod-runtime, in a sandbox of its own with a pod address from the
//! net-forwarder — as the original's `hpktainer run docker://IMAGE` did. Its output is followed
//! until it exits; then the sandbox is removed and its address released. Interrupted (SIGINT,
//! SIGTERM), it stops the container and cleans up the same way.
//!
//! The sandbox carries the label `hpk.io/hpktainer`, which the kubelet leaves alone.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_cri::v1 as cri;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use tonic::transport::Channel;

use crate::error::{Error, Result};

/// The label marking an hpktainer sandbox.
pub const LABEL: &str = "hpk.io/hpktainer";
/// The runtime's socket inside a bubble.
pub const CRI_SOCKET: &str = "/run/hpk/cri.sock";

/// `hpktainer` commands.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum TainerCmd {
    /// Run IMAGE (optionally COMMAND…) in a sandbox with a pod address; follow its output.
    Run(RunArgs),
}

/// `hpktainer run` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// The image (`docker://` is accepted and dropped, as the original's users type it).
    pub image: String,
    /// The command and its arguments (default: the image's).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub command: Vec<String>,
    /// The runtime's CRI socket.
    #[arg(long, default_value = CRI_SOCKET)]
    pub socket: PathBuf,
}

/// Runs the container; returns its exit code.
pub async fn run(args: &RunArgs) -> Result<i32> {
    let image = args.image.strip_prefix("docker://").unwrap_or(&args.image).to_owned();
    if image.is_empty() {
        return Err(Error::Invalid("hpktainer run needs an image".into()));
    }
    let channel = hpk_rpc::connect::unix(&args.socket).await.map_err(|e| Error::Failed {
        what: format!("the pod runtime at {}", args.socket.display()),
        detail: format!("{e} (hpktainer runs inside a bubble: `hpk shell NODE`)"),
    })?;
    let mut runtime = RuntimeServiceClient::new(channel.clone());
    let mut images = ImageServiceClient::new(channel);
    let mut id = [0u8; 4];
    getrandom::fill(&mut id)
        .map_err(|e| Error::io("generate", "a name", std::io::Error::other(e.to_string())))?;
    let name = format!("hpktainer-{}", hex::encode(id));
    let logs = PathBuf::from(crate::bubble::spec::NODE_DIR).join("hpktainer").join(&name);
    std::fs::create_dir_all(&logs).map_err(|e| Error::io("create", logs.display(), e))?;
    let labels: std::collections::HashMap<String, String> = [(LABEL.to_owned(), "true".to_owned())].into();
    let sandbox_config = cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: name.clone(),
            uid: name.clone(),
            namespace: "hpktainer".into(),
            attempt: 0,
        }),
        hostname: name.clone(),
        log_directory: logs.display().to_string(),
        labels: labels.clone(),
        ..Default::default()
    };
    let status =
        |e: tonic::Status| Error::Failed { what: "the pod runtime".into(), detail: e.message().to_owned() };
    images
        .pull_image(cri::PullImageRequest {
            image: Some(cri::ImageSpec { image: image.clone(), ..Default::default() }),
            ..Default::default()
        })
        .await
        .map_err(|e| Error::Failed { what: format!("pulling {image}"), detail: e.message().to_owned() })?;
    let sandbox = runtime
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(sandbox_config.clone()),
            runtime_handler: String::new(),
        })
        .await
        .map_err(status)?
        .into_inner()
        .pod_sandbox_id;
    let result = run_in(&mut runtime, &sandbox, &sandbox_config, &image, &args.command, &logs, &labels).await;
    // Always: the sandbox goes, and with it the address.
    let _ = runtime.stop_pod_sandbox(cri::StopPodSandboxRequest { pod_sandbox_id: sandbox.clone() }).await;
    let removed = runtime.remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: sandbox }).await;
    let _ = std::fs::remove_dir_all(&logs);
    if let Err(e) = removed {
        eprintln!("hpktainer: removing the sandbox failed: {}", e.message());
    }
    result
}

async fn run_in(
    runtime: &mut RuntimeServiceClient<Channel>,
    sandbox: &str,
    sandbox_config: &cri::PodSandboxConfig,
    image: &str,
    command: &[String],
    logs: &Path,
    labels: &std::collections::HashMap<String, String>,
) -> Result<i32> {
    let status =
        |e: tonic::Status| Error::Failed { what: "the pod runtime".into(), detail: e.message().to_owned() };
    let address = runtime
        .pod_sandbox_status(cri::PodSandboxStatusRequest {
            pod_sandbox_id: sandbox.to_owned(),
            verbose: false,
        })
        .await
        .map_err(status)?
        .into_inner()
        .status
        .and_then(|s| s.network)
        .map(|n| n.ip)
        .unwrap_or_default();
    eprintln!("hpktainer: {image} in sandbox {} with address {address}", &sandbox[..12.min(sandbox.len())]);
    let config = cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata { name: "main".into(), attempt: 0 }),
        image: Some(cri::ImageSpec { image: image.to_owned(), ..Default::default() }),
        command: command.to_vec(),
        log_path: "main.log".into(),
        labels: labels.clone(),
        ..Default::default()
    };
    let container = runtime
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: sandbox.to_owned(),
            config: Some(config),
            sandbox_config: Some(sandbox_config.clone()),
        })
        .await
        .map_err(status)?
        .into_inner()
        .container_id;
    runtime
        .start_container(cri::StartContainerRequest { container_id: container.clone() })
        .await
        .map_err(status)?;
    let log = logs.join("main.log");
    let mut offset = 0u64;
    let mut stop = Box::pin(stop_signal());
    loop {
        offset = print_new(&log, offset);
        let state = runtime
            .container_status(cri::ContainerStatusRequest { container_id: container.clone(), verbose: false })
            .await
            .map_err(status)?
            .into_inner()
            .status;
        if let Some(s) = state
            && s.state == cri::ContainerState::ContainerExited as i32
        {
            // The shim has written everything by the time the exit is recorded.
            print_new(&log, offset);
            return Ok(s.exit_code);
        }
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(100)) => {}
            () = &mut stop => {
                eprintln!("hpktainer: interrupted; stopping the container");
                let _ = runtime.stop_container(cri::StopContainerRequest { container_id: container.clone(), timeout: 5 }).await;
                print_new(&log, offset);
                return Ok(130);
            }
        }
    }
}

async fn stop_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut int), Ok(mut term)) = (signal(SignalKind::interrupt()), signal(SignalKind::terminate()))
    else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = int.recv() => {}
        _ = term.recv() => {}
    }
}

/// Prints the CRI log records after `offset` (`TIME STREAM TAG MESSAGE`) to stdout or stderr;
/// returns the new offset (complete lines only).
fn print_new(log: &Path, offset: u64) -> u64 {
    use std::io::{Read, Seek, Write};
    let Ok(mut file) = std::fs::File::open(log) else { return offset };
    if file.seek(std::io::SeekFrom::Start(offset)).is_err() {
        return offset;
    }
    let mut buf = Vec::new();
    if file.read_to_end(&mut buf).is_err() {
        return offset;
    }
    let complete = buf.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
    for line in buf[..complete].split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        let mut parts = line.splitn(4, |b| *b == b' ');
        let (_, stream, tag, message) =
            (parts.next(), parts.next(), parts.next(), parts.next().unwrap_or(b""));
        let newline = if tag == Some(b"P".as_slice()) { &b""[..] } else { &b"\n"[..] };
        if stream == Some(b"stderr".as_slice()) {
            let mut err = std::io::stderr().lock();
            let _ = err.write_all(message).and_then(|()| err.write_all(newline));
        } else {
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(message).and_then(|()| out.write_all(newline)).and_then(|()| out.flush());
        }
    }
    offset + complete as u64
}
