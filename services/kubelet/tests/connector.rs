//! Connector mode against the real control plane: the harness's cluster (with its ordinary
//! HPK node `node1`) is the "existing cluster"; test host `remote` runs a runtime bubble
//! (`hpk bubble --role runtime`: a pod-runtime serving CRI over mutual TLS, an HPC
//! allocation's side); test host `connector` runs hpk-kubelet as
//! `examples/hpk-connector.yaml`'s Deployment runs it — its arguments, environment and
//! kubeconfig, with the node identity `system:node:hpk-connector` an admin approves as the
//! README says (a CertificateSigningRequest), and no RBAC — with the example pods.

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hpk_integration::connector::RuntimeBubble as RemoteRuntime;
use hpk_integration::process::Process;
use hpk_proto::podruntime::v1::AllocationRequest;
use hpk_proto::podruntime::v1::remote_client::RemoteClient;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use serde_json::{Value, json};
use support::{Cluster, KUBELET, eventually};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const CONNECTOR: &str = "hpk-connector";
const POD_CIDR: &str = "10.244.77.0/24";

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

/// The items of a manifest file as JSON, through `kubectl create --dry-run=client`.
fn items(c: &Cluster, file: &Path) -> Vec<Value> {
    let out = c.kubectl(&["create", "--dry-run=client", "-o", "json", "-f", &file.display().to_string()]);
    // One JSON object per item, one after the other.
    serde_json::Deserializer::from_str(&out).into_iter::<Value>().map(|item| item.expect("json")).collect()
}

/// An example pod with the test registry's httpd in place of nginx, saying hello first, with a
/// ConfigMap volume (sent to the remote runtime), and an httpGet readiness and a tcpSocket
/// liveness probe on its port, which on the connector's node the remote runtime runs.
fn example_pod(c: &Cluster, file: &str) -> Value {
    let mut pod = items(c, &examples().join(file)).remove(0);
    let container = &mut pod["spec"]["containers"][0];
    container["image"] = json!(c.httpd);
    container["command"] =
        json!(["sh", "-c", "echo hello from the remote runtime; exec httpd -f -p 8080 -h /www"]);
    container["ports"] = json!([{"containerPort": 8080, "name": "web"}]);
    container["readinessProbe"] = json!({"httpGet": {"path": "/", "port": "web"}, "periodSeconds": 2});
    container["livenessProbe"] = json!({"tcpSocket": {"port": 8080}, "periodSeconds": 2});
    container["volumeMounts"] = json!([{"name": "greeting", "mountPath": "/config"}]);
    pod["spec"]["volumes"] = json!([{"name": "greeting", "configMap": {"name": "greeting"}}]);
    pod
}

/// The Deployment's kubelet as a process on test host `connector`: its arguments and
/// environment, with the mounted Secret and ConfigMap files under `files`.
fn start_connector(c: &Cluster, remote: &RemoteRuntime, files: &Path) -> Process {
    let manifest = items(c, &examples().join("hpk-connector.yaml"));
    let deployment = manifest.iter().find(|i| i["kind"] == "Deployment").expect("a Deployment");
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let host = c.cp.network().host("connector").expect("connector host").clone();
    let local = |arg: &str| {
        arg.replace("/etc/hpk-connector/", &format!("{}/", files.display()))
            .replace("/var/lib/hpk-connector", &files.join("state").display().to_string())
    };
    let mut cmd = host.command(KUBELET);
    for arg in container["args"].as_array().expect("args") {
        cmd.arg(local(arg.as_str().expect("arg")));
    }
    // As in the pod: the pod's IP, the Secret's endpoint (the kubeconfig is an argument).
    // This machine's disk may be fuller than the default 10 % threshold allows (a disk-pressure
    // taint would keep the example pods off the node), as every other test kubelet is told.
    cmd.arg("--disk-pressure-percent=1");
    for env in container["env"].as_array().expect("env") {
        let name = env["name"].as_str().expect("name");
        let value = match name {
            "HPK_NODE_IP" => host.ip.to_string(),
            // The Secret's `endpoint`: the bubble's runtime-endpoint file as it is.
            "HPK_RUNTIME_ENDPOINT" => {
                std::fs::read_to_string(&remote.credentials.endpoint_file).expect("endpoint")
            }
            _ => env["value"].as_str().expect("value").to_owned(),
        };
        cmd.env(name, value);
    }
    Process::spawn("hpk-kubelet", cmd, &files.join("kubelet.log")).expect("kubelet")
}

