//! `hpk.kubelet.v1`: "what is this node doing", for grpcurl on the kubelet's UNIX socket.

use std::sync::Arc;

use hpk_proto::kubelet::v1 as diag;
use hpk_proto::kubelet::v1::kubelet_server::Kubelet;
use k8s_cri::v1 as cri;
use tonic::{Request, Response, Status};

use crate::pods::{Context, lock};

/// The kubelet's version as the Node reports it.
pub const KUBELET_VERSION: &str = concat!("v1.35.4-hpk.", env!("CARGO_PKG_VERSION"));

/// The diagnostics service.
pub struct Diagnostics {
    ctx: Arc<Context>,
}

impl Diagnostics {
    /// Answers from the pods' shared context.
    pub fn new(ctx: Arc<Context>) -> Self {
        Self { ctx }
    }
}

#[tonic::async_trait]
impl Kubelet for Diagnostics {
    async fn node(&self, _: Request<diag::NodeRequest>) -> Result<Response<diag::NodeSummary>, Status> {
        let node = self.ctx.node.borrow().clone();
        let (used, pods) = {
            let admitted = lock(&self.ctx.admitted);
            (admitted.used(), admitted.len())
        };
        Ok(Response::new(diag::NodeSummary {
            name: self.ctx.node_name.clone(),
            ready: node.ready,
            message: node.message.clone(),
            allocatable_millicpu: node.allocatable.millicpu,
            allocatable_memory_bytes: node.allocatable.memory,
            allocatable_pods: node.allocatable.pods,
            requested_millicpu: used.millicpu,
            requested_memory_bytes: used.memory,
            pods: u32::try_from(pods).unwrap_or(u32::MAX),
        }))
    }

    async fn list_pods(
        &self,
        request: Request<diag::ListPodsRequest>,
    ) -> Result<Response<diag::ListPodsResponse>, Status> {
        let namespace = request.into_inner().namespace;
        let pods = lock(&self.ctx.summaries)
            .values()
            .filter(|p| namespace.is_empty() || p.namespace == namespace)
            .cloned()
            .collect();
        Ok(Response::new(diag::ListPodsResponse { pods }))
    }

    async fn version(
        &self,
        _: Request<diag::VersionRequest>,
    ) -> Result<Response<diag::VersionResponse>, Status> {
        let mut runtime = self.ctx.cri.runtime.clone();
        let version = runtime
            .version(cri::VersionRequest { version: String::new() })
            .await
            .map_err(|e| Status::unavailable(format!("the runtime did not answer: {}", e.message())))?
            .into_inner();
        Ok(Response::new(diag::VersionResponse {
            kubelet_version: KUBELET_VERSION.to_owned(),
            runtime_name: version.runtime_name,
            runtime_version: version.runtime_version,
            runtime_api_version: version.runtime_api_version,
        }))
    }
}
