use std::sync::Arc;

use k8s_cri::v1 as cri;
use k8s_cri::v1::runtime_service_server::RuntimeService;
use tonic::{Request, Response, Status};

use super::{CRI_VERSION, RUNTIME_NAME, unimplemented};

/// `runtime.v1.RuntimeService`.
#[derive(Clone)]
pub struct Runtime(pub Arc<crate::runtime::Runtime>);

type Reply<T> = Result<Response<T>, Status>;

#[tonic::async_trait]
impl RuntimeService for Runtime {
    async fn version(&self, _: Request<cri::VersionRequest>) -> Reply<cri::VersionResponse> {
        Ok(Response::new(cri::VersionResponse {
            version: "0.1.0".into(),
            runtime_name: RUNTIME_NAME.into(),
            runtime_version: env!("CARGO_PKG_VERSION").into(),
            runtime_api_version: CRI_VERSION.into(),
        }))
    }

    async fn run_pod_sandbox(
        &self,
        r: Request<cri::RunPodSandboxRequest>,
    ) -> Reply<cri::RunPodSandboxResponse> {
        let config =
            r.into_inner().config.ok_or_else(|| Status::invalid_argument("RunPodSandbox needs a config"))?;
        let pod_sandbox_id = self.0.run_sandbox(config).await?;
        Ok(Response::new(cri::RunPodSandboxResponse { pod_sandbox_id }))
    }

    async fn stop_pod_sandbox(
        &self,
        r: Request<cri::StopPodSandboxRequest>,
    ) -> Reply<cri::StopPodSandboxResponse> {
        self.0.stop_sandbox(&r.into_inner().pod_sandbox_id).await?;
        Ok(Response::new(cri::StopPodSandboxResponse {}))
    }

    async fn remove_pod_sandbox(
        &self,
        r: Request<cri::RemovePodSandboxRequest>,
    ) -> Reply<cri::RemovePodSandboxResponse> {
        self.0.remove_sandbox(&r.into_inner().pod_sandbox_id).await?;
        Ok(Response::new(cri::RemovePodSandboxResponse {}))
    }

    async fn pod_sandbox_status(
        &self,
        r: Request<cri::PodSandboxStatusRequest>,
    ) -> Reply<cri::PodSandboxStatusResponse> {
        let status = self.0.sandbox_status(&r.into_inner().pod_sandbox_id).await?;
        Ok(Response::new(cri::PodSandboxStatusResponse { status: Some(status), ..Default::default() }))
    }

    async fn list_pod_sandbox(
        &self,
        r: Request<cri::ListPodSandboxRequest>,
    ) -> Reply<cri::ListPodSandboxResponse> {
        let items = self.0.list_sandboxes(r.into_inner().filter).await;
        Ok(Response::new(cri::ListPodSandboxResponse { items }))
    }

    async fn create_container(
        &self,
        r: Request<cri::CreateContainerRequest>,
    ) -> Reply<cri::CreateContainerResponse> {
        let r = r.into_inner();
        let config = r.config.ok_or_else(|| Status::invalid_argument("CreateContainer needs a config"))?;
        let container_id = self.0.create_container(&r.pod_sandbox_id, config).await?;
        Ok(Response::new(cri::CreateContainerResponse { container_id }))
    }

    async fn start_container(
        &self,
        r: Request<cri::StartContainerRequest>,
    ) -> Reply<cri::StartContainerResponse> {
        self.0.start_container(&r.into_inner().container_id).await?;
        Ok(Response::new(cri::StartContainerResponse {}))
    }

    async fn stop_container(
        &self,
        r: Request<cri::StopContainerRequest>,
    ) -> Reply<cri::StopContainerResponse> {
        let r = r.into_inner();
        self.0.stop_container(&r.container_id, r.timeout).await?;
        Ok(Response::new(cri::StopContainerResponse {}))
    }

    async fn remove_container(
        &self,
        r: Request<cri::RemoveContainerRequest>,
    ) -> Reply<cri::RemoveContainerResponse> {
        self.0.remove_container(&r.into_inner().container_id).await?;
        Ok(Response::new(cri::RemoveContainerResponse {}))
    }

    async fn list_containers(
        &self,
        r: Request<cri::ListContainersRequest>,
    ) -> Reply<cri::ListContainersResponse> {
        let containers = self.0.list_containers(r.into_inner().filter).await;
        Ok(Response::new(cri::ListContainersResponse { containers }))
    }

