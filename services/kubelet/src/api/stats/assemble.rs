//! A [`Summary`] from the runtime's answers and the node's readings. Nothing here does I/O (the
//! log directories are measured by a function the caller gives), so tests feed it hand-made CRI
//! responses.
//!
//! - Pods: the READY sandboxes, sorted by namespace and name. Their CPU, memory and process count
//!   are the sandbox's own figures (the pod-runtime counts every process of the sandbox, pause
//!   included), else the sum of their containers'; their network is the sandbox's namespace's.
//! - Containers: the RUNNING ones the runtime has stats for, sorted by name; `startTime` is their
//!   creation, as upstream's CRI stats provider gives it.
//! - Filesystems: a container's `rootfs` is its writable layer on the runtime's image filesystem,
//!   its `logs` its log directory on the kubelet's; a pod's `ephemeral-storage` adds both up for
//!   all its containers, on the kubelet's filesystem.
//! - `usageNanoCores` comes from [`CpuRates`]; keys not seen in this summary are forgotten.

use std::collections::{HashMap, HashSet};

use k8s_cri::v1 as cri;

use super::node::{FsReading, NodeReadings, node_network};
use super::rate::CpuRates;
use super::summary::{
    ContainerStats, CpuStats, FsStats, InterfaceStats, MemoryStats, NetworkStats, NodeStats, PodReference,
    PodStats, ProcessStats, RlimitStats, RuntimeStats, Summary, Timestamp,
};

/// The label the kubelet puts a container's spec name in.
const CONTAINER_NAME_LABEL: &str = "io.kubernetes.container.name";

/// The rate key of the node itself.
const NODE_KEY: &str = "node";

/// What the runtime answered, one call each.
#[derive(Clone, Debug, Default)]
pub struct RuntimeView {
    /// `ListPodSandboxStats`.
    pub sandbox_stats: Vec<cri::PodSandboxStats>,
    /// `ListPodSandbox`: each sandbox's state and creation.
    pub sandboxes: Vec<cri::PodSandbox>,
    /// `ListContainers`: each container's state, creation and spec name.
    pub containers: Vec<cri::Container>,
    /// `ImageFsInfo`'s image filesystem, when the runtime gives one.
    pub image_fs: Option<ImageFs>,
}

/// The runtime's image filesystem.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ImageFs {
    /// What `ImageFsInfo` says: the mount point and what images use of it.
    pub usage: cri::FilesystemUsage,
    /// `statvfs` of that mount point, when the kubelet can see it.
    pub fs: Option<FsReading>,
}

/// Bytes and inodes under a directory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DirUsage {
    /// Bytes allocated, as `du` counts them.
    pub bytes: u64,
    /// Files and directories.
    pub inodes: u64,
}

/// The summary of node `node_name`. `logs` measures the log directory of a pod's container
/// (`None` when there is none); `rates` keeps CPU samples from one summary to the next.
pub fn assemble(
    node_name: &str,
    node: &NodeReadings,
    runtime: &RuntimeView,
    logs: impl Fn(&PodReference, &str) -> Option<DirUsage>,
    rates: &mut CpuRates,
) -> Summary {
    let mut builder = Builder {
        now: node.time,
        root_fs: node.fs,
        image_fs: runtime.image_fs.as_ref().and_then(|i| i.fs),
        logs: &logs,
        rates,
        live: HashSet::new(),
    };
    let node = builder.node(node_name, node, runtime.image_fs.as_ref());
    let pods = builder.pods(runtime);
    builder.rates.retain(&builder.live);
    Summary { node, pods }
}

/// One summary in the making.
struct Builder<'a> {
    /// When the node was read: the time of figures the runtime does not stamp.
    now: Timestamp,
    /// The kubelet's filesystem.
    root_fs: Option<FsReading>,
    /// The runtime's image filesystem.
    image_fs: Option<FsReading>,
    logs: &'a dyn Fn(&PodReference, &str) -> Option<DirUsage>,
    rates: &'a mut CpuRates,
    /// The rate keys seen in this summary.
    live: HashSet<String>,
}

