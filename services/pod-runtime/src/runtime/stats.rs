//! ContainerStats, ListContainerStats, PodSandboxStats, ListPodSandboxStats — from `/proc`.
//!
//! Nothing is delegated to us in cgroups (see [`crate::engine::limits_not_enforced`]), so the
//! figures come from the processes themselves:
//! - a sandbox's processes are those in its pause's PID namespace; a container's are those of
//!   them in the container's mount namespace (its init's, which `crun exec` joins too);
//! - CPU: user + system time of those processes and of the children they reaped, as
//!   nanoseconds of one core; `usage_nano_cores` from the previous sample of the same
//!   container or sandbox. Time of processes reaped by hpk-pause (orphans) is not counted;
//! - memory: working set and usage are the sum of the processes' resident set (pages shared
//!   between them count once per process), RSS their anonymous part, page faults summed;
//! - writable layer: bytes and inodes of the container's overlay upper directory;
//! - network: `/proc/<pause>/net/dev` of the sandbox's namespace, loopback excluded.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex as StdMutex;

use hpk_node_resources::procfs::ticks_per_second;
use k8s_cri::v1 as cri;

use super::exec::sandbox_processes;
use super::{Container, Error, Result, Runtime, Sandbox, labels_match, now_nanos};

/// The last CPU sample per container or sandbox: (timestamp ns, cumulative core-ns).
#[derive(Debug, Default)]
pub(crate) struct CpuSamples(StdMutex<HashMap<String, (i64, u64)>>);

impl CpuSamples {
    /// Records `usage` for `id` at `now`; returns the rate since the last sample, in
    /// nanocores, when there is one and time has passed.
    fn rate(&self, id: &str, now: i64, usage: u64) -> Option<u64> {
        let mut samples = self.0.lock().ok()?;
        let previous = samples.insert(id.to_owned(), (now, usage));
        let (then, before) = previous?;
        let elapsed = u64::try_from(now - then).ok().filter(|e| *e > 0)?;
        let used = usage.checked_sub(before)?;
        u64::try_from(u128::from(used) * 1_000_000_000 / u128::from(elapsed)).ok()
    }

    fn forget(&self, live: &[&str]) {
        if let Ok(mut samples) = self.0.lock() {
            samples.retain(|id, _| live.contains(&id.as_str()));
        }
    }
}

/// What one process uses.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Usage {
    /// CPU time in nanoseconds: user + system time, its own and its reaped children's, counted
    /// in clock ticks, or, when more, its main thread's run time from `/proc/<pid>/schedstat`
    /// (in nanoseconds, so a process that has run for less than a tick still shows) plus its
    /// children's ticks.
    nanos: u64,
    resident: u64,
    anonymous: u64,
    minor_faults: u64,
    major_faults: u64,
    processes: u64,
}

impl std::ops::AddAssign for Usage {
    fn add_assign(&mut self, o: Self) {
        self.nanos += o.nanos;
        self.resident += o.resident;
        self.anonymous += o.anonymous;
        self.minor_faults += o.minor_faults;
        self.major_faults += o.major_faults;
        self.processes += o.processes;
    }
}

/// Parses `/proc/<pid>/stat`, the `Rss*` lines of `/proc/<pid>/status` and, if read,
/// `/proc/<pid>/schedstat` (run time in nanoseconds, wait time, time slices).
pub(crate) fn parse_usage(stat: &str, status: &str, schedstat: Option<&str>) -> Option<Usage> {
    let stat = hpk_node_resources::procfs::PidStat::parse(stat)?;
    let kib = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    let tick = 1_000_000_000 / ticks_per_second();
    let ticks = (stat.utime + stat.stime + stat.cutime + stat.cstime).saturating_mul(tick);
    let run = schedstat
        .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .map(|ns| ns.saturating_add((stat.cutime + stat.cstime).saturating_mul(tick)));
    Some(Usage {
        nanos: run.map_or(ticks, |run| run.max(ticks)),
        resident: kib("VmRSS:"),
        anonymous: kib("RssAnon:"),
        minor_faults: stat.minor_faults,
        major_faults: stat.major_faults,
        processes: 1,
    })
}

