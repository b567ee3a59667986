//! Unit tests of `plan`: the pod's next steps from its spec and state alone.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use serde_json::json;
use tokio::time::Instant;

use super::*;
use crate::pods::record::Exit;

fn pod(spec: serde_json::Value) -> Pod {
    serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "ns", "uid": "u1"}, "spec": spec}))
        .expect("a pod")
}

fn two_inits(policy: &str) -> Pod {
    pod(json!({
        "restartPolicy": policy,
        "initContainers": [{"name": "i0", "image": "busybox"}, {"name": "i1", "image": "busybox"}],
        "containers": [{"name": "app", "image": "busybox"}],
        "terminationGracePeriodSeconds": 12
    }))
}

fn one_container(policy: &str) -> Pod {
    pod(json!({"restartPolicy": policy, "containers": [{"name": "app", "image": "busybox"}]}))
}

/// Admitted, volumes fresh at `now`, the sandbox running.
fn ready_state(pod: &Pod, now: Instant) -> PodState {
    let mut state = PodState::new(pod);
    state.admitted = true;
    state.volumes_refreshed = Some(now);
    state.sandbox = Some(Sandbox { id: "s1".into(), config: Default::default(), ips: vec![], ready: true });
    state
}

fn run(c: &mut ContainerRecord) {
    c.id = Some(format!("{}-id", c.name));
    c.state = State::Running { started_at: Timestamp::UNIX_EPOCH };
}

/// Container `c` exited with `code` after running `ran`.
fn exit(c: &mut ContainerRecord, code: i32, ran: Duration) {
    c.id = Some(format!("{}-id", c.name));
    let started = Timestamp::UNIX_EPOCH;
    let finished = started + jiff_span(ran);
    c.state = State::Terminated(Exit {
        exit_code: code,
        reason: if code == 0 { "Completed" } else { "Error" }.into(),
        message: String::new(),
        started_at: Some(started),
        finished_at: Some(finished),
        container_id: format!("{}-id", c.name),
    });
}

fn jiff_span(d: Duration) -> k8s_openapi::jiff::SignedDuration {
    k8s_openapi::jiff::SignedDuration::try_from(d).expect("fits")
}

/// The actions that do something (no timers, no step markers).
fn doing(actions: &[Action]) -> Vec<Action> {
    actions.iter().filter(|a| !matches!(a, Action::WakeAt(_) | Action::Enter(_))).cloned().collect()
}

#[test]
fn a_new_pod_is_admitted_then_gets_volumes_then_a_sandbox() {
    let pod = one_container("Always");
    let now = Instant::now();
    let mut state = PodState::new(&pod);
    assert_eq!(plan(&pod, &state, now), [Action::Admit]);
    state.admitted = true;
    assert_eq!(plan(&pod, &state, now), [Action::PrepareVolumes]);
    state.volumes_refreshed = Some(now);
    assert_eq!(plan(&pod, &state, now), [Action::WakeAt(now + VOLUME_REFRESH), Action::CreateSandbox]);
    // Volumes are re-read when due.
    assert_eq!(plan(&pod, &state, now + VOLUME_REFRESH), [Action::RefreshVolumes]);
}

#[test]
fn a_failed_sandbox_waits_for_its_back_off_and_a_dead_one_is_replaced() {
    let pod = one_container("Always");
    let now = Instant::now();
    let mut state = ready_state(&pod, now);
    state.sandbox = None;
    state.sandbox_backoff.fail(now);
    let until = now + crate::pods::backoff::INITIAL;
    assert_eq!(plan(&pod, &state, now), [Action::WakeAt(now + VOLUME_REFRESH), Action::WakeAt(until)]);
    assert_eq!(doing(&plan(&pod, &state, until)), [Action::CreateSandbox]);
    state.sandbox = Some(Sandbox { id: "s1".into(), config: Default::default(), ips: vec![], ready: false });
    assert_eq!(doing(&plan(&pod, &state, now)), [Action::ReplaceSandbox]);
}

