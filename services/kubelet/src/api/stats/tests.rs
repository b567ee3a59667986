//! A summary assembled from hand-made CRI answers, and its JSON as Summary API clients read it.

use std::collections::HashMap;

use k8s_cri::v1 as cri;
use serde_json::{Value, json};

use super::assemble::{DirUsage, ImageFs, RuntimeView, assemble};
use super::node::{FsReading, MemInfo, NodeReadings};
use super::rate::CpuRates;
use super::summary::{InterfaceStats, PodReference, PodStats, Summary, Timestamp};

const SECOND: i64 = 1_000_000_000;
const GIB: u64 = 1 << 30;
/// 2023-11-14T22:13:20Z.
const T0: i64 = 1_700_000_000 * SECOND;

fn value(v: u64) -> Option<cri::UInt64Value> {
    Some(cri::UInt64Value { value: v })
}

fn cpu(at: i64, core_nanos: u64) -> Option<cri::CpuUsage> {
    // The runtime's own rate must not show through: the kubelet computes its own.
    Some(cri::CpuUsage {
        timestamp: at,
        usage_core_nano_seconds: value(core_nanos),
        usage_nano_cores: value(999),
    })
}

fn memory(at: i64, working_set: u64) -> Option<cri::MemoryUsage> {
    Some(cri::MemoryUsage {
        timestamp: at,
        working_set_bytes: value(working_set),
        available_bytes: None,
        usage_bytes: value(working_set + 100),
        rss_bytes: value(working_set / 2),
        page_faults: value(7),
        major_page_faults: value(1),
    })
}

fn container_stats(
    id: &str,
    at: i64,
    core_nanos: u64,
    working_set: u64,
    layer_bytes: u64,
) -> cri::ContainerStats {
    cri::ContainerStats {
        attributes: Some(cri::ContainerAttributes { id: id.to_owned(), ..Default::default() }),
        cpu: cpu(at, core_nanos),
        memory: memory(at, working_set),
        writable_layer: Some(cri::FilesystemUsage {
            timestamp: at,
            fs_id: None,
            used_bytes: value(layer_bytes),
            inodes_used: value(3),
        }),
        swap: None,
    }
}

fn metadata(name: &str, namespace: &str, uid: &str) -> Option<cri::PodSandboxMetadata> {
    Some(cri::PodSandboxMetadata {
        name: name.into(),
        namespace: namespace.into(),
        uid: uid.into(),
        attempt: 0,
    })
}

fn interface(name: &str, rx: u64, tx: u64) -> cri::NetworkInterfaceUsage {
    cri::NetworkInterfaceUsage {
        name: name.into(),
        rx_bytes: value(rx),
        rx_errors: value(0),
        tx_bytes: value(tx),
        tx_errors: value(1),
    }
}

fn sandbox(id: &str, state: cri::PodSandboxState, name: &str, namespace: &str, uid: &str) -> cri::PodSandbox {
    cri::PodSandbox {
        id: id.into(),
        metadata: metadata(name, namespace, uid),
        state: state as i32,
        created_at: T0 - 100 * SECOND,
        ..Default::default()
    }
}

fn container(
    id: &str,
    sandbox: &str,
    state: cri::ContainerState,
    label: Option<&str>,
    name: &str,
) -> cri::Container {
    let labels = label.map(|l| HashMap::from([("io.kubernetes.container.name".to_owned(), l.to_owned())]));
    cri::Container {
        id: id.into(),
        pod_sandbox_id: sandbox.into(),
        metadata: Some(cri::ContainerMetadata { name: name.into(), attempt: 0 }),
        state: state as i32,
        created_at: T0 - 90 * SECOND,
        labels: labels.unwrap_or_default(),
        ..Default::default()
    }
}

