//! Command-line and environment configuration of the signer and its client.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

pub use hpk_rpc::flags::parse_duration;

use crate::Profile;
use crate::policy::San;

/// `hpk-cert-signer serve`: run the controller's signer.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Address to listen on with TLS; port 0 picks a free port (see --address-file).
    #[arg(long, env = "HPK_CERT_SIGNER_LISTEN", default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// Write the URL clients should use (`https://HOST:PORT`) to this file once listening.
    #[arg(long, env = "HPK_CERT_SIGNER_ADDRESS_FILE")]
    pub address_file: Option<PathBuf>,
    /// Host to put in the address file and in the signer's certificate, when --listen is a
    /// wildcard address or clients use another name.
    #[arg(long, env = "HPK_CERT_SIGNER_ADVERTISE")]
    pub advertise: Option<String>,
    /// The signer's own TLS certificate chain (PEM), from a CA clients pin that issues no
    /// kubelet certificate (HPK: the server CA). Without it, the serving CA signs one.
    #[arg(long, env = "HPK_CERT_SIGNER_TLS_CERT", requires = "tls_private_key_file")]
    pub tls_cert_file: Option<PathBuf>,
    /// The key of --tls-cert-file; must be 0600 and off the shared filesystem.
    #[arg(long, env = "HPK_CERT_SIGNER_TLS_KEY", requires = "tls_cert_file")]
    pub tls_private_key_file: Option<PathBuf>,
    /// CA certificate the API server uses to verify kubelets (HPK: the kubelet CA). Without
    /// --tls-cert-file it also signs the signer's own TLS certificate.
    #[arg(long, env = "HPK_SERVING_CA_CERT")]
    pub serving_ca_cert: PathBuf,
    /// Private key of the serving CA; must be 0600 and off the shared filesystem.
    #[arg(long, env = "HPK_SERVING_CA_KEY")]
    pub serving_ca_key: PathBuf,
    /// The API server's client CA (K3s: client-ca.crt), for kubelet client certificates.
    #[arg(long, env = "HPK_CLIENT_CA_CERT")]
    pub client_ca_cert: PathBuf,
    /// Private key of the client CA; must be 0600 and off the shared filesystem.
    #[arg(long, env = "HPK_CLIENT_CA_KEY")]
    pub client_ca_key: PathBuf,
    /// File holding the cluster's node-token key (0600, node-local). A node's token is the
    /// HMAC-SHA256 of its name under this key (`hpk-cert-signer node-token` makes one), so a
    /// token obtains certificates for its own node only.
    #[arg(long, env = "HPK_NODE_TOKEN_KEY_FILE")]
    pub token_key_file: PathBuf,
    /// The shared directory (NFS home) CA keys must never lie under [default: $HOME/.hpk].
    #[arg(long, env = "HPK_SHARED_DIR")]
    pub shared_dir: Option<PathBuf>,
    /// Longest validity of an issued certificate, e.g. 7d, 12h, 30s.
    #[arg(long, env = "HPK_CERT_MAX_VALIDITY", default_value = "7d", value_parser = parse_duration)]
    pub max_validity: Duration,
    /// Where to keep the record of enrolled nodes (0600, node-local), so that a restarted
    /// signer still refuses the token a second certificate for a node [default: memory only].
    #[arg(long, env = "HPK_CERT_SIGNER_ENROLLED_FILE")]
    pub enrolled_file: Option<PathBuf>,
    /// The cluster's DNS domain; kubernetes.default.svc.<domain> is never issued to a node.
    #[arg(long, env = "HPK_CLUSTER_DOMAIN", default_value = "cluster.local")]
    pub cluster_domain: String,
    /// Further names or addresses of the API server (its service IP, public names) that no node
    /// certificate may carry. Repeatable.
    #[arg(long = "apiserver-san", env = "HPK_APISERVER_SANS", value_delimiter = ',')]
    pub apiserver_sans: Vec<San>,
}

/// `hpk-cert-signer request`: get (and optionally keep renewing) a kubelet certificate.
#[derive(Debug, Clone, clap::Args)]
pub struct RequestArgs {
    /// The signer's URL, `https://HOST:PORT`.
    #[arg(long, env = "HPK_CERT_SIGNER_URL", required_unless_present = "server_file")]
    pub server: Option<String>,
    /// Read the signer's URL from this file (the signer's --address-file).
    #[arg(long, env = "HPK_CERT_SIGNER_ADDRESS_FILE", conflicts_with = "server")]
    pub server_file: Option<PathBuf>,
    /// The CA certificate to pin for the signer's TLS (the serving CA).
    #[arg(long, env = "HPK_SIGNER_CA_CERT")]
    pub ca_cert: PathBuf,
    /// Name to check in the signer's certificate, if not the host of the URL.
    #[arg(long, env = "HPK_CERT_SIGNER_SERVER_NAME")]
    pub server_name: Option<String>,
    /// File holding this node's token (0600): good for --node-name only.
    #[arg(long, env = "HPK_NODE_TOKEN_FILE")]
    pub token_file: PathBuf,
    /// The node the certificate is for.
    #[arg(long, env = "HPK_NODE_NAME")]
    pub node_name: String,
    /// Which certificate: the kubelet API's serving certificate or the node's client identity.
    #[arg(long, value_enum, default_value_t = Profile::Serving)]
    pub profile: Profile,
    /// An IP address or DNS name of the node (serving certificates). Repeatable.
    #[arg(long = "san", value_delimiter = ',')]
    pub sans: Vec<San>,
    /// Where to write the certificate chain (PEM, 0644).
    #[arg(long)]
    pub cert_out: PathBuf,
    /// Where to write the private key (PEM, 0600); never under the shared directory.
    #[arg(long)]
    pub key_out: PathBuf,
    /// The shared directory the key must not be written under [default: $HOME/.hpk].
    #[arg(long, env = "HPK_SHARED_DIR")]
    pub shared_dir: Option<PathBuf>,
    /// The node's current client certificate (PEM), presented to the signer: needed for a
    /// node that already has a certificate of this profile. Used only if it exists.
    #[arg(long, requires = "client_key")]
    pub client_cert: Option<PathBuf>,
    /// The key of --client-cert.
    #[arg(long, requires = "client_cert")]
    pub client_key: Option<PathBuf>,
    /// Keep running and renew the certificate at two thirds of its lifetime.
    #[arg(long)]
    pub renew: bool,
}

/// `hpk-cert-signer node-token`: make a node's token from the cluster's key.
#[derive(Debug, Clone, clap::Args)]
pub struct NodeTokenArgs {
    /// File holding the cluster's node-token key (0600), as given to `serve --token-key-file`.
    #[arg(long, env = "HPK_NODE_TOKEN_KEY_FILE")]
    pub key_file: PathBuf,
    /// The node the token is for.
    #[arg(long, env = "HPK_NODE_NAME")]
    pub node_name: String,
    /// Where to write the token (created 0600; never under the shared directory) [default:
    /// standard output].
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// The shared directory the token must not be written under [default: $HOME/.hpk].
    #[arg(long, env = "HPK_SHARED_DIR")]
    pub shared_dir: Option<PathBuf>,
}
