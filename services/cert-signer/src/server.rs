//! `run`: load and check everything, then serve until shutdown.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use hpk_proto::certsigner::v1::cert_signer_server::CertSignerServer;
use hpk_rpc::log_limit::LogLimit;
use hpk_rpc::{Listener, Services};
use tokio_util::sync::CancellationToken;
use tonic::service::interceptor::InterceptedService;
use tracing::info;

use crate::ca::Authority;
use crate::config::ServeArgs;
use crate::policy::{Policy, San};
use crate::service::{MAX_REQUEST_BYTES, Service, Signer};
use crate::token::RequireToken;
use crate::{Error, Profile, Result};

/// Validity of the signer's own TLS certificate (capped by the CA's expiry). A signer lives as
/// long as its Slurm job, far less than this.
const OWN_CERT_VALIDITY: Duration = Duration::from_secs(365 * 86_400);

/// Runs the signer until `shutdown` is cancelled. Every file is checked before the socket is
/// bound, so a misconfigured signer never listens.
pub async fn run(args: ServeArgs, shutdown: CancellationToken) -> Result<()> {
    let shared = args.shared_dir.clone().unwrap_or_else(crate::secrets::default_shared_dir);
    let token_key = crate::token::load(&args.token_key_file)?;
    crate::secrets::ensure_not_shared(&args.token_key_file, &shared)?;
    let serving = Authority::load(Profile::Serving, &args.serving_ca_cert, &args.serving_ca_key, &shared)?;
    let client = Authority::load(Profile::Client, &args.client_ca_cert, &args.client_ca_key, &shared)?;
    let policy = Policy::new(&args.cluster_domain, &args.apiserver_sans);

    let host = advertised_host(&args)?;
    let (own_chain, own_key) = match (&args.tls_cert_file, &args.tls_private_key_file) {
        (Some(cert), Some(key)) => {
            crate::secrets::ensure_not_shared(key, &shared)?;
            let key_pem = crate::secrets::read_private(key)?;
            let chain = std::fs::read(cert).map_err(|e| Error::file("read", cert, e))?;
            (chain, key_pem)
        }
        _ => {
            let own_key = rcgen::KeyPair::generate()?;
            let own_cert = serving.issue_server(
                &own_key,
                "hpk-cert-signer",
                &[host.parse::<San>()?],
                OWN_CERT_VALIDITY,
            )?;
            (own_cert.chain_pem.into_bytes(), own_key.serialize_pem().into_bytes())
        }
    };
    // A node may present its client certificate (renewals must): verified against the client CA.
    let client_ca_pem =
        std::fs::read(&args.client_ca_cert).map_err(|e| Error::file("read", &args.client_ca_cert, e))?;
    let listener =
        Listener::tls_with_optional_client_ca(args.listen, &own_chain, &own_key, &client_ca_pem).await?;
    let enrolment = crate::enroll::Enrolment::load(args.enrolled_file.as_deref())?;
    let port = listener.local_addr().map(|a| a.port()).unwrap_or(args.listen.port());
    let url = format!("https://{}:{port}", bracket_ipv6(&host));
    if let Some(path) = &args.address_file {
        crate::files::write_atomic(path, format!("{url}\n").as_bytes(), 0o644)?;
    }
    info!(%url, max_validity_s = args.max_validity.as_secs(), "cert-signer ready");

    let signer = Service(Arc::new(Signer {
        policy,
        serving,
        client,
        max_validity: args.max_validity,
        token_key: token_key.into_bytes(),
        enrolment,
        refusals: LogLimit::default(),
    }));
    let grpc = CertSignerServer::new(signer).max_decoding_message_size(MAX_REQUEST_BYTES);
    let services = Services::new()
        .with(InterceptedService::new(grpc, RequireToken::default()))
        .describe(hpk_proto::FILE_DESCRIPTOR_SET);
    hpk_rpc::serve(listener, services, shutdown).await?;
    if let Some(path) = &args.address_file {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

/// The host clients use: `--advertise`, else the listen address if it is a specific one.
fn advertised_host(args: &ServeArgs) -> Result<String> {
    if let Some(host) = &args.advertise {
        return Ok(host.clone());
    }
    let ip: IpAddr = args.listen.ip();
    if ip.is_unspecified() {
        return Err(Error::Config(format!(
            "--listen {} is a wildcard address: give --advertise with the host name or address clients use",
            args.listen
        )));
    }
    Ok(ip.to_string())
}

fn bracket_ipv6(host: &str) -> String {
    if host.parse::<std::net::Ipv6Addr>().is_ok() { format!("[{host}]") } else { host.to_owned() }
}