fn usage_of(host_pid: i32) -> Option<Usage> {
    let stat = std::fs::read_to_string(format!("/proc/{host_pid}/stat")).ok()?;
    let status = std::fs::read_to_string(format!("/proc/{host_pid}/status")).ok()?;
    let schedstat = std::fs::read_to_string(format!("/proc/{host_pid}/schedstat")).ok();
    parse_usage(&stat, &status, schedstat.as_deref())
}

/// Usage of the sandbox's processes: all of them, and per mount namespace (container).
fn sandbox_usage(pause_pid: u32) -> (Usage, HashMap<std::path::PathBuf, Usage>) {
    let mut total = Usage::default();
    let mut by_mount_ns: HashMap<std::path::PathBuf, Usage> = HashMap::new();
    for process in sandbox_processes(pause_pid) {
        let Some(usage) = usage_of(process.host_pid) else { continue };
        total += usage;
        if let Ok(ns) = std::fs::read_link(format!("/proc/{}/ns/mnt", process.host_pid)) {
            *by_mount_ns.entry(ns).or_default() += usage;
        }
    }
    (total, by_mount_ns)
}

/// The mount namespace of the container's init, seen from the host.
fn container_mount_ns(c: &Container) -> Option<std::path::PathBuf> {
    let wanted = c.sandbox_pid?;
    let process = sandbox_processes(c.pause_pid).into_iter().find(|p| p.sandbox_pid == wanted)?;
    std::fs::read_link(format!("/proc/{}/ns/mnt", process.host_pid)).ok()
}

/// Bytes and inodes under `dir`, not following links.
fn disk_usage(dir: &Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let mut bytes = 0;
    let mut inodes = 0;
    let mut stack = vec![dir.to_owned()];
    while let Some(path) = stack.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&path) else { continue };
        inodes += 1;
        bytes += meta.blocks() * 512;
        if meta.is_dir()
            && let Ok(entries) = std::fs::read_dir(&path)
        {
            stack.extend(entries.flatten().map(|e| e.path()));
        }
    }
    (bytes, inodes)
}

/// Per-interface counters from a `/proc/net/dev`, loopback excluded.
pub(crate) fn parse_net_dev(text: &str, timestamp: i64) -> cri::NetworkUsage {
    let value = |v: u64| Some(cri::UInt64Value { value: v });
    let interfaces: Vec<cri::NetworkInterfaceUsage> = text
        .lines()
        .skip(2)
        .filter_map(|line| {
            let (name, counters) = line.split_once(':')?;
            let name = name.trim();
            let n: Vec<u64> = counters.split_whitespace().filter_map(|v| v.parse().ok()).collect();
            if name == "lo" || n.len() < 16 {
                return None;
            }
            Some(cri::NetworkInterfaceUsage {
                name: name.to_owned(),
                rx_bytes: value(n[0]),
                rx_errors: value(n[2]),
                tx_bytes: value(n[8]),
                tx_errors: value(n[10]),
            })
        })
        .collect();
    cri::NetworkUsage { timestamp, default_interface: interfaces.first().cloned(), interfaces }
}

impl Runtime {
    fn cpu(&self, id: &str, now: i64, usage: &Usage) -> cri::CpuUsage {
        let nanos = usage.nanos;
        cri::CpuUsage {
            timestamp: now,
            usage_core_nano_seconds: Some(cri::UInt64Value { value: nanos }),
            usage_nano_cores: self.cpu_samples.rate(id, now, nanos).map(|value| cri::UInt64Value { value }),
        }
    }

    fn container_stats_of(&self, c: &Container, usage: Option<Usage>, now: i64) -> cri::ContainerStats {
        let running = c.state == cri::ContainerState::ContainerRunning;
        let usage = if running { usage.unwrap_or_default() } else { Usage::default() };
        let value = |v: u64| Some(cri::UInt64Value { value: v });
        let upper = self.writable_dir(&c.id).join("upper");
        let (bytes, inodes) = disk_usage(&upper);
        cri::ContainerStats {
            attributes: Some(cri::ContainerAttributes {
                id: c.id.clone(),
                metadata: c.config.metadata.clone(),
                labels: c.config.labels.clone(),
                annotations: c.config.annotations.clone(),
            }),
            cpu: Some(self.cpu(&c.id, now, &usage)),
            memory: Some(cri::MemoryUsage {
                timestamp: now,
                working_set_bytes: value(usage.resident),
                available_bytes: None,
                usage_bytes: value(usage.resident),
                rss_bytes: value(usage.anonymous),
                page_faults: value(usage.minor_faults),
                major_page_faults: value(usage.major_faults),
            }),
            writable_layer: Some(cri::FilesystemUsage {
                timestamp: now,
                fs_id: Some(cri::FilesystemIdentifier { mountpoint: upper.display().to_string() }),
                used_bytes: value(bytes),
                inodes_used: value(inodes),
            }),
            swap: None,
        }
    }

