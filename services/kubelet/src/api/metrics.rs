//! The kubelet's own metrics at `/metrics` (Prometheus text): its HTTP requests, the pods
//! and containers it runs, the node's name, and the process's CPU, memory and start time.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::pods::{Context, lock};

/// (method, route, code) → (count, seconds).
type Requests = BTreeMap<(&'static str, &'static str, u16), (u64, f64)>;

/// Request counters and the in-flight gauge.
#[derive(Debug, Default)]
pub struct Metrics {
    requests: Mutex<Requests>,
    inflight: AtomicI64,
    sessions: Arc<AtomicI64>,
}

/// Counts an exec, attach or port-forward session as open while it lives.
pub struct Session(Arc<AtomicI64>);

impl Drop for Session {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Counts a request as in flight while it lives.
pub struct Inflight<'a>(&'a AtomicI64);

impl Drop for Inflight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Metrics {
    /// Marks a request in flight until the guard drops.
    pub fn inflight(&self) -> Inflight<'_> {
        self.inflight.fetch_add(1, Ordering::Relaxed);
        Inflight(&self.inflight)
    }

    /// Marks a streaming session open until the guard drops.
    pub fn session(&self) -> Session {
        self.sessions.fetch_add(1, Ordering::Relaxed);
        Session(self.sessions.clone())
    }

    /// Counts a finished request. Methods other than the standard ones count as `other`, so
    /// clients (even unauthenticated ones) cannot grow the label set without bound.
    pub fn observe(&self, method: &str, route: &'static str, code: u16, took: Duration) {
        const KNOWN: [&str; 7] = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"];
        let method = KNOWN.iter().find(|m| **m == method).copied().unwrap_or("other");
        let mut requests = self.requests.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let entry = requests.entry((method, route, code)).or_default();
        entry.0 += 1;
        entry.1 += took.as_secs_f64();
    }

    /// The exposition.
    pub fn render(&self, ctx: &Context) -> String {
        let mut out = String::new();
        let requests = self.requests.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        let _ = writeln!(
            out,
            "# HELP kubelet_http_requests_total Number of HTTP requests the kubelet API answered, by method, path and code."
        );
        let _ = writeln!(out, "# TYPE kubelet_http_requests_total counter");
        for ((method, route, code), (count, _)) in &requests {
            let _ = writeln!(
                out,
                "kubelet_http_requests_total{{code=\"{code}\",method=\"{method}\",path=\"{route}\",server_type=\"readwrite\"}} {count}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP kubelet_http_requests_duration_seconds_sum Total seconds spent answering HTTP requests, by method, path and code."
        );
        let _ = writeln!(out, "# TYPE kubelet_http_requests_duration_seconds_sum counter");
        for ((method, route, code), (_, seconds)) in &requests {
            let _ = writeln!(
                out,
                "kubelet_http_requests_duration_seconds_sum{{code=\"{code}\",method=\"{method}\",path=\"{route}\",server_type=\"readwrite\"}} {seconds}"
            );
        }
        let _ =
            writeln!(out, "# HELP kubelet_http_inflight_requests Number of HTTP requests being answered.");
        let _ = writeln!(out, "# TYPE kubelet_http_inflight_requests gauge");
        let _ = writeln!(
            out,
            "kubelet_http_inflight_requests{{server_type=\"readwrite\"}} {}",
            self.inflight.load(Ordering::Relaxed)
        );

        let _ = writeln!(
            out,
            "# HELP kubelet_streaming_sessions Exec, attach and port-forward sessions being proxied to the runtime."
        );
        let _ = writeln!(out, "# TYPE kubelet_streaming_sessions gauge");
        let _ = writeln!(out, "kubelet_streaming_sessions {}", self.sessions.load(Ordering::Relaxed));

        let (pods, running, waiting) = {
            let summaries = lock(&ctx.summaries);
            let running =
                summaries.values().flat_map(|p| &p.containers).filter(|c| c.state == "running").count();
            let all = summaries.values().map(|p| p.containers.len()).sum::<usize>();
            (summaries.len(), running, all - running)
        };
        let _ = writeln!(out, "# HELP kubelet_running_pods Number of pods the kubelet runs.");
        let _ = writeln!(out, "# TYPE kubelet_running_pods gauge");
        let _ = writeln!(out, "kubelet_running_pods {pods}");
        let _ = writeln!(out, "# HELP kubelet_running_containers Number of containers by state.");
        let _ = writeln!(out, "# TYPE kubelet_running_containers gauge");
        let _ = writeln!(out, "kubelet_running_containers{{container_state=\"running\"}} {running}");
        let _ = writeln!(out, "kubelet_running_containers{{container_state=\"other\"}} {waiting}");
        let _ = writeln!(out, "# HELP kubelet_node_name The node's name. The count is always 1.");
        let _ = writeln!(out, "# TYPE kubelet_node_name gauge");
        let _ = writeln!(out, "kubelet_node_name{{node=\"{}\"}} 1", ctx.node_name);
        process_metrics(&mut out);
        out
    }
}

/// `process_*` from /proc/self.
fn process_metrics(out: &mut String) {
    use hpk_node_resources::procfs::{MachineStat, PidStat, page_size, ticks_per_second};
    let Some(own) = PidStat::read(None) else { return };
    let ticks = ticks_per_second() as f64;
    let boot = MachineStat::read().and_then(|m| m.boot_time).unwrap_or(0) as f64;
    let _ =
        writeln!(out, "# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.");
    let _ = writeln!(out, "# TYPE process_cpu_seconds_total counter");
    let _ = writeln!(out, "process_cpu_seconds_total {}", (own.utime + own.stime) as f64 / ticks);
    let _ = writeln!(out, "# HELP process_resident_memory_bytes Resident memory size in bytes.");
    let _ = writeln!(out, "# TYPE process_resident_memory_bytes gauge");
    let _ = writeln!(out, "process_resident_memory_bytes {}", own.rss_pages.saturating_mul(page_size()));
    let _ = writeln!(
        out,
        "# HELP process_start_time_seconds Start time of the process since unix epoch in seconds."
    );
    let _ = writeln!(out, "# TYPE process_start_time_seconds gauge");
    let _ = writeln!(out, "process_start_time_seconds {}", boot + own.start_ticks as f64 / ticks);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn odd_methods_share_one_label() {
        let m = Metrics::default();
        for method in ["GET", "BREW", "WHEN", "GET"] {
            m.observe(method, "pods", 405, Duration::from_millis(1));
        }
        let requests = m.requests.lock().expect("lock").clone();
        assert_eq!(requests.len(), 2);
        assert_eq!(requests[&("GET", "pods", 405)].0, 2);
        assert_eq!(requests[&("other", "pods", 405)].0, 2);
    }
}
