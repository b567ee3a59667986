//! The node's GPUs: the `nvidia.com/gpu` devices of the CDI specs this kubelet's node has
//! (the bubble's launcher writes one for the allocation's GPUs), each given to one container
//! at a time. A container that asks for `nvidia.com/gpu: N` gets N devices no other container
//! holds, by their CDI names, which the runtime resolves into device nodes and driver files;
//! the pod keeps them until it is terminated. Which container holds which device is written on
//! the container (annotation [`ANNOTATION`]), so a restarted kubelet takes it over.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::Container;

/// The container annotation naming the GPUs (CDI device names, comma-separated) it holds.
pub const ANNOTATION: &str = "hpk.io/gpus";

/// The node's GPUs and who holds them.
#[derive(Debug, Default)]
pub struct Gpus {
    /// Device names within [`hpk_cdi::GPU_KIND`], in order.
    devices: Vec<String>,
    /// Pod UID → container → devices.
    held: Mutex<BTreeMap<String, BTreeMap<String, Vec<String>>>>,
    /// Where the specs were read, for errors.
    dirs: Vec<PathBuf>,
}

impl Gpus {
    /// The GPUs the CDI specs in `dirs` describe (a device named `all` is not one); specs that
    /// cannot be read are logged and left out.
    pub fn discover(dirs: &[PathBuf]) -> Self {
        let (registry, errors) = hpk_cdi::Registry::load(dirs);
        for error in &errors {
            tracing::warn!(%error, "a CDI spec left out");
        }
        let devices: Vec<String> =
            registry.device_names(hpk_cdi::GPU_KIND).into_iter().filter(|d| d != "all").collect();
        Self { devices, held: Mutex::default(), dirs: dirs.to_vec() }
    }

    /// GPUs named `devices`.
    pub fn new(devices: Vec<String>) -> Self {
        Self { devices, ..Self::default() }
    }

