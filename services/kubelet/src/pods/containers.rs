//! The worker's container steps: starting one (image, env, mounts, config, postStart), its
//! restart and back-off, stopping one (preStop, SIGTERM, SIGKILL), its probes, and reading
//! states back from the runtime.

use std::time::Duration;

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{Container, LifecycleHandler, Probe};
use k8s_openapi::jiff::Timestamp;
use tokio::time::Instant;

use super::error::{RETRY_CONTAINER, Reason, Retry, StepError};
use super::pull;
use super::record::State;
use super::termination;
use super::worker::Worker;
use crate::events::Kind;
use crate::probes::{self, ProbeKind};

/// The longest a postStart hook may hold the pod's worker.
const POST_START_LIMIT: Duration = Duration::from_secs(120);

/// Why a lifecycle hook failed.
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    /// The handler failed (a non-zero exit, an HTTP error, a refused connection …).
    #[error("hook of container {container} failed: {detail}")]
    Failed {
        /// The container.
        container: String,
        /// What the handler said.
        detail: String,
    },
    /// The container has no runtime container to run it in.
    #[error("hook of container {0} failed: the container has no id")]
    NoContainer(String),
}

/// The container's configuration could not be made.
fn config_error(error: &dyn std::error::Error) -> StepError {
    StepError::new(
        Reason::CreateContainerConfigError,
        crate::node::error_chain(error),
        Retry::After(RETRY_CONTAINER),
    )
}

impl Worker {
    /// Container `i` ended and restarts now: its exit becomes the last state, its back-off
    /// advances (afresh when it ran long enough).
    pub(super) fn restart(&mut self, i: usize, reset_backoff: bool) {
        let c = &mut self.state.containers[i];
        if reset_backoff {
            c.restart_backoff.reset();
        }
        if let Some(exit) = c.exit().cloned() {
            c.last = Some(exit);
        }
        c.restart_backoff.fail(Instant::now());
    }

    /// Container `i` ended and waits `delay` before it restarts: CrashLoopBackOff.
    pub(super) fn back_off(&mut self, i: usize, delay: Duration) {
        let pod = format!("{}_{}({})", self.name(), self.namespace(), self.uid);
        let pod_name = self.name().to_owned();
        let c = &mut self.state.containers[i];
        let Some(exit) = c.exit().cloned() else { return };
        let (name, init) = (c.name.clone(), c.init);
        c.last = Some(exit);
        c.wait(
            "CrashLoopBackOff",
            format!("back-off {}s restarting failed container={name} pod={pod}", delay.as_secs()),
        );
        if let Some(at) = c.restart_backoff.until() {
            self.wake_at(at);
        }
        self.event(
            Some((&name, init)),
            Kind::Warning,
            "BackOff",
            format!("Back-off restarting failed container {name} in pod {pod_name}"),
        );
    }

