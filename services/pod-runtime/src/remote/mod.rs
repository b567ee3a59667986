//! `hpk.podruntime.v1.Remote`: what a kubelet on another machine needs of this runtime besides
//! CRI (connector mode). Served beside CRI on the mutually authenticated TCP listener only.
//!
//! - [`files`]: PutFiles / RemovePodFiles, the pod's files under `<root>/pod-files/<uid>/`
//!   (checked whole by `validate` before anything is written).
//! - [`logs`]: ReadLog through `hpk-cri-logs`.
//! - Allocation: `hpk-node-resources` over the runtime's root and the process's Slurm
//!   variables.
//! - [`probe`]: Probe, one attempt of a network probe on a sandbox's own address, through
//!   `hpk-probe`'s clients (the kubelet's own).
//!
//! The handlers are thin: the logic takes a root path and is tested without a runtime.

pub mod files;
pub mod logs;
pub mod probe;
mod validate;

#[cfg(test)]
mod api_tests;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use hpk_proto::podruntime::v1 as pb;
use hpk_proto::podruntime::v1::remote_server::{Remote, RemoteServer};
use tonic::{Code, Request, Response, Status};

use crate::runtime::Runtime;

/// Largest message either way, as for CRI; bounds a PutFiles' content too.
pub const MAX_MESSAGE: usize = 16 * 1024 * 1024;

/// What can go wrong serving `hpk.podruntime.v1.Remote`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request is malformed; the message names the offending part.
    #[error("{0}")]
    Invalid(String),
    /// What the request names does not exist.
    #[error("{0}")]
    NotFound(String),
    /// Too many requests of this kind run already.
    #[error("{0}")]
    Busy(String),
    /// A file operation failed.
    #[error("cannot {action} {path}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The path.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The runtime refused (an unknown container, say).
    #[error(transparent)]
    Runtime(#[from] crate::runtime::Error),
    /// The machine's figures could not be read.
    #[error("cannot read this node's resources: {0}")]
    Resources(#[from] hpk_node_resources::Error),
    /// A blocking task did not finish.
    #[error("a file task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// Result with this module's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn io(action: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io { action, path: path.into(), source }
    }
}

impl From<Error> for Status {
    fn from(error: Error) -> Self {
        let code = match error {
            // The runtime's own mapping (NOT_FOUND for an unknown container).
            Error::Runtime(e) => return e.into(),
            Error::Invalid(_) => Code::InvalidArgument,
            Error::NotFound(_) => Code::NotFound,
            Error::Busy(_) => Code::ResourceExhausted,
            Error::Io { .. } | Error::Resources(_) | Error::Task(_) => Code::Internal,
        };
        Status::new(code, error.to_string())
    }
}

/// The `Remote` service over the runtime.
#[derive(Clone)]
pub struct RemoteApi {
    runtime: Arc<Runtime>,
    /// `<runtime root>/pod-files`, absolute: its paths are answered to the kubelet.
    pod_files: PathBuf,
    max_pods: u32,
    /// Probes running now, at most [`probe::MAX_RUNNING`].
    probes: Arc<tokio::sync::Semaphore>,
}

impl RemoteApi {
    /// The service for `runtime`, whose node takes at most `max_pods` pods.
    pub fn new(runtime: Arc<Runtime>, max_pods: u32) -> Self {
        let pod_files = runtime.config.root.join(files::POD_FILES);
        let pod_files = std::path::absolute(&pod_files).unwrap_or(pod_files);
        let probes = Arc::new(tokio::sync::Semaphore::new(probe::MAX_RUNNING));
        Self { runtime, pod_files, max_pods, probes }
    }
}

/// The `Remote` gRPC service, messages up to [`MAX_MESSAGE`] either way.
pub fn remote_server(runtime: Arc<Runtime>, max_pods: u32) -> RemoteServer<RemoteApi> {
    RemoteServer::new(RemoteApi::new(runtime, max_pods))
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE)
}

/// The capacity of this machine or Slurm allocation (`env` reads a variable); `root` is the
/// runtime's state directory, whose filesystem is the ephemeral storage.
pub fn allocation(
    root: &Path,
    max_pods: u32,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<pb::AllocationResponse> {
    let machine = hpk_node_resources::Machine::read(root)?;
    let capacity = hpk_node_resources::capacity(env, &machine, max_pods).to_strings();
    Ok(pb::AllocationResponse {
        capacity: capacity.into_iter().collect::<HashMap<_, _>>(),
        source: hpk_node_resources::source(env),
    })
}

type Reply<T> = Result<Response<T>, Status>;

#[tonic::async_trait]
impl Remote for RemoteApi {
    async fn put_files(&self, request: Request<pb::PutFilesRequest>) -> Reply<pb::PutFilesResponse> {
        let pod_files = self.pod_files.clone();
        let request = request.into_inner();
        let path = tokio::task::spawn_blocking(move || files::put(&pod_files, &request, MAX_MESSAGE))
            .await
            .map_err(Error::from)??;
        let path = path.into_os_string().into_string().map_err(|path| {
            Status::internal(format!("the runtime's root is not UTF-8: {}", Path::new(&path).display()))
        })?;
        Ok(Response::new(pb::PutFilesResponse { path }))
    }

    async fn remove_pod_files(
        &self,
        request: Request<pb::RemovePodFilesRequest>,
    ) -> Reply<pb::RemovePodFilesResponse> {
        let pod_files = self.pod_files.clone();
        let uid = request.into_inner().pod_uid;
        tokio::task::spawn_blocking(move || files::remove_pod(&pod_files, &uid))
            .await
            .map_err(Error::from)??;
        Ok(Response::new(pb::RemovePodFilesResponse {}))
    }

    type ReadLogStream = logs::Chunks;

    async fn read_log(&self, request: Request<pb::ReadLogRequest>) -> Reply<Self::ReadLogStream> {
        Ok(Response::new(logs::read(Arc::clone(&self.runtime), request.into_inner()).await?))
    }

    async fn allocation(&self, _: Request<pb::AllocationRequest>) -> Reply<pb::AllocationResponse> {
        let root = self.runtime.config.root.clone();
        let max_pods = self.max_pods;
        let answer = tokio::task::spawn_blocking(move || {
            allocation(&root, max_pods, &|name| std::env::var(name).ok())
        })
        .await
        .map_err(Error::from)??;
        Ok(Response::new(answer))
    }

    async fn probe(&self, request: Request<pb::ProbeRequest>) -> Reply<pb::ProbeResponse> {
        let _running = Arc::clone(&self.probes)
            .try_acquire_owned()
            .map_err(|_| Error::Busy(format!("{} probes are running; try again", probe::MAX_RUNNING)))?;
        Ok(Response::new(probe::run(&self.runtime, request.get_ref()).await?))
    }
}