impl Builder<'_> {
    /// `nanos` as a time; the node's reading time when the runtime left it at 0.
    fn at(&self, nanos: i64) -> Timestamp {
        if nanos > 0 { Timestamp::from_unix_nanos(nanos) } else { self.now }
    }

    /// CPU figures of `key` with its rate; none without a cumulative figure.
    fn cpu(&mut self, key: String, time: Timestamp, usage: Option<u64>) -> Option<CpuStats> {
        let usage = usage?;
        let usage_nano_cores = self.rates.update(&key, time.unix_nanos(), usage);
        self.live.insert(key);
        Some(CpuStats { time, usage_nano_cores, usage_core_nano_seconds: Some(usage) })
    }

    fn cri_cpu(&mut self, key: String, cpu: Option<&cri::CpuUsage>) -> Option<CpuStats> {
        let cpu = cpu?;
        self.cpu(key, self.at(cpu.timestamp), cpu.usage_core_nano_seconds.map(|v| v.value))
    }

    fn cri_memory(&self, m: &cri::MemoryUsage) -> MemoryStats {
        let value = |v: Option<cri::UInt64Value>| v.map(|v| v.value);
        MemoryStats {
            time: self.at(m.timestamp),
            available_bytes: value(m.available_bytes),
            usage_bytes: value(m.usage_bytes),
            working_set_bytes: value(m.working_set_bytes),
            rss_bytes: value(m.rss_bytes),
            page_faults: value(m.page_faults),
            major_page_faults: value(m.major_page_faults),
        }
    }

    fn node(&mut self, name: &str, node: &NodeReadings, image_fs: Option<&ImageFs>) -> NodeStats {
        let time = node.time;
        let has_rlimit = node.max_pid.is_some() || node.processes.is_some();
        NodeStats {
            node_name: name.to_owned(),
            start_time: node.boot_time.unwrap_or(time),
            cpu: self.cpu(NODE_KEY.to_owned(), time, node.cpu_core_nanos),
            memory: node.memory.map(|m| m.to_stats(time)),
            network: node_network(&node.interfaces, time),
            fs: node.fs.map(|f| f.to_stats(time)),
            runtime: image_fs.map(|i| RuntimeStats { image_fs: Some(self.image_fs_stats(i)) }),
            rlimit: has_rlimit.then_some(RlimitStats {
                time,
                max_pid: node.max_pid,
                processes: node.processes,
            }),
        }
    }

    /// The image filesystem: its size from `statvfs`, its use by images from the runtime.
    fn image_fs_stats(&self, image: &ImageFs) -> FsStats {
        let usage = &image.usage;
        FsStats {
            used_bytes: usage.used_bytes.map(|v| v.value),
            inodes_used: usage.inodes_used.map(|v| v.value),
            ..on_filesystem(self.at(usage.timestamp), image.fs)
        }
    }

    fn pods(&mut self, runtime: &RuntimeView) -> Vec<PodStats> {
        let ready = cri::PodSandboxState::SandboxReady as i32;
        let running = cri::ContainerState::ContainerRunning as i32;
        let sandboxes: HashMap<&str, &cri::PodSandbox> =
            runtime.sandboxes.iter().filter(|s| s.state == ready).map(|s| (s.id.as_str(), s)).collect();
        let mut pods = Vec::new();
        for stats in &runtime.sandbox_stats {
            let Some(id) = stats.attributes.as_ref().map(|a| a.id.as_str()) else { continue };
            let Some(sandbox) = sandboxes.get(id) else { continue };
            let containers: Vec<&cri::Container> =
                runtime.containers.iter().filter(|c| c.pod_sandbox_id == id && c.state == running).collect();
            pods.push(self.pod(sandbox, stats, &containers));
        }
        pods.sort_by(|a, b| {
            (&a.pod_ref.namespace, &a.pod_ref.name).cmp(&(&b.pod_ref.namespace, &b.pod_ref.name))
        });
        pods
    }

    fn pod(
        &mut self,
        sandbox: &cri::PodSandbox,
        stats: &cri::PodSandboxStats,
        running: &[&cri::Container],
    ) -> PodStats {
        let pod_ref = pod_reference(sandbox, stats);
        let linux = stats.linux.as_ref();
        let by_id: HashMap<&str, &cri::ContainerStats> = linux
            .map(|l| {
                l.containers.iter().filter_map(|c| Some((c.attributes.as_ref()?.id.as_str(), c))).collect()
            })
            .unwrap_or_default();
        let mut containers: Vec<ContainerStats> = running
            .iter()
            .filter_map(|c| by_id.get(c.id.as_str()).map(|s| self.container(&pod_ref, c, s)))
            .collect();
        containers.sort_by(|a, b| a.name.cmp(&b.name));

        let key = format!("pod/{}", sandbox.id);
        let cpu = match linux.and_then(|l| l.cpu.as_ref()).filter(|c| c.usage_core_nano_seconds.is_some()) {
            Some(cpu) => self.cri_cpu(key, Some(cpu)),
            None => self.summed_cpu(key, &containers),
        };
        let memory = match linux.and_then(|l| l.memory.as_ref()).filter(|m| m.working_set_bytes.is_some()) {
            Some(memory) => Some(self.cri_memory(memory)),
            None => summed_memory(&containers),
        };
        let process_count = linux.and_then(|l| l.process.as_ref()).and_then(|p| p.process_count);
        PodStats {
            pod_ref,
            start_time: Timestamp::from_unix_nanos(sandbox.created_at),
            cpu,
            memory,
            network: linux.and_then(|l| l.network.as_ref()).map(|n| self.network(n)),
            volumes: Vec::new(),
            ephemeral_storage: Some(self.ephemeral_storage(&containers)),
            process_stats: process_count.map(|c| ProcessStats { process_count: Some(c.value) }),
            containers,
        }
    }

    fn container(
        &mut self,
        pod: &PodReference,
        c: &cri::Container,
        stats: &cri::ContainerStats,
    ) -> ContainerStats {
        let name = container_name(c);
        let logs = (self.logs)(pod, &name).map(|usage| FsStats {
            used_bytes: Some(usage.bytes),
            inodes_used: Some(usage.inodes),
            ..on_filesystem(self.now, self.root_fs)
        });
        ContainerStats {
            start_time: Timestamp::from_unix_nanos(c.created_at),
            cpu: self.cri_cpu(format!("container/{}", c.id), stats.cpu.as_ref()),
            memory: stats.memory.as_ref().map(|m| self.cri_memory(m)),
            rootfs: stats.writable_layer.as_ref().map(|w| self.rootfs(w)),
            logs,
            name,
        }
    }

    /// A writable layer: its use from the runtime, on the image filesystem.
    fn rootfs(&self, layer: &cri::FilesystemUsage) -> FsStats {
        FsStats {
            used_bytes: layer.used_bytes.map(|v| v.value),
            inodes_used: layer.inodes_used.map(|v| v.value),
            ..on_filesystem(self.at(layer.timestamp), self.image_fs)
        }
    }

    /// The pod's CPU as the sum of its containers', when the sandbox has no figure of its own.
    fn summed_cpu(&mut self, key: String, containers: &[ContainerStats]) -> Option<CpuStats> {
        let cpus: Vec<&CpuStats> = containers.iter().filter_map(|c| c.cpu.as_ref()).collect();
        let usage = cpus.iter().filter_map(|c| c.usage_core_nano_seconds).reduce(u64::saturating_add)?;
        let time = cpus.iter().map(|c| c.time).max().unwrap_or(self.now);
        self.cpu(key, time, Some(usage))
    }

    fn network(&self, n: &cri::NetworkUsage) -> NetworkStats {
        NetworkStats {
            time: self.at(n.timestamp),
            default_interface: n.default_interface.as_ref().map(interface).unwrap_or_default(),
            interfaces: n.interfaces.iter().map(interface).collect(),
        }
    }

    /// What the pod's containers use of node-local storage: writable layers and logs.
    fn ephemeral_storage(&self, containers: &[ContainerStats]) -> FsStats {
        let mut total =
            FsStats { used_bytes: Some(0), inodes_used: Some(0), ..on_filesystem(self.now, self.root_fs) };
        for part in containers.iter().flat_map(|c| [c.rootfs.as_ref(), c.logs.as_ref()]).flatten() {
            total.used_bytes = add(total.used_bytes, part.used_bytes);
            total.inodes_used = add(total.inodes_used, part.inodes_used);
        }
        total
    }
}

