//! One probe attempt, bounded by the probe's timeoutSeconds.

use std::time::Duration;

use k8s_cri::v1::ExecSyncResponse;
use k8s_openapi::api::core::v1::{Container, ExecAction, HTTPGetAction, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use hpk_probe::{Action, HttpGet, ProbeFailure};

use super::{Outcome, ProbeKind, Target};
use crate::cri::{CriCall, CriError, CriFailure};

/// The most probe output kept in a message, as the kubelet keeps.
const MAX_OUTPUT: usize = 10 * 1024;

/// The probe's timeoutSeconds (default 1, at least 1).
pub(super) fn timeout(probe: &Probe) -> Duration {
    Duration::from_secs(u64::try_from(probe.timeout_seconds.unwrap_or(1)).unwrap_or(1).max(1))
}

/// One attempt of `probe` against `target`: exec (CRI ExecSync, exit 0 passes), httpGet
/// (200–399 passes; HTTPS without certificate checks), tcpSocket (a connection passes) or
/// grpc (`grpc.health.v1.Health/Check` answering SERVING passes). A probe without exactly
/// one handler, or naming a port the container lacks, fails with the reason. In connector
/// mode the remote runtime runs the network probes.
pub async fn check(kind: ProbeKind, probe: &Probe, target: &Target) -> Outcome {
    match attempt(probe, target).await {
        Ok(None) => Outcome::Success,
        Ok(Some(warning)) => Outcome::Warning(format!("{kind} probe warning: {warning}")),
        Err(detail @ ProbeFailure::RemoteUnavailable(_)) => {
            Outcome::Unknown(format!("{kind} probe: {detail}"))
        }
        Err(detail) => Outcome::Failure(format!("{kind} probe failed: {detail}")),
    }
}

/// `Ok(Some(warning))`: passed, with something to say (an HTTP redirect off the probed host,
/// not followed).
async fn attempt(probe: &Probe, target: &Target) -> Result<Option<String>, ProbeFailure> {
    let timeout = timeout(probe);
    let action = match (&probe.exec, &probe.http_get, &probe.tcp_socket, &probe.grpc) {
        (Some(exec), None, None, None) => return exec_probe(exec, target, timeout).await.map(|()| None),
        (None, Some(get), None, None) => Action::HttpGet(http_get(get, target)?),
        (None, None, Some(tcp), None) => Action::TcpSocket {
            host: host_or_pod_ip(tcp.host.as_deref(), target)?,
            port: resolve_port(&tcp.port, &target.container)?,
        },
        (None, None, None, Some(g)) => Action::Grpc {
            host: host_or_pod_ip(None, target)?,
            port: u16::try_from(g.port).ok().filter(|p| *p > 0).ok_or(ProbeFailure::InvalidPort(g.port))?,
            service: g.service.clone().unwrap_or_default(),
        },
        (None, None, None, None) => return Err(ProbeFailure::NoHandler),
        _ => return Err(ProbeFailure::ManyHandlers),
    };
    match &target.remote {
        None => hpk_probe::run(&action, timeout).await,
        Some(remote) => remote_probe(remote.clone(), &target.sandbox_id, &action, timeout).await,
    }
}

/// The attempt, run by the remote runtime (connector mode). A link that does not answer, or a
/// runtime too busy to run it, makes the attempt one not made (`RemoteUnavailable`: thrown
/// away); a request the runtime refuses (a host not the pod's own, a sandbox gone) fails with
/// the runtime's reason, which the Unhealthy event shows.
async fn remote_probe(
    mut remote: hpk_proto::podruntime::v1::remote_client::RemoteClient<tonic::transport::Channel>,
    sandbox_id: &str,
    action: &Action,
    timeout: Duration,
) -> Result<Option<String>, ProbeFailure> {
    let request = hpk_probe::wire::request(sandbox_id, action, timeout);
    // The runtime ends the attempt at the timeout; the margin covers the round trip.
    match tokio::time::timeout(timeout + Duration::from_secs(2), remote.probe(request)).await {
        Ok(Ok(response)) => hpk_probe::wire::outcome(response.get_ref()),
        Ok(Err(status)) => Err(remote_refusal(&status)),
        Err(_) => Err(ProbeFailure::RemoteUnavailable(format!("no answer within {timeout:?}"))),
    }
}

/// What a `Remote/Probe` error means for the attempt.
fn remote_refusal(status: &tonic::Status) -> ProbeFailure {
    use tonic::Code;
    match status.code() {
        Code::InvalidArgument | Code::NotFound | Code::PermissionDenied | Code::FailedPrecondition => {
            ProbeFailure::Remote(format!("the remote runtime refused the probe: {}", status.message()))
        }
        code => ProbeFailure::RemoteUnavailable(format!("{code}: {}", status.message())),
    }
}

/// The probe's own host, else the pod's IP.
fn host_or_pod_ip(host: Option<&str>, target: &Target) -> Result<String, ProbeFailure> {
    match host.filter(|h| !h.is_empty()) {
        Some(host) => Ok(host.to_owned()),
        None => target.pod_ip.map(|ip| ip.to_string()).ok_or(ProbeFailure::NoPodIp),
    }
}

async fn exec_probe(exec: &ExecAction, target: &Target, timeout: Duration) -> Result<(), ProbeFailure> {
    let command = exec.command.clone().unwrap_or_default();
    if command.is_empty() {
        return Err(ProbeFailure::NoCommand);
    }
    // The runtime ends the command at the timeout; the margin covers the round trip.
    let result = tokio::time::timeout(
        timeout + Duration::from_secs(2),
        target.cri.exec_sync(&target.container_id, command.clone(), timeout),
    )
    .await
    .unwrap_or_else(|_| {
        Err(CriError::new(CriCall::ExecSync, CriFailure::TimedOut, "no answer from the runtime"))
    });
    exec_result(&command, result)
}

fn http_get(get: &HTTPGetAction, target: &Target) -> Result<HttpGet, ProbeFailure> {
    Ok(HttpGet {
        scheme: get.scheme.clone().unwrap_or_else(|| "HTTP".into()),
        port: resolve_port(&get.port, &target.container)?,
        host: host_or_pod_ip(get.host.as_deref(), target)?,
        path: get.path.clone().unwrap_or_default(),
        headers: get.http_headers.iter().flatten().map(|h| (h.name.clone(), h.value.clone())).collect(),
    })
}

/// A port number, or the number of the container port with that name (or a number written
/// as a string), in 1–65535.
pub(super) fn resolve_port(port: &IntOrString, container: &Container) -> Result<u16, ProbeFailure> {
    let number = match port {
        IntOrString::Int(n) => *n,
        IntOrString::String(name) => {
            let named = container.ports.iter().flatten().find(|p| p.name.as_deref() == Some(name.as_str()));
            match (named, name.parse::<i32>()) {
                (Some(p), _) => p.container_port,
                (None, Ok(n)) => n,
                (None, Err(_)) => {
                    return Err(ProbeFailure::PortNotFound {
                        name: name.clone(),
                        container: container.name.clone(),
                    });
                }
            }
        }
    };
    u16::try_from(number).ok().filter(|p| *p > 0).ok_or(ProbeFailure::InvalidPort(number))
}

/// The verdict on an exec probe's ExecSync answer: exit 0 passes; otherwise the command, its
/// exit code and its output (stdout then stderr, at most 10 KiB).
pub(super) fn exec_result(
    command: &[String],
    result: Result<ExecSyncResponse, CriError>,
) -> Result<(), ProbeFailure> {
    let shown = command.join(" ");
    match result {
        Ok(response) if response.exit_code == 0 => Ok(()),
        Ok(response) => {
            let mut output = response.stdout;
            output.extend_from_slice(&response.stderr);
            output.truncate(MAX_OUTPUT);
            let output = String::from_utf8_lossy(&output);
            let output = output.trim_end();
            let code = response.exit_code;
            Err(ProbeFailure::Exited { command: shown, code, output: output.to_owned() })
        }
        Err(error) if error.failure == CriFailure::TimedOut => {
            Err(ProbeFailure::ExecTimedOut { command: shown })
        }
        Err(error) => Err(ProbeFailure::ExecFailed { command: shown, message: error.message }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probes::testing::{closed_port, grpc_server, http_server, probe, target};
    use serde_json::json;

    fn container() -> serde_json::Value {
        json!({"name": "app", "image": "i", "ports": [{"name": "http", "containerPort": 8080}]})
    }

    async fn http(path: &str, port: u16, tls: bool) -> Outcome {
        let scheme = if tls { "HTTPS" } else { "HTTP" };
        let p = probe(json!({"httpGet": {"path": path, "port": port, "scheme": scheme}}));
        check(ProbeKind::Liveness, &p, &target(container())).await
    }

    fn failure(outcome: Outcome) -> String {
        match outcome {
            Outcome::Failure(message) => message,
            other => panic!("expected a failure, got {other:?}"),
        }
    }

    #[test]
    fn a_remote_refusal_fails_and_a_link_down_is_not_counted() {
        let refused = remote_refusal(&tonic::Status::invalid_argument(
            "host \"10.0.0.9\" is not an address of sandbox s",
        ));
        assert_eq!(
            refused.to_string(),
            "the remote runtime refused the probe: host \"10.0.0.9\" is not an address of sandbox s"
        );
        assert!(matches!(remote_refusal(&tonic::Status::not_found("sandbox s")), ProbeFailure::Remote(_)));
        for status in [
            tonic::Status::unavailable("connection refused"),
            tonic::Status::resource_exhausted("512 probes are running"),
            tonic::Status::deadline_exceeded("late"),
        ] {
            assert!(matches!(remote_refusal(&status), ProbeFailure::RemoteUnavailable(_)), "{status:?}");
        }
    }

    #[tokio::test]
    async fn http_status_decides() {
        let (addr, seen) = http_server(false).await;
        assert_eq!(http("/ok", addr.port(), false).await, Outcome::Success);
        assert_eq!(
            failure(http("/fail", addr.port(), false).await),
            "Liveness probe failed: HTTP probe failed with statuscode: 500"
        );
        assert_eq!(
            http("/away", addr.port(), false).await,
            Outcome::Warning("Liveness probe warning: Probe terminated redirects, Response body: hi".into()),
            "a 301 off the host passes, with upstream's warning and the redirect's body"
        );
        assert_eq!(http("ok", addr.port(), false).await, Outcome::Success, "a path without its slash");
        let head = seen.lock().expect("lock")[0].clone();
        assert!(head.starts_with("GET /ok HTTP/1.1\r\n"), "{head}");
        assert!(head.to_ascii_lowercase().contains("user-agent: kube-probe/"), "{head}");
        assert!(head.to_ascii_lowercase().contains(&format!("host: 127.0.0.1:{}", addr.port())), "{head}");
    }

    #[tokio::test]
    async fn http_follows_redirects_on_the_same_host() {
        let (addr, seen) = http_server(false).await;
        assert_eq!(
            failure(http("/here", addr.port(), false).await),
            "Liveness probe failed: HTTP probe failed with statuscode: 500",
            "the redirect's target answers"
        );
        assert_eq!(http("/hop", addr.port(), false).await, Outcome::Success, "a relative location");
        let message = failure(http("/loop", addr.port(), false).await);
        assert!(message.ends_with("stopped after 10 redirects"), "{message}");
        assert_eq!(seen.lock().expect("lock").len(), 2 + 2 + 11);
    }

    #[tokio::test]
    async fn http_headers_and_host_are_sent() {
        let (addr, seen) = http_server(false).await;
        let p = probe(json!({"httpGet": {"path": "/ok?x=1", "port": "http", "httpHeaders": [
            {"name": "Host", "value": "app.example"}, {"name": "X-Probe", "value": "yes"}]}}));
        let mut t = target(
            json!({"name": "app", "image": "i", "ports": [{"name": "http", "containerPort": addr.port()}]}),
        );
        assert_eq!(check(ProbeKind::Readiness, &p, &t).await, Outcome::Success);
        let head = seen.lock().expect("lock")[0].to_ascii_lowercase();
        assert!(head.starts_with("get /ok?x=1 http/1.1"), "{head}");
        assert!(head.contains("host: app.example\r\n") && head.contains("x-probe: yes\r\n"), "{head}");
        t.pod_ip = None;
        assert_eq!(
            failure(check(ProbeKind::Readiness, &p, &t).await),
            "Readiness probe failed: the pod has no IP address yet"
        );
    }

    #[tokio::test]
    async fn http_times_out() {
        let (addr, _) = http_server(false).await;
        let started = std::time::Instant::now();
        let message = failure(http("/slow", addr.port(), false).await);
        assert!(message.contains("Client.Timeout exceeded"), "{message}");
        assert!(started.elapsed() < Duration::from_secs(3), "bounded by timeoutSeconds (1)");
    }

    #[tokio::test]
    async fn http_refused_says_so() {
        let port = closed_port().await;
        let message = failure(http("/ok", port, false).await);
        assert!(
            message.ends_with(&format!("dial tcp 127.0.0.1:{port}: connect: connection refused")),
            "{message}"
        );
    }

    #[tokio::test]
    async fn https_skips_certificate_verification() {
        let (addr, _) = http_server(true).await;
        assert_eq!(http("/ok", addr.port(), true).await, Outcome::Success);
        assert_eq!(
            failure(http("/fail", addr.port(), true).await),
            "Liveness probe failed: HTTP probe failed with statuscode: 500"
        );
    }

    #[tokio::test]
    async fn tcp_connects_or_fails() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let open = listener.local_addr().expect("addr").port();
        let p = probe(json!({"tcpSocket": {"port": open}}));
        assert_eq!(check(ProbeKind::Startup, &p, &target(container())).await, Outcome::Success);
        let closed = closed_port().await;
        let p = probe(json!({"tcpSocket": {"port": closed}}));
        assert_eq!(
            failure(check(ProbeKind::Startup, &p, &target(container())).await),
            format!("Startup probe failed: dial tcp 127.0.0.1:{closed}: connect: connection refused")
        );
    }

    #[tokio::test]
    async fn grpc_health_decides() {
        let addr = grpc_server().await;
        let grpc = |service: &str| probe(json!({"grpc": {"port": addr.port(), "service": service}}));
        let t = target(container());
        assert_eq!(check(ProbeKind::Liveness, &grpc("up"), &t).await, Outcome::Success);
        assert_eq!(
            check(ProbeKind::Liveness, &probe(json!({"grpc": {"port": addr.port()}})), &t).await,
            Outcome::Success
        );
        assert_eq!(
            failure(check(ProbeKind::Liveness, &grpc("down"), &t).await),
            r#"Liveness probe failed: service unhealthy (responded with "NOT_SERVING")"#
        );
        let message = failure(check(ProbeKind::Liveness, &grpc("unknown"), &t).await);
        assert!(
            message.starts_with(
                "Liveness probe failed: error: health rpc probe failed: rpc error: code = NotFound desc = "
            ),
            "{message}"
        );
        let closed = closed_port().await;
        let message =
            failure(check(ProbeKind::Liveness, &probe(json!({"grpc": {"port": closed}})), &t).await);
        assert!(message.contains(&format!("failed to connect service \"127.0.0.1:{closed}\"")), "{message}");
    }

    #[tokio::test]
    async fn bad_probes_fail_with_a_reason() {
        let t = target(container());
        let cases = [
            (json!({}), "the probe has no handler"),
            (
                json!({"tcpSocket": {"port": 1}, "httpGet": {"port": 1}}),
                "the probe has more than one handler",
            ),
            (json!({"tcpSocket": {"port": "metrics"}}), r#"port "metrics" not found in container "app""#),
            (json!({"httpGet": {"port": 0}}), "invalid port number: 0"),
            (json!({"httpGet": {"port": 70000}}), "invalid port number: 70000"),
            (json!({"httpGet": {"port": 1, "scheme": "FTP"}}), r#"unsupported scheme "FTP""#),
            (json!({"exec": {}}), "the exec probe has no command"),
        ];
        for (p, want) in cases {
            let message = failure(check(ProbeKind::Liveness, &probe(p.clone()), &t).await);
            assert!(
                message.starts_with("Liveness probe failed: ") && message.contains(want),
                "{p}: {message}"
            );
        }
    }

    #[test]
    fn named_and_numeric_ports_resolve() {
        let c: Container = serde_json::from_value(container()).expect("container");
        assert_eq!(resolve_port(&IntOrString::String("http".into()), &c), Ok(8080));
        assert_eq!(resolve_port(&IntOrString::String("9090".into()), &c), Ok(9090), "a number as a string");
        assert_eq!(resolve_port(&IntOrString::Int(81), &c), Ok(81));
        assert!(resolve_port(&IntOrString::String("grpc".into()), &c).is_err());
    }

    /// Exec probes need a running container in a real runtime; the integration tests run
    /// them. Here: the verdict and message for each kind of ExecSync answer.
    #[test]
    fn exec_answers_become_verdicts() {
        let cmd = vec!["sh".to_owned(), "-c".to_owned(), "test -f /ready".to_owned()];
        let answer = |code: i32, out: &str, err: &str| {
            Ok(ExecSyncResponse {
                stdout: out.as_bytes().to_vec(),
                stderr: err.as_bytes().to_vec(),
                exit_code: code,
            })
        };
        assert_eq!(exec_result(&cmd, answer(0, "fine", "")), Ok(()));
        assert_eq!(
            exec_result(&cmd, answer(1, "", "not ready\n")).map_err(|e| e.to_string()),
            Err(r#"command "sh -c test -f /ready" exited with 1: not ready"#.to_owned())
        );
        assert_eq!(
            exec_result(&cmd, answer(2, "", "")).map_err(|e| e.to_string()),
            Err(r#"command "sh -c test -f /ready" exited with 2"#.to_owned())
        );
        let long = "x".repeat(20_000);
        let message = exec_result(&cmd, answer(1, &long, "")).expect_err("fails").to_string();
        assert!(message.len() < MAX_OUTPUT + 100, "output is capped");
        assert_eq!(
            exec_result(&cmd, Err(CriError::new(CriCall::ExecSync, CriFailure::TimedOut, "slow")))
                .map_err(|e| e.to_string()),
            Err(r#"command "sh -c test -f /ready" timed out"#.to_owned())
        );
        assert_eq!(
            exec_result(
                &cmd,
                Err(CriError::new(CriCall::ExecSync, CriFailure::NotFound, "no such container"))
            )
            .map_err(|e| e.to_string()),
            Err(r#"command "sh -c test -f /ready" could not run: no such container"#.to_owned())
        );
    }
}
