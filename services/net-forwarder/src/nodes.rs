//! The Kubernetes side of the tunnel: this node's pod CIDR, its published tunnel endpoint and
//! public key, and the other nodes as [`Peer`]s, all read from and written to the Node objects,
//! as the node's own identity (`system:node:<name>`).
//!
//! A Node becomes a peer once it has a `spec.podCIDR` (the controller-manager allocates it), an
//! [`ENDPOINT_ANNOTATION`] and a [`PUBLIC_KEY_ANNOTATION`] (its net-forwarder publishes both in
//! one patch). Until then it is not an error, only not yet a peer; a value that does not parse
//! is skipped, logged and counted. NodeRestriction lets a node patch only its own Node, so the
//! key on a Node is the one that node's net-forwarder made.

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddrV4;
use std::path::Path;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::cidr::PodCidr;
use crate::peers::{ENDPOINT_ANNOTATION, PUBLIC_KEY_ANNOTATION, Peer, parse_endpoint, validate};
use crate::tunnel::identity::PublicKey;
use crate::{Error, Result};

/// The first pause between retries of a failed API request; it doubles up to [`MAX_RETRY_DELAY`].
const FIRST_RETRY_DELAY: Duration = Duration::from_millis(100);
const MAX_RETRY_DELAY: Duration = Duration::from_secs(5);

/// This node's view of the cluster's Node objects.
pub struct NodeSync {
    client: kube::Client,
    node: String,
}

impl NodeSync {
    /// A client from a kubeconfig file (the node's identity, `system:node:<node>`).
    pub async fn connect(kubeconfig: &Path, node: &str) -> Result<Self> {
        let bad = |source| Error::Kubeconfig { path: kubeconfig.to_owned(), source };
        let file = Kubeconfig::read_from(kubeconfig).map_err(bad)?;
        let config =
            kube::Config::from_custom_kubeconfig(file, &KubeConfigOptions::default()).await.map_err(bad)?;
        let client = kube::Client::try_from(config)
            .map_err(|e| Error::kube(format!("client from {}", kubeconfig.display()), e))?;
        Ok(Self::new(client, node))
    }

    /// Wraps a client; `node` is the name of this node's Node object.
    pub fn new(client: kube::Client, node: &str) -> Self {
        Self { client, node: node.to_owned() }
    }

    /// This node's name.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// Waits until this node's Node object exists and has a `spec.podCIDR`, for at most
    /// `timeout`. API errors are retried with back-off within that bound; the error on timeout
    /// says what was missing (the Node, or its pod CIDR) and the last API error seen. A pod CIDR
    /// that does not parse is a configuration error at once.
    pub async fn pod_cidr(&self, timeout: Duration) -> Result<PodCidr> {
        let api: Api<Node> = Api::all(self.client.clone());
        let config = watcher::Config::default().fields(&format!("metadata.name={}", self.node));
        let mut events = pin!(watcher(api, config).default_backoff());
        let mut seen = OwnNode::default();
        let wait = async {
            while let Some(event) = events.next().await {
                if let Some(found) = seen.observe(&self.node, event) {
                    return found;
                }
            }
            Err(Error::Unavailable(format!("the watch of Node {} ended", self.node)))
        };
        match tokio::time::timeout(timeout, wait).await {
            Ok(found) => found,
            Err(_) => Err(seen.timed_out(&self.node, timeout)),
        }
    }

    /// Publishes this node's tunnel endpoint and public key in its [`ENDPOINT_ANNOTATION`] and
    /// [`PUBLIC_KEY_ANNOTATION`], in one merge patch of the Node (which NodeRestriction lets a
    /// node do to itself only), so no peer sees the new endpoint with the old key or the other
    /// way round. Retried within `timeout`.
    pub async fn publish_tunnel(
        &self,
        endpoint: SocketAddrV4,
        key: &PublicKey,
        timeout: Duration,
    ) -> Result<()> {
        // Refuse what no peer would accept, rather than publish it.
        parse_endpoint(&endpoint.to_string())?;
        PublicKey::parse(&key.to_string())?;
        let api: Api<Node> = Api::all(self.client.clone());
        let patch = Patch::Merge(serde_json::json!({"metadata": {"annotations": {
            ENDPOINT_ANNOTATION: endpoint.to_string(),
            PUBLIC_KEY_ANNOTATION: key.to_string(),
        }}}));
        let params = PatchParams::default();
        let what = format!("publish tunnel endpoint {endpoint} and public key on Node {}", self.node);
        retry(&what, timeout, || api.patch(&self.node, &params, &patch)).await?;
        info!(node = %self.node, %endpoint, public_key = %key, "tunnel endpoint and public key published");
        Ok(())
    }

