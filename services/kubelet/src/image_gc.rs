//! Image garbage collection, as the upstream kubelet does it (`imageGCHighThresholdPercent`,
//! `imageGCLowThresholdPercent`, `imageMinimumGCAge`, `imageMaximumGCAge`): every period, when
//! the images' filesystem is used at or above the high threshold, images no container uses
//! (running or not) are removed through CRI `RemoveImage`, the least recently used first,
//! until usage is down to the low threshold. An image is not removed before it has been unused
//! for the minimum age (a pull for a pod about to start is not undone), nor a pinned one.
//! With a maximum age, an image unused for longer is removed whatever the disk.
//!
//! When not enough can be freed, the Node gets a Warning event `FreeDiskSpaceFailed` with the
//! figures; each removal is logged and reported as a Normal event `ImageGCRemoved` on the
//! Node. "Last used" is known from the time this kubelet started: an image seen unused at
//! start counts as used then, and one that appears later (a pull) as used when it was first
//! seen (upstream's "first detected"), so that the minimum age keeps a pull for a pod whose
//! container is not created yet. In connector mode the images lie on the runtime's machine
//! and nothing is collected here.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_cri::v1 as cri;
use tokio_util::sync::CancellationToken;

use crate::cri::Cri;
use crate::events::{Events, Kind};

/// What the collection keeps.
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    /// Collect when the filesystem is used at or above this share, in percent.
    pub high_percent: u8,
    /// Collect down to this share.
    pub low_percent: u8,
    /// An image unused for less than this is kept.
    pub min_age: Duration,
    /// An image unused for longer than this is removed whatever the disk (none: never).
    pub max_age: Option<Duration>,
    /// How often the images are looked at.
    pub period: Duration,
}

/// An image as the collection sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// The runtime's image ID.
    pub id: String,
    /// Its size in bytes.
    pub size: u64,
    /// How long it has been unused (none: in use now).
    pub unused_for: Option<Duration>,
    /// Pinned by the runtime: never removed.
    pub pinned: bool,
}

/// What to remove: images unused past `max_age` always; then, if `to_free` bytes are wanted,
/// the least recently used of the others past `min_age` until that much is freed. Returns the
/// images to remove and the bytes they free.
pub fn choose(images: &[Candidate], policy: &Policy, to_free: u64) -> (Vec<String>, u64) {
    let mut eligible: Vec<&Candidate> =
        images.iter().filter(|c| !c.pinned && c.unused_for.is_some_and(|u| u >= policy.min_age)).collect();
    // Least recently used (longest unused) first; the ID breaks ties, for a stable order.
    eligible.sort_by(|a, b| b.unused_for.cmp(&a.unused_for).then_with(|| a.id.cmp(&b.id)));
    let (mut chosen, mut freed) = (Vec::new(), 0u64);
    for c in eligible {
        let too_old = policy.max_age.is_some_and(|max| c.unused_for.is_some_and(|u| u > max));
        if too_old || freed < to_free {
            chosen.push(c.id.clone());
            freed += c.size;
        }
    }
    (chosen, freed)
}

/// Bytes to free so that `used` of `total` comes down to `low_percent`; zero below
/// `high_percent`.
pub fn bytes_to_free(total: u64, used: u64, policy: &Policy) -> u64 {
    if total == 0 || used * 100 < total * u64::from(policy.high_percent) {
        return 0;
    }
    used.saturating_sub(total * u64::from(policy.low_percent) / 100)
}

