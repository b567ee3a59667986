//! A cluster's certificates, laid out much as K3s does: a server CA (the API server's and the
//! cert-signer's serving certificates only), a kubelet CA (kubelet serving certificates, which
//! the API server verifies kubelets with: no node certificate can pass as the API server,
//! review H3), a client CA (every client identity), a request-header CA for the aggregation
//! layer, and a service-account key pair. Every certificate is valid from an hour before it is
//! made until a day after the cluster's lifetime ends (review L1). Used by the controller bubble.

use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

use crate::error::{Error, Result};

/// A certificate and its key on disk.
#[derive(Clone, Debug)]
pub struct CertFiles {
    /// PEM certificate.
    pub cert: PathBuf,
    /// PEM private key (0600).
    pub key: PathBuf,
}

/// A CA that can sign more certificates.
struct Ca {
    issuer: Issuer<'static, KeyPair>,
    files: CertFiles,
    validity: Validity,
}

/// From an hour ago (clocks of a cluster's nodes differ a little) to a day past the cluster's end.
#[derive(Clone, Copy, Debug)]
pub struct Validity {
    /// Start.
    pub not_before: time::OffsetDateTime,
    /// End.
    pub not_after: time::OffsetDateTime,
}

impl Validity {
    /// For a cluster that lives `lifetime` from now.
    pub fn for_lifetime(lifetime: Duration) -> Self {
        let now = time::OffsetDateTime::now_utc();
        let margin = Duration::from_secs(86_400);
        Self { not_before: now - Duration::from_secs(3600), not_after: now + lifetime + margin }
    }
}

/// The cluster PKI, written under one directory.
pub struct ClusterPki {
    dir: PathBuf,
    server_ca: Ca,
    kubelet_ca: Ca,
    client_ca: Ca,
    /// The API server's serving certificate.
    pub apiserver: CertFiles,
    /// The cert-signer's serving certificate, from the server CA like the API server's: nodes
    /// pin the server CA for it, and no kubelet certificate can pass for it.
    pub cert_signer: CertFiles,
    /// The API server's client certificate toward kubelets.
    pub apiserver_kubelet_client: CertFiles,
    /// etcd's CA: it verifies etcd's clients and peers, and issues nothing else (review M1).
    pub etcd_ca: CertFiles,
    /// etcd's serving (and peer) certificate, for 127.0.0.1.
    pub etcd_server: CertFiles,
    /// The API server's client certificate toward etcd, the only client etcd accepts.
    pub apiserver_etcd_client: CertFiles,
    /// The CA extension API servers (metrics-server) trust for the API server's proxied
    /// requests (K3s `request-header-ca`).
    pub request_header_ca: CertFiles,
    /// The API server's client certificate toward extension API servers (`front-proxy-client`).
    pub front_proxy_client: CertFiles,
    /// Service-account token signing key (ECDSA P-256) and its public half.
    pub service_account_key: PathBuf,
    /// Public key verifying service-account tokens.
    pub service_account_pub: PathBuf,
}

