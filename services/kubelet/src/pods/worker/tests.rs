//! The worker over the recording fake runtime: each action carried out, and a failure at each
//! CRI call reported with its reason, tried again later, and leaving nothing half-made.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use serde_json::json;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::*;
use crate::cri::fake::FakeCri;
use crate::cri::{Cri, CriCall, CriFailure};
use crate::node::{NodeState, Resources};
use crate::pods::record::State;

struct Harness {
    fake: Arc<FakeCri>,
    worker: Worker,
    node: watch::Sender<NodeState>,
    _dir: tempfile::TempDir,
}

fn harness(spec: serde_json::Value) -> Harness {
    // Nothing listens there: the API calls (events) fail quietly.
    let client = kube::Client::try_from(kube::Config::new("http://127.0.0.1:1".parse().expect("uri")))
        .expect("client");
    harness_with_api(spec, client)
}

fn harness_with_api(spec: serde_json::Value, client: kube::Client) -> Harness {
    let dir = tempfile::tempdir().expect("tmp");
    let fake = Arc::new(FakeCri::default());
    let channel = tonic::transport::Endpoint::from_static("http://127.0.0.1:1").connect_lazy();
    let allocatable =
        Resources { millicpu: 4000, memory: 8 << 30, ephemeral_storage: 1 << 30, gpus: 0, pods: 10 };
    let (node_tx, node) = watch::channel(NodeState { allocatable, ready: true, message: String::new() });
    let ctx = Arc::new(Context {
        client: client.clone(),
        cri: Cri {
            runtime: RuntimeServiceClient::new(channel.clone()),
            images: ImageServiceClient::new(channel),
            remote: None,
        },
        runtime: fake.clone(),
        objects: crate::objects::ApiObjects::with_services(client.clone(), Vec::new()),
        events: crate::events::Events::new(client, "node"),
        node_name: "node".into(),
        host_ip: "10.0.0.1".into(),
        pods_dir: dir.path().join("pods"),
        logs_dir: dir.path().join("logs"),
        dns: crate::cri_config::DnsSettings::default(),
        node,
        admitted: Mutex::default(),
        summaries: Mutex::new(BTreeMap::new()),
        pods: Mutex::new(BTreeMap::new()),
        ids: None,
        host_paths: crate::volumes::HostPaths::default(),
        gpus: crate::gpus::Gpus::default(),
        allowed_unsafe_sysctls: Vec::new(),
    });
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
        "spec": spec,
    }))
    .expect("pod");
    let (probe_tx, _) = mpsc::channel(8);
    Harness { fake, worker: Worker::new(ctx, Arc::new(pod), probe_tx), node: node_tx, _dir: dir }
}

/// An API server double that answers each pod status patch with the pod as patched and keeps
/// the patches' bodies; anything else (events) gets a 404.
fn status_api() -> (kube::Client, Arc<Mutex<Vec<serde_json::Value>>>) {
    use http_body_util::BodyExt as _;
    let patches = Arc::new(Mutex::new(Vec::new()));
    let seen = patches.clone();
    let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
        let seen = seen.clone();
        async move {
            let is_status =
                request.method() == http::Method::PATCH && request.uri().path().ends_with("/status");
            let body = request.into_body().collect().await?.to_bytes();
            if !is_status {
                let mut answer =
                    http::Response::new(http_body_util::Full::new(bytes::Bytes::from_static(b"{}")));
                *answer.status_mut() = http::StatusCode::NOT_FOUND;
                return Ok::<_, kube::Error>(answer);
            }
            let patch: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
            seen.lock().expect("lock").push(patch.clone());
            let pod = json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "resourceVersion": "2"},
                "status": patch["status"],
            });
            Ok(http::Response::new(http_body_util::Full::new(bytes::Bytes::from(pod.to_string()))))
        }
    });
    (kube::Client::new(service, "default"), patches)
}

/// The Ready condition of a status patch: (status, reason).
fn ready_of(patch: &serde_json::Value) -> (String, String) {
    let conditions = patch["status"]["conditions"].as_array().cloned().unwrap_or_default();
    let ready = conditions.iter().find(|c| c["type"] == "Ready").cloned().unwrap_or_default();
    (ready["status"].as_str().unwrap_or_default().into(), ready["reason"].as_str().unwrap_or_default().into())
}

