//! The CRI calls a pod worker makes, as a trait: the gRPC client implements it, a recording
//! fake (`fake.rs`) drives the worker's unit tests. `tonic::Status` stops here: the worker sees
//! a [`CriError`] that says which call failed and how.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use k8s_cri::v1 as cri;

use super::Cri;

/// What a [`CriClient`] call returns.
pub type CriFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, CriError>> + Send + 'a>>;

/// The runtime's container events, as they come.
pub type CriEvents = futures_util::stream::BoxStream<'static, Result<cri::ContainerEventResponse, CriError>>;

/// A CRI call, named as the runtime service names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CriCall {
    /// `RunPodSandbox`.
    RunPodSandbox,
    /// `StopPodSandbox`.
    StopPodSandbox,
    /// `RemovePodSandbox`.
    RemovePodSandbox,
    /// `PodSandboxStatus`.
    PodSandboxStatus,
    /// `ListPodSandbox`.
    ListPodSandbox,
    /// `CreateContainer`.
    CreateContainer,
    /// `StartContainer`.
    StartContainer,
    /// `StopContainer`.
    StopContainer,
    /// `RemoveContainer`.
    RemoveContainer,
    /// `ContainerStatus`.
    ContainerStatus,
    /// `ListContainers`.
    ListContainers,
    /// `ExecSync`.
    ExecSync,
    /// `ImageStatus`.
    ImageStatus,
    /// `GetContainerEvents`.
    GetContainerEvents,
    /// `PullImage`.
    PullImage,
}

/// How a CRI call failed, as far as the worker cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CriFailure {
    /// The object is not there (removed underneath the kubelet).
    NotFound,
    /// The runtime did not answer in time.
    TimedOut,
    /// The runtime cannot be reached.
    Unavailable,
    /// The runtime refused or failed the call.
    Failed,
}

/// A failed CRI call: which call, how, and the runtime's words.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("CRI {call:?}: {message}")]
pub struct CriError {
    /// The call.
    pub call: CriCall,
    /// How it failed.
    pub failure: CriFailure,
    /// The runtime's message.
    pub message: String,
}

impl CriError {
    /// An error of `call`.
    pub fn new(call: CriCall, failure: CriFailure, message: impl Into<String>) -> Self {
        Self { call, failure, message: message.into() }
    }

    /// The runtime's message alone (what events and statuses show).
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Whether the object was not found.
    pub fn is_not_found(&self) -> bool {
        self.failure == CriFailure::NotFound
    }

    /// The gRPC status of `call`, translated: the one place the worker's view meets tonic.
    fn from_status(call: CriCall, status: &tonic::Status) -> Self {
        let failure = match status.code() {
            tonic::Code::NotFound => CriFailure::NotFound,
            tonic::Code::DeadlineExceeded => CriFailure::TimedOut,
            tonic::Code::Unavailable => CriFailure::Unavailable,
            _ => CriFailure::Failed,
        };
        Self::new(call, failure, status.message())
    }
}

/// The runtime and image service calls of a pod worker, its probes and the pod manager.
pub trait CriClient: Send + Sync {
    /// Runs a sandbox; its id.
    fn run_pod_sandbox(&self, config: cri::PodSandboxConfig) -> CriFuture<'_, String>;
    /// Stops a sandbox (and its containers).
    fn stop_pod_sandbox(&self, id: &str) -> CriFuture<'_, ()>;
    /// Removes a sandbox.
    fn remove_pod_sandbox(&self, id: &str) -> CriFuture<'_, ()>;
    /// A sandbox's status.
    fn pod_sandbox_status(&self, id: &str) -> CriFuture<'_, Option<cri::PodSandboxStatus>>;
    /// Every sandbox.
    fn list_pod_sandbox(&self) -> CriFuture<'_, Vec<cri::PodSandbox>>;
    /// Creates a container in a sandbox; its id.
    fn create_container(
        &self,
        sandbox_id: &str,
        config: cri::ContainerConfig,
        sandbox_config: Option<cri::PodSandboxConfig>,
    ) -> CriFuture<'_, String>;
    /// Starts a created container.
    fn start_container(&self, id: &str) -> CriFuture<'_, ()>;
    /// Stops a container: SIGTERM, SIGKILL after `timeout` seconds.
    fn stop_container(&self, id: &str, timeout: i64) -> CriFuture<'_, ()>;
    /// Removes a container.
    fn remove_container(&self, id: &str) -> CriFuture<'_, ()>;
    /// A container's status.
    fn container_status(&self, id: &str) -> CriFuture<'_, Option<cri::ContainerStatus>>;
    /// Every container.
    fn list_containers(&self) -> CriFuture<'_, Vec<cri::Container>>;
    /// Runs `cmd` in container `id` and waits at most `timeout` (whole seconds, at least 1).
    fn exec_sync(
        &self,
        id: &str,
        cmd: Vec<String>,
        timeout: Duration,
    ) -> CriFuture<'_, cri::ExecSyncResponse>;
    /// An image, if present.
    fn image_status(&self, image: cri::ImageSpec) -> CriFuture<'_, Option<cri::Image>>;
    /// Pulls an image; its reference.
    fn pull_image(&self, image: cri::ImageSpec, auth: Option<cri::AuthConfig>) -> CriFuture<'_, String>;
    /// Subscribes to the runtime's container events.
    fn container_events(&self) -> CriFuture<'_, CriEvents>;
}