#[test]
fn init_containers_run_one_at_a_time_in_order() {
    let pod = two_inits("Always");
    let now = Instant::now();
    let mut state = ready_state(&pod, now);
    assert!(!state.initialized);
    let actions = plan(&pod, &state, now);
    assert!(actions.contains(&Action::Enter(Step::Initializing)));
    assert_eq!(doing(&actions), [Action::Start(0)]);
    run(&mut state.containers[0]);
    assert_eq!(doing(&plan(&pod, &state, now)), [], "the second waits while the first runs");
    exit(&mut state.containers[0], 0, Duration::from_secs(1));
    assert_eq!(doing(&plan(&pod, &state, now)), [Action::Start(1)]);
    exit(&mut state.containers[1], 0, Duration::from_secs(1));
    assert_eq!(doing(&plan(&pod, &state, now)), [Action::InitDone]);
    state.initialized = true;
    let actions = plan(&pod, &state, now);
    assert!(actions.contains(&Action::Enter(Step::Running)));
    assert_eq!(doing(&actions), [Action::Start(2)], "the containers start only now");
}

#[test]
fn a_failed_init_container_fails_the_pod_under_never_and_restarts_otherwise() {
    let now = Instant::now();
    let never = two_inits("Never");
    let mut state = ready_state(&never, now);
    exit(&mut state.containers[0], 1, Duration::from_secs(1));
    assert_eq!(doing(&plan(&never, &state, now)), [Action::Complete { phase: Some(Phase::Failed) }]);
    let always = two_inits("Always");
    let mut state = ready_state(&always, now);
    exit(&mut state.containers[0], 1, Duration::from_secs(1));
    assert_eq!(doing(&plan(&always, &state, now)), [Action::Restart { index: 0, reset_backoff: false }]);
}

#[test]
fn crash_loop_back_off_waits_ten_seconds_then_doubles() {
    let pod = one_container("Always");
    let t0 = Instant::now();
    let mut state = ready_state(&pod, t0);
    state.initialized = true;
    // The first exit restarts at once.
    exit(&mut state.containers[0], 1, Duration::from_secs(1));
    state.containers[0].restart_count = 0;
    assert_eq!(
        doing(&plan(&pod, &state, t0)),
        [Action::Restart { index: 0, reset_backoff: false }, Action::Running]
    );
    // The worker's restart advances the back-off; the next exit waits 10 s.
    state.containers[0].restart_backoff.fail(t0);
    state.containers[0].restart_count = 1;
    let t1 = t0 + Duration::from_secs(1);
    assert_eq!(
        doing(&plan(&pod, &state, t1)),
        [Action::BackOff { index: 0, delay: Duration::from_secs(10) }, Action::Running]
    );
    // Waiting in CrashLoopBackOff: wake when the 10 s are over, then start.
    state.containers[0].wait("CrashLoopBackOff", "back-off 10s");
    let actions = plan(&pod, &state, t1);
    assert!(actions.contains(&Action::WakeAt(t0 + Duration::from_secs(10))), "{actions:?}");
    assert_eq!(doing(&actions), [Action::Running]);
    assert_eq!(doing(&plan(&pod, &state, t0 + Duration::from_secs(10))), [Action::Start(0), Action::Running]);
    // The next failure waits 20 s.
    let t10 = t0 + Duration::from_secs(10);
    state.containers[0].restart_backoff.fail(t10);
    exit(&mut state.containers[0], 1, Duration::from_secs(1));
    assert_eq!(
        doing(&plan(&pod, &state, t10)),
        [Action::BackOff { index: 0, delay: Duration::from_secs(20) }, Action::Running]
    );
    // A container that ran ten minutes starts afresh: at once, its back-off reset.
    exit(&mut state.containers[0], 1, Duration::from_secs(600));
    assert_eq!(
        doing(&plan(&pod, &state, t10)),
        [Action::Restart { index: 0, reset_backoff: true }, Action::Running]
    );
}

#[test]
fn an_image_pull_back_off_holds_the_start() {
    let pod = one_container("Always");
    let now = Instant::now();
    let mut state = ready_state(&pod, now);
    state.initialized = true;
    state.containers[0].pull_backoff.fail(now);
    state.containers[0].wait("ErrImagePull", "no such image");
    let actions = plan(&pod, &state, now);
    assert!(actions.contains(&Action::WakeAt(now + Duration::from_secs(10))));
    assert_eq!(doing(&actions), []);
}

#[test]
fn the_restart_policy_decides_the_phase_when_containers_end() {
    let now = Instant::now();
    let cases = [
        ("Never", 0, vec![Action::Complete { phase: Some(Phase::Succeeded) }]),
        ("Never", 1, vec![Action::Complete { phase: Some(Phase::Failed) }]),
        ("OnFailure", 0, vec![Action::Complete { phase: Some(Phase::Succeeded) }]),
        ("OnFailure", 1, vec![Action::Restart { index: 0, reset_backoff: false }, Action::Running]),
        ("Always", 0, vec![Action::Restart { index: 0, reset_backoff: false }, Action::Running]),
    ];
    for (policy, code, want) in cases {
        let pod = one_container(policy);
        let mut state = ready_state(&pod, now);
        state.initialized = true;
        exit(&mut state.containers[0], code, Duration::from_secs(1));
        assert_eq!(doing(&plan(&pod, &state, now)), want, "{policy} exit {code}");
    }
}

