//! The pods bound to this node: a watch of `spec.nodeName=<node>` starts one worker per pod
//! and forwards changes; the runtime's container events wake the worker of their pod; at start,
//! what the runtime still runs is handed to the workers of those pods (adoption), and sandboxes
//! of pods deleted while the kubelet was away are removed.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::worker::{self, Msg};
use super::{Adopted, Context, key};
use crate::cri::CriError;

/// The kubelet's pods until `shutdown`; pods keep running when it ends. With `eviction`
/// (its policy and the kubelet's root directory), the eviction manager runs too.
pub async fn run(
    ctx: Arc<Context>,
    eviction: Option<(crate::eviction::Policy, std::path::PathBuf)>,
    shutdown: CancellationToken,
) -> Result<(), CriError> {
    let mut adopted = list_runtime(&ctx).await?;
    tracing::info!(pods = adopted.len(), "runtime listed");
    let workers: Arc<tokio::sync::Mutex<HashMap<String, mpsc::UnboundedSender<Msg>>>> = Arc::default();
    tokio::spawn(forward_runtime_events(ctx.clone(), workers.clone(), shutdown.clone()));
    tokio::spawn(forward_node_readiness(ctx.clone(), workers.clone(), shutdown.clone()));
    if let Some((policy, root)) = eviction {
        tokio::spawn(crate::eviction::run(ctx.clone(), workers.clone(), policy, root, shutdown.clone()));
    }

    let pods: Api<Pod> = Api::all(ctx.client.clone());
    let config = watcher::Config::default().fields(&format!("spec.nodeName={}", ctx.node_name));
    let mut stream = watcher::watcher(pods, config).backoff(WatchBackoff::default()).boxed();
    // UIDs seen in the current (re)list; workers of pods missing from it are told Deleted.
    let mut listing: Option<HashSet<String>> = None;
    let mut first_list_done = false;
    let mut finished: HashSet<String> = HashSet::new();
    loop {
        let event = tokio::select! {
            () = shutdown.cancelled() => break,
            event = stream.next() => event,
        };
        let Some(event) = event else { break };
        let event = match event {
            Ok(event) => event,
            Err(error) => {
                // The watcher backs off and retries; pods keep running meanwhile.
                tracing::warn!(%error, "pod watch interrupted");
                continue;
            }
        };
        let mut workers = workers.lock().await;
        // A worker that ended terminated its pod: later events about it (its final status
        // patch, the delete) must not start another.
        workers.retain(|uid, tx| {
            if tx.is_closed() {
                finished.insert(uid.clone());
            }
            !tx.is_closed()
        });
        match event {
            Event::Init => listing = Some(HashSet::new()),
            Event::InitApply(pod) | Event::Apply(pod) => {
                let uid = pod.metadata.uid.clone().unwrap_or_default();
                if let Some(seen) = listing.as_mut() {
                    seen.insert(uid.clone());
                }
                let pod = Arc::new(pod);
                super::lock(&ctx.pods).insert(uid.clone(), pod.clone());
                if let Some(tx) = workers.get(&uid) {
                    let _ = tx.send(Msg::Update(pod));
                } else if finished.contains(&uid) {
                    // Terminated by this kubelet; the API has not yet said it is gone.
                } else if pod
                    .status
                    .as_ref()
                    .and_then(|s| s.phase.as_deref())
                    .is_some_and(|p| p == "Succeeded" || p == "Failed")
                    && pod.metadata.deletion_timestamp.is_none()
                    && !adopted.contains_key(&uid)
                {
                    // A finished pod the kubelet already reported: nothing to run.
                } else {
                    let (tx, rx) = mpsc::unbounded_channel();
                    let found = adopted.remove(&uid);
                    tracing::info!(pod = %key(&pod), uid = %uid, adopted = found.is_some(), "pod worker started");
                    tokio::spawn(worker::run(ctx.clone(), pod, found, rx));
                    workers.insert(uid, tx);
                }
            }
            Event::Delete(pod) => {
                let uid = pod.metadata.uid.clone().unwrap_or_default();
                super::lock(&ctx.pods).remove(&uid);
                finished.remove(&uid);
                if let Some(tx) = workers.remove(&uid) {
                    let _ = tx.send(Msg::Deleted);
                }
            }
            Event::InitDone => {
                if let Some(seen) = listing.take() {
                    super::lock(&ctx.pods).retain(|uid, _| seen.contains(uid));
                    for (uid, tx) in workers.iter() {
                        if !seen.contains(uid) {
                            let _ = tx.send(Msg::Deleted);
                        }
                    }
                }
                if !first_list_done {
                    first_list_done = true;
                    // Pods deleted from the API while the kubelet was away; removed on a task
                    // of their own, as stopping a sandbox may take its grace period.
                    let orphans: Vec<(String, Adopted)> = adopted.drain().collect();
                    let ctx = ctx.clone();
                    tokio::spawn(async move {
                        for (uid, orphan) in orphans {
                            remove_orphan(&ctx, &uid, orphan).await;
                        }
                    });
                }
            }
        }
    }
    Ok(())
}

