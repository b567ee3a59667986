//! The pod-runtime over CRI v1: one channel on its UNIX socket, cloned by every pod worker.

use std::path::Path;
use std::time::Duration;

use k8s_cri::v1 as cri;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use tonic::transport::Channel;

/// CRI clients for the runtime and image services (the same socket).
#[derive(Clone)]
pub struct Cri {
    /// `RuntimeService`.
    pub runtime: RuntimeServiceClient<Channel>,
    /// `ImageService`.
    pub images: ImageServiceClient<Channel>,
}

impl Cri {
    /// Connects to the runtime on `socket`.
    pub async fn connect(socket: &Path) -> Result<Self, hpk_rpc::Error> {
        let channel = hpk_rpc::connect::unix(socket).await?;
        // A pod's spec may carry large env or configs; the runtime refuses what is too big.
        let runtime = RuntimeServiceClient::new(channel.clone()).max_decoding_message_size(16 << 20);
        let images = ImageServiceClient::new(channel).max_decoding_message_size(16 << 20);
        Ok(Self { runtime, images })
    }

    /// Runs `cmd` in container `id` and waits at most `timeout` (whole seconds, at least 1).
    pub async fn exec_sync(
        &self,
        id: &str,
        cmd: Vec<String>,
        timeout: Duration,
    ) -> Result<cri::ExecSyncResponse, tonic::Status> {
        let request = cri::ExecSyncRequest {
            container_id: id.to_owned(),
            cmd,
            timeout: i64::try_from(timeout.as_secs().max(1)).unwrap_or(i64::MAX),
        };
        let mut runtime = self.runtime.clone();
        Ok(runtime.exec_sync(request).await?.into_inner())
    }
}
