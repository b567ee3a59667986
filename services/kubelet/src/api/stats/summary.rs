//! The kubelet's Summary API (`k8s.io/kubelet/pkg/apis/stats/v1alpha1`) as upstream writes it:
//! camelCase names except `ephemeral-storage`, `process_stats`, `process_count`, `maxpid` and
//! `curproc`; a figure that is not known is left out, as Go's `omitempty` does.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// A point in time, kept to the nanosecond (`/metrics/resource` gives milliseconds) and written
/// as `metav1.Time` is: RFC 3339 in UTC, whole seconds (`2021-06-22T21:11:18Z`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(i64);

impl Timestamp {
    /// `nanos` nanoseconds after the Unix epoch.
    pub const fn from_unix_nanos(nanos: i64) -> Self {
        Self(nanos)
    }

    /// `seconds` seconds after the Unix epoch.
    pub const fn from_unix_seconds(seconds: i64) -> Self {
        Self(seconds.saturating_mul(1_000_000_000))
    }

    /// The system clock now.
    pub fn now() -> Self {
        let since_epoch = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        Self(since_epoch.map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)).unwrap_or(0))
    }

    /// Nanoseconds after the Unix epoch.
    pub const fn unix_nanos(self) -> i64 {
        self.0
    }

    /// Whole milliseconds after the Unix epoch (rounded down, as Prometheus timestamps are).
    pub const fn unix_millis(self) -> i64 {
        self.0.div_euclid(1_000_000)
    }

    /// Whole seconds after the Unix epoch (rounded down).
    pub const fn unix_seconds(self) -> i64 {
        self.0.div_euclid(1_000_000_000)
    }

    /// RFC 3339 in UTC to the second, or `None` past the year 9999.
    pub fn to_rfc3339(self) -> Option<String> {
        OffsetDateTime::from_unix_timestamp(self.unix_seconds()).ok()?.format(&Rfc3339).ok()
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let text = self.to_rfc3339().ok_or_else(|| {
            serde::ser::Error::custom(format!("timestamp {} ns is out of RFC 3339's range", self.0))
        })?;
        serializer.serialize_str(&text)
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    /// Any RFC 3339 time (fractions and offsets too); `null`, Go's zero time, reads as the epoch.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let Some(text) = Option::<String>::deserialize(deserializer)? else {
            return Ok(Self::default());
        };
        let time = OffsetDateTime::parse(&text, &Rfc3339)
            .map_err(|e| serde::de::Error::custom(format!("time {text:?} is not RFC 3339: {e}")))?;
        i64::try_from(time.unix_timestamp_nanos())
            .map(Self)
            .map_err(|_| serde::de::Error::custom(format!("time {text:?} is out of range")))
    }
}

/// A list Go may write as `null`: read as empty.
fn nullable<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

/// The whole answer of `/stats/summary`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// The node.
    pub node: NodeStats,
    /// Every running pod.
    #[serde(default, deserialize_with = "nullable")]
    pub pods: Vec<PodStats>,
}

/// The node as a whole.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStats {
    /// The node's name.
    pub node_name: String,
    /// When the node started (its boot).
    pub start_time: Timestamp,
    /// CPU of the whole machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    /// Memory of the whole machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    /// The node's network interfaces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkStats>,
    /// The filesystem of the kubelet's root directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fs: Option<FsStats>,
    /// The container runtime's filesystems.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<RuntimeStats>,
    /// Process IDs: the limit and those in use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rlimit: Option<RlimitStats>,
}

/// The container runtime's filesystems.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeStats {
    /// Where the runtime keeps images (and here the containers' writable layers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_fs: Option<FsStats>,
}

/// Process IDs of the node.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RlimitStats {
    /// When they were read.
    pub time: Timestamp,
    /// The most tasks the kernel allows (`kernel.pid_max`, or `threads-max` when lower).
    #[serde(rename = "maxpid", default, skip_serializing_if = "Option::is_none")]
    pub max_pid: Option<i64>,
    /// Tasks alive now.
    #[serde(rename = "curproc", default, skip_serializing_if = "Option::is_none")]
    pub processes: Option<i64>,
}

/// One pod.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStats {
    /// Which pod.
    pub pod_ref: PodReference,
    /// When its sandbox was created.
    pub start_time: Timestamp,
    /// Its running containers.
    #[serde(default, deserialize_with = "nullable")]
    pub containers: Vec<ContainerStats>,
    /// CPU of all its processes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    /// Memory of all its processes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    /// Its network namespace's interfaces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkStats>,
    /// Its volumes (none reported yet).
    #[serde(
        rename = "volume",
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "nullable"
    )]
    pub volumes: Vec<VolumeStats>,
    /// Node-local storage it uses: its containers' writable layers and logs.
    #[serde(rename = "ephemeral-storage", default, skip_serializing_if = "Option::is_none")]
    pub ephemeral_storage: Option<FsStats>,
    /// How many processes it runs.
    #[serde(rename = "process_stats", default, skip_serializing_if = "Option::is_none")]
    pub process_stats: Option<ProcessStats>,
}

