//! The node's heartbeat: the Lease `kube-node-lease/<name>`, renewed every 10 s. The node
//! lifecycle controller marks the node Unknown when it lapses (40 s).

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// The namespace of node leases.
pub const NAMESPACE: &str = "kube-node-lease";
/// How long the lease holds without renewal.
pub const DURATION_SECONDS: i32 = 40;
/// How often it is renewed.
pub const RENEW_INTERVAL: Duration = Duration::from_secs(10);

/// Retry delays after a failure: 200 ms, doubling, at most 7 s.
#[derive(Debug)]
pub struct Backoff {
    next: Duration,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(200);
    const MAX: Duration = Duration::from_secs(7);

    /// Starts at the first delay.
    pub fn new() -> Self {
        Self { next: Self::FIRST }
    }

    /// The delay before the next attempt.
    pub fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = (self.next * 2).min(Self::MAX);
        delay
    }

    /// After a success: the next failure starts over.
    pub fn reset(&mut self) {
        self.next = Self::FIRST;
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new()
    }
}

/// The lease as the node holds it; owned by the Node (uid `node_uid`) when known, so that
/// deleting the Node deletes it.
pub fn desired(name: &str, node_uid: Option<&str>, now: MicroTime) -> Lease {
    let owner = node_uid.map(|uid| {
        vec![OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: name.to_owned(),
            uid: uid.to_owned(),
            ..Default::default()
        }]
    });
    Lease {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(NAMESPACE.to_owned()),
            owner_references: owner,
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(name.to_owned()),
            lease_duration_seconds: Some(DURATION_SECONDS),
            renew_time: Some(now),
            ..Default::default()
        }),
    }
}

/// Renews the lease once: a merge patch (one request, no read-modify-write), or a create when
/// it does not exist (first start, or the Node and with it the lease was deleted).
pub async fn renew(leases: &Api<Lease>, name: &str, node_uid: Option<&str>) -> Result<(), kube::Error> {
    let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
    let lease = desired(name, node_uid, now.clone());
    match leases.patch(name, &PatchParams::default(), &Patch::Merge(&lease)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => {
            let mut lease = lease;
            if let Some(spec) = lease.spec.as_mut() {
                spec.acquire_time = Some(now);
            }
            leases.create(&PostParams::default(), &lease).await?;
            info!(node = name, "lease created");
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// Renews every [`RENEW_INTERVAL`] until `shutdown`, at once at start; a failure is retried
/// with [`Backoff`] and never ends the loop. `node_uid` follows the registered Node.
pub async fn run(
    client: kube::Client,
    name: String,
    mut node_uid: watch::Receiver<Option<String>>,
    shutdown: CancellationToken,
) {
    let leases: Api<Lease> = Api::namespaced(client, NAMESPACE);
    let mut backoff = Backoff::new();
    loop {
        let uid = node_uid.borrow_and_update().clone();
        // A renewal that takes longer than the period is as good as failed.
        let renewal = tokio::time::timeout(RENEW_INTERVAL, renew(&leases, &name, uid.as_deref()));
        let result = tokio::select! {
            () = shutdown.cancelled() => return,
            result = renewal => result.map_err(|_| "no answer within the renewal period".to_owned()),
        };
        let wait = match result.and_then(|r| r.map_err(|e| e.to_string())) {
            Ok(()) => {
                debug!(node = %name, "lease renewed");
                backoff.reset();
                RENEW_INTERVAL
            }
            Err(e) => {
                let delay = backoff.next_delay();
                warn!(node = %name, error = %e, retry_ms = delay.as_millis() as u64, "lease renewal failed");
                delay
            }
        };
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
            // A re-registered Node: point the lease at it now.
            Ok(()) = node_uid.changed() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_seven_seconds_and_resets() {
        let mut b = Backoff::new();
        let delays: Vec<u128> = (0..8).map(|_| b.next_delay().as_millis()).collect();
        assert_eq!(delays, [200, 400, 800, 1600, 3200, 6400, 7000, 7000]);
        b.reset();
        assert_eq!(b.next_delay(), Duration::from_millis(200));
    }

    #[test]
    fn the_lease_names_its_holder_and_owner() {
        let now = MicroTime(k8s_openapi::jiff::Timestamp::from_second(1000).unwrap());
        let lease = desired("node1", Some("uid-1"), now.clone());
        let spec = lease.spec.unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some("node1"));
        assert_eq!(spec.lease_duration_seconds, Some(40));
        assert_eq!(spec.renew_time, Some(now.clone()));
        let owners = lease.metadata.owner_references.unwrap();
        assert_eq!((owners[0].kind.as_str(), owners[0].uid.as_str()), ("Node", "uid-1"));
        assert_eq!(lease.metadata.namespace.as_deref(), Some(NAMESPACE));
        assert!(desired("node1", None, now).metadata.owner_references.is_none());
    }

    /// An API server that accepts connections and never answers; returns its URL and how many
    /// connections it got.
    async fn silent_server() -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let seen = count.clone();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((conn, _)) = listener.accept().await {
                seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                held.push(conn);
            }
        });
        (url, count)
    }

    #[tokio::test]
    async fn a_silent_api_server_neither_crashes_nor_delays_shutdown() {
        let (url, connections) = silent_server().await;
        let client = kube::Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap();
        let (_uid_tx, uid_rx) = watch::channel(None);
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(run(client, "node1".into(), uid_rx, shutdown.clone()));
        tokio::time::timeout(Duration::from_secs(5), async {
            while connections.load(std::sync::atomic::Ordering::SeqCst) == 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("the lease loop tried to renew");
        assert!(!task.is_finished());
        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(1), task).await.expect("prompt shutdown").unwrap();
    }

    #[tokio::test]
    async fn failed_renewals_do_not_end_the_loop() {
        // Nothing listens: every renewal fails at once and is retried (200, 400 ms, …).
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let url = format!("http://127.0.0.1:{port}").parse().unwrap();
        let client = kube::Client::try_from(kube::Config::new(url)).unwrap();
        let (_uid_tx, uid_rx) = watch::channel(None);
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(run(client, "node1".into(), uid_rx, shutdown.clone()));
        tokio::time::sleep(Duration::from_millis(1000)).await;
        assert!(!task.is_finished(), "failures must not end the loop");
        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(1), task).await.expect("prompt shutdown").unwrap();
    }
}
