//! A signing CA loaded from disk, and the certificates it issues.

use std::path::Path;
use std::time::{Duration, SystemTime};

use rcgen::{
    CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SerialNumber,
};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use x509_parser::prelude::FromDer;

use crate::policy::{Approved, San};
use crate::{Error, Profile, Result};

/// How far `notBefore` is set in the past, so a node whose clock lags a little can use the
/// certificate at once.
const BACKDATE: Duration = Duration::from_secs(60);

/// A CA certificate with its private key, able to sign.
pub struct Authority {
    profile: Profile,
    issuer: Issuer<'static, KeyPair>,
    ca_pem: String,
    intermediates_pem: String,
    not_after: SystemTime,
}

/// A certificate the signer issued.
#[derive(Clone, Debug)]
pub struct Issued {
    /// The leaf certificate followed by intermediates, PEM.
    pub chain_pem: String,
    /// The CA certificate, PEM.
    pub ca_pem: String,
    /// Serial number, lowercase hex.
    pub serial: String,
    /// Start of validity.
    pub not_before: SystemTime,
    /// End of validity.
    pub not_after: SystemTime,
}

impl Authority {
    /// Loads the CA for `profile`: `cert_path` holds the CA certificate (optionally followed by
    /// its own chain), `key_path` its private key, which must be 0600 and outside `shared_dir`.
    pub fn load(profile: Profile, cert_path: &Path, key_path: &Path, shared_dir: &Path) -> Result<Self> {
        crate::secrets::ensure_not_shared(key_path, shared_dir)?;
        let key_pem = crate::secrets::read_private(key_path)?;
        let bad_key = |reason: String| Error::BadCa { path: key_path.to_owned(), reason };
        let key_pem = String::from_utf8(key_pem).map_err(|_| bad_key("key is not PEM text".into()))?;
        let key = KeyPair::from_pem(&key_pem).map_err(|e| bad_key(e.to_string()))?;

        let bad_cert = |reason: String| Error::BadCa { path: cert_path.to_owned(), reason };
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert_path)
            .map_err(|e| bad_cert(e.to_string()))?
            .collect::<Result<_, _>>()
            .map_err(|e| bad_cert(e.to_string()))?;
        let ca_der = certs.first().ok_or_else(|| bad_cert("no certificate in the file".into()))?;
        let (_, ca) = x509_parser::certificate::X509Certificate::from_der(ca_der)
            .map_err(|e| bad_cert(e.to_string()))?;
        if !ca.is_ca() {
            return Err(bad_cert("the certificate is not a CA (basicConstraints CA:TRUE missing)".into()));
        }
        if ca.public_key().raw != rcgen::PublicKeyData::subject_public_key_info(&key).as_slice() {
            return Err(bad_key(format!(
                "the key does not belong to the CA certificate {}",
                cert_path.display()
            )));
        }
        let not_after = to_system_time(ca.validity().not_after.timestamp());
        if not_after <= SystemTime::now() {
            return Err(bad_cert("the CA certificate has expired".into()));
        }
        let issuer = Issuer::from_ca_cert_der(ca_der, key).map_err(|e| bad_cert(e.to_string()))?;
        let ca_pem = pem_cert(ca_der);
        let intermediates_pem = certs[1..].iter().map(pem_cert).collect();
        Ok(Self { profile, issuer, ca_pem, intermediates_pem, not_after })
    }

    /// The CA certificate, PEM.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// Issues a certificate for an approved request, valid until at most `now + validity` and
    /// never past the CA's own expiry.
    pub fn issue(&self, approved: &Approved, validity: Duration) -> Result<Issued> {
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, format!("system:node:{}", approved.node));
        dn.push(DnType::OrganizationName, "system:nodes");
        params.distinguished_name = dn;
        params.subject_alt_names =
            approved.sans.iter().map(San::to_rcgen).collect::<hpk_signer_client::Result<_>>()?;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        if approved.rsa {
            params.key_usages.push(KeyUsagePurpose::KeyEncipherment);
        }
        params.extended_key_usages = vec![match self.profile {
            Profile::Serving => ExtendedKeyUsagePurpose::ServerAuth,
            Profile::Client => ExtendedKeyUsagePurpose::ClientAuth,
        }];
        self.sign(params, &approved.public_key, validity)
    }

    /// Issues a serving certificate for a key of the signer's own (its TLS listener).
    pub fn issue_server(
        &self,
        key: &KeyPair,
        name: &str,
        sans: &[San],
        validity: Duration,
    ) -> Result<Issued> {
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, name);
        params.subject_alt_names =
            sans.iter().map(San::to_rcgen).collect::<hpk_signer_client::Result<_>>()?;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.sign(params, key, validity)
    }

    fn sign(
        &self,
        mut params: CertificateParams,
        public_key: &impl rcgen::PublicKeyData,
        validity: Duration,
    ) -> Result<Issued> {
        let now = SystemTime::now();
        if self.not_after <= now {
            return Err(Error::CaExpired { profile: self.profile });
        }
        let not_before = now - BACKDATE;
        let not_after = (now + validity).min(self.not_after);
        params.is_ca = IsCa::ExplicitNoCa;
        params.use_authority_key_identifier_extension = true;
        params.not_before = not_before.into();
        params.not_after = not_after.into();
        let serial = random_serial()?;
        params.serial_number = Some(SerialNumber::from_slice(&serial));
        let cert = params.signed_by(public_key, &self.issuer)?;
        Ok(Issued {
            chain_pem: format!("{}{}", cert.pem(), self.intermediates_pem),
            ca_pem: self.ca_pem.clone(),
            serial: serial.iter().map(|b| format!("{b:02x}")).collect(),
            // X.509 times have whole seconds; report what the certificate says.
            not_before: truncate_to_seconds(not_before),
            not_after: truncate_to_seconds(not_after),
        })
    }
}

/// 16 random bytes (RFC 5280 allows up to 20 octets), so serials never repeat in practice.
fn random_serial() -> Result<[u8; 16]> {
    let mut serial = [0u8; 16];
    getrandom::fill(&mut serial).map_err(|e| Error::Random(e.to_string()))?;
    // First byte in 0x40..=0x7f: positive, and never a leading zero that DER would strip.
    serial[0] = (serial[0] & 0x3f) | 0x40;
    Ok(serial)
}

fn pem_cert(der: &CertificateDer<'_>) -> String {
    pem::encode_config(
        &pem::Pem::new("CERTIFICATE", der.as_ref()),
        pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF),
    )
}

fn to_system_time(unix: i64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(unix).unwrap_or(0))
}

fn truncate_to_seconds(t: SystemTime) -> SystemTime {
    let secs = t.duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
}