    /// How many there are.
    pub fn count(&self) -> usize {
        self.devices.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, BTreeMap<String, Vec<String>>>> {
        self.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `n` GPUs for container `container` of pod `uid`, qualified CDI names: the ones it holds
    /// already, else the first free ones; what the pod's init containers `reusable` held is
    /// free for it (they have run to completion before it starts, as upstream's device manager
    /// has it). Err: why there are not enough.
    pub fn allocate(
        &self,
        uid: &str,
        container: &str,
        n: usize,
        reusable: &[String],
    ) -> Result<Vec<String>, String> {
        let mut held = self.lock();
        if let Some(devices) = held.get(uid).and_then(|c| c.get(container))
            && devices.len() == n
        {
            return Ok(devices.iter().map(|d| hpk_cdi::qualified(hpk_cdi::GPU_KIND, d)).collect());
        }
        let taken: std::collections::BTreeSet<&String> = held
            .iter()
            .flat_map(|(u, containers)| {
                containers
                    .iter()
                    .filter(move |(c, _)| !(u == uid && (*c == container || reusable.contains(c))))
                    .flat_map(|(_, d)| d)
            })
            .collect();
        let free: Vec<String> = self.devices.iter().filter(|d| !taken.contains(d)).take(n).cloned().collect();
        if free.len() < n {
            return Err(if self.devices.is_empty() {
                format!(
                    "{n} {} asked for, and this node has none that a CDI spec describes (in {})",
                    hpk_cdi::GPU_KIND,
                    self.dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", ")
                )
            } else {
                format!(
                    "{n} {} asked for, {} of the node's {} free",
                    hpk_cdi::GPU_KIND,
                    self.devices.len() - taken.len(),
                    self.devices.len()
                )
            });
        }
        let qualified = free.iter().map(|d| hpk_cdi::qualified(hpk_cdi::GPU_KIND, d)).collect();
        held.entry(uid.to_owned()).or_default().insert(container.to_owned(), free);
        Ok(qualified)
    }

    /// Takes over what a container of a previous kubelet held (its [`ANNOTATION`]).
    pub fn adopt(&self, uid: &str, container: &str, annotation: &str) {
        let devices: Vec<String> = annotation
            .split(',')
            .filter_map(|q| hpk_cdi::parse_qualified(q.trim()).ok())
            .filter(|(kind, name)| *kind == hpk_cdi::GPU_KIND && self.devices.iter().any(|d| d == name))
            .map(|(_, name)| name.to_owned())
            .collect();
        if !devices.is_empty() {
            self.lock().entry(uid.to_owned()).or_default().insert(container.to_owned(), devices);
        }
    }

    /// Frees whatever pod `uid` holds.
    pub fn release(&self, uid: &str) {
        self.lock().remove(uid);
    }
}

/// How many GPUs `container` asks for: its `nvidia.com/gpu` limit (an extended resource's
/// request must equal its limit; the API server checks), else its request.
pub fn wanted(container: &Container) -> usize {
    let r = container.resources.as_ref();
    let pick = |m: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>| {
        m.and_then(|m| m.get(hpk_cdi::GPU_KIND)).and_then(|q| q.0.trim().parse::<usize>().ok())
    };
    pick(r.and_then(|r| r.limits.as_ref())).or_else(|| pick(r.and_then(|r| r.requests.as_ref()))).unwrap_or(0)
}

/// The environment a container with `n` GPUs gets: NVIDIA's and CUDA's device lists, numbered
/// as the container sees them (0 … n-1).
pub fn env(n: usize) -> Vec<(String, String)> {
    let list = (0..n).map(|i| i.to_string()).collect::<Vec<_>>().join(",");
    vec![("NVIDIA_VISIBLE_DEVICES".into(), list.clone()), ("CUDA_VISIBLE_DEVICES".into(), list)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_pods_never_share_a_gpu_and_a_pod_keeps_its_own() {
        let gpus = Gpus::new(vec!["0".into(), "1".into(), "2".into()]);
        assert_eq!(
            gpus.allocate("a", "c", 2, &[]),
            Ok(vec!["nvidia.com/gpu=0".to_owned(), "nvidia.com/gpu=1".to_owned()])
        );
        // A restart of the container: the same devices.
        assert_eq!(gpus.allocate("a", "c", 2, &[]).expect("again"), ["nvidia.com/gpu=0", "nvidia.com/gpu=1"]);
        assert_eq!(gpus.allocate("b", "c", 1, &[]).expect("the last"), ["nvidia.com/gpu=2"]);
        let err = gpus.allocate("c", "c", 1, &[]).expect_err("none free");
        assert!(err.contains("0 of the node's 3 free"), "{err}");
        gpus.release("a");
        assert_eq!(gpus.allocate("c", "c", 2, &[]).expect("freed"), ["nvidia.com/gpu=0", "nvidia.com/gpu=1"]);
        // A pod's init container's GPUs go on to its containers; not to another pod's.
        gpus.release("c");
        assert_eq!(
            gpus.allocate("p", "init", 2, &[]).expect("init"),
            ["nvidia.com/gpu=0", "nvidia.com/gpu=1"]
        );
        assert!(
            gpus.allocate("q", "app", 1, &["init".into()]).is_err(),
            "another pod's init container holds them"
        );
        let app = gpus.allocate("p", "app", 2, &["init".into()]).expect("the init container's");
        assert_eq!(app, ["nvidia.com/gpu=0", "nvidia.com/gpu=1"]);
    }

    #[test]
    fn a_restarted_kubelet_takes_over_what_containers_hold() {
        let gpus = Gpus::new(vec!["0".into(), "1".into()]);
        gpus.adopt("a", "c", "nvidia.com/gpu=1, nvidia.com/gpu=9, example.com/x=0, junk");
        assert_eq!(gpus.allocate("b", "c", 1, &[]).expect("the free one"), ["nvidia.com/gpu=0"]);
        assert!(gpus.allocate("d", "c", 1, &[]).is_err(), "device 1 is held by the adopted container");
    }

    #[test]
    fn a_node_without_a_spec_says_where_it_looked() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let gpus = Gpus::discover(&[tmp.path().to_owned()]);
        assert_eq!(gpus.count(), 0);
        let err = gpus.allocate("a", "c", 1, &[]).expect_err("none");
        assert!(
            err.contains("none that a CDI spec describes") && err.contains(&tmp.path().display().to_string()),
            "{err}"
        );
    }

    #[test]
    fn the_request_is_the_limit_and_the_environment_counts_from_zero() {
        let c: Container = serde_json::from_value(serde_json::json!({
            "name": "c", "resources": {"limits": {"nvidia.com/gpu": "2"}}
        }))
        .expect("container");
        assert_eq!(wanted(&c), 2);
        assert_eq!(wanted(&Container::default()), 0);
        assert_eq!(
            env(2),
            [
                ("NVIDIA_VISIBLE_DEVICES".to_owned(), "0,1".to_owned()),
                ("CUDA_VISIBLE_DEVICES".to_owned(), "0,1".to_owned())
            ]
        );
    }
}
