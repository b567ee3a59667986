//! Exits reported by a sandbox's hpk-pause, applied to the containers they belong to.

use std::sync::Arc;

use k8s_cri::v1 as cri;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::UnixStream;
use tracing::{debug, info, warn};

use super::{Runtime, now_nanos};
use crate::pause::Event;

/// One exit as the pause reports it: the PID in the sandbox and how it ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Exit {
    pub(crate) pid: i32,
    /// Exit status as a shell reports it: the code, or 128 + the signal.
    pub(crate) status: i32,
}

/// Parses one event line; `None` for lines that are not exits (readiness, garbage).
pub(crate) fn parse_exit(line: &str) -> Option<Exit> {
    match Event::from_line(line).ok()? {
        Event::Exit(exit) => {
            let status = exit.exit_code.or(exit.signal.map(|s| 128 + s))?;
            Some(Exit { pid: exit.pid, status })
        }
        Event::Ready { .. } => None,
    }
}

/// The number of queued exits a ready line announces; `None` for other lines.
pub(crate) fn parse_ready(line: &str) -> Option<usize> {
    match Event::from_line(line).ok()? {
        Event::Ready { queued, .. } => Some(queued),
        Event::Exit(_) => None,
    }
}

/// Reads the pause's events until it disconnects (the sandbox stopped), then marks the sandbox
/// not ready and its still-running containers exited.
pub(crate) async fn watch(runtime: Arc<Runtime>, sandbox_id: String, stream: BufReader<UnixStream>) {
    let mut lines = stream.lines();
    loop {
        match lines.next_line().await {
            Ok(Some(line)) => {
                if let Some(exit) = parse_exit(&line) {
                    apply(&runtime, &sandbox_id, exit).await;
                } else {
                    debug!(sandbox = %sandbox_id, line, "pause event");
                }
            }
            Ok(None) => break,
            Err(e) => {
                warn!(sandbox = %sandbox_id, error = %e, "reading pause events failed");
                break;
            }
        }
    }
    sandbox_gone(&runtime, &sandbox_id, "the sandbox stopped").await;
}

/// The sandbox's pause is gone: the sandbox is not ready, and its running containers were
/// killed with it (a PID namespace dies with its init).
pub(crate) async fn sandbox_gone(runtime: &Runtime, sandbox_id: &str, why: &str) {
    let mut state = runtime.state.lock().await;
    let was_ready = match state.sandboxes.get_mut(sandbox_id) {
        Some(sandbox) if sandbox.ready => {
            sandbox.ready = false;
            sandbox.save(&runtime.sandbox_dir(sandbox_id));
            true
        }
        _ => false,
    };
    let mut stopped = Vec::new();
    for container in state.containers.values_mut().filter(|c| c.sandbox_id == sandbox_id) {
        if container.state == cri::ContainerState::ContainerRunning {
            mark_exited(container, 137, why);
            stopped.push(container.id.clone());
        }
    }
    for id in &stopped {
        runtime.emit(&state, id, cri::ContainerEventType::ContainerStoppedEvent);
    }
    if was_ready {
        runtime.emit(&state, sandbox_id, cri::ContainerEventType::ContainerStoppedEvent);
        info!(sandbox = %sandbox_id, "sandbox stopped");
    }
}

