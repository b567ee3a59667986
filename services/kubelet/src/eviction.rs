//! Eviction under memory or disk pressure, as the upstream kubelet's hard thresholds
//! (`--eviction-hard`, `memory.available<100Mi` by default; `nodefs.available` defaults to the
//! DiskPressure threshold, `--disk-pressure-percent`).
//!
//! No cgroup limit holds the pods of a bubble (none is delegated on most sites), and a Slurm
//! job that outgrows its memory is killed whole by Slurm's cgroup. So the kubelet watches:
//! every [`Policy::interval`], memory available is the lower of the host's `MemAvailable` and
//! the node's allocatable memory (the job's grant) less what the pods' containers use (their
//! working sets, CRI `ListContainerStats`); disk available is the free space of the kubelet's
//! filesystem. Below a threshold, one pod is evicted per round, chosen as upstream chooses:
//! first the pods using more than they requested, then the lowest priority, then the largest
//! use beyond the request. Critical pods (priority 2,000,000,000 and above:
//! `system-cluster-critical`, `system-node-critical`) are never evicted. The pod fails with
//! reason `Evicted` and a message naming the resource, a Warning event `Evicted`, its
//! containers stopped at once. Not in connector mode (the runtime's machine is not this one).

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::Pod;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::pods::worker::Msg;
use crate::pods::{Context, lock};

/// Priority at and above which a pod is critical and never evicted.
pub const CRITICAL_PRIORITY: i32 = 2_000_000_000;

/// A threshold on an available amount.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Threshold {
    /// Bytes.
    Bytes(u64),
    /// A share of the total, in percent.
    Percent(f64),
}

impl Threshold {
    /// The threshold in bytes for a total of `total`.
    pub fn bytes(self, total: u64) -> u64 {
        match self {
            Threshold::Bytes(b) => b,
            Threshold::Percent(p) => (total as f64 * p / 100.0) as u64,
        }
    }
}

/// The hard thresholds.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Thresholds {
    /// `memory.available`.
    pub memory: Option<Threshold>,
    /// `nodefs.available`.
    pub nodefs: Option<Threshold>,
}

/// Parses `--eviction-hard`: `signal<quantity` items, comma-separated; signals
/// `memory.available` and `nodefs.available` (`imagefs.available` is the same filesystem here
/// and is taken as `nodefs.available`); quantities in bytes (`100Mi`) or percent (`10%`).
pub fn parse_thresholds(text: &str) -> Result<Thresholds, String> {
    let mut out = Thresholds::default();
    for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (signal, value) = item
            .split_once('<')
            .ok_or_else(|| format!("{item:?}: expected SIGNAL<QUANTITY, e.g. memory.available<100Mi"))?;
        let threshold = if let Some(p) = value.strip_suffix('%') {
            let p: f64 = p.parse().map_err(|_| format!("{item:?}: {value:?} is not a percentage"))?;
            if !(0.0..=100.0).contains(&p) {
                return Err(format!("{item:?}: {value:?} is not between 0% and 100%"));
            }
            Threshold::Percent(p)
        } else {
            let q = k8s_openapi::apimachinery::pkg::api::resource::Quantity(value.to_owned());
            let bytes = crate::quantity::units(&q).map_err(|e| format!("{item:?}: {e}"))?;
            Threshold::Bytes(u64::try_from(bytes).map_err(|_| format!("{item:?}: {value:?} is negative"))?)
        };
        match signal {
            "memory.available" => out.memory = Some(threshold),
            "nodefs.available" | "imagefs.available" => out.nodefs = Some(threshold),
            other => {
                return Err(format!(
                    "{other:?}: unknown eviction signal (memory.available, nodefs.available, imagefs.available)"
                ));
            }
        }
    }
    Ok(out)
}

/// What the eviction manager watches, and how often.
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    /// The hard thresholds.
    pub thresholds: Thresholds,
    /// How often it looks.
    pub interval: Duration,
}

/// The resource a node runs short of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource {
    /// `memory.available`.
    Memory,
    /// `nodefs.available`.
    Disk,
}