/// The images as the collection sees them at `now`: what `containers` use is marked used now;
/// an image not seen before counts as last used when it was `detected` (upstream's
/// "first detected"), so that a pull for a pod about to start is kept for the minimum age
/// even when the pod's container is created just after the containers were listed; names of
/// images gone are forgotten.
fn candidates(
    images: &[cri::Image],
    containers: &[cri::Container],
    last_used: &mut HashMap<String, Instant>,
    now: Instant,
    detected: Instant,
) -> Vec<Candidate> {
    let mut used_now = std::collections::HashSet::new();
    for c in containers {
        for name in [c.image_ref.as_str(), c.image_id.as_str()]
            .into_iter()
            .chain(c.image.as_ref().map(|i| i.image.as_str()))
        {
            if !name.is_empty() {
                last_used.insert(name.to_owned(), now);
                used_now.insert(name);
            }
        }
    }
    let names = |image: &cri::Image| -> Vec<String> {
        std::iter::once(&image.id).chain(&image.repo_tags).chain(&image.repo_digests).cloned().collect()
    };
    let candidates = images
        .iter()
        .map(|image| {
            let names = names(image);
            let in_use = names.iter().any(|n| used_now.contains(n.as_str()));
            let used_at = names.iter().filter_map(|n| last_used.get(n)).max().copied();
            let used_at = used_at.unwrap_or_else(|| {
                last_used.insert(image.id.clone(), detected);
                detected
            });
            Candidate {
                id: image.id.clone(),
                size: image.size,
                unused_for: (!in_use).then(|| now.saturating_duration_since(used_at)),
                pinned: image.pinned,
            }
        })
        .collect();
    // Forget what is gone.
    let known: std::collections::HashSet<String> = images.iter().flat_map(names).collect();
    last_used.retain(|k, _| known.contains(k));
    candidates
}

/// Collects for ever (until `shutdown`). `root` lies on the images' filesystem (the node's
/// state directory, where the runtime keeps them too).
pub async fn run(
    cri: Cri,
    root: PathBuf,
    policy: Policy,
    events: Events,
    node: String,
    shutdown: CancellationToken,
) {
    let mut last_used: HashMap<String, Instant> = HashMap::new();
    let mut start = Some(Instant::now());
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(policy.period) => {}
        }
        if let Err(e) = round(&cri, &root, &policy, &events, &node, &mut last_used, &mut start).await {
            tracing::warn!(error = %e, "image garbage collection failed this round");
        }
    }
}

