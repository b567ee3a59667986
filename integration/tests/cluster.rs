//! The upstream control plane on a test host, driven through kube-rs and kubectl.

use std::collections::BTreeMap;
use std::time::Duration;

use hpk_integration::controlplane::ControlPlane;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod};
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;

/// Polls `check` every 200 ms for up to 60 s; panics with `what` on timeout.
async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    hpk_integration::eventually(what, Duration::from_secs(60), &mut check, String::new).await
}

fn from_json<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> T {
    serde_json::from_value(value).expect("valid object")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deployment_pods_wait_unschedulable_and_nodes_get_pod_cidrs() {
    let Some(cp) = hpk_integration::skip_unless_available(ControlPlane::start(&["node1"]).await) else {
        return;
    };
    let client = cp.admin_client().await.expect("admin client");

    // kubectl from the same release sees a ready API server.
    let out = cp.kubectl().args(["get", "--raw", "/readyz"]).output().expect("kubectl");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok", "{}", String::from_utf8_lossy(&out.stderr));

    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(&PostParams::default(), &from_json(json!({"metadata": {"name": "demo"}})))
        .await
        .expect("namespace");
    // Created through kubectl, read back through kube-rs.
    let out = cp
        .kubectl()
        .args(["create", "configmap", "settings", "-n", "demo", "--from-literal=mode=test"])
        .output()
        .expect("kubectl");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), "demo");
    let settings = configmaps.get("settings").await.expect("configmap");
    assert_eq!(settings.data.and_then(|d| d.get("mode").cloned()).as_deref(), Some("test"));
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "demo");
    let deployment = json!({
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": "registry.test/busybox:1"}]}
            }
        }
    });
    deployments.create(&PostParams::default(), &from_json(deployment)).await.expect("deployment");

    // The controller-manager creates the ReplicaSet and both Pods.
    let replicasets: Api<ReplicaSet> = Api::namespaced(client.clone(), "demo");
    eventually("the ReplicaSet", || {
        let replicasets = replicasets.clone();
        async move {
            replicasets
                .list(&ListParams::default().labels("app=web"))
                .await
                .ok()
                .filter(|l| l.items.len() == 1)
        }
    })
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "demo");
    // With no nodes, the scheduler marks both Pending as Unschedulable.
    let unschedulable = eventually("two unschedulable pods", || {
        let pods = pods.clone();
        async move {
            let list = pods.list(&ListParams::default().labels("app=web")).await.ok()?;
            let reasons: Vec<String> = list
                .items
                .iter()
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Pending"))
                .filter_map(|p| {
                    p.status
                        .as_ref()?
                        .conditions
                        .as_ref()?
                        .iter()
                        .find(|c| c.type_ == "PodScheduled" && c.status == "False")?
                        .reason
                        .clone()
                })
                .collect();
            (reasons.len() == 2).then_some(reasons)
        }
    })
    .await;
    assert_eq!(unschedulable, ["Unschedulable", "Unschedulable"]);

    // kubectl sees the same objects.
    let out = cp
        .kubectl()
        .args(["get", "pods", "-n", "demo", "-l", "app=web", "-o", "name"])
        .output()
        .expect("kubectl");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).lines().count(),
        2,
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A Node object gets a podCIDR from the controller-manager.
    let nodes: Api<Node> = Api::all(client.clone());
    let mut labels = BTreeMap::new();
    labels.insert("kubernetes.io/hostname".to_owned(), "node1".to_owned());
    let node: Node = from_json(json!({"metadata": {"name": "node1", "labels": labels}}));
    nodes.create(&PostParams::default(), &node).await.expect("node");
    let cidr = eventually("a podCIDR on node1", || {
        let nodes = nodes.clone();
        async move { nodes.get("node1").await.ok()?.spec?.pod_cidr }
    })
    .await;
    assert!(cidr.starts_with("10.244.") && cidr.ends_with("/24"), "{cidr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_test_host_reaches_the_api_server_and_nothing_listens_elsewhere() {
    let Some(cp) = hpk_integration::skip_unless_available(ControlPlane::start(&["node1"]).await) else {
        return;
    };
    let node = cp.network().host("node1").expect("node1").clone();

    // From node1's namespace, as system:node:node1.
    let kubeconfig = cp.node_kubeconfig("node1").expect("node kubeconfig");
    let out = node
        .command(cp.bin_dir().join("kubectl"))
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args(["get", "--raw", "/readyz"])
        .output()
        .expect("kubectl on node1");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok", "{}", String::from_utf8_lossy(&out.stderr));
    let out = node.command("hostname").output().expect("hostname");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "node1");

    // Every listener of the control plane is on its test address or its own loopback.
    let host = cp.host();
    let out = hpk_integration::netns::run(std::process::Command::new("ip").args([
        "netns",
        "exec",
        &host.netns,
        "ss",
        "-Hltn",
    ]))
    .expect("ss");
    let ip = host.ip.to_string();
    for line in out.lines() {
        let local = line.split_whitespace().nth(3).expect("local address column");
        let addr = local.rsplit_once(':').map(|(a, _)| a).unwrap_or(local);
        assert!(addr == ip || addr == "127.0.0.1", "unexpected listener {local}\n{out}");
    }
    assert!(out.contains(&format!("{ip}:6443")), "{out}");
}
