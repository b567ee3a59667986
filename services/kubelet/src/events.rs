//! Events to the API (events.k8s.io/v1 through kube-runtime's recorder, which counts repeats
//! as a series): Pulling, Pulled, Created, Started, Killing, BackOff, Unhealthy, FailedMount…
//! Publishing never blocks a pod worker: each event goes out on a task of its own, and a failure
//! is logged, never fatal.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

/// Events about pods, as this node's kubelet.
#[derive(Clone)]
pub struct Events {
    recorder: Arc<Recorder>,
}

/// Normal or Warning.
pub use kube::runtime::events::EventType as Kind;

impl Events {
    /// Events reported by `kubelet` on `node`.
    pub fn new(client: kube::Client, node: &str) -> Self {
        let reporter = Reporter { controller: "kubelet".into(), instance: Some(node.to_owned()) };
        Self { recorder: Arc::new(Recorder::new(client, reporter)) }
    }

    /// Publishes `reason` (`action` is what was attempted) about `pod`, or about one of its
    /// containers (`field_path` `spec.containers{name}` / `spec.initContainers{name}`).
    pub fn publish(
        &self,
        pod: &Pod,
        field_path: Option<String>,
        kind: EventType,
        reason: &str,
        note: String,
    ) {
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: pod.metadata.name.clone(),
            namespace: pod.metadata.namespace.clone(),
            uid: pod.metadata.uid.clone(),
            resource_version: pod.metadata.resource_version.clone(),
            field_path,
        };
        self.send(reference, kind, reason, note);
    }

    /// Publishes `reason` about Node `node` (image garbage collection, eviction).
    pub fn publish_node(&self, node: &str, kind: EventType, reason: &str, note: String) {
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(node.to_owned()),
            // As the upstream kubelet: a Node's events name it by its name as UID.
            uid: Some(node.to_owned()),
            ..Default::default()
        };
        self.send(reference, kind, reason, note);
    }

    /// Sends one event about `reference` on a task of its own; a note over 1000 bytes is cut
    /// (at a character boundary).
    fn send(&self, reference: ObjectReference, kind: EventType, reason: &str, mut note: String) {
        if note.len() > 1000 {
            let mut cut = 1000;
            while !note.is_char_boundary(cut) {
                cut -= 1;
            }
            note.truncate(cut);
        }
        let event = Event {
            type_: kind,
            reason: reason.to_owned(),
            note: Some(note),
            action: reason.to_owned(),
            secondary: None,
        };
        let recorder = Arc::clone(&self.recorder);
        tokio::spawn(async move {
            if let Err(error) = recorder.publish(&event, &reference).await {
                let about = format!(
                    "{}/{}",
                    reference.kind.as_deref().unwrap_or(""),
                    reference.name.as_deref().unwrap_or("")
                );
                tracing::warn!(reason = %event.reason, %about, %error, "event not published");
            }
        });
    }
}