    /// Pulls the image, resolves env and mounts, creates and starts container `i`, runs its
    /// postStart hook and its probes.
    pub(super) async fn start_container(&mut self, i: usize) -> Result<(), StepError> {
        let (name, init) = (self.state.containers[i].name.clone(), self.state.containers[i].init);
        let Some(spec) = self.spec_of(&name, init) else { return Ok(()) };
        let Some(sandbox_id) = self.state.sandbox.as_ref().map(|s| s.id.clone()) else { return Ok(()) };
        let who = Some((name.as_str(), init));
        let image = spec.image.clone().unwrap_or_default();

        // The image.
        let pulling = || self.event(who, Kind::Normal, "Pulling", format!("Pulling image {image:?}"));
        let ready = pull::ensure(self.ctx.runtime.as_ref(), &self.ctx.objects, &self.pod, &spec, pulling)
            .await
            .map_err(pull::NotReady::into_step_error)?;
        let note = match ready.pulled_in {
            Some(took) => format!("Successfully pulled image {image:?} in {:.3}s", took.as_secs_f64()),
            None => format!("Container image {image:?} already present on machine"),
        };
        self.event(who, Kind::Normal, "Pulled", note);
        self.state.containers[i].pull_backoff.reset();

        // Its configuration.
        let config = self.container_config(&spec, &ready, i).await?;
        let attempt = self.state.containers[i].next_attempt();
        let sandbox_config = self.state.sandbox.as_ref().map(|s| s.config.clone());
        let runtime = self.ctx.runtime.clone();
        let id = runtime
            .create_container(&sandbox_id, config, sandbox_config)
            .await
            .map_err(|error| StepError::new(Reason::CreateContainerError, error.message(), Retry::BackOff))?;
        self.event(who, Kind::Normal, "Created", format!("Created container: {name}"));
        if let Some(message) = self.not_honoured(&spec, ready.uid) {
            tracing::warn!(pod = %self.key, container = %name, %message, "security context not honoured");
            self.event(who, Kind::Warning, crate::cri_config::NOT_HONOURED_REASON, message);
        }
        // The runtime keeps the previous container (for `logs --previous`), not older ones.
        if let Some(older) = self.state.containers[i].replace_container(&id, attempt)
            && let Err(error) = runtime.remove_container(&older).await
            && !error.is_not_found()
        {
            tracing::warn!(pod = %self.key, container = %older, %error, "removing an old container failed");
        }
        if let Err(error) = runtime.start_container(&id).await {
            // The created container stays as the runtime left it: its state is the status.
            self.refresh_one(i).await;
            return Err(StepError::new(Reason::RunContainerError, error.message(), Retry::OnChange));
        }
        self.event(who, Kind::Normal, "Started", format!("Started container {name}"));
        {
            let c = &mut self.state.containers[i];
            c.state = State::Running { started_at: Timestamp::now() };
            c.started = spec.startup_probe.is_none();
            c.ready = spec.readiness_probe.is_none();
            c.failed_probe = None;
        }
        tracing::info!(pod = %self.key, container = %name, id = %id, "container started");
        if let Some(hook) = spec.lifecycle.as_ref().and_then(|l| l.post_start.clone())
            && let Err(error) = self.run_hook(i, &spec, &hook, POST_START_LIMIT).await
        {
            self.stop_container(i, 0).await;
            self.refresh_one(i).await;
            return Err(StepError::new(Reason::FailedPostStartHook, error.to_string(), Retry::OnChange));
        }
        self.start_probes(i, true);
        // It may have exited already.
        self.refresh_one(i).await;
        Ok(())
    }

    /// Which IDs of `spec`'s security context the bubble cannot honour, in words. Only the
    /// bubble's own runtime is known: a remote one (connector mode) says nothing here.
    fn not_honoured(&self, spec: &Container, image_uid: Option<i64>) -> Option<String> {
        let ids = self.ctx.ids.as_ref().filter(|_| self.ctx.cri.remote.is_none())?;
        crate::cri_config::not_honoured(&self.pod, spec, image_uid, ids, &self.ctx.node_name)
    }

