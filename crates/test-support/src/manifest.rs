//! The manifests tests create: pods as JSON a Kubernetes client deserializes, and the
//! Deployment, Service and httpd container of the end-to-end suites as YAML for `kubectl apply`.

use serde_json::{Value, json};

/// A pod of one container `main` running `command` in `image`, with a one-second grace period
/// (tests delete many pods), labelled `labels`.
pub fn pod(name: &str, image: &str, command: &[&str], labels: &[(&str, &str)]) -> Value {
    let labels: serde_json::Map<String, Value> =
        labels.iter().map(|(k, v)| ((*k).to_owned(), Value::from(*v))).collect();
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": image, "command": command}]
        }
    })
}

/// A Deployment `name` of `replicas` pods labelled `app: <name>`, spread over nodes (maxSkew 1
/// by `kubernetes.io/hostname`, `whenUnsatisfiable: <when>`), each with `grace` seconds to
/// terminate when given; `container` is one item of its container list, YAML from `- `.
pub fn spread_deployment(
    name: &str,
    replicas: u32,
    when: &str,
    grace: Option<u32>,
    container: &str,
) -> String {
    let container = container.trim_end().replace('\n', "\n      ");
    let grace = grace.map(|g| format!("      terminationGracePeriodSeconds: {g}\n")).unwrap_or_default();
    format!(
        "apiVersion: apps/v1
kind: Deployment
metadata: {{name: {name}}}
spec:
  replicas: {replicas}
  selector: {{matchLabels: {{app: {name}}}}}
  template:
    metadata: {{labels: {{app: {name}}}}}
    spec:
{grace}      topologySpreadConstraints:
      - {{maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: {when}, labelSelector: {{matchLabels: {{app: {name}}}}}}}
      containers:
      {container}
"
    )
}

/// The container item (YAML from `- `) of busybox httpd on port 8080 in `image`, serving
/// `pod=<its pod> node=<its node>` so a client sees which replica answered; ready once its port
/// takes connections.
pub fn httpd_who_answers(image: &str) -> String {
    format!(
        "- name: httpd
  image: {image}
  command: [sh, -c, 'echo \"pod=$(hostname) node=$NODE_NAME\" > /www/index.html && exec httpd -f -p 8080 -h /www']
  env: [{{name: NODE_NAME, valueFrom: {{fieldRef: {{fieldPath: spec.nodeName}}}}}}]
  ports: [{{containerPort: 8080}}]
  readinessProbe: {{tcpSocket: {{port: 8080}}, periodSeconds: 1}}
"
    )
}

/// A ClusterIP Service `name` on port 80 to port `target_port` of the pods labelled
/// `app: <selects>`.
pub fn service(name: &str, selects: &str, target_port: u16) -> String {
    format!(
        "apiVersion: v1
kind: Service
metadata: {{name: {name}}}
spec:
  selector: {{app: {selects}}}
  ports: [{{port: 80, targetPort: {target_port}}}]
"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spread_deployment_nests_its_container_under_the_pod_spec() {
        let yaml = spread_deployment("web", 4, "DoNotSchedule", Some(1), &httpd_who_answers("img"));
        assert!(
            yaml.contains("      terminationGracePeriodSeconds: 1\n      topologySpreadConstraints:"),
            "{yaml}"
        );
        assert!(yaml.contains("      containers:\n      - name: httpd\n        image: img\n"), "{yaml}");
        assert!(
            yaml.contains("        readinessProbe: {tcpSocket: {port: 8080}, periodSeconds: 1}\n"),
            "{yaml}"
        );
        assert!(
            !spread_deployment("a", 1, "ScheduleAnyway", None, "- {name: c, image: i}")
                .contains("termination")
        );
        assert!(
            service("web", "web", 8080)
                .contains("selector: {app: web}\n  ports: [{port: 80, targetPort: 8080}]")
        );
    }

    #[test]
    fn a_pod_has_its_one_container_labels_and_short_grace() {
        let p = pod("p", "img", &["sleep", "1"], &[("app", "x")]);
        assert_eq!(p["metadata"]["name"], "p");
        assert_eq!(p["spec"]["containers"][0]["image"], "img");
        assert_eq!(p["spec"]["containers"][0]["command"], serde_json::json!(["sleep", "1"]));
        assert_eq!(p["spec"]["terminationGracePeriodSeconds"], 1);
        assert_eq!(p["metadata"]["labels"]["app"], "x");
    }
}