    async fn container_status(
        &self,
        r: Request<cri::ContainerStatusRequest>,
    ) -> Reply<cri::ContainerStatusResponse> {
        let r = r.into_inner();
        let (status, info) = self.0.container_status_verbose(&r.container_id).await?;
        let info = if r.verbose { info } else { Default::default() };
        Ok(Response::new(cri::ContainerStatusResponse { status: Some(status), info }))
    }

    async fn status(&self, _: Request<cri::StatusRequest>) -> Reply<cri::StatusResponse> {
        let condition = |kind: &str, status: bool, reason: &str, message: String| cri::RuntimeCondition {
            r#type: kind.into(),
            status,
            reason: reason.into(),
            message,
        };
        let limits = crate::engine::limits_not_enforced(self.0.cgroup_mode());
        let info = [
            ("limitsNotEnforced".to_owned(), limits.join("; ")),
            ("engine".to_owned(), self.0.engine_name().to_owned()),
            (
                "idMapping".to_owned(),
                self.0.id_mappings().map_or_else(|| "unknown".to_owned(), ToString::to_string),
            ),
        ]
        .into_iter()
        .collect();
        let runtime = self.0.clone();
        let engine = tokio::task::spawn_blocking(move || runtime.engine_ready())
            .await
            .unwrap_or_else(|e| Err(format!("the check did not finish: {e}")));
        let runtime_ready = match engine {
            Ok(()) => condition("RuntimeReady", true, "", String::new()),
            Err(why) => condition("RuntimeReady", false, "EngineNotWorking", why),
        };
        let network_ready = match &self.0.config.network {
            None => condition(
                "NetworkReady",
                true,
                "LoopbackOnly",
                "no hpk-net-forwarder is configured: sandboxes get a loopback-only network".into(),
            ),
            Some(network) => match network.ready().await {
                Ok(()) => condition("NetworkReady", true, "", String::new()),
                Err(why) => condition("NetworkReady", false, "NetForwarderNotReady", why),
            },
        };
        Ok(Response::new(cri::StatusResponse {
            status: Some(cri::RuntimeStatus { conditions: vec![runtime_ready, network_ready] }),
            info,
            ..Default::default()
        }))
    }

    async fn update_container_resources(
        &self,
        _: Request<cri::UpdateContainerResourcesRequest>,
    ) -> Reply<cri::UpdateContainerResourcesResponse> {
        Err(Status::failed_precondition(crate::engine::limits_not_enforced(self.0.cgroup_mode()).join("; ")))
    }

    async fn reopen_container_log(
        &self,
        r: Request<cri::ReopenContainerLogRequest>,
    ) -> Reply<cri::ReopenContainerLogResponse> {
        self.0.reopen_container_log(&r.into_inner().container_id).await?;
        Ok(Response::new(cri::ReopenContainerLogResponse {}))
    }

    async fn exec_sync(&self, r: Request<cri::ExecSyncRequest>) -> Reply<cri::ExecSyncResponse> {
        let cri::ExecSyncRequest { container_id, cmd, timeout } = r.into_inner();
        let out = self.0.exec_sync(&container_id, cmd, timeout).await?;
        Ok(Response::new(cri::ExecSyncResponse {
            stdout: out.stdout,
            stderr: out.stderr,
            exit_code: out.exit_code,
        }))
    }

    async fn exec(&self, r: Request<cri::ExecRequest>) -> Reply<cri::ExecResponse> {
        let r = r.into_inner();
        self.0.check_exec(&r).await?;
        let url = self
            .0
            .streaming()?
            .exec_url(hpk_streaming::ExecRequest {
                container_id: r.container_id,
                cmd: r.cmd,
                tty: r.tty,
                stdin: r.stdin,
                stdout: r.stdout,
                stderr: r.stderr,
            })
            .map_err(streaming_status)?;
        Ok(Response::new(cri::ExecResponse { url }))
    }

    async fn attach(&self, r: Request<cri::AttachRequest>) -> Reply<cri::AttachResponse> {
        let r = r.into_inner();
        self.0.check_attach(&r).await?;
        let url = self
            .0
            .streaming()?
            .attach_url(hpk_streaming::AttachRequest {
                container_id: r.container_id,
                tty: r.tty,
                stdin: r.stdin,
                stdout: r.stdout,
                stderr: r.stderr,
            })
            .map_err(streaming_status)?;
        Ok(Response::new(cri::AttachResponse { url }))
    }