#[test]
fn a_liveness_failure_kills_the_container_within_the_grace_period() {
    let pod = two_inits("Always");
    let now = Instant::now();
    let mut state = ready_state(&pod, now);
    state.initialized = true;
    run(&mut state.containers[2]);
    assert_eq!(doing(&plan(&pod, &state, now)), [Action::Running], "a healthy container is left alone");
    state.containers[2].failed_probe = Some(ProbeKind::Liveness);
    assert_eq!(
        doing(&plan(&pod, &state, now)),
        [Action::Kill { index: 2, probe: ProbeKind::Liveness, grace: 12 }, Action::Running]
    );
    // Once it ended, the restart policy restarts it.
    state.containers[2].failed_probe = None;
    exit(&mut state.containers[2], 137, Duration::from_secs(5));
    assert_eq!(
        doing(&plan(&pod, &state, now)),
        [Action::Restart { index: 2, reset_backoff: false }, Action::Running]
    );
}

#[test]
fn a_probe_with_its_own_grace_period_kills_within_it() {
    let pod = pod(json!({
        "containers": [{"name": "app", "image": "busybox",
                        "startupProbe": {"exec": {"command": ["cat", "/tmp/up"]}, "terminationGracePeriodSeconds": 5},
                        "livenessProbe": {"exec": {"command": ["true"]}}}],
        "terminationGracePeriodSeconds": 500
    }));
    let now = Instant::now();
    let mut state = ready_state(&pod, now);
    state.initialized = true;
    run(&mut state.containers[0]);
    state.containers[0].failed_probe = Some(ProbeKind::Startup);
    assert_eq!(
        doing(&plan(&pod, &state, now)),
        [Action::Kill { index: 0, probe: ProbeKind::Startup, grace: 5 }, Action::Running],
        "the startup probe's own grace period"
    );
    state.containers[0].failed_probe = Some(ProbeKind::Liveness);
    assert_eq!(
        doing(&plan(&pod, &state, now)),
        [Action::Kill { index: 0, probe: ProbeKind::Liveness, grace: 500 }, Action::Running],
        "the liveness probe sets none: the pod's"
    );
}

#[test]
fn readiness_never_restarts_a_container() {
    let pod = one_container("Always");
    let now = Instant::now();
    let mut state = ready_state(&pod, now);
    state.initialized = true;
    run(&mut state.containers[0]);
    state.containers[0].ready = false;
    assert_eq!(doing(&plan(&pod, &state, now)), [Action::Running]);
}

#[test]
fn termination_takes_the_deletions_grace_period_before_anything_else() {
    let now = Instant::now();
    let mut pod = two_inits("Always");
    let state = PodState::new(&pod);
    pod.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::now()));
    assert_eq!(plan(&pod, &state, now), [Action::Terminate { grace: 12 }], "the spec's grace");
    pod.metadata.deletion_grace_period_seconds = Some(3);
    assert_eq!(plan(&pod, &state, now), [Action::Terminate { grace: 3 }], "the deletion's grace");
    pod.metadata.deletion_grace_period_seconds = Some(-1);
    assert_eq!(plan(&pod, &state, now), [Action::Terminate { grace: 0 }]);
    let unnamed = one_container("Always");
    let mut state = PodState::new(&unnamed);
    state.deleted = true;
    assert_eq!(plan(&unnamed, &state, now), [Action::Terminate { grace: VANISHED_GRACE }], "a vanished pod");
    assert_eq!(termination_grace(&unnamed, false), 30, "the default");
}

#[test]
fn a_completed_pod_only_stops_its_sandbox() {
    let pod = one_container("Never");
    let now = Instant::now();
    let mut state = ready_state(&pod, now);
    state.phase = Phase::Succeeded;
    assert_eq!(plan(&pod, &state, now), [Action::Complete { phase: None }]);
}