pub(crate) async fn apply(runtime: &Runtime, sandbox_id: &str, exit: Exit) {
    let mut state = runtime.state.lock().await;
    let owner = state
        .containers
        .values_mut()
        .find(|c| c.sandbox_id == sandbox_id && c.sandbox_pid == Some(exit.pid) && c.finished_at == 0);
    match owner {
        Some(container) => {
            let (id, shim) = (container.id.clone(), container.shim_pid);
            // The last of its output may still be in the pipe, on its way through the shim:
            // the exit is recorded once the shim has put it in the log and ended, so that a
            // log read on the exit has all of it (as containerd waits for a task's I/O).
            if let Some(shim) = shim {
                drop(state);
                wait_for_shim(shim, &id).await;
                state = runtime.state.lock().await;
            }
            // Stopped otherwise (its sandbox gone) or removed while the shim finished.
            let Some(container) = state.containers.get_mut(&id).filter(|c| c.finished_at == 0) else {
                return;
            };
            info!(container = %id, status = exit.status, "container exited");
            mark_exited(container, exit.status, "");
            runtime.emit(&state, &id, cri::ContainerEventType::ContainerStoppedEvent);
        }
        // Not (yet) known as a container's init: a process the container left behind, or an
        // init whose start is still being recorded; start_container looks here.
        None => {
            if let Some(sandbox) = state.sandboxes.get_mut(sandbox_id) {
                match sandbox.exit_waiters.remove(&exit.pid) {
                    Some(waiter) => {
                        let _ = waiter.send(exit.status);
                    }
                    None => {
                        sandbox.unclaimed_exits.insert(exit.pid, exit.status);
                    }
                }
            }
        }
    }
}

/// The longest an exit waits for its container's log shim: a process the container left
/// running in the sandbox may hold the output open, and the shim with it.
const SHIM_DRAIN: std::time::Duration = std::time::Duration::from_secs(2);

/// Waits until process `pid`, the shim of container `id`, has ended (or is a zombie, whose
/// command line reads empty), for at most [`SHIM_DRAIN`].
pub(crate) async fn wait_for_shim(pid: u32, id: &str) {
    let started = tokio::time::Instant::now();
    while crate::logshim::is_shim_of(pid, id) {
        if started.elapsed() >= SHIM_DRAIN {
            debug!(container = %id, shim = pid, "the shim still runs; recording the exit");
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
}

/// Records an exit: state, code, time, reason, and wakes whoever waits for it.
pub(crate) fn mark_exited(container: &mut super::Container, status: i32, message: &str) {
    container.state = cri::ContainerState::ContainerExited;
    container.exit_code = status;
    container.finished_at = now_nanos();
    container.reason = if status == 0 { "Completed".into() } else { "Error".into() };
    if !message.is_empty() {
        container.reason = format!("{}: {message}", container.reason);
    }
    container.exited.send_replace(true);
    container.save();
}

impl Runtime {
    /// Tells GetContainerEvents subscribers that `id` (a container, or a sandbox whose own
    /// lifecycle changed) had event `kind`, with the sandbox's status and its containers'.
    pub(crate) fn emit(&self, state: &super::State, id: &str, kind: cri::ContainerEventType) {
        if self.events.receiver_count() == 0 {
            return;
        }
        let sandbox_id = match state.containers.get(id) {
            Some(c) => c.sandbox_id.as_str(),
            None => id,
        };
        let event = cri::ContainerEventResponse {
            container_id: id.to_owned(),
            container_event_type: kind as i32,
            created_at: now_nanos(),
            pod_sandbox_status: state.sandboxes.get(sandbox_id).map(super::Sandbox::status),
            containers_statuses: state
                .containers
                .values()
                .filter(|c| c.sandbox_id == sandbox_id)
                .map(super::Container::status)
                .collect(),
        };
        let _ = self.events.send(event);
    }

    /// A stream of every container and sandbox event from now on.
    pub fn subscribe_events(&self) -> tokio::sync::broadcast::Receiver<cri::ContainerEventResponse> {
        self.events.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exits_carry_codes_or_signals() {
        assert_eq!(parse_exit(r#"{"pid":7,"exit_code":3,"signal":null}"#), Some(Exit { pid: 7, status: 3 }));
        assert_eq!(
            parse_exit(r#"{"pid":7,"exit_code":null,"signal":9}"#),
            Some(Exit { pid: 7, status: 137 })
        );
        assert_eq!(parse_exit(r#"{"ready":true,"pid":1}"#), None);
        assert_eq!(parse_exit("not json"), None);
    }
}