impl Resource {
    fn name(self) -> &'static str {
        match self {
            Resource::Memory => "memory",
            Resource::Disk => "ephemeral-storage",
        }
    }
}

/// One pod as the ranking sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodUse {
    /// The pod's UID.
    pub uid: String,
    /// Its priority (`spec.priority`, 0 when unset).
    pub priority: i32,
    /// What it uses of the resource, bytes.
    pub usage: u64,
    /// What it requested of it, bytes.
    pub request: u64,
}

/// The pod to evict for `resource`: over its request first, then the lowest priority, then
/// the largest use beyond the request; never a critical pod.
pub fn choose(pods: &[PodUse]) -> Option<&PodUse> {
    pods.iter().filter(|p| p.priority < CRITICAL_PRIORITY).min_by_key(|p| {
        let beyond = i128::from(p.usage) - i128::from(p.request);
        (p.usage <= p.request, p.priority, -beyond)
    })
}

/// The resource under pressure, with the threshold and what is available, if any.
pub fn pressure(
    thresholds: &Thresholds,
    memory: Option<(u64, u64)>,
    disk: Option<(u64, u64)>,
) -> Option<(Resource, u64, u64)> {
    let check = |t: Option<Threshold>, reading: Option<(u64, u64)>, r: Resource| {
        let (available, total) = reading?;
        let threshold = t?.bytes(total);
        (available < threshold).then_some((r, threshold, available))
    };
    check(thresholds.memory, memory, Resource::Memory)
        .or_else(|| check(thresholds.nodefs, disk, Resource::Disk))
}

/// The message a pod evicted for `resource` gets.
pub fn message(resource: Resource, threshold: u64, available: u64, victim: &PodUse) -> String {
    format!(
        "The node was low on resource: {}. Threshold quantity: {threshold}, available: {available}. The pod was using {} bytes, request is {}.",
        resource.name(),
        victim.usage,
        victim.request
    )
}

/// A pod's request of `resource` in bytes: the sum over its containers.
fn request(pod: &Pod, resource: Resource) -> u64 {
    let key = resource.name();
    pod.spec
        .iter()
        .flat_map(|s| s.containers.iter())
        .filter_map(|c| c.resources.as_ref()?.requests.as_ref()?.get(key))
        .filter_map(|q| crate::quantity::units(q).ok())
        .map(|v| u64::try_from(v).unwrap_or(0))
        .sum()
}

