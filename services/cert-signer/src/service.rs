//! The `hpk.certsigner.v1.CertSigner` gRPC service.

use std::sync::Arc;
use std::time::Duration;

use hpk_proto::certsigner::v1::cert_signer_server::CertSigner;
use hpk_proto::certsigner::v1::{SignRequest, SignResponse};
use hpk_rpc::log_limit::LogLimit;
use tonic::{Request, Response, Status};
use tracing::{info, warn};

use crate::ca::{Authority, Issued};
use crate::enroll::{Caller, Enrolment};
use crate::policy::Policy;
use crate::{Profile, Result};

/// Largest request accepted; a CSR with 16 SANs is a few kilobytes.
pub const MAX_REQUEST_BYTES: usize = 64 * 1024;

/// What the service needs to decide and sign.
pub struct Signer {
    /// The policy every request must pass.
    pub policy: Policy,
    /// CA for kubelet serving certificates.
    pub serving: Authority,
    /// CA for kubelet client certificates.
    pub client: Authority,
    /// Longest validity of an issued certificate.
    pub max_validity: Duration,
    /// The cluster's node-token key: a request's token must be its node's under this key.
    pub token_key: Vec<u8>,
    /// Which nodes have certificates; who may ask for more.
    pub enrolment: Enrolment,
    /// Refusals logged at most a few every 10 s: any peer can cause them.
    pub refusals: LogLimit,
}

impl Signer {
    /// Checks and signs one request, logging the decision. `token` is the bearer token the
    /// request carried; it must be `node`'s (review H3).
    pub fn sign(
        &self,
        token: &[u8],
        caller: &Caller,
        profile: Profile,
        node: &str,
        csr_pem: &str,
        peer: &str,
    ) -> Result<Issued> {
        let authority = match profile {
            Profile::Serving => &self.serving,
            Profile::Client => &self.client,
        };
        let result = self.authenticate(token, node).and_then(|()| self.policy.check(profile, node, csr_pem));
        let result = result.and_then(|approved| {
            let issued = self
                .enrolment
                .admit(caller, profile, node, || authority.issue(&approved, self.max_validity))?;
            let sans: Vec<String> = approved.sans.iter().map(ToString::to_string).collect();
            info!(
                node, %profile, peer, sans = %sans.join(","), serial = %issued.serial,
                not_after = %humantime(issued.not_after), verdict = "issued", "certificate issued"
            );
            Ok(issued)
        });
        if let Err(err) = &result
            && let Some(dropped) = self.refusals.admit()
        {
            if let Some(summary) = self.refusals.summary(dropped) {
                warn!(dropped, verdict = "denied", "{summary}");
            }
            let verdict = match err {
                crate::Error::WrongToken | crate::Error::MissingToken => "unauthenticated",
                _ => "denied",
            };
            warn!(node, %profile, peer, verdict, reason = %err, "request refused");
        }
        result
    }

    /// Whether `token` is `node`'s token: a leaked token is good for its own node only.
    fn authenticate(&self, token: &[u8], node: &str) -> Result<()> {
        if hpk_rpc::node_token::matches(&self.token_key, node, token) {
            Ok(())
        } else {
            Err(crate::Error::WrongToken)
        }
    }
}

/// The gRPC face of a [`Signer`].
#[derive(Clone)]
pub struct Service(pub Arc<Signer>);

impl Service {
    fn handle(
        &self,
        profile: Profile,
        request: Request<SignRequest>,
    ) -> Result<Response<SignResponse>, Status> {
        let peer = request.remote_addr().map(|a| a.to_string()).unwrap_or_default();
        // The TLS handshake verified any client certificate against the client CA.
        let caller = request
            .peer_certs()
            .and_then(|certs| certs.first().map(|der| Caller::from_certificate(der)))
            .unwrap_or(Caller::Token);
        let token = crate::token::presented(request.metadata())?.to_vec();
        let SignRequest { node_name, csr_pem } = request.into_inner();
        let issued = self.0.sign(&token, &caller, profile, &node_name, &csr_pem, &peer)?;
        Ok(Response::new(SignResponse {
            certificate_chain_pem: issued.chain_pem,
            ca_pem: issued.ca_pem,
            serial: issued.serial,
            not_before_unix: unix(issued.not_before),
            not_after_unix: unix(issued.not_after),
        }))
    }
}

#[tonic::async_trait]
impl CertSigner for Service {
    async fn sign_kubelet_serving_certificate(
        &self,
        request: Request<SignRequest>,
    ) -> Result<Response<SignResponse>, Status> {
        self.handle(Profile::Serving, request)
    }

    async fn sign_kubelet_client_certificate(
        &self,
        request: Request<SignRequest>,
    ) -> Result<Response<SignResponse>, Status> {
        self.handle(Profile::Client, request)
    }
}

fn unix(t: std::time::SystemTime) -> i64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

fn humantime(t: std::time::SystemTime) -> String {
    time::OffsetDateTime::from(t)
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| "?".into())
}
