//! Registering the Node: create it, or bring a restarted kubelet's Node up to date without
//! touching what others own.
//!
//! An existing Node gets a strategic-merge PATCH of the labels the kubelet owns: labels merge
//! by key, so others' labels and annotations (net.hpk.io/tunnel-endpoint), spec.podCIDR and
//! everything else stay as they are. Taints are set only at creation: NodeRestriction refuses
//! a node that modifies its own taints, as it does for the upstream kubelet's
//! `--register-with-taints`. The status is the status loop's business (see `status.rs`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, NodeSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use tracing::{info, warn};

use super::NodeConfig;

/// The label saying which part a node plays in HPK (`worker`, `controller`). Not
/// `node-role.kubernetes.io/`: NodeRestriction forbids a node to set that.
pub const ROLE_LABEL: &str = "node.hpk.io/role";

/// The labels the kubelet sets on its Node.
pub fn labels(config: &NodeConfig) -> BTreeMap<String, String> {
    let hostname = if is_label_value(&config.hostname) { &config.hostname } else { &config.name };
    [
        ("kubernetes.io/hostname", hostname.as_str()),
        ("kubernetes.io/os", "linux"),
        ("kubernetes.io/arch", &super::info::architecture()),
        (ROLE_LABEL, config.role.as_str()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

/// A valid label value: at most 63 characters, alphanumerics with `-_.` inside.
fn is_label_value(value: &str) -> bool {
    let bytes = value.as_bytes();
    value.len() <= 63
        && bytes.iter().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(b))
        && bytes.first().is_none_or(u8::is_ascii_alphanumeric)
        && bytes.last().is_none_or(u8::is_ascii_alphanumeric)
}

/// The Node as first created.
pub fn new_node(config: &NodeConfig) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(config.name.clone()),
            labels: Some(labels(config)),
            ..Default::default()
        },
        spec: Some(NodeSpec { taints: config.taint.clone().map(|t| vec![t]), ..Default::default() }),
        status: None,
    }
}

/// Creates the Node, or updates the kubelet's labels on the one that exists; returns it.
pub async fn register(nodes: &Api<Node>, config: &NodeConfig) -> Result<Node, kube::Error> {
    match nodes.create(&PostParams::default(), &new_node(config)).await {
        Ok(node) => {
            info!(node = %config.name, "node registered");
            Ok(node)
        }
        Err(kube::Error::Api(status)) if status.code == 409 => update_existing(nodes, config).await,
        Err(e) => Err(e),
    }
}

async fn update_existing(nodes: &Api<Node>, config: &NodeConfig) -> Result<Node, kube::Error> {
    let existing = nodes.get(&config.name).await?;
    if let Some(taint) = &config.taint {
        let taints = existing.spec.as_ref().and_then(|s| s.taints.as_deref()).unwrap_or_default();
        if !taints.iter().any(|t| t.key == taint.key && t.effect == taint.effect && t.value == taint.value) {
            warn!(node = %config.name, taint = %taint.key, "the existing Node lacks the configured taint; \
                a node may not change its own taints: add it with kubectl taint");
        }
    }
    let wanted = labels(config);
    let have = existing.metadata.labels.clone().unwrap_or_default();
    if wanted.iter().all(|(k, v)| have.get(k) == Some(v)) {
        info!(node = %config.name, "node already registered");
        return Ok(existing);
    }
    let patch = serde_json::json!({ "metadata": { "labels": wanted } });
    let node = nodes.patch(&config.name, &PatchParams::default(), &Patch::Strategic(patch)).await?;
    info!(node = %config.name, "node already registered; labels updated");
    Ok(node)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use k8s_openapi::api::core::v1::Taint;

    use super::*;

    fn config(hostname: &str) -> NodeConfig {
        NodeConfig {
            name: "node1".into(),
            internal_ip: "10.0.0.5".parse().unwrap(),
            hostname: hostname.into(),
            kubelet_port: 10250,
            max_pods: 110,
            role: "worker".into(),
            taint: Some(Taint {
                key: "hpk.io/virtual".into(),
                effect: "NoSchedule".into(),
                ..Default::default()
            }),
            root_dir: PathBuf::from("/"),
            net_forwarder_socket: None,
            disk_pressure_percent: 10,
            env: None,
            capacity: None,
            gpus: None,
        }
    }

    #[test]
    fn labels_and_taint_of_a_new_node() {
        let node = new_node(&config("host1"));
        let labels = node.metadata.labels.unwrap();
        assert_eq!(labels.get(ROLE_LABEL).map(String::as_str), Some("worker"));
        assert_eq!(labels.get("kubernetes.io/hostname").map(String::as_str), Some("host1"));
        assert!(!labels.keys().any(|k| k.starts_with("node-role.kubernetes.io/")));
        assert_eq!(node.spec.unwrap().taints.unwrap()[0].key, "hpk.io/virtual");
    }

    #[test]
    fn a_hostname_that_is_no_label_value_gives_way_to_the_name() {
        let long = format!("{}.example.org", "h".repeat(60));
        let labels = labels(&config(&long));
        assert_eq!(labels.get("kubernetes.io/hostname").map(String::as_str), Some("node1"));
        assert!(is_label_value("a.b-c_d") && !is_label_value("-a") && !is_label_value("a b"));
    }
}