/// A pod's identity.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PodReference {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.uid`.
    pub uid: String,
}

/// One container of a pod.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStats {
    /// The container's name in the pod spec.
    pub name: String,
    /// When it was created.
    pub start_time: Timestamp,
    /// Its CPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    /// Its memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    /// Its writable layer, on the runtime's filesystem.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rootfs: Option<FsStats>,
    /// Its log directory, on the kubelet's filesystem.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logs: Option<FsStats>,
}

/// CPU use.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CpuStats {
    /// When it was sampled.
    pub time: Timestamp,
    /// Cores in use lately, in billionths of a core.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage_nano_cores: Option<u64>,
    /// CPU time used since the start, in nanoseconds of one core.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage_core_nano_seconds: Option<u64>,
}

/// Memory use.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryStats {
    /// When it was sampled.
    pub time: Timestamp,
    /// What is left before the limit (the node: what the kernel can still give).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available_bytes: Option<u64>,
    /// All memory in use, page cache included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage_bytes: Option<u64>,
    /// Memory in use that cannot simply be dropped: what evictions and `kubectl top` go by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_set_bytes: Option<u64>,
    /// Anonymous memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss_bytes: Option<u64>,
    /// Minor page faults since the start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_faults: Option<u64>,
    /// Major page faults since the start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub major_page_faults: Option<u64>,
}

/// Traffic of one network interface, counted since it came up.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InterfaceStats {
    /// The interface's name.
    #[serde(default)]
    pub name: String,
    /// Bytes received.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rx_bytes: Option<u64>,
    /// Receive errors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rx_errors: Option<u64>,
    /// Bytes sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tx_bytes: Option<u64>,
    /// Send errors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tx_errors: Option<u64>,
}

/// Network use: the default interface's counters inline, then every interface.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkStats {
    /// When it was sampled.
    pub time: Timestamp,
    /// The default interface (`name`, `rxBytes`, … at this level, as upstream inlines them).
    #[serde(flatten)]
    pub default_interface: InterfaceStats,
    /// Every interface but loopback.
    #[serde(default, skip_serializing_if = "Vec::is_empty", deserialize_with = "nullable")]
    pub interfaces: Vec<InterfaceStats>,
}

/// A filesystem's size and what is used of it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FsStats {
    /// When it was measured.
    pub time: Timestamp,
    /// Bytes an unprivileged user may still write.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available_bytes: Option<u64>,
    /// Size of the filesystem.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_bytes: Option<u64>,
    /// Bytes used (by the whole filesystem, or by what these stats are about).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used_bytes: Option<u64>,
    /// Inodes free.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inodes_free: Option<u64>,
    /// Inodes in all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inodes: Option<u64>,
    /// Inodes used (by the whole filesystem, or by what these stats are about).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inodes_used: Option<u64>,
}

/// One volume of a pod: its filesystem figures inline, then its name.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeStats {
    /// The volume's filesystem.
    #[serde(flatten)]
    pub fs: FsStats,
    /// The volume's name in the pod spec.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
}

