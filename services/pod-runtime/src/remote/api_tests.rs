//! The service over a real `Runtime` (no sandbox started): ReadLog of a container put into the
//! runtime's state, Allocation, and the pod's files going with its last sandbox.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use hpk_proto::podruntime::v1 as pb;
use hpk_proto::podruntime::v1::remote_server::Remote;
use k8s_cri::v1 as cri;
use tokio_stream::StreamExt;
use tonic::{Code, Request};

use super::RemoteApi;
use crate::engine::{CgroupMode, Crun, CrunEngine};
use crate::images::ImageStore;
use crate::runtime::{Config, Container, Runtime, Sandbox};

const UID: &str = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";

fn runtime(root: &Path) -> Arc<Runtime> {
    let config = Config {
        root: root.to_owned(),
        state: root.to_owned(),
        pause_binary: "/nonexistent/hpk-pause".into(),
        pause_grace_seconds: 1,
        cgroup_mode: CgroupMode::V2,
        shim_binary: "/nonexistent/hpk-pod-runtime".into(),
        network: None,
        pod_logs_root: None,
        cdi_spec_dirs: Vec::new(),
        on_pod_removed: Some(super::files::remove_on_pod_removed(root.join(super::files::POD_FILES))),
    };
    let images = ImageStore::open(&root.join("images")).unwrap();
    Runtime::new(config, Arc::new(CrunEngine::new(Crun::new(&root.join("crun")))), images).unwrap()
}

async fn add_container(runtime: &Runtime, id: &str, log: &Path, state: cri::ContainerState) {
    let container = Container {
        id: id.into(),
        dir: runtime.config.state.join("containers").join(id),
        sandbox_id: "s".repeat(64),
        config: cri::ContainerConfig::default(),
        image_ref: String::new(),
        image_id: String::new(),
        state,
        created_at: 0,
        started_at: 0,
        finished_at: 0,
        exit_code: 0,
        reason: String::new(),
        log_path: Some(log.to_owned()),
        pause_pid: 0,
        sandbox_pid: None,
        exited: tokio::sync::watch::channel(false).0,
        start_error: None,
        shim_pid: None,
        not_honoured: None,
    };
    runtime.state.lock().await.containers.insert(id.into(), container);
}

fn read_log(container_id: &str) -> pb::ReadLogRequest {
    pb::ReadLogRequest { container_id: container_id.into(), ..Default::default() }
}

async fn collect(api: &RemoteApi, request: pb::ReadLogRequest) -> Result<String, tonic::Status> {
    let mut chunks = api.read_log(Request::new(request)).await?.into_inner();
    let mut out = Vec::new();
    while let Some(chunk) = chunks.next().await {
        out.extend(chunk?.data);
    }
    Ok(String::from_utf8(out).unwrap())
}

#[tokio::test]
async fn read_log_renders_the_cri_log() {
    let root = tempfile::tempdir().unwrap();
    let runtime = runtime(root.path());
    let log = root.path().join("c.log");
    std::fs::write(
        &log,
        "2026-11-30T06:01:25.000000001Z stdout F one\n\
         2026-11-30T06:01:26.000000000Z stderr F two\n\
         2026-11-30T06:01:27.000000000Z stdout P thr\n\
         2026-11-30T06:01:27.100000000Z stdout F ee\n",
    )
    .unwrap();
    let id = "c".repeat(64);
    add_container(&runtime, &id, &log, cri::ContainerState::ContainerExited).await;
    let api = RemoteApi::new(Arc::clone(&runtime), 110);

    assert_eq!(collect(&api, read_log(&id)).await.unwrap(), "one\ntwo\nthree\n");
    let stdout = pb::ReadLogRequest { stream: "Stdout".into(), ..read_log(&id[..12]) };
    assert_eq!(collect(&api, stdout).await.unwrap(), "one\nthree\n", "an ID prefix, as crictl sends");
    // Records are counted (a partial one too) and timestamped as the file has them.
    let tail = pb::ReadLogRequest { tail_lines: Some(2), timestamps: true, ..read_log(&id) };
    let expected = "2026-11-30T06:01:27.000000000Z thr2026-11-30T06:01:27.100000000Z ee\n";
    assert_eq!(collect(&api, tail).await.unwrap(), expected);
    let since = pb::ReadLogRequest { since_unix_nanos: Some(1_796_018_486_000_000_000), ..read_log(&id) };
    assert_eq!(collect(&api, since).await.unwrap(), "two\nthree\n");
    let limit = pb::ReadLogRequest { limit_bytes: Some(5), ..read_log(&id) };
    assert_eq!(collect(&api, limit).await.unwrap(), "one\nt");
    // Following a stopped container's log ends at once.
    let follow = pb::ReadLogRequest { follow: true, ..read_log(&id) };
    let done = tokio::time::timeout(std::time::Duration::from_secs(5), collect(&api, follow)).await;
    assert_eq!(done.expect("the follow ends").unwrap(), "one\ntwo\nthree\n");
}