    /// Stats of one container.
    pub async fn container_stats(&self, wanted: &str) -> Result<cri::ContainerStats> {
        let id = self.resolve_container(wanted).await?;
        let state = self.state.lock().await;
        let c =
            state.containers.get(&id).ok_or_else(|| Error::NotFound { kind: "container", id: id.clone() })?;
        let usage = container_mount_ns(c).and_then(|ns| sandbox_usage(c.pause_pid).1.remove(&ns));
        Ok(self.container_stats_of(c, usage, now_nanos()))
    }

    /// Stats of the containers matching `filter`.
    pub async fn list_container_stats(
        &self,
        filter: Option<cri::ContainerStatsFilter>,
    ) -> Vec<cri::ContainerStats> {
        let state = self.state.lock().await;
        let f = filter.unwrap_or_default();
        let now = now_nanos();
        let mut per_sandbox: HashMap<u32, HashMap<std::path::PathBuf, Usage>> = HashMap::new();
        let stats = state
            .containers
            .values()
            .filter(|c| {
                (f.id.is_empty() || c.id.starts_with(&f.id))
                    && (f.pod_sandbox_id.is_empty() || c.sandbox_id.starts_with(&f.pod_sandbox_id))
                    && labels_match(&c.config.labels, &f.label_selector)
            })
            .map(|c| {
                let by_ns = per_sandbox.entry(c.pause_pid).or_insert_with(|| sandbox_usage(c.pause_pid).1);
                let usage = container_mount_ns(c).and_then(|ns| by_ns.get(&ns).copied());
                self.container_stats_of(c, usage, now)
            })
            .collect();
        let live: Vec<&str> =
            state.containers.keys().chain(state.sandboxes.keys()).map(String::as_str).collect();
        self.cpu_samples.forget(&live);
        stats
    }

    fn sandbox_stats_of(&self, s: &Sandbox, containers: &[&Container], now: i64) -> cri::PodSandboxStats {
        let value = |v: u64| Some(cri::UInt64Value { value: v });
        let (total, by_ns) = if s.ready { sandbox_usage(s.pause_pid) } else { Default::default() };
        let network = if s.ready {
            std::fs::read_to_string(format!("/proc/{}/net/dev", s.pause_pid))
                .ok()
                .map(|text| parse_net_dev(&text, now))
        } else {
            None
        };
        let containers = containers
            .iter()
            .map(|c| {
                let usage = container_mount_ns(c).and_then(|ns| by_ns.get(&ns).copied());
                self.container_stats_of(c, usage, now)
            })
            .collect();
        cri::PodSandboxStats {
            attributes: Some(cri::PodSandboxAttributes {
                id: s.id.clone(),
                metadata: s.config.metadata.clone(),
                labels: s.config.labels.clone(),
                annotations: s.config.annotations.clone(),
            }),
            linux: Some(cri::LinuxPodSandboxStats {
                cpu: Some(self.cpu(&s.id, now, &total)),
                memory: Some(cri::MemoryUsage {
                    timestamp: now,
                    working_set_bytes: value(total.resident),
                    available_bytes: None,
                    usage_bytes: value(total.resident),
                    rss_bytes: value(total.anonymous),
                    page_faults: value(total.minor_faults),
                    major_page_faults: value(total.major_faults),
                }),
                network,
                process: Some(cri::ProcessUsage { timestamp: now, process_count: value(total.processes) }),
                containers,
            }),
            windows: None,
        }
    }