/// The pod watch's retry delays: 200 ms doubling to 5 s (kube-runtime's default grows to
/// 30 s, so a node whose link to the API came back would wait that long to hear of its pods
/// and to repair their status).
#[derive(Clone, Debug)]
struct WatchBackoff {
    next: Duration,
}

impl WatchBackoff {
    const FIRST: Duration = Duration::from_millis(200);
    const MAX: Duration = Duration::from_secs(5);
}

impl Default for WatchBackoff {
    fn default() -> Self {
        Self { next: Self::FIRST }
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let delay = self.next;
        self.next = (self.next * 2).min(Self::MAX);
        Some(delay)
    }
}

impl kube::runtime::utils::Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.next = Self::FIRST;
    }
}

/// The label of sandboxes `hpktainer run` makes (the `hpk` crate's `tainer::LABEL`).
const HPKTAINER_LABEL: &str = "hpk.io/hpktainer";

/// Sandboxes and containers the runtime has, by pod UID.
async fn list_runtime(ctx: &Context) -> Result<HashMap<String, Adopted>, CriError> {
    let sandboxes = ctx.runtime.list_pod_sandbox().await?;
    let containers = ctx.runtime.list_containers().await?;
    let mut by_uid: HashMap<String, Adopted> = HashMap::new();
    let mut uid_of_sandbox = HashMap::new();
    for sandbox in sandboxes {
        // Ad-hoc containers a user started in the bubble (`hpktainer run`) are not pods.
        if sandbox.labels.contains_key(HPKTAINER_LABEL) {
            continue;
        }
        let uid = sandbox.metadata.as_ref().map(|m| m.uid.clone()).unwrap_or_default();
        uid_of_sandbox.insert(sandbox.id.clone(), uid.clone());
        by_uid.entry(uid).or_default().sandboxes.push(sandbox);
    }
    for container in containers {
        if let Some(uid) = uid_of_sandbox.get(&container.pod_sandbox_id) {
            by_uid.entry(uid.clone()).or_default().containers.push(container);
        }
    }
    for adopted in by_uid.values_mut() {
        adopted.sandboxes.sort_by_key(|s| std::cmp::Reverse(s.created_at));
    }
    Ok(by_uid)
}

/// Removes what is left of a pod the API no longer has.
async fn remove_orphan(ctx: &Context, uid: &str, orphan: Adopted) {
    for sandbox in orphan.sandboxes {
        tracing::info!(uid = %uid, sandbox = %sandbox.id, "removing the sandbox of a deleted pod");
        let _ = ctx.runtime.stop_pod_sandbox(&sandbox.id).await;
        if let Err(error) = ctx.runtime.remove_pod_sandbox(&sandbox.id).await {
            tracing::warn!(uid = %uid, %error, "removing an orphaned sandbox failed");
        }
    }
    if let Err(error) = crate::volumes::remove(&ctx.pod_dir(uid)) {
        tracing::warn!(uid = %uid, %error, "removing an orphaned pod's volumes failed");
    }
}

/// Wakes every worker when the node turns Ready or NotReady: each reports its pod's Ready
/// condition anew (see `status::View::node_not_ready`).
async fn forward_node_readiness(
    ctx: Arc<Context>,
    workers: Arc<tokio::sync::Mutex<HashMap<String, mpsc::UnboundedSender<Msg>>>>,
    shutdown: CancellationToken,
) {
    let mut node = ctx.node.clone();
    let mut ready = node.borrow_and_update().ready;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            changed = node.changed() => if changed.is_err() { return },
        }
        let now = node.borrow_and_update().ready;
        if now != ready {
            ready = now;
            for tx in workers.lock().await.values() {
                let _ = tx.send(Msg::Node(now));
            }
        }
    }
}

/// Wakes the worker of the pod each container event is about; after the stream breaks (the
/// runtime restarted, or this subscriber fell behind), every worker reads its states again.
async fn forward_runtime_events(
    ctx: Arc<Context>,
    workers: Arc<tokio::sync::Mutex<HashMap<String, mpsc::UnboundedSender<Msg>>>>,
    shutdown: CancellationToken,
) {
    let mut delay = Duration::from_millis(100);
    loop {
        let stream = tokio::select! {
            () = shutdown.cancelled() => return,
            answer = ctx.runtime.container_events() => answer,
        };
        match stream {
            Ok(mut stream) => {
                delay = Duration::from_millis(100);
                // Whatever happened while no stream was open.
                for tx in workers.lock().await.values() {
                    let _ = tx.send(Msg::Runtime);
                }
                loop {
                    let event = tokio::select! {
                        () = shutdown.cancelled() => return,
                        event = stream.next() => event,
                    };
                    match event {
                        Some(Ok(event)) => {
                            let uid = event.pod_sandbox_status.and_then(|s| s.metadata).map(|m| m.uid);
                            if let Some(uid) = uid
                                && let Some(tx) = workers.lock().await.get(&uid)
                            {
                                let _ = tx.send(Msg::Runtime);
                            }
                        }
                        None => break,
                        Some(Err(error)) => {
                            tracing::warn!(error = %error.message(), "runtime event stream broke");
                            break;
                        }
                    }
                }
            }
            Err(error) => tracing::warn!(error = %error.message(), "runtime events unavailable"),
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(Duration::from_secs(5));
    }
}
