//! The controller bubble's control plane: etcd, kube-apiserver, kube-controller-manager,
//! kube-scheduler (the upstream components of the image's multi-call binary) and
//! hpk-cert-signer, started in that order, each awaited; then what the cluster shares is put in
//! the node directory's `publish/`, from which the launcher publishes it (`bubble::publish`) —
//! the admin kubeconfig last, so that its presence means "the control plane is ready".

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject};
use kube::Api;
use kube::api::PostParams;

use super::InitArgs;
use super::supervisor::{Service, Supervisor};
use crate::addons::KUBERNETES_SERVICE_IP;
use crate::bubble::spec::{NODE_DIR, SHARED_DIR};
use crate::cluster::write_file;
use crate::controlplane;
use crate::error::{Error, Result};
use crate::pki::{ClusterPki, write_kubeconfig};

const BOUND: Duration = Duration::from_secs(120);

/// Starts the control plane and publishes the shared files.
pub async fn start(args: &InitArgs, sup: &mut Supervisor) -> Result<()> {
    let node_dir = Path::new(NODE_DIR);
    let api_port = args.port("apiserver")?;
    let signer_port = args.port("cert-signer")?;
    let d = |sub: &str| node_dir.join(sub);
    let p = |path: &Path| path.display().to_string();
    let pki_dir = d("pki");
    let lifetime = args.options.lifetime.unwrap_or(crate::cluster::DEFAULT_LIFETIME);
    let pki = ClusterPki::generate(
        &pki_dir,
        &format!("hpk-{}", args.cluster),
        &[IpAddr::V4(args.address)],
        KUBERNETES_SERVICE_IP.parse().map_err(|_| Error::Invalid("service IP".into()))?,
        crate::pki::Validity::for_lifetime(lifetime),
    )?;
    let local_api = format!("https://127.0.0.1:{api_port}");

    sup.start(Service::new(
        "etcd",
        "/usr/local/bin/etcd",
        controlplane::etcd_args(&pki, &args.node, &d("etcd")),
    ))?;
    wait(sup, "etcd", "etcd /health", || async {
        http_get_plain(controlplane::ETCD_HEALTH, "/health").await.map(|b| b.contains("\"health\":\"true\""))
    })
    .await?;

    // Published through the bubble's relay at the same port on the host's address, which is
    // also what the `kubernetes` Service's endpoint names.
    let mut apiserver =
        controlplane::apiserver_args(&pki, &d("apiserver"), "127.0.0.1", &args.address.to_string(), api_port);
    // A cluster lives as long as its job: pods of a lost node move after 30 s of it being
    // NotReady or unreachable, not upstream's 5 minutes (a pod may ask for longer).
    apiserver.push("--default-not-ready-toleration-seconds=30".into());
    apiserver.push("--default-unreachable-toleration-seconds=30".into());
    let admission = d("apiserver-admission.yaml");
    write_file(&admission, controlplane::POD_SECURITY_ADMISSION.as_bytes(), 0o644)?;
    apiserver.push(format!("--admission-control-config-file={}", p(&admission)));
    sup.start(Service::new("kube-apiserver", "/usr/local/bin/kube-apiserver", apiserver))?;
    let admin_local = d("admin.kubeconfig");
    let admin_files = pki.client_cert("admin", "hpk-admin", &["system:masters"])?;
    write_kubeconfig(&admin_local, &local_api, &pki.server_ca().cert, "admin", &admin_files)?;
    let admin = client(&admin_local).await?;
    wait(sup, "kube-apiserver", "kube-apiserver /readyz", || {
        let admin = admin.clone();
        async move { get_text(&admin, "/readyz").await.map(|b| b.trim() == "ok") }
    })
    .await?;

    let component = |file: &str, cn: &str| -> Result<PathBuf> {
        let files = pki.client_cert(file, cn, &[])?;
        let path = d(&format!("{file}.kubeconfig"));
        write_kubeconfig(&path, &local_api, &pki.server_ca().cert, file, &files)?;
        Ok(path)
    };
    let cm = component("controller-manager", "system:kube-controller-manager")?;
    let (server_ca, kubelet_ca, client_ca) =
        (pki.server_ca().clone(), pki.kubelet_ca().clone(), pki.client_ca().clone());
    sup.start(Service::new(
        "kube-controller-manager",
        "/usr/local/bin/kube-controller-manager",
        controlplane::controller_manager_args(&pki, &cm, &d("controller-manager"), "127.0.0.1"),
    ))?;
    let sched = component("scheduler", "system:kube-scheduler")?;
    sup.start(Service::new(
        "kube-scheduler",
        "/usr/local/bin/kube-scheduler",
        controlplane::scheduler_args(&sched, &d("scheduler"), "127.0.0.1"),
    ))?;
    for (service, port) in [("kube-controller-manager", 10257), ("kube-scheduler", 10259)] {
        let probe = insecure_client(&format!("https://127.0.0.1:{port}"))?;
        wait(sup, service, &format!("{service} /healthz"), || {
            let probe = probe.clone();
            async move { get_text(&probe, "/healthz").await.map(|b| b.trim() == "ok") }
        })
        .await?;
    }

    // The node-token key: the launcher's, in the node directory (review M4: no secret of the
    // nodes' is in the shared directory; the tunnel has no shared key either, each node's
    // net-forwarder makes its own key pair in memory). A node's token is made from it, and the
    // signer accepts a token for its own node's name only (review H3).
    let token_key = d(crate::cluster::NODE_TOKEN_KEY_FILE);
    if !token_key.is_file() {
        return Err(Error::Invalid(format!(
            "the launcher left no node-token key at {}",
            token_key.display()
        )));
    }
    let signer_address = d("cert-signer.address");
    let _ = std::fs::remove_file(&signer_address);
    sup.start(Service::new(
        "hpk-cert-signer",
        "/usr/local/bin/hpk-cert-signer",
        vec![
            "serve".into(),
            format!("--listen=127.0.0.1:{signer_port}"),
            format!("--advertise={}", args.address),
            format!("--address-file={}", p(&signer_address)),
            // Its own certificate comes from the server CA, which nodes pin; what it issues
            // for kubelets comes from the kubelet CA (review H3).
            format!("--tls-cert-file={}", p(&pki.cert_signer.cert)),
            format!("--tls-private-key-file={}", p(&pki.cert_signer.key)),
            format!("--serving-ca-cert={}", p(&kubelet_ca.cert)),
            format!("--serving-ca-key={}", p(&kubelet_ca.key)),
            format!("--client-ca-cert={}", p(&client_ca.cert)),
            format!("--client-ca-key={}", p(&client_ca.key)),
            format!("--token-key-file={}", p(&token_key)),
            format!("--enrolled-file={}", p(&d("cert-signer.enrolled"))),
            // What it signs lives as long as the cluster, and no longer (its CAs end a day
            // after it does): a node's client certificate, which nothing renews, lasts too.
            format!("--max-validity={}s", lifetime.as_secs() + 86_400),
            format!("--shared-dir={SHARED_DIR}"),
            // The API server's in-cluster address; its host address is not listed: every bubble
            // on that host (the controller's own node first) is a node reached at that address.
            format!("--apiserver-san={KUBERNETES_SERVICE_IP}"),
        ],
    ))?;
    wait(sup, "hpk-cert-signer", "hpk-cert-signer's address file", || {
        let f = signer_address.clone();
        async move { Ok(f.is_file()) }
    })
    .await?;

    apply_node_rbac(&admin).await?;
    // LoadBalancer Services get the nodes' addresses (super::service_lb), as its own identity.
    apply_service_lb_rbac(&admin).await?;
    let service_lb = client(&component("service-lb", super::service_lb::USER)?).await?;
    tokio::spawn(super::service_lb::run(service_lb));
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), "default");
    wait(sup, "kube-controller-manager", "the default ServiceAccount", || {
        let accounts = accounts.clone();
        async move { accounts.get_opt("default").await.map(|sa| sa.is_some()).map_err(|e| e.to_string()) }
    })
    .await?;

    // Published by the launcher (bubble::publish), which checks these parts, writes the
    // kubeconfigs itself and puts them in the shared directory, the admin kubeconfig last (the
    // "ready" mark). The parts: public certificates, and the client certificates and keys of
    // the admin; no CA key ever leaves this node. (kube-proxy runs as its node: review M4.)
    let publish = d(crate::bubble::publish::PUBLISH_DIR);
    let copy = |from: &Path, to: &str, mode: u32| -> Result<()> {
        let bytes = std::fs::read(from).map_err(|e| Error::io("read", from.display(), e))?;
        write_file(&publish.join(to), &bytes, mode)
    };
    copy(&server_ca.cert, "ca.crt", 0o644)?;
    copy(&client_ca.cert, "client-ca.crt", 0o644)?;
    copy(&admin_files.cert, "admin.crt", 0o644)?;
    copy(&admin_files.key, "admin.key", 0o600)?;
    write_file(&publish.join(crate::bubble::publish::READY), b"", 0o644)?;
    let public_api = format!("https://{}:{api_port}", args.address);
    tracing::info!(api = %public_api, "control plane ready");
    // Cluster DNS, and resource metrics (kubectl top, HorizontalPodAutoscalers), as K3s
    // ships them: Deployments on the cluster's own nodes.
    let manifest = crate::addons::coredns_manifest(&args.options.coredns_image)?;
    apply_addon("CoreDNS", &manifest, &admin_local).await?;
    tracing::info!(image = %args.options.coredns_image, "cluster DNS applied");
    let kubelet_pem = std::fs::read_to_string(&kubelet_ca.cert)
        .map_err(|e| Error::io("read", kubelet_ca.cert.display(), e))?;
    let manifest = crate::addons::metrics_server_manifest(&args.options.metrics_server_image, &kubelet_pem)?;
    apply_addon("metrics-server", &manifest, &admin_local).await?;
    tracing::info!(image = %args.options.metrics_server_image, "metrics-server applied");
    // Storage: the default StorageClass on each node's local disk, and with a shared
    // directory the ReadWriteMany ones.
    let node_volumes = format!("{}/local-path", crate::bubble::spec::LOCAL_VOLUMES_DIR);
    let shared = args.options.shared_volumes.as_ref().map(|d| d.display().to_string());
    let manifest = crate::addons::local_path_manifest(&crate::addons::LocalPath {
        image: &args.options.local_path_provisioner_image,
        helper_image: &args.options.local_path_helper_image,
        node_dir: &node_volumes,
        shared_dir: shared.as_deref(),
    })?;
    apply_addon("the local-path provisioner", &manifest, &admin_local).await?;
    tracing::info!(image = %args.options.local_path_provisioner_image, shared = ?shared, "storage applied");
    Ok(())
}

