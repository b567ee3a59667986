//! Service links: the `<NAME>_SERVICE_HOST`, `<NAME>_SERVICE_PORT` and Docker-link variables
//! the kubelet gives every container for the Services of its namespace (unless the pod sets
//! `enableServiceLinks: false`) and, always, for the `kubernetes` Service of `default`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Service;

/// The namespace of the API server's own Service.
const MASTER_NAMESPACE: &str = "default";
/// The API server's own Service, whose variables every container gets.
const MASTER_SERVICE: &str = "kubernetes";

/// A Service's name as a variable name: upper case, `-` as `_`.
fn var_name(name: &str) -> String {
    name.to_ascii_uppercase().replace('-', "_")
}

/// Whether `service` has a cluster IP (not headless, not ExternalName).
fn has_cluster_ip(service: &Service) -> bool {
    service
        .spec
        .as_ref()
        .and_then(|s| s.cluster_ip.as_deref())
        .is_some_and(|ip| !ip.is_empty() && ip != "None")
}

/// The service-link variables of a pod in `namespace` from all of the cluster's `services`,
/// sorted by name. The `kubernetes` Service of `default` is always included; with
/// `enable_links` the Services of `namespace` are too, one of them named `kubernetes`
/// taking that name's place.
pub fn service_env<'a>(
    services: impl IntoIterator<Item = &'a Service>,
    namespace: &str,
    enable_links: bool,
) -> BTreeMap<String, String> {
    let mut chosen: BTreeMap<&str, &Service> = BTreeMap::new();
    for service in services.into_iter().filter(|s| has_cluster_ip(s)) {
        let Some(name) = service.metadata.name.as_deref() else { continue };
        let ns = service.metadata.namespace.as_deref().unwrap_or_default();
        if ns == MASTER_NAMESPACE && name == MASTER_SERVICE {
            chosen.entry(name).or_insert(service);
        } else if ns == namespace && enable_links {
            chosen.insert(name, service);
        }
    }
    let mut env = BTreeMap::new();
    for (name, service) in chosen {
        add_service(&mut env, name, service);
    }
    env
}

