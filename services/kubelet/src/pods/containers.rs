//! The worker's runtime steps: the sandbox, starting a container (image, env, mounts, config,
//! postStart), stopping one (preStop, SIGTERM, SIGKILL), reading states back from the runtime,
//! and adopting what a previous kubelet left.

use std::time::Duration;

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{Container, LifecycleHandler, Probe};
use k8s_openapi::jiff::Timestamp;
use tokio::time::Instant;

use super::backoff::{Backoff, RESET_AFTER};
use super::pull;
use super::record::State;
use super::worker::{Sandbox, Worker};
use crate::events::Kind;
use crate::probes::{self, ProbeKind};

/// The longest a postStart hook may hold the pod's worker.
const POST_START_LIMIT: Duration = Duration::from_secs(120);

impl Worker {
    /// Creates the sandbox when there is none; true once it runs.
    pub(super) async fn ensure_sandbox(&mut self) -> bool {
        if self.sandbox.as_ref().is_some_and(|s| s.ready) {
            return true;
        }
        if self.sandbox.is_some() && !self.replace_dead_sandbox().await {
            return false;
        }
        let now = Instant::now();
        if self.sandbox_backoff.waiting(now) {
            if let Some(at) = self.sandbox_backoff.until() {
                self.wake_at(at);
            }
            return false;
        }
        self.step = super::worker::Step::CreatingSandbox;
        let logs_root = self.ctx.logs_dir.clone();
        let (config, warnings) =
            match crate::spec::sandbox_config(&self.pod, self.sandbox_attempt, &self.ctx.dns, &logs_root) {
                Ok(made) => made,
                Err(error) => {
                    self.sandbox_failed(now, crate::node::error_chain(&error));
                    return false;
                }
            };
        for warning in warnings {
            self.event(None, Kind::Warning, "DNSConfigForming", warning);
        }
        if let Err(error) = std::fs::create_dir_all(&config.log_directory) {
            self.sandbox_failed(now, format!("creating the log directory {}: {error}", config.log_directory));
            return false;
        }
        let mut runtime = self.ctx.cri.runtime.clone();
        let request =
            cri::RunPodSandboxRequest { config: Some(config.clone()), runtime_handler: String::new() };
        let id = match runtime.run_pod_sandbox(request).await {
            Ok(answer) => answer.into_inner().pod_sandbox_id,
            Err(status) => {
                self.sandbox_failed(now, format!("failed to create pod sandbox: {}", status.message()));
                return false;
            }
        };
        let ips = sandbox_ips(&self.ctx.cri, &id).await;
        tracing::info!(pod = %self.key, sandbox = %id, ip = ?ips, "sandbox running");
        self.sandbox = Some(Sandbox { id, config, ips, ready: true });
        self.sandbox_attempt += 1;
        self.sandbox_backoff.reset();
        // /etc/hosts names the pod's address, known only now.
        self.message.clear();
        true
    }

