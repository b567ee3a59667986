//! The kubelet's side: generate a key locally, ask the signer for a certificate, write both
//! atomically, and renew at two thirds of the lifetime.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use hpk_proto::certsigner::v1::SignRequest;
use hpk_proto::certsigner::v1::cert_signer_client::CertSignerClient;
use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tracing::{info, warn};
use x509_parser::prelude::FromDer;

use crate::token::AttachToken;
use crate::{Error, Profile, Result, San};

/// Longest wait between failed renewal attempts.
const MAX_RETRY: Duration = Duration::from_secs(30);

/// What to ask for.
#[derive(Clone, Debug)]
pub struct CertRequest {
    /// The node the certificate is for.
    pub node_name: String,
    /// Serving or client certificate.
    pub profile: Profile,
    /// SANs (serving certificates only).
    pub sans: Vec<San>,
}

/// A private key with the certificate issued for it.
#[derive(Clone)]
pub struct Credentials {
    /// Certificate chain, PEM.
    pub chain_pem: String,
    /// Private key, PEM. Generated here; never sent anywhere.
    pub key_pem: String,
    /// The CA that issued the certificate, PEM.
    pub ca_pem: String,
    /// Serial number, hex.
    pub serial: String,
    /// End of validity.
    pub not_after: SystemTime,
    /// When the certificate was received; renewal is planned from here.
    pub received: SystemTime,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("serial", &self.serial)
            .field("not_after", &self.not_after)
            .finish()
    }
}

impl Credentials {
    /// When to renew: two thirds of the way from receipt to expiry.
    pub fn renew_at(&self) -> SystemTime {
        let lifetime = self.not_after.duration_since(self.received).unwrap_or_default();
        self.received + lifetime * 2 / 3
    }

    /// Writes the key (0600) and then the certificate (0644), each atomically.
    pub fn write(&self, cert_path: &Path, key_path: &Path) -> Result<()> {
        crate::files::write_atomic(key_path, self.key_pem.as_bytes(), 0o600)?;
        crate::files::write_atomic(cert_path, self.chain_pem.as_bytes(), 0o644)
    }
}

/// A connection to the signer, authenticated with the node token.
#[derive(Clone)]
pub struct SignerClient {
    inner: CertSignerClient<InterceptedService<Channel, AttachToken>>,
    /// Where and how it connected, to connect again as a node.
    url: String,
    ca_pem: Vec<u8>,
    token: String,
    server_name: Option<String>,
}

impl SignerClient {
    /// Connects to `url` over TLS, trusting only `ca_pem`.
    pub async fn connect(url: &str, ca_pem: &[u8], token: &str, server_name: Option<&str>) -> Result<Self> {
        Self::connect_as(url, ca_pem, token, server_name, None).await
    }

    /// [`SignerClient::connect`], presenting the node's current client certificate
    /// `(certificate PEM, key PEM)` where given: renewals of a node that has certificates
    /// need it.
    pub async fn connect_as(
        url: &str,
        ca_pem: &[u8],
        token: &str,
        server_name: Option<&str>,
        identity: Option<(&[u8], &[u8])>,
    ) -> Result<Self> {
        let channel = match identity {
            Some((cert, key)) => hpk_rpc::connect::mutual_tls(url, ca_pem, cert, key, server_name).await?,
            None => hpk_rpc::connect::tls(url, ca_pem, server_name).await?,
        };
        Ok(Self {
            inner: CertSignerClient::with_interceptor(channel, AttachToken::new(token)?),
            url: url.to_owned(),
            ca_pem: ca_pem.to_owned(),
            token: token.to_owned(),
            server_name: server_name.map(str::to_owned),
        })
    }

    /// The same signer, connected again presenting `creds` (a node's client certificate).
    pub async fn as_node(&self, creds: &Credentials) -> Result<Self> {
        let identity = (creds.chain_pem.as_bytes(), creds.key_pem.as_bytes());
        Self::connect_as(&self.url, &self.ca_pem, &self.token, self.server_name.as_deref(), Some(identity))
            .await
    }

