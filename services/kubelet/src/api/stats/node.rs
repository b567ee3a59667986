//! The node's own figures: `/proc/stat`, `/proc/meminfo`, `/proc/net/dev`, `/proc/loadavg`,
//! `kernel.pid_max` and `statvfs`. The kubelet runs in its node's namespaces, so these are the
//! machine's. Each parser takes the file's text, so tests give it fixtures; [`NodeReadings::read`]
//! is the only part that touches the system.

use std::path::Path;

use hpk_node_resources::procfs::MachineStat;
use tracing::warn;

use super::summary::{FsStats, InterfaceStats, MemoryStats, NetworkStats, Timestamp};

/// What `/proc/stat` says about the whole machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcStat {
    /// CPU time spent working since boot, all cores together, in nanoseconds of one core.
    pub busy_core_nanos: u64,
    /// When the machine booted (`btime`).
    pub boot_time: Option<Timestamp>,
}

/// Parses `/proc/stat`; `ticks_per_second` is `sysconf(_SC_CLK_TCK)`.
///
/// Busy time is user + nice + system + irq + softirq + steal of the aggregate `cpu` line: idle
/// and iowait are not work, and guest time is already counted in user.
pub fn parse_proc_stat(text: &str, ticks_per_second: u64) -> Option<ProcStat> {
    let stat = MachineStat::parse(text);
    Some(ProcStat {
        busy_core_nanos: ticks_to_nanos(stat.busy_ticks?, ticks_per_second)?,
        boot_time: stat.boot_time.and_then(|s| i64::try_from(s).ok()).map(Timestamp::from_unix_seconds),
    })
}

fn ticks_to_nanos(ticks: u64, ticks_per_second: u64) -> Option<u64> {
    let per_second = u128::from(ticks_per_second);
    if per_second == 0 {
        return None;
    }
    u64::try_from(u128::from(ticks) * 1_000_000_000 / per_second).ok()
}

pub use hpk_node_resources::procfs::ticks_per_second;

/// The lines of `/proc/meminfo` the summary needs, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemInfo {
    /// `MemTotal`.
    pub total: u64,
    /// `MemFree`: not used at all, page cache excluded.
    pub free: u64,
    /// `MemAvailable`: what can be given out without swapping, reclaimable cache included
    /// (`MemFree + Buffers + Cached` on kernels older than 3.14, which lack it).
    pub available: u64,
    /// `AnonPages`, when the kernel gives it.
    pub anonymous: Option<u64>,
}

/// Parses `/proc/meminfo`.
pub fn parse_meminfo(text: &str) -> Option<MemInfo> {
    let field = |key: &str| meminfo_field(text, key);
    let free = field("MemFree")?;
    let available = field("MemAvailable").or_else(|| {
        free.checked_add(field("Buffers").unwrap_or(0))?.checked_add(field("Cached").unwrap_or(0))
    })?;
    Some(MemInfo { total: field("MemTotal")?, free, available, anonymous: field("AnonPages") })
}

/// A `Key:   123 kB` line, in bytes.
fn meminfo_field(text: &str, key: &str) -> Option<u64> {
    let rest = text.lines().find_map(|l| l.split_once(':').filter(|(k, _)| *k == key).map(|(_, v)| v))?;
    let mut parts = rest.split_whitespace();
    let value: u64 = parts.next()?.parse().ok()?;
    match parts.next() {
        Some("kB") => value.checked_mul(1024),
        None => Some(value),
        Some(_) => None,
    }
}

impl MemInfo {
    /// The node's memory figures.
    ///
    /// Usage counts page cache, as a cgroup's usage does (total − free); the working set leaves
    /// out what the kernel can reclaim (total − `MemAvailable`), as cAdvisor's usage − inactive
    /// file does, so evictions and `kubectl top` do not count a full page cache as pressure.
    pub fn to_stats(self, time: Timestamp) -> MemoryStats {
        MemoryStats {
            time,
            available_bytes: Some(self.available),
            usage_bytes: Some(self.total.saturating_sub(self.free)),
            working_set_bytes: Some(self.total.saturating_sub(self.available)),
            rss_bytes: self.anonymous,
            page_faults: None,
            major_page_faults: None,
        }
    }
}

