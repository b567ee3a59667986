use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, Service};

use super::{Owner, Want, plan};
use crate::host_ports::Protocol::{self, Tcp, Udp};

const NODE: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 10);

fn service(name: &str, json: serde_json::Value) -> Arc<Service> {
    let mut s: Service = serde_json::from_value(json).expect("service");
    s.metadata.name = Some(name.into());
    s.metadata.namespace = Some("default".into());
    Arc::new(s)
}

fn pod(name: &str, spec: serde_json::Value, status: serde_json::Value) -> Arc<Pod> {
    let p: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec,
        "status": status,
    }))
    .expect("pod");
    Arc::new(p)
}

fn svc_owner(name: &str) -> Owner {
    Owner::Service { namespace: "default".into(), name: name.into() }
}

fn pod_owner(name: &str) -> Owner {
    Owner::Pod { namespace: "default".into(), name: name.into() }
}

#[test]
fn node_ports_and_load_balancer_ports_go_to_the_cluster_ip() {
    let np = service(
        "web",
        serde_json::json!({"spec": {"type": "NodePort", "clusterIP": "10.96.0.20",
            "ports": [{"port": 80, "targetPort": 8080, "nodePort": 30080}]}}),
    );
    let lb = service(
        "lb",
        serde_json::json!({"spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.21",
            "ports": [{"port": 8443, "nodePort": 30443, "protocol": "TCP"}]}}),
    );
    let classed = service(
        "other-lb",
        serde_json::json!({"spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.22",
            "loadBalancerClass": "example.com/lb", "ports": [{"port": 9000, "nodePort": 30900}]}}),
    );
    let internal = service(
        "internal",
        serde_json::json!({"spec": {"type": "ClusterIP", "clusterIP": "10.96.0.23", "ports": [{"port": 81}]}}),
    );
    // DNS over both protocols: the same node port number twice, two host ports.
    let dns = service(
        "dns",
        serde_json::json!({"spec": {"type": "NodePort", "clusterIP": "10.96.0.10", "ports": [
            {"name": "udp", "port": 53, "nodePort": 30053, "protocol": "UDP"},
            {"name": "tcp", "port": 53, "nodePort": 30053, "protocol": "TCP"},
            {"name": "sctp", "port": 5353, "nodePort": 30054, "protocol": "SCTP"}]}}),
    );
    let plan = plan(&[np, lb, classed, internal, dns], &[], NODE);
    let to = |ip: &str, port: u16| SocketAddr::new(ip.parse().expect("ip"), port);
    let got: Vec<((Protocol, u16), Want)> = plan.ports.into_iter().collect();
    assert_eq!(
        got,
        vec![
            ((Tcp, 8443), Want { target: to("10.96.0.21", 8443), owner: svc_owner("lb") }),
            ((Tcp, 30053), Want { target: to("10.96.0.10", 53), owner: svc_owner("dns") }),
            ((Tcp, 30080), Want { target: to("10.96.0.20", 80), owner: svc_owner("web") }),
            ((Tcp, 30443), Want { target: to("10.96.0.21", 8443), owner: svc_owner("lb") }),
            // Another controller's LoadBalancer: its nodePort only.
            ((Tcp, 30900), Want { target: to("10.96.0.22", 9000), owner: svc_owner("other-lb") }),
            ((Udp, 30053), Want { target: to("10.96.0.10", 53), owner: svc_owner("dns") }),
        ]
    );
    let refused: Vec<(Owner, u16)> = plan.refused.iter().map(|(o, p, _)| (o.clone(), *p)).collect();
    assert_eq!(refused, vec![(svc_owner("dns"), 30054)]);
    assert!(plan.refused[0].2.contains("SCTP"), "{}", plan.refused[0].2);
}

#[test]
fn host_ports_go_to_the_pod_and_are_the_pods_first() {
    let running = pod(
        "hp",
        serde_json::json!({"containers": [{"name": "c", "ports": [
            {"containerPort": 8080, "hostPort": 30080},
            {"containerPort": 9090},
            {"containerPort": 9091, "hostPort": 9091, "hostIP": "198.51.100.1"},
            {"containerPort": 53, "hostPort": 5353, "protocol": "UDP"},
            {"containerPort": 54, "hostPort": 5354, "protocol": "SCTP"}]}]}),
        serde_json::json!({"phase": "Running", "podIP": "10.244.1.5"}),
    );
    let host_net = pod(
        "hn",
        serde_json::json!({"hostNetwork": true, "containers": [{"name": "c", "ports": [
            {"containerPort": 7000, "hostPort": 7000}]}]}),
        serde_json::json!({"phase": "Running", "podIP": "192.0.2.10"}),
    );
    let done = pod(
        "done",
        serde_json::json!({"containers": [{"name": "c", "ports": [{"containerPort": 1, "hostPort": 7001}]}]}),
        serde_json::json!({"phase": "Succeeded", "podIP": "10.244.1.6"}),
    );
    let no_ip = pod(
        "pending",
        serde_json::json!({"containers": [{"name": "c", "ports": [{"containerPort": 1, "hostPort": 7002}]}]}),
        serde_json::json!({"phase": "Pending"}),
    );
    // A NodePort that a pod's hostPort already has: the pod keeps it, the Service is told.
    let clash = service(
        "clash",
        serde_json::json!({"spec": {"type": "NodePort", "clusterIP": "10.96.0.30",
            "ports": [{"port": 80, "nodePort": 30080}]}}),
    );
    let plan = plan(&[clash], &[running, host_net, done, no_ip], NODE);
    let got: Vec<((Protocol, u16), SocketAddr, Owner)> =
        plan.ports.into_iter().map(|(p, w)| (p, w.target, w.owner)).collect();
    assert_eq!(
        got,
        vec![
            ((Tcp, 7000), SocketAddr::from((Ipv4Addr::LOCALHOST, 7000)), pod_owner("hn")),
            ((Tcp, 30080), SocketAddr::from(([10, 244, 1, 5], 8080)), pod_owner("hp")),
            ((Udp, 5353), SocketAddr::from(([10, 244, 1, 5], 53)), pod_owner("hp")),
        ]
    );
    let refused: Vec<(Owner, u16)> = plan.refused.iter().map(|(o, p, _)| (o.clone(), *p)).collect();
    assert_eq!(refused, vec![(pod_owner("hp"), 5354), (svc_owner("clash"), 30080)]);
    assert!(plan.refused[0].2.contains("SCTP"), "{}", plan.refused[0].2);
    assert!(plan.refused[1].2.contains("pod default/hp"), "{}", plan.refused[1].2);
}

#[test]
fn a_terminating_pod_and_a_headless_service_publish_nothing() {
    let mut going = (*pod(
        "going",
        serde_json::json!({"containers": [{"name": "c", "ports": [{"containerPort": 80, "hostPort": 8080}]}]}),
        serde_json::json!({"phase": "Running", "podIP": "10.244.1.7"}),
    ))
    .clone();
    going.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
    let headless = service(
        "headless",
        serde_json::json!({"spec": {"type": "NodePort", "clusterIP": "None", "ports": [{"port": 80, "nodePort": 30081}]}}),
    );
    let plan = plan(&[headless], &[Arc::new(going)], NODE);
    assert!(plan.ports.is_empty(), "{:?}", plan.ports);
}
