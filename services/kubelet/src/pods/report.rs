//! The pod's status pushed to the API when it changed, and its summary for the diagnostics.

use hpk_proto::kubelet::v1 as diag;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use tokio::time::Instant;

use super::error::RETRY;
use super::lock;
use super::record::State;
use super::status;
use super::worker::{Step, Worker};

/// How soon a status patch refused for a conflict is tried again when the watch has not
/// brought the newer pod by then.
const CONFLICT_RETRY: std::time::Duration = std::time::Duration::from_millis(500);

impl Worker {
    /// Pushes the status when it changed (times aside); keeps the diagnostics summary current.
    pub(super) async fn report(&mut self) {
        self.summarize();
        if self.state.step == Step::Terminated || (self.state.deleted && self.state.step == Step::Terminating)
        {
            return;
        }
        let mut pod = (*self.pod).clone();
        if !self.last_conditions.is_empty() {
            // Our own last conditions, until the watch brings them back.
            let status = pod.status.get_or_insert_default();
            let mut conditions = status.conditions.clone().unwrap_or_default();
            for ours in &self.last_conditions {
                conditions.retain(|c| c.type_ != ours.type_);
                conditions.push(ours.clone());
            }
            status.conditions = Some(conditions);
        }
        let ips = self.state.sandbox.as_ref().map(|s| s.ips.clone()).unwrap_or_default();
        let node = self.ctx.node.borrow().clone();
        let view = status::View {
            phase: self.state.phase,
            reason: self.state.reason.clone(),
            rejected: self.state.rejected,
            sandbox_ready: self.state.sandbox.as_ref().is_some_and(|s| s.ready),
            initialized: self.state.initialized,
            pod_ips: &ips,
            host_ip: &self.ctx.host_ip,
            start_time: self.state.start_time,
            containers: &self.state.containers,
            node_not_ready: (!node.ready).then_some(node.message.as_str()),
            resize_pending: self.state.resize_pending.as_ref(),
        };
        let computed = status::compute(&pod, &view, Timestamp::now());
        let comparable = serde_json::to_value(&computed).unwrap_or_default();
        if self.reported.as_ref() == Some(&comparable) {
            return;
        }
        let pods: Api<Pod> = Api::namespaced(self.ctx.client.clone(), self.namespace());
        // A merge patch replaces the conditions list whole: made against the pod this status
        // was computed from, so that a condition someone else wrote meanwhile (a readiness
        // gate's) is never dropped. A conflict waits for the watch's newer pod.
        let mut patch = serde_json::json!({ "status": computed });
        if let Some(version) = pod.metadata.resource_version.as_deref() {
            patch["metadata"] = serde_json::json!({ "resourceVersion": version });
        }
        match pods.patch_status(self.name(), &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(updated) => {
                // Only the kubelet's own: the others were copied from the pod, and are for
                // their writers to change.
                self.last_conditions = computed
                    .conditions
                    .iter()
                    .flatten()
                    .filter(|c| status::OWNED_CONDITIONS.contains(&c.type_.as_str()))
                    .cloned()
                    .collect();
                self.reported = Some(comparable);
                // The pod as it now is, so that the next patch is made against it.
                self.pod = std::sync::Arc::new(updated);
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {
                tracing::debug!(pod = %self.key, "the pod changed underneath its status; waiting for the newer pod");
                self.wake_at(Instant::now() + CONFLICT_RETRY);
            }
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(error) => {
                tracing::warn!(pod = %self.key, %error, "status update failed; retrying");
                self.wake_at(Instant::now() + RETRY);
            }
        }
    }

    fn summarize(&self) {
        let summary = diag::PodSummary {
            namespace: self.namespace().to_owned(),
            name: self.name().to_owned(),
            uid: self.uid.clone(),
            state: format!("{:?}", self.state.step),
            phase: self.state.phase.as_str().to_owned(),
            sandbox_id: self.state.sandbox.as_ref().map(|s| s.id.clone()).unwrap_or_default(),
            pod_ip: self.state.sandbox.as_ref().and_then(|s| s.ips.first().cloned()).unwrap_or_default(),
            containers: self
                .state
                .containers
                .iter()
                .map(|c| {
                    let (state, reason) = match &c.state {
                        State::Waiting { reason, .. } => ("waiting", reason.clone()),
                        State::Running { .. } => ("running", String::new()),
                        State::Terminated(e) => ("terminated", e.reason.clone()),
                    };
                    diag::ContainerSummary {
                        name: c.name.clone(),
                        init: c.init,
                        id: c.id.clone().unwrap_or_default(),
                        state: state.into(),
                        reason,
                        restart_count: c.restart_count,
                        ready: c.is_ready(),
                    }
                })
                .collect(),
            message: self.state.message.clone(),
        };
        lock(&self.ctx.summaries).insert(self.uid.clone(), summary);
    }
}