#[test]
fn an_adopted_pod_is_taken_over_not_made_again() {
    // A kubelet restarted while the pod ran: its sandbox and container run, the runtime has
    // dropped the completed init containers, the API says the container restarted twice.
    let pod = two_inits("Always");
    let now = Instant::now();
    let mut state = ready_state(&pod, now);
    run(&mut state.containers[2]);
    state.containers[2].restart_count = 2;
    assert!(adopted_initialized(&state.containers), "a container exists: the init containers ran");
    state.initialized = adopted_initialized(&state.containers);
    let actions = plan(&pod, &state, now);
    assert_eq!(doing(&actions), [Action::Running], "nothing is created, started or stopped: {actions:?}");
    assert_eq!(plan(&pod, &state, now), actions, "level-triggered: the same state, the same plan");
    // A pod adopted before its containers: its init containers still run.
    let mut fresh = ready_state(&pod, now);
    fresh.initialized = adopted_initialized(&fresh.containers);
    assert!(!fresh.initialized);
    assert_eq!(doing(&plan(&pod, &fresh, now)), [Action::Start(0)]);
}

#[test]
fn a_pod_past_its_active_deadline_fails_and_an_updated_deadline_counts() {
    let mut pod = pod(json!({
        "activeDeadlineSeconds": 30,
        "terminationGracePeriodSeconds": 7,
        "containers": [{"name": "app", "image": "busybox"}]
    }));
    let now = Instant::now();
    let mut state = ready_state(&pod, now);
    state.started = Some(now);
    run(&mut state.containers[0]);
    // The volumes were just refreshed whenever it plans.
    let plan_at = |pod: &Pod, state: &mut PodState, secs: u64| {
        let at = now + Duration::from_secs(secs);
        state.volumes_refreshed = Some(at);
        plan(pod, state, at)
    };
    let deadline = now + Duration::from_secs(30);
    assert!(plan_at(&pod, &mut state, 0).contains(&Action::WakeAt(deadline)), "woken at the deadline");
    assert_eq!(doing(&plan_at(&pod, &mut state, 29)), [Action::Running]);
    assert_eq!(plan_at(&pod, &mut state, 30), [Action::DeadlineExceeded { grace: 7 }]);
    // Shortened while it runs (the API allows lowering it): it counts from the start.
    pod.spec.as_mut().expect("spec").active_deadline_seconds = Some(5);
    assert_eq!(plan_at(&pod, &mut state, 6), [Action::DeadlineExceeded { grace: 7 }]);
    // Not started, no deadline; a failed pod stays failed.
    state.started = None;
    assert_eq!(doing(&plan_at(&pod, &mut state, 60)), [Action::Running]);
    state.phase = Phase::Failed;
    state.started = Some(now);
    assert_eq!(plan_at(&pod, &mut state, 60), [Action::Complete { phase: None }]);
}

#[test]
fn an_evicted_pod_fails_at_once_unless_it_is_already_done_or_deleted() {
    let pod = pod(json!({
        "terminationGracePeriodSeconds": 30,
        "containers": [{"name": "app", "image": "busybox"}]
    }));
    let now = Instant::now();
    let mut state = ready_state(&pod, now);
    run(&mut state.containers[0]);
    state.evicted = Some("The node was low on resource: memory.".into());
    // Its own grace period is not waited for.
    assert_eq!(plan(&pod, &state, now), [Action::Evict { grace: EVICTION_GRACE }]);
    state.deleted = true;
    assert!(matches!(plan(&pod, &state, now)[..], [Action::Terminate { .. }]));
    state.deleted = false;
    state.phase = Phase::Failed;
    assert_eq!(plan(&pod, &state, now), [Action::Complete { phase: None }]);
}

#[test]
fn a_started_pod_from_the_api_keeps_its_age() {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
        "spec": {"activeDeadlineSeconds": 100, "containers": [{"name": "app", "image": "busybox"}]},
        "status": {"phase": "Running", "startTime": (Timestamp::now() - jiff_span(Duration::from_secs(90))).to_string()}
    }))
    .expect("a pod");
    let state = PodState::new(&pod);
    let left = active_deadline(&pod, &state).expect("a deadline").saturating_duration_since(Instant::now());
    assert!(left > Duration::from_secs(5) && left <= Duration::from_secs(10), "{left:?}");
}

fn with_sidecar(policy: &str) -> Pod {
    pod(json!({
        "restartPolicy": policy,
        "initContainers": [
            {"name": "proxy", "image": "busybox", "restartPolicy": "Always",
             "startupProbe": {"exec": {"command": ["true"]}}},
            {"name": "setup", "image": "busybox"}
        ],
        "containers": [{"name": "app", "image": "busybox"}],
        "terminationGracePeriodSeconds": 3
    }))
}

