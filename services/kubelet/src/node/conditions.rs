//! The node's conditions: readers of the system's figures, the decisions on them as pure
//! functions, and the transition bookkeeping the API expects.

use std::path::Path;

pub use hpk_node_resources::Filesystem;
use k8s_openapi::api::core::v1::NodeCondition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::NodeError;
use super::resources::{meminfo_bytes, read_text};

/// Memory pressure below this much `MemAvailable`.
pub const MEMORY_AVAILABLE_MIN: i64 = 100 << 20;
/// Disk pressure below this share (in percent) of the filesystem available, by default (the
/// kubelet's `nodefs.available<10%`).
pub const DISK_AVAILABLE_MIN_PERCENT: u8 = 10;
/// PID pressure above this share (in percent) of the PID limit in use.
pub const PIDS_USED_MAX_PERCENT: i64 = 90;

/// One condition as the kubelet observed it, before timestamps. Messages name thresholds, not
/// live figures, so that a push is due when a condition changes, not whenever a figure moves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    /// `Ready`, `MemoryPressure`, …
    pub kind: &'static str,
    /// Whether the condition holds.
    pub status: bool,
    /// A CamelCase reason.
    pub reason: &'static str,
    /// For a person.
    pub message: String,
}

impl Check {
    /// The API condition: the heartbeat is `now`; the transition time is kept from `previous`
    /// while the status stays what it was.
    pub fn to_condition(&self, previous: Option<&NodeCondition>, now: &Time) -> NodeCondition {
        let status = if self.status { "True" } else { "False" };
        let transition = match previous {
            Some(p) if p.status == status => p.last_transition_time.clone().unwrap_or_else(|| now.clone()),
            _ => now.clone(),
        };
        NodeCondition {
            type_: self.kind.to_owned(),
            status: status.to_owned(),
            reason: Some(self.reason.to_owned()),
            message: Some(self.message.clone()),
            last_heartbeat_time: Some(now.clone()),
            last_transition_time: Some(transition),
        }
    }
}

/// The filesystem holding `path`.
pub fn filesystem(path: &Path) -> Result<Filesystem, NodeError> {
    Ok(hpk_node_resources::filesystem(path)?)
}

/// `MemAvailable` of /proc/meminfo, in bytes.
pub fn memory_available() -> Result<i64, NodeError> {
    let path = Path::new("/proc/meminfo");
    meminfo_bytes(&read_text(path)?, "MemAvailable")
        .ok_or_else(|| hpk_node_resources::Error::Parse { what: "MemAvailable", path: path.into() }.into())
}

/// PIDs in use and the limit on them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pids {
    /// Tasks (threads) alive: each holds a PID.
    pub used: i64,
    /// `kernel.pid_max`.
    pub pid_max: i64,
    /// `kernel.threads-max`, when readable.
    pub threads_max: Option<i64>,
}

/// The PIDs in use (/proc/loadavg's task total, else the numeric entries of /proc) and the limits.
pub fn pids() -> Result<Pids, NodeError> {
    let number = |path: &str| -> Result<i64, NodeError> {
        read_text(Path::new(path))?
            .trim()
            .parse()
            .map_err(|_| hpk_node_resources::Error::Parse { what: "a number", path: path.into() }.into())
    };
    let pid_max = number("/proc/sys/kernel/pid_max")?;
    let threads_max = number("/proc/sys/kernel/threads-max").ok();
    let used = match read_text(Path::new("/proc/loadavg")).ok().as_deref().and_then(loadavg_tasks) {
        Some(n) => n,
        None => count_processes()?,
    };
    Ok(Pids { used, pid_max, threads_max })
}

/// The total of the 4th field of /proc/loadavg (`running/total`).
fn loadavg_tasks(text: &str) -> Option<i64> {
    text.split_whitespace().nth(3)?.split_once('/')?.1.parse().ok()
}

fn count_processes() -> Result<i64, NodeError> {
    let entries = std::fs::read_dir("/proc").map_err(|source| hpk_node_resources::Error::Read {
        what: "process list",
        path: "/proc".into(),
        source,
    })?;
    let n = entries
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_str().is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit())))
        .count();
    Ok(i64::try_from(n).unwrap_or(i64::MAX))
}

