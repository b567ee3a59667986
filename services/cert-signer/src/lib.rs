//! hpk-cert-signer: the controller's kubelet certificate signer.
//!
//! The signer holds the cluster's serving CA and client CA keys on the controller and signs, over
//! TLS, certificates for keys generated on each node, after checking a node token and a fixed
//! policy ([`policy`]). The node's side — generate the key locally, request, write, renew at two
//! thirds of the lifetime — is the library `hpk-signer-client`, re-exported here as [`client`]
//! for `hpk-cert-signer request`. [`node_token`] makes a node's token from the cluster's key.

pub mod ca;
pub mod config;
pub mod enroll;
mod error;
pub mod policy;
pub mod secrets;
mod server;
pub mod service;
pub mod token;

pub use error::{Error, Result};
pub use hpk_signer_client::{Profile, client, files};
pub use server::run;

/// `hpk-cert-signer node-token`: write node `--node-name`'s token, made from the cluster's key,
/// to `--out` (created 0600, off the shared directory) or to standard output.
pub fn node_token(args: &config::NodeTokenArgs) -> Result<()> {
    policy::check_node_name(&args.node_name)?;
    let key = token::load(&args.key_file)?;
    let token = hpk_rpc::node_token::derive(key.as_bytes(), &args.node_name);
    match &args.out {
        Some(out) => {
            let shared = args.shared_dir.clone().unwrap_or_else(secrets::default_shared_dir);
            secrets::ensure_not_shared(out, &shared)?;
            Ok(files::write_atomic(out, format!("{token}\n").as_bytes(), 0o600)?)
        }
        None => {
            println!("{token}");
            Ok(())
        }
    }
}

/// `hpk-cert-signer request`: get a certificate, and with `--renew` keep it renewed until
/// `shutdown`.
pub async fn request(args: config::RequestArgs, shutdown: tokio_util::sync::CancellationToken) -> Result<()> {
    let shared = args.shared_dir.clone().unwrap_or_else(secrets::default_shared_dir);
    secrets::ensure_not_shared(&args.key_out, &shared)?;
    let url = match (&args.server, &args.server_file) {
        (Some(url), _) => url.clone(),
        (None, Some(file)) => {
            std::fs::read_to_string(file).map_err(|e| Error::file("read", file, e))?.trim().to_owned()
        }
        (None, None) => return Err(Error::Config("give --server or --server-file".into())),
    };
    let ca_pem = std::fs::read(&args.ca_cert).map_err(|e| Error::file("read", &args.ca_cert, e))?;
    let token = token::load(&args.token_file)?;
    let request = client::CertRequest { node_name: args.node_name, profile: args.profile, sans: args.sans };
    policy::check_node_name(&request.node_name)?;
    // The node's current certificate, if it has one: read before the new one replaces it.
    let identity = match (&args.client_cert, &args.client_key) {
        (Some(cert), Some(key)) if cert.is_file() && key.is_file() => Some((
            std::fs::read(cert).map_err(|e| Error::file("read", cert, e))?,
            secrets::read_private(key)?,
        )),
        _ => None,
    };
    let mut signer = client::SignerClient::connect_as(
        &url,
        &ca_pem,
        &token,
        args.server_name.as_deref(),
        identity.as_ref().map(|(c, k)| (c.as_slice(), k.as_slice())),
    )
    .await?;
    let creds = signer.request(&request).await?;
    creds.write(&args.cert_out, &args.key_out)?;
    tracing::info!(serial = %creds.serial, cert = %args.cert_out.display(), "certificate written");
    if !args.renew {
        return Ok(());
    }
    let (updates, _) = tokio::sync::watch::channel(creds.clone());
    Ok(client::keep_renewed(signer, request, creds, Some((args.cert_out, args.key_out)), updates, shutdown)
        .await?)
}
