//! The pod manifests tests create, as JSON a Kubernetes client deserializes.

use serde_json::{Value, json};

/// A pod of one container `main` running `command` in `image`, with a one-second grace period
/// (tests delete many pods), labelled `labels`. Add fields with [`with`].
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

/// `manifest` with the fields of `patch` merged in (objects merged key by key, anything else
/// replaced), e.g. `with(pod(..), json!({"spec": {"nodeName": "node1"}}))`.
pub fn with(mut manifest: Value, patch: Value) -> Value {
    merge(&mut manifest, patch);
    manifest
}

fn merge(into: &mut Value, patch: Value) {
    match (into, patch) {
        (Value::Object(into), Value::Object(patch)) => {
            for (key, value) in patch {
                merge(into.entry(key).or_insert(Value::Null), value);
            }
        }
        (into, patch) => *into = patch,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_patch_adds_fields_and_keeps_the_others() {
        let p = with(pod("p", "img", &["sleep", "1"], &[("app", "x")]), json!({"spec": {"nodeName": "n1"}}));
        assert_eq!(p["spec"]["nodeName"], "n1");
        assert_eq!(p["spec"]["containers"][0]["command"], json!(["sleep", "1"]));
        assert_eq!(p["metadata"]["labels"]["app"], "x");
    }
}
