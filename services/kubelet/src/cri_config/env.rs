//! The container's environment as the kubelet builds it: `envFrom` first, then `env`, each
//! `value` expanded against what is defined before it (then the service links), then the
//! service-link variables that neither defined.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::{ConfigMap, Container, EnvVar, Pod, Secret};

use super::SpecError;
use super::expand::expand;
use super::service_env::service_env;
use crate::downward::{self, PodFacts};
use crate::objects::ObjectSource;

/// The environment of one container, resolved.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResolvedEnv {
    /// Name and value, in the order each name was first defined; a later definition of the
    /// same name replaced the value in place.
    pub vars: Vec<(String, String)>,
    /// `envFrom` keys (with their prefix) skipped for not being valid variable names.
    pub skipped: Vec<String>,
    /// One message per `envFrom` source with skipped keys, worded as the kubelet's
    /// `InvalidEnvironmentVariableNames` warning event.
    pub warnings: Vec<String>,
}

impl ResolvedEnv {
    /// The variables as a map (for lookups and `$(VAR)` expansion).
    pub fn to_map(&self) -> BTreeMap<String, String> {
        self.vars.iter().cloned().collect()
    }

    /// The value of `name`, if defined.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    fn set(&mut self, index: &mut HashMap<String, usize>, name: String, value: String) {
        match index.get(&name) {
            Some(&i) => self.vars[i].1 = value,
            None => {
                index.insert(name.clone(), self.vars.len());
                self.vars.push((name, value));
            }
        }
    }
}

/// A valid environment variable name as the kubelet checks `envFrom` keys since 1.34
/// (RelaxedEnvironmentVariableValidation, GA): one or more printable ASCII characters, `=`
/// excepted.
fn is_env_var_name(name: &str) -> bool {
    !name.is_empty() && name.chars().all(|c| (' '..='~').contains(&c) && c != '=')
}

/// ConfigMaps and Secrets read once per resolution, absent ones remembered as `None`.
struct Objects<'a, O> {
    source: &'a O,
    namespace: String,
    config_maps: HashMap<String, Option<ConfigMap>>,
    secrets: HashMap<String, Option<Secret>>,
}

impl<O: ObjectSource> Objects<'_, O> {
    async fn config_map(&mut self, name: &str) -> Result<Option<&ConfigMap>, SpecError> {
        if !self.config_maps.contains_key(name) {
            let found =
                self.source.config_map(&self.namespace, name).await.map_err(|source| SpecError::Read {
                    kind: "configmap",
                    namespace: self.namespace.clone(),
                    name: name.into(),
                    source: Box::new(source),
                })?;
            self.config_maps.insert(name.to_owned(), found);
        }
        Ok(self.config_maps.get(name).and_then(Option::as_ref))
    }

    async fn secret(&mut self, name: &str) -> Result<Option<&Secret>, SpecError> {
        if !self.secrets.contains_key(name) {
            let found =
                self.source.secret(&self.namespace, name).await.map_err(|source| SpecError::Read {
                    kind: "secret",
                    namespace: self.namespace.clone(),
                    name: name.into(),
                    source: Box::new(source),
                })?;
            self.secrets.insert(name.to_owned(), found);
        }
        Ok(self.secrets.get(name).and_then(Option::as_ref))
    }
}

fn secret_data(secret: &Secret) -> BTreeMap<String, String> {
    secret
        .data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), String::from_utf8_lossy(&v.0).into_owned()))
        .collect()
}

