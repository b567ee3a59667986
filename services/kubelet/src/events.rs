//! Events to the API (events.k8s.io/v1): Pulling, Pulled, Created, Started, Killing, BackOff,
//! Unhealthy, FailedMount… An event that repeats — same object and field path, type, reason
//! and note — within [`SERIES_TTL`] of its last time is counted as a series of the first
//! (`series.count`, `series.lastObservedTime`), as upstream's recorder aggregates identical
//! events. The note is part of that key: a readiness probe that now fails for another reason,
//! or a liveness probe failing beside it, is an event of its own with its own words
//! (kube-runtime's `Recorder` leaves the note out of its key, and showed such failures as
//! repeats of the first message). At most [`MAX_SERIES`] series are remembered.
//! Publishing never blocks a pod worker: each event goes out on a task of its own, and a failure
//! is logged, never fatal.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::api::events::v1::{Event as K8sEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, Patch, PatchParams, PostParams};

/// How long after its last time an event may still be counted as a repeat.
pub const SERIES_TTL: Duration = Duration::from_secs(6 * 60);
/// The most series remembered; the oldest is forgotten first.
pub const MAX_SERIES: usize = 4096;

/// Normal or Warning.
pub use kube::runtime::events::EventType as Kind;

/// What makes two events the same.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    namespace: Option<String>,
    kind: Option<String>,
    name: Option<String>,
    uid: Option<String>,
    field_path: Option<String>,
    warning: bool,
    reason: String,
    note: String,
}

/// A series: the event's name, how many times, when last.
#[derive(Clone, Debug)]
struct Seen {
    name: String,
    count: i32,
    last: Instant,
}

/// The series remembered, bounded.
#[derive(Default)]
struct SeriesCache {
    seen: HashMap<Key, Seen>,
}

impl SeriesCache {
    /// Records one more of `key` at `now`: the existing series' name and new count, or None
    /// for a first (then remembered as `name`).
    fn note(&mut self, key: Key, name: &str, now: Instant) -> Option<(String, i32)> {
        self.seen.retain(|_, s| now.duration_since(s.last) < SERIES_TTL);
        if let Some(seen) = self.seen.get_mut(&key) {
            seen.count = seen.count.saturating_add(1);
            seen.last = now;
            return Some((seen.name.clone(), seen.count));
        }
        if self.seen.len() >= MAX_SERIES
            && let Some(oldest) = self.seen.iter().min_by_key(|(_, s)| s.last).map(|(k, _)| k.clone())
        {
            self.seen.remove(&oldest);
        }
        self.seen.insert(key, Seen { name: name.to_owned(), count: 1, last: now });
        None
    }
}

/// Events about pods and the node, as this node's kubelet.
#[derive(Clone)]
pub struct Events {
    client: kube::Client,
    instance: String,
    cache: Arc<Mutex<SeriesCache>>,
}

impl Events {
    /// Events reported by `kubelet` on `node`.
    pub fn new(client: kube::Client, node: &str) -> Self {
        Self { client, instance: node.to_owned(), cache: Arc::default() }
    }

