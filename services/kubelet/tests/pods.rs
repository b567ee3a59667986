//! The kubelet against the real control plane, the real pod-runtime (crun) and the real
//! net-forwarder: a table of manifests, each checked by what `kubectl get` shows for its pods
//! and the events `kubectl get events` lists. Bad input is in the table too: every such pod
//! gets a clear status and events while the other pods keep running.

mod support;

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, Patch, PatchParams};
use support::{Cluster, eventually};

/// `kubectl get pod NAME` columns: (READY, STATUS, RESTARTS).
fn kubectl_row(c: &Cluster, name: &str) -> Option<(String, String, u32)> {
    let out = c.cp.kubectl().args(["get", "pod", name, "--no-headers"]).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let cols: Vec<&str> = text.split_whitespace().collect();
    if cols.len() < 4 {
        return None;
    }
    Some((cols[1].to_owned(), cols[2].to_owned(), cols[3].parse().ok()?))
}

/// One field of each event `kubectl get events --field-selector SELECTOR` lists.
fn event_field(c: &Cluster, selector: &str, field: &str) -> Vec<String> {
    let out = c.kubectl(&["get", "events", "--field-selector", selector, "-o", "json"]);
    let list: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
    list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e[field].as_str().map(str::to_owned))
        .collect()
}

/// The reasons of the events about object `name`, as `kubectl get events` lists them.
fn event_reasons(c: &Cluster, name: &str) -> Vec<String> {
    event_field(c, &format!("involvedObject.name={name}"), "reason")
}

/// The messages of the events about object `name` with reason `reason`.
fn event_messages(c: &Cluster, name: &str, reason: &str) -> Vec<String> {
    event_field(c, &format!("involvedObject.name={name},reason={reason}"), "message")
}

async fn has_events(c: &Cluster, name: &str, reasons: &[&str]) {
    eventually(c, &format!("events {reasons:?} for {name}"), Duration::from_secs(30), || async {
        let seen = event_reasons(c, name);
        reasons.iter().all(|r| seen.iter().any(|s| s == r)).then_some(())
    })
    .await;
}

async fn status_is(c: &Cluster, name: &str, status: &str, within: Duration) -> (String, String, u32) {
    eventually(c, &format!("pod {name} shows {status}"), within, || async {
        kubectl_row(c, name).filter(|(_, s, _)| s == status)
    })
    .await
}

/// Waits until `container` of pod `p` has written `text` to its log.
async fn log_shows(c: &Cluster, p: &Pod, container: &str, text: &str, within: Duration) {
    let what = format!("{container} of {} logs {text:?}", p.metadata.name.as_deref().unwrap_or(""));
    eventually(c, &what, within, || async { c.container_log(p, container).contains(text).then_some(()) })
        .await;
}

async fn pod(c: &Cluster, name: &str) -> Pod {
    c.pods("default").get(name).await.expect("pod")
}

fn pod_manifest(name: &str, body: &str) -> String {
    format!("apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n{body}")
}