/// Processes of a pod.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessStats {
    /// How many.
    #[serde(rename = "process_count", default, skip_serializing_if = "Option::is_none")]
    pub process_count: Option<u64>,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const SECOND: i64 = 1_000_000_000;

    #[test]
    fn times_are_rfc3339_in_utc_to_the_second() {
        let t = Timestamp::from_unix_nanos(1_624_396_278_302_091_597);
        assert_eq!(t.to_rfc3339().as_deref(), Some("2021-06-22T21:11:18Z"));
        assert_eq!(serde_json::to_string(&t).expect("serializes"), "\"2021-06-22T21:11:18Z\"");
        let read: Timestamp = serde_json::from_str("\"2021-06-23T05:11:18.302091597+08:00\"").expect("reads");
        assert_eq!(read, t);
        assert!(serde_json::from_str::<Timestamp>("\"yesterday\"").is_err());
        assert_eq!(
            serde_json::from_str::<Timestamp>("null").expect("null is Go's zero time"),
            Timestamp::default()
        );
    }

    /// What a kubelet answers, as `kubectl get --raw …/stats/summary` shows it (fields we do not
    /// model, such as `systemContainers` and `swap`, included).
    const UPSTREAM: &str = r#"{
     "node": {
      "nodeName": "kind-worker",
      "systemContainers": [{"name": "kubelet", "startTime": "2024-05-01T10:00:00Z"}],
      "startTime": "2024-05-01T09:59:00Z",
      "cpu": {"time": "2024-05-01T10:05:03Z", "usageNanoCores": 251306232, "usageCoreNanoSeconds": 99151853000},
      "memory": {"time": "2024-05-01T10:05:03Z", "availableBytes": 6303125504, "usageBytes": 2181410816,
                 "workingSetBytes": 1694511104, "rssBytes": 736677888, "pageFaults": 52410, "majorPageFaults": 105},
      "network": {"time": "2024-05-01T10:05:03Z", "name": "eth0", "rxBytes": 2394834, "rxErrors": 0, "txBytes": 1838334,
                  "txErrors": 0, "interfaces": [{"name": "eth0", "rxBytes": 2394834, "rxErrors": 0, "txBytes": 1838334, "txErrors": 0}]},
      "fs": {"time": "2024-05-01T10:05:03Z", "availableBytes": 10, "capacityBytes": 20, "usedBytes": 10, "inodesFree": 3,
             "inodes": 4, "inodesUsed": 1},
      "runtime": {"imageFs": {"time": "2024-05-01T10:05:03Z", "usedBytes": 5, "inodesUsed": 6},
                  "containerFs": {"time": "2024-05-01T10:05:03Z", "usedBytes": 5}},
      "rlimit": {"time": "2024-05-01T10:05:03Z", "maxpid": 4194304, "curproc": 512},
      "swap": {"time": "2024-05-01T10:05:03Z", "swapUsageBytes": 0}
     },
     "pods": [{
      "podRef": {"name": "coredns-1", "namespace": "kube-system", "uid": "3f1c"},
      "startTime": "2024-05-01T10:00:12Z",
      "containers": [{
       "name": "coredns", "startTime": "2024-05-01T10:00:13Z",
       "cpu": {"time": "2024-05-01T10:05:01Z", "usageNanoCores": 1853410, "usageCoreNanoSeconds": 1395839000},
       "memory": {"time": "2024-05-01T10:05:01Z", "usageBytes": 15437824, "workingSetBytes": 15286272},
       "rootfs": {"time": "2024-05-01T10:05:01Z", "usedBytes": 24576, "inodesUsed": 7},
       "logs": {"time": "2024-05-01T10:05:03.123456789Z", "usedBytes": 8192, "inodesUsed": 1}
      }],
      "cpu": {"time": "2024-05-01T10:05:01Z", "usageCoreNanoSeconds": 1411111000},
      "network": {"time": "2024-05-01T10:05:01Z", "name": "eth0", "rxBytes": 1, "txBytes": 2},
      "volume": [{"time": "2024-05-01T10:04:40Z", "usedBytes": 12288, "inodesUsed": 9, "name": "config-volume"}],
      "ephemeral-storage": {"time": "2024-05-01T10:05:03Z", "usedBytes": 45056, "inodesUsed": 17},
      "process_stats": {"process_count": 1},
      "swap": {"time": "2024-05-01T10:05:01Z", "swapUsageBytes": 0}
     }]
    }"#;

    #[test]
    fn an_upstream_summary_reads_into_these_types() {
        let summary: Summary = serde_json::from_str(UPSTREAM).expect("reads");
        let node = &summary.node;
        assert_eq!(node.cpu.as_ref().and_then(|c| c.usage_nano_cores), Some(251_306_232));
        assert_eq!(node.memory.as_ref().and_then(|m| m.major_page_faults), Some(105));
        assert_eq!(
            node.network.as_ref().map(|n| (n.default_interface.name.as_str(), n.interfaces.len())),
            Some(("eth0", 1))
        );
        assert_eq!(
            node.runtime.as_ref().and_then(|r| r.image_fs.as_ref()).and_then(|f| f.inodes_used),
            Some(6)
        );
        assert_eq!(
            node.rlimit.as_ref().map(|r| (r.max_pid, r.processes)),
            Some((Some(4_194_304), Some(512)))
        );
        let pod = &summary.pods[0];
        assert_eq!(pod.pod_ref.uid, "3f1c");
        assert_eq!(pod.volumes[0].name, "config-volume");
        assert_eq!(pod.volumes[0].fs.used_bytes, Some(12_288));
        assert_eq!(pod.ephemeral_storage.as_ref().and_then(|e| e.used_bytes), Some(45_056));
        assert_eq!(pod.process_stats.as_ref().and_then(|p| p.process_count), Some(1));
        let logs_time = pod.containers[0].logs.as_ref().map(|l| l.time).expect("logs");
        assert_eq!(logs_time.unix_nanos() % SECOND, 123_456_789);
        assert_eq!(logs_time.to_rfc3339().as_deref(), Some("2024-05-01T10:05:03Z"));

        let again = serde_json::to_value(&summary).expect("serializes");
        assert_eq!(again["pods"][0]["volume"][0]["name"], "config-volume");
        assert_eq!(again["pods"][0]["volume"][0]["usedBytes"], 12_288);
    }

    #[test]
    fn null_lists_read_as_empty() {
        let summary: Summary =
            serde_json::from_str(r#"{"node": {"nodeName": "n", "startTime": null}, "pods": null}"#)
                .expect("reads");
        assert!(summary.pods.is_empty());
        assert_eq!(summary.node.start_time, Timestamp::default());
        let v = serde_json::to_value(&summary).expect("serializes");
        let mut node_keys: Vec<&str> =
            v["node"].as_object().map(|o| o.keys().map(String::as_str).collect()).unwrap_or_default();
        node_keys.sort_unstable();
        assert_eq!(node_keys, ["nodeName", "startTime"]);
        assert_eq!(v["pods"], json!([]));
    }
}