/// `web` (default) with app, sidecar, an exited init and a container the runtime has no stats
/// for; `db` (apps), whose sandbox gives no CPU or memory of its own; `old`, not ready.
/// `usage` is added to every CPU counter, `t` is when everything is sampled.
fn runtime(t: i64, usage: u64, with_db: bool) -> RuntimeView {
    use cri::ContainerState::{ContainerExited, ContainerRunning};
    use cri::PodSandboxState::{SandboxNotready, SandboxReady};
    let web = cri::PodSandboxStats {
        attributes: Some(cri::PodSandboxAttributes { id: "sb-web".into(), ..Default::default() }),
        linux: Some(cri::LinuxPodSandboxStats {
            cpu: cpu(t, 50 * SECOND as u64 + 2 * usage),
            memory: memory(t, 5000),
            network: Some(cri::NetworkUsage {
                timestamp: t,
                default_interface: Some(interface("eth0", 10, 20)),
                interfaces: vec![interface("eth0", 10, 20), interface("net1", 1, 2)],
            }),
            process: Some(cri::ProcessUsage { timestamp: t, process_count: value(4) }),
            containers: vec![
                container_stats("c-app", t, 30 * SECOND as u64 + usage, 3000, 1000),
                container_stats("c-side", t, 10 * SECOND as u64 + usage, 1500, 2000),
                container_stats("c-init", t, SECOND as u64, 0, 500),
            ],
        }),
        windows: None,
    };
    let db = cri::PodSandboxStats {
        attributes: Some(cri::PodSandboxAttributes {
            id: "sb-db".into(),
            metadata: metadata("db", "apps", "uid-2"),
            ..Default::default()
        }),
        linux: Some(cri::LinuxPodSandboxStats {
            containers: vec![container_stats("c-db", t, 70 * SECOND as u64 + usage, 8000, 4000)],
            ..Default::default()
        }),
        windows: None,
    };
    let old = cri::PodSandboxStats {
        attributes: Some(cri::PodSandboxAttributes { id: "sb-old".into(), ..Default::default() }),
        linux: Some(cri::LinuxPodSandboxStats { cpu: cpu(t, 1), ..Default::default() }),
        windows: None,
    };
    let mut view = RuntimeView {
        sandbox_stats: vec![old, web],
        sandboxes: vec![
            sandbox("sb-web", SandboxReady, "web", "default", "uid-1"),
            sandbox("sb-old", SandboxNotready, "old", "default", "uid-0"),
        ],
        containers: vec![
            container("c-app", "sb-web", ContainerRunning, Some("app"), "ignored"),
            container("c-side", "sb-web", ContainerRunning, None, "sidecar"),
            container("c-init", "sb-web", ContainerExited, Some("init"), "init"),
            container("c-new", "sb-web", ContainerRunning, Some("new"), "new"),
        ],
        image_fs: Some(ImageFs {
            usage: cri::FilesystemUsage {
                timestamp: t,
                fs_id: Some(cri::FilesystemIdentifier { mountpoint: "/var/lib/hpk/images".into() }),
                used_bytes: value(7000),
                inodes_used: value(70),
            },
            fs: Some(FsReading {
                capacity: 9000,
                available: 2000,
                used: 7000,
                inodes: 900,
                inodes_free: 100,
                inodes_used: 800,
            }),
        }),
    };
    if with_db {
        view.sandbox_stats.push(db);
        // The runtime has no metadata for this one in ListPodSandbox: the stats' attributes say.
        view.sandboxes.push(cri::PodSandbox { metadata: None, ..sandbox("sb-db", SandboxReady, "", "", "") });
        view.containers.push(container("c-db", "sb-db", ContainerRunning, Some("postgres"), "postgres"));
    }
    view
}

fn node(t: i64, usage: u64) -> NodeReadings {
    let iface = |name: &str, rx| InterfaceStats {
        name: name.into(),
        rx_bytes: Some(rx),
        rx_errors: Some(0),
        tx_bytes: Some(5),
        tx_errors: Some(0),
    };
    NodeReadings {
        time: Timestamp::from_unix_nanos(t),
        boot_time: Some(Timestamp::from_unix_nanos(T0 - 1000 * SECOND)),
        cpu_core_nanos: Some(500 * SECOND as u64 + 4 * usage),
        memory: Some(MemInfo {
            total: 16 * GIB,
            free: 2 * GIB,
            available: 10 * GIB,
            anonymous: Some(4 * GIB),
        }),
        interfaces: vec![iface("eth0", 100), iface("ib0", 90_000)],
        fs: Some(FsReading {
            capacity: 1000,
            available: 400,
            used: 600,
            inodes: 50,
            inodes_free: 20,
            inodes_used: 30,
        }),
        max_pid: Some(4_194_304),
        processes: Some(345),
    }
}

/// Only web's app has a log directory.
fn logs(pod: &PodReference, container: &str) -> Option<DirUsage> {
    (pod.namespace == "default" && pod.name == "web" && pod.uid == "uid-1" && container == "app")
        .then_some(DirUsage { bytes: 4096, inodes: 2 })
}

fn summary_at(t: i64, usage: u64, with_db: bool, rates: &mut CpuRates) -> Summary {
    assemble("hpc-node-1", &node(t, usage), &runtime(t, usage, with_db), logs, rates)
}

fn pod<'a>(summary: &'a Summary, name: &str) -> &'a PodStats {
    summary
        .pods
        .iter()
        .find(|p| p.pod_ref.name == name)
        .unwrap_or_else(|| panic!("no pod {name}: {summary:#?}"))
}

