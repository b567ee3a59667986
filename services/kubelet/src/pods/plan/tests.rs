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