    async fn port_forward(&self, r: Request<cri::PortForwardRequest>) -> Reply<cri::PortForwardResponse> {
        let r = r.into_inner();
        self.0.check_port_forward(&r).await?;
        let url = self
            .0
            .streaming()?
            .port_forward_url(hpk_streaming::PortForwardRequest {
                sandbox_id: r.pod_sandbox_id,
                ports: r.port,
            })
            .map_err(streaming_status)?;
        Ok(Response::new(cri::PortForwardResponse { url }))
    }

    async fn container_stats(
        &self,
        r: Request<cri::ContainerStatsRequest>,
    ) -> Reply<cri::ContainerStatsResponse> {
        let stats = self.0.container_stats(&r.into_inner().container_id).await?;
        Ok(Response::new(cri::ContainerStatsResponse { stats: Some(stats) }))
    }

    async fn list_container_stats(
        &self,
        r: Request<cri::ListContainerStatsRequest>,
    ) -> Reply<cri::ListContainerStatsResponse> {
        let stats = self.0.list_container_stats(r.into_inner().filter).await;
        Ok(Response::new(cri::ListContainerStatsResponse { stats }))
    }

    async fn pod_sandbox_stats(
        &self,
        r: Request<cri::PodSandboxStatsRequest>,
    ) -> Reply<cri::PodSandboxStatsResponse> {
        let stats = self.0.sandbox_stats(&r.into_inner().pod_sandbox_id).await?;
        Ok(Response::new(cri::PodSandboxStatsResponse { stats: Some(stats) }))
    }

    async fn list_pod_sandbox_stats(
        &self,
        r: Request<cri::ListPodSandboxStatsRequest>,
    ) -> Reply<cri::ListPodSandboxStatsResponse> {
        let stats = self.0.list_sandbox_stats(r.into_inner().filter).await;
        Ok(Response::new(cri::ListPodSandboxStatsResponse { stats }))
    }

    async fn update_runtime_config(
        &self,
        _: Request<cri::UpdateRuntimeConfigRequest>,
    ) -> Reply<cri::UpdateRuntimeConfigResponse> {
        // The kubelet sends the node's pod CIDR here; the net-forwarder will take it.
        Ok(Response::new(cri::UpdateRuntimeConfigResponse {}))
    }

    async fn checkpoint_container(
        &self,
        _: Request<cri::CheckpointContainerRequest>,
    ) -> Reply<cri::CheckpointContainerResponse> {
        unimplemented("CheckpointContainer")
    }

    type GetContainerEventsStream = std::pin::Pin<
        Box<dyn tokio_stream::Stream<Item = Result<cri::ContainerEventResponse, Status>> + Send>,
    >;

    async fn get_container_events(
        &self,
        _: Request<cri::GetEventsRequest>,
    ) -> Reply<Self::GetContainerEventsStream> {
        use tokio::sync::broadcast::error::RecvError;
        let mut events = self.0.subscribe_events();
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        tokio::spawn(async move {
            loop {
                let item = match events.recv().await {
                    Ok(event) => Ok(event),
                    // A subscriber that falls behind gets an error and the stream ends: it
                    // must list again, as the kubelet does when its event stream breaks.
                    Err(RecvError::Lagged(n)) => {
                        Err(Status::aborted(format!("the event stream fell {n} events behind; list again")))
                    }
                    Err(RecvError::Closed) => return,
                };
                let last = item.is_err();
                if tx.send(item).await.is_err() || last {
                    return;
                }
            }
        });
        let events = tokio_stream::wrappers::ReceiverStream::new(rx);
        Ok(Response::new(Box::pin(events)))
    }

    async fn list_metric_descriptors(
        &self,
        _: Request<cri::ListMetricDescriptorsRequest>,
    ) -> Reply<cri::ListMetricDescriptorsResponse> {
        unimplemented("ListMetricDescriptors")
    }

    async fn list_pod_sandbox_metrics(
        &self,
        _: Request<cri::ListPodSandboxMetricsRequest>,
    ) -> Reply<cri::ListPodSandboxMetricsResponse> {
        unimplemented("ListPodSandboxMetrics")
    }

    async fn runtime_config(
        &self,
        _: Request<cri::RuntimeConfigRequest>,
    ) -> Reply<cri::RuntimeConfigResponse> {
        Ok(Response::new(cri::RuntimeConfigResponse::default()))
    }
}

/// The streaming server's refusals as gRPC statuses.
fn streaming_status(e: hpk_streaming::Error) -> Status {
    match e {
        hpk_streaming::Error::InvalidRequest(_) => Status::invalid_argument(e.to_string()),
        hpk_streaming::Error::TooManyPending(_) => Status::resource_exhausted(e.to_string()),
        other => Status::internal(other.to_string()),
    }
}