type Case<'a> = Pin<Box<dyn Future<Output = ()> + 'a>>;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn manifests_show_in_kubectl_as_kubernetes_users_expect() {
    let Some(c) = Cluster::start().await else { return };
    let c = &c;
    let shell = c.shell.clone();
    let httpd = c.httpd.clone();
    let hostdir = c.dir.path().join("hostpath");
    std::fs::create_dir_all(&hostdir).expect("hostpath dir");
    let hostdir = hostdir.display().to_string();
    let missing = format!("{}/hpk/missing:v1", c.registry.host_port());

    let manifests = [
        // Objects the pods refer to.
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cfg\ndata:\n  key: one\n".to_owned(),
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: sec\ndata:\n  key: c2VjcmV0\n".to_owned(),
        format!(
            "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\nspec:\n  replicas: 3\n  selector:\n    matchLabels: {{app: web}}\n  template:\n    metadata:\n      labels: {{app: web}}\n    spec:\n      containers:\n      - name: httpd\n        image: {httpd}\n        readinessProbe:\n          httpGet: {{path: /, port: 8080}}\n          periodSeconds: 1\n"
        ),
        format!(
            "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: done\nspec:\n  backoffLimit: 0\n  template:\n    spec:\n      restartPolicy: Never\n      containers:\n      - name: main\n        image: {shell}\n        command: [sh, -c, 'echo finished']\n"
        ),
        pod_manifest(
            "crash",
            &format!(
                "  restartPolicy: OnFailure\n  containers:\n  - name: main\n    image: {shell}\n    command: [sh, -c, 'exit 1']\n"
            ),
        ),
        pod_manifest(
            "init-fail",
            &format!(
                "  restartPolicy: Never\n  initContainers:\n  - name: setup\n    image: {shell}\n    command: [sh, -c, 'exit 3']\n  containers:\n  - name: main\n    image: {shell}\n    command: [sleep, '600']\n"
            ),
        ),
        pod_manifest(
            "liveness",
            &format!(
                "  containers:\n  - name: main\n    image: {shell}\n    command: [sh, -c, 'touch /tmp/ok; sleep 3; rm /tmp/ok; sleep 600']\n    livenessProbe:\n      exec: {{command: [cat, /tmp/ok]}}\n      periodSeconds: 1\n      failureThreshold: 1\n  terminationGracePeriodSeconds: 1\n"
            ),
        ),
        pod_manifest(
            "readiness",
            &format!(
                "  containers:\n  - name: main\n    image: {shell}\n    command: [sh, -c, 'sleep 2; touch /tmp/ready; sleep 600']\n    readinessProbe:\n      exec: {{command: [cat, /tmp/ready]}}\n      periodSeconds: 1\n"
            ),
        ),
        pod_manifest(
            "env-ip",
            &format!(
                "  containers:\n  - name: main\n    image: {shell}\n    command: [sh, -c, 'echo ip=$MY_IP; sleep 600']\n    env:\n    - name: MY_IP\n      valueFrom: {{fieldRef: {{fieldPath: status.podIP}}}}\n"
            ),
        ),
        pod_manifest(
            "cm-watch",
            &format!(
                "  containers:\n  - name: main\n    image: {shell}\n    command: [sh, -c, 'while true; do echo v=$(cat /etc/cfg/key); sleep 1; done']\n    volumeMounts: [{{name: cfg, mountPath: /etc/cfg}}]\n  volumes:\n  - name: cfg\n    configMap: {{name: cfg}}\n"
            ),
        ),
        pod_manifest(
            "shared",
            &format!(
                "  containers:\n  - name: writer\n    image: {shell}\n    command: [sh, -c, 'echo hello > /data/x; sleep 600']\n    volumeMounts: [{{name: data, mountPath: /data}}]\n  - name: reader\n    image: {shell}\n    command: [sh, -c, 'until cat /data/x; do sleep 0.2; done; sleep 600']\n    volumeMounts: [{{name: data, mountPath: /data}}]\n  volumes:\n  - name: data\n    emptyDir: {{}}\n"
            ),
        ),
        pod_manifest(
            "sub-path",
            &format!(
                "  containers:\n  - name: writer\n    image: {shell}\n    command: [sh, -c, 'mkdir -p /all/d/x; echo inside > /all/d/x/marker; sleep 600']\n    volumeMounts: [{{name: data, mountPath: /all}}]\n  - name: reader\n    image: {shell}\n    command: [sh, -c, 'until cat /sub/marker; do sleep 0.2; done; echo key=$(cat /etc/key); sleep 600']\n    volumeMounts: [{{name: data, mountPath: /sub, subPath: d/x}}, {{name: cfg, mountPath: /etc/key, subPath: key}}]\n  volumes:\n  - name: data\n    emptyDir: {{}}\n  - name: cfg\n    configMap: {{name: cfg}}\n"
            ),
        ),
        pod_manifest(
            "secret-mode",
            &format!(
                "  containers:\n  - name: main\n    image: {shell}\n    command: [sh, -c, 'stat -L -c mode=%a /etc/secret/key; cat /etc/secret/key; echo; sleep 600']\n    volumeMounts: [{{name: s, mountPath: /etc/secret}}]\n  volumes:\n  - name: s\n    secret: {{secretName: sec, defaultMode: 0400}}\n"
            ),
        ),
        pod_manifest(
            "prestop",
            &format!(
                "  terminationGracePeriodSeconds: 10\n  containers:\n  - name: main\n    image: {shell}\n    command: [sh, -c, 'trap \"echo term > /data/term; exit 0\" TERM; while true; do sleep 1; done']\n    lifecycle:\n      preStop:\n        exec: {{command: [sh, -c, 'echo pre > /data/pre']}}\n    volumeMounts: [{{name: data, mountPath: /data}}]\n  volumes:\n  - name: data\n    hostPath: {{path: {hostdir}/prestop, type: DirectoryOrCreate}}\n"
            ),
        ),
        pod_manifest(
            "sidecar",
            &format!(
                "  restartPolicy: Never\n  terminationGracePeriodSeconds: 5\n  initContainers:\n  - name: side\n    image: {shell}\n    restartPolicy: Always\n    command: [sh, -c, 'trap \"echo term >> /data/log; exit 0\" TERM; echo start >> /data/log; if [ $(grep -c start /data/log) -lt 2 ]; then sleep 2; exit 1; fi; while true; do sleep 1; done']\n    startupProbe:\n      exec: {{command: [grep, start, /data/log]}}\n      periodSeconds: 1\n    volumeMounts: [{{name: data, mountPath: /data}}]\n  - name: setup\n    image: {shell}\n    command: [sh, -c, 'grep start /data/log && echo setup >> /data/log']\n    volumeMounts: [{{name: data, mountPath: /data}}]\n  containers:\n  - name: main\n    image: {shell}\n    command: [sh, -c, 'echo main >> /data/log; sleep 6']\n    volumeMounts: [{{name: data, mountPath: /data}}]\n  volumes:\n  - name: data\n    hostPath: {{path: {hostdir}/sidecar, type: DirectoryOrCreate}}\n"
            ),
        ),
        pod_manifest(
            "deadline",
            &format!(
                "  activeDeadlineSeconds: 3\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    image: {shell}\n    command: [sleep, '600']\n"
            ),
        ),
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: links-svc\nspec:\n  selector: {app: nothing}\n  ports:\n  - {name: http, port: 8080}\n  - {name: dns, port: 53, protocol: UDP}\n".to_owned(),
        pod_manifest(
            "links",
            &format!(
                "  containers:\n  - name: main\n    image: {shell}\n    command: [sh, -c, 'echo host=$LINKS_SVC_SERVICE_HOST http=$LINKS_SVC_SERVICE_PORT_HTTP udp=$LINKS_SVC_PORT_53_UDP api=$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT mem=$MEM; sleep 600']\n    resources:\n      limits: {{memory: 64Mi}}\n    env:\n    - name: MEM\n      valueFrom: {{resourceFieldRef: {{resource: limits.memory}}}}\n"
            ),
        ),
        pod_manifest(
            "no-links",
            &format!(
                "  enableServiceLinks: false\n  containers:\n  - name: main\n    image: {shell}\n    command: [sh, -c, 'echo host=$LINKS_SVC_SERVICE_HOST api=$KUBERNETES_SERVICE_HOST; sleep 600']\n"
            ),
        ),
        pod_manifest(
            "debug-me",
            &format!(
                "  terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    image: {shell}\n    command: [sleep, '600']\n"
            ),
        ),
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: relaxed\ndata:\n  data-1: value-1\n  dotted.key: value-2\n".to_owned(),
        pod_manifest(
            "env-from",
            &format!(
                "  containers:\n  - name: main\n    image: {shell}\n    command: [sh, -c, 'tr \"\\\\0\" \"\\\\n\" < /proc/1/environ; sleep 600']\n    envFrom:\n    - configMapRef: {{name: relaxed}}\n    - configMapRef: {{name: relaxed}}\n      prefix: p-\n"
            ),
        ),
        pod_manifest(
            "gated",
            &format!(
                "  terminationGracePeriodSeconds: 1\n  readinessGates:\n  - conditionType: example.com/ready\n  containers:\n  - name: main\n    image: {shell}\n    command: [sleep, '600']\n"
            ),
        ),
        pod_manifest(
            "term-file",
            &format!(
                "  restartPolicy: Never\n  containers:\n  - name: main\n    image: {shell}\n    command: [sh, -c, 'printf DONE > /dev/termination-custom-log']\n    terminationMessagePath: /dev/termination-custom-log\n    securityContext: {{runAsUser: 1000, readOnlyRootFilesystem: true}}\n"
            ),
        ),
        pod_manifest(
            "term-logs",
            &format!(
                "  restartPolicy: Never\n  containers:\n  - name: main\n    image: {shell}\n    command: [sh, -c, 'echo first; echo DONE; exit 2']\n    terminationMessagePolicy: FallbackToLogsOnError\n"
            ),
        ),
        pod_manifest(
            "etc-hosts",
            &format!(
                "  terminationGracePeriodSeconds: 1\n  containers:\n  - name: managed\n    image: {shell}\n    command: [sh, -c, 'head -n 1 /etc/hosts; sleep 600']\n  - name: node\n    image: {shell}\n    command: [sh, -c, 'echo lines=$(wc -l < /etc/hosts); if echo x >> /etc/hosts; then echo writable; else echo read-only; fi; sleep 600']\n    volumeMounts: [{{name: hosts, mountPath: /etc/hosts}}]\n  volumes:\n  - name: hosts\n    hostPath: {{path: /etc/hosts, type: File}}\n"
            ),
        ),
        pod_manifest(
            "startup-fails",
            &format!(
                "  terminationGracePeriodSeconds: 600\n  containers:\n  - name: main\n    image: {shell}\n    command: [sh, -c, 'trap \"\" TERM; sleep 600']\n    startupProbe:\n      exec: {{command: [cat, /tmp/never]}}\n      initialDelaySeconds: 1\n      periodSeconds: 1\n      failureThreshold: 1\n      terminationGracePeriodSeconds: 2\n"
            ),
        ),
        pod_manifest("no-image", &format!("  containers:\n  - name: main\n    image: {missing}\n")),
        pod_manifest(
            "too-big",
            &format!(
                "  containers:\n  - name: main\n    image: {shell}\n    command: [sleep, '600']\n    resources:\n      requests: {{cpu: '1000'}}\n"
            ),
        ),
        // Bad input.
        pod_manifest(
            "no-configmap",
            &format!(
                "  containers:\n  - name: main\n    image: {shell}\n    command: [sleep, '600']\n    volumeMounts: [{{name: v, mountPath: /v}}]\n  volumes:\n  - name: v\n    configMap: {{name: nowhere}}\n"
            ),
        ),
        pod_manifest(
            "wrong-hostpath",
            &format!(
                "  containers:\n  - name: main\n    image: {shell}\n    command: [sleep, '600']\n    volumeMounts: [{{name: v, mountPath: /v}}]\n  volumes:\n  - name: v\n    hostPath: {{path: /etc/hostname, type: Directory}}\n"
            ),
        ),
        pod_manifest(
            "hostpath-root",
            &format!(
                "  containers:\n  - name: main\n    image: {shell}\n    command: [sleep, '600']\n    volumeMounts: [{{name: v, mountPath: /host}}]\n  volumes:\n  - name: v\n    hostPath: {{path: /}}\n"
            ),
        ),
        pod_manifest(
            "no-pvc",
            &format!(
                "  nodeName: node1\n  containers:\n  - name: main\n    image: {shell}\n    command: [sleep, '600']\n    volumeMounts: [{{name: v, mountPath: /v}}]\n  volumes:\n  - name: v\n    persistentVolumeClaim: {{claimName: nowhere}}\n"
            ),
        ),
        pod_manifest(
            "missing-key",
            &format!(
                "  containers:\n  - name: main\n    image: {shell}\n    command: [sleep, '600']\n    env:\n    - name: X\n      valueFrom: {{configMapKeyRef: {{name: cfg, key: nope}}}}\n"
            ),
        ),
        pod_manifest(
            "absurd",
            &format!(
                "  nodeName: node1\n  containers:\n  - name: main\n    image: {shell}\n    command: [sleep, '600']\n    resources:\n      requests: {{cpu: '100000', memory: 1Ei}}\n"
            ),
        ),
        pod_manifest(
            "sandbox-dies",
            &format!(
                "  terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    image: {shell}\n    command: [sleep, '600']\n"
            ),
        ),
    ];
    c.apply(&manifests.join("---\n"));

    let long = Duration::from_secs(90);
    let cases: Vec<(&str, Case<'_>)> = vec![
        (
            "a Deployment of 3 replicas runs and is Ready",
            Box::pin(async {
                let pods = eventually(c, "3 web pods Ready", long, || async {
                    let list = c.pods("default").list(&ListParams::default().labels("app=web")).await.ok()?;
                    let names: Vec<String> =
                        list.items.iter().filter_map(|p| p.metadata.name.clone()).collect();
                    let ready = names
                        .iter()
                        .filter(|n| kubectl_row(c, n).is_some_and(|(r, s, _)| r == "1/1" && s == "Running"))
                        .count();
                    (names.len() == 3 && ready == 3).then_some(names)
                })
                .await;
                has_events(c, &pods[0], &["Scheduled", "Pulled", "Created", "Started"]).await;
            }),
        ),
        (
            "a Job completes",
            Box::pin(async {
                eventually(c, "job done succeeded", long, || async {
                    let out = c.kubectl(&["get", "job", "done", "-o", "jsonpath={.status.succeeded}"]);
                    (out.trim() == "1").then_some(())
                })
                .await;
                let list = c
                    .pods("default")
                    .list(&ListParams::default().labels("job-name=done"))
                    .await
                    .expect("pods");
                let name = list.items[0].metadata.name.clone().expect("name");
                status_is(c, &name, "Completed", long).await;
                has_events(c, &name, &["Scheduled", "Pulled", "Created", "Started"]).await;
            }),
        ),
        (
            "OnFailure with exit 1 backs off: CrashLoopBackOff, growing delay, restarts counted",
            Box::pin(async {
                let (_, _, restarts) = status_is(c, "crash", "CrashLoopBackOff", long).await;
                assert!(restarts >= 1, "restarts {restarts}");
                eventually(c, "crash waits 20 s after its second failure", long, || async {
                    let p = pod(c, "crash").await;
                    let cs = p.status?.container_statuses?.into_iter().next()?;
                    let msg = cs.state?.waiting?.message?;
                    (msg.contains("back-off 20s") && cs.restart_count >= 2).then_some(())
                })
                .await;
                let p = pod(c, "crash").await;
                let last = p
                    .status
                    .and_then(|s| s.container_statuses)
                    .and_then(|cs| cs.into_iter().next())
                    .and_then(|cs| cs.last_state)
                    .and_then(|s| s.terminated)
                    .expect("lastState");
                assert_eq!((last.exit_code, last.reason.as_deref()), (1, Some("Error")));
                has_events(c, "crash", &["BackOff", "Started"]).await;
            }),
        ),
        (
            "a failing init container shows Init:Error",
            Box::pin(async {
                status_is(c, "init-fail", "Init:Error", long).await;
                let p = pod(c, "init-fail").await;
                assert_eq!(p.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Failed"));
                has_events(c, "init-fail", &["Started"]).await;
            }),
        ),
        (
            "a failing liveness probe restarts the container",
            Box::pin(async {
                eventually(c, "liveness restarted", long, || async {
                    kubectl_row(c, "liveness").filter(|(_, _, r)| *r >= 1)
                })
                .await;
                has_events(c, "liveness", &["Unhealthy", "Killing"]).await;
            }),
        ),
        (
            "a readiness probe flips Ready",
            Box::pin(async {
                eventually(c, "readiness 1/1", long, || async {
                    kubectl_row(c, "readiness").filter(|(r, _, _)| r == "1/1")
                })
                .await;
                // Unready once the file goes: the test removes it when it has seen 1/1, so no
                // window of the pod's own timing can be missed on a loaded machine.
                c.kubectl(&["exec", "readiness", "--", "rm", "/tmp/ready"]);
                eventually(c, "readiness 0/1 again", Duration::from_secs(30), || async {
                    kubectl_row(c, "readiness").filter(|(r, s, _)| r == "0/1" && s == "Running")
                })
                .await;
                has_events(c, "readiness", &["Unhealthy"]).await;
            }),
        ),
        (
            "env status.podIP is the pod's IP",
            Box::pin(async {
                status_is(c, "env-ip", "Running", long).await;
                let p = pod(c, "env-ip").await;
                let ip = p.status.as_ref().and_then(|s| s.pod_ip.clone()).expect("podIP");
                assert!(ip.starts_with("10.244."), "pod IP {ip} from the node's pod CIDR");
                log_shows(c, &p, "main", &format!("ip={ip}"), Duration::from_secs(20)).await;
                has_events(c, "env-ip", &["Created", "Started"]).await;
            }),
        ),
        (
            "a configMap volume follows updates within a minute",
            Box::pin(async {
                status_is(c, "cm-watch", "Running", long).await;
                let p = pod(c, "cm-watch").await;
                log_shows(c, &p, "main", "v=one", Duration::from_secs(20)).await;
                let cms: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
                    kube::Api::namespaced(c.admin.clone(), "default");
                cms.patch(
                    "cfg",
                    &PatchParams::default(),
                    &Patch::Merge(serde_json::json!({"data": {"key": "two"}})),
                )
                .await
                .expect("patch");
                log_shows(c, &p, "main", "v=two", Duration::from_secs(60)).await;
                has_events(c, "cm-watch", &["Started"]).await;
            }),
        ),
        (
            "an emptyDir is shared by two containers",
            Box::pin(async {
                status_is(c, "shared", "Running", long).await;
                let p = pod(c, "shared").await;
                log_shows(c, &p, "reader", "hello", Duration::from_secs(20)).await;
                has_events(c, "shared", &["Started"]).await;
            }),
        ),
        (
            "subPath mounts: a directory of a shared emptyDir and a configMap key",
            Box::pin(async {
                status_is(c, "sub-path", "Running", long).await;
                let p = pod(c, "sub-path").await;
                // d/x is made by the writer or by the kubelet resolving the reader's subPath,
                // whichever comes first; the runtime mounts it from a descriptor opened beneath
                // the volume (the kubelet names the volume in the hpk.io/sub-path-roots annotation).
                log_shows(c, &p, "reader", "inside", Duration::from_secs(20)).await;
                log_shows(c, &p, "reader", "key=", Duration::from_secs(20)).await;
                has_events(c, "sub-path", &["Started"]).await;
            }),
        ),
        (
            "a secret's defaultMode is honoured",
            Box::pin(async {
                status_is(c, "secret-mode", "Running", long).await;
                let p = pod(c, "secret-mode").await;
                let log = eventually(c, "secret-mode logs", Duration::from_secs(20), || async {
                    let log = c.container_log(&p, "main");
                    log.contains("secret").then_some(log)
                })
                .await;
                assert!(log.contains("mode=400"), "{log}");
                has_events(c, "secret-mode", &["Started"]).await;
            }),
        ),
        (
            "preStop runs and SIGTERM arrives on delete, the pod is gone within its grace period",
            Box::pin(async {
                status_is(c, "prestop", "Running", long).await;
                // The shell must have set its trap.
                tokio::time::sleep(Duration::from_secs(1)).await;
                let started = std::time::Instant::now();
                c.kubectl(&["delete", "pod", "prestop", "--wait=false"]);
                eventually(c, "prestop gone", Duration::from_secs(15), || async {
                    c.pods("default").get_opt("prestop").await.ok().and_then(|p| p.is_none().then_some(()))
                })
                .await;
                assert!(started.elapsed() < Duration::from_secs(12), "gone after {:?}", started.elapsed());
                let dir = std::path::Path::new(&hostdir).join("prestop");
                assert_eq!(
                    std::fs::read_to_string(dir.join("pre")).unwrap_or_default().trim(),
                    "pre",
                    "preStop ran"
                );
                assert_eq!(
                    std::fs::read_to_string(dir.join("term")).unwrap_or_default().trim(),
                    "term",
                    "SIGTERM arrived"
                );
                has_events(c, "prestop", &["Killing"]).await;
            }),
        ),
        (
            "a native sidecar starts first, gates the next init container by its startup probe, restarts, and stops after the container",
            Box::pin(async {
                status_is(c, "sidecar", "Completed", long).await;
                let p = pod(c, "sidecar").await;
                assert_eq!(p.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded"));
                let side = p
                    .status
                    .as_ref()
                    .and_then(|s| s.init_container_statuses.as_ref())
                    .and_then(|cs| cs.iter().find(|c| c.name == "side").cloned())
                    .expect("the sidecar's status");
                assert!(side.restart_count >= 1, "restarted while the pod ran: {side:?}");
                let log = std::fs::read_to_string(std::path::Path::new(&hostdir).join("sidecar/log"))
                    .unwrap_or_default();
                let lines: Vec<&str> = log.lines().collect();
                let at = |what: &str| lines.iter().position(|l| *l == what);
                assert_eq!(lines.first(), Some(&"start"), "{log}");
                assert!(at("start") < at("setup") && at("setup") < at("main"), "in order: {log}");
                assert!(lines.iter().filter(|l| **l == "start").count() >= 2, "restarted: {log}");
                assert_eq!(lines.last(), Some(&"term"), "stopped after the container ended: {log}");
            }),
        ),
        (
            "envFrom: keys that are not shell identifiers reach the container's environment, prefixed too",
            Box::pin(async {
                status_is(c, "env-from", "Running", long).await;
                let p = pod(c, "env-from").await;
                for line in
                    ["data-1=value-1", "dotted.key=value-2", "p-data-1=value-1", "p-dotted.key=value-2"]
                {
                    log_shows(c, &p, "main", line, Duration::from_secs(20)).await;
                }
            }),
        ),
        (
            "a readiness gate holds Ready until its condition is True, and drops it again",
            Box::pin(async {
                status_is(c, "gated", "Running", long).await;
                let ready = || {
                    c.kubectl(&[
                        "get",
                        "pod",
                        "gated",
                        "-o",
                        "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
                    ])
                };
                let gate = |value: &str| {
                    let patch = format!(
                        r#"{{"status":{{"conditions":[{{"type":"example.com/ready","status":"{value}"}}]}}}}"#
                    );
                    c.kubectl(&[
                        "patch",
                        "pod",
                        "gated",
                        "--subresource=status",
                        "--type=strategic",
                        "-p",
                        &patch,
                    ]);
                };
                eventually(c, "gated running but not Ready", Duration::from_secs(30), || async {
                    (ready() == "False").then_some(())
                })
                .await;
                gate("True");
                eventually(c, "gated Ready once its gate is True", Duration::from_secs(30), || async {
                    (ready() == "True").then_some(())
                })
                .await;
                gate("False");
                eventually(c, "gated not Ready once its gate is False", Duration::from_secs(30), || async {
                    (ready() == "False").then_some(())
                })
                .await;
                let gates = c.kubectl(&[
                    "get",
                    "pod",
                    "gated",
                    "-o",
                    "jsonpath={.status.conditions[?(@.type==\"example.com/ready\")].status}",
                ]);
                assert_eq!(gates, "False", "the gate's condition is kept as written");
            }),
        ),
        (
            "termination messages: from the file at a custom path as a non-root user, from the log's tail on failure",
            Box::pin(async {
                let message = |name: &'static str| async move {
                    let out = c.kubectl(&[
                        "get",
                        "pod",
                        name,
                        "-o",
                        "jsonpath={.status.containerStatuses[0].state.terminated.message}",
                    ]);
                    (!out.is_empty()).then_some(out)
                };
                status_is(c, "term-file", "Completed", long).await;
                let written = eventually(c, "term-file's message", long, || message("term-file")).await;
                assert_eq!(written, "DONE");
                status_is(c, "term-logs", "Error", long).await;
                let tail = eventually(c, "term-logs' message", long, || message("term-logs")).await;
                assert_eq!(tail, "first\nDONE\n");
            }),
        ),
        (
            "/etc/hosts: the kubelet's, unless the container mounts the node's, which it cannot write",
            Box::pin(async {
                status_is(c, "etc-hosts", "Running", long).await;
                let p = pod(c, "etc-hosts").await;
                log_shows(c, &p, "managed", "# Kubernetes-managed hosts file.", Duration::from_secs(20))
                    .await;
                let node = std::fs::read_to_string("/etc/hosts").expect("the host's /etc/hosts");
                let lines = format!("lines={}", node.lines().count());
                log_shows(c, &p, "node", &lines, Duration::from_secs(20)).await;
                log_shows(c, &p, "node", "read-only", Duration::from_secs(20)).await;
                assert_eq!(std::fs::read_to_string("/etc/hosts").expect("again"), node, "unchanged");
            }),
        ),
        (
            "a failed startup probe kills within the probe's grace period, not the pod's, and the container is never ready",
            Box::pin(async {
                let started = std::time::Instant::now();
                eventually(c, "startup-fails restarted", long, || async {
                    kubectl_row(c, "startup-fails").filter(|(_, _, r)| *r >= 1)
                })
                .await;
                assert!(started.elapsed() < Duration::from_secs(60), "{:?}", started.elapsed());
                let p = pod(c, "startup-fails").await;
                let main = p.status.and_then(|s| s.container_statuses).unwrap_or_default();
                assert!(main.iter().all(|s| !s.ready), "never ready: {main:?}");
                let killed = event_messages(c, "startup-fails", "Killing");
                assert!(killed.iter().any(|m| m.contains("failed startup probe")), "{killed:?}");
            }),
        ),
        (
            "activeDeadlineSeconds: the pod fails with DeadlineExceeded",
            Box::pin(async {
                let started = std::time::Instant::now();
                // kubectl's STATUS shows the stopped container's reason; the pod's is in its status.
                let status = eventually(c, "pod deadline Failed, DeadlineExceeded", long, || async {
                    let status = pod(c, "deadline").await.status?;
                    (status.phase.as_deref() == Some("Failed")
                        && status.reason.as_deref() == Some("DeadlineExceeded"))
                    .then_some(status)
                })
                .await;
                assert!(status.message.clone().unwrap_or_default().contains("deadline"), "{status:?}");
                let main = status.container_statuses.unwrap_or_default().into_iter().next().expect("main");
                assert!(main.state.and_then(|s| s.terminated).is_some(), "its container stopped");
                assert!(started.elapsed() < Duration::from_secs(60), "{:?}", started.elapsed());
                has_events(c, "deadline", &["DeadlineExceeded"]).await;
            }),
        ),
        (
            "service links: the namespace's Services and the API server's, unless enableServiceLinks is false; a resourceFieldRef without divisor",
            Box::pin(async {
                let ip = c.kubectl(&["get", "svc", "links-svc", "-o", "jsonpath={.spec.clusterIP}"]);
                let api = c.kubectl(&["get", "svc", "kubernetes", "-o", "jsonpath={.spec.clusterIP}"]);
                status_is(c, "links", "Running", long).await;
                let p = pod(c, "links").await;
                let want = format!(
                    "host={ip} http=8080 udp=udp://{ip}:53 api={api}:443 mem=67108864",
                    ip = ip.trim(),
                    api = api.trim()
                );
                log_shows(c, &p, "main", &want, Duration::from_secs(20)).await;
                status_is(c, "no-links", "Running", long).await;
                let p = pod(c, "no-links").await;
                log_shows(c, &p, "main", &format!("host= api={}", api.trim()), Duration::from_secs(20)).await;
            }),
        ),
        (
            "kubectl debug: an ephemeral container beside the pod's, with logs and exec, and -i attached",
            Box::pin(async {
                status_is(c, "debug-me", "Running", long).await;
                let image = format!("--image={shell}");
                let debug = ["debug", "debug-me", image.as_str(), "--container=dbg", "--"];
                c.kubectl(&[&debug[..], &["sh", "-c", "echo debugged; sleep 600"]].concat());
                let running = |name: &'static str| async move {
                    let p = pod(c, "debug-me").await;
                    let st = p.status?.ephemeral_container_statuses?.into_iter().find(|s| s.name == name)?;
                    st.state?.running.map(|_| ())
                };
                eventually(c, "ephemeral container dbg running", long, || running("dbg")).await;
                let p = pod(c, "debug-me").await;
                log_shows(c, &p, "dbg", "debugged", Duration::from_secs(20)).await;
                let out = c.kubectl(&["exec", "debug-me", "-c", "dbg", "--", "echo", "exec-ok"]);
                assert!(out.contains("exec-ok"), "{out}");
                // -i: kubectl waits for it to run, then attaches its stdin and output.
                let mut cmd = tokio::process::Command::from(c.cp.kubectl());
                cmd.args(["debug", "debug-me", "-i", image.as_str(), "--container=dbg2", "--"])
                    .args(["sh", "-c", "read line; echo got=$line"])
                    .stdin(std::process::Stdio::piped())
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .kill_on_drop(true);
                let mut child = cmd.spawn().expect("kubectl debug -i");
                let mut stdin = child.stdin.take().expect("stdin");
                tokio::io::AsyncWriteExt::write_all(&mut stdin, b"hello\n").await.expect("write");
                let out = tokio::time::timeout(Duration::from_secs(90), child.wait_with_output())
                    .await
                    .expect("kubectl debug -i returned")
                    .expect("kubectl debug -i");
                let stdout = String::from_utf8_lossy(&out.stdout);
                assert!(stdout.contains("got=hello"), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
                drop(stdin);
                let p = pod(c, "debug-me").await;
                let statuses = p.status.and_then(|s| s.ephemeral_container_statuses).unwrap_or_default();
                let dbg2 = statuses.iter().find(|s| s.name == "dbg2").expect("dbg2's status");
                assert_eq!(dbg2.restart_count, 0, "never restarted");
                assert_eq!(
                    kubectl_row(c, "debug-me").map(|r| r.0).as_deref(),
                    Some("1/1"),
                    "the pod's readiness is its own container's"
                );
            }),
        ),
        (
            "a missing image: ErrImagePull, then ImagePullBackOff",
            Box::pin(async {
                // ErrImagePull lasts from the first failed pull to the second (10 s); on a
                // loaded machine the polls missed it (CI, 2026-12-04), so the first reason seen
                // may already be the back-off. That the first failure is ErrImagePull is the
                // unit test `a_failed_pull_is_err_image_pull_then_image_pull_back_off`; here,
                // what kubectl shows and the events.
                let first = eventually(c, "pod no-image shows a failed pull", long, || async {
                    kubectl_row(c, "no-image")
                        .map(|(_, s, _)| s)
                        .filter(|s| s == "ErrImagePull" || s == "ImagePullBackOff")
                })
                .await;
                if first == "ErrImagePull" {
                    status_is(c, "no-image", "ImagePullBackOff", long).await;
                }
                has_events(c, "no-image", &["Pulling", "Failed", "BackOff"]).await;
                let failed = event_messages(c, "no-image", "Failed");
                assert!(failed.iter().any(|m| m.starts_with("Failed to pull image")), "{failed:?}");
            }),
        ),
        (
            "a pod asking more CPU than allocatable stays Pending",
            Box::pin(async {
                has_events(c, "too-big", &["FailedScheduling"]).await;
                tokio::time::sleep(Duration::from_secs(2)).await;
                assert_eq!(kubectl_row(c, "too-big").map(|r| r.1).as_deref(), Some("Pending"));
            }),
        ),
        (
            "a missing configMap volume: FailedMount, nothing started",
            Box::pin(async {
                has_events(c, "no-configmap", &["FailedMount"]).await;
                let m = event_messages(c, "no-configmap", "FailedMount");
                assert!(m.iter().any(|m| m.contains("nowhere")), "{m:?}");
                assert_eq!(kubectl_row(c, "no-configmap").map(|r| r.1).as_deref(), Some("ContainerCreating"));
            }),
        ),
        (
            "a hostPath of the wrong type: FailedMount naming the type",
            Box::pin(async {
                has_events(c, "wrong-hostpath", &["FailedMount"]).await;
                let m = event_messages(c, "wrong-hostpath", "FailedMount");
                assert!(m.iter().any(|m| m.contains("/etc/hostname") && m.contains("Directory")), "{m:?}");
            }),
        ),
        (
            "a hostPath of / (above HPK's own directories): FailedMount saying why",
            Box::pin(async {
                has_events(c, "hostpath-root", &["FailedMount"]).await;
                let m = event_messages(c, "hostpath-root", "FailedMount");
                assert!(m.iter().any(|m| m.contains("contains /hpk") && m.contains("HPK itself")), "{m:?}");
                assert_eq!(
                    kubectl_row(c, "hostpath-root").map(|r| r.1).as_deref(),
                    Some("ContainerCreating")
                );
            }),
        ),
        (
            "a missing PVC: FailedMount",
            Box::pin(async {
                has_events(c, "no-pvc", &["FailedMount"]).await;
                let m = event_messages(c, "no-pvc", "FailedMount");
                assert!(m.iter().any(|m| m.contains("nowhere")), "{m:?}");
            }),
        ),
        (
            "an env reference to a missing key: CreateContainerConfigError",
            Box::pin(async {
                status_is(c, "missing-key", "CreateContainerConfigError", long).await;
                let p = pod(c, "missing-key").await;
                let msg = p
                    .status
                    .and_then(|s| s.container_statuses)
                    .and_then(|cs| cs.into_iter().next())
                    .and_then(|cs| cs.state?.waiting?.message)
                    .unwrap_or_default();
                assert!(msg.contains("nope") && msg.contains("cfg"), "{msg}");
                has_events(c, "missing-key", &["Failed"]).await;
                let m = event_messages(c, "missing-key", "Failed");
                assert!(m.iter().any(|m| m.contains("nope")), "{m:?}");
            }),
        ),
        (
            "a sandbox stopped underneath the pod is replaced: SandboxChanged, Running again",
            Box::pin(async {
                status_is(c, "sandbox-dies", "Running", long).await;
                let endpoint = format!("unix://{}", c.node.runtime_socket().display());
                let crictl = |args: &[&str]| {
                    let out = std::process::Command::new("crictl")
                        .args(["--runtime-endpoint", &endpoint, "--image-endpoint", &endpoint])
                        .args(args)
                        .output()
                        .expect("crictl");
                    assert!(
                        out.status.success(),
                        "crictl {args:?}: {}",
                        String::from_utf8_lossy(&out.stderr)
                    );
                    String::from_utf8_lossy(&out.stdout).trim().to_owned()
                };
                let sandbox = crictl(&["pods", "--name", "sandbox-dies", "--state", "ready", "-q"]);
                assert!(!sandbox.is_empty(), "the pod's sandbox");
                crictl(&["stopp", &sandbox]);
                has_events(c, "sandbox-dies", &["SandboxChanged"]).await;
                eventually(c, "sandbox-dies Running again, one restart", long, || async {
                    kubectl_row(c, "sandbox-dies").filter(|(r, s, n)| r == "1/1" && s == "Running" && *n == 1)
                })
                .await;
                let now = crictl(&["pods", "--name", "sandbox-dies", "--state", "ready", "-q"]);
                assert!(!now.is_empty() && now != sandbox, "a new sandbox: {now} (was {sandbox})");
            }),
        ),
        (
            "an absurd request bound by nodeName is rejected: OutOfcpu",
            Box::pin(async {
                status_is(c, "absurd", "OutOfcpu", long).await;
                let p = pod(c, "absurd").await;
                assert_eq!(p.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Failed"));
                has_events(c, "absurd", &["OutOfcpu"]).await;
            }),
        ),
    ];
    let (names, futures): (Vec<&str>, Vec<Case<'_>>) = cases.into_iter().unzip();
    let started = std::time::Instant::now();
    futures_util::future::join_all(futures).await;
    eprintln!("{} cases passed in {:?}: {names:#?}", names.len(), started.elapsed());

    // The kubelet served through all of it, and never panicked.
    let pid = c.node.kubelet_pid().expect("kubelet");
    let alive =
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(i32::try_from(pid).expect("pid")), None).is_ok();
    assert!(alive, "kubelet alive\n{}", c.node.logs());
    let log = std::fs::read_to_string(c.node.dir().join("kubelet-1.log")).unwrap_or_default();
    assert!(!log.contains("panicked"), "the kubelet panicked:\n{log}");
}