/// MemoryPressure from `MemAvailable` (or why it could not be read).
pub fn memory(available: Result<i64, NodeError>) -> Check {
    let kind = "MemoryPressure";
    match available {
        Ok(bytes) if bytes < MEMORY_AVAILABLE_MIN => Check {
            kind,
            status: true,
            reason: "KubeletHasInsufficientMemory",
            message: format!(
                "kubelet has insufficient memory available: less than {} MiB",
                MEMORY_AVAILABLE_MIN >> 20
            ),
        },
        Ok(_) => Check {
            kind,
            status: false,
            reason: "KubeletHasSufficientMemory",
            message: "kubelet has sufficient memory available".into(),
        },
        Err(e) => unmeasured(kind, "KubeletHasSufficientMemory", &e),
    }
}

/// DiskPressure from the state directory's filesystem: less than `min_percent` available.
pub fn disk(fs: Result<Filesystem, NodeError>, min_percent: u8) -> Check {
    let kind = "DiskPressure";
    match fs {
        Ok(fs) if fs.available.saturating_mul(100) < fs.total.saturating_mul(i64::from(min_percent)) => {
            Check {
                kind,
                status: true,
                reason: "KubeletHasDiskPressure",
                message: format!(
                    "kubelet has disk pressure: less than {min_percent} % of its filesystem available"
                ),
            }
        }
        Ok(_) => Check {
            kind,
            status: false,
            reason: "KubeletHasNoDiskPressure",
            message: "kubelet has no disk pressure".into(),
        },
        Err(e) => unmeasured(kind, "KubeletHasNoDiskPressure", &e),
    }
}

/// PIDPressure: more than 90 % of the lower of `pid_max` and `threads-max` in use.
pub fn pid(pids: Result<Pids, NodeError>) -> Check {
    let kind = "PIDPressure";
    match pids {
        Ok(p) => {
            let limit = p.threads_max.map_or(p.pid_max, |t| t.min(p.pid_max));
            if p.used.saturating_mul(100) > limit.saturating_mul(PIDS_USED_MAX_PERCENT) {
                Check {
                    kind,
                    status: true,
                    reason: "KubeletHasInsufficientPID",
                    message: format!(
                        "kubelet has insufficient PID available: more than {PIDS_USED_MAX_PERCENT} % of {limit} in use"
                    ),
                }
            } else {
                Check {
                    kind,
                    status: false,
                    reason: "KubeletHasSufficientPID",
                    message: "kubelet has sufficient PID available".into(),
                }
            }
        }
        Err(e) => unmeasured(kind, "KubeletHasSufficientPID", &e),
    }
}

/// A pressure the kubelet could not measure is not claimed; the message says why.
fn unmeasured(kind: &'static str, reason: &'static str, error: &NodeError) -> Check {
    let error = super::error_chain(error);
    Check { kind, status: false, reason, message: format!("kubelet could not measure this: {error}") }
}

/// What Ready depends on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Probe {
    /// Answered and ready.
    Ready,
    /// Answered, not ready, or did not answer: why.
    NotReady(String),
}