/// A node that turns NotReady because its runtime stopped answering (a remote runtime's link
/// cut): the pod says so at once, without first asking the runtime, whose calls would wait
/// behind connection attempts; back Ready, the containers are read again before it says Ready.
#[tokio::test]
async fn a_node_turning_not_ready_is_reported_before_any_runtime_call() {
    let (client, patches) = status_api();
    let mut h = harness_with_api(app(), client);
    h.worker.sync().await;
    h.worker.report().await;
    assert_eq!(patches.lock().expect("lock").last().map(ready_of), Some(("True".into(), String::new())));

    h.node.send_modify(|n| {
        n.ready = false;
        n.message = "container runtime hpk-pod-runtime is not ready: Status did not answer within 3 s".into();
    });
    let before = h.fake.calls().len();
    h.worker.on_message(Msg::Node(false)).await;
    assert_eq!(h.fake.calls().len(), before, "the runtime was asked: {:?}", &h.fake.calls()[before..]);
    let patch = patches.lock().expect("lock").last().cloned().expect("a patch");
    assert_eq!(ready_of(&patch), ("False".into(), "NodeNotReady".into()), "{patch}");

    // Back: nothing is said until the containers were read again.
    h.node.send_modify(|n| {
        n.ready = true;
        n.message.clear();
    });
    let reported = patches.lock().expect("lock").len();
    h.worker.on_message(Msg::Node(true)).await;
    h.worker.on_message(Msg::Runtime).await;
    assert_eq!(patches.lock().expect("lock").len(), reported);
    assert!(std::mem::take(&mut h.worker.stale), "a refresh is due");
    h.worker.refresh().await;
    assert!(h.fake.calls()[before..].contains(&CriCall::ContainerStatus), "{:?}", h.fake.calls());
    h.worker.report().await;
    let patch = patches.lock().expect("lock").last().cloned().expect("a patch");
    assert_eq!(ready_of(&patch).0, "True", "{patch}");
}

fn app() -> serde_json::Value {
    json!({"containers": [{"name": "app", "image": "busybox:1.36"}]})
}

fn waiting_reason(worker: &Worker, i: usize) -> String {
    match &worker.state.containers[i].state {
        State::Waiting { reason, .. } => reason.clone(),
        other => format!("{other:?}"),
    }
}

/// The wake-up is about `delay` from now.
fn wakes_in(worker: &Worker, delay: Duration) -> bool {
    worker.wake.is_some_and(|at| {
        let left = at.saturating_duration_since(Instant::now());
        left <= delay && left + Duration::from_secs(2) >= delay
    })
}

#[tokio::test]
async fn a_pod_is_admitted_given_a_sandbox_and_its_container_started() {
    let mut h = harness(app());
    h.worker.sync().await;
    assert_eq!(h.worker.state.step, Step::Running);
    assert_eq!(h.worker.state.phase, Phase::Running);
    assert!(h.worker.state.containers[0].running());
    let calls = h.fake.calls();
    for call in
        [CriCall::RunPodSandbox, CriCall::PullImage, CriCall::CreateContainer, CriCall::StartContainer]
    {
        assert!(calls.contains(&call), "{call:?} in {calls:?}");
    }
    // Level-triggered: another wake-up with nothing new makes nothing again.
    let before = h.fake.calls().len();
    h.worker.sync().await;
    let again = h.fake.calls().split_off(before);
    assert!(
        !again.iter().any(|c| matches!(c, CriCall::RunPodSandbox | CriCall::CreateContainer)),
        "{again:?}"
    );
}

#[tokio::test]
async fn a_failed_sandbox_is_reported_backed_off_and_left_nowhere() {
    for failing in [CriCall::RunPodSandbox, CriCall::PodSandboxStatus] {
        let mut h = harness(app());
        h.fake.fail(failing, CriFailure::Failed);
        h.worker.sync().await;
        assert!(h.worker.state.sandbox.is_none(), "{failing:?}");
        assert!(h.fake.lock().sandboxes.is_empty(), "{failing:?}: no sandbox is left half-made");
        assert!(h.fake.lock().containers.is_empty());
        assert!(!h.worker.state.message.is_empty(), "{failing:?}: the pod says why");
        assert!(h.worker.state.sandbox_backoff.waiting(Instant::now()), "{failing:?}");
        assert!(wakes_in(&h.worker, Duration::from_secs(10)), "{failing:?}: tried again after the back-off");
        // Healed, and its back-off over, the next wake-up makes it.
        h.fake.heal(failing);
        h.worker.state.sandbox_backoff.reset();
        h.worker.sync().await;
        assert!(h.worker.state.containers[0].running(), "{failing:?}");
        assert_eq!(h.fake.lock().sandboxes.len(), 1);
    }
}

#[tokio::test]
async fn a_failed_pull_is_err_image_pull_then_image_pull_back_off() {
    let mut h = harness(app());
    h.fake.fail(CriCall::PullImage, CriFailure::Failed);
    h.worker.sync().await;
    assert_eq!(waiting_reason(&h.worker, 0), "ErrImagePull");
    assert!(h.fake.lock().containers.is_empty(), "no container without its image");
    assert!(wakes_in(&h.worker, Duration::from_secs(10)));
    h.worker.state.containers[0].pull_backoff = {
        // Its first back-off is over.
        let mut b = crate::pods::backoff::Backoff::default();
        b.fail(Instant::now() - Duration::from_secs(11));
        b
    };
    h.worker.sync().await;
    assert_eq!(waiting_reason(&h.worker, 0), "ImagePullBackOff");
    assert!(wakes_in(&h.worker, Duration::from_secs(20)), "the back-off doubled");
}