impl ClusterPki {
    /// Generates the PKI in `dir`; the API server's certificate names `apiserver_ips` plus the
    /// in-cluster names and `service_ip`.
    /// The CAs' common names start with `prefix` (e.g. `hpk-test`).
    /// Every certificate is valid for `validity`; the cert-signer's names `apiserver_ips`.
    pub fn generate(
        dir: &Path,
        prefix: &str,
        apiserver_ips: &[IpAddr],
        service_ip: IpAddr,
        validity: Validity,
    ) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io("create", dir.display(), e))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| Error::io("chmod", dir.display(), e))?;
        let server_ca = Ca::new(dir, "server-ca", &format!("{prefix}-server-ca"), validity)?;
        let kubelet_ca = Ca::new(dir, "kubelet-ca", &format!("{prefix}-kubelet-ca"), validity)?;
        let client_ca = Ca::new(dir, "client-ca", &format!("{prefix}-client-ca"), validity)?;
        let mut sans: Vec<SanType> = [
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
            "localhost",
        ]
        .iter()
        .map(|name| Ok(SanType::DnsName((*name).try_into()?)))
        .collect::<Result<_, rcgen::Error>>()?;
        sans.extend(
            apiserver_ips
                .iter()
                .copied()
                .chain([service_ip, "127.0.0.1".parse().expect("literal")])
                .map(SanType::IpAddress),
        );
        let apiserver = server_ca.sign(
            dir,
            "apiserver",
            "kube-apiserver",
            &[],
            sans,
            &[ExtendedKeyUsagePurpose::ServerAuth],
        )?;
        let cert_signer = server_ca.sign(
            dir,
            "cert-signer",
            "hpk-cert-signer",
            &[],
            apiserver_ips.iter().copied().map(SanType::IpAddress).collect(),
            &[ExtendedKeyUsagePurpose::ServerAuth],
        )?;
        let apiserver_kubelet_client = client_ca.sign(
            dir,
            "apiserver-kubelet-client",
            "kube-apiserver-kubelet-client",
            &["system:masters"],
            vec![],
            &[ExtendedKeyUsagePurpose::ClientAuth],
        )?;
        let etcd_ca = Ca::new(dir, "etcd-ca", &format!("{prefix}-etcd-ca"), validity)?;
        let etcd_server = etcd_ca.sign(
            dir,
            "etcd-server",
            "etcd",
            &[],
            vec![SanType::IpAddress("127.0.0.1".parse().expect("literal"))],
            &[ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth],
        )?;
        let apiserver_etcd_client = etcd_ca.sign(
            dir,
            "apiserver-etcd-client",
            "kube-apiserver-etcd-client",
            &[],
            vec![],
            &[ExtendedKeyUsagePurpose::ClientAuth],
        )?;
        let request_header =
            Ca::new(dir, "request-header-ca", &format!("{prefix}-request-header-ca"), validity)?;
        let front_proxy_client = request_header.sign(
            dir,
            "front-proxy-client",
            "front-proxy-client",
            &[],
            vec![],
            &[ExtendedKeyUsagePurpose::ClientAuth],
        )?;
        let sa = KeyPair::generate()?;
        let service_account_key = dir.join("service-account.key");
        let service_account_pub = dir.join("service-account.pub");
        write(&service_account_key, &sa.serialize_pem(), 0o600)?;
        write(&service_account_pub, &sa.public_key_pem(), 0o644)?;
        Ok(Self {
            dir: dir.to_owned(),
            server_ca,
            kubelet_ca,
            client_ca,
            apiserver,
            cert_signer,
            apiserver_kubelet_client,
            etcd_ca: etcd_ca.files,
            etcd_server,
            apiserver_etcd_client,
            request_header_ca: request_header.files,
            front_proxy_client,
            service_account_key,
            service_account_pub,
        })
    }

    /// The server CA (verifies the API server and the cert-signer; K3s `server-ca`).
    pub fn server_ca(&self) -> &CertFiles {
        &self.server_ca.files
    }

    /// The kubelet CA: kubelet serving certificates, from the cert-signer; the API server
    /// verifies kubelets with it.
    pub fn kubelet_ca(&self) -> &CertFiles {
        &self.kubelet_ca.files
    }

    /// The client CA (verifies every client identity; K3s `client-ca`).
    pub fn client_ca(&self) -> &CertFiles {
        &self.client_ca.files
    }

    /// Issues a client certificate `CN=cn, O=orgs` signed by the client CA, stored as `file`.
    pub fn client_cert(&self, file: &str, cn: &str, orgs: &[&str]) -> Result<CertFiles> {
        self.client_ca.sign(&self.dir, file, cn, orgs, vec![], &[ExtendedKeyUsagePurpose::ClientAuth])
    }
}

/// A runtime bubble's own TLS (connector mode): a CA made for it, and the runtime's serving
/// certificate from that CA for `addresses`. Keys 0600 in `dir`, which must be node-local.
/// The kubelet trusts the CA's certificate (`runtime-ca.crt`); returns (CA, serving).
pub fn runtime_tls(
    dir: &Path,
    name: &str,
    addresses: &[IpAddr],
    validity: Validity,
) -> Result<(CertFiles, CertFiles)> {
    let ca = Ca::new(dir, "runtime-ca", &format!("{name}-runtime-ca"), validity)?;
    let sans = addresses.iter().copied().map(SanType::IpAddress).collect();
    let serving = ca.sign(dir, "runtime", name, &[], sans, &[ExtendedKeyUsagePurpose::ServerAuth])?;
    Ok((ca.files, serving))
}