/// The container's environment, in order: `envFrom` (configMapRef/secretRef, with prefix and
/// optional; keys that are not valid names are skipped and listed in
/// [`ResolvedEnv::skipped`]), then `env` (`value` with `$(VAR)` expansion against what is
/// defined before it; `valueFrom`: configMapKeyRef, secretKeyRef, fieldRef,
/// resourceFieldRef). A later definition of a name replaces the earlier value. Last, the
/// service-link variables (see [`service_env`]) of names neither defined; `$(VAR)` finds them
/// too.
pub async fn resolve_env(
    pod: &Pod,
    container: &Container,
    facts: &PodFacts,
    objects: &impl ObjectSource,
) -> Result<ResolvedEnv, SpecError> {
    let namespace = pod.metadata.namespace.clone().unwrap_or_else(|| "default".into());
    let mut objects =
        Objects { source: objects, namespace, config_maps: HashMap::new(), secrets: HashMap::new() };
    let mut env = ResolvedEnv::default();
    let mut index = HashMap::new();
    let links = pod.spec.as_ref().and_then(|s| s.enable_service_links).unwrap_or(true);
    let services = objects.source.services().await?;
    let services = service_env(services.iter().map(AsRef::as_ref), &objects.namespace, links);

    for from in container.env_from.iter().flatten() {
        let prefix = from.prefix.as_deref().unwrap_or_default();
        let (kind, name, data) = if let Some(cm) = &from.config_map_ref {
            match objects.config_map(&cm.name).await? {
                Some(found) => ("configMap", &cm.name, found.data.clone().unwrap_or_default()),
                None if cm.optional == Some(true) => continue,
                None => return Err(SpecError::NotFound { kind: "configmap", name: cm.name.clone() }),
            }
        } else if let Some(secret) = &from.secret_ref {
            match objects.secret(&secret.name).await? {
                Some(found) => ("secret", &secret.name, secret_data(found)),
                None if secret.optional == Some(true) => continue,
                None => return Err(SpecError::NotFound { kind: "secret", name: secret.name.clone() }),
            }
        } else {
            continue;
        };
        let mut invalid = Vec::new();
        for (key, value) in data {
            let key = format!("{prefix}{key}");
            if is_env_var_name(&key) {
                env.set(&mut index, key, value);
            } else {
                invalid.push(key);
            }
        }
        if !invalid.is_empty() {
            invalid.sort();
            env.warnings.push(format!(
                "Keys [{}] from the EnvFrom {kind} {}/{name} were skipped since they are considered invalid \
                 environment variable names.",
                invalid.join(", "),
                objects.namespace,
            ));
            env.skipped.extend(invalid);
        }
    }

    for var in container.env.iter().flatten() {
        let defined = Defined { env: &env, index: &index, services: &services };
        if let Some(value) = env_value(pod, container, facts, &mut objects, &defined, var).await? {
            env.set(&mut index, var.name.clone(), value);
        }
    }
    for (name, value) in services {
        if !index.contains_key(&name) {
            env.set(&mut index, name, value);
        }
    }
    Ok(env)
}

/// What `$(VAR)` can refer to: the variables defined so far, then the service links.
struct Defined<'a> {
    env: &'a ResolvedEnv,
    index: &'a HashMap<String, usize>,
    services: &'a BTreeMap<String, String>,
}

impl Defined<'_> {
    fn get(&self, name: &str) -> Option<String> {
        self.index.get(name).map(|&i| self.env.vars[i].1.clone()).or_else(|| self.services.get(name).cloned())
    }
}