    /// The CRI config of container `i`: env, runAsNonRoot, mounts, /etc/hosts.
    async fn container_config(
        &self,
        spec: &Container,
        image: &pull::Ready,
        i: usize,
    ) -> Result<cri::ContainerConfig, StepError> {
        let facts = self.facts();
        let env = crate::cri_config::resolve_env(&self.pod, spec, &facts, &self.ctx.objects)
            .await
            .map_err(|e| config_error(&e))?;
        for warning in &env.warnings {
            self.event(
                Some((&spec.name, self.state.containers[i].init)),
                Kind::Warning,
                "InvalidEnvironmentVariableNames",
                warning.clone(),
            );
        }
        crate::cri_config::verify_run_as_non_root(&self.pod, spec, image.uid, &image.username)
            .map_err(|e| config_error(&e))?;
        let volumes = self.volumes.as_ref().ok_or_else(|| {
            StepError::new(
                Reason::CreateContainerConfigError,
                "volumes are not ready",
                Retry::After(RETRY_CONTAINER),
            )
        })?;
        let mut container_mounts = volumes.mounts_for(spec, &env.to_map()).map_err(|e| config_error(&e))?;
        let mut mounts = std::mem::take(&mut container_mounts.mounts);
        if crate::volumes::wants_etc_hosts(spec) {
            let ip = facts.pod_ips.first().cloned().unwrap_or_default();
            let hosts = crate::volumes::write_etc_hosts(
                &self.pod,
                &ip,
                &self.ctx.dns.cluster_domain,
                &self.ctx.pod_dir(&self.uid),
            )
            .map_err(|e| config_error(&e))?;
            mounts.push(hosts);
        }
        // The termination message's file: on this machine only (connector mode leaves the
        // message to the remote runtime).
        if self.ctx.cri.remote.is_none()
            && let Some(path) = termination::container_path(spec, &mounts)
        {
            let c = &self.state.containers[i];
            let mount = termination::prepare(&self.ctx.pod_dir(&self.uid), &c.name, c.next_attempt(), &path)
                .map_err(|e| config_error(&e))?;
            mounts.push(mount);
        }
        if let Some(remote) = &self.ctx.cri.remote {
            mounts = crate::remote_files::ship(remote, &self.uid, &self.ctx.pod_dir(&self.uid), mounts)
                .await
                .map_err(|e| config_error(&e))?;
        }
        container_mounts.mounts = mounts;
        let c = &self.state.containers[i];
        let mut config = crate::cri_config::container_config(
            &self.pod,
            spec,
            &env,
            container_mounts.mounts.clone(),
            &image.image_ref,
            c.next_attempt(),
            c.next_attempt(),
        )
        .map_err(|e| config_error(&e))?;
        // The runtime resolves each subPath mount again beneath its volume and mounts what it
        // opened, so nothing swapped in since the check above is followed (review H4).
        config.annotations.extend(container_mounts.annotation());
        // GPUs: devices of its own, which the runtime resolves from the node's CDI specs.
        let wanted = crate::gpus::wanted(spec);
        if wanted > 0 {
            let init: Vec<String> = self
                .pod
                .spec
                .as_ref()
                .and_then(|s| s.init_containers.as_ref())
                .into_iter()
                .flatten()
                .filter(|c| c.name != spec.name && c.restart_policy.as_deref() != Some("Always"))
                .map(|c| c.name.clone())
                .collect();
            let devices =
                self.ctx.gpus.allocate(&self.uid, &spec.name, wanted, &init).map_err(|message| {
                    StepError::new(Reason::CreateContainerConfigError, message, Retry::After(RETRY_CONTAINER))
                })?;
            for (key, value) in crate::gpus::env(wanted) {
                if !config.envs.iter().any(|e| e.key == key) {
                    config.envs.push(cri::KeyValue { key, value });
                }
            }
            config.annotations.insert(crate::gpus::ANNOTATION.into(), devices.join(","));
            config.cdi_devices = devices.into_iter().map(|name| cri::CdiDevice { name }).collect();
        }
        Ok(config)
    }

    /// Runs a lifecycle hook (exec, httpGet, sleep) within `limit`.
    async fn run_hook(
        &self,
        i: usize,
        spec: &Container,
        hook: &LifecycleHandler,
        limit: Duration,
    ) -> Result<(), HookError> {
        if let Some(sleep) = hook.sleep.as_ref() {
            let secs = u64::try_from(sleep.seconds).unwrap_or(0);
            tokio::time::sleep(Duration::from_secs(secs).min(limit)).await;
            return Ok(());
        }
        let probe = Probe {
            exec: hook.exec.clone(),
            http_get: hook.http_get.clone(),
            tcp_socket: hook.tcp_socket.clone(),
            timeout_seconds: Some(i32::try_from(limit.as_secs()).unwrap_or(i32::MAX).max(1)),
            ..Probe::default()
        };
        let target = self.probe_target(i, spec).ok_or_else(|| HookError::NoContainer(spec.name.clone()))?;
        match probes::check(ProbeKind::Liveness, &probe, &target).await {
            probes::Outcome::Success | probes::Outcome::Warning(_) => Ok(()),
            probes::Outcome::Failure(message) | probes::Outcome::Unknown(message) => {
                // The check speaks of a probe; this is a hook.
                let detail = message
                    .strip_prefix("Liveness probe failed: ")
                    .or_else(|| message.strip_prefix("Liveness probe: "))
                    .unwrap_or(&message)
                    .to_owned();
                Err(HookError::Failed { container: spec.name.clone(), detail })
            }
        }
    }