/// `kubectl apply` of add-on `what`'s `manifest` (`deploy/`).
async fn apply_addon(what: &str, manifest: &str, kubeconfig: &Path) -> Result<()> {
    use tokio::io::AsyncWriteExt;
    let mut child = tokio::process::Command::new("/usr/local/bin/kubectl")
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args(["apply", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| Error::io("run", format!("kubectl apply ({what})"), e))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(manifest.as_bytes())
            .await
            .map_err(|e| Error::io("write", format!("the {what} manifest"), e))?;
    }
    let out =
        child.wait_with_output().await.map_err(|e| Error::io("run", format!("kubectl apply ({what})"), e))?;
    if !out.status.success() {
        return Err(Error::Failed {
            what: format!("applying {what}"),
            detail: String::from_utf8_lossy(&out.stderr).into(),
        });
    }
    Ok(())
}

/// Kubernetes 1.35 lets a node read only its own Node; the net-forwarder follows the others'
/// podCIDRs and tunnel endpoints, so `system:nodes` may get/list/watch nodes.
async fn apply_node_rbac(admin: &kube::Client) -> Result<()> {
    let name = "hpk:node-peer-reader";
    create_role(admin, name, vec![rule(&["nodes"], &["get", "list", "watch"])]).await?;
    bind(admin, name, name, "Group", "system:nodes").await?;
    // Each node's kube-proxy runs with the node's own identity (no kube-proxy key on the shared
    // filesystem, review M4): the nodes get what upstream grants system:kube-proxy.
    bind(admin, "hpk:node-proxier", "system:node-proxier", "Group", "system:nodes").await
}