impl Ca {
    fn new(dir: &Path, file: &str, cn: &str, validity: Validity) -> Result<Self> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        params.not_before = validity.not_before;
        params.not_after = validity.not_after;
        params.distinguished_name.push(DnType::CommonName, cn);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let cert = params.self_signed(&key)?;
        let files = CertFiles { cert: dir.join(format!("{file}.crt")), key: dir.join(format!("{file}.key")) };
        write(&files.cert, &cert.pem(), 0o644)?;
        write(&files.key, &key.serialize_pem(), 0o600)?;
        Ok(Self { issuer: Issuer::new(params, key), files, validity })
    }

    fn sign(
        &self,
        dir: &Path,
        file: &str,
        cn: &str,
        orgs: &[&str],
        sans: Vec<SanType>,
        usages: &[ExtendedKeyUsagePurpose],
    ) -> Result<CertFiles> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        params.not_before = self.validity.not_before;
        params.not_after = self.validity.not_after;
        params.distinguished_name.push(DnType::CommonName, cn);
        for org in orgs {
            params.distinguished_name.push(DnType::OrganizationName, *org);
        }
        params.subject_alt_names = sans;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        params.extended_key_usages = usages.to_vec();
        params.use_authority_key_identifier_extension = true;
        let cert = params.signed_by(&key, &self.issuer)?;
        let files = CertFiles { cert: dir.join(format!("{file}.crt")), key: dir.join(format!("{file}.key")) };
        write(&files.cert, &cert.pem(), 0o644)?;
        write(&files.key, &key.serialize_pem(), 0o600)?;
        Ok(files)
    }
}

/// Writes a secret file (0600).
pub fn write_secret(path: &Path, contents: &str) -> Result<()> {
    write(path, contents, 0o600)
}

/// Created with its final mode (never readable by others for a moment, whatever the umask
/// and the directory: review L17) and renamed into place.
fn write(path: &Path, contents: &str, mode: u32) -> Result<()> {
    crate::files::write_file(path, contents.as_bytes(), mode)
}

/// Writes a kubeconfig for `server` trusting `ca`, authenticating with `client` (0600).
pub fn write_kubeconfig(path: &Path, server: &str, ca: &Path, user: &str, client: &CertFiles) -> Result<()> {
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: hpk-test\n  cluster:\n    server: {server}\n    certificate-authority: {ca}\n\
         users:\n- name: {user}\n  user:\n    client-certificate: {cert}\n    client-key: {key}\n\
         contexts:\n- name: hpk-test\n  context:\n    cluster: hpk-test\n    user: {user}\ncurrent-context: hpk-test\n",
        ca = ca.display(),
        cert = client.cert.display(),
        key = client.key.display(),
    );
    write(path, &text, 0o600)
}

/// Writes a self-contained kubeconfig (certificates and key embedded, 0600) for `server`,
/// named `cluster`: the one users copy or point `KUBECONFIG` at.
pub fn write_embedded_kubeconfig(
    path: &Path,
    cluster: &str,
    server: &str,
    ca: &Path,
    user: &str,
    client: &CertFiles,
) -> Result<()> {
    use base64::Engine as _;
    let read = |p: &Path| std::fs::read(p).map_err(|e| Error::io("read", p.display(), e));
    let b64 = |bytes: Vec<u8>| base64::engine::general_purpose::STANDARD.encode(bytes);
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: {cluster}\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\n\
         users:\n- name: {user}\n  user:\n    client-certificate-data: {cert}\n    client-key-data: {key}\n\
         contexts:\n- name: {cluster}\n  context:\n    cluster: {cluster}\n    user: {user}\ncurrent-context: {cluster}\n",
        ca = b64(read(ca)?),
        cert = b64(read(&client.cert)?),
        key = b64(read(&client.key)?),
    );
    write(path, &text, 0o600)
}