async fn round(
    cri: &Cri,
    root: &std::path::Path,
    policy: &Policy,
    events: &Events,
    node: &str,
    last_used: &mut HashMap<String, Instant>,
    start: &mut Option<Instant>,
) -> Result<(), String> {
    let images = cri
        .images
        .clone()
        .list_images(cri::ListImagesRequest { filter: None })
        .await
        .map_err(|e| format!("ListImages: {}", e.message()))?
        .into_inner()
        .images;
    let containers = cri
        .runtime
        .clone()
        .list_containers(cri::ListContainersRequest { filter: None })
        .await
        .map_err(|e| format!("ListContainers: {}", e.message()))?
        .into_inner()
        .containers;
    let now = Instant::now();
    // Images there at the first round count as detected when this kubelet started.
    let detected = start.take().unwrap_or(now);
    let candidates = candidates(&images, &containers, last_used, now, detected);

    let fs = hpk_node_resources::filesystem(root).map_err(|e| e.to_string())?;
    let total = u64::try_from(fs.total).unwrap_or(0);
    let used = total.saturating_sub(u64::try_from(fs.available).unwrap_or(0));
    let to_free = bytes_to_free(total, used, policy);
    let (chosen, eligible_bytes) = choose(&candidates, policy, to_free);
    let mut freed = 0u64;
    for id in &chosen {
        let size = candidates.iter().find(|c| &c.id == id).map_or(0, |c| c.size);
        let name = images
            .iter()
            .find(|i| &i.id == id)
            .and_then(|i| i.repo_tags.first().cloned())
            .unwrap_or_else(|| id.clone());
        let removed = cri
            .images
            .clone()
            .remove_image(cri::RemoveImageRequest {
                image: Some(cri::ImageSpec { image: id.clone(), ..Default::default() }),
            })
            .await;
        match removed {
            Ok(_) => {
                freed += size;
                tracing::info!(image = %name, size, "image removed by garbage collection");
                events.publish_node(
                    node,
                    Kind::Normal,
                    "ImageGCRemoved",
                    format!("removed unused image {name} ({size} bytes)"),
                );
            }
            // In use after all (a container created since the list): kept.
            Err(e) => tracing::info!(image = %name, error = %e.message(), "image not removed"),
        }
    }
    if to_free > 0 && freed < to_free {
        let note = format!(
            "Failed to garbage collect required amount of images. Attempted to free {to_free} bytes, but only found {eligible_bytes} bytes eligible to free."
        );
        tracing::warn!("{note}");
        events.publish_node(node, Kind::Warning, "FreeDiskSpaceFailed", note);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> Policy {
        Policy {
            high_percent: 85,
            low_percent: 80,
            min_age: Duration::from_secs(120),
            max_age: None,
            period: Duration::from_secs(300),
        }
    }

    fn image(id: &str, size: u64, unused_secs: Option<u64>) -> Candidate {
        Candidate { id: id.into(), size, unused_for: unused_secs.map(Duration::from_secs), pinned: false }
    }

    #[test]
    fn nothing_is_freed_below_the_high_threshold_and_down_to_the_low_one_above() {
        assert_eq!(bytes_to_free(1000, 849, &policy()), 0);
        assert_eq!(bytes_to_free(1000, 850, &policy()), 50);
        assert_eq!(bytes_to_free(1000, 990, &policy()), 190);
        assert_eq!(bytes_to_free(0, 0, &policy()), 0);
    }

    #[test]
    fn the_least_recently_used_go_first_and_only_as_many_as_needed() {
        let images = [
            image("in-use", 500, None),
            image("young", 500, Some(60)),
            image("old", 100, Some(3600)),
            image("older", 100, Some(7200)),
            image("oldest", 100, Some(9000)),
            Candidate { pinned: true, ..image("pinned", 900, Some(99_999)) },
        ];
        assert_eq!(choose(&images, &policy(), 150), (vec!["oldest".to_owned(), "older".to_owned()], 200));
        // Never the image in use, the young one or the pinned one, however much is wanted.
        assert_eq!(choose(&images, &policy(), 10_000).0, ["oldest", "older", "old"]);
        assert_eq!(choose(&images, &policy(), 0), (vec![], 0));
    }

    #[test]
    fn past_the_maximum_age_an_image_goes_whatever_the_disk() {
        let policy = Policy { max_age: Some(Duration::from_secs(3600)), ..policy() };
        let images = [image("old", 100, Some(3000)), image("stale", 100, Some(4000))];
        assert_eq!(choose(&images, &policy, 0).0, ["stale"]);
    }

    fn cri_image(id: &str, tag: &str) -> cri::Image {
        cri::Image { id: id.into(), repo_tags: vec![tag.into()], size: 100, ..Default::default() }
    }

    #[test]
    fn a_pull_counts_as_used_when_first_seen_and_an_image_in_use_is_never_a_candidate() {
        let started = Instant::now();
        let mut last_used = HashMap::new();
        let old = cri_image("sha256:old", "reg/old:1");
        // First round, an hour after start: the image there since start is an hour unused.
        let t1 = started + Duration::from_secs(3600);
        let c = candidates(std::slice::from_ref(&old), &[], &mut last_used, t1, started);
        assert_eq!(c[0].unused_for, Some(Duration::from_secs(3600)));
        // A later round: a fresh pull, its container not created yet, is 0 s unused, so the
        // minimum age keeps it; the running container's image is in use.
        let fresh = cri_image("sha256:fresh", "reg/fresh:1");
        let running = cri::Container {
            image_ref: "sha256:old".into(),
            image: Some(cri::ImageSpec { image: "reg/old:1".into(), ..Default::default() }),
            ..Default::default()
        };
        let t2 = t1 + Duration::from_secs(10);
        let both = [old.clone(), fresh.clone()];
        let c = candidates(&both, std::slice::from_ref(&running), &mut last_used, t2, t2);
        assert_eq!(c[0].unused_for, None, "in use");
        assert_eq!(c[1].unused_for, Some(Duration::ZERO), "first seen now");
        assert!(choose(&c, &policy(), 10_000).0.is_empty(), "{c:?}");
        // Three minutes on, both unused: the old one since its container went, the fresh one
        // since it was first seen; both past the minimum age, the fresh one longer unused.
        let t3 = t2 + Duration::from_secs(180);
        let c = candidates(&both, &[], &mut last_used, t3, t3);
        assert_eq!(c[0].unused_for, Some(Duration::from_secs(180)));
        assert_eq!(c[1].unused_for, Some(Duration::from_secs(180)));
        assert_eq!(choose(&c, &policy(), 10_000).0, ["sha256:fresh", "sha256:old"]);
        // An image gone is forgotten: pulled again, it is new again.
        let _ = candidates(std::slice::from_ref(&old), &[], &mut last_used, t3, t3);
        let t4 = t3 + Duration::from_secs(1);
        let c = candidates(&both, &[], &mut last_used, t4, t4);
        assert_eq!(c[1].unused_for, Some(Duration::ZERO));
    }
}