    /// Watches all Nodes until `shutdown` is cancelled. After every change it sends the other
    /// nodes that are valid peers (see [`PeerTable`]) into `tx`, when that list differs from
    /// the last one. API errors and expired watches are retried with kube's back-off.
    ///
    /// The Node authorizer lets a node read only its own Node object (AuthorizeNodeWithSelectors,
    /// stable since Kubernetes 1.34), so the cluster must grant the nodes [`peer_reader_rbac`];
    /// until it does, the watch logs why it is refused and keeps retrying.
    pub async fn watch_peers(
        &self,
        own_cidr: PodCidr,
        tx: tokio::sync::watch::Sender<Vec<Peer>>,
        bad: Arc<AtomicU64>,
        shutdown: CancellationToken,
    ) {
        let api: Api<Node> = Api::all(self.client.clone());
        let mut events = pin!(watcher(api, watcher::Config::default()).default_backoff());
        let mut table = PeerTable::new(&self.node, own_cidr);
        // Nodes listed since the watch (re)started; they replace the table when the list is done.
        let mut relist: Option<BTreeMap<String, Advert>> = None;
        let mut failing = WatchFailure::default();
        loop {
            let event = tokio::select! {
                () = shutdown.cancelled() => return,
                event = events.next() => event,
            };
            if let Some(Ok(_)) = event {
                failing.recovered();
            }
            let changed = match event {
                None => {
                    warn!("node watch ended");
                    return;
                }
                Some(Ok(watcher::Event::Init)) => {
                    relist = Some(BTreeMap::new());
                    false
                }
                Some(Ok(watcher::Event::InitApply(node))) => {
                    relist.get_or_insert_default().insert(node_name(&node), Advert::of(&node));
                    false
                }
                Some(Ok(watcher::Event::InitDone)) => table.replace(relist.take().unwrap_or_default()),
                Some(Ok(watcher::Event::Apply(node))) => table.apply(&node),
                Some(Ok(watcher::Event::Delete(node))) => table.delete(&node),
                Some(Err(e)) => {
                    failing.report(&e);
                    false
                }
            };
            if changed {
                let peers = table.peers(&bad);
                let sent = tx.send_if_modified(|current| {
                    let differs = *current != peers;
                    if differs {
                        *current = peers;
                    }
                    differs
                });
                if sent {
                    debug!(peers = tx.borrow().len(), "peer list changed");
                }
            }
        }
    }
}

/// The name of the ClusterRole and ClusterRoleBinding of [`peer_reader_rbac`].
pub const PEER_READER: &str = "hpk:net-forwarder:peer-reader";

/// What the cluster must grant so that each node's net-forwarder can watch the other Nodes:
/// get, list and watch on Nodes for the group `system:nodes`. (Nodes used to read every Node;
/// the Node authorizer now allows only their own and leaves the rest to RBAC.) Read only: a
/// node still changes no Node but its own (NodeRestriction).
pub fn peer_reader_rbac() -> (ClusterRole, ClusterRoleBinding) {
    let metadata = ObjectMeta { name: Some(PEER_READER.to_owned()), ..Default::default() };
    let role = ClusterRole {
        metadata: metadata.clone(),
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["nodes".to_owned()]),
            verbs: ["get", "list", "watch"].map(str::to_owned).to_vec(),
            ..Default::default()
        }]),
        ..Default::default()
    };
    let binding = ClusterRoleBinding {
        metadata,
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".to_owned(),
            kind: "ClusterRole".to_owned(),
            name: PEER_READER.to_owned(),
        },
        subjects: Some(vec![Subject {
            api_group: Some("rbac.authorization.k8s.io".to_owned()),
            kind: "Group".to_owned(),
            name: "system:nodes".to_owned(),
            namespace: None,
        }]),
    };
    (role, binding)
}

/// The watch's current failure, so that a failure repeated at every back-off is logged once.
#[derive(Default)]
struct WatchFailure {
    last: Option<String>,
}