/// Ready: the runtime (RuntimeReady and NetworkReady) and, when configured, the net-forwarder.
pub fn ready(runtime: &Probe, forwarder: Option<&Probe>) -> Check {
    let mut problems = Vec::new();
    if let Probe::NotReady(why) = runtime {
        problems.push(format!("container runtime hpk-pod-runtime is not ready: {why}"));
    }
    if let Some(Probe::NotReady(why)) = forwarder {
        problems.push(format!("hpk-net-forwarder is not serving: {why}"));
    }
    if problems.is_empty() {
        Check {
            kind: "Ready",
            status: true,
            reason: "KubeletReady",
            message: "kubelet is posting ready status".into(),
        }
    } else {
        Check { kind: "Ready", status: false, reason: "KubeletNotReady", message: problems.join("; ") }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: i64 = 1 << 20;

    fn time(seconds: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(seconds).unwrap())
    }

    #[test]
    fn memory_threshold() {
        assert!(memory(Ok(99 * MIB)).status);
        assert!(!memory(Ok(100 * MIB)).status);
        assert!(!memory(Ok(8 << 30)).status);
        let failed = memory(Err(NodeError::System(hpk_node_resources::Error::Read {
            what: "memory",
            path: "/proc/meminfo".into(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no /proc"),
        })));
        assert!(!failed.status && failed.message.contains("no /proc"));
    }

    #[test]
    fn disk_threshold() {
        let fs = |available| Ok(Filesystem { total: 1000 * MIB, available });
        assert!(disk(fs(99 * MIB), DISK_AVAILABLE_MIN_PERCENT).status);
        assert!(!disk(fs(100 * MIB), DISK_AVAILABLE_MIN_PERCENT).status);
        assert!(!disk(fs(900 * MIB), DISK_AVAILABLE_MIN_PERCENT).status);
        assert_eq!(disk(fs(0), DISK_AVAILABLE_MIN_PERCENT).reason, "KubeletHasDiskPressure");
        assert!(!disk(fs(20 * MIB), 1).status, "a lower threshold");
    }

    #[test]
    fn pid_threshold_honours_the_lower_limit() {
        let p = |used, threads_max| Ok(Pids { used, pid_max: 1000, threads_max });
        assert!(!pid(p(900, None)).status);
        assert!(pid(p(901, None)).status);
        assert!(pid(p(500, Some(500))).status, "threads-max lower than pid_max");
        assert!(!pid(p(500, Some(100_000))).status);
    }

    #[test]
    fn loadavg_task_total() {
        assert_eq!(loadavg_tasks("0.52 0.58 0.59 3/1234 56789\n"), Some(1234));
        assert_eq!(loadavg_tasks("garbage"), None);
    }

    #[test]
    fn the_system_readers_work_here() {
        assert!(memory_available().unwrap() > 0);
        let p = pids().unwrap();
        assert!(p.used > 0 && p.pid_max > 0, "{p:?}");
        let fs = filesystem(Path::new("/")).unwrap();
        assert!(fs.total >= fs.available && fs.total > 0);
    }

    #[test]
    fn ready_names_what_is_not() {
        let ok = ready(&Probe::Ready, None);
        assert!(ok.status);
        assert_eq!(ok.reason, "KubeletReady");
        let down = ready(&Probe::NotReady("connection refused".into()), Some(&Probe::Ready));
        assert!(!down.status);
        assert_eq!(down.reason, "KubeletNotReady");
        assert!(down.message.contains("runtime") && down.message.contains("connection refused"));
        let both = ready(&Probe::NotReady("a".into()), Some(&Probe::NotReady("b".into())));
        assert!(both.message.contains("runtime") && both.message.contains("net-forwarder"));
        assert!(!ready(&Probe::Ready, Some(&Probe::NotReady("NOT_SERVING".into()))).status);
    }

    #[test]
    fn transition_time_changes_only_with_the_status() {
        let ready_check = ready(&Probe::Ready, None);
        let first = ready_check.to_condition(None, &time(100));
        assert_eq!(first.last_transition_time, Some(time(100)));
        let second = ready_check.to_condition(Some(&first), &time(110));
        assert_eq!(second.last_heartbeat_time, Some(time(110)));
        assert_eq!(second.last_transition_time, Some(time(100)), "same status: kept");
        let down = ready(&Probe::NotReady("x".into()), None).to_condition(Some(&second), &time(120));
        assert_eq!(down.status, "False");
        assert_eq!(down.last_transition_time, Some(time(120)), "new status: now");
        let message_only = ready(&Probe::NotReady("y".into()), None).to_condition(Some(&down), &time(130));
        assert_eq!(message_only.last_transition_time, Some(time(120)), "a new message is no transition");
        let unknown = NodeCondition { status: "Unknown".into(), ..first.clone() };
        let back = ready_check.to_condition(Some(&unknown), &time(140));
        assert_eq!(back.last_transition_time, Some(time(140)), "from the controller's Unknown");
    }
}
