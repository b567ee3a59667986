//! grpc probes: `grpc.health.v1.Health/Check` over plaintext HTTP/2, as the kubelet does.

use std::time::Duration;

use tonic::transport::Endpoint;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::failure::ProbeFailure;
use crate::join_host_port;

/// An error and its causes, `: `-joined (tonic's own text is only "transport error").
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Asks `host:port` for the health of `service` (the server's overall health when empty):
/// SERVING passes.
pub(crate) async fn probe(
    host: &str,
    port: u16,
    service: &str,
    timeout: Duration,
) -> Result<(), ProbeFailure> {
    let addr = join_host_port(host, port);
    let endpoint = Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| ProbeFailure::GrpcAddress { addr: addr.clone(), reason: e.to_string() })?
        .connect_timeout(timeout)
        .timeout(timeout);
    let connect_failed = |cause: String| ProbeFailure::GrpcConnect { addr: addr.clone(), timeout, cause };
    let channel = match tokio::time::timeout(timeout, endpoint.connect()).await {
        Ok(Ok(channel)) => channel,
        Ok(Err(e)) => return Err(connect_failed(chain(&e))),
        Err(_) => return Err(connect_failed("context deadline exceeded".into())),
    };
    let request = HealthCheckRequest { service: service.to_owned() };
    let rpc_timeout = || ProbeFailure::GrpcTimeout(timeout);
    let response = match tokio::time::timeout(timeout, HealthClient::new(channel).check(request)).await {
        Err(_) => return Err(rpc_timeout()),
        Ok(Err(status)) => {
            return Err(match status.code() {
                tonic::Code::Unimplemented => ProbeFailure::GrpcUnimplemented(status.message().to_owned()),
                tonic::Code::DeadlineExceeded | tonic::Code::Cancelled => rpc_timeout(),
                // In grpc-go's words, as upstream's event says it.
                code => ProbeFailure::GrpcFailed(format!(
                    "rpc error: code = {code:?} desc = {}",
                    status.message()
                )),
            });
        }
        Ok(Ok(response)) => response.into_inner(),
    };
    match ServingStatus::try_from(response.status) {
        Ok(ServingStatus::Serving) => Ok(()),
        other => {
            let name = other.map_or("UNKNOWN", |s| s.as_str_name());
            Err(ProbeFailure::GrpcUnhealthy(name))
        }
    }
}
