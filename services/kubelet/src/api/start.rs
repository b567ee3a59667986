//! Starting the kubelet API: the serving certificate (files, or the cert-signer with
//! renewal), the client CA, the listener, the background stats sampling.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use hpk_signer_client::{CertRequest, Profile, San, SignerClient, keep_renewed};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::auth::{Authenticator, Authorizer};
use super::tls::{self, ServingCert};
use super::{KubeletApi, stats};
use crate::config::KubeletArgs;
use crate::error::{Error, Result};
use crate::pods::Context;

/// How long start-up waits for the cert-signer to issue the serving certificate.
const SIGNER_WAIT: Duration = Duration::from_secs(30);
/// How often stats are sampled when nobody asks, so CPU rates are ready when someone does.
const STATS_EVERY: Duration = Duration::from_secs(10);

/// The kubelet API, bound but not yet serving: the certificate obtained, the port taken.
pub struct Prepared {
    listener: tokio::net::TcpListener,
    config: rustls::ServerConfig,
    address: SocketAddr,
}

/// Obtains the serving certificate and binds `--address:--kubelet-port`, before the node is
/// registered: a node that cannot serve its API is not registered. Nothing listens unless
/// every check passed.
pub async fn prepare(
    args: &KubeletArgs,
    node: &str,
    hostname: &str,
    shutdown: &CancellationToken,
) -> Result<Prepared> {
    let serving = serving_certificate(args, node, hostname, shutdown).await?;
    let client_ca = match &args.client_ca_file {
        Some(path) => Some(read(path, "--client-ca-file")?),
        None => {
            tracing::warn!(
                "no --client-ca-file: the kubelet API accepts bearer tokens only, not the API server's client certificate"
            );
            None
        }
    };
    let config = tls::server_config(serving, client_ca.as_deref())?;
    let address = SocketAddr::new(args.address.unwrap_or(args.node_ip), args.kubelet_port);
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .map_err(|e| Error::Config(format!("kubelet API: cannot listen on {address}: {e}")))?;
    Ok(Prepared { listener, config, address })
}

impl Prepared {
    /// Serves until `shutdown`, reviewing tokens and access through `client` (the node's).
    pub fn serve(
        self,
        args: &KubeletArgs,
        ctx: Arc<Context>,
        client: kube::Client,
        shutdown: &CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        let api = Arc::new(KubeletApi::new(
            ctx.clone(),
            Authenticator::new(client.clone(), args.authentication_token_webhook_cache_ttl),
            Authorizer::new(
                client,
                ctx.node_name.clone(),
                args.authorization_webhook_cache_authorized_ttl,
                args.authorization_webhook_cache_unauthorized_ttl,
            ),
            stats::Collector::new(ctx.node_name.clone(), args.root_dir.clone(), ctx.logs_dir.clone()),
        ));
        tokio::spawn(sample_stats(api.clone(), shutdown.clone()));
        tracing::info!(address = %self.address, "kubelet API serving (TLS, authenticated, authorized)");
        tokio::spawn(super::serve(self.listener, Arc::new(self.config), api, shutdown.clone()))
    }
}

async fn sample_stats(api: Arc<KubeletApi>, shutdown: CancellationToken) {
    loop {
        if let Err(status) = api.stats().summary(&api.context().cri).await {
            tracing::debug!(error = %status.message(), "stats sample failed");
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(STATS_EVERY) => {}
        }
    }
}