/// Watches until `shutdown`, telling the chosen pod's worker to evict it.
pub async fn run(
    ctx: Arc<Context>,
    workers: Arc<tokio::sync::Mutex<HashMap<String, mpsc::UnboundedSender<Msg>>>>,
    policy: Policy,
    root: PathBuf,
    shutdown: CancellationToken,
) {
    let mut evicted: HashSet<String> = HashSet::new();
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(policy.interval) => {}
        }
        let stats = match ctx
            .cri
            .runtime
            .clone()
            .list_container_stats(cri::ListContainerStatsRequest { filter: None })
            .await
        {
            Ok(r) => r.into_inner().stats,
            Err(e) => {
                tracing::debug!(error = %e.message(), "no container stats: no eviction this round");
                continue;
            }
        };
        let mut memory_use: HashMap<String, u64> = HashMap::new();
        let mut disk_use: HashMap<String, u64> = HashMap::new();
        for s in &stats {
            let Some(uid) = s.attributes.as_ref().and_then(|a| a.labels.get("io.kubernetes.pod.uid")) else {
                continue;
            };
            let memory = s.memory.as_ref().and_then(|m| m.working_set_bytes.as_ref()).map_or(0, |v| v.value);
            let disk = s.writable_layer.as_ref().and_then(|f| f.used_bytes.as_ref()).map_or(0, |v| v.value);
            *memory_use.entry(uid.clone()).or_default() += memory;
            *disk_use.entry(uid.clone()).or_default() += disk;
        }
        let allocatable = u64::try_from(ctx.node.borrow().allocatable.memory).unwrap_or(0);
        let used: u64 = memory_use.values().sum();
        let host = crate::node::conditions::memory_available().ok().and_then(|m| u64::try_from(m).ok());
        let memory = (allocatable > 0).then(|| {
            let granted = allocatable.saturating_sub(used);
            (host.map_or(granted, |h| h.min(granted)), allocatable)
        });
        let disk = hpk_node_resources::filesystem(&root)
            .ok()
            .map(|fs| (u64::try_from(fs.available).unwrap_or(0), u64::try_from(fs.total).unwrap_or(0)));
        let Some((resource, threshold, available)) = pressure(&policy.thresholds, memory, disk) else {
            evicted.clear();
            continue;
        };
        let pods: Vec<Arc<Pod>> = lock(&ctx.pods).values().cloned().collect();
        let usage = match resource {
            Resource::Memory => &memory_use,
            Resource::Disk => &disk_use,
        };
        let candidates: Vec<PodUse> = pods
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter(|p| {
                !matches!(p.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"))
            })
            .filter_map(|p| {
                let uid = p.metadata.uid.clone()?;
                Some(PodUse {
                    priority: p.spec.as_ref().and_then(|s| s.priority).unwrap_or(0),
                    usage: usage.get(&uid).copied().unwrap_or(0),
                    request: request(p, resource),
                    uid,
                })
            })
            .filter(|p| !evicted.contains(&p.uid))
            .collect();
        let Some(victim) = choose(&candidates) else {
            tracing::warn!(
                resource = resource.name(),
                threshold,
                available,
                "the node is low on a resource and has no pod to evict"
            );
            continue;
        };
        let message = message(resource, threshold, available, victim);
        let sent = workers
            .lock()
            .await
            .get(&victim.uid)
            .is_some_and(|tx| tx.send(Msg::Evict(message.clone())).is_ok());
        if sent {
            tracing::warn!(uid = %victim.uid, %message, "eviction");
            evicted.insert(victim.uid.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(uid: &str, priority: i32, usage: u64, request: u64) -> PodUse {
        PodUse { uid: uid.into(), priority, usage, request }
    }

    #[test]
    fn thresholds_are_read_as_upstream_writes_them() {
        let t = parse_thresholds("memory.available<100Mi, nodefs.available<10%").expect("parse");
        assert_eq!(t.memory, Some(Threshold::Bytes(100 << 20)));
        assert_eq!(t.nodefs, Some(Threshold::Percent(10.0)));
        assert_eq!(parse_thresholds("").expect("empty"), Thresholds::default());
        for bad in
            ["memory.available>1Gi", "cpu.available<1", "memory.available<lots", "nodefs.available<120%"]
        {
            assert!(parse_thresholds(bad).is_err(), "{bad} accepted");
        }
        assert_eq!(Threshold::Percent(10.0).bytes(1000), 100);
    }

    #[test]
    fn pressure_is_below_the_threshold_memory_first() {
        let t = Thresholds { memory: Some(Threshold::Bytes(100)), nodefs: Some(Threshold::Percent(10.0)) };
        assert_eq!(pressure(&t, Some((100, 1000)), Some((100, 1000))), None);
        assert_eq!(pressure(&t, Some((99, 1000)), Some((50, 1000))), Some((Resource::Memory, 100, 99)));
        assert_eq!(pressure(&t, Some((500, 1000)), Some((50, 1000))), Some((Resource::Disk, 100, 50)));
        assert_eq!(pressure(&t, None, None), None);
    }

    #[test]
    fn the_pod_over_its_request_goes_first_then_low_priority_then_the_largest() {
        let pods = [
            pod("within", 0, 100, 200),
            pod("over-small", 0, 150, 100),
            pod("over-large", 0, 900, 100),
            pod("over-important", 1000, 5000, 0),
            pod("critical", CRITICAL_PRIORITY, 99_999, 0),
        ];
        assert_eq!(choose(&pods).map(|p| p.uid.as_str()), Some("over-large"));
        assert_eq!(choose(&pods[..2]).map(|p| p.uid.as_str()), Some("over-small"));
        assert_eq!(
            choose(&[pods[0].clone(), pods[3].clone()]).map(|p| p.uid.as_str()),
            Some("over-important")
        );
        assert_eq!(choose(&pods[4..]), None, "a critical pod is never evicted");
    }
}
