//! The pod's status as the kubelet reports it: phase, conditions, addresses and container
//! statuses, computed from what the worker knows (a pure function, tested below).

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting, ContainerStatus,
    HostIP, Pod, PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::record::{ContainerRecord, Exit, State};

/// The pod's lifecycle phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Not every container has started yet.
    Pending,
    /// Initialized, and some container runs or will run again.
    Running,
    /// Every container ended with 0 and none restarts.
    Succeeded,
    /// Every container ended, one failed, none restarts (or the pod was rejected).
    Failed,
}

impl Phase {
    /// The API's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "Pending",
            Self::Running => "Running",
            Self::Succeeded => "Succeeded",
            Self::Failed => "Failed",
        }
    }

    /// Succeeded or Failed: nothing in the pod runs again.
    pub fn terminal(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed)
    }
}

/// What the status is computed from.
pub struct View<'a> {
    /// The phase.
    pub phase: Phase,
    /// A reason and message for the pod as a whole (a rejected pod: OutOfcpu …; one past its
    /// deadline: DeadlineExceeded).
    pub reason: Option<(String, String)>,
    /// The pod was rejected at admission and never had containers.
    pub rejected: bool,
    /// The sandbox runs with its network set up.
    pub sandbox_ready: bool,
    /// Every init container completed.
    pub initialized: bool,
    /// The pod's addresses, primary first.
    pub pod_ips: &'a [String],
    /// The node's address.
    pub host_ip: &'a str,
    /// When the kubelet accepted the pod.
    pub start_time: Option<Timestamp>,
    /// Every container, init containers first in spec order, then the others in spec order.
    pub containers: &'a [ContainerRecord],
    /// Why the node is not Ready, while it is not: the pod's readiness cannot be vouched for
    /// (a connector's runtime out of reach, say), so Ready is False, as the node lifecycle
    /// controller marks the pods of a node it lost.
    pub node_not_ready: Option<&'a str>,
    /// A resize the node cannot give now: `PodResizePending`'s reason (Infeasible, Deferred)
    /// and message.
    pub resize_pending: Option<&'a (String, String)>,
}

/// The runtime's container id as Kubernetes shows it.
pub fn container_id(id: &str) -> String {
    format!("hpk://{id}")
}

fn exit_state(exit: &Exit) -> ContainerState {
    ContainerState {
        terminated: Some(ContainerStateTerminated {
            exit_code: exit.exit_code,
            reason: Some(exit.reason.clone()),
            message: (!exit.message.is_empty()).then(|| exit.message.clone()),
            started_at: exit.started_at.map(Time),
            finished_at: exit.finished_at.map(Time),
            container_id: (!exit.container_id.is_empty()).then(|| container_id(&exit.container_id)),
            signal: None,
        }),
        ..ContainerState::default()
    }
}

fn container_status(c: &ContainerRecord) -> ContainerStatus {
    let state = match &c.state {
        State::Waiting { reason, message } => ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some(reason.clone()),
                message: (!message.is_empty()).then(|| message.clone()),
            }),
            ..ContainerState::default()
        },
        State::Running { started_at } => ContainerState {
            running: Some(ContainerStateRunning { started_at: Some(Time(*started_at)) }),
            ..ContainerState::default()
        },
        State::Terminated(exit) => exit_state(exit),
    };
    ContainerStatus {
        name: c.name.clone(),
        image: c.image.clone(),
        image_id: c.image_id.clone(),
        container_id: c.id.as_deref().map(container_id),
        // A completed init container counts as ready, as upstream shows it.
        ready: c.is_ready() || (c.init && !c.sidecar && c.exit().is_some_and(|e| e.exit_code == 0)),
        started: Some(c.running() && c.started),
        restart_count: i32::try_from(c.restart_count).unwrap_or(i32::MAX),
        state: Some(state),
        last_state: Some(c.last.as_ref().map(exit_state).unwrap_or_default()),
        resources: c.resources.clone(),
        // What was allocated to it: its requests at admission, a resize's since (upstream
        // reports them so since in-place resize; the resize specs compare them with the spec).
        allocated_resources: c.resources.as_ref().and_then(|r| r.requests.clone()),
        ..ContainerStatus::default()
    }
}

