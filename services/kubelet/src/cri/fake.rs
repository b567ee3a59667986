//! A recording fake of the runtime for unit tests: sandboxes and containers in memory, every
//! call logged, and any call made to fail on demand.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use k8s_cri::v1 as cri;

use super::{CriCall, CriClient, CriError, CriEvents, CriFailure, CriFuture};

/// What the fake runtime holds.
#[derive(Debug, Default)]
pub struct FakeState {
    /// Every call, in order: the call and the id or name it concerned.
    pub calls: Vec<(CriCall, String)>,
    /// Sandboxes by id: their config and whether they are ready.
    pub sandboxes: BTreeMap<String, (cri::PodSandboxConfig, bool)>,
    /// Containers by id: sandbox, name, attempt and state.
    pub containers: BTreeMap<String, (String, String, u32, cri::ContainerState)>,
    /// Images present.
    pub images: Vec<String>,
    /// Calls that fail, and how.
    pub failing: HashMap<CriCall, CriFailure>,
    next: u32,
}

/// The fake runtime.
#[derive(Debug, Default)]
pub struct FakeCri {
    /// Its state, for tests to set up and inspect.
    pub state: Mutex<FakeState>,
}

impl FakeCri {
    /// Makes every later `call` fail with `failure`.
    pub fn fail(&self, call: CriCall, failure: CriFailure) {
        self.lock().failing.insert(call, failure);
    }

    /// Lets `call` succeed again.
    pub fn heal(&self, call: CriCall) {
        self.lock().failing.remove(&call);
    }

    /// The calls made so far.
    pub fn calls(&self) -> Vec<CriCall> {
        self.lock().calls.iter().map(|(c, _)| *c).collect()
    }

    /// Locks the state.
    pub fn lock(&self) -> std::sync::MutexGuard<'_, FakeState> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records `call` on `what` and runs `then` on the state unless the call is set to fail.
    fn record<T: Send + 'static>(
        &self,
        call: CriCall,
        what: &str,
        then: impl FnOnce(&mut FakeState) -> Result<T, CriFailure>,
    ) -> CriFuture<'_, T> {
        let mut state = self.lock();
        state.calls.push((call, what.to_owned()));
        let result = match state.failing.get(&call) {
            Some(failure) => Err(CriError::new(call, *failure, format!("fake {call:?} failed"))),
            None => then(&mut state).map_err(|f| CriError::new(call, f, format!("{what} not found"))),
        };
        Box::pin(std::future::ready(result))
    }
}

impl FakeState {
    fn id(&mut self, prefix: &str) -> String {
        self.next += 1;
        format!("{prefix}{}", self.next)
    }
}