/// Every interface of a `/proc/net/dev` but loopback, in the file's order.
pub fn parse_net_dev(text: &str) -> Vec<InterfaceStats> {
    text.lines().filter_map(net_dev_line).filter(|i| i.name != "lo").collect()
}

/// `  eth0: rx bytes packets errs drop fifo frame compressed multicast, tx bytes packets errs …`.
fn net_dev_line(line: &str) -> Option<InterfaceStats> {
    let (name, counters) = line.split_once(':')?;
    let n: Vec<u64> = counters.split_whitespace().map(str::parse).collect::<Result<_, _>>().ok()?;
    if n.len() < 16 {
        return None;
    }
    Some(InterfaceStats {
        name: name.trim().to_owned(),
        rx_bytes: n.first().copied(),
        rx_errors: n.get(2).copied(),
        tx_bytes: n.get(8).copied(),
        tx_errors: n.get(10).copied(),
    })
}

/// The node's network: the interface with the most traffic (received + sent; the first of
/// equals) as the default one, since an HPC node's uplink may be `ib0` or `eno1` rather than
/// upstream's `eth0`. `None` without any interface.
pub fn node_network(interfaces: &[InterfaceStats], time: Timestamp) -> Option<NetworkStats> {
    let traffic = |i: &InterfaceStats| i.rx_bytes.unwrap_or(0).saturating_add(i.tx_bytes.unwrap_or(0));
    let mut busiest: Option<&InterfaceStats> = None;
    for interface in interfaces {
        if busiest.is_none_or(|b| traffic(interface) > traffic(b)) {
            busiest = Some(interface);
        }
    }
    Some(NetworkStats { time, default_interface: busiest?.clone(), interfaces: interfaces.to_vec() })
}

/// Tasks alive: the total of `/proc/loadavg`'s 4th field (`running/total`).
pub fn parse_loadavg_tasks(text: &str) -> Option<i64> {
    text.split_whitespace().nth(3)?.split_once('/')?.1.parse().ok()
}

/// A file holding one number, such as `/proc/sys/kernel/pid_max`.
pub fn parse_number(text: &str) -> Option<i64> {
    text.trim().parse().ok()
}

/// A filesystem's size and use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FsReading {
    /// Bytes in all.
    pub capacity: u64,
    /// Bytes an unprivileged user may still write.
    pub available: u64,
    /// Bytes used.
    pub used: u64,
    /// Inodes in all.
    pub inodes: u64,
    /// Inodes free.
    pub inodes_free: u64,
    /// Inodes used.
    pub inodes_used: u64,
}

impl FsReading {
    /// From `statvfs`' counts: `fragment` size, `blocks`, `free` and `available` blocks,
    /// `files` and `files_free`.
    pub fn from_counts(
        fragment: u64,
        blocks: u64,
        free: u64,
        available: u64,
        files: u64,
        files_free: u64,
    ) -> Self {
        Self {
            capacity: blocks.saturating_mul(fragment),
            available: available.saturating_mul(fragment),
            used: blocks.saturating_sub(free).saturating_mul(fragment),
            inodes: files,
            inodes_free: files_free,
            inodes_used: files.saturating_sub(files_free),
        }
    }

    /// `statvfs` of the filesystem holding `path`.
    pub fn of(path: &Path) -> Result<Self, nix::Error> {
        let s = nix::sys::statvfs::statvfs(path)?;
        Ok(Self::from_counts(
            s.fragment_size(),
            s.blocks(),
            s.blocks_free(),
            s.blocks_available(),
            s.files(),
            s.files_free(),
        ))
    }

    /// The whole filesystem as summary figures.
    pub fn to_stats(self, time: Timestamp) -> FsStats {
        FsStats {
            time,
            available_bytes: Some(self.available),
            capacity_bytes: Some(self.capacity),
            used_bytes: Some(self.used),
            inodes_free: Some(self.inodes_free),
            inodes: Some(self.inodes),
            inodes_used: Some(self.inodes_used),
        }
    }
}

/// The node's figures at one moment; what could not be read is `None` (and logged).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeReadings {
    /// When they were read.
    pub time: Timestamp,
    /// When the node booted.
    pub boot_time: Option<Timestamp>,
    /// CPU time used since boot, in core-nanoseconds.
    pub cpu_core_nanos: Option<u64>,
    /// Memory.
    pub memory: Option<MemInfo>,
    /// Network interfaces but loopback.
    pub interfaces: Vec<InterfaceStats>,
    /// The filesystem of the kubelet's root directory.
    pub fs: Option<FsReading>,
    /// The most tasks the kernel allows: the lower of `kernel.pid_max` and `kernel.threads-max`,
    /// as upstream's kubelet reports it.
    pub max_pid: Option<i64>,
    /// Tasks alive.
    pub processes: Option<i64>,
}