/// The Secret and ConfigMap files of the Deployment, as `kubectl create secret` would hold them.
/// The connector's node identity as the README makes it: an EC key and a CSR for
/// `system:node:hpk-connector` in `system:nodes` (openssl), a CertificateSigningRequest for
/// the `kubernetes.io/kube-apiserver-client-kubelet` signer, approved by the admin; returns the
/// (certificate, key) files.
fn node_identity(c: &Cluster, dir: &Path) -> (PathBuf, PathBuf) {
    use base64::Engine as _;
    std::fs::create_dir_all(dir).expect("mkdir");
    let (key, csr, cert) = (dir.join("identity.key"), dir.join("identity.csr"), dir.join("identity.crt"));
    let out = std::process::Command::new("openssl")
        .args(["req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"])
        .args(["-subj", "/O=system:nodes/CN=system:node:hpk-connector", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&csr)
        .output()
        .expect("openssl");
    assert!(out.status.success(), "openssl req: {}", String::from_utf8_lossy(&out.stderr));
    let request = base64::engine::general_purpose::STANDARD.encode(std::fs::read(&csr).expect("csr"));
    c.apply(
        &json!({
            "apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
            "metadata": {"name": CONNECTOR},
            "spec": {"request": request, "signerName": "kubernetes.io/kube-apiserver-client-kubelet",
                     "usages": ["digital signature", "client auth"], "expirationSeconds": 86400}
        })
        .to_string(),
    );
    c.kubectl(&["certificate", "approve", CONNECTOR]);
    // The controller-manager signs it within moments of the approval.
    let deadline = Instant::now() + Duration::from_secs(30);
    let issued = loop {
        let b64 = c.kubectl(&["get", "csr", CONNECTOR, "-o", "jsonpath={.status.certificate}"]);
        if !b64.trim().is_empty() {
            break b64.trim().to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "the CSR was not signed within 30 s\n{}",
            c.cp.kubectl()
                .args(["describe", "csr"])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let pem = base64::engine::general_purpose::STANDARD.decode(issued).expect("base64 certificate");
    std::fs::write(&cert, pem).expect("write");
    (cert, key)
}

fn write_files(c: &Cluster, remote: &RemoteRuntime, files: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let copy = |from: &Path, to: &str, mode: u32| {
        let to = files.join(to);
        std::fs::create_dir_all(to.parent().expect("parent")).expect("mkdir");
        std::fs::copy(from, &to).expect("copy");
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(mode)).expect("chmod");
    };
    copy(&remote.credentials.ca, "runtime/ca.crt", 0o400);
    copy(&remote.credentials.cert, "runtime/tls.crt", 0o400);
    copy(&remote.credentials.key, "runtime/tls.key", 0o400);
    // The kubelet API's serving certificate, from the cluster's CA as an operator would get it.
    let host_ip = c.cp.network().host("connector").expect("host").ip;
    let bin_dir = Path::new(KUBELET).parent().expect("bin dir");
    let (cert, key) = hpk_integration::connector::issue(
        &c.cp,
        bin_dir,
        CONNECTOR,
        "serving",
        &[host_ip.to_string()],
        files,
        "serving-issued",
        Some((&remote.credentials.cert, &remote.credentials.key)),
    )
    .expect("serving certificate");
    copy(&cert, "serving/tls.crt", 0o400);
    copy(&key, "serving/tls.key", 0o400);
    copy(&c.cp.pki().client_ca().cert, "config/client-ca.crt", 0o444);
    std::fs::write(files.join("config/resolv.conf"), "nameserver 127.0.0.1\n").expect("resolv.conf");
    // The node identity (Secret hpk-connector-identity), the cluster's CA (kube-root-ca.crt)
    // and the manifest's own kubeconfig (ConfigMap hpk-connector-kubeconfig), its paths and
    // the in-cluster server as this host reaches them.
    let (cert, key) = node_identity(c, &files.join("csr"));
    copy(&cert, "identity/tls.crt", 0o400);
    copy(&key, "identity/tls.key", 0o400);
    copy(&c.cp.pki().server_ca().cert, "cluster-ca/ca.crt", 0o444);
    let manifest = items(c, &examples().join("hpk-connector.yaml"));
    let config = manifest
        .iter()
        .find(|i| i["kind"] == "ConfigMap" && i["metadata"]["name"] == "hpk-connector-kubeconfig")
        .expect("the kubeconfig ConfigMap");
    let kubeconfig = config["data"]["kubeconfig"]
        .as_str()
        .expect("kubeconfig")
        .replace("/etc/hpk-connector/", &format!("{}/", files.display()))
        .replace("https://kubernetes.default.svc", c.cp.api_url());
    std::fs::create_dir_all(files.join("kubeconfig")).expect("mkdir");
    std::fs::write(files.join("kubeconfig/kubeconfig"), kubeconfig).expect("kubeconfig");
}

async fn connector_node(c: &Cluster) -> Option<Node> {
    Api::<Node>::all(c.admin.clone()).get_opt(CONNECTOR).await.ok()?
}

/// Waits until the connector's node's Ready condition is `status`; returns how long it took.
async fn wait_ready(c: &Cluster, status: &str, within: Duration, logs: impl Fn() -> String) -> Duration {
    let started = Instant::now();
    loop {
        if connector_node(c).await.as_ref().and_then(ready) == Some(status) {
            return started.elapsed();
        }
        assert!(started.elapsed() < within, "{CONNECTOR} not Ready={status} within {within:?}\n{}", logs());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn ready(node: &Node) -> Option<&str> {
    node.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == "Ready").map(|c| c.status.as_str())
}

/// The messages of pod `name`'s Unhealthy events, once one says its readiness probe failed.
async fn readiness_failures(c: &Cluster, name: &str) -> String {
    let selector = format!("--field-selector=involvedObject.name={name},reason=Unhealthy");
    eventually(c, &format!("{name}'s readiness probe failing"), Duration::from_secs(60), || async {
        let events = c.kubectl(&["get", "events", &selector, "-o", "jsonpath={.items[*].message}"]);
        events.contains("Readiness probe failed").then_some(events)
    })
    .await
}

fn pod_ready(pod: &Pod) -> Option<&str> {
    pod.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == "Ready").map(|c| c.status.as_str())
}

/// (container ID, restart count, started at) of a pod's first container.
fn container_identity(pod: &Pod) -> Option<(String, i32, String)> {
    let status = pod.status.as_ref()?.container_statuses.as_ref()?.first()?;
    let started = status.state.as_ref()?.running.as_ref()?.started_at.as_ref()?.0.to_string();
    Some((status.container_id.clone()?, status.restart_count, started))
}

/// GET / through `kubectl port-forward` to the pod's port 8080.
async fn through_port_forward(c: &Cluster, pod: &str, local_port: u16) -> String {
    let mut forward =
        c.cp.kubectl()
            .args(["port-forward", &format!("pod/{pod}"), &format!("{local_port}:8080")])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("kubectl port-forward");
    let started = Instant::now();
    let answer = loop {
        if let Ok(mut stream) = tokio::net::TcpStream::connect(("127.0.0.1", local_port)).await {
            let _ = stream.write_all(b"GET / HTTP/1.0\r\n\r\n").await;
            let mut answer = String::new();
            let _ = stream.read_to_string(&mut answer).await;
            if answer.contains("200 OK") {
                break answer;
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "port-forward to {pod} gave no answer\n{}",
            c.dump()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let _ = forward.kill();
    let _ = forward.wait();
    answer
}

/// A TLS client that presents `cert` (or none) to the runtime and asks for a CRI version.
async fn version_with(endpoint: &str, ca: &Path, cert: Option<(&[u8], &[u8])>) -> Result<String, String> {
    let ca = std::fs::read(ca).expect("ca");
    let channel = match cert {
        Some((cert, key)) => hpk_rpc::connect::mutual_tls(endpoint, &ca, cert, key, None).await,
        None => hpk_rpc::connect::tls(endpoint, &ca, None).await,
    }
    .map_err(|e| format!("connect: {e}"))?;
    let mut client = k8s_cri::v1::runtime_service_client::RuntimeServiceClient::new(channel);
    let answer = client
        .version(k8s_cri::v1::VersionRequest { version: String::new() })
        .await
        .map_err(|e| format!("Version: {e}"))?;
    Ok(answer.into_inner().runtime_name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn connector_node_runs_opted_in_pods_on_a_remote_runtime() {
    let Some(image) = hpk_integration::bubble_image() else { return };
    let Some(c) = Cluster::start_with(None, &["connector", "remote"]).await else { return };
    let bin_dir = Path::new(KUBELET).parent().expect("bin dir");
    let (home, state) = (c.dir.path().join("remote-home"), c.dir.path().join("remote-state"));
    for d in [&home, &state] {
        std::fs::create_dir_all(d).expect("mkdir");
    }
    let mut remote = RemoteRuntime::start(
        &c.cp,
        "remote",
        &bin_dir.join("hpk"),
        &image,
        (&home, &state),
        Some(&c.registry.host_port()),
        POD_CIDR,
        CONNECTOR,
    )
    .expect("runtime bubble");

    // Security first: only the connector's certificate gets an answer.
    let creds = remote.credentials.clone();
    let (cert, key) = (std::fs::read(&creds.cert).expect("cert"), std::fs::read(&creds.key).expect("key"));
    let started = Instant::now();
    let name = loop {
        match version_with(&creds.endpoint, &creds.ca, Some((&cert, &key))).await {
            Ok(name) => break name,
            Err(e) if started.elapsed() > Duration::from_secs(30) => panic!("{e}\n{}", remote.logs()),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    assert_eq!(name, "hpk-pod-runtime");
    let refused = version_with(&creds.endpoint, &creds.ca, None).await.expect_err("no client certificate");
    assert!(refused.contains("Version") || refused.contains("connect"), "{refused}");
    let other = c.dir.path().join("other-ca");
    std::fs::create_dir_all(&other).expect("mkdir");
    let other_pki = hpk_integration::pki::ClusterPki::generate(
        &other,
        "stranger",
        &[c.cp.network().gateway().into()],
        "10.96.0.1".parse().expect("ip"),
        hpk_integration::pki::Validity::for_lifetime(Duration::from_secs(3600)),
    )
    .expect("another CA");
    let stranger =
        other_pki.client_cert("stranger", "system:node:hpk-connector", &["system:nodes"]).expect("stranger");
    let refused = version_with(
        &creds.endpoint,
        &creds.ca,
        Some((&std::fs::read(&stranger.cert).expect("cert"), &std::fs::read(&stranger.key).expect("key"))),
    )
    .await
    .expect_err("a certificate from another CA");
    assert!(refused.contains("Version") || refused.contains("connect"), "{refused}");
    // Review M3: the same CA signs every node's and the admin's certificates; the runtime
    // serves the connector's kubelet only.
    for (file, cn) in [("worker", "system:node:worker-1"), ("admin2", "hpk-admin")] {
        let other =
            c.cp.pki().client_cert(file, cn, &["system:nodes"]).expect("a certificate of the same CA");
        let refused = version_with(
            &creds.endpoint,
            &creds.ca,
            Some((&std::fs::read(&other.cert).expect("cert"), &std::fs::read(&other.key).expect("key"))),
        )
        .await
        .expect_err("another name of the same CA");
        assert!(refused.contains("Version") || refused.contains("connect"), "{cn}: {refused}");
    }

    // The manifest, as a user applies it (the Deployment is run below as a process).
    let manifest = items(&c, &examples().join("hpk-connector.yaml"));
    let list = json!({"apiVersion": "v1", "kind": "List",
        "items": manifest.iter().filter(|i| i["kind"] != "Deployment").collect::<Vec<_>>()});
    c.apply(&list.to_string());
    let files = c.dir.path().join("connector");
    write_files(&c, &remote, &files);
    let mut kubelet = start_connector(&c, &remote, &files);
    let logs = |remote: &RemoteRuntime, kubelet: &Process| {
        format!("--- connector kubelet:\n{}\n{}", kubelet.log_tail(60), remote.logs())
    };

    // The node: Ready, tainted, labelled, with the remote side's allocation as its capacity.
    wait_ready(&c, "True", Duration::from_secs(60), || logs(&remote, &kubelet)).await;
    let node = connector_node(&c).await.expect("the connector's node");
    let taints = node.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
    assert!(
        taints.iter().any(|t| t.key == "hpk.io/connector"
            && t.value.as_deref() == Some("true")
            && t.effect == "NoSchedule"),
        "{taints:?}"
    );
    let labels = node.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels.get("node.hpk.io/role").map(String::as_str), Some("connector"));

    // Review M2: the connector is a node to the API server, and no more. The Node authorizer
    // and NodeRestriction refuse it what is not its own.
    let as_connector = |args: &[&str]| {
        std::process::Command::new(c.cp.bin_dir().join("kubectl"))
            .arg(format!("--kubeconfig={}", files.join("kubeconfig/kubeconfig").display()))
            .args(args)
            .output()
            .expect("kubectl")
    };
    let whoami = as_connector(&["auth", "whoami", "-o", "jsonpath={.status.userInfo.username}"]);
    assert_eq!(String::from_utf8_lossy(&whoami.stdout), "system:node:hpk-connector");
    c.kubectl(&["create", "secret", "generic", "unrelated", "--from-literal=password=hunter2"]);
    for attempt in [
        &["get", "secret", "unrelated", "-o", "yaml"][..],
        &["get", "pods", "--all-namespaces"][..],
        &["label", "node", "node1", "hpk-test=planted"][..],
        &["-n", "kube-system", "create", "token", "default"][..],
    ] {
        let out = as_connector(attempt);
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && said.contains("forbidden"), "the connector may {attempt:?}: {said}");
    }
    let channel = hpk_rpc::connect::mutual_tls(
        &creds.endpoint,
        &std::fs::read(&creds.ca).expect("ca"),
        &cert,
        &key,
        None,
    )
    .await
    .expect("channel");
    let allocation =
        RemoteClient::new(channel).allocation(AllocationRequest {}).await.expect("allocation").into_inner();
    let capacity = node.status.as_ref().and_then(|s| s.capacity.clone()).unwrap_or_default();
    for resource in ["cpu", "memory"] {
        assert_eq!(
            capacity.get(resource).map(|q| q.0.as_str()),
            allocation.capacity.get(resource).map(String::as_str),
            "{resource}: node {capacity:?}, allocation {:?}",
            allocation.capacity
        );
    }

    // The example pods: by toleration, by nodeName; and a pod without either stays off.
    c.kubectl(&["create", "configmap", "greeting", "--from-literal=greeting=hello over the link"]);
    c.apply(&example_pod(&c, "nginx-pod-toleration.yaml").to_string());
    c.apply(&example_pod(&c, "nginx-pod.yaml").to_string());
    let mut plain = example_pod(&c, "nginx-pod-toleration.yaml");
    plain["metadata"]["name"] = json!("plain");
    plain["spec"].as_object_mut().expect("spec").remove("tolerations");
    plain["spec"].as_object_mut().expect("spec").remove("nodeSelector");
    c.apply(&plain.to_string());
    let mut untolerated = example_pod(&c, "nginx-pod-toleration.yaml");
    untolerated["metadata"]["name"] = json!("untolerated");
    untolerated["spec"].as_object_mut().expect("spec").remove("tolerations");
    c.apply(&untolerated.to_string());

    // Probes the remote runtime runs: a readiness probe on a port nothing listens on fails
    // there, and says so.
    let mut unready = example_pod(&c, "nginx-pod-toleration.yaml");
    unready["metadata"]["name"] = json!("unready");
    unready["spec"]["containers"][0]["readinessProbe"] =
        json!({"httpGet": {"path": "/", "port": 8081}, "periodSeconds": 2});
    c.apply(&unready.to_string());
    // A probe naming a host other than the pod's own is refused there, and the event says so.
    let mut elsewhere = example_pod(&c, "nginx-pod-toleration.yaml");
    elsewhere["metadata"]["name"] = json!("elsewhere");
    let gateway = c.cp.network().gateway().to_string();
    elsewhere["spec"]["containers"][0]["readinessProbe"] =
        json!({"httpGet": {"host": gateway, "path": "/", "port": 8080}, "periodSeconds": 2});
    c.apply(&elsewhere.to_string());
    // gRPC probes, which the remote runtime runs too: upstream's agnhost health server, SERVING
    // for the service "" it registers, NotFound for any other.
    let grpc_probes =
        match hpk_integration::skip_unless_available(hpk_integration::clusterdns::agnhost_binary()) {
            Some(agnhost) => {
                let image =
                    hpk_integration::image::static_binary_image_from(&agnhost).expect("agnhost image");
                let client =
                    hpk_integration::registry::Client::new(&c.registry.url()).expect("registry client");
                client.push("hpk/agnhost", "v1", &image).await.expect("push agnhost");
                let reference = format!("{}/hpk/agnhost:v1", c.registry.host_port());
                for (name, service) in [("grpc-ready", ""), ("grpc-unknown", "absent")] {
                    let mut pod = example_pod(&c, "nginx-pod-toleration.yaml");
                    pod["metadata"]["name"] = json!(name);
                    let container = &mut pod["spec"]["containers"][0];
                    container["image"] = json!(reference);
                    container.as_object_mut().expect("container").remove("command");
                    container["args"] = json!(["grpc-health-checking", "--port=5000", "--http-port=8080"]);
                    container["readinessProbe"] =
                        json!({"grpc": {"port": 5000, "service": service}, "periodSeconds": 2});
                    container.as_object_mut().expect("container").remove("livenessProbe");
                    c.apply(&pod.to_string());
                }
                true
            }
            None => false,
        };

    let pods = c.pods("default");
    let remote_net: ipnet_check::Net = POD_CIDR.parse().expect("cidr");
    let connector_ip = c.cp.network().host("connector").expect("host").ip.to_string();
    for name in ["nginx-toleration", "nginx"] {
        let pod = eventually(&c, &format!("{name} Running on {CONNECTOR}"), Duration::from_secs(90), || {
            let pods = pods.clone();
            async move {
                let pod = pods.get_opt(name).await.ok()??;
                let status = pod.status.as_ref()?;
                (status.phase.as_deref() == Some("Running") && pod_ready(&pod) == Some("True")).then_some(pod)
            }
        })
        .await;
        let spec = pod.spec.as_ref().expect("spec");
        assert_eq!(spec.node_name.as_deref(), Some(CONNECTOR));
        let status = pod.status.as_ref().expect("status");
        let ip = status.pod_ip.clone().unwrap_or_default();
        assert!(remote_net.contains(&ip), "{name}'s IP {ip} is not the remote side's ({POD_CIDR})");
        assert_eq!(status.host_ip.as_deref(), Some(connector_ip.as_str()));
    }
    let refused = readiness_failures(&c, "unready").await;
    let unready = pods.get("unready").await.expect("unready");
    let ip = unready.status.as_ref().and_then(|s| s.pod_ip.clone()).unwrap_or_default();
    assert!(remote_net.contains(&ip), "unready's IP {ip} is not the remote side's ({POD_CIDR})");
    assert!(
        refused
            .contains(&format!("Get \"http://{ip}:8081/\": dial tcp {ip}:8081: connect: connection refused")),
        "{refused}"
    );
    assert_eq!(pod_ready(&unready), Some("False"));
    let refused_elsewhere = readiness_failures(&c, "elsewhere").await;
    assert!(
        refused_elsewhere.contains(&format!(
            "the remote runtime refused the probe: host \"{gateway}\" is not an address of sandbox"
        )),
        "{refused_elsewhere}"
    );
    assert_eq!(unready.spec.as_ref().and_then(|s| s.node_name.as_deref()), Some(CONNECTOR));
    if grpc_probes {
        let ready = eventually(&c, "grpc-ready Ready on the connector", Duration::from_secs(90), || {
            let pods = pods.clone();
            async move {
                let pod = pods.get_opt("grpc-ready").await.ok()??;
                (pod_ready(&pod) == Some("True")).then_some(pod)
            }
        })
        .await;
        let ip = ready.status.as_ref().and_then(|s| s.pod_ip.clone()).unwrap_or_default();
        assert!(remote_net.contains(&ip), "grpc-ready's IP {ip} is not the remote side's ({POD_CIDR})");
        // Refused until agnhost listens, then the server's NotFound: an event of its own, not
        // a repeat of the first.
        let selector = "--field-selector=involvedObject.name=grpc-unknown,reason=Unhealthy";
        let not_found =
            eventually(&c, "grpc-unknown's probe answered NotFound", Duration::from_secs(60), || async {
                let events = c.kubectl(&["get", "events", selector, "-o", "jsonpath={.items[*].message}"]);
                {
                    eprintln!("EVENTS: {events}");
                    events.contains("unknown service").then_some(events)
                }
            })
            .await;
        assert!(
            not_found.contains("Readiness probe failed: error: health rpc probe failed: rpc error: code = NotFound desc = unknown service"),
            "{not_found}"
        );
        let unknown = pods.get("grpc-unknown").await.expect("grpc-unknown");
        assert_eq!(pod_ready(&unknown), Some("False"));
    }

    let plain = eventually(&c, "plain Running on node1", Duration::from_secs(90), || {
        let pods = pods.clone();
        async move {
            let pod = pods.get_opt("plain").await.ok()??;
            (pod.status.as_ref()?.phase.as_deref() == Some("Running")).then_some(pod)
        }
    })
    .await;
    assert_eq!(plain.spec.as_ref().and_then(|s| s.node_name.as_deref()), Some(support::NODE));
    let untolerated = eventually(&c, "untolerated refused by the scheduler", Duration::from_secs(30), || {
        let pods = pods.clone();
        async move {
            let pod = pods.get_opt("untolerated").await.ok()??;
            let condition =
                pod.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == "PodScheduled")?.clone();
            (condition.status == "False").then_some(condition)
        }
    })
    .await;
    // The connector node (the only one its selector matches) refuses it for its taint.
    assert!(
        untolerated.message.as_deref().unwrap_or_default().contains("1 node(s) had untolerated taint"),
        "{untolerated:?}"
    );

    // logs, exec (with its exit code, and the ConfigMap sent over) and port-forward, all
    // through the connector's kubelet API and the link.
    let log = c.kubectl(&["logs", "nginx-toleration"]);
    assert_eq!(log, "hello from the remote runtime\n");
    let out =
        c.cp.kubectl()
            .args(["exec", "nginx-toleration", "--", "sh", "-c", "cat /config/greeting; exit 3"])
            .output()
            .expect("kubectl exec");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hello over the link");
    assert_eq!(out.status.code(), Some(3), "{}", String::from_utf8_lossy(&out.stderr));
    let answer = through_port_forward(&c, "nginx-toleration", 18081).await;
    assert!(answer.ends_with(hpk_integration::image::HTTPD_INDEX), "{answer}");

    // Cut the link: the runtime's port refuses connections (TCP resets), as when its listener
    // is gone. The node turns NotReady and its pods report it; restored, the node is Ready and
    // the same containers are adopted, never restarted.
    let before = container_identity(&pods.get("nginx-toleration").await.expect("pod")).expect("running");
    let nft = |script: &str| {
        let out = remote
            .host()
            .command("nft")
            .args(["-f", "-"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut child| {
                std::io::Write::write_all(&mut child.stdin.take().expect("stdin"), script.as_bytes())?;
                child.wait_with_output()
            });
        let out = out.expect("nft");
        assert!(out.status.success(), "nft {script}: {}", String::from_utf8_lossy(&out.stderr));
    };
    let cut_with = |verdict: &str| {
        format!(
            "table inet hpk_cut {{\n chain input {{\n  type filter hook input priority 0;\n  tcp dport {} {verdict}\n }}\n}}\n",
            remote.port()
        )
    };
    for (verdict, what) in [("reject with tcp reset", "refused"), ("drop", "dropped")] {
        nft(&cut_with(verdict));
        let cut = wait_ready(&c, "False", Duration::from_secs(40), || logs(&remote, &kubelet)).await;
        println!("NotReady {:.1} s after the link was cut (connections {what})", cut.as_secs_f64());
        hpk_integration::eventually(
            "nginx-toleration reports NotReady",
            Duration::from_secs(30),
            || {
                let pods = pods.clone();
                async move {
                    (pod_ready(&pods.get("nginx-toleration").await.ok()?) == Some("False")).then_some(())
                }
            },
            || format!("{}\n{}", c.dump(), logs(&remote, &kubelet)),
        )
        .await;
        nft("delete table inet hpk_cut");
        let restored = wait_ready(&c, "True", Duration::from_secs(60), || logs(&remote, &kubelet)).await;
        println!("Ready {:.1} s after the link came back", restored.as_secs_f64());
        let after = eventually(&c, "nginx-toleration Ready again", Duration::from_secs(30), || {
            let pods = pods.clone();
            async move {
                let pod = pods.get("nginx-toleration").await.ok()?;
                (pod_ready(&pod) == Some("True")).then(|| container_identity(&pod)).flatten()
            }
        })
        .await;
        assert_eq!(after, before, "the container was restarted");
    }
    let answer = through_port_forward(&c, "nginx-toleration", 18082).await;
    assert!(answer.ends_with(hpk_integration::image::HTTPD_INDEX), "{answer}");
    let out = c.kubectl(&["exec", "nginx-toleration", "--", "cat", "/config/greeting"]);
    assert_eq!(out, "hello over the link");

    for name in [
        "nginx-toleration",
        "nginx",
        "plain",
        "untolerated",
        "unready",
        "elsewhere",
        "grpc-ready",
        "grpc-unknown",
    ] {
        c.kubectl(&["delete", "pod", name, "--wait=false"]);
    }
    kubelet.stop();
    // The pods' containers go with the bubble; the launcher leaves nothing behind.
    remote.stop();
    let leftovers: Vec<_> = std::fs::read_dir(&state)
        .map(|d| d.flatten().map(|e| e.file_name()).filter(|n| n != "images").collect())
        .unwrap_or_default();
    assert!(leftovers.is_empty(), "the runtime bubble left {leftovers:?} in its state directory");
}

/// An IPv4 network, enough to check a pod's address.
mod ipnet_check {
    use std::net::Ipv4Addr;

    pub struct Net(u32, u32);

    impl std::str::FromStr for Net {
        type Err = String;
        fn from_str(s: &str) -> Result<Self, String> {
            let (ip, len) = s.split_once('/').ok_or("no /")?;
            let ip: Ipv4Addr = ip.parse().map_err(|e| format!("{e}"))?;
            let len: u32 = len.parse().map_err(|e| format!("{e}"))?;
            let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
            Ok(Self(u32::from(ip) & mask, mask))
        }
    }

    impl Net {
        pub fn contains(&self, ip: &str) -> bool {
            ip.parse::<Ipv4Addr>().is_ok_and(|ip| u32::from(ip) & self.1 == self.0)
        }
    }
}

/// A certificate and key pair in PEM, from a throwaway CA (rcgen).
fn pem_pair() -> (String, String) {
    let key = rcgen::KeyPair::generate().expect("key");
    let cert =
        rcgen::CertificateParams::new(vec!["x".to_owned()]).expect("params").self_signed(&key).expect("cert");
    (cert.pem(), key.serialize_pem())
}

#[test]
fn connector_flags_and_files_are_checked_before_anything_is_made() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tmp");
    let root = dir.path().join("state");
    let (cert, key) = pem_pair();
    let write = |name: &str, text: &str, mode: u32| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).expect("write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
        path.display().to_string()
    };
    let (ca, crt) = (write("ca.crt", &cert, 0o644), write("tls.crt", &cert, 0o644));
    let (open_key, private_key) = (write("open.key", &key, 0o644), write("tls.key", &key, 0o600));
    let junk = write("junk.crt", "not a certificate\n", 0o644);
    let run = |extra: &[&str]| {
        let out = std::process::Command::new(KUBELET)
            .args([
                "--node-ip=10.0.0.1",
                &format!("--root-dir={}", root.display()),
                "--kubeconfig=/nonexistent",
            ])
            .args(extra)
            .output()
            .expect("run hpk-kubelet");
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let endpoint = "--runtime-endpoint=https://10.0.0.7:7443";
    let cases: [(Vec<String>, Option<i32>, &str); 5] = [
        (vec!["--runtime-endpoint=http://10.0.0.7:7443".into()], Some(2), "https://HOST:PORT"),
        (vec![endpoint.into()], Some(2), "--runtime-ca-file"),
        (
            vec![
                endpoint.into(),
                format!("--runtime-ca-file={ca}"),
                format!("--runtime-cert-file={crt}"),
                format!("--runtime-key-file={open_key}"),
            ],
            Some(78),
            "chmod 0600",
        ),
        (
            vec![
                endpoint.into(),
                format!("--runtime-ca-file={junk}"),
                format!("--runtime-cert-file={crt}"),
                format!("--runtime-key-file={private_key}"),
            ],
            Some(78),
            "the remote runtime's credentials",
        ),
        (vec![], Some(2), "--runtime-socket"),
    ];
    for (args, code, says) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (got, stderr) = run(&args);
        assert_eq!(got, code, "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: expected {says:?} in {stderr}");
        assert!(!root.exists(), "{args:?} made {}", root.display());
    }
}
