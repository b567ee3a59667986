//! A probe over `hpk.podruntime.v1.Remote/Probe` (connector mode): the kubelet's side makes the
//! request and reads the answer; the runtime's side checks the request and answers. Both ends
//! use this one mapping.

use std::time::Duration;

use hpk_proto::podruntime::v1 as pb;
use pb::probe_request::Action as PbAction;
use pb::probe_response::Outcome as PbOutcome;

use crate::{Action, HttpGet, ProbeFailure};

/// The longest attempt the runtime runs.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(600);
/// The longest path.
pub const MAX_PATH: usize = 8 * 1024;
/// The most headers.
pub const MAX_HEADERS: usize = 64;
/// The longest header (name and value).
pub const MAX_HEADER: usize = 8 * 1024;
/// The longest gRPC service name.
pub const MAX_SERVICE: usize = 1024;

/// The request for one attempt of `action` on sandbox `sandbox_id` within `timeout` (cut to
/// 1 ms–[`MAX_TIMEOUT`]).
pub fn request(sandbox_id: &str, action: &Action, timeout: Duration) -> pb::ProbeRequest {
    let timeout_ms =
        u32::try_from(timeout.clamp(Duration::from_millis(1), MAX_TIMEOUT).as_millis()).unwrap_or(u32::MAX);
    let (host, port, action) = match action {
        Action::HttpGet(get) => (
            get.host.clone(),
            get.port,
            PbAction::HttpGet(pb::HttpGetProbe {
                scheme: get.scheme.clone(),
                path: get.path.clone(),
                headers: get
                    .headers
                    .iter()
                    .map(|(name, value)| pb::HttpHeader { name: name.clone(), value: value.clone() })
                    .collect(),
            }),
        ),
        Action::TcpSocket { host, port } => (host.clone(), *port, PbAction::TcpSocket(pb::TcpSocketProbe {})),
        Action::Grpc { host, port, service } => {
            (host.clone(), *port, PbAction::Grpc(pb::GrpcProbe { service: service.clone() }))
        }
    };
    pb::ProbeRequest {
        pod_sandbox_id: sandbox_id.to_owned(),
        host,
        port: u32::from(port),
        timeout_ms,
        action: Some(action),
    }
}

/// The attempt a request asks for and its time limit, or what is wrong with it (each field
/// within its bound; the host is checked by the runtime, which knows the sandbox's IPs).
pub fn parse(request: &pb::ProbeRequest) -> Result<(Action, Duration), String> {
    let port = u16::try_from(request.port)
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| format!("port {} is outside 1-65535", request.port))?;
    let timeout = Duration::from_millis(u64::from(request.timeout_ms));
    if timeout.is_zero() || timeout > MAX_TIMEOUT {
        return Err(format!(
            "timeout of {} ms is outside 1 ms to {} s",
            request.timeout_ms,
            MAX_TIMEOUT.as_secs()
        ));
    }
    if request.host.is_empty() {
        return Err("no host".into());
    }
    let host = request.host.clone();
    let action = match &request.action {
        None => return Err("no probe handler (httpGet, tcpSocket or grpc)".into()),
        Some(PbAction::HttpGet(get)) => {
            if get.path.len() > MAX_PATH {
                return Err(format!("path of {} bytes is over {MAX_PATH}", get.path.len()));
            }
            if get.headers.len() > MAX_HEADERS {
                return Err(format!("{} headers are over {MAX_HEADERS}", get.headers.len()));
            }
            if let Some(h) = get.headers.iter().find(|h| h.name.len() + h.value.len() > MAX_HEADER) {
                return Err(format!("header {:.64?} is over {MAX_HEADER} bytes", h.name));
            }
            Action::HttpGet(HttpGet {
                scheme: get.scheme.clone(),
                host,
                port,
                path: get.path.clone(),
                headers: get.headers.iter().map(|h| (h.name.clone(), h.value.clone())).collect(),
            })
        }
        Some(PbAction::TcpSocket(_)) => Action::TcpSocket { host, port },
        Some(PbAction::Grpc(g)) => {
            if g.service.len() > MAX_SERVICE {
                return Err(format!("service name of {} bytes is over {MAX_SERVICE}", g.service.len()));
            }
            Action::Grpc { host, port, service: g.service.clone() }
        }
    };
    Ok((action, timeout))
}

/// The host a request names.
pub fn host(action: &Action) -> &str {
    match action {
        Action::HttpGet(get) => &get.host,
        Action::TcpSocket { host, .. } | Action::Grpc { host, .. } => host,
    }
}

/// The answer for an attempt's result.
pub fn response(result: &Result<Option<String>, ProbeFailure>) -> pb::ProbeResponse {
    let (outcome, message) = match result {
        Ok(None) => (PbOutcome::Passed, String::new()),
        Ok(Some(warning)) => (PbOutcome::Warned, warning.clone()),
        Err(failure) => (PbOutcome::Failed, failure.to_string()),
    };
    pb::ProbeResponse { outcome: outcome.into(), message }
}

