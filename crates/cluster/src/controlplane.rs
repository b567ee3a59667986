//! The upstream control plane's flags, shared by the controller bubble and the test harness:
//! the same API server, controller-manager and scheduler configuration wherever a test claims
//! Kubernetes behaviour. Callers add what differs (where things listen, extras).

use std::path::Path;

use crate::addons::{CLUSTER_CIDR, NODE_CIDR_MASK, SERVICE_CIDR};
use crate::pki::ClusterPki;

fn p(path: &Path) -> String {
    path.display().to_string()
}

/// Where etcd answers `/health` (and metrics, no data) without a certificate.
pub const ETCD_HEALTH: &str = "127.0.0.1:2381";

/// etcd member `name` with its data in `data_dir`, on the loopback, with TLS and client
/// certificates of the etcd CA on its client and peer ports (review M1): whatever else shares
/// the loopback (a hostNetwork pod on the controller) reads nothing. Health on [`ETCD_HEALTH`].
pub fn etcd_args(pki: &ClusterPki, name: &str, data_dir: &Path) -> Vec<String> {
    let (ca, server) = (p(&pki.etcd_ca.cert), &pki.etcd_server);
    vec![
        format!("--name={name}"),
        format!("--data-dir={}", p(data_dir)),
        "--listen-client-urls=https://127.0.0.1:2379".into(),
        "--advertise-client-urls=https://127.0.0.1:2379".into(),
        format!("--cert-file={}", p(&server.cert)),
        format!("--key-file={}", p(&server.key)),
        "--client-cert-auth".into(),
        format!("--trusted-ca-file={ca}"),
        "--listen-peer-urls=https://127.0.0.1:2380".into(),
        "--initial-advertise-peer-urls=https://127.0.0.1:2380".into(),
        format!("--initial-cluster={name}=https://127.0.0.1:2380"),
        format!("--peer-cert-file={}", p(&server.cert)),
        format!("--peer-key-file={}", p(&server.key)),
        "--peer-client-cert-auth".into(),
        format!("--peer-trusted-ca-file={ca}"),
        format!("--listen-metrics-urls=http://{ETCD_HEALTH}"),
        // A cluster lives as long as its job: its data need not survive a power loss.
        "--unsafe-no-fsync".into(),
        "--log-level=warn".into(),
    ]
}

/// The API server's admission configuration in HPK's bubbles: Pod Security Admission
/// enforces the `baseline` level in every namespace without a level of its own (review H5),
/// and warns at it, so no pod is privileged, shares the node's namespaces or mounts a
/// hostPath unless its namespace says so: `kubectl label namespace NS
/// pod-security.kubernetes.io/enforce=privileged` (the README's "Pod security"). kube-system,
/// where HPK's own add-ons run, is exempt.
pub const POD_SECURITY_ADMISSION: &str = "\
apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
- name: PodSecurity
  configuration:
    apiVersion: pod-security.admission.config.k8s.io/v1
    kind: PodSecurityConfiguration
    defaults:
      enforce: baseline
      enforce-version: latest
      warn: baseline
      warn-version: latest
      audit: baseline
      audit-version: latest
    exemptions:
      usernames: []
      runtimeClasses: []
      namespaces: [kube-system]
";