impl WatchFailure {
    fn report(&mut self, e: &watcher::Error) {
        let text = e.to_string();
        if self.last.as_deref() == Some(text.as_str()) {
            debug!(error = %text, "node watch still failing; retrying");
            return;
        }
        if forbidden(e) {
            warn!(
                error = %text,
                hint = "grant the nodes list and watch on Nodes (nodes::peer_reader_rbac)",
                "node watch refused; retrying"
            );
        } else {
            warn!(error = %text, "node watch failed; retrying");
        }
        self.last = Some(text);
    }

    fn recovered(&mut self) {
        if self.last.take().is_some() {
            info!("node watch recovered");
        }
    }
}

fn forbidden(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status)) => status.code == 403,
        watcher::Error::WatchError(status) => status.code == 403,
        _ => false,
    }
}

/// What the wait for this node's pod CIDR has seen so far, for the error on timeout.
#[derive(Default)]
struct OwnNode {
    /// `None` until the API server has answered a list: unknown; then whether the Node exists.
    exists: Option<bool>,
    /// Whether the current (re)list has returned the Node.
    listed: bool,
    last_error: Option<String>,
}

impl OwnNode {
    /// Takes one watch event; `Some` once the wait is over.
    fn observe(
        &mut self,
        name: &str,
        event: watcher::Result<watcher::Event<Node>>,
    ) -> Option<Result<PodCidr>> {
        match event {
            Ok(watcher::Event::Init) => self.listed = false,
            Ok(watcher::Event::InitDone) => self.exists = Some(self.listed),
            Ok(watcher::Event::Delete(_)) => self.exists = Some(false),
            Ok(watcher::Event::Apply(node) | watcher::Event::InitApply(node)) => {
                (self.exists, self.listed) = (Some(true), true);
                return node_pod_cidr(&node)
                    .map(|cidr| cidr.map_err(|e| Error::Config(format!("Node {name}: {e}"))));
            }
            Err(e) => {
                debug!(node = name, error = %e, "watching own Node failed; retrying");
                self.last_error = Some(e.to_string());
            }
        }
        None
    }

    fn timed_out(&self, name: &str, timeout: Duration) -> Error {
        let secs = timeout.as_secs_f64();
        let mut msg = match self.exists {
            None => format!("Node {name}: no answer from the API server within {secs} s"),
            Some(false) => format!("Node {name} not found (waited {secs} s; has its kubelet registered it?)"),
            Some(true) => format!(
                "Node {name} has no spec.podCIDR (waited {secs} s; is the controller-manager running with \
                 --allocate-node-cidrs?)"
            ),
        };
        if let Some(e) = &self.last_error {
            msg.push_str(&format!("; last API error: {e}"));
        }
        Error::Unavailable(msg)
    }
}

/// The three fields of a Node that make it a peer, as published (unparsed).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Advert {
    pod_cidr: Option<String>,
    endpoint: Option<String>,
    public_key: Option<String>,
}

impl Advert {
    fn of(node: &Node) -> Self {
        let annotation = |key: &str| node.metadata.annotations.as_ref().and_then(|a| a.get(key).cloned());
        Self {
            pod_cidr: node.spec.as_ref().and_then(|s| s.pod_cidr.clone()),
            endpoint: annotation(ENDPOINT_ANNOTATION),
            public_key: annotation(PUBLIC_KEY_ANNOTATION),
        }
    }

    /// `Ok(None)` while any field is missing (not yet a peer); an error names the bad value.
    fn peer(&self, name: &str) -> Result<Option<Peer>> {
        let (Some(cidr), Some(endpoint), Some(key)) = (&self.pod_cidr, &self.endpoint, &self.public_key)
        else {
            return Ok(None);
        };
        let bad = |what: String| Error::InvalidArgument(format!("Node {name}: {what}"));
        let pod_cidr = cidr.parse::<PodCidr>().map_err(|e| bad(format!("spec.podCIDR {cidr:?}: {e}")))?;
        let endpoint =
            parse_endpoint(endpoint).map_err(|e| bad(format!("annotation {ENDPOINT_ANNOTATION}: {e}")))?;
        let public_key =
            PublicKey::parse(key).map_err(|e| bad(format!("annotation {PUBLIC_KEY_ANNOTATION}: {e}")))?;
        Ok(Some(Peer { node: name.to_owned(), pod_cidr, endpoint, public_key }))
    }
}

fn node_name(node: &Node) -> String {
    node.metadata.name.clone().unwrap_or_default()
}