    /// Generates a fresh key, sends a CSR for it, and checks the answer belongs to that key.
    pub async fn request(&mut self, request: &CertRequest) -> Result<Credentials> {
        let key = KeyPair::generate()?;
        let csr_pem = build_csr(request, &key)?;
        let message = SignRequest { node_name: request.node_name.clone(), csr_pem };
        let response = match request.profile {
            Profile::Serving => self.inner.sign_kubelet_serving_certificate(message).await?,
            Profile::Client => self.inner.sign_kubelet_client_certificate(message).await?,
        }
        .into_inner();
        let not_after = check_leaf(&response.certificate_chain_pem, &key)?;
        Ok(Credentials {
            chain_pem: response.certificate_chain_pem,
            key_pem: key.serialize_pem(),
            ca_pem: response.ca_pem,
            serial: response.serial,
            not_after,
            received: SystemTime::now(),
        })
    }
}

/// Builds the PEM CSR for `request`, signed by `key`.
pub fn build_csr(request: &CertRequest, key: &KeyPair) -> Result<String> {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, format!("system:node:{}", request.node_name));
    dn.push(DnType::OrganizationName, "system:nodes");
    params.distinguished_name = dn;
    params.subject_alt_names = request.sans.iter().map(San::to_rcgen).collect::<Result<_>>()?;
    Ok(params.serialize_request(key)?.pem()?)
}

/// Checks the first certificate of `chain_pem` carries `key`'s public key; returns its expiry.
fn check_leaf(chain_pem: &str, key: &KeyPair) -> Result<SystemTime> {
    let bad = |reason: String| Error::BadResponse(reason);
    let (_, pem) = x509_parser::pem::parse_x509_pem(chain_pem.as_bytes()).map_err(|e| bad(e.to_string()))?;
    let (_, cert) =
        x509_parser::certificate::X509Certificate::from_der(&pem.contents).map_err(|e| bad(e.to_string()))?;
    if cert.public_key().raw != rcgen::PublicKeyData::subject_public_key_info(key).as_slice() {
        return Err(bad("the certificate is not for the key this client generated".into()));
    }
    let secs =
        u64::try_from(cert.validity().not_after.timestamp()).map_err(|_| bad("expiry before 1970".into()))?;
    Ok(SystemTime::UNIX_EPOCH + Duration::from_secs(secs))
}

/// Keeps `current` renewed until `shutdown`: at [`Credentials::renew_at`] requests a new
/// certificate for a new key, writes it to `paths` (if given), and publishes it on `updates`.
/// Failed attempts are retried with backoff; an expiring certificate is logged loudly. A
/// client certificate is renewed presenting the current one (the token enrols a node once);
/// a serving certificate is renewed over `client`, which must present the node's client
/// certificate.
pub async fn keep_renewed(
    mut client: SignerClient,
    request: CertRequest,
    mut current: Credentials,
    paths: Option<(PathBuf, PathBuf)>,
    updates: watch::Sender<Credentials>,
    shutdown: CancellationToken,
) -> Result<()> {
    loop {
        let wait = current.renew_at().duration_since(SystemTime::now()).unwrap_or_default();
        tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            () = tokio::time::sleep(wait) => {}
        }
        let mut retry = Duration::from_secs(1);
        current = loop {
            if request.profile == Profile::Client {
                match client.as_node(&current).await {
                    Ok(as_node) => client = as_node,
                    Err(err) => {
                        warn!(node = %request.node_name, error = %err, "reconnecting with the current certificate failed")
                    }
                }
            }
            let attempt = client.request(&request).await.and_then(|creds| {
                if let Some((cert, key)) = &paths {
                    creds.write(cert, key)?;
                }
                Ok(creds)
            });
            match attempt {
                Ok(creds) => break creds,
                Err(err) => {
                    let expired = current.not_after <= SystemTime::now();
                    warn!(node = %request.node_name, profile = %request.profile, error = %err, expired, "renewal failed; retrying");
                    tokio::select! {
                        () = shutdown.cancelled() => return Ok(()),
                        () = tokio::time::sleep(retry) => {}
                    }
                    retry = (retry * 2).min(MAX_RETRY);
                }
            }
        };
        info!(node = %request.node_name, profile = %request.profile, serial = %current.serial, "certificate renewed");
        // No receiver left is fine: files (if any) are the other channel.
        let _ = updates.send(current.clone());
    }
}
