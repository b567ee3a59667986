//! A node's capacity — what the Slurm allocation grants, else what the machine has — and the
//! user and group IDs its bubble maps ([`ids`]), and the `/proc` files usage figures come
//! from ([`procfs`]).
//!
//! Shared by the kubelet (the Node's `status.capacity`) and the pod-runtime
//! (`hpk.podruntime.v1.Remote/Allocation`, for a kubelet on another machine). Figures are
//! plain numbers and Kubernetes quantity strings: no Kubernetes API types here.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use tracing::warn;

pub mod cgroup;
pub mod ids;
pub mod procfs;

/// Why a system figure could not be read.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A system file or figure could not be read.
    #[error("cannot read {what} from {path}")]
    Read {
        /// What was read.
        what: &'static str,
        /// Where from.
        path: PathBuf,
        /// Why not.
        #[source]
        source: std::io::Error,
    },
    /// A system file did not say what it should.
    #[error("cannot parse {what} in {path}")]
    Parse {
        /// What was looked for.
        what: &'static str,
        /// Where.
        path: PathBuf,
    },
}

/// The result of reading a system figure.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The extended resource a GPU is advertised as.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";

/// The variables that list the allocation's GPUs, most authoritative first.
const GPU_LISTS: [&str; 3] = ["SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL"];

/// Amounts of the resources a node advertises.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resources {
    /// CPU in millicores.
    pub millicpu: i64,
    /// Memory in bytes.
    pub memory: i64,
    /// Ephemeral storage (the filesystem of the kubelet's state directory) in bytes.
    pub ephemeral_storage: i64,
    /// GPUs, advertised as `nvidia.com/gpu` when there are any.
    pub gpus: i64,
    /// Pods the node takes at most.
    pub pods: i64,
}

impl Resources {
    /// Kubernetes quantity strings by resource name, as `status.capacity` /
    /// `status.allocatable` want them. `nvidia.com/gpu` is left out when there are none, as a
    /// node without the device plugin shows it.
    pub fn to_strings(&self) -> BTreeMap<String, String> {
        let mut map = BTreeMap::new();
        map.insert("cpu".to_owned(), cpu_quantity(self.millicpu));
        map.insert("memory".to_owned(), bytes_quantity(self.memory));
        map.insert("ephemeral-storage".to_owned(), bytes_quantity(self.ephemeral_storage));
        map.insert("pods".to_owned(), self.pods.to_string());
        if self.gpus > 0 {
            map.insert(GPU_RESOURCE.to_owned(), self.gpus.to_string());
        }
        map
    }
}

/// `3000` → `3`, `1500` → `1500m`.
fn cpu_quantity(millicpu: i64) -> String {
    if millicpu % 1000 == 0 { (millicpu / 1000).to_string() } else { format!("{millicpu}m") }
}

/// The largest binary suffix that divides the amount exactly: `2147483648` → `2Gi`.
fn bytes_quantity(bytes: i64) -> String {
    for (suffix, shift) in [("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10)] {
        let unit = 1i64 << shift;
        if bytes != 0 && bytes % unit == 0 {
            return format!("{}{suffix}", bytes / unit);
        }
    }
    bytes.to_string()
}

/// The machine's own figures, the fallback for whatever the allocation does not say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Machine {
    /// CPUs this process may run on (affinity and cgroup quota considered).
    pub cpus: u32,
    /// Memory this process may use, in bytes: its cgroup's limit where one is set and
    /// readable (a Slurm job confined by `task/cgroup`), else `MemTotal` of /proc/meminfo.
    pub memory: i64,
    /// Size of the filesystem holding the state directory, in bytes.
    pub disk: i64,
}

impl Machine {
    /// Reads the figures from the system; `root_dir` is the state directory (the kubelet's or
    /// the runtime's), whose filesystem is the ephemeral storage.
    pub fn read(root_dir: &Path) -> Result<Self> {
        let cpus = std::thread::available_parallelism().map_err(|source| Error::Read {
            what: "available CPUs",
            path: "sched_getaffinity".into(),
            source,
        })?;
        let meminfo = read_text(Path::new("/proc/meminfo"))?;
        let total = meminfo_bytes(&meminfo, "MemTotal")
            .ok_or_else(|| Error::Parse { what: "MemTotal", path: "/proc/meminfo".into() })?;
        let read = |file: &str| std::fs::read_to_string(file).unwrap_or_default();
        let limit = cgroup::memory_limit(&read("/proc/self/cgroup"), &read("/proc/self/mountinfo"));
        let memory = limit.map_or(total, |l| l.min(total));
        let disk = filesystem(root_dir)?.total;
        Ok(Self { cpus: u32::try_from(cpus.get()).unwrap_or(u32::MAX), memory, disk })
    }
}

