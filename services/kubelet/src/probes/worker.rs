//! A probe's schedule: initialDelaySeconds, then one attempt every periodSeconds, with the
//! verdict changing after successThreshold successes or failureThreshold failures in a row.

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::core::v1::Probe;
use tokio::sync::mpsc::Sender;
use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use super::{Outcome, ProbeKind, ProbeReport, Target, check};

/// The schedule and thresholds of a probe, defaulted as the API server defaults them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Schedule {
    initial_delay: Duration,
    period: Duration,
    success_threshold: u32,
    failure_threshold: u32,
}

impl Schedule {
    fn of(kind: ProbeKind, probe: &Probe) -> Self {
        let positive = |v: Option<i32>, default: u32| {
            v.and_then(|v| u32::try_from(v).ok()).filter(|v| *v > 0).unwrap_or(default)
        };
        Self {
            initial_delay: Duration::from_secs(
                u64::try_from(probe.initial_delay_seconds.unwrap_or(0)).unwrap_or(0),
            ),
            period: Duration::from_secs(u64::from(positive(probe.period_seconds, 10))),
            // Liveness and startup probes must use 1 (the API server refuses anything else).
            success_threshold: match kind {
                ProbeKind::Readiness => positive(probe.success_threshold, 1),
                ProbeKind::Liveness | ProbeKind::Startup => 1,
            },
            failure_threshold: positive(probe.failure_threshold, 3),
        }
    }
}

/// Runs `probe` for a started container until `cancel` fires or `reports` closes: waits
/// initialDelaySeconds, then checks every periodSeconds (default 10); successThreshold
/// (default 1) and failureThreshold (default 3) decide when the verdict changes. Readiness
/// starts unready and goes on for the container's life; liveness starts alive and stops after
/// reporting `healthy: false` (the caller restarts the container); startup reports once,
/// either way, and stops. Every failed attempt is reported as [`ProbeReport::Failed`].
/// Liveness and readiness probes are for the caller to start once startup has succeeded.
pub fn spawn(
    kind: ProbeKind,
    probe: Probe,
    target: Target,
    reports: Sender<ProbeReport>,
    cancel: CancellationToken,
) -> JoinHandle<()> {
    let schedule = Schedule::of(kind, &probe);
    let container = target.container.name.clone();
    tokio::spawn(async move {
        let attempt = || check(kind, &probe, &target);
        run(kind, schedule, container, attempt, reports, cancel).await;
    })
}