/// What the load-balancer controller may do: read Services and Nodes, write Services' status.
async fn apply_service_lb_rbac(admin: &kube::Client) -> Result<()> {
    let name = super::service_lb::RBAC_NAME;
    let rules = vec![
        rule(&["services", "nodes"], &["get", "list", "watch"]),
        rule(&["services/status"], &["patch", "update"]),
    ];
    create_role(admin, name, rules).await?;
    bind(admin, name, name, "User", super::service_lb::USER).await
}

/// A rule of the core API group.
fn rule(resources: &[&str], verbs: &[&str]) -> PolicyRule {
    PolicyRule {
        api_groups: Some(vec![String::new()]),
        resources: Some(resources.iter().map(|r| (*r).to_owned()).collect()),
        verbs: verbs.iter().map(|v| (*v).to_owned()).collect(),
        ..Default::default()
    }
}

/// Creates ClusterRole `name` with `rules` unless it exists.
async fn create_role(admin: &kube::Client, name: &str, rules: Vec<PolicyRule>) -> Result<()> {
    let role = ClusterRole {
        metadata: kube::api::ObjectMeta { name: Some(name.into()), ..Default::default() },
        rules: Some(rules),
        ..Default::default()
    };
    ignore_exists(Api::<ClusterRole>::all(admin.clone()).create(&PostParams::default(), &role).await)
}