/// Size and free space of a filesystem, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Filesystem {
    /// Size.
    pub total: i64,
    /// Available to unprivileged users.
    pub available: i64,
}

/// The filesystem holding `path`.
pub fn filesystem(path: &Path) -> Result<Filesystem> {
    let stat = nix::sys::statvfs::statvfs(path).map_err(|e| Error::Read {
        what: "filesystem size",
        path: path.into(),
        source: e.into(),
    })?;
    let fragment = i64::try_from(stat.fragment_size()).unwrap_or(i64::MAX);
    let blocks = |n: u64| i64::try_from(n).unwrap_or(i64::MAX).saturating_mul(fragment);
    Ok(Filesystem { total: blocks(stat.blocks()), available: blocks(stat.blocks_available()) })
}

/// A whole file as text.
pub fn read_text(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| Error::Read { what: "file", path: path.into(), source })
}

/// A `Key:   123 kB` line of /proc/meminfo, in bytes.
pub fn meminfo_bytes(meminfo: &str, key: &str) -> Option<i64> {
    let line = meminfo.lines().find(|l| l.split(':').next() == Some(key))?;
    let mut fields = line.split(':').nth(1)?.split_whitespace();
    let value: i64 = fields.next()?.parse().ok()?;
    match fields.next() {
        Some("kB") => value.checked_mul(1024),
        None => Some(value),
        Some(_) => None,
    }
}

/// Where [`capacity`]'s figures come from: `slurm job <SLURM_JOB_ID>` inside a Slurm job,
/// else `machine`.
pub fn source(env: &dyn Fn(&str) -> Option<String>) -> String {
    match env("SLURM_JOB_ID").map(|id| id.trim().to_owned()).filter(|id| !id.is_empty()) {
        Some(id) => format!("slurm job {id}"),
        None => "machine".to_owned(),
    }
}

/// The node's capacity from the Slurm allocation (`env` reads a variable), the machine's
/// figures for whatever Slurm does not say or says badly. Never fails: a garbage value is
/// logged with the variable's name and ignored.
pub fn capacity(env: &dyn Fn(&str) -> Option<String>, machine: &Machine, max_pods: u32) -> Resources {
    let cpus = positive(env, "SLURM_CPUS_ON_NODE").unwrap_or(i64::from(machine.cpus));
    let memory = slurm_memory(env, cpus).unwrap_or(machine.memory);
    Resources {
        millicpu: cpus.saturating_mul(1000),
        memory,
        ephemeral_storage: machine.disk,
        gpus: gpus(env),
        pods: i64::from(max_pods),
    }
}

/// Memory from `SLURM_MEM_PER_NODE` (MB, Slurm's MB being MiB), else `SLURM_MEM_PER_CPU` × CPUs.
/// Slurm writes 0 for "all of the node's memory": that says nothing, so the machine's figure
/// stands.
fn slurm_memory(env: &dyn Fn(&str) -> Option<String>, cpus: i64) -> Option<i64> {
    let mib = positive(env, "SLURM_MEM_PER_NODE")
        .or_else(|| positive(env, "SLURM_MEM_PER_CPU").map(|per_cpu| per_cpu.saturating_mul(cpus)))?;
    Some(mib.saturating_mul(1 << 20))
}

/// GPUs: the devices of this job step on this node (`SLURM_STEP_GPUS`, which Slurm's GRES
/// plugin sets for each node of a step), else `SLURM_GPUS_ON_NODE`, else the length of the
/// first other GPU list that is set.
fn gpus(env: &dyn Fn(&str) -> Option<String>) -> i64 {
    if let Some(list) = env("SLURM_STEP_GPUS") {
        return gpu_list_len("SLURM_STEP_GPUS", &list);
    }
    if let Some(n) = count(env, "SLURM_GPUS_ON_NODE") {
        return n;
    }
    GPU_LISTS.iter().find_map(|var| env(var).map(|list| gpu_list_len(var, &list))).unwrap_or(0)
}