    /// Stats of one sandbox and its containers.
    pub async fn sandbox_stats(&self, wanted: &str) -> Result<cri::PodSandboxStats> {
        let id = self.resolve_sandbox(wanted).await?;
        let state = self.state.lock().await;
        let s =
            state.sandboxes.get(&id).ok_or_else(|| Error::NotFound { kind: "sandbox", id: id.clone() })?;
        let containers: Vec<&Container> = state.containers.values().filter(|c| c.sandbox_id == id).collect();
        Ok(self.sandbox_stats_of(s, &containers, now_nanos()))
    }

    /// Stats of the sandboxes matching `filter`.
    pub async fn list_sandbox_stats(
        &self,
        filter: Option<cri::PodSandboxStatsFilter>,
    ) -> Vec<cri::PodSandboxStats> {
        let state = self.state.lock().await;
        let f = filter.unwrap_or_default();
        let now = now_nanos();
        state
            .sandboxes
            .values()
            .filter(|s| {
                (f.id.is_empty() || s.id.starts_with(&f.id))
                    && labels_match(&s.config.labels, &f.label_selector)
            })
            .map(|s| {
                let containers: Vec<&Container> =
                    state.containers.values().filter(|c| c.sandbox_id == s.id).collect();
                self.sandbox_stats_of(s, &containers, now)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_comes_from_stat_and_status() {
        // pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime cutime cstime ...
        let stat = "42 (sh (x)) S 1 42 42 0 -1 4194560 120 0 3 0 7 5 2 1 20 0 1 0 100 2000 300";
        let status = "Name:\tsh\nVmRSS:\t    1200 kB\nRssAnon:\t     200 kB\n";
        let tick = 1_000_000_000 / ticks_per_second();
        let usage = parse_usage(stat, status, None).expect("parses");
        assert_eq!(usage.nanos, (7 + 5 + 2 + 1) * tick);
        // A process that has run for less than a tick: its run time in nanoseconds, plus its
        // reaped children's ticks; never less than the ticks say.
        let fresh = "42 (sleep) S 1 42 42 0 -1 4194560 120 0 3 0 0 0 2 1 20 0 1 0 100 2000 300";
        let usage = parse_usage(fresh, status, Some("734512 20001 3\n")).expect("parses");
        assert_eq!(usage.nanos, 734_512 + 3 * tick);
        let usage = parse_usage(stat, status, Some("5 0 1\n")).expect("parses");
        assert_eq!(usage.nanos, (7 + 5 + 2 + 1) * tick, "the larger of the two");
        let usage = parse_usage(stat, status, Some("garbage")).expect("parses");
        assert_eq!(usage.nanos, (7 + 5 + 2 + 1) * tick);
        assert_eq!(usage.resident, 1200 * 1024);
        assert_eq!(usage.anonymous, 200 * 1024);
        assert_eq!((usage.minor_faults, usage.major_faults), (120, 3));
        assert_eq!(parse_usage("garbage", status, None), None);
    }

    #[test]
    fn net_dev_skips_loopback() {
        let text = "Inter-|   Receive                                                |  Transmit\n \
            face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n    \
            lo:  100 1 0 0 0 0 0 0 100 1 0 0 0 0 0 0\n  \
            eth0: 5000 10 2 0 0 0 0 0 7000 12 4 0 0 0 0 0\n";
        let usage = parse_net_dev(text, 5);
        assert_eq!(usage.interfaces.len(), 1);
        let eth0 = &usage.interfaces[0];
        assert_eq!(eth0.name, "eth0");
        assert_eq!(eth0.rx_bytes.as_ref().map(|v| v.value), Some(5000));
        assert_eq!(eth0.rx_errors.as_ref().map(|v| v.value), Some(2));
        assert_eq!(eth0.tx_bytes.as_ref().map(|v| v.value), Some(7000));
        assert_eq!(eth0.tx_errors.as_ref().map(|v| v.value), Some(4));
        assert_eq!(usage.default_interface.map(|i| i.name), Some("eth0".to_owned()));
    }

    #[test]
    fn cpu_rate_needs_two_samples() {
        let samples = CpuSamples::default();
        assert_eq!(samples.rate("a", 1_000_000_000, 0), None);
        // Half a core over one second.
        assert_eq!(samples.rate("a", 2_000_000_000, 500_000_000), Some(500_000_000));
        // A counter that went back (a process left) gives no rate.
        assert_eq!(samples.rate("a", 3_000_000_000, 100), None);
    }
}