/// One Service's variables, as the kubelet writes them.
fn add_service(env: &mut BTreeMap<String, String>, name: &str, service: &Service) {
    let Some(spec) = service.spec.as_ref() else { return };
    let ip = spec.cluster_ip.clone().unwrap_or_default();
    let ports = spec.ports.as_deref().unwrap_or_default();
    // The API server refuses a Service with a cluster IP and no port; such a one is skipped.
    let Some(first) = ports.first() else { return };
    let name = var_name(name);
    env.insert(format!("{name}_SERVICE_HOST"), ip.clone());
    env.insert(format!("{name}_SERVICE_PORT"), first.port.to_string());
    for port in ports {
        if let Some(port_name) = port.name.as_deref().filter(|n| !n.is_empty()) {
            env.insert(format!("{name}_SERVICE_PORT_{}", var_name(port_name)), port.port.to_string());
        }
    }
    // Docker links: <NAME>_PORT for the first port, and for each one
    // <NAME>_PORT_<port>_<PROTO>{,_PROTO,_PORT,_ADDR}.
    for (i, port) in ports.iter().enumerate() {
        let protocol = port.protocol.as_deref().unwrap_or("TCP");
        let lower = protocol.to_ascii_lowercase();
        let url = format!("{lower}://{ip}:{}", port.port);
        if i == 0 {
            env.insert(format!("{name}_PORT"), url.clone());
        }
        let prefix = format!("{name}_PORT_{}_{}", port.port, protocol.to_ascii_uppercase());
        env.insert(format!("{prefix}_PROTO"), lower);
        env.insert(format!("{prefix}_PORT"), port.port.to_string());
        env.insert(format!("{prefix}_ADDR"), ip.clone());
        env.insert(prefix, url);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn service(namespace: &str, name: &str, ip: &str, ports: serde_json::Value) -> Service {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"clusterIP": ip, "ports": ports},
        }))
        .expect("service")
    }

    fn cluster() -> Vec<Service> {
        vec![
            service("default", "kubernetes", "10.96.0.1", json!([{"name": "https", "port": 443}])),
            service(
                "app",
                "web-front",
                "10.96.3.4",
                json!([{"name": "http", "port": 80}, {"name": "metrics", "port": 9090, "protocol": "TCP"}]),
            ),
            service("app", "dns", "10.96.3.5", json!([{"port": 53, "protocol": "UDP"}])),
            service("app", "headless", "None", json!([{"port": 80}])),
            service("other", "db", "10.96.9.9", json!([{"port": 5432}])),
        ]
    }

    #[test]
    fn services_of_the_namespace_and_the_api_server_as_the_kubelet_names_them() {
        let env = service_env(&cluster(), "app", true);
        let get = |k: &str| env.get(k).map(String::as_str);
        assert_eq!(get("KUBERNETES_SERVICE_HOST"), Some("10.96.0.1"));
        assert_eq!(get("KUBERNETES_SERVICE_PORT"), Some("443"));
        assert_eq!(get("KUBERNETES_SERVICE_PORT_HTTPS"), Some("443"));
        assert_eq!(get("KUBERNETES_PORT"), Some("tcp://10.96.0.1:443"));
        assert_eq!(get("KUBERNETES_PORT_443_TCP"), Some("tcp://10.96.0.1:443"));
        assert_eq!(get("KUBERNETES_PORT_443_TCP_PROTO"), Some("tcp"));
        assert_eq!(get("KUBERNETES_PORT_443_TCP_PORT"), Some("443"));
        assert_eq!(get("KUBERNETES_PORT_443_TCP_ADDR"), Some("10.96.0.1"));
        assert_eq!(get("WEB_FRONT_SERVICE_HOST"), Some("10.96.3.4"));
        assert_eq!(get("WEB_FRONT_SERVICE_PORT"), Some("80"));
        assert_eq!(get("WEB_FRONT_SERVICE_PORT_HTTP"), Some("80"));
        assert_eq!(get("WEB_FRONT_SERVICE_PORT_METRICS"), Some("9090"));
        assert_eq!(get("WEB_FRONT_PORT"), Some("tcp://10.96.3.4:80"), "the first port only");
        assert_eq!(get("WEB_FRONT_PORT_9090_TCP_ADDR"), Some("10.96.3.4"));
        assert_eq!(get("DNS_PORT"), Some("udp://10.96.3.5:53"));
        assert_eq!(get("DNS_PORT_53_UDP_PROTO"), Some("udp"));
        assert!(env.keys().all(|k| !k.starts_with("HEADLESS") && !k.starts_with("DB_")), "{env:?}");
        assert_eq!(env.len(), 8 + 13 + 7, "{env:?}");
    }

    #[test]
    fn without_links_only_the_api_server_and_a_local_kubernetes_service_takes_its_place() {
        let env = service_env(&cluster(), "app", false);
        assert!(env.keys().all(|k| k.starts_with("KUBERNETES_")), "{env:?}");
        assert_eq!(env.len(), 8);

        let mut services = cluster();
        services.push(service("app", "kubernetes", "10.96.7.7", json!([{"port": 8080}])));
        let env = service_env(&services, "app", true);
        assert_eq!(env.get("KUBERNETES_SERVICE_HOST").map(String::as_str), Some("10.96.7.7"));
        let env = service_env(&services, "app", false);
        assert_eq!(env.get("KUBERNETES_SERVICE_HOST").map(String::as_str), Some("10.96.0.1"));
    }

    #[test]
    fn a_service_without_an_address_or_ports_gives_nothing() {
        let odd: Service = serde_json::from_value(json!({
            "metadata": {"name": "odd", "namespace": "app"},
            "spec": {"clusterIP": "10.96.1.1"},
        }))
        .expect("service");
        let external: Service = serde_json::from_value(json!({
            "metadata": {"name": "ext", "namespace": "app"},
            "spec": {"type": "ExternalName", "externalName": "example.org"},
        }))
        .expect("service");
        assert!(service_env(&[odd, external], "app", true).is_empty());
    }
}