/// Entries of a device list (`0,1,3`, `GPU-<uuid>,MIG-<uuid>`), counted as CUDA reads it: up
/// to the first entry that is not a device. Slurm writes `NoDevFiles` when it grants none.
fn gpu_list_len(var: &str, list: &str) -> i64 {
    let mut n = 0;
    for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let device = entry.parse::<u32>().is_ok() || entry.starts_with("GPU-") || entry.starts_with("MIG-");
        if !device {
            if entry != "NoDevFiles" && entry != "-1" {
                warn!(variable = var, value = list, "ignoring what follows a non-device entry");
            }
            break;
        }
        n += 1;
    }
    n
}

/// A variable holding a count greater than zero; garbage is logged and ignored.
fn positive(env: &dyn Fn(&str) -> Option<String>, var: &str) -> Option<i64> {
    count(env, var).filter(|n| *n > 0)
}

/// A variable holding a non-negative integer; garbage is logged and ignored.
fn count(env: &dyn Fn(&str) -> Option<String>, var: &str) -> Option<i64> {
    let value = env(var)?;
    match value.trim().parse::<i64>() {
        Ok(n) if n >= 0 => Some(n),
        _ => {
            warn!(variable = var, value = %value, "not a count; using the machine's figure");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: i64 = 1 << 30;

    fn machine() -> Machine {
        Machine { cpus: 8, memory: 16 * GIB, disk: 100 * GIB }
    }

    fn with(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let vars: Vec<(String, String)> = vars.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect();
        move |key| vars.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
    }

    fn cap(vars: &[(&str, &str)]) -> Resources {
        capacity(&with(vars), &machine(), 110)
    }

    #[test]
    fn outside_slurm_the_machine_counts() {
        let r = cap(&[]);
        assert_eq!(
            r,
            Resources { millicpu: 8000, memory: 16 * GIB, ephemeral_storage: 100 * GIB, gpus: 0, pods: 110 }
        );
    }

    #[test]
    fn slurm_cpus_and_memory_per_node() {
        let r = cap(&[("SLURM_CPUS_ON_NODE", "3"), ("SLURM_MEM_PER_NODE", "2048")]);
        assert_eq!((r.millicpu, r.memory), (3000, 2 * GIB));
        assert_eq!(r.ephemeral_storage, 100 * GIB, "Slurm says nothing of disk");
    }

    #[test]
    fn memory_per_cpu_times_cpus() {
        let r = cap(&[("SLURM_CPUS_ON_NODE", "4"), ("SLURM_MEM_PER_CPU", "512")]);
        assert_eq!(r.memory, 2 * GIB);
        let r = cap(&[("SLURM_MEM_PER_CPU", "1024")]);
        assert_eq!(r.memory, 8 * GIB, "the machine's CPUs when Slurm gives none");
    }

    #[test]
    fn per_node_wins_over_per_cpu_and_zero_means_the_machine() {
        let r = cap(&[
            ("SLURM_CPUS_ON_NODE", "2"),
            ("SLURM_MEM_PER_NODE", "1024"),
            ("SLURM_MEM_PER_CPU", "4096"),
        ]);
        assert_eq!(r.memory, GIB);
        assert_eq!(cap(&[("SLURM_MEM_PER_NODE", "0")]).memory, 16 * GIB);
    }

    #[test]
    fn garbage_falls_back_to_the_machine() {
        let r = cap(&[
            ("SLURM_CPUS_ON_NODE", "abc"),
            ("SLURM_MEM_PER_NODE", "lots"),
            ("SLURM_MEM_PER_CPU", "-5"),
            ("SLURM_GPUS_ON_NODE", "x"),
        ]);
        assert_eq!((r.millicpu, r.memory, r.gpus), (8000, 16 * GIB, 0));
        assert_eq!(cap(&[("SLURM_CPUS_ON_NODE", "0")]).millicpu, 8000);
        assert_eq!(cap(&[("SLURM_CPUS_ON_NODE", "99999999999999999999")]).millicpu, 8000);
    }

    #[test]
    fn gpus_from_each_variable() {
        assert_eq!(cap(&[("SLURM_GPUS_ON_NODE", "2")]).gpus, 2);
        assert_eq!(cap(&[("SLURM_JOB_GPUS", "0,1,2")]).gpus, 3);
        assert_eq!(cap(&[("SLURM_STEP_GPUS", "5")]).gpus, 1);
        assert_eq!(cap(&[("CUDA_VISIBLE_DEVICES", "GPU-1a2b,MIG-3c4d")]).gpus, 2);
        assert_eq!(cap(&[("GPU_DEVICE_ORDINAL", "0,1,2,3")]).gpus, 4);
        assert_eq!(cap(&[("SLURM_GPUS_ON_NODE", "1"), ("SLURM_JOB_GPUS", "0,1")]).gpus, 1);
        assert_eq!(cap(&[("SLURM_JOB_GPUS", "0,1"), ("CUDA_VISIBLE_DEVICES", "0")]).gpus, 2);
        // The batch step's variables reach every node's step: the step's own list wins.
        assert_eq!(
            cap(&[("SLURM_STEP_GPUS", "0,1"), ("SLURM_GPUS_ON_NODE", "4"), ("SLURM_JOB_GPUS", "0")]).gpus,
            2
        );
        assert_eq!(cap(&[("SLURM_STEP_GPUS", "NoDevFiles"), ("SLURM_GPUS_ON_NODE", "4")]).gpus, 0);
    }

    #[test]
    fn gpu_lists_that_grant_none_or_are_odd() {
        assert_eq!(cap(&[("CUDA_VISIBLE_DEVICES", "NoDevFiles")]).gpus, 0);
        assert_eq!(cap(&[("CUDA_VISIBLE_DEVICES", "")]).gpus, 0);
        assert_eq!(cap(&[("CUDA_VISIBLE_DEVICES", "0,-1,1")]).gpus, 1, "CUDA stops at -1");
        assert_eq!(cap(&[("CUDA_VISIBLE_DEVICES", "0, 1 ,")]).gpus, 2);
        assert_eq!(cap(&[("SLURM_GPUS_ON_NODE", "many"), ("SLURM_JOB_GPUS", "0,1")]).gpus, 2);
    }

    #[test]
    fn quantities_as_kubectl_shows_them() {
        let r = Resources { millicpu: 3000, memory: 2 * GIB, ephemeral_storage: 12345, gpus: 2, pods: 110 };
        let q = r.to_strings();
        let get = |k: &str| q.get(k).map(String::as_str);
        assert_eq!(get("cpu"), Some("3"));
        assert_eq!(get("memory"), Some("2Gi"));
        assert_eq!(get("ephemeral-storage"), Some("12345"));
        assert_eq!(get("nvidia.com/gpu"), Some("2"));
        assert_eq!(get("pods"), Some("110"));
        let none = Resources { gpus: 0, millicpu: 1500, ..r }.to_strings();
        assert!(!none.contains_key(GPU_RESOURCE));
        assert_eq!(none.get("cpu").map(String::as_str), Some("1500m"));
        let odd = Resources { memory: 3 << 40, ephemeral_storage: 0, ..r }.to_strings();
        assert_eq!((odd["memory"].as_str(), odd["ephemeral-storage"].as_str()), ("3Ti", "0"));
    }

    #[test]
    fn source_names_the_job() {
        assert_eq!(source(&with(&[("SLURM_JOB_ID", "1234")])), "slurm job 1234");
        assert_eq!(source(&with(&[("SLURM_JOB_ID", " ")])), "machine");
        assert_eq!(source(&with(&[])), "machine");
    }

    #[test]
    fn meminfo_lines() {
        let text =
            "MemTotal:       16316412 kB\nMemFree:  1 kB\nMemAvailable:    8000000 kB\nHugePages_Total: 0\n";
        assert_eq!(meminfo_bytes(text, "MemTotal"), Some(16_316_412 * 1024));
        assert_eq!(meminfo_bytes(text, "MemAvailable"), Some(8_000_000 * 1024));
        assert_eq!(meminfo_bytes(text, "HugePages_Total"), Some(0));
        assert_eq!(meminfo_bytes(text, "Mem"), None);
    }

    #[test]
    fn the_machine_reads() {
        let m = Machine::read(Path::new("/")).unwrap();
        assert!(m.cpus >= 1 && m.memory > 0 && m.disk > 0, "{m:?}");
        let fs = filesystem(Path::new("/")).unwrap();
        assert!(fs.total >= fs.available && fs.total == m.disk);
    }

    #[test]
    fn read_errors_name_the_path() {
        let error = Machine::read(Path::new("/nonexistent/hpk")).unwrap_err();
        assert_eq!(error.to_string(), "cannot read filesystem size from /nonexistent/hpk");
        let error = read_text(Path::new("/nonexistent/file")).unwrap_err();
        assert!(matches!(error, Error::Read { what: "file", .. }), "{error:?}");
    }
}
