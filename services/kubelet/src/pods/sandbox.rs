//! The worker's sandbox steps: making it, replacing one that stopped underneath the pod, and
//! adopting what a previous kubelet left.

use k8s_cri::v1 as cri;

use super::error::{RETRY, Reason, Retry, StepError};
use super::plan::{self, Sandbox, Step};
use super::worker::Worker;
use crate::cri::CriClient;
use crate::events::Kind;

impl Worker {
    /// Makes the sandbox. A failure leaves none behind: a sandbox the runtime made but whose
    /// status cannot be read is removed again.
    pub(super) async fn create_sandbox(&mut self) -> Result<(), StepError> {
        self.state.step = Step::CreatingSandbox;
        let failed =
            |message: String| StepError::new(Reason::FailedCreatePodSandBox, message, Retry::BackOff);
        let (config, warnings) = crate::cri_config::sandbox_config(
            &self.pod,
            self.state.sandbox_attempt,
            &self.ctx.dns,
            &self.ctx.logs_dir,
        )
        .map_err(|error| failed(crate::node::error_chain(&error)))?;
        for warning in warnings {
            self.event(None, Kind::Warning, "DNSConfigForming", warning);
        }
        std::fs::create_dir_all(&config.log_directory).map_err(|error| {
            failed(format!("creating the log directory {}: {error}", config.log_directory))
        })?;
        let runtime = self.ctx.runtime.clone();
        let id = runtime
            .run_pod_sandbox(config.clone())
            .await
            .map_err(|error| failed(format!("failed to create pod sandbox: {}", error.message())))?;
        let ips = match sandbox_ips(runtime.as_ref(), &id).await {
            Ok(ips) => ips,
            Err(error) => {
                // Half made: take it down, so that the next attempt starts clean.
                let _ = runtime.stop_pod_sandbox(&id).await;
                if let Err(error) = runtime.remove_pod_sandbox(&id).await {
                    tracing::warn!(pod = %self.key, sandbox = %id, %error, "removing a half-made sandbox failed");
                }
                return Err(failed(format!("failed to read the pod sandbox's status: {}", error.message())));
            }
        };
        tracing::info!(pod = %self.key, sandbox = %id, ip = ?ips, "sandbox running");
        self.state.sandbox = Some(Sandbox { id, config, ips, ready: true });
        self.state.sandbox_attempt += 1;
        self.state.sandbox_backoff.reset();
        // /etc/hosts names the pod's address, known only now.
        self.state.message.clear();
        Ok(())
    }

    /// The sandbox stopped underneath a pod that still runs (its pause died, or someone
    /// stopped it): remove it, as the kubelet does, so that a new one is made with the init
    /// containers run again and the containers restarted (counted as restarts).
    pub(super) async fn replace_dead_sandbox(&mut self) -> Result<(), StepError> {
        let Some(old) = self.state.sandbox.as_ref().map(|s| s.id.clone()) else { return Ok(()) };
        self.event(
            None,
            Kind::Normal,
            "SandboxChanged",
            "Pod sandbox changed, it will be killed and re-created.".into(),
        );
        self.stop_probes();
        let runtime = self.ctx.runtime.clone();
        let _ = runtime.stop_pod_sandbox(&old).await;
        runtime.remove_pod_sandbox(&old).await.map_err(|error| {
            StepError::new(
                Reason::SandboxNotRemoved,
                format!("removing the dead sandbox {old}: {}", error.message()),
                Retry::After(RETRY),
            )
        })?;
        self.state.sandbox = None;
        let has_init = self.state.containers.iter().any(|c| c.init);
        for c in &mut self.state.containers {
            // Its containers went with the sandbox; the record keeps the restart to count.
            if c.running() || (c.init && c.exit().is_some()) {
                c.wait(if c.init { "PodInitializing" } else { "ContainerCreating" }, "");
            }
            c.previous_id = None;
        }
        self.state.initialized = !has_init;
        Ok(())
    }

    /// Takes over what a previous kubelet left: the newest ready sandbox and, per container,
    /// its newest runtime container. Nothing that runs is stopped; `plan` then sees them and
    /// makes nothing again.
    pub(super) async fn adopt(&mut self, adopted: super::Adopted) {
        let Some(sandbox) =
            adopted.sandboxes.iter().find(|s| s.state == cri::PodSandboxState::SandboxReady as i32)
        else {
            return;
        };
        let runtime = self.ctx.runtime.clone();
        let Ok(Some(status)) = runtime.pod_sandbox_status(&sandbox.id).await else { return };
        let attempt = status.metadata.as_ref().map_or(0, |m| m.attempt);
        let Ok((config, _)) =
            crate::cri_config::sandbox_config(&self.pod, attempt, &self.ctx.dns, &self.ctx.logs_dir)
        else {
            return;
        };
        let ips = sandbox_ips(runtime.as_ref(), &sandbox.id).await.unwrap_or_default();
        self.state.sandbox = Some(Sandbox { id: sandbox.id.clone(), config, ips, ready: true });
        self.state.sandbox_attempt = attempt + 1;
        for i in 0..self.state.containers.len() {
            let name = self.state.containers[i].name.clone();
            let newest = adopted
                .containers
                .iter()
                .filter(|c| {
                    c.pod_sandbox_id == sandbox.id && c.metadata.as_ref().is_some_and(|m| m.name == name)
                })
                .max_by_key(|c| (c.metadata.as_ref().map_or(0, |m| m.attempt), c.created_at));
            if let Some(found) = newest {
                if let Some(held) = found.annotations.get(crate::gpus::ANNOTATION) {
                    self.ctx.gpus.adopt(&self.uid, &name, held);
                }
                let c = &mut self.state.containers[i];
                c.id = Some(found.id.clone());
                c.attempt = found.metadata.as_ref().map_or(0, |m| m.attempt);
                c.restart_count = c.restart_count.max(c.attempt);
                // The back-off starts afresh with a restarted kubelet.
                c.restart_backoff = super::backoff::Backoff::default();
                self.refresh_one(i).await;
            }
        }
        // Readiness is unknown until the probes say; containers without probes are ready.
        for i in 0..self.state.containers.len() {
            if self.state.containers[i].running() {
                let name = self.state.containers[i].name.clone();
                let spec = self.spec_of(&name, self.state.containers[i].init);
                let c = &mut self.state.containers[i];
                c.started = spec.as_ref().is_none_or(|s| s.startup_probe.is_none());
                c.ready = spec.as_ref().is_none_or(|s| s.readiness_probe.is_none());
                let first = !c.started;
                self.start_probes(i, first);
            }
        }
        self.state.initialized = self.state.initialized || plan::adopted_initialized(&self.state.containers);
        if let Ok(req) = super::admission::requests(&self.pod) {
            super::lock(&self.ctx.admitted).adopt(&self.uid, req, super::admission::host_ports(&self.pod));
            self.state.admitted = true;
        }
        tracing::info!(pod = %self.key, sandbox = %sandbox.id, "adopted the running pod");
    }
}

/// The sandbox's addresses, primary first.
pub(super) async fn sandbox_ips(
    runtime: &dyn CriClient,
    id: &str,
) -> Result<Vec<String>, crate::cri::CriError> {
    let Some(network) = runtime.pod_sandbox_status(id).await?.and_then(|s| s.network) else {
        return Ok(Vec::new());
    };
    Ok(std::iter::once(network.ip)
        .chain(network.additional_ips.into_iter().map(|ip| ip.ip))
        .filter(|ip| !ip.is_empty())
        .collect())
}