/// One `env` entry's value; `None` when an optional source is absent (the variable is then
/// not defined at all, as with the kubelet).
async fn env_value<O: ObjectSource>(
    pod: &Pod,
    container: &Container,
    facts: &PodFacts,
    objects: &mut Objects<'_, O>,
    defined: &Defined<'_>,
    var: &EnvVar,
) -> Result<Option<String>, SpecError> {
    let value = var.value.as_deref().unwrap_or_default();
    let Some(from) = var.value_from.as_ref().filter(|_| value.is_empty()) else {
        return Ok(Some(expand(value, &|name: &str| defined.get(name))));
    };
    let downward = |source| SpecError::Downward { env: var.name.clone(), source };
    if let Some(field) = &from.field_ref {
        return downward::field_value(pod, field, facts).map(Some).map_err(downward);
    }
    if let Some(resource) = &from.resource_field_ref {
        return downward::resource_value(pod, Some(container), resource, facts).map(Some).map_err(downward);
    }
    if let Some(sel) = &from.config_map_key_ref {
        let optional = sel.optional == Some(true);
        let Some(cm) = objects.config_map(&sel.name).await? else {
            return if optional {
                Ok(None)
            } else {
                Err(SpecError::NotFound { kind: "configmap", name: sel.name.clone() })
            };
        };
        return match cm.data.as_ref().and_then(|d| d.get(&sel.key)) {
            Some(value) => Ok(Some(value.clone())),
            None if optional => Ok(None),
            None => Err(SpecError::MissingKey {
                kind: "ConfigMap",
                key: sel.key.clone(),
                namespace: objects.namespace.clone(),
                name: sel.name.clone(),
            }),
        };
    }
    if let Some(sel) = &from.secret_key_ref {
        let optional = sel.optional == Some(true);
        let Some(secret) = objects.secret(&sel.name).await? else {
            return if optional {
                Ok(None)
            } else {
                Err(SpecError::NotFound { kind: "secret", name: sel.name.clone() })
            };
        };
        return match secret.data.as_ref().and_then(|d| d.get(&sel.key)) {
            Some(value) => Ok(Some(String::from_utf8_lossy(&value.0).into_owned())),
            None if optional => Ok(None),
            None => Err(SpecError::MissingKey {
                kind: "Secret",
                key: sel.key.clone(),
                namespace: objects.namespace.clone(),
                name: sel.name.clone(),
            }),
        };
    }
    if from.file_key_ref.is_some() {
        return Err(SpecError::Unsupported { env: var.name.clone(), what: "valueFrom.fileKeyRef" });
    }
    // An empty valueFrom: the API server refuses it; an empty value is what is left.
    Ok(Some(String::new()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri_config::fixtures::{FakeObjects, pod};
    use serde_json::json;

    fn facts() -> PodFacts {
        PodFacts { node_name: "node1".into(), pod_ips: vec!["10.244.1.5".into()], ..PodFacts::default() }
    }

    async fn resolve(container: serde_json::Value, objects: &FakeObjects) -> Result<ResolvedEnv, SpecError> {
        let pod = pod(json!({"containers": [container]}));
        let c = pod.spec.as_ref().expect("spec").containers[0].clone();
        resolve_env(&pod, &c, &facts(), objects).await
    }

    fn pairs(env: &ResolvedEnv) -> Vec<(&str, &str)> {
        env.vars.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
    }

    fn objects() -> FakeObjects {
        FakeObjects::default()
            .with_config_map("cm", &[("color", "blue"), ("size", "L"), ("1bad", "x"), ("has=equals", "y")])
            .with_secret("sec", &[("password", "hunter2"), ("user", "admin")])
    }

    #[tokio::test]
    async fn env_from_comes_first_and_env_overrides_in_place() {
        let env = resolve(
            json!({"name": "c", "image": "i",
                   "envFrom": [{"configMapRef": {"name": "cm"}, "prefix": "CM_"}, {"secretRef": {"name": "sec"}}],
                   "env": [{"name": "FIRST", "value": "1"},
                           {"name": "user", "value": "root"},
                           {"name": "FIRST", "value": "again-$(FIRST)"}]}),
            &objects(),
        )
        .await
        .expect("resolves");
        assert_eq!(
            pairs(&env),
            [
                ("CM_1bad", "x"),
                ("CM_color", "blue"),
                ("CM_size", "L"),
                ("password", "hunter2"),
                ("user", "root"),
                ("FIRST", "again-1"),
            ]
        );
        assert_eq!(env.skipped, ["CM_has=equals"]);
        assert_eq!(env.get("user"), Some("root"));
        assert_eq!(env.to_map().len(), 6);
    }

    #[tokio::test]
    async fn invalid_env_from_keys_are_skipped_with_a_warning() {
        let env = resolve(
            json!({"name": "c", "image": "i", "envFrom": [{"configMapRef": {"name": "cm"}}]}),
            &objects(),
        )
        .await
        .expect("resolves");
        // Since 1.34 a name may start with a digit (any printable ASCII but `=`).
        assert_eq!(pairs(&env), [("1bad", "x"), ("color", "blue"), ("size", "L")]);
        assert_eq!(env.skipped, ["has=equals"]);
        assert_eq!(
            env.warnings,
            ["Keys [has=equals] from the EnvFrom configMap default/cm were skipped since they are \
              considered invalid environment variable names."]
        );
    }

    #[tokio::test]
    async fn values_expand_against_what_is_defined_before_them() {
        let env = resolve(
            json!({"name": "c", "image": "i", "envFrom": [{"configMapRef": {"name": "cm"}}],
                   "env": [{"name": "A", "value": "$(color)-$(B)"}, {"name": "B", "value": "b"},
                           {"name": "C", "value": "$(A)|$(B)|$$(B)"}]}),
            &objects(),
        )
        .await
        .expect("resolves");
        assert_eq!(env.get("A"), Some("blue-$(B)"), "B is defined after A");
        assert_eq!(env.get("C"), Some("blue-$(B)|b|$(B)"));
    }

    #[tokio::test]
    async fn key_refs_resolve_or_fail_unless_optional() {
        let c = |from: serde_json::Value| json!({"name": "c", "image": "i", "env": [{"name": "V", "valueFrom": from}]});
        let objects = objects();
        let env = resolve(c(json!({"configMapKeyRef": {"name": "cm", "key": "color"}})), &objects).await;
        assert_eq!(env.expect("present").get("V"), Some("blue"));
        let env = resolve(c(json!({"secretKeyRef": {"name": "sec", "key": "password"}})), &objects).await;
        assert_eq!(env.expect("present").get("V"), Some("hunter2"));

        let err = resolve(c(json!({"configMapKeyRef": {"name": "cm", "key": "k"}})), &objects).await;
        assert_eq!(
            err.expect_err("missing key").to_string(),
            r#"couldn't find key "k" in ConfigMap default/cm"#
        );
        let err = resolve(c(json!({"secretKeyRef": {"name": "sec", "key": "k"}})), &objects).await;
        assert_eq!(
            err.expect_err("missing key").to_string(),
            r#"couldn't find key "k" in Secret default/sec"#
        );
        let err = resolve(c(json!({"configMapKeyRef": {"name": "nope", "key": "k"}})), &objects).await;
        assert_eq!(err.expect_err("missing map").to_string(), r#"configmap "nope" not found"#);
        let err = resolve(c(json!({"secretKeyRef": {"name": "nope", "key": "k"}})), &objects).await;
        assert_eq!(err.expect_err("missing secret").to_string(), r#"secret "nope" not found"#);

        for from in [
            json!({"configMapKeyRef": {"name": "cm", "key": "k", "optional": true}}),
            json!({"configMapKeyRef": {"name": "nope", "key": "k", "optional": true}}),
            json!({"secretKeyRef": {"name": "sec", "key": "k", "optional": true}}),
            json!({"secretKeyRef": {"name": "nope", "key": "k", "optional": true}}),
        ] {
            let env = resolve(c(from.clone()), &objects).await.expect("optional");
            assert_eq!(env.get("V"), None, "{from}: an optional absent source defines nothing");
        }
    }

    #[tokio::test]
    async fn env_from_a_missing_source_fails_unless_optional() {
        let c = |from: serde_json::Value| json!({"name": "c", "image": "i", "envFrom": [from]});
        let err = resolve(c(json!({"configMapRef": {"name": "nope"}})), &objects()).await;
        assert_eq!(err.expect_err("missing").to_string(), r#"configmap "nope" not found"#);
        let err = resolve(c(json!({"secretRef": {"name": "nope"}})), &objects()).await;
        assert_eq!(err.expect_err("missing").to_string(), r#"secret "nope" not found"#);
        let env = resolve(c(json!({"secretRef": {"name": "nope", "optional": true}})), &objects()).await;
        assert!(env.expect("optional").vars.is_empty());
    }

    #[tokio::test]
    async fn downward_refs_resolve_to_the_pod_facts() {
        let env = resolve(
            json!({"name": "c", "image": "i", "resources": {"limits": {"memory": "64Mi"}}, "env": [
                {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                {"name": "NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "MEM", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}},
                {"name": "URL", "value": "http://$(IP):80"}]}),
            &objects(),
        )
        .await
        .expect("resolves");
        assert_eq!(
            pairs(&env),
            [("IP", "10.244.1.5"), ("NAME", "web"), ("MEM", "64"), ("URL", "http://10.244.1.5:80")]
        );

        let err = resolve(
            json!({"name": "c", "image": "i", "env": [{"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "spec.nope"}}}]}),
            &objects(),
        )
        .await;
        assert_eq!(
            err.expect_err("unsupported").to_string(),
            r#"env "X": unsupported fieldRef fieldPath "spec.nope""#
        );
    }

    #[tokio::test]
    async fn service_links_come_last_yield_to_env_and_expand() {
        let objects = objects()
            .with_service(json!({"metadata": {"name": "kubernetes", "namespace": "default"},
                                 "spec": {"clusterIP": "10.96.0.1", "ports": [{"name": "https", "port": 443}]}}))
            .with_service(json!({"metadata": {"name": "web", "namespace": "default"},
                                 "spec": {"clusterIP": "10.96.0.20", "ports": [{"port": 8080}]}}))
            .with_service(json!({"metadata": {"name": "db", "namespace": "other"},
                                 "spec": {"clusterIP": "10.96.0.30", "ports": [{"port": 5432}]}}));
        let container = json!({"name": "c", "image": "i", "env": [
            {"name": "WEB_SERVICE_HOST", "value": "mine"},
            {"name": "URL", "value": "http://$(WEB_SERVICE_HOST):$(WEB_SERVICE_PORT)/$(KUBERNETES_SERVICE_HOST)"}]});
        let run = |links: Option<bool>| {
            let mut spec = json!({"containers": [container.clone()]});
            if let Some(links) = links {
                spec["enableServiceLinks"] = json!(links);
            }
            let pod = pod(spec);
            let objects = &objects;
            async move {
                let c = pod.spec.as_ref().expect("spec").containers[0].clone();
                resolve_env(&pod, &c, &facts(), objects).await.expect("resolves")
            }
        };
        let env = run(None).await;
        assert_eq!(
            &env.vars[..2],
            [
                ("WEB_SERVICE_HOST".to_owned(), "mine".to_owned()),
                ("URL".to_owned(), "http://mine:8080/10.96.0.1".to_owned()),
            ]
        );
        assert_eq!(env.vars.iter().filter(|(k, _)| k == "WEB_SERVICE_HOST").count(), 1);
        assert_eq!(env.get("WEB_PORT"), Some("tcp://10.96.0.20:8080"));
        assert_eq!(env.get("KUBERNETES_SERVICE_PORT_HTTPS"), Some("443"));
        assert_eq!(env.get("DB_SERVICE_HOST"), None, "another namespace's");
        assert_eq!(env.vars.len(), 2 + 8 + 7 - 1);

        let env = run(Some(false)).await;
        assert_eq!(env.get("URL"), Some("http://mine:$(WEB_SERVICE_PORT)/10.96.0.1"));
        assert_eq!(env.get("WEB_PORT"), None);
        assert_eq!(env.get("KUBERNETES_SERVICE_HOST"), Some("10.96.0.1"), "the API server's always");
    }

    #[test]
    fn env_var_names_follow_the_kubelet_rule() {
        for good in ["A", "a_b", "-x", ".x", "x.y-z9", "_", "1a", "a b", "data-1", "$x"] {
            assert!(is_env_var_name(good), "{good}");
        }
        for bad in ["", "a=b", "é", "tab\there", "nl\n"] {
            assert!(!is_env_var_name(bad), "{bad}");
        }
    }
}
