//! The pod-runtime over CRI v1: one channel on its UNIX socket, cloned by every pod worker; or,
//! in connector mode, one mutual-TLS channel to a runtime on another machine, with
//! `hpk.podruntime.v1.Remote` beside CRI and the streaming sessions over the same port.

mod client;
#[cfg(test)]
pub mod fake;

pub use client::{CriCall, CriClient, CriError, CriEvents, CriFailure, CriFuture};

use std::path::Path;
use std::sync::Arc;

use hpk_proto::podruntime::v1::remote_client::RemoteClient;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use rustls_pki_types::ServerName;
use tonic::transport::Channel;

/// CRI clients for the runtime and image services (the same socket).
#[derive(Clone)]
pub struct Cri {
    /// `RuntimeService`.
    pub runtime: RuntimeServiceClient<Channel>,
    /// `ImageService`.
    pub images: ImageServiceClient<Channel>,
    /// What a runtime on another machine adds; `None` on the UNIX socket.
    pub remote: Option<Remote>,
}

/// The link to a runtime on another machine.
#[derive(Clone)]
pub struct Remote {
    /// `hpk.podruntime.v1.Remote`: files, logs, allocation.
    pub api: RemoteClient<Channel>,
    /// Where streaming sessions go.
    pub stream: StreamLink,
}

/// Opens HTTP/1.1 sessions to the remote runtime's port with the kubelet's client certificate:
/// the path of a streaming URL is requested over one.
#[derive(Clone)]
pub struct StreamLink {
    /// `host:port`.
    pub authority: String,
    server_name: ServerName<'static>,
    tls: Arc<rustls::ClientConfig>,
}

impl StreamLink {
    /// A new TLS session to the runtime.
    pub async fn connect(&self) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
        let tcp = tokio::net::TcpStream::connect(self.authority.as_str()).await?;
        let _ = tcp.set_nodelay(true);
        tokio_rustls::TlsConnector::from(self.tls.clone()).connect(self.server_name.clone(), tcp).await
    }
}

/// The credentials of a remote runtime's link, as PEM.
pub struct RemoteCredentials {
    /// The CA of the runtime's certificate.
    pub ca: Vec<u8>,
    /// The kubelet's client certificate.
    pub cert: Vec<u8>,
    /// Its key.
    pub key: Vec<u8>,
    /// The name the runtime's certificate must carry; the endpoint's host if `None`.
    pub server_name: Option<String>,
}

impl Cri {
    /// Connects to the runtime on `socket`.
    pub async fn connect(socket: &Path) -> Result<Self, hpk_rpc::Error> {
        let channel = hpk_rpc::connect::unix(socket).await?;
        // A pod's spec may carry large env or configs; the runtime refuses what is too big.
        let runtime = RuntimeServiceClient::new(channel.clone()).max_decoding_message_size(16 << 20);
        let images = ImageServiceClient::new(channel).max_decoding_message_size(16 << 20);
        Ok(Self { runtime, images, remote: None })
    }

    /// A channel to the runtime at `endpoint` (`https://HOST:PORT`) with mutual TLS. It
    /// connects on first use and again after the link is lost, so a cut link shows as failing
    /// calls (the node turns NotReady) rather than a dead client.
    pub fn connect_remote(endpoint: &str, creds: &RemoteCredentials) -> Result<Self, hpk_rpc::Error> {
        let uri: http::Uri = endpoint.parse().map_err(|e: http::uri::InvalidUri| {
            hpk_rpc::Error::Endpoint { uri: endpoint.into(), reason: e.to_string() }
        })?;
        let authority = uri.authority().ok_or_else(|| hpk_rpc::Error::Endpoint {
            uri: endpoint.into(),
            reason: "no host:port".into(),
        })?;
        let name =
            creds.server_name.clone().unwrap_or_else(|| authority.host().trim_matches(['[', ']']).to_owned());
        let server_name = ServerName::try_from(name.clone()).map_err(|e| hpk_rpc::Error::Endpoint {
            uri: endpoint.into(),
            reason: format!("server name {name:?}: {e}"),
        })?;
        let channel =
            hpk_rpc::connect::mutual_tls_lazy(endpoint, &creds.ca, &creds.cert, &creds.key, Some(&name))?;
        let tls =
            hpk_rpc::mtls::client_config(&creds.ca, &creds.cert, &creds.key, &[hpk_rpc::mtls::ALPN_HTTP1])?;
        let runtime = RuntimeServiceClient::new(channel.clone()).max_decoding_message_size(16 << 20);
        let images = ImageServiceClient::new(channel.clone()).max_decoding_message_size(16 << 20);
        let api = RemoteClient::new(channel)
            .max_decoding_message_size(16 << 20)
            .max_encoding_message_size(16 << 20);
        let stream = StreamLink { authority: authority.to_string(), server_name, tls };
        Ok(Self { runtime, images, remote: Some(Remote { api, stream }) })
    }
}