/// The size of the filesystem something lives on; what that something uses is the caller's.
fn on_filesystem(time: Timestamp, fs: Option<FsReading>) -> FsStats {
    FsStats {
        time,
        available_bytes: fs.map(|f| f.available),
        capacity_bytes: fs.map(|f| f.capacity),
        used_bytes: None,
        inodes_free: fs.map(|f| f.inodes_free),
        inodes: fs.map(|f| f.inodes),
        inodes_used: None,
    }
}

/// The pod's memory as the sum of its containers' (no `availableBytes`: that is per limit).
fn summed_memory(containers: &[ContainerStats]) -> Option<MemoryStats> {
    containers.iter().filter_map(|c| c.memory.clone()).reduce(|a, b| MemoryStats {
        time: a.time.max(b.time),
        available_bytes: None,
        usage_bytes: add(a.usage_bytes, b.usage_bytes),
        working_set_bytes: add(a.working_set_bytes, b.working_set_bytes),
        rss_bytes: add(a.rss_bytes, b.rss_bytes),
        page_faults: add(a.page_faults, b.page_faults),
        major_page_faults: add(a.major_page_faults, b.major_page_faults),
    })
}

/// The sum of what is known.
fn add(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.saturating_add(b)),
        (a, b) => a.or(b),
    }
}

fn interface(i: &cri::NetworkInterfaceUsage) -> InterfaceStats {
    InterfaceStats {
        name: i.name.clone(),
        rx_bytes: i.rx_bytes.map(|v| v.value),
        rx_errors: i.rx_errors.map(|v| v.value),
        tx_bytes: i.tx_bytes.map(|v| v.value),
        tx_errors: i.tx_errors.map(|v| v.value),
    }
}

/// The pod of a sandbox, from `ListPodSandbox`'s metadata, else the stats' attributes.
fn pod_reference(sandbox: &cri::PodSandbox, stats: &cri::PodSandboxStats) -> PodReference {
    let metadata = sandbox.metadata.as_ref().or_else(|| stats.attributes.as_ref()?.metadata.as_ref());
    metadata
        .map(|m| PodReference { name: m.name.clone(), namespace: m.namespace.clone(), uid: m.uid.clone() })
        .unwrap_or_default()
}

/// The container's name in the pod spec: the kubelet's label, else the CRI metadata.
fn container_name(c: &cri::Container) -> String {
    c.labels
        .get(CONTAINER_NAME_LABEL)
        .cloned()
        .or_else(|| c.metadata.as_ref().map(|m| m.name.clone()))
        .unwrap_or_default()
}