#[tokio::test]
async fn read_log_refusals() {
    let root = tempfile::tempdir().unwrap();
    let runtime = runtime(root.path());
    let id = "d".repeat(64);
    add_container(&runtime, &id, &root.path().join("gone.log"), cri::ContainerState::ContainerRunning).await;
    let api = RemoteApi::new(runtime, 110);
    let code = |r: Result<String, tonic::Status>| r.unwrap_err().code();
    assert_eq!(code(collect(&api, read_log(&"e".repeat(64))).await), Code::NotFound, "unknown container");
    assert_eq!(code(collect(&api, read_log(&id)).await), Code::NotFound, "the log file is gone");
    let bad = pb::ReadLogRequest { stream: "stdout".into(), ..read_log(&id) };
    assert_eq!(code(collect(&api, bad).await), Code::InvalidArgument);
    assert_eq!(code(collect(&api, read_log("")).await), Code::InvalidArgument);
}

#[tokio::test]
async fn allocation_of_this_machine() {
    let root = tempfile::tempdir().unwrap();
    let api = RemoteApi::new(runtime(root.path()), 42);
    let answer = api.allocation(Request::new(pb::AllocationRequest {})).await.unwrap().into_inner();
    assert_eq!(answer.capacity.get("pods").map(String::as_str), Some("42"));
    for name in ["cpu", "memory", "ephemeral-storage"] {
        assert!(answer.capacity.contains_key(name), "{name} in {:?}", answer.capacity);
    }
    let expected = match std::env::var("SLURM_JOB_ID") {
        Ok(id) if !id.trim().is_empty() => format!("slurm job {}", id.trim()),
        _ => "machine".to_owned(),
    };
    assert_eq!(answer.source, expected);

    let slurm: HashMap<&str, &str> = HashMap::from([("SLURM_JOB_ID", "1234"), ("SLURM_CPUS_ON_NODE", "3")]);
    let env = |name: &str| slurm.get(name).map(|v| (*v).to_owned());
    let answer = super::allocation(root.path(), 110, &env).unwrap();
    assert_eq!((answer.capacity["cpu"].as_str(), answer.source.as_str()), ("3", "slurm job 1234"));
    let error = super::allocation(&root.path().join("missing"), 110, &env).unwrap_err();
    assert_eq!(tonic::Status::from(error).code(), Code::Internal);
}

#[tokio::test]
async fn put_and_remove_through_the_service() {
    let root = tempfile::tempdir().unwrap();
    let api = RemoteApi::new(runtime(root.path()), 110);
    let entry = pb::FileEntry {
        path: String::new(),
        kind: Some(pb::file_entry::Kind::Content(b"127.0.0.1 localhost\n".to_vec())),
        mode: 0,
    };
    let request = pb::PutFilesRequest {
        pod_uid: UID.into(),
        key: "etc-hosts".into(),
        directory: false,
        entries: vec![entry],
    };
    let path = api.put_files(Request::new(request.clone())).await.unwrap().into_inner().path;
    assert_eq!(Path::new(&path), root.path().join("pod-files").join(UID).join("etc-hosts"));
    assert!(Path::new(&path).is_absolute());
    let bad = pb::PutFilesRequest { key: "../x".into(), ..request };
    assert_eq!(api.put_files(Request::new(bad)).await.unwrap_err().code(), Code::InvalidArgument);
    let remove = |uid: &str| Request::new(pb::RemovePodFilesRequest { pod_uid: uid.into() });
    api.remove_pod_files(remove(UID)).await.unwrap();
    assert!(!Path::new(&path).exists());
    api.remove_pod_files(remove(UID)).await.unwrap();
    assert_eq!(api.remove_pod_files(remove("Not/A/UID")).await.unwrap_err().code(), Code::InvalidArgument);
}

fn sandbox(id: &str, uid: &str) -> Sandbox {
    Sandbox {
        id: id.into(),
        config: cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata { uid: uid.into(), ..Default::default() }),
            ..Default::default()
        },
        created_at: 0,
        ready: false,
        pause_pid: 0,
        unclaimed_exits: HashMap::new(),
        ip: None,
        exit_waiters: HashMap::new(),
    }
}