/// Binds ClusterRole `role` to one subject (`kind` Group or User) as binding `name`, unless
/// it exists.
async fn bind(admin: &kube::Client, name: &str, role: &str, kind: &str, subject: &str) -> Result<()> {
    let binding = ClusterRoleBinding {
        metadata: kube::api::ObjectMeta { name: Some(name.into()), ..Default::default() },
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "ClusterRole".into(),
            name: role.into(),
        },
        subjects: Some(vec![Subject {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: kind.into(),
            name: subject.into(),
            ..Default::default()
        }]),
    };
    ignore_exists(
        Api::<ClusterRoleBinding>::all(admin.clone()).create(&PostParams::default(), &binding).await,
    )
}

fn ignore_exists<T>(r: std::result::Result<T, kube::Error>) -> Result<()> {
    match r {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Polls `probe` every 100 ms until it answers true, for at most [`BOUND`]; fails at once if
/// `service` exits meanwhile.
pub async fn wait<F, Fut>(sup: &Supervisor, service: &str, what: &str, mut probe: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = std::result::Result<bool, String>>,
{
    let deadline = tokio::time::Instant::now() + BOUND;
    let started = std::time::Instant::now();
    loop {
        sup.check_running(service)?;
        let last = match probe().await {
            Ok(true) => {
                tracing::info!(%what, seconds = started.elapsed().as_secs_f64(), "ready");
                return Ok(());
            }
            Ok(false) => "answered, not ready".to_owned(),
            Err(e) => e,
        };
        if tokio::time::Instant::now() >= deadline {
            return Err(Error::NotReady { what: what.into(), seconds: BOUND.as_secs(), detail: last });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A plain-HTTP GET on the bubble's loopback (etcd's health); the body.
async fn http_get_plain(addr: &str, path: &str) -> std::result::Result<String, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut body = String::new();
    tokio::time::timeout(Duration::from_secs(2), s.read_to_string(&mut body))
        .await
        .map_err(|_| "no answer within 2 s".to_owned())?
        .map_err(|e| e.to_string())?;
    Ok(body)
}

/// A client from a kubeconfig file.
pub async fn client(path: &Path) -> Result<kube::Client> {
    let kubeconfig = kube::config::Kubeconfig::read_from(path)
        .map_err(|e| Error::Invalid(format!("{}: {e}", path.display())))?;
    let config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
            .await
            .map_err(|e| Error::Invalid(format!("{}: {e}", path.display())))?;
    Ok(kube::Client::try_from(config)?)
}

fn insecure_client(url: &str) -> Result<kube::Client> {
    let mut config = kube::Config::new(url.parse().map_err(|e| Error::Invalid(format!("{url}: {e}")))?);
    config.accept_invalid_certs = true;
    Ok(kube::Client::try_from(config)?)
}

async fn get_text(client: &kube::Client, path: &str) -> std::result::Result<String, String> {
    let request = http::Request::get(path).body(Vec::new()).map_err(|e| e.to_string())?;
    client.request_text(request).await.map_err(|e| e.to_string())
}