/// The attempt's result from an answer: a failure in the runtime's words.
pub fn outcome(response: &pb::ProbeResponse) -> Result<Option<String>, ProbeFailure> {
    match PbOutcome::try_from(response.outcome) {
        Ok(PbOutcome::Passed) => Ok(None),
        Ok(PbOutcome::Warned) => Ok(Some(response.message.clone())),
        Ok(PbOutcome::Failed) => Err(ProbeFailure::Remote(response.message.clone())),
        Ok(PbOutcome::Unspecified) | Err(_) => Err(ProbeFailure::RemoteUnavailable(format!(
            "an answer without an outcome ({})",
            response.outcome
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get() -> Action {
        Action::HttpGet(HttpGet {
            scheme: "HTTP".into(),
            host: "10.244.0.5".into(),
            port: 8080,
            path: "/healthz?x=1".into(),
            headers: vec![("Host".into(), "app.local".into()), ("X-A".into(), "b".into())],
        })
    }

    #[test]
    fn every_handler_survives_the_round_trip() {
        let grpc = Action::Grpc { host: "fd00::5".into(), port: 9000, service: "app".into() };
        let tcp = Action::TcpSocket { host: "10.244.0.5".into(), port: 22 };
        for action in [get(), grpc, tcp] {
            let request = request("sb1", &action, Duration::from_secs(3));
            assert_eq!(request.pod_sandbox_id, "sb1");
            assert_eq!(parse(&request), Ok((action, Duration::from_secs(3))));
        }
    }

    #[test]
    fn the_timeout_is_cut_to_its_bounds() {
        assert_eq!(request("s", &get(), Duration::ZERO).timeout_ms, 1);
        assert_eq!(request("s", &get(), Duration::from_secs(86_400)).timeout_ms, 600_000);
    }

    #[test]
    fn bad_requests_say_what_is_wrong() {
        let good = request("s", &get(), Duration::from_secs(1));
        let refused = |change: &dyn Fn(&mut pb::ProbeRequest)| {
            let mut r = good.clone();
            change(&mut r);
            parse(&r).expect_err("refused")
        };
        assert_eq!(refused(&|r| r.port = 0), "port 0 is outside 1-65535");
        assert_eq!(refused(&|r| r.port = 70_000), "port 70000 is outside 1-65535");
        assert_eq!(refused(&|r| r.timeout_ms = 0), "timeout of 0 ms is outside 1 ms to 600 s");
        assert_eq!(refused(&|r| r.timeout_ms = 600_001), "timeout of 600001 ms is outside 1 ms to 600 s");
        assert_eq!(refused(&|r| r.host.clear()), "no host");
        assert_eq!(refused(&|r| r.action = None), "no probe handler (httpGet, tcpSocket or grpc)");
        fn get_of(r: &mut pb::ProbeRequest) -> &mut pb::HttpGetProbe {
            match r.action.as_mut() {
                Some(PbAction::HttpGet(g)) => g,
                _ => unreachable!("an httpGet request"),
            }
        }
        assert_eq!(
            refused(&|r| get_of(r).path = "/".repeat(MAX_PATH + 1)),
            "path of 8193 bytes is over 8192"
        );
        assert_eq!(
            refused(&|r| get_of(r).headers = vec![pb::HttpHeader::default(); MAX_HEADERS + 1]),
            "65 headers are over 64"
        );
        assert_eq!(
            refused(&|r| get_of(r).headers[1].value = "v".repeat(MAX_HEADER)),
            "header \"X-A\" is over 8192 bytes"
        );
        assert!(
            refused(
                &|r| r.action = Some(PbAction::Grpc(pb::GrpcProbe { service: "s".repeat(MAX_SERVICE + 1) }))
            )
            .starts_with("service name of 1025 bytes")
        );
    }

    #[test]
    fn outcomes_survive_the_round_trip() {
        let failed: Result<Option<String>, ProbeFailure> = Err(ProbeFailure::HttpStatus(500));
        assert_eq!(outcome(&response(&Ok(None))), Ok(None));
        assert_eq!(outcome(&response(&Ok(Some("w".into())))), Ok(Some("w".into())));
        assert_eq!(
            outcome(&response(&failed)).map_err(|f| f.to_string()),
            Err("HTTP probe failed with statuscode: 500".into())
        );
        let unknown = pb::ProbeResponse { outcome: 9, message: String::new() };
        assert_eq!(
            outcome(&unknown).map_err(|f| f.to_string()),
            Err("the remote runtime did not run the probe: an answer without an outcome (9)".into())
        );
    }
}