#[tokio::test]
async fn the_pod_files_go_with_its_last_sandbox() {
    if !crate::engine::on_path("crun") {
        eprintln!("skipped: removing a sandbox asks crun, and crun is not on PATH");
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let runtime = runtime(root.path());
    let pod_files = root.path().join("pod-files");
    let request = pb::PutFilesRequest {
        pod_uid: UID.into(),
        key: "etc-hosts".into(),
        directory: false,
        entries: vec![pb::FileEntry {
            path: String::new(),
            kind: Some(pb::file_entry::Kind::Content(b"x".to_vec())),
            mode: 0,
        }],
    };
    let stored = super::files::put(&pod_files, &request, super::MAX_MESSAGE).unwrap();
    let (first, second) = ("1".repeat(64), "2".repeat(64));
    {
        let mut state = runtime.state.lock().await;
        state.sandboxes.insert(first.clone(), sandbox(&first, UID));
        state.sandboxes.insert(second.clone(), sandbox(&second, UID));
    }
    runtime.remove_sandbox(&first).await.unwrap();
    assert!(stored.exists(), "another sandbox of the pod remains");
    runtime.remove_sandbox(&second).await.unwrap();
    assert!(!pod_files.join(UID).exists(), "gone with the pod's last sandbox");
    assert!(pod_files.exists());
}

/// A one-request-per-connection HTTP server on 127.0.0.1: `/ok` answers 200, anything else 500.
async fn http_server() -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = vec![0; 4096];
                let n = stream.read(&mut head).await.unwrap_or(0);
                let ok = String::from_utf8_lossy(&head[..n]).starts_with("GET /ok ");
                let status = if ok { "200 OK" } else { "500 Internal Server Error" };
                let answer = format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
                let _ = stream.write_all(answer.as_bytes()).await;
            });
        }
    });
    port
}

#[tokio::test]
async fn probes_run_here_on_the_sandboxs_own_address() {
    use hpk_probe::{Action, HttpGet};
    use pb::probe_response::Outcome;
    let root = tempfile::tempdir().unwrap();
    let runtime = runtime(root.path());
    let id = "5".repeat(64);
    let mut probed = sandbox(&id, UID);
    probed.ip = Some("127.0.0.1".into());
    runtime.state.lock().await.sandboxes.insert(id.clone(), probed);
    let api = RemoteApi::new(Arc::clone(&runtime), 110);
    let port = http_server().await;
    let get = |host: &str, path: &str| {
        Action::HttpGet(HttpGet {
            scheme: "HTTP".into(),
            host: host.into(),
            port,
            path: path.into(),
            headers: Vec::new(),
        })
    };
    let probe = |sandbox: &str, action: &Action| {
        Request::new(hpk_probe::wire::request(sandbox, action, std::time::Duration::from_secs(2)))
    };

    let passed = api.probe(probe(&id, &get("127.0.0.1", "/ok"))).await.unwrap().into_inner();
    assert_eq!((passed.outcome(), passed.message.as_str()), (Outcome::Passed, ""));
    let failed = api.probe(probe(&id, &get("127.0.0.1", "/fail"))).await.unwrap().into_inner();
    assert_eq!(
        (failed.outcome(), failed.message.as_str()),
        (Outcome::Failed, "HTTP probe failed with statuscode: 500")
    );
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let tcp = Action::TcpSocket { host: "127.0.0.1".into(), port: closed };
    let refused = api.probe(probe(&id, &tcp)).await.unwrap().into_inner();
    assert_eq!(refused.outcome(), Outcome::Failed);
    assert_eq!(refused.message, format!("dial tcp 127.0.0.1:{closed}: connect: connection refused"));

    // Refusals: another host, an unknown sandbox, a malformed request, too many at once.
    let elsewhere = api.probe(probe(&id, &get("127.0.0.2", "/ok"))).await.unwrap_err();
    assert_eq!(elsewhere.code(), Code::InvalidArgument);
    assert!(elsewhere.message().contains("not an address of sandbox"), "{}", elsewhere.message());
    let unknown = api.probe(probe(&"6".repeat(64), &get("127.0.0.1", "/ok"))).await.unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);
    let mut malformed =
        hpk_probe::wire::request(&id, &get("127.0.0.1", "/ok"), std::time::Duration::from_secs(1));
    malformed.action = None;
    let malformed = api.probe(Request::new(malformed)).await.unwrap_err();
    assert_eq!(malformed.code(), Code::InvalidArgument);
    let all =
        Arc::clone(&api.probes).acquire_many_owned(u32::try_from(super::probe::MAX_RUNNING).unwrap()).await;
    let busy = api.probe(probe(&id, &get("127.0.0.1", "/ok"))).await.unwrap_err();
    assert_eq!(busy.code(), Code::ResourceExhausted);
    drop(all);
    assert_eq!(
        api.probe(probe(&id, &get("127.0.0.1", "/ok"))).await.unwrap().into_inner().outcome(),
        Outcome::Passed
    );
}