/// A condition, keeping the previous transition time when its status did not change.
fn condition(
    previous: &[PodCondition],
    kind: &str,
    ok: bool,
    reason: Option<&str>,
    message: Option<String>,
    now: Timestamp,
) -> PodCondition {
    let status = if ok { "True" } else { "False" };
    let since = previous
        .iter()
        .find(|c| c.type_ == kind && c.status == status)
        .and_then(|c| c.last_transition_time.clone())
        .unwrap_or(Time(now));
    PodCondition {
        type_: kind.to_owned(),
        status: status.to_owned(),
        reason: if ok { None } else { reason.map(str::to_owned) },
        message: if ok { None } else { message },
        last_transition_time: Some(since),
        ..PodCondition::default()
    }
}

/// The pod conditions the kubelet writes; any other (a readiness gate's, DisruptionTarget,
/// PodScheduled) is someone else's, kept as the API has it.
pub const OWNED_CONDITIONS: &[&str] =
    &["PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodResizePending"];

/// The status to report for `pod`. Conditions the kubelet does not own (PodScheduled,
/// DisruptionTarget, readiness gates' own) are kept from the pod's current status.
pub fn compute(pod: &Pod, view: &View<'_>, now: Timestamp) -> PodStatus {
    let previous = pod.status.as_ref().and_then(|s| s.conditions.clone()).unwrap_or_default();
    let mains: Vec<&ContainerRecord> = view.containers.iter().filter(|c| c.regular()).collect();
    // Sidecars count towards readiness, and are initialized once started.
    let unready: Vec<&str> = view
        .containers
        .iter()
        .filter(|c| (c.regular() || c.sidecar) && !c.is_ready())
        .map(|c| c.name.as_str())
        .collect();
    let incomplete: Vec<&str> = view
        .containers
        .iter()
        .filter(|c| {
            c.init
                && if c.sidecar {
                    !(c.running() && c.started)
                } else {
                    c.exit().is_none_or(|e| e.exit_code != 0)
                }
        })
        .map(|c| c.name.as_str())
        .collect();
    let terminal = view.phase.terminal();
    let (containers_ready, ready_reason) =
        if terminal { (false, "PodCompleted") } else { (unready.is_empty(), "ContainersNotReady") };
    let gates_ok = pod
        .spec
        .iter()
        .flat_map(|s| s.readiness_gates.iter().flatten())
        .all(|gate| previous.iter().any(|c| c.type_ == gate.condition_type && c.status == "True"));
    let unready_message = Some(format!("containers with unready status: [{}]", unready.join(" ")));
    let initialized = view.initialized || (terminal && incomplete.is_empty());
    let mut conditions = vec![
        condition(&previous, "PodReadyToStartContainers", view.sandbox_ready && !terminal, None, None, now),
        condition(
            &previous,
            "Initialized",
            initialized,
            Some("ContainersNotInitialized"),
            Some(format!("containers with incomplete status: [{}]", incomplete.join(" "))),
            now,
        ),
        match view.node_not_ready {
            Some(why) if !terminal => condition(
                &previous,
                "Ready",
                false,
                Some("NodeNotReady"),
                Some(format!("the node is not ready: {why}")),
                now,
            ),
            _ => condition(
                &previous,
                "Ready",
                containers_ready && gates_ok,
                Some(ready_reason),
                unready_message.clone(),
                now,
            ),
        },
        condition(&previous, "ContainersReady", containers_ready, Some(ready_reason), unready_message, now),
    ];
    if let Some((reason, message)) = view.resize_pending.filter(|_| !terminal) {
        // Present while pending, as upstream's (its status True).
        let mut pending =
            condition(&previous, "PodResizePending", false, Some(reason), Some(message.clone()), now);
        pending.status = "True".into();
        conditions.push(pending);
    }
    conditions.extend(previous.iter().filter(|c| !OWNED_CONDITIONS.contains(&c.type_.as_str())).cloned());
    let rejected = view.rejected;
    let pod_ips = view.pod_ips.iter().map(|ip| PodIP { ip: ip.clone() }).collect::<Vec<_>>();
    PodStatus {
        phase: Some(view.phase.as_str().to_owned()),
        reason: view.reason.as_ref().map(|(r, _)| r.clone()),
        message: view.reason.as_ref().map(|(_, m)| m.clone()),
        conditions: Some(conditions),
        host_ip: Some(view.host_ip.to_owned()),
        host_ips: Some(vec![HostIP { ip: view.host_ip.to_owned() }]),
        pod_ip: view.pod_ips.first().cloned(),
        pod_ips: (!pod_ips.is_empty()).then_some(pod_ips),
        start_time: view.start_time.map(Time),
        // A rejected pod never had containers (kubectl then shows its reason, e.g. OutOfcpu).
        init_container_statuses: (!rejected)
            .then(|| view.containers.iter().filter(|c| c.init).map(container_status).collect()),
        container_statuses: (!rejected).then(|| {
            mains
                .iter()
                .map(|c| {
                    let mut status = container_status(c);
                    // Not created yet behind init containers: PodInitializing, as upstream.
                    if !initialized
                        && let Some(waiting) = status.state.as_mut().and_then(|s| s.waiting.as_mut())
                        && waiting.reason.as_deref() == Some("ContainerCreating")
                    {
                        waiting.reason = Some("PodInitializing".into());
                    }
                    // A terminal pod past its init containers has no container waiting or
                    // running: one that never ran, or whose end was not seen, counts as failed,
                    // as upstream's status manager words it (TerminatePod).
                    if terminal
                        && initialized
                        && let Some(state) = status.state.as_mut()
                        && state.terminated.is_none()
                    {
                        *state = ContainerState {
                            terminated: Some(ContainerStateTerminated {
                                exit_code: 137,
                                reason: Some("ContainerStatusUnknown".into()),
                                message: Some(
                                    "The container could not be located when the pod was terminated".into(),
                                ),
                                ..ContainerStateTerminated::default()
                            }),
                            ..ContainerState::default()
                        };
                    }
                    status
                })
                .collect()
        }),
        ephemeral_container_statuses: Some(
            view.containers.iter().filter(|c| c.ephemeral).map(container_status).collect::<Vec<_>>(),
        )
        .filter(|statuses| !statuses.is_empty()),
        qos_class: pod.status.as_ref().and_then(|s| s.qos_class.clone()),
        // The generation of the spec this status answers (status.observedGeneration).
        observed_generation: pod.metadata.generation,
        ..PodStatus::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "default", "uid": "u"},
            "spec": {"containers": [{"name": "a", "image": "i"}]},
            "status": {"conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"},
                {"type": "Ready", "status": "False", "lastTransitionTime": "2026-01-01T00:00:01Z"}
            ]}
        }))
        .expect("pod")
    }

    fn find<'a>(status: &'a PodStatus, kind: &str) -> &'a PodCondition {
        status.conditions.as_ref().expect("conditions").iter().find(|c| c.type_ == kind).expect(kind)
    }

    /// One running, ready container and the view of its pod; `node_not_ready` as given.
    fn running(name: &str) -> ContainerRecord {
        let mut c = ContainerRecord::new(name, "i", false);
        c.id = Some("abc".into());
        c.state = State::Running { started_at: Timestamp::UNIX_EPOCH };
        c.ready = true;
        c.started = true;
        c
    }

    const IPS: [&str; 1] = ["10.244.1.5"];

    fn running_view<'a>(
        c: &'a ContainerRecord,
        ips: &'a [String],
        node_not_ready: Option<&'a str>,
    ) -> View<'a> {
        View {
            phase: Phase::Running,
            reason: None,
            rejected: false,
            sandbox_ready: true,
            initialized: true,
            pod_ips: ips,
            host_ip: "10.250.0.11",
            start_time: Some(Timestamp::UNIX_EPOCH),
            containers: std::slice::from_ref(c),
            node_not_ready,
            resize_pending: None,
        }
    }

    #[test]
    fn a_pending_resize_is_a_condition_and_the_given_resources_are_shown() {
        let mut c = running("a");
        c.resources =
            Some(serde_json::from_value(serde_json::json!({"requests": {"cpu": "100m"}})).expect("r"));
        let ips = ["10.244.0.5".to_owned()];
        let pending = ("Infeasible".to_owned(), "Node didn't have enough capacity: cpu".to_owned());
        let view = View { resize_pending: Some(&pending), ..running_view(&c, &ips, None) };
        let status = compute(&pod(), &view, Timestamp::now());
        let condition = find(&status, "PodResizePending");
        assert_eq!(
            (condition.status.as_str(), condition.reason.as_deref(), condition.message.as_deref()),
            ("True", Some("Infeasible"), Some(pending.1.as_str()))
        );
        let shown =
            status.container_statuses.clone().expect("statuses")[0].resources.clone().expect("resources");
        assert_eq!(shown.requests.expect("requests")["cpu"].0, "100m");
        let allocated = status.container_statuses.clone().expect("statuses")[0].allocated_resources.clone();
        assert_eq!(allocated.expect("allocatedResources")["cpu"].0, "100m", "the requests given");
        // Given (or given up): the condition goes.
        let mut with_it = pod();
        with_it.status = Some(status);
        let status = compute(&with_it, &running_view(&c, &ips, None), Timestamp::now());
        assert!(status.conditions.expect("conditions").iter().all(|c| c.type_ != "PodResizePending"));
    }

    #[test]
    fn running_ready_pod_reports_addresses_and_ready_conditions() {
        let c = running("a");
        let ips = IPS.map(str::to_owned);
        let view = running_view(&c, &ips, None);
        let now = Timestamp::now();
        let status = compute(&pod(), &view, now);
        assert_eq!(status.phase.as_deref(), Some("Running"));
        assert_eq!(status.pod_ip.as_deref(), Some("10.244.1.5"));
        assert_eq!(find(&status, "Ready").status, "True");
        assert_eq!(find(&status, "Ready").last_transition_time, Some(Time(now)), "changed from False");
        assert_eq!(
            find(&status, "PodScheduled").last_transition_time.as_ref().map(|t| t.0.to_string()),
            Some("2026-01-01T00:00:00Z".into()),
            "kept as the scheduler set it"
        );
        let cs = &status.container_statuses.as_ref().expect("statuses")[0];
        assert_eq!(cs.container_id.as_deref(), Some("hpk://abc"));
        assert!(cs.ready && cs.started == Some(true));
    }

    #[test]
    fn a_running_pod_on_a_node_that_is_not_ready_is_not_ready() {
        let c = running("web");
        let ips = IPS.map(str::to_owned);
        let view = running_view(&c, &ips, Some("Status failed: connection refused"));
        let status = compute(&pod(), &view, Timestamp::now());
        let ready = find(&status, "Ready");
        assert_eq!((ready.status.as_str(), ready.reason.as_deref()), ("False", Some("NodeNotReady")));
        assert!(ready.message.as_deref().unwrap_or_default().contains("connection refused"), "{ready:?}");
        assert_eq!(find(&status, "ContainersReady").status, "True", "the containers themselves are fine");
        assert_eq!(status.phase.as_deref(), Some("Running"));
    }

    #[test]
    fn failing_init_container_reports_not_initialized_with_its_exit() {
        let mut init = ContainerRecord::new("setup", "i", true);
        init.state = State::Terminated(Exit {
            exit_code: 1,
            reason: "Error".into(),
            message: String::new(),
            started_at: None,
            finished_at: None,
            container_id: "x".into(),
        });
        let main = ContainerRecord::new("a", "i", false);
        let records = [init, main];
        let view = View {
            phase: Phase::Failed,
            reason: None,
            rejected: false,
            sandbox_ready: false,
            initialized: false,
            pod_ips: &[],
            host_ip: "h",
            start_time: None,
            containers: &records,
            node_not_ready: None,
            resize_pending: None,
        };
        let status = compute(&pod(), &view, Timestamp::now());
        let init = find(&status, "Initialized");
        assert_eq!(
            (init.status.as_str(), init.reason.as_deref()),
            ("False", Some("ContainersNotInitialized"))
        );
        assert_eq!(init.message.as_deref(), Some("containers with incomplete status: [setup]"));
        let s = &status.init_container_statuses.as_ref().expect("init")[0];
        let t = s.state.as_ref().and_then(|s| s.terminated.as_ref()).expect("terminated");
        assert_eq!((t.exit_code, t.reason.as_deref()), (1, Some("Error")));
        assert!(!status.container_statuses.as_ref().expect("mains")[0].ready);
        // Behind a failed init container, the app container never left PodInitializing; the
        // failed init container is not ready.
        let waiting = status.container_statuses.as_ref().expect("mains")[0].state.clone().expect("state");
        assert_eq!(waiting.waiting.and_then(|w| w.reason).as_deref(), Some("PodInitializing"));
        assert!(!s.ready);
    }

    #[test]
    fn a_container_is_not_ready_before_its_startup_probe_passed() {
        let mut main = running("a");
        main.started = false;
        let records = [main];
        let ips = IPS.map(str::to_owned);
        let view = View { containers: &records, ..running_view(&records[0], &ips, None) };
        let status = compute(&pod(), &view, Timestamp::now());
        let c = &status.container_statuses.as_ref().expect("statuses")[0];
        assert_eq!((c.ready, c.started), (false, Some(false)));
        assert_eq!(find(&status, "Ready").status, "False");
    }

    #[test]
    fn a_completed_init_container_is_ready_and_the_generation_is_observed() {
        let mut init = ContainerRecord::new("setup", "i", true);
        init.state = State::Terminated(Exit {
            exit_code: 0,
            reason: "Completed".into(),
            message: String::new(),
            started_at: None,
            finished_at: None,
            container_id: "x".into(),
        });
        let main = running("a");
        let records = [init, main];
        let ips = IPS.map(str::to_owned);
        let view = View { containers: &records, ..running_view(&records[1], &ips, None) };
        let mut p = pod();
        p.metadata.generation = Some(3);
        let status = compute(&p, &view, Timestamp::now());
        assert!(status.init_container_statuses.as_ref().expect("init")[0].ready);
        assert_eq!(status.observed_generation, Some(3));
    }

    #[test]
    fn a_terminal_pod_shows_no_container_waiting_or_running() {
        // The deadline passed before the container ran (a loaded machine), and one whose stop
        // was not seen: both terminated, ContainerStatusUnknown, as upstream's TerminatePod.
        let mut never = ContainerRecord::new("a", "i", false);
        never.wait("ContainerCreating", "");
        let ips = ["10.244.0.5".to_owned()];
        for c in [never, running("a")] {
            let reason = Some(("DeadlineExceeded".to_owned(), "past the deadline".to_owned()));
            let view = View { phase: Phase::Failed, reason, ..running_view(&c, &ips, None) };
            let status = compute(&pod(), &view, Timestamp::now());
            let state = status.container_statuses.expect("statuses")[0].state.clone().expect("state");
            let ended = state.terminated.expect("terminated");
            assert_eq!((ended.exit_code, ended.reason.as_deref()), (137, Some("ContainerStatusUnknown")));
            assert!(state.waiting.is_none() && state.running.is_none());
        }
        // Not terminal: as it is.
        let c = running("a");
        let status = compute(&pod(), &running_view(&c, &ips, None), Timestamp::now());
        assert!(
            status.container_statuses.expect("statuses")[0].state.clone().expect("state").running.is_some()
        );
    }
}