    fn probe_target(&self, i: usize, spec: &Container) -> Option<probes::Target> {
        let id = self.state.containers[i].id.clone()?;
        let pod_ip = self.state.sandbox.as_ref().and_then(|s| s.ips.first()).and_then(|ip| ip.parse().ok());
        Some(probes::Target {
            pod_ip,
            container_id: id,
            container: spec.clone(),
            cri: self.ctx.runtime.clone(),
            sandbox_id: self.state.sandbox.as_ref().map(|s| s.id.clone()).unwrap_or_default(),
            remote: self.ctx.cri.remote.as_ref().map(|r| r.api.clone()),
        })
    }

    /// Starts container `i`'s probes: the startup probe first when it has one (`first`), and
    /// liveness and readiness once it has passed.
    pub(super) fn start_probes(&mut self, i: usize, first: bool) {
        let name = self.state.containers[i].name.clone();
        let Some(spec) = self.spec_of(&name, self.state.containers[i].init) else { return };
        let Some(target) = self.probe_target(i, &spec) else { return };
        let cancel = self.probes.entry(name).or_default().clone();
        let mut wanted: Vec<(ProbeKind, Probe)> = Vec::new();
        match (first, spec.startup_probe.clone()) {
            (true, Some(startup)) => wanted.push((ProbeKind::Startup, startup)),
            _ => {
                wanted.extend(spec.liveness_probe.clone().map(|p| (ProbeKind::Liveness, p)));
                wanted.extend(spec.readiness_probe.clone().map(|p| (ProbeKind::Readiness, p)));
            }
        }
        for (kind, probe) in wanted {
            probes::spawn(kind, probe, target.clone(), self.probe_tx.clone(), cancel.child_token());
        }
    }

    fn stop_probes_of(&mut self, name: &str) {
        if let Some(cancel) = self.probes.remove(name) {
            cancel.cancel();
        }
    }

    /// Stops container `i`: its preStop hook, then SIGTERM and SIGKILL after what is left of
    /// `grace` seconds.
    pub(super) async fn stop_container(&mut self, i: usize, grace: i64) {
        let (name, init) = (self.state.containers[i].name.clone(), self.state.containers[i].init);
        self.stop_probes_of(&name);
        let Some(id) = self.state.containers[i].id.clone().filter(|_| self.state.containers[i].running())
        else {
            return;
        };
        let deadline = Instant::now() + Duration::from_secs(u64::try_from(grace).unwrap_or(0));
        self.event(Some((&name, init)), Kind::Normal, "Killing", format!("Stopping container {name}"));
        if let Some(spec) = self.spec_of(&name, init)
            && let Some(hook) = spec.lifecycle.as_ref().and_then(|l| l.pre_stop.clone())
        {
            let left = deadline.saturating_duration_since(Instant::now());
            if let Err(error) = self.run_hook(i, &spec, &hook, left).await {
                self.event(Some((&name, init)), Kind::Warning, "FailedPreStopHook", error.to_string());
            }
        }
        let left = deadline.saturating_duration_since(Instant::now()).as_secs();
        let timeout = i64::try_from(left).unwrap_or(0);
        if let Err(error) = self.ctx.runtime.stop_container(&id, timeout).await {
            tracing::warn!(pod = %self.key, container = %name, %error, "stopping the container failed");
        }
    }