/// The serving certificate: from `--tls-cert-file`, or from the cert-signer (renewed in the
/// background and swapped in without a restart).
async fn serving_certificate(
    args: &KubeletArgs,
    node: &str,
    hostname: &str,
    shutdown: &CancellationToken,
) -> Result<Arc<ServingCert>> {
    if let (Some(cert), Some(key)) = (&args.tls_cert_file, &args.tls_private_key_file) {
        return ServingCert::from_files(cert, key).map(Arc::new).map_err(Error::Tls);
    }
    let url = match (&args.cert_signer_url, &args.cert_signer_address_file) {
        (Some(url), _) => url.clone(),
        (None, Some(file)) => std::fs::read_to_string(file).map(|s| s.trim().to_owned()).map_err(|e| {
            Error::Config(format!("reading --cert-signer-address-file {}: {e}", file.display()))
        })?,
        (None, None) => {
            return Err(Error::Config(
                "the kubelet API needs a serving certificate: give --cert-signer-url (or \
                 --cert-signer-address-file) with --cert-signer-ca and --node-token-file, or \
                 --tls-cert-file and --tls-private-key-file"
                    .into(),
            ));
        }
    };
    let ca_path = args
        .cert_signer_ca
        .as_deref()
        .ok_or_else(|| Error::Config("--cert-signer-ca is needed with the cert-signer".into()))?;
    let token_path = args
        .node_token_file
        .as_deref()
        .ok_or_else(|| Error::Config("--node-token-file is needed with the cert-signer".into()))?;
    let ca = read(ca_path, "--cert-signer-ca")?;
    tls::check_private(token_path)?;
    let token = String::from_utf8(read(token_path, "--node-token-file")?)
        .map_err(|_| Error::Config(format!("{} is not text", token_path.display())))?
        .trim()
        .to_owned();
    let identity = match (&args.cert_signer_client_cert, &args.cert_signer_client_key) {
        (Some(cert), Some(key)) => {
            tls::check_private(key)?;
            Some((read(cert, "--cert-signer-client-cert")?, read(key, "--cert-signer-client-key")?))
        }
        _ => None,
    };

    // The node name is a DNS name by construction; a host name that is not one (upper case
    // aside) would make the signer refuse the whole request, so it is left out.
    let mut sans = vec![San::Ip(args.node_ip)];
    for name in [node.to_owned(), hostname.to_lowercase()] {
        let dns = San::Dns(name.clone());
        if crate::config::is_dns_subdomain(&name) && !sans.contains(&dns) {
            sans.push(dns);
        } else if !sans.contains(&dns) {
            tracing::info!(name, "not a DNS name; left out of the serving certificate");
        }
    }
    let request = CertRequest { node_name: node.to_owned(), profile: Profile::Serving, sans };
    let deadline = tokio::time::Instant::now() + SIGNER_WAIT;
    let (client, creds) = loop {
        let attempt = async {
            let identity = identity.as_ref().map(|(c, k)| (c.as_slice(), k.as_slice()));
            let mut client = SignerClient::connect_as(&url, &ca, &token, None, identity).await?;
            let creds = client.request(&request).await?;
            Ok::<_, hpk_signer_client::Error>((client, creds))
        };
        match attempt.await {
            Ok(done) => break done,
            // A refusal (bad token, policy) will not change by waiting.
            Err(e) if is_refusal(&e) => return Err(Error::Signer(format!("{url} refused: {e}"))),
            Err(e) if tokio::time::Instant::now() >= deadline || shutdown.is_cancelled() => {
                return Err(Error::Signer(format!(
                    "{url}: no certificate within {}s: {e}",
                    SIGNER_WAIT.as_secs()
                )));
            }
            Err(e) => tracing::info!(error = %e, "waiting for the cert-signer"),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    tracing::info!(serial = %creds.serial, "serving certificate issued by the cert-signer");
    let serving = Arc::new(
        ServingCert::from_pem(creds.chain_pem.as_bytes(), creds.key_pem.as_bytes())
            .map_err(Error::SignedCert)?,
    );
    let (tx, mut rx) = watch::channel(creds.clone());
    tokio::spawn(keep_renewed(client, request, creds, None, tx, shutdown.clone()));
    let swapped = serving.clone();
    tokio::spawn(async move {
        while rx.changed().await.is_ok() {
            let creds = rx.borrow_and_update().clone();
            match swapped.replace(creds.chain_pem.as_bytes(), creds.key_pem.as_bytes()) {
                Ok(()) => tracing::info!(serial = %creds.serial, "serving certificate renewed"),
                Err(error) => {
                    tracing::error!(%error, "renewed serving certificate unusable; keeping the old one")
                }
            }
        }
    });
    Ok(serving)
}

fn read(path: &Path, flag: &str) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| Error::Config(format!("reading {flag} {}: {e}", path.display())))
}

/// The signer answered and said no (token, policy): retrying cannot help.
fn is_refusal(e: &hpk_signer_client::Error) -> bool {
    matches!(e, hpk_signer_client::Error::Refused(status)
        if matches!(status.code(), tonic::Code::Unauthenticated | tonic::Code::PermissionDenied
            | tonic::Code::InvalidArgument | tonic::Code::FailedPrecondition))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: KubeletArgs,
    }

    fn args(extra: &[&str]) -> KubeletArgs {
        let base = ["hpk-kubelet", "--kubeconfig=/nonexistent", "--node-ip=127.0.0.1"];
        let more = ["--runtime-socket=/nonexistent", "--root-dir=/nonexistent", "--kubelet-port=0"];
        Cli::try_parse_from(base.iter().chain(&more).chain(extra)).expect("flags").args
    }

    async fn refusal(extra: &[&str]) -> String {
        match prepare(&args(extra), "node1", "node1", &CancellationToken::new()).await {
            Err(Error::Config(message)) => message,
            Err(error @ (Error::Tls(_) | Error::Flag(_))) => error.to_string(),
            Err(other) => panic!("{extra:?}: not a configuration error: {other}"),
            Ok(_) => panic!("{extra:?}: the API started"),
        }
    }

    #[tokio::test]
    async fn a_missing_or_unsafe_certificate_source_is_a_configuration_error() {
        assert!(refusal(&[]).await.contains("needs a serving certificate"));
        assert!(refusal(&["--cert-signer-url=https://127.0.0.1:1"]).await.contains("--cert-signer-ca"));
        let dir = tempfile::tempdir().expect("tempdir");
        let token = dir.path().join("token");
        std::fs::write(&token, "secret").expect("write");
        std::fs::set_permissions(&token, std::os::unix::fs::PermissionsExt::from_mode(0o644)).expect("chmod");
        let (ca, token_flag) = (
            format!("--cert-signer-ca={}", token.display()),
            format!("--node-token-file={}", token.display()),
        );
        let message = refusal(&["--cert-signer-url=https://127.0.0.1:1", &ca, &token_flag]).await;
        assert!(message.contains("must be 0600"), "{message}");
        let cert = dir.path().join("none.crt");
        let message = refusal(&[
            &format!("--tls-cert-file={}", cert.display()),
            &format!("--tls-private-key-file={}", token.display()),
        ])
        .await;
        assert!(message.contains("0600"), "{message}");
        // Flags that need each other are refused by the parser itself.
        assert!(
            Cli::try_parse_from([
                "hpk-kubelet",
                "--kubeconfig=/x",
                "--node-ip=127.0.0.1",
                "--runtime-socket=/x",
                "--root-dir=/x",
                "--tls-cert-file=/x"
            ])
            .is_err()
        );
    }
}
