//! The end of a pod: a completed pod's sandbox stopped, and graceful termination — preStop
//! hooks and SIGTERM, SIGKILL after the grace period, the sandbox and volumes removed, the API
//! object deleted for good with a UID precondition.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Preconditions};

use super::error::{RETRY, Reason, Retry, StepError};
use super::lock;
use super::status::Phase;
use super::worker::{Step, Worker};
use crate::events::Kind;

impl Worker {
    /// A completed pod keeps its containers (for logs) but not its sandbox.
    pub(super) async fn stop_sandbox_of_completed_pod(&mut self) -> Result<(), StepError> {
        self.stop_probes();
        let mut result = Ok(());
        let mut stopped = false;
        if let Some(sandbox) = self.state.sandbox.as_mut().filter(|s| s.ready) {
            match self.ctx.runtime.stop_pod_sandbox(&sandbox.id).await {
                Ok(()) => {
                    sandbox.ready = false;
                    stopped = true;
                }
                Err(error) => {
                    result = Err(StepError::new(
                        Reason::SandboxNotRemoved,
                        format!("stopping the sandbox {}: {}", sandbox.id, error.message()),
                        Retry::After(RETRY),
                    ));
                }
            }
        }
        // A container that outlived its stop (a StopContainer that failed or timed out on a
        // loaded machine) ended with the sandbox: read it back, so that the terminal phase is
        // not reported beside a running container.
        if stopped && self.state.containers.iter().any(|c| c.running()) {
            self.refresh().await;
        }
        if self.state.admitted {
            lock(&self.ctx.admitted).release(&self.uid);
            self.ctx.gpus.release(&self.uid);
            self.state.admitted = false;
        }
        result
    }

    /// The pod ran past its `activeDeadlineSeconds`: phase Failed with reason
    /// DeadlineExceeded (as the kubelet words it), its containers stopped within `grace`, its
    /// sandbox stopped as a completed pod's.
    pub(super) async fn deadline_exceeded(&mut self, grace: i64) -> Result<(), StepError> {
        if self.state.reason.is_none() {
            let message = "Pod was active on the node longer than the specified deadline".to_owned();
            tracing::info!(pod = %self.key, "active deadline exceeded");
            self.event(None, Kind::Normal, "DeadlineExceeded", message.clone());
            self.state.message.clone_from(&message);
            self.state.reason = Some(("DeadlineExceeded".into(), message));
        }
        self.state.phase = Phase::Failed;
        self.state.step = Step::Completed;
        self.stop_probes();
        self.stop_all(grace).await;
        self.stop_sandbox_of_completed_pod().await
    }

    /// The eviction manager chose the pod: phase Failed with reason Evicted and its message,
    /// a Warning event Evicted, its containers stopped within `grace`, its sandbox stopped as
    /// a completed pod's (its requests freed at once).
    pub(super) async fn evict(&mut self, grace: i64) -> Result<(), StepError> {
        if self.state.reason.is_none() {
            let message = self.state.evicted.clone().unwrap_or_default();
            tracing::warn!(pod = %self.key, %message, "evicting the pod");
            self.event(None, Kind::Warning, "Evicted", message.clone());
            self.state.message.clone_from(&message);
            self.state.reason = Some(("Evicted".into(), message));
        }
        self.state.phase = Phase::Failed;
        self.state.step = Step::Completed;
        self.stop_probes();
        self.stop_all(grace).await;
        self.stop_sandbox_of_completed_pod().await
    }

    /// Stops every probe.
    pub(super) fn stop_probes(&mut self) {
        for (_, cancel) in self.probes.drain() {
            cancel.cancel();
        }
    }

    /// Graceful termination within `grace` seconds: preStop hooks and SIGTERM, SIGKILL after
    /// the grace period, the sandbox removed, the volumes cleaned, and the API object deleted
    /// for good. A sandbox that cannot be removed is kept and tried again.
    pub(super) async fn terminate(&mut self, grace: i64) -> Result<(), StepError> {
        if self.state.step != Step::Terminating {
            tracing::info!(pod = %self.key, "terminating pod");
        }
        self.state.step = Step::Terminating;
        self.stop_probes();
        self.stop_all(grace).await;
        if let Some(sandbox) = self.state.sandbox.take() {
            let runtime = self.ctx.runtime.clone();
            let removed = match runtime.stop_pod_sandbox(&sandbox.id).await {
                Ok(()) => runtime.remove_pod_sandbox(&sandbox.id).await,
                Err(error) => Err(error),
            };
            if let Err(error) = removed {
                let message = format!("removing the sandbox {}: {}", sandbox.id, error.message());
                self.state.sandbox = Some(sandbox);
                return Err(StepError::new(Reason::SandboxNotRemoved, message, Retry::After(RETRY)));
            }
        }
        if let Err(error) = crate::volumes::remove(&self.ctx.pod_dir(&self.uid)) {
            tracing::warn!(pod = %self.key, %error, "removing the pod's volumes failed");
        }
        lock(&self.ctx.admitted).release(&self.uid);
        self.ctx.gpus.release(&self.uid);
        self.state.admitted = false;
        if !self.state.deleted {
            if !self.state.phase.terminal() {
                let failed = self
                    .state
                    .containers
                    .iter()
                    .filter(|c| c.regular())
                    .any(|c| c.exit().is_none_or(|e| e.exit_code != 0));
                self.state.phase = if failed { Phase::Failed } else { Phase::Succeeded };
            }
            self.report().await;
            let pods: Api<Pod> = Api::namespaced(self.ctx.client.clone(), self.namespace());
            let params = DeleteParams {
                grace_period_seconds: Some(0),
                preconditions: Some(Preconditions { uid: Some(self.uid.clone()), resource_version: None }),
                ..DeleteParams::default()
            };
            match pods.delete(self.name(), &params).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
                Err(error) => {
                    return Err(StepError::new(
                        Reason::FinalDeleteFailed,
                        format!("final delete: {error}"),
                        Retry::After(RETRY),
                    ));
                }
            }
        }
        lock(&self.ctx.summaries).remove(&self.uid);
        self.state.step = Step::Terminated;
        tracing::info!(pod = %self.key, "pod terminated");
        Ok(())
    }
}