    /// Publishes `reason` (`action` is what was attempted) about `pod`, or about one of its
    /// containers (`field_path` `spec.containers{name}` / `spec.initContainers{name}`).
    pub fn publish(&self, pod: &Pod, field_path: Option<String>, kind: Kind, reason: &str, note: String) {
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
    pub fn publish_node(&self, node: &str, kind: Kind, reason: &str, note: String) {
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

    /// Sends one event about `reference` on a task of its own (a repeat patches its series);
    /// a note over 1000 bytes is cut (at a character boundary).
    fn send(&self, reference: ObjectReference, kind: Kind, reason: &str, mut note: String) {
        if note.len() > 1000 {
            let mut cut = 1000;
            while !note.is_char_boundary(cut) {
                cut -= 1;
            }
            note.truncate(cut);
        }
        let key = Key {
            namespace: reference.namespace.clone(),
            kind: reference.kind.clone(),
            name: reference.name.clone(),
            uid: reference.uid.clone(),
            field_path: reference.field_path.clone(),
            warning: matches!(kind, Kind::Warning),
            reason: reason.to_owned(),
            note: note.clone(),
        };
        let now = k8s_openapi::jiff::Timestamp::now();
        let fresh = format!("{}.{:x}", reference.name.as_deref().unwrap_or("kubelet"), now.as_nanosecond());
        let repeat = self.cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner).note(
            key,
            &fresh,
            Instant::now(),
        );
        let namespace = reference.namespace.clone().unwrap_or_else(|| "default".into());
        let event = K8sEvent {
            metadata: ObjectMeta {
                name: Some(repeat.as_ref().map_or(fresh, |(name, _)| name.clone())),
                namespace: Some(namespace.clone()),
                ..Default::default()
            },
            action: Some(reason.to_owned()),
            reason: Some(reason.to_owned()),
            note: Some(note),
            event_time: Some(MicroTime(now)),
            regarding: Some(reference),
            reporting_controller: Some("kubelet".into()),
            reporting_instance: Some(self.instance.clone()),
            type_: Some(match kind {
                Kind::Normal => "Normal".into(),
                Kind::Warning => "Warning".into(),
            }),
            series: repeat
                .as_ref()
                .map(|(_, count)| EventSeries { count: *count, last_observed_time: MicroTime(now) }),
            ..Default::default()
        };
        let api: Api<K8sEvent> = Api::namespaced(self.client.clone(), &namespace);
        tokio::spawn(async move {
            let published = match &event.series {
                // A repeat patches the series; if the first is not there (not created yet, or
                // gone), it is created with the series.
                Some(series) => {
                    let name = event.metadata.name.clone().unwrap_or_default();
                    let patch = serde_json::json!({"series": series});
                    match api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                        Err(kube::Error::Api(e)) if e.code == 404 => {
                            api.create(&PostParams::default(), &event).await.map(|_| ())
                        }
                        other => other.map(|_| ()),
                    }
                }
                None => api.create(&PostParams::default(), &event).await.map(|_| ()),
            };
            if let Err(error) = published {
                let about = event.regarding.as_ref().map_or(String::new(), |r| {
                    format!("{}/{}", r.kind.as_deref().unwrap_or(""), r.name.as_deref().unwrap_or(""))
                });
                tracing::warn!(reason = ?event.reason, %about, %error, "event not published");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(note: &str, field_path: &str) -> Key {
        Key {
            namespace: Some("default".into()),
            kind: Some("Pod".into()),
            name: Some("web".into()),
            uid: Some("u1".into()),
            field_path: Some(field_path.into()),
            warning: true,
            reason: "Unhealthy".into(),
            note: note.into(),
        }
    }

    #[test]
    fn a_repeat_counts_but_another_note_is_its_own_event() {
        let mut cache = SeriesCache::default();
        let t0 = Instant::now();
        let refused = key("Readiness probe failed: connection refused", "spec.containers{app}");
        assert_eq!(cache.note(refused.clone(), "web.1", t0), None);
        assert_eq!(cache.note(refused.clone(), "web.2", t0), Some(("web.1".into(), 2)));
        assert_eq!(cache.note(refused.clone(), "web.3", t0), Some(("web.1".into(), 3)));
        // Another message (the same probe's new cause, or the liveness probe): a new event.
        let not_found = key("Readiness probe failed: NotFound", "spec.containers{app}");
        assert_eq!(cache.note(not_found.clone(), "web.4", t0), None);
        assert_eq!(cache.note(not_found, "web.5", t0), Some(("web.4".into(), 2)));
        // Another container: its own.
        assert_eq!(
            cache.note(key("Readiness probe failed: connection refused", "spec.containers{b}"), "web.6", t0),
            None
        );
        // Past the TTL since its last time, a repeat starts a new series.
        let later = t0 + SERIES_TTL;
        assert_eq!(cache.note(refused, "web.7", later), None);
    }

    #[test]
    fn the_cache_is_bounded_and_forgets_the_oldest() {
        let mut cache = SeriesCache::default();
        let t0 = Instant::now();
        for i in 0..MAX_SERIES {
            let at = t0 + Duration::from_millis(i as u64);
            assert_eq!(cache.note(key(&i.to_string(), "p"), &format!("e{i}"), at), None);
        }
        let at = t0 + Duration::from_millis(MAX_SERIES as u64);
        assert_eq!(cache.note(key("new", "p"), "new", at), None);
        assert_eq!(cache.seen.len(), MAX_SERIES);
        // The oldest (0) is forgotten; the next oldest still counts.
        assert_eq!(cache.note(key("0", "p"), "again", at), None);
        assert_eq!(cache.note(key("2", "p"), "x", at), Some(("e2".into(), 2)));
    }
}
