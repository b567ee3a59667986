//! A runtime bubble (connector mode): the remote side of a kubelet that runs in another
//! cluster. Its own CA and serving certificate (keys in the node directory, never shared), the
//! net-forwarder for pod addresses from `--pod-cidr`, and hpk-pod-runtime serving CRI,
//! streaming and `hpk.podruntime.v1.Remote` with mutual TLS on the published `runtime` port
//! (relayed to the same port on the bubble's loopback), accepting the client CA the launcher
//! copied in. `runtime-ca.crt` and then `runtime-endpoint` (`https://ADDRESS:PORT`) appear in
//! the shared directory once it serves, published by the launcher: what the connector's
//! Secret and ConfigMap need.

use std::net::IpAddr;
use std::path::Path;

use super::InitArgs;
use super::controller::wait;
use super::supervisor::{Service, Supervisor};
use crate::bubble::CLIENT_CA;
use crate::bubble::spec::NODE_DIR;
use crate::error::Result;

/// Starts the runtime bubble's services.
pub async fn start(args: &InitArgs, sup: &mut Supervisor) -> Result<()> {
    let node_dir = Path::new(NODE_DIR);
    let p = |path: &Path| path.display().to_string();
    let port = args.port("runtime")?;
    let tls = node_dir.join("runtime-tls");
    crate::image::create_private_dir(&tls)?;
    let (ca, serving) = crate::pki::runtime_tls(
        &tls,
        &args.node,
        &[IpAddr::V4(args.address), IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)],
        crate::pki::Validity::for_lifetime(args.options.lifetime.unwrap_or(crate::cluster::DEFAULT_LIFETIME)),
    )?;

    let nf_socket = super::node::NF_SOCKET;
    let mut net_forwarder = super::node::net_forwarder_args();
    net_forwarder.push(format!("--pod-cidr={}", args.options.pod_cidr));
    sup.start(Service::new("hpk-net-forwarder", "/usr/local/bin/hpk-net-forwarder", net_forwarder))?;
    wait(sup, "hpk-net-forwarder", "hpk-net-forwarder's socket", || async move {
        Ok(Path::new(nf_socket).exists())
    })
    .await?;

    let mut runtime = super::node::runtime_args(args, nf_socket);
    runtime.extend([
        format!("--listen=127.0.0.1:{port}"),
        format!("--tls-cert-file={}", p(&serving.cert)),
        format!("--tls-private-key-file={}", p(&serving.key)),
        format!("--client-ca-file={}", p(&node_dir.join(CLIENT_CA))),
    ]);
    // Only the connector's kubelet, not whatever else its CA signs (review M3).
    let names = &args.options.client_names;
    let defaults = ["hpk-connector".to_owned(), "system:node:hpk-connector".to_owned()];
    let names = if names.is_empty() { &defaults[..] } else { &names[..] };
    runtime.extend(names.iter().map(|n| format!("--client-name={n}")));
    sup.start(Service::new("hpk-pod-runtime", "/usr/local/bin/hpk-pod-runtime", runtime))?;
    wait(sup, "hpk-pod-runtime", "hpk-pod-runtime's mutual-TLS port", move || async move {
        Ok(tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok())
    })
    .await?;

    // Published by the launcher (bubble::publish): the CA, then the endpoint it knows.
    let publish = node_dir.join(crate::bubble::publish::PUBLISH_DIR);
    let ca_pem =
        std::fs::read(&ca.cert).map_err(|e| crate::error::Error::io("read", ca.cert.display(), e))?;
    crate::cluster::write_file(&publish.join("runtime-ca.crt"), &ca_pem, 0o644)?;
    crate::cluster::write_file(&publish.join(crate::bubble::publish::READY), b"", 0o644)?;
    Ok(())
}