#[test]
fn node_figures_come_from_the_readings_and_the_image_filesystem() {
    let summary = summary_at(T0, 0, true, &mut CpuRates::default());
    let node = &summary.node;
    assert_eq!(node.node_name, "hpc-node-1");
    assert_eq!(node.start_time, Timestamp::from_unix_nanos(T0 - 1000 * SECOND));
    let cpu = node.cpu.as_ref().expect("cpu");
    assert_eq!((cpu.usage_core_nano_seconds, cpu.usage_nano_cores), (Some(500 * SECOND as u64), None));
    let memory = node.memory.as_ref().expect("memory");
    assert_eq!((memory.working_set_bytes, memory.usage_bytes), (Some(6 * GIB), Some(14 * GIB)));
    assert_eq!(node.network.as_ref().map(|n| n.default_interface.name.as_str()), Some("ib0"));
    assert_eq!(node.fs.as_ref().and_then(|f| f.capacity_bytes), Some(1000));
    let rlimit = node.rlimit.as_ref().expect("rlimit");
    assert_eq!((rlimit.max_pid, rlimit.processes), (Some(4_194_304), Some(345)));
    let image_fs = node.runtime.as_ref().and_then(|r| r.image_fs.as_ref()).expect("imageFs");
    assert_eq!(
        (
            image_fs.used_bytes,
            image_fs.capacity_bytes,
            image_fs.available_bytes,
            image_fs.inodes_used,
            image_fs.inodes
        ),
        (Some(7000), Some(9000), Some(2000), Some(70), Some(900))
    );
}

#[test]
fn ready_pods_with_their_running_containers() {
    let summary = summary_at(T0, 0, true, &mut CpuRates::default());
    let names: Vec<(&str, &str)> =
        summary.pods.iter().map(|p| (p.pod_ref.namespace.as_str(), p.pod_ref.name.as_str())).collect();
    assert_eq!(names, [("apps", "db"), ("default", "web")]);

    let web = pod(&summary, "web");
    assert_eq!(
        web.pod_ref,
        PodReference { name: "web".into(), namespace: "default".into(), uid: "uid-1".into() }
    );
    assert_eq!(web.start_time, Timestamp::from_unix_nanos(T0 - 100 * SECOND));
    let containers: Vec<&str> = web.containers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(containers, ["app", "sidecar"], "exited and stat-less containers are left out");
    let app = &web.containers[0];
    assert_eq!(app.start_time, Timestamp::from_unix_nanos(T0 - 90 * SECOND));
    assert_eq!(app.cpu.as_ref().and_then(|c| c.usage_core_nano_seconds), Some(30 * SECOND as u64));
    assert_eq!(app.cpu.as_ref().and_then(|c| c.usage_nano_cores), None);
    let app_memory = app.memory.as_ref().expect("memory");
    assert_eq!(
        (app_memory.working_set_bytes, app_memory.rss_bytes, app_memory.usage_bytes),
        (Some(3000), Some(1500), Some(3100))
    );
    let rootfs = app.rootfs.as_ref().expect("rootfs");
    assert_eq!(
        (rootfs.used_bytes, rootfs.inodes_used, rootfs.capacity_bytes),
        (Some(1000), Some(3), Some(9000))
    );
    let app_logs = app.logs.as_ref().expect("logs");
    assert_eq!(
        (app_logs.used_bytes, app_logs.inodes_used, app_logs.capacity_bytes),
        (Some(4096), Some(2), Some(1000))
    );
    assert_eq!(web.containers[1].logs, None);

    // The sandbox's own figures, not the containers' sum.
    assert_eq!(web.cpu.as_ref().and_then(|c| c.usage_core_nano_seconds), Some(50 * SECOND as u64));
    assert_eq!(web.memory.as_ref().and_then(|m| m.working_set_bytes), Some(5000));
    let network = web.network.as_ref().expect("network");
    assert_eq!(
        (network.default_interface.name.as_str(), network.default_interface.tx_bytes),
        ("eth0", Some(20))
    );
    assert_eq!(network.interfaces.len(), 2);
    assert_eq!(web.process_stats.as_ref().and_then(|p| p.process_count), Some(4));
    let ephemeral = web.ephemeral_storage.as_ref().expect("ephemeral-storage");
    // app's layer 1000 + app's logs 4096 + sidecar's layer 2000; inodes 3 + 2 + 3.
    assert_eq!((ephemeral.used_bytes, ephemeral.inodes_used), (Some(7096), Some(8)));
    assert_eq!((ephemeral.capacity_bytes, ephemeral.available_bytes), (Some(1000), Some(400)));
}

#[test]
fn a_sandbox_without_figures_of_its_own_sums_its_containers() {
    let mut rates = CpuRates::default();
    let first = summary_at(T0, 0, true, &mut rates);
    let db = pod(&first, "db");
    assert_eq!(db.pod_ref, PodReference { name: "db".into(), namespace: "apps".into(), uid: "uid-2".into() });
    assert_eq!(db.cpu.as_ref().and_then(|c| c.usage_core_nano_seconds), Some(70 * SECOND as u64));
    let memory = db.memory.as_ref().expect("memory");
    assert_eq!(
        (memory.working_set_bytes, memory.page_faults, memory.available_bytes),
        (Some(8000), Some(7), None)
    );
    assert_eq!((db.network.as_ref(), db.process_stats.as_ref()), (None, None));

    let later = summary_at(T0 + 2 * SECOND, SECOND as u64, true, &mut rates);
    assert_eq!(pod(&later, "db").cpu.as_ref().and_then(|c| c.usage_nano_cores), Some(500_000_000));
}

