//! LoadBalancer Services get the nodes' addresses, as K3s's ServiceLB gives them: the
//! controller bubble writes `status.loadBalancer.ingress` — the distinct InternalIPs of the
//! Ready nodes, `ipMode: VIP` — on every LoadBalancer Service without a `loadBalancerClass`,
//! and each node publishes the Service's ports on its host ([`super::ports`]). A Service that
//! stops being a LoadBalancer has the addresses taken off again.
//!
//! It runs as its own identity, `system:hpk-service-lb` ([`RBAC_NAME`]: read Services and
//! Nodes, write Services' status, nothing else).

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{LoadBalancerIngress, Node, Service};
use kube::Api;
use kube::api::{Patch, PatchParams};
use kube::runtime::{WatchStreamExt, reflector, watcher};

/// The identity's common name and its ClusterRole's (and binding's) name.
pub const USER: &str = "system:hpk-service-lb";
pub const RBAC_NAME: &str = "hpk:service-lb";

/// The ingress a Service should show: the nodes' addresses for a LoadBalancer of no class,
/// nothing otherwise.
pub fn ingress(service: &Service, nodes: &[Arc<Node>]) -> Vec<String> {
    let Some(spec) = &service.spec else { return Vec::new() };
    if spec.type_.as_deref() != Some("LoadBalancer") || spec.load_balancer_class.is_some() {
        return Vec::new();
    }
    let mut ips: Vec<String> = nodes
        .iter()
        .filter(|n| ready(n))
        .flat_map(|n| n.status.iter().flat_map(|s| s.addresses.iter().flatten()))
        .filter(|a| a.type_ == "InternalIP")
        .map(|a| a.address.clone())
        .collect();
    ips.sort();
    ips.dedup();
    ips
}

fn ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn current(service: &Service) -> Vec<String> {
    let mut ips: Vec<String> = service
        .status
        .iter()
        .filter_map(|s| s.load_balancer.as_ref())
        .flat_map(|lb| lb.ingress.iter().flatten())
        .filter_map(|i| i.ip.clone())
        .collect();
    ips.sort();
    ips
}

/// Keeps the Services' ingress for ever.
pub async fn run(client: kube::Client) {
    let (services, services_writer) = reflector::store::<Service>();
    let (nodes, nodes_writer) = reflector::store::<Node>();
    let changed = Arc::new(tokio::sync::Notify::new());
    let services_api: Api<Service> = Api::all(client.clone());
    let follow = |stream: futures_util::stream::BoxStream<'static, ()>| {
        let changed = changed.clone();
        tokio::spawn(async move {
            let mut stream = stream;
            while stream.next().await.is_some() {
                changed.notify_one();
            }
        });
    };
    follow(
        reflector::reflector(services_writer, watcher(services_api.clone(), watcher::Config::default()))
            .default_backoff()
            .map(|_| ())
            .boxed(),
    );
    follow(
        reflector::reflector(
            nodes_writer,
            watcher(Api::<Node>::all(client.clone()), watcher::Config::default()),
        )
        .default_backoff()
        .map(|_| ())
        .boxed(),
    );
    loop {
        tokio::select! {
            () = changed.notified() => tokio::time::sleep(Duration::from_millis(200)).await,
            () = tokio::time::sleep(Duration::from_secs(30)) => {}
        }
        let nodes = nodes.state();
        for service in services.state() {
            // Another controller's load balancer: its status is that controller's.
            if service.spec.as_ref().is_some_and(|s| s.load_balancer_class.is_some()) {
                continue;
            }
            let want = ingress(&service, &nodes);
            if want == current(&service) {
                continue;
            }
            let (Some(ns), Some(name)) = (&service.metadata.namespace, &service.metadata.name) else {
                continue;
            };
            let entries: Vec<LoadBalancerIngress> = want
                .iter()
                .map(|ip| LoadBalancerIngress {
                    ip: Some(ip.clone()),
                    ip_mode: Some("VIP".into()),
                    ..Default::default()
                })
                .collect();
            let patch = serde_json::json!({"status": {"loadBalancer": {"ingress": entries}}});
            let api: Api<Service> = Api::namespaced(client.clone(), ns);
            match api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                Ok(_) => {
                    tracing::info!(service = %format!("{ns}/{name}"), ingress = ?want, "load balancer addresses set")
                }
                Err(e) => {
                    tracing::warn!(service = %format!("{ns}/{name}"), error = %e, "could not set the load balancer's addresses")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(ip: &str, ready: &str) -> Arc<Node> {
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": ip},
                "status": {
                    "addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": "h"}],
                    "conditions": [{"type": "Ready", "status": ready}],
                },
            }))
            .expect("node"),
        )
    }

    fn service(spec: serde_json::Value) -> Service {
        serde_json::from_value(serde_json::json!({"metadata": {"name": "s", "namespace": "d"}, "spec": spec}))
            .expect("service")
    }

    #[test]
    fn a_load_balancer_gets_the_ready_nodes_addresses_once_each() {
        let nodes = [
            node("192.0.2.2", "True"),
            node("192.0.2.1", "True"),
            node("192.0.2.1", "True"),
            node("192.0.2.3", "False"),
        ];
        let lb = service(serde_json::json!({"type": "LoadBalancer", "ports": [{"port": 80}]}));
        assert_eq!(ingress(&lb, &nodes), ["192.0.2.1", "192.0.2.2"]);
        let classed = service(
            serde_json::json!({"type": "LoadBalancer", "loadBalancerClass": "x/y", "ports": [{"port": 80}]}),
        );
        assert!(ingress(&classed, &nodes).is_empty());
        let node_port = service(serde_json::json!({"type": "NodePort", "ports": [{"port": 80}]}));
        assert!(ingress(&node_port, &nodes).is_empty());
    }
}