    /// The sandbox stopped underneath a pod that still runs (its pause died, or someone
    /// stopped it): remove it, as the kubelet does, so that a new one is made with the init
    /// containers run again and the containers restarted (counted as restarts).
    async fn replace_dead_sandbox(&mut self) -> bool {
        let Some(old) = self.sandbox.as_ref().map(|s| s.id.clone()) else { return true };
        self.event(
            None,
            Kind::Normal,
            "SandboxChanged",
            "Pod sandbox changed, it will be killed and re-created.".into(),
        );
        self.stop_probes();
        let mut runtime = self.ctx.cri.runtime.clone();
        let _ = runtime.stop_pod_sandbox(cri::StopPodSandboxRequest { pod_sandbox_id: old.clone() }).await;
        if let Err(status) =
            runtime.remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: old.clone() }).await
        {
            tracing::warn!(pod = %self.key, sandbox = %old, error = %status.message(), "removing a dead sandbox failed; retrying");
            self.wake_at(Instant::now() + super::worker::RETRY);
            return false;
        }
        self.sandbox = None;
        let has_init = self.containers.iter().any(|c| c.init);
        for c in &mut self.containers {
            // Its containers went with the sandbox; the record keeps the restart to count.
            if c.running() || (c.init && c.exit().is_some()) {
                c.wait(if c.init { "PodInitializing" } else { "ContainerCreating" }, "");
            }
            c.previous_id = None;
        }
        self.initialized = !has_init;
        true
    }

    fn sandbox_failed(&mut self, now: Instant, message: String) {
        tracing::warn!(pod = %self.key, %message, "sandbox not created");
        self.event(None, Kind::Warning, "FailedCreatePodSandBox", message.clone());
        self.message = message;
        self.sandbox_backoff.fail(now);
        if let Some(at) = self.sandbox_backoff.until() {
            self.wake_at(at);
        }
    }

    /// Starts container `i` unless its image or restart back-off says wait.
    pub(super) async fn start_when_due(&mut self, i: usize, now: Instant) {
        let c = &self.containers[i];
        if c.restart_backoff.waiting(now) || c.pull_backoff.waiting(now) {
            let at = [c.restart_backoff.until(), c.pull_backoff.until()]
                .into_iter()
                .flatten()
                .filter(|t| *t > now)
                .min();
            if let Some(at) = at {
                self.wake_at(at);
            }
            return;
        }
        self.start_container(i).await;
    }

    /// Container `i` ended and restarts: at once the first time, then after its back-off.
    pub(super) async fn restart_after_backoff(&mut self, i: usize, now: Instant) {
        let pod = format!("{}_{}({})", self.name(), self.namespace(), self.uid);
        let pod_name = self.name().to_owned();
        let c = &mut self.containers[i];
        let Some(exit) = c.exit().cloned() else { return };
        // A container that ran long enough starts its back-off afresh.
        let ran = exit.started_at.zip(exit.finished_at).map(|(s, f)| f.duration_since(s).unsigned_abs());
        if ran.is_some_and(|ran| ran >= RESET_AFTER) {
            c.restart_backoff.reset();
        }
        if c.restart_backoff.waiting(now) {
            let delay = c.restart_backoff.delay();
            let (name, init) = (c.name.clone(), c.init);
            c.last = Some(exit);
            c.wait(
                "CrashLoopBackOff",
                format!("back-off {}s restarting failed container={name} pod={pod}", delay.as_secs()),
            );
            if let Some(at) = self.containers[i].restart_backoff.until() {
                self.wake_at(at);
            }
            self.event(
                Some((&name, init)),
                Kind::Warning,
                "BackOff",
                format!("Back-off restarting failed container {name} in pod {pod_name}"),
            );
            return;
        }
        c.last = Some(exit);
        c.restart_backoff.fail(now);
        self.start_container(i).await;
    }

    /// Pulls the image, resolves env and mounts, creates and starts container `i`, runs its
    /// postStart hook and its probes.
    async fn start_container(&mut self, i: usize) {
        let (name, init) = (self.containers[i].name.clone(), self.containers[i].init);
        let Some(spec) = self.spec_of(&name, init) else { return };
        let Some(sandbox_id) = self.sandbox.as_ref().map(|s| s.id.clone()) else { return };
        let who = Some((name.as_str(), init));
        let image = spec.image.clone().unwrap_or_default();

        // The image.
        let pulling = || self.event(who, Kind::Normal, "Pulling", format!("Pulling image {image:?}"));
        let ready = match pull::ensure(&self.ctx.cri, &self.ctx.objects, &self.pod, &spec, pulling).await {
            Ok(ready) => ready,
            Err(not_ready) => {
                let c = &mut self.containers[i];
                if not_ready.reason == "ErrImagePull" {
                    let first = c.pull_backoff.delay().is_zero();
                    c.pull_backoff.fail(Instant::now());
                    let reason = if first { "ErrImagePull" } else { "ImagePullBackOff" };
                    let message = if first {
                        not_ready.message.clone()
                    } else {
                        format!("Back-off pulling image {image:?}: {}", not_ready.message)
                    };
                    c.wait(reason, message);
                    if let Some(at) = c.pull_backoff.until() {
                        self.wake_at(at);
                    }
                    self.event(
                        who,
                        Kind::Warning,
                        "Failed",
                        format!("Failed to pull image {image:?}: {}", not_ready.message),
                    );
                    if !first {
                        self.event(who, Kind::Normal, "BackOff", format!("Back-off pulling image {image:?}"));
                    }
                } else {
                    c.wait(not_ready.reason, not_ready.message.clone());
                    self.event(who, Kind::Warning, "Failed", format!("Error: {}", not_ready.reason));
                    self.wake_at(Instant::now() + Duration::from_secs(10));
                }
                return;
            }
        };
        if let Some(took) = ready.pulled_in {
            self.event(
                who,
                Kind::Normal,
                "Pulled",
                format!("Successfully pulled image {image:?} in {:.3}s", took.as_secs_f64()),
            );
        } else {
            self.event(
                who,
                Kind::Normal,
                "Pulled",
                format!("Container image {image:?} already present on machine"),
            );
        }
        self.containers[i].pull_backoff.reset();

        // Its configuration.
        let config = match self.container_config(&spec, &ready, i).await {
            Ok(config) => config,
            Err(message) => {
                self.containers[i].wait("CreateContainerConfigError", message.clone());
                self.event(who, Kind::Warning, "Failed", format!("Error: {message}"));
                self.message = message;
                self.wake_at(Instant::now() + Duration::from_secs(10));
                return;
            }
        };
        let attempt = self.containers[i].next_attempt();
        let sandbox_config = self.sandbox.as_ref().map(|s| s.config.clone());
        let mut runtime = self.ctx.cri.runtime.clone();
        let request =
            cri::CreateContainerRequest { pod_sandbox_id: sandbox_id, config: Some(config), sandbox_config };
        let id = match runtime.create_container(request).await {
            Ok(answer) => answer.into_inner().container_id,
            Err(status) => {
                let message = status.message().to_owned();
                let c = &mut self.containers[i];
                c.wait("CreateContainerError", message.clone());
                c.restart_backoff.fail(Instant::now());
                if let Some(at) = c.restart_backoff.until() {
                    self.wake_at(at);
                }
                self.event(who, Kind::Warning, "Failed", format!("Error: {message}"));
                return;
            }
        };
        self.event(who, Kind::Normal, "Created", format!("Created container: {name}"));
        if let Some(message) = self.not_honoured(&spec, ready.uid) {
            tracing::warn!(pod = %self.key, container = %name, %message, "security context not honoured");
            self.event(who, Kind::Warning, crate::spec::NOT_HONOURED_REASON, message);
        }
        // The runtime keeps the previous container (for `logs --previous`), not older ones.
        if let Some(older) = self.containers[i].replace_container(&id, attempt) {
            let request = cri::RemoveContainerRequest { container_id: older.clone() };
            if let Err(status) = runtime.remove_container(request).await
                && status.code() != tonic::Code::NotFound
            {
                tracing::warn!(pod = %self.key, container = %older, error = %status.message(), "removing an old container failed");
            }
        }
        if let Err(status) =
            runtime.start_container(cri::StartContainerRequest { container_id: id.clone() }).await
        {
            let message = status.message().to_owned();
            self.event(who, Kind::Warning, "Failed", format!("Error: {message}"));
            self.refresh_one(i).await;
            if self.containers[i].exit().is_none() {
                self.containers[i].wait("RunContainerError", message);
            }
            return;
        }
        self.event(who, Kind::Normal, "Started", format!("Started container {name}"));
        {
            let c = &mut self.containers[i];
            c.state = State::Running { started_at: Timestamp::now() };
            c.started = spec.startup_probe.is_none();
            c.ready = spec.readiness_probe.is_none();
        }
        tracing::info!(pod = %self.key, container = %name, id = %id, "container started");
        if let Some(hook) = spec.lifecycle.as_ref().and_then(|l| l.post_start.clone())
            && let Err(message) = self.run_hook(i, &spec, &hook, POST_START_LIMIT).await
        {
            self.event(who, Kind::Warning, "FailedPostStartHook", message);
            self.stop_container(i, 0).await;
            self.refresh_one(i).await;
            return;
        }
        self.start_probes(i, true);
        // It may have exited already.
        self.refresh_one(i).await;
    }

    /// Which IDs of `spec`'s security context the bubble cannot honour, in words. Only the
    /// bubble's own runtime is known: a remote one (connector mode) says nothing here.
    fn not_honoured(&self, spec: &Container, image_uid: Option<i64>) -> Option<String> {
        let ids = self.ctx.ids.as_ref().filter(|_| self.ctx.cri.remote.is_none())?;
        crate::spec::not_honoured(&self.pod, spec, image_uid, ids, &self.ctx.node_name)
    }

    /// The CRI config of container `i`: env, runAsNonRoot, mounts, /etc/hosts.
    async fn container_config(
        &self,
        spec: &Container,
        image: &pull::Ready,
        i: usize,
    ) -> Result<cri::ContainerConfig, String> {
        let facts = self.facts();
        let env = crate::spec::resolve_env(&self.pod, spec, &facts, &self.ctx.objects)
            .await
            .map_err(|e| crate::node::error_chain(&e))?;
        for warning in &env.warnings {
            self.event(
                Some((&spec.name, self.containers[i].init)),
                Kind::Warning,
                "InvalidEnvironmentVariableNames",
                warning.clone(),
            );
        }
        crate::spec::verify_run_as_non_root(&self.pod, spec, image.uid, &image.username)
            .map_err(|e| crate::node::error_chain(&e))?;
        let volumes = self.volumes.as_ref().ok_or("volumes are not ready")?;
        let mut container_mounts =
            volumes.mounts_for(spec, &env.to_map()).map_err(|e| crate::node::error_chain(&e))?;
        let mut mounts = std::mem::take(&mut container_mounts.mounts);
        if crate::volumes::wants_etc_hosts(spec) {
            let ip = facts.pod_ips.first().cloned().unwrap_or_default();
            let hosts = crate::volumes::write_etc_hosts(
                &self.pod,
                &ip,
                &self.ctx.dns.cluster_domain,
                &self.ctx.pod_dir(&self.uid),
            )
            .map_err(|e| crate::node::error_chain(&e))?;
            mounts.push(hosts);
        }
        if let Some(remote) = &self.ctx.cri.remote {
            mounts =
                crate::remote_files::ship(remote, &self.uid, &self.ctx.pod_dir(&self.uid), mounts).await?;
        }
        container_mounts.mounts = mounts;
        let c = &self.containers[i];
        let mut config = crate::spec::container_config(
            &self.pod,
            spec,
            &env,
            container_mounts.mounts.clone(),
            &image.image_ref,
            c.next_attempt(),
            c.next_attempt(),
        )
        .map_err(|e| crate::node::error_chain(&e))?;
        // The runtime resolves each subPath mount again beneath its volume and mounts what it
        // opened, so nothing swapped in since the check above is followed (review H4).
        config.annotations.extend(container_mounts.annotation());
        Ok(config)
    }

    /// Runs a lifecycle hook (exec, httpGet, sleep) within `limit`.
    async fn run_hook(
        &self,
        i: usize,
        spec: &Container,
        hook: &LifecycleHandler,
        limit: Duration,
    ) -> Result<(), String> {
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
        let target = self.probe_target(i, spec)?;
        match probes::check(ProbeKind::Liveness, &probe, &target).await {
            probes::Outcome::Success => Ok(()),
            probes::Outcome::Failure(message) => {
                // The check speaks of a probe; this is a hook.
                let message = message.strip_prefix("Liveness probe failed: ").unwrap_or(&message);
                Err(format!("hook of container {} failed: {message}", spec.name))
            }
        }
    }

    fn probe_target(&self, i: usize, spec: &Container) -> Result<probes::Target, String> {
        let id = self.containers[i].id.clone().ok_or("the container has no id")?;
        let pod_ip = self.sandbox.as_ref().and_then(|s| s.ips.first()).and_then(|ip| ip.parse().ok());
        Ok(probes::Target { pod_ip, container_id: id, container: spec.clone(), cri: self.ctx.cri.clone() })
    }

    /// Starts container `i`'s probes: the startup probe first when it has one (`first`), and
    /// liveness and readiness once it has passed.
    pub(super) fn start_probes(&mut self, i: usize, first: bool) {
        let name = self.containers[i].name.clone();
        let Some(spec) = self.spec_of(&name, self.containers[i].init) else { return };
        let Ok(target) = self.probe_target(i, &spec) else { return };
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
        let (name, init) = (self.containers[i].name.clone(), self.containers[i].init);
        self.stop_probes_of(&name);
        let Some(id) = self.containers[i].id.clone().filter(|_| self.containers[i].running()) else { return };
        let deadline = Instant::now() + Duration::from_secs(u64::try_from(grace).unwrap_or(0));
        self.event(Some((&name, init)), Kind::Normal, "Killing", format!("Stopping container {name}"));
        if let Some(spec) = self.spec_of(&name, init)
            && let Some(hook) = spec.lifecycle.as_ref().and_then(|l| l.pre_stop.clone())
        {
            let left = deadline.saturating_duration_since(Instant::now());
            if let Err(message) = self.run_hook(i, &spec, &hook, left).await {
                self.event(Some((&name, init)), Kind::Warning, "FailedPreStopHook", message);
            }
        }
        let left = deadline.saturating_duration_since(Instant::now()).as_secs();
        let mut runtime = self.ctx.cri.runtime.clone();
        let request =
            cri::StopContainerRequest { container_id: id.clone(), timeout: i64::try_from(left).unwrap_or(0) };
        if let Err(status) = runtime.stop_container(request).await {
            tracing::warn!(pod = %self.key, container = %name, error = %status.message(), "stopping the container failed");
        }
    }

    /// Stops every running container, all at once, each within `grace`.
    pub(super) async fn stop_all(&mut self, grace: i64) {
        // Hooks run one container after another here, but within one deadline: the grace
        // period is the pod's, not each container's.
        let deadline = Instant::now() + Duration::from_secs(u64::try_from(grace).unwrap_or(0));
        let running: Vec<usize> =
            (0..self.containers.len()).filter(|&i| self.containers[i].running()).collect();
        for i in running {
            let left =
                i64::try_from(deadline.saturating_duration_since(Instant::now()).as_secs()).unwrap_or(0);
            self.stop_container(i, left).await;
        }
        self.refresh().await;
    }

    /// Reads every container's state back from the runtime.
    pub(super) async fn refresh(&mut self) {
        for i in 0..self.containers.len() {
            self.refresh_one(i).await;
        }
        if let Some(sandbox) = self.sandbox.as_mut() {
            let mut runtime = self.ctx.cri.runtime.clone();
            let request = cri::PodSandboxStatusRequest { pod_sandbox_id: sandbox.id.clone(), verbose: false };
            if let Ok(answer) = runtime.pod_sandbox_status(request).await {
                let ready = answer
                    .into_inner()
                    .status
                    .is_some_and(|s| s.state == cri::PodSandboxState::SandboxReady as i32);
                if sandbox.ready && !ready && !self.phase.terminal() {
                    tracing::warn!(pod = %self.key, sandbox = %sandbox.id, "sandbox stopped underneath the pod");
                }
                sandbox.ready = ready;
            }
        }
    }

    pub(super) async fn refresh_one(&mut self, i: usize) {
        let Some(id) = self.containers[i].id.clone() else { return };
        let mut runtime = self.ctx.cri.runtime.clone();
        let request = cri::ContainerStatusRequest { container_id: id, verbose: false };
        match runtime.container_status(request).await {
            Ok(answer) => {
                if let Some(status) = answer.into_inner().status {
                    let was_running = self.containers[i].running();
                    self.containers[i].apply(&status);
                    if was_running && !self.containers[i].running() {
                        let name = self.containers[i].name.clone();
                        self.stop_probes_of(&name);
                    }
                }
            }
            Err(status) if status.code() == tonic::Code::NotFound => {
                // Removed underneath us (with its sandbox): it no longer runs. The id stays, so
                // that the next container counts as a restart.
                let c = &mut self.containers[i];
                if c.running() {
                    c.wait("ContainerCreating", "the runtime lost the container");
                }
            }
            Err(status) => {
                tracing::warn!(pod = %self.key, error = %status.message(), "container status failed")
            }
        }
    }

    /// Takes over what a previous kubelet left: the newest ready sandbox and, per container,
    /// its newest runtime container. Nothing that runs is stopped.
    pub(super) async fn adopt(&mut self, adopted: super::Adopted) {
        let Some(sandbox) =
            adopted.sandboxes.iter().find(|s| s.state == cri::PodSandboxState::SandboxReady as i32)
        else {
            return;
        };
        let mut runtime = self.ctx.cri.runtime.clone();
        let request = cri::PodSandboxStatusRequest { pod_sandbox_id: sandbox.id.clone(), verbose: false };
        let Ok(status) = runtime.pod_sandbox_status(request).await else { return };
        let Some(status) = status.into_inner().status else { return };
        let attempt = status.metadata.as_ref().map_or(0, |m| m.attempt);
        let Ok((config, _)) =
            crate::spec::sandbox_config(&self.pod, attempt, &self.ctx.dns, &self.ctx.logs_dir)
        else {
            return;
        };
        let ips = sandbox_ips(&self.ctx.cri, &sandbox.id).await;
        self.sandbox = Some(Sandbox { id: sandbox.id.clone(), config, ips, ready: true });
        self.sandbox_attempt = attempt + 1;
        for i in 0..self.containers.len() {
            let name = self.containers[i].name.clone();
            let newest = adopted
                .containers
                .iter()
                .filter(|c| {
                    c.pod_sandbox_id == sandbox.id && c.metadata.as_ref().is_some_and(|m| m.name == name)
                })
                .max_by_key(|c| (c.metadata.as_ref().map_or(0, |m| m.attempt), c.created_at));
            if let Some(found) = newest {
                let c = &mut self.containers[i];
                c.id = Some(found.id.clone());
                c.attempt = found.metadata.as_ref().map_or(0, |m| m.attempt);
                c.restart_count = c.restart_count.max(c.attempt);
                // The back-off starts afresh with a restarted kubelet.
                c.restart_backoff = Backoff::default();
                self.refresh_one(i).await;
            }
        }
        // Readiness is unknown until the probes say; containers without probes are ready.
        for i in 0..self.containers.len() {
            if self.containers[i].running() {
                let name = self.containers[i].name.clone();
                let spec = self.spec_of(&name, self.containers[i].init);
                let c = &mut self.containers[i];
                c.started = spec.as_ref().is_none_or(|s| s.startup_probe.is_none());
                c.ready = spec.as_ref().is_none_or(|s| s.readiness_probe.is_none());
                self.start_probes(i, !self.containers[i].started);
            }
        }
        let inits_done =
            self.containers.iter().filter(|c| c.init).all(|c| c.exit().is_some_and(|e| e.exit_code == 0));
        let mains_exist = self.containers.iter().any(|c| !c.init && c.id.is_some());
        self.initialized = self.initialized || inits_done || mains_exist;
        if let Ok(req) = super::admission::requests(&self.pod) {
            super::lock(&self.ctx.admitted).adopt(&self.uid, req);
            self.admitted = true;
        }
        tracing::info!(pod = %self.key, sandbox = %sandbox.id, "adopted the running pod");
    }
}

/// The sandbox's addresses, primary first.
async fn sandbox_ips(cri: &crate::cri::Cri, id: &str) -> Vec<String> {
    let mut runtime = cri.runtime.clone();
    let request = cri::PodSandboxStatusRequest { pod_sandbox_id: id.to_owned(), verbose: false };
    let Ok(answer) = runtime.pod_sandbox_status(request).await else { return Vec::new() };
    let Some(network) = answer.into_inner().status.and_then(|s| s.network) else { return Vec::new() };
    std::iter::once(network.ip)
        .chain(network.additional_ips.into_iter().map(|ip| ip.ip))
        .filter(|ip| !ip.is_empty())
        .collect()
}
