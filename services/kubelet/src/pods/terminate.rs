//! The end of a pod: a completed pod's sandbox stopped, and graceful termination — preStop
//! hooks and SIGTERM, SIGKILL after the grace period, the sandbox and volumes removed, the API
//! object deleted for good with a UID precondition.

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Preconditions};
use tokio::time::Instant;

use super::lock;
use super::status::Phase;
use super::worker::{RETRY, Step, VANISHED_GRACE, Worker};

impl Worker {
    /// A completed pod keeps its containers (for logs) but not its sandbox.
    pub(super) async fn stop_sandbox_of_completed_pod(&mut self) {
        self.stop_probes();
        if let Some(sandbox) = self.sandbox.as_mut().filter(|s| s.ready) {
            let mut runtime = self.ctx.cri.runtime.clone();
            let request = cri::StopPodSandboxRequest { pod_sandbox_id: sandbox.id.clone() };
            match runtime.stop_pod_sandbox(request).await {
                Ok(_) => sandbox.ready = false,
                Err(status) => {
                    tracing::warn!(pod = %self.key, error = %status.message(), "stopping the sandbox failed");
                    self.wake_at(Instant::now() + RETRY);
                }
            }
        }
        if self.admitted {
            lock(&self.ctx.admitted).release(&self.uid);
            self.admitted = false;
        }
    }

    /// Stops every probe.
    pub(super) fn stop_probes(&mut self) {
        for (_, cancel) in self.probes.drain() {
            cancel.cancel();
        }
    }

    /// Graceful termination: preStop hooks and SIGTERM, SIGKILL after the grace period, the
    /// sandbox removed, the volumes cleaned, and the API object deleted for good.
    pub(super) async fn terminate(&mut self) {
        if self.step != Step::Terminating {
            tracing::info!(pod = %self.key, "terminating pod");
        }
        self.step = Step::Terminating;
        self.stop_probes();
        let grace = if self.deleted {
            VANISHED_GRACE
        } else {
            self.pod
                .metadata
                .deletion_grace_period_seconds
                .or_else(|| self.pod.spec.as_ref().and_then(|s| s.termination_grace_period_seconds))
                .unwrap_or(30)
                .max(0)
        };
        self.stop_all(grace).await;
        if let Some(sandbox) = self.sandbox.take() {
            let mut runtime = self.ctx.cri.runtime.clone();
            let stop = cri::StopPodSandboxRequest { pod_sandbox_id: sandbox.id.clone() };
            let removed = match runtime.stop_pod_sandbox(stop).await {
                Ok(_) => {
                    runtime
                        .remove_pod_sandbox(cri::RemovePodSandboxRequest {
                            pod_sandbox_id: sandbox.id.clone(),
                        })
                        .await
                }
                Err(status) => Err(status),
            };
            if let Err(status) = removed {
                tracing::warn!(pod = %self.key, sandbox = %sandbox.id, error = %status.message(), "removing the sandbox failed; retrying");
                self.sandbox = Some(sandbox);
                self.wake_at(Instant::now() + RETRY);
                return;
            }
        }
        if let Err(error) = crate::volumes::remove(&self.ctx.pod_dir(&self.uid)) {
            tracing::warn!(pod = %self.key, %error, "removing the pod's volumes failed");
        }
        lock(&self.ctx.admitted).release(&self.uid);
        self.admitted = false;
        if !self.deleted {
            if !self.phase.terminal() {
                let failed = self
                    .containers
                    .iter()
                    .filter(|c| !c.init)
                    .any(|c| c.exit().is_none_or(|e| e.exit_code != 0));
                self.phase = if failed { Phase::Failed } else { Phase::Succeeded };
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
                    tracing::warn!(pod = %self.key, %error, "final delete failed; retrying");
                    self.wake_at(Instant::now() + RETRY);
                    return;
                }
            }
        }
        lock(&self.ctx.summaries).remove(&self.uid);
        self.step = Step::Terminated;
        tracing::info!(pod = %self.key, "pod terminated");
    }
}