#[test]
fn cpu_rates_come_from_the_previous_summary_and_forget_what_left() {
    let mut rates = CpuRates::default();
    summary_at(T0, 0, true, &mut rates);
    // node, web, app, sidecar, db, postgres.
    assert_eq!(rates.len(), 6);

    let rate = |s: &Summary| {
        let web = pod(s, "web");
        (
            s.node.cpu.as_ref().and_then(|c| c.usage_nano_cores),
            web.cpu.as_ref().and_then(|c| c.usage_nano_cores),
            web.containers[0].cpu.as_ref().and_then(|c| c.usage_nano_cores),
        )
    };
    // One more second of CPU for each container over two seconds: half a core; the node four.
    let later = summary_at(T0 + 2 * SECOND, SECOND as u64, true, &mut rates);
    assert_eq!(rate(&later), (Some(2_000_000_000), Some(1_000_000_000), Some(500_000_000)));
    // Half a second on, much more used: the same rates (the 2 s samples stay).
    let soon = summary_at(T0 + 2 * SECOND + SECOND / 2, 5 * SECOND as u64, true, &mut rates);
    assert_eq!(rate(&soon), rate(&later));

    summary_at(T0 + 3 * SECOND, 2 * SECOND as u64, false, &mut rates);
    assert_eq!(rates.len(), 4, "db and postgres are forgotten");
}

#[test]
fn the_json_has_upstream_names_and_leaves_out_what_is_unknown() {
    let mut rates = CpuRates::default();
    let summary = summary_at(T0, 0, true, &mut rates);
    let v = serde_json::to_value(&summary).expect("serializes");
    let node = &v["node"];
    assert_eq!(node["nodeName"], "hpc-node-1");
    assert_eq!(node["startTime"], "2023-11-14T21:56:40Z");
    assert_eq!(node["rlimit"], json!({"time": "2023-11-14T22:13:20Z", "maxpid": 4_194_304, "curproc": 345}));
    assert_eq!(node["runtime"]["imageFs"]["usedBytes"], 7000);
    assert_eq!(node["network"]["name"], "ib0");
    assert_eq!(node["network"]["rxBytes"], 90_000);
    assert_eq!(node["network"]["interfaces"].as_array().map(Vec::len), Some(2));
    assert_eq!(keys(&node["cpu"]), ["time", "usageCoreNanoSeconds"], "no rate yet, no usageNanoCores");

    let web = &v["pods"][1];
    assert_eq!(web["podRef"], json!({"name": "web", "namespace": "default", "uid": "uid-1"}));
    assert_eq!(
        keys(web),
        [
            "containers",
            "cpu",
            "ephemeral-storage",
            "memory",
            "network",
            "podRef",
            "process_stats",
            "startTime"
        ]
    );
    assert_eq!(web["process_stats"], json!({"process_count": 4}));
    assert_eq!(web["ephemeral-storage"]["usedBytes"], 7096);
    assert_eq!(keys(&web["containers"][0]), ["cpu", "logs", "memory", "name", "rootfs", "startTime"]);
    assert_eq!(keys(&web["containers"][1]), ["cpu", "memory", "name", "rootfs", "startTime"]);
    assert_eq!(
        keys(&web["containers"][0]["memory"]),
        ["majorPageFaults", "pageFaults", "rssBytes", "time", "usageBytes", "workingSetBytes"]
    );
    assert_eq!(
        keys(&web["containers"][0]["logs"]),
        ["availableBytes", "capacityBytes", "inodes", "inodesFree", "inodesUsed", "time", "usedBytes"]
    );
    assert!(v["pods"][0].get("network").is_none() && v["pods"][0].get("process_stats").is_none());

    let later = serde_json::to_value(summary_at(T0 + 2 * SECOND, SECOND as u64, true, &mut rates))
        .expect("serializes");
    assert_eq!(later["pods"][1]["containers"][0]["cpu"]["usageNanoCores"], 500_000_000);

    let back: Summary = serde_json::from_value(v).expect("reads back");
    assert_eq!(back, summary, "whole-second times survive the round trip");
}

/// An object's keys, sorted.
fn keys(v: &Value) -> Vec<String> {
    let mut keys: Vec<String> = v.as_object().map(|o| o.keys().cloned().collect()).unwrap_or_default();
    keys.sort();
    keys
}