impl CriClient for FakeCri {
    fn run_pod_sandbox(&self, config: cri::PodSandboxConfig) -> CriFuture<'_, String> {
        let name = config.metadata.as_ref().map(|m| m.name.clone()).unwrap_or_default();
        self.record(CriCall::RunPodSandbox, &name, |s| {
            let id = s.id("sandbox-");
            s.sandboxes.insert(id.clone(), (config, true));
            Ok(id)
        })
    }

    fn stop_pod_sandbox(&self, id: &str) -> CriFuture<'_, ()> {
        self.record(CriCall::StopPodSandbox, id, |s| {
            if let Some(sandbox) = s.sandboxes.get_mut(id) {
                sandbox.1 = false;
            }
            for c in s.containers.values_mut().filter(|c| c.0 == id) {
                c.3 = cri::ContainerState::ContainerExited;
            }
            Ok(())
        })
    }

    fn remove_pod_sandbox(&self, id: &str) -> CriFuture<'_, ()> {
        self.record(CriCall::RemovePodSandbox, id, |s| {
            s.sandboxes.remove(id);
            s.containers.retain(|_, c| c.0 != id);
            Ok(())
        })
    }

    fn pod_sandbox_status(&self, id: &str) -> CriFuture<'_, Option<cri::PodSandboxStatus>> {
        self.record(CriCall::PodSandboxStatus, id, |s| {
            let (config, ready) = s.sandboxes.get(id).ok_or(CriFailure::NotFound)?;
            let state = if *ready {
                cri::PodSandboxState::SandboxReady
            } else {
                cri::PodSandboxState::SandboxNotready
            };
            Ok(Some(cri::PodSandboxStatus {
                id: id.to_owned(),
                metadata: config.metadata.clone(),
                state: state as i32,
                network: Some(cri::PodSandboxNetworkStatus { ip: "10.0.0.2".into(), ..Default::default() }),
                ..Default::default()
            }))
        })
    }

    fn list_pod_sandbox(&self) -> CriFuture<'_, Vec<cri::PodSandbox>> {
        self.record(CriCall::ListPodSandbox, "", |s| {
            Ok(s.sandboxes
                .iter()
                .map(|(id, (config, ready))| cri::PodSandbox {
                    id: id.clone(),
                    metadata: config.metadata.clone(),
                    state: if *ready { 0 } else { 1 },
                    ..Default::default()
                })
                .collect())
        })
    }

    fn create_container(
        &self,
        sandbox_id: &str,
        config: cri::ContainerConfig,
        _sandbox_config: Option<cri::PodSandboxConfig>,
    ) -> CriFuture<'_, String> {
        let (name, attempt) =
            config.metadata.as_ref().map(|m| (m.name.clone(), m.attempt)).unwrap_or_default();
        self.record(CriCall::CreateContainer, &name, |s| {
            if !s.sandboxes.contains_key(sandbox_id) {
                return Err(CriFailure::NotFound);
            }
            let id = s.id("container-");
            s.containers.insert(
                id.clone(),
                (sandbox_id.to_owned(), name.clone(), attempt, cri::ContainerState::ContainerCreated),
            );
            Ok(id)
        })
    }

    fn start_container(&self, id: &str) -> CriFuture<'_, ()> {
        self.record(CriCall::StartContainer, id, |s| {
            let c = s.containers.get_mut(id).ok_or(CriFailure::NotFound)?;
            c.3 = cri::ContainerState::ContainerRunning;
            Ok(())
        })
    }

    fn stop_container(&self, id: &str, _timeout: i64) -> CriFuture<'_, ()> {
        self.record(CriCall::StopContainer, id, |s| {
            let c = s.containers.get_mut(id).ok_or(CriFailure::NotFound)?;
            c.3 = cri::ContainerState::ContainerExited;
            Ok(())
        })
    }

    fn remove_container(&self, id: &str) -> CriFuture<'_, ()> {
        self.record(CriCall::RemoveContainer, id, |s| {
            s.containers.remove(id).map(|_| ()).ok_or(CriFailure::NotFound)
        })
    }

    fn container_status(&self, id: &str) -> CriFuture<'_, Option<cri::ContainerStatus>> {
        self.record(CriCall::ContainerStatus, id, |s| {
            let (_, name, attempt, state) = s.containers.get(id).ok_or(CriFailure::NotFound)?;
            let exited = *state == cri::ContainerState::ContainerExited;
            Ok(Some(cri::ContainerStatus {
                id: id.to_owned(),
                metadata: Some(cri::ContainerMetadata { name: name.clone(), attempt: *attempt }),
                state: *state as i32,
                started_at: 1_000_000_000,
                finished_at: if exited { 2_000_000_000 } else { 0 },
                exit_code: if exited { 137 } else { 0 },
                reason: if exited { "Error".into() } else { String::new() },
                ..Default::default()
            }))
        })
    }

    fn list_containers(&self) -> CriFuture<'_, Vec<cri::Container>> {
        self.record(CriCall::ListContainers, "", |s| {
            Ok(s.containers
                .iter()
                .map(|(id, (sandbox, name, attempt, state))| cri::Container {
                    id: id.clone(),
                    pod_sandbox_id: sandbox.clone(),
                    metadata: Some(cri::ContainerMetadata { name: name.clone(), attempt: *attempt }),
                    state: *state as i32,
                    ..Default::default()
                })
                .collect())
        })
    }

    fn exec_sync(
        &self,
        id: &str,
        _cmd: Vec<String>,
        _timeout: Duration,
    ) -> CriFuture<'_, cri::ExecSyncResponse> {
        self.record(CriCall::ExecSync, id, |s| {
            s.containers.get(id).ok_or(CriFailure::NotFound)?;
            Ok(cri::ExecSyncResponse::default())
        })
    }

    fn image_status(&self, image: cri::ImageSpec) -> CriFuture<'_, Option<cri::Image>> {
        let name = image.image.clone();
        self.record(CriCall::ImageStatus, &name, |s| {
            Ok(s.images
                .contains(&name)
                .then(|| cri::Image { id: format!("sha256:{name}"), ..Default::default() }))
        })
    }

    fn pull_image(&self, image: cri::ImageSpec, _auth: Option<cri::AuthConfig>) -> CriFuture<'_, String> {
        let name = image.image.clone();
        self.record(CriCall::PullImage, &name, |s| {
            s.images.push(name.clone());
            Ok(format!("sha256:{name}"))
        })
    }

    fn container_events(&self) -> CriFuture<'_, CriEvents> {
        // No events: the tests wake the worker themselves.
        self.record(CriCall::GetContainerEvents, "", |_| {
            Ok(Box::pin(futures_util::stream::pending()) as CriEvents)
        })
    }
}