/// kube-apiserver on etcd at 127.0.0.1:2379 (TLS, with its own client certificate), listening
/// on `bind`:`port`, advertising `advertise` (the `kubernetes` Service's endpoint),
/// authenticating with the cluster's PKI, authorizing with Node and RBAC, verifying kubelets
/// against the kubelet CA, with the aggregation layer's request-header CA and front-proxy
/// client.
pub fn apiserver_args(
    pki: &ClusterPki,
    cert_dir: &Path,
    bind: &str,
    advertise: &str,
    port: u16,
) -> Vec<String> {
    vec![
        "--etcd-servers=https://127.0.0.1:2379".into(),
        format!("--etcd-cafile={}", p(&pki.etcd_ca.cert)),
        format!("--etcd-certfile={}", p(&pki.apiserver_etcd_client.cert)),
        format!("--etcd-keyfile={}", p(&pki.apiserver_etcd_client.key)),
        format!("--bind-address={bind}"),
        format!("--advertise-address={advertise}"),
        format!("--secure-port={port}"),
        format!("--cert-dir={}", p(cert_dir)),
        format!("--tls-cert-file={}", p(&pki.apiserver.cert)),
        format!("--tls-private-key-file={}", p(&pki.apiserver.key)),
        format!("--client-ca-file={}", p(&pki.client_ca().cert)),
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
        format!("--service-account-key-file={}", p(&pki.service_account_pub)),
        format!("--service-account-signing-key-file={}", p(&pki.service_account_key)),
        format!("--service-cluster-ip-range={SERVICE_CIDR}"),
        "--authorization-mode=Node,RBAC".into(),
        "--enable-admission-plugins=NodeRestriction".into(),
        format!("--kubelet-client-certificate={}", p(&pki.apiserver_kubelet_client.cert)),
        format!("--kubelet-client-key={}", p(&pki.apiserver_kubelet_client.key)),
        // Kubelets are verified with their own CA: no kubelet certificate passes as the API
        // server, whose certificate is from the server CA (review H3).
        format!("--kubelet-certificate-authority={}", p(&pki.kubelet_ca().cert)),
        "--kubelet-preferred-address-types=InternalIP,Hostname".into(),
        // The aggregation layer (metrics-server behind metrics.k8s.io): requests proxied with
        // the front-proxy client certificate.
        format!("--requestheader-client-ca-file={}", p(&pki.request_header_ca.cert)),
        "--requestheader-allowed-names=front-proxy-client".into(),
        "--requestheader-username-headers=X-Remote-User".into(),
        "--requestheader-group-headers=X-Remote-Group".into(),
        "--requestheader-extra-headers-prefix=X-Remote-Extra-".into(),
        format!("--proxy-client-cert-file={}", p(&pki.front_proxy_client.cert)),
        format!("--proxy-client-key-file={}", p(&pki.front_proxy_client.key)),
        "--allow-privileged=true".into(),
        "--profiling=false".into(),
    ]
}

/// kube-controller-manager with `kubeconfig`, health on `bind`:10257: node podCIDRs (/24s of
/// the cluster CIDR), service-account tokens, the CSR signers on the cluster's CAs, and a node
/// whose Lease stops Unknown after 20 s (upstream: 50 s).
pub fn controller_manager_args(
    pki: &ClusterPki,
    kubeconfig: &Path,
    cert_dir: &Path,
    bind: &str,
) -> Vec<String> {
    let (server_ca, client_ca) = (pki.server_ca(), pki.client_ca());
    vec![
        format!("--kubeconfig={}", p(kubeconfig)),
        format!("--authentication-kubeconfig={}", p(kubeconfig)),
        format!("--authorization-kubeconfig={}", p(kubeconfig)),
        format!("--bind-address={bind}"),
        "--secure-port=10257".into(),
        format!("--cert-dir={}", p(cert_dir)),
        format!("--service-account-private-key-file={}", p(&pki.service_account_key)),
        format!("--root-ca-file={}", p(&server_ca.cert)),
        "--use-service-account-credentials=true".into(),
        "--allocate-node-cidrs=true".into(),
        format!("--cluster-cidr={CLUSTER_CIDR}"),
        format!("--node-cidr-mask-size={NODE_CIDR_MASK}"),
        format!("--service-cluster-ip-range={SERVICE_CIDR}"),
        format!("--cluster-signing-kubelet-serving-cert-file={}", p(&pki.kubelet_ca().cert)),
        format!("--cluster-signing-kubelet-serving-key-file={}", p(&pki.kubelet_ca().key)),
        format!("--cluster-signing-kubelet-client-cert-file={}", p(&client_ca.cert)),
        format!("--cluster-signing-kubelet-client-key-file={}", p(&client_ca.key)),
        format!("--cluster-signing-kube-apiserver-client-cert-file={}", p(&client_ca.cert)),
        format!("--cluster-signing-kube-apiserver-client-key-file={}", p(&client_ca.key)),
        // The Lease is renewed every 10 s: a lost node is noticed within 20 s.
        "--node-monitor-grace-period=20s".into(),
        "--leader-elect=false".into(),
        "--profiling=false".into(),
    ]
}

/// kube-scheduler with `kubeconfig`, health on `bind`:10259.
pub fn scheduler_args(kubeconfig: &Path, cert_dir: &Path, bind: &str) -> Vec<String> {
    vec![
        format!("--kubeconfig={}", p(kubeconfig)),
        format!("--authentication-kubeconfig={}", p(kubeconfig)),
        format!("--authorization-kubeconfig={}", p(kubeconfig)),
        format!("--bind-address={bind}"),
        "--secure-port=10259".into(),
        format!("--cert-dir={}", p(cert_dir)),
        "--leader-elect=false".into(),
        "--profiling=false".into(),
    ]
}
