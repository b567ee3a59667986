//! gRPC health follows the server's readiness: NOT_SERVING while a check says it cannot work,
//! SERVING again once it can, NOT_SERVING at shutdown.

use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

async fn status(socket: &std::path::Path, service: &str) -> i32 {
    let channel = hpk_rpc::connect::unix(socket).await.expect("connect");
    HealthClient::new(channel)
        .check(HealthCheckRequest { service: service.into() })
        .await
        .expect("health check")
        .into_inner()
        .status
}

/// Polls until the health of `service` is `want` (the change is applied by a task).
async fn becomes(socket: &std::path::Path, service: &str, want: ServingStatus) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let got = status(socket, service).await;
        if got == want as i32 {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "{service:?}: {got}, not {want:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Through a real socket, the server as a whole (`""`); the services by name follow the same
/// state (`serve.rs` unit test).
#[tokio::test]
async fn health_follows_readiness() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o700)).expect("chmod");
    let socket = dir.path().join("s.sock");
    let readiness = hpk_rpc::Readiness::new();
    let services = hpk_rpc::Services::new().with_readiness(readiness.clone());
    let shutdown = CancellationToken::new();
    let server = tokio::spawn(hpk_rpc::serve(
        hpk_rpc::Listener::unix(&socket).expect("listen"),
        services,
        shutdown.clone(),
    ));
    becomes(&socket, "", ServingStatus::Serving).await;
    readiness.set_not_ready("the tunnel device is gone");
    becomes(&socket, "", ServingStatus::NotServing).await;
    readiness.set_ready();
    becomes(&socket, "", ServingStatus::Serving).await;
    shutdown.cancel();
    server.await.expect("join").expect("serve");
}
