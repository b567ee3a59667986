//! Stats (`crictl stats`, `crictl statsp`, ContainerStats) from the sandbox's processes, and
//! GetContainerEvents streaming every lifecycle change as it happens.

mod support;

use std::time::Duration;

use k8s_cri::v1 as cri;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use support::{CRICTL_TOOLS, Runtime, registry_with_shell_image, tools_present, write_json};

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

fn number(v: &serde_json::Value) -> u64 {
    // crictl prints 64-bit values as strings.
    v.as_str().and_then(|s| s.parse().ok()).or_else(|| v.as_u64()).unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_count_what_the_pod_uses() {
    if !tools_present(CRICTL_TOOLS) {
        return;
    }
    let (registry, reference, _) = registry_with_shell_image().await;
    let tmp = tempfile::tempdir().expect("tempdir");
    tokio::task::block_in_place(|| {
        let rt = Runtime::start(tmp.path(), &registry.host_port());
        rt.ok(&["pull", &reference]);
        let pod = write_json(
            &tmp.path().join("pod.json"),
            serde_json::json!({
                "metadata": {"name": "busy", "namespace": "default", "uid": "uid-s", "attempt": 0},
                "labels": {"app": "busy"},
                "log_directory": tmp.path().join("logs"),
            }),
        );
        let pod_id = rt.ok(&["runp", &pod]);
        // Burns CPU for a while, writes 1 MiB into its writable layer, then sleeps.
        let ctr = write_json(
            &tmp.path().join("ctr.json"),
            serde_json::json!({
                "metadata": {"name": "burner"},
                "image": {"image": reference},
                "labels": {"role": "burner"},
                "command": ["sh", "-c",
                    "dd if=/dev/zero of=/blob bs=1024 count=1024 2>/dev/null; i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; exec sleep 60"],
                "log_path": "burner/0.log",
            }),
        );
        let ctr_id = rt.ok(&["create", &pod_id, &ctr, &pod]);
        rt.ok(&["start", &ctr_id]);
        // Once the loop is done (the container's init then execs sleep), bounded.
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while !rt.crictl(&["exec", "-s", &ctr_id, "pidof", "sleep"]).status.success() {
            assert!(std::time::Instant::now() < deadline, "the burner never reached its sleep");
            std::thread::sleep(Duration::from_millis(100));
        }
        let stats = json(&rt.ok(&["stats", "-o", "json", "--label", "role=burner"]));
        let s = &stats["stats"][0];
        assert_eq!(s["attributes"]["id"], ctr_id.as_str(), "{stats}");
        assert!(number(&s["cpu"]["usageCoreNanoSeconds"]["value"]) > 100_000_000, "burnt CPU: {stats}");
        assert!(number(&s["memory"]["workingSetBytes"]["value"]) > 100_000, "resident memory: {stats}");
        assert!(number(&s["writableLayer"]["usedBytes"]["value"]) >= 1024 * 1024, "the 1 MiB file: {stats}");
        let none = json(&rt.ok(&["stats", "-o", "json", "--label", "role=nothing"]));
        assert!(none["stats"].as_array().is_none_or(Vec::is_empty), "{none}");

        let pods = json(&rt.ok(&["statsp", "-o", "json", "--label", "app=busy"]));
        let p = &pods["stats"][0];
        assert_eq!(p["attributes"]["id"], pod_id.as_str(), "{pods}");
        // The pause and the container's sleep.
        assert!(number(&p["linux"]["process"]["processCount"]["value"]) >= 2, "{pods}");
        assert!(number(&p["linux"]["cpu"]["usageCoreNanoSeconds"]["value"]) > 100_000_000, "{pods}");
        assert_eq!(p["linux"]["containers"][0]["attributes"]["id"], ctr_id.as_str(), "{pods}");

        // A stopped container uses nothing.
        rt.ok(&["stop", "--timeout", "1", &ctr_id]);
        let stopped = json(&rt.ok(&["stats", "-o", "json", "--id", &ctr_id]));
        assert_eq!(number(&stopped["stats"][0]["memory"]["workingSetBytes"]["value"]), 0, "{stopped}");
        rt.ok(&["rmp", "-f", &pod_id]);
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn container_events_stream_every_change() {
    if !tools_present(CRICTL_TOOLS) {
        return;
    }
    let (registry, reference, _) = registry_with_shell_image().await;
    let tmp = tempfile::tempdir().expect("tempdir");
    let rt = tokio::task::block_in_place(|| Runtime::start(tmp.path(), &registry.host_port()));
    let channel = hpk_rpc::connect::unix(rt.socket()).await.expect("connect");
    let mut client = RuntimeServiceClient::new(channel);
    let mut events =
        client.get_container_events(cri::GetEventsRequest {}).await.expect("subscribe").into_inner();

    let (pod_id, ctr_id) = tokio::task::block_in_place(|| {
        rt.ok(&["pull", &reference]);
        let pod = write_json(
            &tmp.path().join("pod.json"),
            serde_json::json!({
                "metadata": {"name": "ev", "namespace": "default", "uid": "uid-e", "attempt": 0},
                "log_directory": tmp.path().join("logs"),
            }),
        );
        let pod_id = rt.ok(&["runp", &pod]);
        let ctr = write_json(
            &tmp.path().join("ctr.json"),
            serde_json::json!({
                "metadata": {"name": "quick"},
                "image": {"image": reference},
                "command": ["sh", "-c", "exit 4"],
                "log_path": "quick/0.log",
            }),
        );
        let ctr_id = rt.ok(&["create", &pod_id, &ctr, &pod]);
        rt.ok(&["start", &ctr_id]);
        (pod_id, ctr_id)
    });
    use cri::ContainerEventType as T;
    let mut seen = Vec::new();
    let expected = [
        (pod_id.clone(), T::ContainerCreatedEvent),
        (pod_id.clone(), T::ContainerStartedEvent),
        (ctr_id.clone(), T::ContainerCreatedEvent),
        (ctr_id.clone(), T::ContainerStartedEvent),
        (ctr_id.clone(), T::ContainerStoppedEvent),
    ];
    let mut stopped_status = None;
    while seen.len() < expected.len() {
        let event = tokio::time::timeout(Duration::from_secs(10), events.message())
            .await
            .unwrap_or_else(|_| panic!("no event within 10 s; seen {seen:?}"))
            .expect("stream")
            .expect("an event");
        let kind = T::try_from(event.container_event_type).expect("known type");
        if event.container_id == ctr_id && kind == T::ContainerStoppedEvent {
            stopped_status = event.containers_statuses.iter().find(|s| s.id == ctr_id).cloned();
            assert_eq!(event.pod_sandbox_status.as_ref().map(|s| s.id.as_str()), Some(pod_id.as_str()));
        }
        seen.push((event.container_id, kind));
    }
    assert_eq!(seen, expected);
    let status = stopped_status.expect("the stopped event carries the container's status");
    assert_eq!(status.exit_code, 4);

    tokio::task::block_in_place(|| rt.ok(&["rmp", "-f", &pod_id]));
    let mut rest = Vec::new();
    while rest.len() < 3 {
        let event = tokio::time::timeout(Duration::from_secs(10), events.message())
            .await
            .expect("events after rmp")
            .expect("stream")
            .expect("an event");
        rest.push((event.container_id, T::try_from(event.container_event_type).expect("known")));
    }
    assert_eq!(
        rest,
        [
            (pod_id.clone(), T::ContainerStoppedEvent),
            (ctr_id, T::ContainerDeletedEvent),
            (pod_id, T::ContainerDeletedEvent)
        ]
    );
}