/// A Node's `spec.podCIDR`: `None` while unset, an error if it does not parse.
pub fn node_pod_cidr(node: &Node) -> Option<Result<PodCidr>> {
    let cidr = node.spec.as_ref()?.pod_cidr.as_deref()?;
    Some(cidr.parse().map_err(|e| Error::InvalidArgument(format!("spec.podCIDR {cidr:?}: {e}"))))
}

/// What Node `node` contributes to the peer list of node `own`: `Ok(None)` for `own` itself and
/// for a Node without a pod CIDR, endpoint or public key annotation yet; an error names a malformed value.
pub fn peer_of(node: &Node, own: &str) -> Result<Option<Peer>> {
    let name = node_name(node);
    if name == own {
        return Ok(None);
    }
    Advert::of(node).peer(&name)
}

/// The other Nodes as the watch has seen them, and the problems already reported.
pub struct PeerTable {
    own: String,
    own_cidr: PodCidr,
    nodes: BTreeMap<String, Advert>,
    /// (node, problem) pairs reported and still present: each is logged and counted once while
    /// it lasts, and forgotten once it is gone, so the set holds only current problems.
    reported: HashSet<(String, String)>,
}

impl PeerTable {
    /// An empty table for node `own` with pod CIDR `own_cidr`.
    pub fn new(own: &str, own_cidr: PodCidr) -> Self {
        Self { own: own.to_owned(), own_cidr, nodes: BTreeMap::new(), reported: HashSet::new() }
    }

    /// Records an added or changed Node; true if what it publishes changed.
    pub fn apply(&mut self, node: &Node) -> bool {
        let advert = Advert::of(node);
        self.nodes.insert(node_name(node), advert.clone()) != Some(advert)
    }

    /// Forgets a deleted Node; true if it was known.
    pub fn delete(&mut self, node: &Node) -> bool {
        self.nodes.remove(&node_name(node)).is_some()
    }

    fn replace(&mut self, nodes: BTreeMap<String, Advert>) -> bool {
        let changed = self.nodes != nodes;
        self.nodes = nodes;
        changed
    }

    /// The valid peers, sorted by node. Nodes with a malformed pod CIDR, endpoint or key, and peers
    /// [`validate`] refuses, are left out; each new problem is logged and adds one to `bad`.
    pub fn peers(&mut self, bad: &AtomicU64) -> Vec<Peer> {
        let mut problems = HashSet::new();
        let mut candidates = Vec::new();
        for (name, advert) in self.nodes.iter().filter(|(name, _)| **name != self.own) {
            match advert.peer(name) {
                Ok(Some(peer)) => candidates.push(peer),
                Ok(None) => {}
                Err(e) => {
                    problems.insert((name.clone(), e.to_string()));
                }
            }
        }
        let (good, refused) = validate(self.own_cidr, candidates);
        for (peer, why) in refused {
            problems.insert((peer.node.clone(), format!("peer {peer} refused: {why}")));
        }
        for (node, problem) in problems.difference(&self.reported) {
            warn!(%node, %problem, "node skipped as a tunnel peer");
            bad.fetch_add(1, Ordering::Relaxed);
        }
        self.reported = problems;
        good
    }
}

/// Runs `op` until it succeeds, fails for good, or `timeout` has passed, pausing between tries.
async fn retry<T, F, Fut>(what: &str, timeout: Duration, mut op: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = kube::Result<T>>,
{
    let deadline = Instant::now() + timeout;
    let mut delay = FIRST_RETRY_DELAY;
    let mut last = None;
    loop {
        match tokio::time::timeout_at(deadline, op()).await {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(e)) if !retryable(&e) => return Err(Error::kube(what, e)),
            Ok(Err(e)) => {
                debug!(action = what, error = %e, "API request failed; retrying");
                last = Some(e);
            }
            Err(_) => {}
        }
        if Instant::now() + delay >= deadline {
            let action = format!("{what} (gave up after {} s)", timeout.as_secs_f64());
            return Err(match last {
                Some(e) => Error::kube(action, e),
                None => Error::Unavailable(format!("{action}: no answer from the API server")),
            });
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(MAX_RETRY_DELAY);
    }
}

/// Whether a failed request may succeed if tried again: not when the API server refused it.
fn retryable(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(status) => !matches!(status.code, 400 | 401 | 403 | 405 | 422),
        _ => true,
    }
}

#[cfg(test)]
#[path = "nodes_tests.rs"]
mod tests;