#[tokio::test]
async fn a_failed_create_is_create_container_error_with_the_restart_back_off() {
    let mut h = harness(app());
    h.fake.fail(CriCall::CreateContainer, CriFailure::Failed);
    h.worker.sync().await;
    assert_eq!(waiting_reason(&h.worker, 0), "CreateContainerError");
    assert!(h.fake.lock().containers.is_empty());
    assert!(h.worker.state.containers[0].id.is_none(), "no container is recorded");
    assert!(h.worker.state.containers[0].restart_backoff.waiting(Instant::now()));
    assert!(wakes_in(&h.worker, Duration::from_secs(10)));
    assert_eq!(h.worker.state.phase, Phase::Pending);
}

#[tokio::test]
async fn a_failed_start_is_run_container_error_and_the_next_attempt_makes_a_new_one() {
    let mut h = harness(app());
    h.fake.fail(CriCall::StartContainer, CriFailure::Failed);
    h.worker.sync().await;
    assert_eq!(waiting_reason(&h.worker, 0), "RunContainerError");
    let first = h.worker.state.containers[0].id.clone().expect("the created container is recorded");
    h.fake.heal(CriCall::StartContainer);
    h.worker.sync().await;
    assert!(h.worker.state.containers[0].running());
    assert_ne!(h.worker.state.containers[0].id.as_deref(), Some(first.as_str()), "a new container");
}

#[tokio::test]
async fn a_liveness_failure_restarts_the_container() {
    let mut h = harness(app());
    h.worker.sync().await;
    let first = h.worker.state.containers[0].id.clone().expect("runs");
    h.worker.state.containers[0].failed_probe = Some(ProbeKind::Liveness);
    h.worker.sync().await;
    let calls = h.fake.calls();
    assert!(calls.contains(&CriCall::StopContainer), "{calls:?}");
    let c = &h.worker.state.containers[0];
    assert!(c.running(), "restarted at once, the first time");
    assert_ne!(c.id.as_deref(), Some(first.as_str()));
    assert_eq!(c.restart_count, 1);
    assert_eq!(c.last.as_ref().map(|e| e.exit_code), Some(137));
}

#[tokio::test]
async fn termination_retries_a_sandbox_that_would_not_go() {
    let mut h = harness(app());
    h.worker.sync().await;
    h.worker.state.deleted = true;
    h.fake.fail(CriCall::RemovePodSandbox, CriFailure::Unavailable);
    h.worker.sync().await;
    assert_eq!(h.worker.state.step, Step::Terminating);
    assert!(h.worker.state.sandbox.is_some(), "kept, to be removed again");
    assert!(wakes_in(&h.worker, crate::pods::error::RETRY));
    h.fake.heal(CriCall::RemovePodSandbox);
    h.worker.sync().await;
    assert_eq!(h.worker.state.step, Step::Terminated);
    assert!(h.fake.lock().sandboxes.is_empty());
    assert!(lock(&h.worker.ctx.admitted).is_empty(), "its requests are released");
}

#[tokio::test]
async fn a_completed_pod_whose_sandbox_will_not_stop_is_tried_again() {
    let mut h =
        harness(json!({"restartPolicy": "Never", "containers": [{"name": "app", "image": "busybox:1.36"}]}));
    h.worker.sync().await;
    let id = h.worker.state.containers[0].id.clone().expect("runs");
    // The container ends (the fake's stop leaves it exited with 137).
    h.fake.lock().containers.get_mut(&id).expect("there").3 = k8s_cri::v1::ContainerState::ContainerExited;
    h.fake.fail(CriCall::StopPodSandbox, CriFailure::Unavailable);
    h.worker.refresh().await;
    h.worker.sync().await;
    assert_eq!(h.worker.state.phase, Phase::Failed, "exit 137 under Never");
    assert_eq!(h.worker.state.step, Step::Completed);
    assert!(h.worker.state.sandbox.as_ref().is_some_and(|s| s.ready), "still up");
    assert!(wakes_in(&h.worker, crate::pods::error::RETRY));
    h.fake.heal(CriCall::StopPodSandbox);
    h.worker.sync().await;
    assert!(h.worker.state.sandbox.as_ref().is_some_and(|s| !s.ready), "stopped now");
    assert!(h.fake.lock().containers.contains_key(&id), "its container is kept for its logs");
}

#[tokio::test]
async fn an_unreadable_image_status_still_pulls() {
    let mut h = harness(app());
    h.fake.fail(CriCall::ImageStatus, CriFailure::Unavailable);
    h.worker.sync().await;
    assert!(h.fake.calls().contains(&CriCall::PullImage));
    assert!(h.worker.state.containers[0].running());
}