impl NodeReadings {
    /// Reads the machine; `root_dir` is the directory whose filesystem is the node's `fs`.
    pub fn read(root_dir: &Path, ticks_per_second: u64) -> Self {
        let stat = read_parsed("/proc/stat", |t| parse_proc_stat(t, ticks_per_second));
        let limits = ["/proc/sys/kernel/pid_max", "/proc/sys/kernel/threads-max"];
        Self {
            time: Timestamp::now(),
            boot_time: stat.and_then(|s| s.boot_time),
            cpu_core_nanos: stat.map(|s| s.busy_core_nanos),
            memory: read_parsed("/proc/meminfo", parse_meminfo),
            interfaces: read_parsed("/proc/net/dev", |t| Some(parse_net_dev(t))).unwrap_or_default(),
            fs: FsReading::of(root_dir)
                .inspect_err(|error| warn!(path = %root_dir.display(), %error, "statvfs for node stats"))
                .ok(),
            max_pid: limits.into_iter().filter_map(|p| read_parsed(p, parse_number)).min(),
            processes: read_parsed("/proc/loadavg", parse_loadavg_tasks),
        }
    }
}

/// A file parsed by `parse`; a failure is logged and gives `None`.
fn read_parsed<T>(path: &str, parse: impl FnOnce(&str) -> Option<T>) -> Option<T> {
    let text = std::fs::read_to_string(path)
        .inspect_err(|error| warn!(path, %error, "reading a file for node stats"))
        .ok()?;
    let parsed = parse(&text);
    if parsed.is_none() {
        warn!(path, "unexpected contents in a file for node stats");
    }
    parsed
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROC_STAT: &str = "cpu  100 20 30 1000 50 5 6 7 40 0\n\
        cpu0 50 10 15 500 25 2 3 3 20 0\n\
        intr 12345 0 0\n\
        ctxt 999\n\
        btime 1700000000\n\
        processes 4242\n";

    #[test]
    fn proc_stat_counts_busy_ticks_in_core_nanoseconds() {
        let stat = parse_proc_stat(PROC_STAT, 100).expect("parses");
        // user + nice + system + irq + softirq + steal = 168 ticks of 10 ms.
        assert_eq!(stat.busy_core_nanos, 1_680_000_000);
        assert_eq!(stat.boot_time, Some(Timestamp::from_unix_seconds(1_700_000_000)));
        assert_eq!(parse_proc_stat(PROC_STAT, 250).map(|s| s.busy_core_nanos), Some(672_000_000));
    }

    #[test]
    fn proc_stat_without_a_cpu_line_or_clock_is_none() {
        assert_eq!(parse_proc_stat("btime 5\n", 100), None);
        assert_eq!(parse_proc_stat("cpu 1 2 x 4\n", 100), None);
        assert_eq!(parse_proc_stat(PROC_STAT, 0), None);
        let old_kernel = parse_proc_stat("cpu 1 2 3 4\n", 100).expect("four counters are enough");
        assert_eq!((old_kernel.busy_core_nanos, old_kernel.boot_time), (60_000_000, None));
    }

    const MEMINFO: &str = "MemTotal:       16000000 kB\n\
        MemFree:         2000000 kB\n\
        MemAvailable:   10000000 kB\n\
        Buffers:          500000 kB\n\
        Cached:          6000000 kB\n\
        AnonPages:       4000000 kB\n\
        HugePages_Total:       0\n";

    #[test]
    fn meminfo_gives_bytes_and_node_memory() {
        let info = parse_meminfo(MEMINFO).expect("parses");
        assert_eq!(
            info,
            MemInfo {
                total: 16_000_000 * 1024,
                free: 2_000_000 * 1024,
                available: 10_000_000 * 1024,
                anonymous: Some(4_000_000 * 1024),
            }
        );
        let stats = info.to_stats(Timestamp::from_unix_seconds(7));
        assert_eq!(stats.available_bytes, Some(10_000_000 * 1024));
        assert_eq!(stats.usage_bytes, Some(14_000_000 * 1024));
        assert_eq!(stats.working_set_bytes, Some(6_000_000 * 1024));
        assert_eq!(stats.rss_bytes, Some(4_000_000 * 1024));
        assert_eq!(stats.time, Timestamp::from_unix_seconds(7));
    }

    #[test]
    fn meminfo_without_mem_available_adds_buffers_and_cache() {
        let old = MEMINFO.replace("MemAvailable:   10000000 kB\n", "");
        assert_eq!(parse_meminfo(&old).map(|m| m.available), Some(8_500_000 * 1024));
        assert_eq!(parse_meminfo("MemFree: 1 kB\n"), None);
        assert_eq!(parse_meminfo("MemTotal: 1 MB\nMemFree: 1 kB\nMemAvailable: 1 kB\n"), None);
    }

    const NET_DEV: &str = "Inter-|   Receive                                                |  Transmit\n \
        face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n    \
        lo: 900000 10 0 0 0 0 0 0 900000 10 0 0 0 0 0 0\n  \
        eth0: 5000 10 2 0 0 0 0 0 7000 12 4 0 0 0 0 0\n   \
        ib0: 80000 10 0 0 0 0 0 0 1000 12 1 0 0 0 0 0\n  \
        eno1: 81000 10 0 0 0 0 0 0 0 12 0 0 0 0 0 0\n";

    #[test]
    fn net_dev_leaves_out_loopback_and_keeps_the_order() {
        let interfaces = parse_net_dev(NET_DEV);
        let names: Vec<&str> = interfaces.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(names, ["eth0", "ib0", "eno1"]);
        let eth0 = &interfaces[0];
        assert_eq!(
            (eth0.rx_bytes, eth0.rx_errors, eth0.tx_bytes, eth0.tx_errors),
            (Some(5000), Some(2), Some(7000), Some(4))
        );
    }

    #[test]
    fn the_busiest_interface_is_the_default_and_the_first_wins_a_tie() {
        let time = Timestamp::from_unix_seconds(1);
        let network = node_network(&parse_net_dev(NET_DEV), time).expect("interfaces");
        // ib0 and eno1 both moved 81000 bytes; ib0 comes first.
        assert_eq!(network.default_interface.name, "ib0");
        assert_eq!(network.default_interface.tx_errors, Some(1));
        assert_eq!(network.interfaces.len(), 3);
        assert_eq!(node_network(&[], time), None);
    }

    #[test]
    fn loadavg_gives_the_task_total() {
        assert_eq!(parse_loadavg_tasks("0.50 0.40 0.30 2/345 6789\n"), Some(345));
        assert_eq!(parse_loadavg_tasks("0.50 0.40 0.30\n"), None);
        assert_eq!(parse_number("4194304\n"), Some(4_194_304));
        assert_eq!(parse_number("many"), None);
    }

    #[test]
    fn statvfs_counts_become_bytes() {
        let fs = FsReading::from_counts(4096, 1000, 300, 250, 500, 120);
        assert_eq!(
            fs,
            FsReading {
                capacity: 4_096_000,
                available: 1_024_000,
                used: 2_867_200,
                inodes: 500,
                inodes_free: 120,
                inodes_used: 380,
            }
        );
        let stats = fs.to_stats(Timestamp::from_unix_seconds(3));
        assert_eq!(
            (stats.capacity_bytes, stats.used_bytes, stats.inodes_used),
            (Some(4_096_000), Some(2_867_200), Some(380))
        );
    }

    #[test]
    fn this_machine_reads() {
        let dir = tempfile::tempdir().expect("temp dir");
        let readings = NodeReadings::read(dir.path(), ticks_per_second());
        assert!(readings.cpu_core_nanos.is_some_and(|n| n > 0), "{readings:?}");
        assert!(readings.boot_time.is_some_and(|t| t < readings.time), "{readings:?}");
        assert!(readings.memory.is_some_and(|m| m.total > 0 && m.available <= m.total), "{readings:?}");
        assert!(readings.fs.is_some_and(|f| f.capacity > 0), "{readings:?}");
        assert!(readings.max_pid.is_some_and(|n| n > 0), "{readings:?}");
        assert!(readings.processes.is_some_and(|n| n > 0), "{readings:?}");
    }
}