/// Runs one gRPC call on a clone of the runtime client, mapping its status.
macro_rules! call {
    ($client:expr, $call:ident, $method:ident, $request:expr, |$answer:ident| $map:expr) => {{
        let mut client = $client.clone();
        let request = $request;
        Box::pin(async move {
            match client.$method(request).await {
                Ok($answer) => {
                    let $answer = $answer.into_inner();
                    Ok($map)
                }
                Err(status) => Err(CriError::from_status(CriCall::$call, &status)),
            }
        })
    }};
}

impl CriClient for Cri {
    fn run_pod_sandbox(&self, config: cri::PodSandboxConfig) -> CriFuture<'_, String> {
        let request = cri::RunPodSandboxRequest { config: Some(config), runtime_handler: String::new() };
        call!(self.runtime, RunPodSandbox, run_pod_sandbox, request, |a| a.pod_sandbox_id)
    }

    fn stop_pod_sandbox(&self, id: &str) -> CriFuture<'_, ()> {
        let request = cri::StopPodSandboxRequest { pod_sandbox_id: id.to_owned() };
        call!(self.runtime, StopPodSandbox, stop_pod_sandbox, request, |_a| ())
    }

    fn remove_pod_sandbox(&self, id: &str) -> CriFuture<'_, ()> {
        let request = cri::RemovePodSandboxRequest { pod_sandbox_id: id.to_owned() };
        call!(self.runtime, RemovePodSandbox, remove_pod_sandbox, request, |_a| ())
    }

    fn pod_sandbox_status(&self, id: &str) -> CriFuture<'_, Option<cri::PodSandboxStatus>> {
        let request = cri::PodSandboxStatusRequest { pod_sandbox_id: id.to_owned(), verbose: false };
        call!(self.runtime, PodSandboxStatus, pod_sandbox_status, request, |a| a.status)
    }

    fn list_pod_sandbox(&self) -> CriFuture<'_, Vec<cri::PodSandbox>> {
        let request = cri::ListPodSandboxRequest { filter: None };
        call!(self.runtime, ListPodSandbox, list_pod_sandbox, request, |a| a.items)
    }

    fn create_container(
        &self,
        sandbox_id: &str,
        config: cri::ContainerConfig,
        sandbox_config: Option<cri::PodSandboxConfig>,
    ) -> CriFuture<'_, String> {
        let request = cri::CreateContainerRequest {
            pod_sandbox_id: sandbox_id.to_owned(),
            config: Some(config),
            sandbox_config,
        };
        call!(self.runtime, CreateContainer, create_container, request, |a| a.container_id)
    }

    fn start_container(&self, id: &str) -> CriFuture<'_, ()> {
        let request = cri::StartContainerRequest { container_id: id.to_owned() };
        call!(self.runtime, StartContainer, start_container, request, |_a| ())
    }

    fn stop_container(&self, id: &str, timeout: i64) -> CriFuture<'_, ()> {
        let request = cri::StopContainerRequest { container_id: id.to_owned(), timeout };
        call!(self.runtime, StopContainer, stop_container, request, |_a| ())
    }

    fn remove_container(&self, id: &str) -> CriFuture<'_, ()> {
        let request = cri::RemoveContainerRequest { container_id: id.to_owned() };
        call!(self.runtime, RemoveContainer, remove_container, request, |_a| ())
    }

    fn container_status(&self, id: &str) -> CriFuture<'_, Option<cri::ContainerStatus>> {
        let request = cri::ContainerStatusRequest { container_id: id.to_owned(), verbose: false };
        call!(self.runtime, ContainerStatus, container_status, request, |a| a.status)
    }

    fn list_containers(&self) -> CriFuture<'_, Vec<cri::Container>> {
        let request = cri::ListContainersRequest { filter: None };
        call!(self.runtime, ListContainers, list_containers, request, |a| a.containers)
    }

    fn exec_sync(
        &self,
        id: &str,
        cmd: Vec<String>,
        timeout: Duration,
    ) -> CriFuture<'_, cri::ExecSyncResponse> {
        let request = cri::ExecSyncRequest {
            container_id: id.to_owned(),
            cmd,
            timeout: i64::try_from(timeout.as_secs().max(1)).unwrap_or(i64::MAX),
        };
        call!(self.runtime, ExecSync, exec_sync, request, |a| a)
    }

    fn image_status(&self, image: cri::ImageSpec) -> CriFuture<'_, Option<cri::Image>> {
        let request = cri::ImageStatusRequest { image: Some(image), verbose: false };
        call!(self.images, ImageStatus, image_status, request, |a| a.image)
    }

    fn pull_image(&self, image: cri::ImageSpec, auth: Option<cri::AuthConfig>) -> CriFuture<'_, String> {
        let request = cri::PullImageRequest { image: Some(image), auth, sandbox_config: None };
        call!(self.images, PullImage, pull_image, request, |a| a.image_ref)
    }

    fn container_events(&self) -> CriFuture<'_, CriEvents> {
        use futures_util::StreamExt;
        let request = cri::GetEventsRequest {};
        call!(self.runtime, GetContainerEvents, get_container_events, request, |a| a
            .map(|event| event.map_err(|status| CriError::from_status(CriCall::GetContainerEvents, &status)))
            .boxed())
    }
}