    /// Stops every running container within `grace`: the containers first, then the init
    /// containers (sidecars) in reverse order, as the kubelet stops them.
    pub(super) async fn stop_all(&mut self, grace: i64) {
        // Hooks run one container after another here, but within one deadline: the grace
        // period is the pod's, not each container's.
        let deadline = Instant::now() + Duration::from_secs(u64::try_from(grace).unwrap_or(0));
        let containers = &self.state.containers;
        let mains = (0..containers.len()).filter(|&i| !containers[i].init);
        let inits = (0..containers.len()).rev().filter(|&i| containers[i].init);
        let running: Vec<usize> = mains.chain(inits).filter(|&i| containers[i].running()).collect();
        for i in running {
            let left =
                i64::try_from(deadline.saturating_duration_since(Instant::now()).as_secs()).unwrap_or(0);
            self.stop_container(i, left).await;
        }
        self.refresh().await;
    }

    /// Reads every container's state back from the runtime.
    pub(super) async fn refresh(&mut self) {
        for i in 0..self.state.containers.len() {
            self.refresh_one(i).await;
        }
        let runtime = self.ctx.runtime.clone();
        if let Some(sandbox) = self.state.sandbox.as_mut()
            && let Ok(status) = runtime.pod_sandbox_status(&sandbox.id).await
        {
            let ready = status.is_some_and(|s| s.state == cri::PodSandboxState::SandboxReady as i32);
            if sandbox.ready && !ready && !self.state.phase.terminal() {
                tracing::warn!(pod = %self.key, sandbox = %sandbox.id, "sandbox stopped underneath the pod");
            }
            sandbox.ready = ready;
        }
    }

    /// Adds the container's own termination message to the exit `apply` just recorded; an
    /// exit already `known` (its id and message) keeps the message it was given.
    async fn termination_message(
        &mut self,
        i: usize,
        status: &cri::ContainerStatus,
        known: Option<(String, String)>,
    ) {
        let c = &self.state.containers[i];
        let Some(exit) = c.exit() else { return };
        if let Some((_, message)) = known.filter(|(id, _)| *id == exit.container_id) {
            if let State::Terminated(exit) = &mut self.state.containers[i].state {
                exit.message = message;
            }
            return;
        }
        let Some(spec) = self.spec_of(&c.name, c.init) else { return };
        let file = (self.ctx.cri.remote.is_none() && termination::container_path(&spec, &[]).is_some())
            .then(|| termination::file(&self.ctx.pod_dir(&self.uid), &c.name, c.attempt));
        let own =
            termination::message(&spec, file.as_deref(), exit.exit_code, &exit.reason, &status.log_path)
                .await;
        if let State::Terminated(exit) = &mut self.state.containers[i].state {
            exit.message = termination::combine(&exit.message, &own);
        }
    }

    pub(super) async fn refresh_one(&mut self, i: usize) {
        let Some(id) = self.state.containers[i].id.clone() else { return };
        match self.ctx.runtime.container_status(&id).await {
            Ok(answer) => {
                if let Some(status) = answer {
                    let was_running = self.state.containers[i].running();
                    let known =
                        self.state.containers[i].exit().map(|e| (e.container_id.clone(), e.message.clone()));
                    self.state.containers[i].apply(&status);
                    self.termination_message(i, &status, known).await;
                    if was_running && !self.state.containers[i].running() {
                        let name = self.state.containers[i].name.clone();
                        self.stop_probes_of(&name);
                    }
                }
            }
            Err(error) if error.is_not_found() => {
                // Removed underneath us (with its sandbox): it no longer runs. The id stays, so
                // that the next container counts as a restart.
                let c = &mut self.state.containers[i];
                if c.running() {
                    c.wait("ContainerCreating", "the runtime lost the container");
                }
            }
            Err(error) => tracing::warn!(pod = %self.key, %error, "container status failed"),
        }
    }
}
