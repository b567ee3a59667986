//! What Ready depends on, asked over gRPC: the runtime's CRI `Status` and `Version`, and the
//! net-forwarder's `grpc.health.v1` check.

use std::path::Path;
use std::time::Duration;

use k8s_cri::v1 as cri;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

use super::conditions::Probe;
use crate::cri::Cri;

/// How long one probe may take: a local socket answers in milliseconds or is wedged.
const TIMEOUT: Duration = Duration::from_secs(3);

/// The runtime's readiness from its CRI `Status`.
pub async fn runtime(cri: &Cri) -> Probe {
    let mut client = cri.runtime.clone();
    match tokio::time::timeout(TIMEOUT, client.status(cri::StatusRequest { verbose: false })).await {
        Err(_) => Probe::NotReady(format!("Status did not answer within {} s", TIMEOUT.as_secs())),
        Ok(Err(status)) => Probe::NotReady(format!("Status failed: {}", status.message())),
        Ok(Ok(reply)) => match reply.into_inner().status {
            Some(status) => runtime_conditions(&status),
            None => Probe::NotReady("Status reported no conditions".into()),
        },
    }
}

/// Ready when RuntimeReady and NetworkReady are both reported true.
pub fn runtime_conditions(status: &cri::RuntimeStatus) -> Probe {
    let mut problems = Vec::new();
    for kind in ["RuntimeReady", "NetworkReady"] {
        match status.conditions.iter().find(|c| c.r#type == kind) {
            Some(c) if c.status => {}
            Some(c) => problems.push(format!("{kind}=false reason:{} message:{}", c.reason, c.message)),
            None => problems.push(format!("{kind} not reported")),
        }
    }
    if problems.is_empty() { Probe::Ready } else { Probe::NotReady(problems.join(", ")) }
}

/// The runtime's `runtime_version`, `None` when it does not answer.
pub async fn runtime_version(cri: &Cri) -> Option<String> {
    let mut client = cri.runtime.clone();
    let request = cri::VersionRequest { version: String::new() };
    match tokio::time::timeout(TIMEOUT, client.version(request)).await {
        Ok(Ok(reply)) => Some(reply.into_inner().runtime_version),
        _ => None,
    }
}

/// The net-forwarder's health (the whole server, service `""`) on its UNIX socket; a fresh
/// connection each time, so a restarted forwarder is found again.
pub async fn forwarder(socket: &Path) -> Probe {
    let check = async {
        let channel = hpk_rpc::connect::unix(socket)
            .await
            .map_err(|e| format!("cannot connect: {}", super::error_chain(&e)))?;
        let reply = HealthClient::new(channel)
            .check(HealthCheckRequest { service: String::new() })
            .await
            .map_err(|s| format!("health check failed: {}", s.message()))?;
        Ok::<_, String>(reply.into_inner().status)
    };
    match tokio::time::timeout(TIMEOUT, check).await {
        Err(_) => Probe::NotReady(format!("health check did not answer within {} s", TIMEOUT.as_secs())),
        Ok(Err(why)) => Probe::NotReady(why),
        Ok(Ok(status)) if status == ServingStatus::Serving as i32 => Probe::Ready,
        Ok(Ok(status)) => Probe::NotReady(format!(
            "health is {}",
            ServingStatus::try_from(status).map_or("an unknown status", |s| s.as_str_name())
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn condition(kind: &str, status: bool) -> cri::RuntimeCondition {
        cri::RuntimeCondition { r#type: kind.into(), status, reason: "R".into(), message: "M".into() }
    }

    #[test]
    fn both_runtime_conditions_must_hold() {
        let status = |conditions| cri::RuntimeStatus { conditions };
        let ready = status(vec![condition("RuntimeReady", true), condition("NetworkReady", true)]);
        assert_eq!(runtime_conditions(&ready), Probe::Ready);
        let no_net = status(vec![condition("RuntimeReady", true), condition("NetworkReady", false)]);
        assert_eq!(
            runtime_conditions(&no_net),
            Probe::NotReady("NetworkReady=false reason:R message:M".into())
        );
        let missing = status(vec![condition("NetworkReady", true)]);
        assert_eq!(runtime_conditions(&missing), Probe::NotReady("RuntimeReady not reported".into()));
    }

    #[tokio::test]
    async fn a_forwarder_that_is_not_there_is_not_ready() {
        let dir = tempfile::tempdir().unwrap();
        match forwarder(&dir.path().join("none.sock")).await {
            Probe::NotReady(why) => {
                assert!(why.contains("cannot connect") && why.contains("No such file"), "{why}")
            }
            Probe::Ready => panic!("nothing listens"),
        }
    }

    #[tokio::test]
    async fn a_serving_forwarder_is_ready_and_a_stopping_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("run/forwarder.sock");
        let shutdown = tokio_util::sync::CancellationToken::new();
        let listener = hpk_rpc::Listener::unix(&socket).unwrap();
        let server = tokio::spawn(hpk_rpc::serve(listener, hpk_rpc::Services::new(), shutdown.clone()));
        assert_eq!(forwarder(&socket).await, Probe::Ready);
        shutdown.cancel();
        server.await.unwrap().unwrap();
        assert!(matches!(forwarder(&socket).await, Probe::NotReady(_)));
    }
}
