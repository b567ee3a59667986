//! Signing latency and idle memory of the real `hpk-cert-signer` binary over TLS, beside a
//! baseline: one `openssl x509 -req` process per CSR, the shell-script way of signing a CSR file
//! (what a file-polling signer runs for each request, before adding its polling interval).
//!
//! Run: `cargo bench -p hpk-cert-signer --bench signing` (prints a Markdown table).

#[path = "../tests/support/mod.rs"]
mod support;

use std::process::Command;
use std::time::{Duration, Instant};

use hpk_cert_signer::Profile;
use hpk_cert_signer::client::{CertRequest, build_csr};
use hpk_proto::certsigner::v1::SignRequest;
use hpk_proto::certsigner::v1::cert_signer_client::CertSignerClient;
use support::{Pki, Signer, TOKEN};

const SEQUENTIAL: usize = 1000;
const CONCURRENT: usize = 100;
const BASELINE: usize = 100;

fn main() {
    support::init_crypto();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    runtime.block_on(run());
}

async fn run() {
    let pki = Pki::new();
    let signer = Signer::start(&pki, &[]);
    // Let start-up allocations settle before calling it idle.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle_rss = support::rss_kib(signer.pid());

    // The token enrols each node name once: every request of a run is for a name of its own.
    let total = 1 + SEQUENTIAL + CONCURRENT;
    let name = |i: usize| format!("node-{i}");
    let csrs: Vec<String> = (0..total)
        .map(|i| {
            let request = CertRequest {
                node_name: name(i),
                profile: Profile::Serving,
                sans: vec![name(i).parse().expect("SAN"), "10.1.0.1".parse().expect("SAN")],
            };
            build_csr(&request, &rcgen::KeyPair::generate().expect("key")).expect("CSR")
        })
        .collect();
    let channel = hpk_rpc::connect::tls(&signer.url, &signer.ca_pem, None).await.expect("connect");
    let auth: tonic::metadata::MetadataValue<_> = format!("Bearer {TOKEN}").parse().expect("header");
    let sign_on = |channel: tonic::transport::Channel, node: String, csr: String| {
        let mut client = CertSignerClient::new(channel);
        let mut request = tonic::Request::new(SignRequest { node_name: node, csr_pem: csr });
        request.metadata_mut().insert("authorization", auth.clone());
        async move {
            let start = Instant::now();
            client.sign_kubelet_serving_certificate(request).await.expect("signed");
            start.elapsed()
        }
    };
    let sign = |i: usize| sign_on(channel.clone(), name(i), csrs[i].clone());

    // Warm the connection (TLS handshake, HTTP/2 settings) outside the measurement.
    sign(0).await;
    let mut sequential = Vec::with_capacity(SEQUENTIAL);
    for i in 1..=SEQUENTIAL {
        sequential.push(sign(i).await);
    }
    let wall = Instant::now();
    let tasks: Vec<_> = (SEQUENTIAL + 1..total).map(|i| tokio::spawn(sign(i))).collect();
    let mut concurrent = Vec::with_capacity(CONCURRENT);
    for task in tasks {
        concurrent.push(task.await.expect("task"));
    }
    let concurrent_wall = wall.elapsed();

    // A node's renewals: over mutual TLS, presenting its client certificate (review H3).
    let mut client = signer.client().await;
    let node_creds = client
        .request(&CertRequest { node_name: "renewing".into(), profile: Profile::Client, sans: vec![] })
        .await
        .expect("the renewing node's client certificate");
    let renewal_channel = hpk_rpc::connect::mutual_tls(
        &signer.url,
        &signer.ca_pem,
        node_creds.chain_pem.as_bytes(),
        node_creds.key_pem.as_bytes(),
        None,
    )
    .await
    .expect("connect as the node");
    let renewal_csr = build_csr(
        &CertRequest {
            node_name: "renewing".into(),
            profile: Profile::Serving,
            sans: vec!["renewing".parse().expect("SAN")],
        },
        &rcgen::KeyPair::generate().expect("key"),
    )
    .expect("CSR");
    sign_on(renewal_channel.clone(), "renewing".into(), renewal_csr.clone()).await;
    let mut renewals = Vec::with_capacity(SEQUENTIAL);
    for _ in 0..SEQUENTIAL {
        renewals.push(sign_on(renewal_channel.clone(), "renewing".into(), renewal_csr.clone()).await);
    }
    let loaded_rss = support::rss_kib(signer.pid());

    let baseline = openssl_baseline(&pki, &csrs[..BASELINE]);

    println!("| measurement | n | p50 | p99 | max |");
    println!("|---|---|---|---|---|");
    row("hpk-cert-signer, sequential over one TLS connection", &mut sequential);
    row(
        &format!("hpk-cert-signer, {CONCURRENT} in flight at once (wall {concurrent_wall:.1?})"),
        &mut concurrent,
    );
    row("hpk-cert-signer, renewals presenting the node's certificate (mutual TLS)", &mut renewals);
    match baseline {
        Some(mut samples) => row("baseline: `openssl x509 -req` process per CSR", &mut samples),
        None => println!("| baseline: openssl not found on PATH | - | - | - | - |"),
    }
    println!();
    println!("idle RSS after start-up: {:.1} MiB; after the load: {:.1} MiB", mib(idle_rss), mib(loaded_rss));
}

fn openssl_baseline(pki: &Pki, csrs: &[String]) -> Option<Vec<Duration>> {
    let dir = pki.dir.path().join("openssl");
    std::fs::create_dir_all(&dir).expect("mkdir");
    let mut samples = Vec::with_capacity(csrs.len());
    for (i, csr) in csrs.iter().enumerate() {
        let csr_path = dir.join(format!("{i}.csr"));
        std::fs::write(&csr_path, csr).expect("write CSR");
        let start = Instant::now();
        let status = Command::new("openssl")
            .args(["x509", "-req", "-days", "7", "-CAcreateserial", "-in"])
            .arg(&csr_path)
            .arg("-CA")
            .arg(&pki.serving_ca_cert)
            .arg("-CAkey")
            .arg(&pki.serving_ca_key)
            .arg("-CAserial")
            .arg(dir.join("ca.srl"))
            .arg("-out")
            .arg(dir.join(format!("{i}.crt")))
            .stderr(std::process::Stdio::null())
            .status()
            .ok()?;
        assert!(status.success(), "openssl failed");
        samples.push(start.elapsed());
    }
    Some(samples)
}

fn row(name: &str, samples: &mut [Duration]) {
    samples.sort();
    let pick = |q: f64| samples[((samples.len() as f64 * q).ceil() as usize).saturating_sub(1)];
    println!(
        "| {name} | {} | {:.2} ms | {:.2} ms | {:.2} ms |",
        samples.len(),
        ms(pick(0.50)),
        ms(pick(0.99)),
        ms(*samples.last().expect("samples"))
    );
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}