async fn run<F, Fut>(
    kind: ProbeKind,
    schedule: Schedule,
    container: String,
    mut attempt: F,
    reports: Sender<ProbeReport>,
    cancel: CancellationToken,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = Outcome>,
{
    tracing::debug!(container = %container, probe = %kind, ?schedule, "probe worker started");
    tokio::select! {
        () = cancel.cancelled() => return,
        () = tokio::time::sleep(schedule.initial_delay) => {}
    }
    let mut ticks = tokio::time::interval(schedule.period);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    // Readiness starts unready; liveness starts alive; startup is pending (neither).
    let mut healthy = match kind {
        ProbeKind::Readiness => Some(false),
        ProbeKind::Liveness => Some(true),
        ProbeKind::Startup => None,
    };
    let (mut last_success, mut run_length) = (None, 0u32);
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            _ = ticks.tick() => {}
        }
        let outcome = tokio::select! {
            () = cancel.cancelled() => return,
            outcome = attempt() => outcome,
        };
        let success = !matches!(outcome, Outcome::Failure(_));
        let report = match outcome {
            Outcome::Unknown(message) => {
                tracing::debug!(container = %container, probe = %kind, %message, "probe attempt not made");
                continue;
            }
            Outcome::Success => None,
            Outcome::Failure(message) => {
                tracing::debug!(container = %container, probe = %kind, %message, "probe failed");
                Some(ProbeReport::Failed { container: container.clone(), kind, message })
            }
            Outcome::Warning(message) => {
                Some(ProbeReport::Warned { container: container.clone(), kind, message })
            }
        };
        if let Some(report) = report
            && reports.send(report).await.is_err()
        {
            return;
        }
        if last_success == Some(success) {
            run_length = run_length.saturating_add(1);
        } else {
            (last_success, run_length) = (Some(success), 1);
        }
        let threshold = if success { schedule.success_threshold } else { schedule.failure_threshold };
        if run_length < threshold || healthy == Some(success) {
            continue;
        }
        healthy = Some(success);
        tracing::info!(container = %container, probe = %kind, healthy = success, "probe verdict changed");
        let report = ProbeReport::Changed { container: container.clone(), kind, healthy: success };
        if reports.send(report).await.is_err() {
            return;
        }
        // A dead container is restarted, a started one is not probed for startup again.
        let done = match kind {
            ProbeKind::Readiness => false,
            ProbeKind::Liveness => !success,
            ProbeKind::Startup => true,
        };
        if done {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probes::testing::{closed_port, probe, target};
    use serde_json::json;
    use std::sync::{Arc, Mutex};
    use tokio::sync::mpsc;
    use tokio::time::Instant;

    /// Runs a worker whose attempts answer `script` (`true` = success; the last answer
    /// repeats), for at most `for_secs` of (paused) time; returns its reports in order, the
    /// seconds after the start at which it checked, and whether it stopped by itself.
    async fn drive(
        kind: ProbeKind,
        p: serde_json::Value,
        script: &[bool],
        for_secs: u64,
    ) -> (Vec<String>, Vec<u64>, bool) {
        let schedule = Schedule::of(kind, &probe(p));
        let start = Instant::now();
        let times = Arc::new(Mutex::new(Vec::new()));
        let (script, log) = (script.to_vec(), times.clone());
        let attempt = move || {
            let mut log = log.lock().expect("lock");
            let n = log.len();
            log.push(start.elapsed().as_secs());
            let ok = script.get(n).or(script.last()).copied().unwrap_or(true);
            std::future::ready(if ok { Outcome::Success } else { Outcome::Failure(format!("failure {n}")) })
        };
        let (tx, mut rx) = mpsc::channel(64);
        let cancel = CancellationToken::new();
        let worker = tokio::spawn(run(kind, schedule, "app".into(), attempt, tx, cancel.clone()));
        let stopped = tokio::time::timeout(Duration::from_secs(for_secs), async {
            while !worker.is_finished() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await
        .is_ok();
        cancel.cancel();
        let mut reports = Vec::new();
        while let Some(report) = rx.recv().await {
            reports.push(match report {
                ProbeReport::Failed { container, kind: k, message } => {
                    assert_eq!((container.as_str(), k), ("app", kind));
                    message
                }
                ProbeReport::Warned { message, .. } => format!("warned: {message}"),
                ProbeReport::Changed { healthy, .. } => format!("healthy={healthy}"),
            });
        }
        let times = times.lock().expect("lock").clone();
        (reports, times, stopped)
    }

    #[tokio::test(start_paused = true)]
    async fn a_warning_passes_and_is_reported_each_time() {
        let schedule = Schedule::of(
            ProbeKind::Liveness,
            &probe(json!({"tcpSocket": {"port": 1}, "periodSeconds": 1, "failureThreshold": 1})),
        );
        let attempt = || std::future::ready(Outcome::Warning("Liveness probe warning: redirected".into()));
        let (tx, mut rx) = mpsc::channel(64);
        let cancel = CancellationToken::new();
        let worker =
            tokio::spawn(run(ProbeKind::Liveness, schedule, "app".into(), attempt, tx, cancel.clone()));
        tokio::time::sleep(Duration::from_millis(2500)).await;
        cancel.cancel();
        worker.await.expect("worker");
        let mut reports = Vec::new();
        while let Some(report) = rx.recv().await {
            reports.push(report);
        }
        assert!(reports.len() >= 2, "{reports:?}");
        for report in reports {
            assert!(
                matches!(&report, ProbeReport::Warned { message, .. } if message.ends_with("redirected")),
                "only warnings, never unhealthy: {report:?}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_attempt_not_made_is_thrown_away() {
        let schedule = Schedule::of(
            ProbeKind::Liveness,
            &probe(json!({"tcpSocket": {"port": 1}, "periodSeconds": 1, "failureThreshold": 2})),
        );
        let n = Arc::new(Mutex::new(0usize));
        let attempt = move || {
            let mut n = n.lock().expect("lock");
            *n += 1;
            std::future::ready(match *n {
                1 | 5 => Outcome::Failure(format!("failure {n}")),
                _ => Outcome::Unknown("Liveness probe: the remote runtime did not run the probe".into()),
            })
        };
        let (tx, mut rx) = mpsc::channel(64);
        let worker = tokio::spawn(run(
            ProbeKind::Liveness,
            schedule,
            "app".into(),
            attempt,
            tx,
            CancellationToken::new(),
        ));
        tokio::time::timeout(Duration::from_secs(60), worker)
            .await
            .expect("stops at the verdict")
            .expect("worker");
        let mut reports = Vec::new();
        while let Some(report) = rx.recv().await {
            reports.push(report);
        }
        assert_eq!(
            reports,
            [
                ProbeReport::Failed {
                    container: "app".into(),
                    kind: ProbeKind::Liveness,
                    message: "failure 1".into()
                },
                ProbeReport::Failed {
                    container: "app".into(),
                    kind: ProbeKind::Liveness,
                    message: "failure 5".into()
                },
                ProbeReport::Changed { container: "app".into(), kind: ProbeKind::Liveness, healthy: false },
            ],
            "no event and no count for the three attempts not made, which do not break the run of failures"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn readiness_waits_the_initial_delay_then_follows_its_thresholds() {
        let p = json!({"tcpSocket": {"port": 1}, "initialDelaySeconds": 5, "periodSeconds": 2,
                       "successThreshold": 2, "failureThreshold": 2});
        let (reports, times, stopped) =
            drive(ProbeKind::Readiness, p, &[false, true, true, true, false, false, true], 18).await;
        assert!(!stopped, "readiness goes on");
        assert_eq!(times[..7], [5, 7, 9, 11, 13, 15, 17]);
        assert_eq!(
            reports,
            ["failure 0", "healthy=true", "failure 4", "failure 5", "healthy=false"],
            "ready after 2 successes, unready after 2 failures, one success is not enough"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn liveness_reports_death_after_the_failure_threshold_and_stops() {
        let p = json!({"exec": {"command": ["true"]}, "periodSeconds": 1});
        let (reports, times, stopped) =
            drive(ProbeKind::Liveness, p, &[false, false, true, false, false, false], 60).await;
        assert!(stopped);
        assert_eq!(times, [0, 1, 2, 3, 4, 5], "checks at once, then every period; nothing after the verdict");
        assert_eq!(
            reports,
            ["failure 0", "failure 1", "failure 3", "failure 4", "failure 5", "healthy=false"]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn liveness_that_passes_says_nothing() {
        let (reports, times, stopped) =
            drive(ProbeKind::Liveness, json!({"exec": {"command": ["true"]}}), &[true], 35).await;
        assert!(!stopped && reports.is_empty());
        assert_eq!(times, [0, 10, 20, 30], "default period 10 s");
    }

    #[tokio::test(start_paused = true)]
    async fn startup_reports_once_either_way_and_stops() {
        let p = json!({"exec": {"command": ["true"]}, "periodSeconds": 1, "failureThreshold": 3});
        let (reports, _, stopped) = drive(ProbeKind::Startup, p.clone(), &[false, true], 60).await;
        assert!(stopped);
        assert_eq!(reports, ["failure 0", "healthy=true"]);
        let (reports, times, stopped) = drive(ProbeKind::Startup, p, &[false], 60).await;
        assert!(stopped);
        assert_eq!((reports.last().map(String::as_str), times.len()), (Some("healthy=false"), 3));
    }

    #[tokio::test(start_paused = true)]
    async fn cancel_and_a_closed_channel_stop_the_worker() {
        let schedule = Schedule::of(ProbeKind::Readiness, &probe(json!({"periodSeconds": 1})));
        let (tx, rx) = mpsc::channel(1);
        let cancel = CancellationToken::new();
        let worker = tokio::spawn(run(
            ProbeKind::Readiness,
            schedule,
            "app".into(),
            || std::future::ready(Outcome::Success),
            tx,
            cancel.clone(),
        ));
        tokio::time::sleep(Duration::from_secs(3)).await;
        cancel.cancel();
        tokio::time::timeout(Duration::from_secs(1), worker)
            .await
            .expect("stops on cancel")
            .expect("no panic");
        drop(rx);

        let (tx, rx) = mpsc::channel(1);
        drop(rx);
        let fail = || std::future::ready(Outcome::Failure("no".into()));
        let worker = tokio::spawn(run(
            ProbeKind::Readiness,
            schedule,
            "app".into(),
            fail,
            tx,
            CancellationToken::new(),
        ));
        tokio::time::timeout(Duration::from_secs(1), worker)
            .await
            .expect("stops when nobody listens")
            .expect("no panic");
    }

    #[test]
    fn schedule_defaults_as_the_api_server_does() {
        let s = Schedule::of(ProbeKind::Liveness, &probe(json!({"successThreshold": 3, "periodSeconds": 0})));
        assert_eq!(
            s,
            Schedule {
                initial_delay: Duration::ZERO,
                period: Duration::from_secs(10),
                success_threshold: 1,
                failure_threshold: 3
            }
        );
        assert_eq!(
            Schedule::of(ProbeKind::Readiness, &probe(json!({"successThreshold": 3}))).success_threshold,
            3
        );
    }

    /// The whole path with real time: a TCP liveness probe against a closed port.
    #[tokio::test]
    async fn a_spawned_worker_probes_for_real() {
        let port = closed_port().await;
        let p = probe(json!({"tcpSocket": {"port": port}, "periodSeconds": 1, "failureThreshold": 2}));
        let (tx, mut rx) = mpsc::channel(8);
        let worker = spawn(
            ProbeKind::Liveness,
            p,
            target(json!({"name": "app", "image": "i"})),
            tx,
            CancellationToken::new(),
        );
        tokio::time::timeout(Duration::from_secs(5), worker)
            .await
            .expect("stops within 5 s")
            .expect("no panic");
        let mut reports = Vec::new();
        while let Some(report) = rx.recv().await {
            reports.push(report);
        }
        let refused =
            format!("Liveness probe failed: dial tcp 127.0.0.1:{port}: connect: connection refused");
        let failed =
            ProbeReport::Failed { container: "app".into(), kind: ProbeKind::Liveness, message: refused };
        let dead =
            ProbeReport::Changed { container: "app".into(), kind: ProbeKind::Liveness, healthy: false };
        assert_eq!(reports, [failed.clone(), failed, dead]);
    }
}