#[test]
fn a_sidecar_starts_first_and_the_next_init_container_waits_for_its_startup_probe() {
    let pod = with_sidecar("Never");
    let now = Instant::now();
    let mut state = ready_state(&pod, now);
    assert!(state.containers[0].sidecar && !state.containers[1].sidecar && !state.containers[2].sidecar);
    assert_eq!(doing(&plan(&pod, &state, now)), [Action::Start(0)]);
    run(&mut state.containers[0]);
    assert_eq!(doing(&plan(&pod, &state, now)), [], "its startup probe has not passed");
    state.containers[0].started = true;
    assert_eq!(doing(&plan(&pod, &state, now)), [Action::Start(1)]);
    run(&mut state.containers[1]);
    assert_eq!(doing(&plan(&pod, &state, now)), [], "a regular init container runs to completion");
    exit(&mut state.containers[1], 0, Duration::from_secs(1));
    assert_eq!(doing(&plan(&pod, &state, now)), [Action::InitDone]);
    state.initialized = true;
    assert_eq!(doing(&plan(&pod, &state, now)), [Action::Start(2)]);
}

#[test]
fn a_sidecar_restarts_whatever_the_pod_policy_and_stops_being_restarted_once_the_pod_is_done() {
    let pod = with_sidecar("Never");
    let now = Instant::now();
    let mut state = ready_state(&pod, now);
    // Ended during the init phase: restarted, not a pod failure under Never.
    exit(&mut state.containers[0], 1, Duration::from_secs(1));
    assert_eq!(doing(&plan(&pod, &state, now)), [Action::Restart { index: 0, reset_backoff: false }]);
    // A failed probe kills it, while the init containers run.
    run(&mut state.containers[0]);
    state.containers[0].started = true;
    state.containers[0].failed_probe = Some(ProbeKind::Liveness);
    run(&mut state.containers[1]);
    assert_eq!(
        doing(&plan(&pod, &state, now)),
        [Action::Kill { index: 0, probe: ProbeKind::Liveness, grace: 3 }]
    );
    state.containers[0].failed_probe = None;
    exit(&mut state.containers[1], 0, Duration::from_secs(1));
    state.initialized = true;
    run(&mut state.containers[2]);
    // Ended while the app runs: restarted (after its back-off once it has failed before).
    exit(&mut state.containers[0], 0, Duration::from_secs(1));
    assert_eq!(
        doing(&plan(&pod, &state, now)),
        [Action::Restart { index: 0, reset_backoff: false }, Action::Running]
    );
    state.containers[0].restart_backoff.fail(now);
    assert!(matches!(doing(&plan(&pod, &state, now))[0], Action::BackOff { index: 0, .. }));
    // The app is done: the pod completes on the app's exit alone, the sidecar not restarted.
    exit(&mut state.containers[2], 0, Duration::from_secs(1));
    assert_eq!(doing(&plan(&pod, &state, now)), [Action::Complete { phase: Some(Phase::Succeeded) }]);
    run(&mut state.containers[0]);
    assert_eq!(doing(&plan(&pod, &state, now)), [Action::Complete { phase: Some(Phase::Succeeded) }]);
}

#[test]
fn an_ephemeral_container_added_while_the_pod_runs_starts_once_and_is_never_restarted() {
    let mut pod = two_inits("Always");
    let now = Instant::now();
    let mut state = ready_state(&pod, now);
    pod.spec.as_mut().expect("spec").ephemeral_containers = Some(vec![
        serde_json::from_value(json!({"name": "debugger", "image": "busybox", "stdin": true, "tty": true}))
            .expect("ephemeral"),
    ]);
    state.add_ephemeral(&pod);
    state.add_ephemeral(&pod);
    assert_eq!(state.containers.len(), 4, "recorded once");
    assert!(state.containers[3].ephemeral && !state.containers[3].regular());
    // During initialization too.
    assert_eq!(doing(&plan(&pod, &state, now)), [Action::Start(3), Action::Start(0)]);
    exit(&mut state.containers[3], 1, Duration::from_secs(1));
    assert_eq!(doing(&plan(&pod, &state, now)), [Action::Start(0)]);
    state.initialized = true;
    run(&mut state.containers[2]);
    assert_eq!(doing(&plan(&pod, &state, now)), [Action::Running], "not restarted, not the pod's phase");
}
