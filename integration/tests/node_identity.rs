//! hpk-cert-signer against the real API server: a client certificate it issues is the node's
//! identity, and the Node authorizer and NodeRestriction treat it as that node and no other.

use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use hpk_cert_signer::Profile;
use hpk_cert_signer::client::{CertRequest, SignerClient};
use hpk_cert_signer::config::ServeArgs;
use hpk_integration::controlplane::{ControlPlane, client_from_kubeconfig};
use hpk_integration::pki::{CertFiles, write_kubeconfig};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};
use tokio_util::sync::CancellationToken;

const TOKEN_KEY: &str = "node-token-key-for-the-identity-test";

fn node(name: &str) -> Node {
    serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).expect("node")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_client_certificate_acts_as_its_node_and_only_that_node() {
    let Some(cp) = hpk_integration::skip_unless_available(ControlPlane::start(&["node1"]).await) else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let token_key_file = dir.path().join("node-token-key");
    std::fs::write(&token_key_file, TOKEN_KEY).expect("key");
    std::fs::set_permissions(&token_key_file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let address_file = dir.path().join("signer.url");

    // The signer holds the cluster's own CAs, as it would on the controller.
    let pki = cp.pki();
    let args = ServeArgs {
        listen: "127.0.0.1:0".parse().expect("addr"),
        address_file: Some(address_file.clone()),
        advertise: None,
        tls_cert_file: None,
        tls_private_key_file: None,
        serving_ca_cert: pki.server_ca().cert.clone(),
        serving_ca_key: pki.server_ca().key.clone(),
        client_ca_cert: pki.client_ca().cert.clone(),
        client_ca_key: pki.client_ca().key.clone(),
        token_key_file,
        shared_dir: Some(dir.path().join("shared")),
        max_validity: Duration::from_secs(3600),
        enrolled_file: None,
        cluster_domain: "cluster.local".into(),
        apiserver_sans: vec![],
    };
    let shutdown = CancellationToken::new();
    let signer = tokio::spawn(hpk_cert_signer::run(args, shutdown.clone()));
    let deadline = Instant::now() + Duration::from_secs(20);
    let url = loop {
        if let Ok(url) = std::fs::read_to_string(&address_file) {
            break url.trim().to_owned();
        }
        assert!(!signer.is_finished(), "signer stopped before listening");
        assert!(Instant::now() < deadline, "signer did not listen");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };

    let ca_pem = std::fs::read(&pki.server_ca().cert).expect("server CA");
    let token = hpk_rpc::node_token::derive(TOKEN_KEY.as_bytes(), "node1");
    let mut client = SignerClient::connect(&url, &ca_pem, &token, None).await.expect("connect");
    let request = CertRequest { node_name: "node1".into(), profile: Profile::Client, sans: vec![] };
    let creds = client.request(&request).await.expect("client certificate");
    let files = CertFiles { cert: dir.path().join("node1.crt"), key: dir.path().join("node1.key") };
    creds.write(&files.cert, &files.key).expect("write");
    let kubeconfig = dir.path().join("node1.kubeconfig");
    write_kubeconfig(&kubeconfig, cp.api_url(), &pki.server_ca().cert, "system:node:node1", &files)
        .expect("kubeconfig");
    let as_node1 = client_from_kubeconfig(&kubeconfig).await.expect("client");

    let nodes: Api<Node> = Api::all(as_node1);
    nodes.create(&PostParams::default(), &node("node1")).await.expect("node1 may register itself");
    match nodes.create(&PostParams::default(), &node("node2")).await {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 403, "{status:?}"),
        other => panic!("node1 must not register node2: {other:?}"),
    }

    shutdown.cancel();
    signer.await.expect("join").expect("signer ran cleanly");
}
