//! The signing policy: what a node may ask for.
//!
//! A request passes only if its CSR parses, its signature verifies with its own key, its subject
//! is exactly the node's identity, every SAN is an IP address or a plain DNS name that is not one
//! of the API server's own names, nor loopback, unspecified or localhost, and it asks for nothing a node certificate must not have (a CA
//! bit, signing other certificates, usages outside the profile, unknown extensions).

use std::collections::BTreeSet;
use std::net::IpAddr;

use hpk_signer_client::san::is_dns_name;
use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::cri_attributes::ParsedCriAttribute;
use x509_parser::extensions::{GeneralName, ParsedExtension, X509Extension};
use x509_parser::oid_registry::{OID_X509_COMMON_NAME, OID_X509_ORGANIZATION_NAME};
use x509_parser::prelude::FromDer;
use x509_parser::public_key::PublicKey;

use crate::{Error, Profile, Result};

/// A subject alternative name (`hpk-signer-client`'s, shared with the nodes).
pub use hpk_signer_client::San;

/// Most SANs one certificate may carry.
pub const MAX_SANS: usize = 16;
/// Smallest RSA key accepted.
const MIN_RSA_BITS: usize = 2048;

/// A request that passed the policy: what will go into the certificate.
#[derive(Debug)]
pub struct Approved {
    /// The node the certificate is for.
    pub node: String,
    /// The requested SANs, deduplicated and sorted.
    pub sans: Vec<San>,
    /// The CSR's public key (DER SubjectPublicKeyInfo).
    pub public_key: rcgen::SubjectPublicKeyInfo,
    /// Whether the key is RSA (it then also gets keyEncipherment).
    pub rsa: bool,
}

/// The names and addresses no node certificate may carry.
#[derive(Clone, Debug)]
pub struct Policy {
    forbidden_names: BTreeSet<String>,
    forbidden_suffix: String,
    forbidden_ips: BTreeSet<IpAddr>,
}

impl Policy {
    /// A policy for a cluster with DNS domain `cluster_domain`; `apiserver_sans` are further
    /// names and addresses of the API server (its service IP, its public names).
    pub fn new(cluster_domain: &str, apiserver_sans: &[San]) -> Self {
        let domain = cluster_domain.trim_matches('.').to_ascii_lowercase();
        let mut forbidden_names: BTreeSet<String> =
            ["kubernetes", "kubernetes.default", "kubernetes.default.svc"].map(String::from).into();
        forbidden_names.insert(format!("kubernetes.default.svc.{domain}"));
        let mut forbidden_ips = BTreeSet::new();
        for san in apiserver_sans {
            match san {
                San::Dns(name) => forbidden_names.insert(name.clone()),
                San::Ip(ip) => forbidden_ips.insert(*ip),
            };
        }
        // Any name under kubernetes.default.svc. is the API server's, whatever the domain.
        Self { forbidden_names, forbidden_suffix: "kubernetes.default.svc.".into(), forbidden_ips }
    }

    /// Checks a request for `node` with the PEM CSR `csr_pem` under `profile`.
    pub fn check(&self, profile: Profile, node: &str, csr_pem: &str) -> Result<Approved> {
        check_node_name(node)?;
        let der = decode_pem(csr_pem)?;
        let (rest, csr) =
            X509CertificationRequest::from_der(&der).map_err(|e| Error::BadCsr(e.to_string()))?;
        if !rest.is_empty() {
            return Err(Error::BadCsr("trailing data after the request".into()));
        }
        let info = &csr.certification_request_info;
        // The key first: ring cannot even verify signatures of keys we refuse (small RSA).
        let rsa = check_key(&info.subject_pki)?;
        csr.verify_signature().map_err(|_| Error::BadCsrSignature)?;
        check_subject(node, info.subject.iter().flat_map(|rdn| rdn.iter()))?;
        let public_key = rcgen::SubjectPublicKeyInfo::from_der(info.subject_pki.raw)
            .map_err(|e| Error::UnsupportedKey(e.to_string()))?;

        let mut sans = BTreeSet::new();
        for attribute in info.iter_attributes() {
            if let ParsedCriAttribute::ExtensionRequest(request) = attribute.parsed_attribute() {
                for ext in &request.extensions {
                    self.check_extension(profile, ext, &mut sans)?;
                }
            }
        }
        if profile == Profile::Client && !sans.is_empty() {
            return Err(Error::ForbiddenSan {
                san: sans.iter().map(San::to_string).collect::<Vec<_>>().join(", "),
                reason: "client certificates carry no SANs",
            });
        }
        if sans.len() > MAX_SANS {
            return Err(Error::TooManySans { count: sans.len(), max: MAX_SANS });
        }
        Ok(Approved { node: node.to_owned(), sans: sans.into_iter().collect(), public_key, rsa })
    }

    fn check_extension(
        &self,
        profile: Profile,
        ext: &X509Extension<'_>,
        sans: &mut BTreeSet<San>,
    ) -> Result<()> {
        match ext.parsed_extension() {
            ParsedExtension::SubjectAlternativeName(san) => {
                for name in &san.general_names {
                    sans.insert(self.check_san(name)?);
                }
            }
            ParsedExtension::BasicConstraints(bc) if bc.ca => return Err(Error::CaRequested),
            ParsedExtension::BasicConstraints(_) => {}
            ParsedExtension::KeyUsage(ku) => {
                if ku.key_cert_sign() || ku.crl_sign() {
                    return Err(Error::CaRequested);
                }
                let extra = ku.non_repudiation()
                    || ku.data_encipherment()
                    || ku.encipher_only()
                    || ku.decipher_only();
                if extra {
                    return Err(Error::UsageNotAllowed {
                        profile,
                        allowed: "digitalSignature, keyEncipherment, keyAgreement",
                        usage: format!("key usage {ku}"),
                    });
                }
            }
            ParsedExtension::ExtendedKeyUsage(eku) => {
                let (wanted, allowed) = match profile {
                    Profile::Serving => (eku.server_auth, "serverAuth"),
                    Profile::Client => (eku.client_auth, "clientAuth"),
                };
                let other = eku.any
                    || eku.code_signing
                    || eku.email_protection
                    || eku.time_stamping
                    || eku.ocsp_signing
                    || !eku.other.is_empty()
                    || (profile == Profile::Serving && eku.client_auth)
                    || (profile == Profile::Client && eku.server_auth);
                if other || !wanted {
                    return Err(Error::UsageNotAllowed { profile, allowed, usage: describe_eku(eku) });
                }
            }
            _ => return Err(Error::ExtensionNotAllowed { oid: ext.oid.to_id_string() }),
        }
        Ok(())
    }

    fn check_san(&self, name: &GeneralName<'_>) -> Result<San> {
        let san = match name {
            GeneralName::DNSName(dns) => dns.parse::<San>()?,
            GeneralName::IPAddress(bytes) => San::Ip(ip_from_bytes(bytes)?),
            other => {
                return Err(Error::ForbiddenSan {
                    san: other.to_string(),
                    reason: "only IP addresses and DNS names are issued",
                });
            }
        };
        // Loopback, the unspecified address and localhost name every host: a certificate for
        // them would pass as any local service, the API server's loopback port first (H3).
        let everyone = match &san {
            San::Dns(dns) => {
                dns == "localhost" || dns.ends_with(".localhost") || dns == "localhost.localdomain"
            }
            San::Ip(ip) => {
                let ip = ip.to_canonical();
                ip.is_loopback() || ip.is_unspecified()
            }
        };
        if everyone {
            return Err(Error::ForbiddenSan {
                san: san.to_string(),
                reason: "loopback, unspecified addresses and localhost name every host",
            });
        }
        let forbidden = match &san {
            San::Dns(dns) => self.forbidden_names.contains(dns) || dns.starts_with(&self.forbidden_suffix),
            San::Ip(ip) => self.forbidden_ips.contains(&ip.to_canonical()) || self.forbidden_ips.contains(ip),
        };
        if forbidden {
            return Err(Error::ForbiddenSan { san: san.to_string(), reason: "it names the API server" });
        }
        Ok(san)
    }
}

fn decode_pem(csr_pem: &str) -> Result<Vec<u8>> {
    let (_, pem) =
        x509_parser::pem::parse_x509_pem(csr_pem.as_bytes()).map_err(|e| Error::BadCsr(e.to_string()))?;
    if pem.label != "CERTIFICATE REQUEST" && pem.label != "NEW CERTIFICATE REQUEST" {
        return Err(Error::BadCsr(format!("PEM block is {:?}, not CERTIFICATE REQUEST", pem.label)));
    }
    Ok(pem.contents)
}

fn check_subject<'a>(
    node: &str,
    attributes: impl Iterator<Item = &'a x509_parser::x509::AttributeTypeAndValue<'a>>,
) -> Result<()> {
    let mut cn = Vec::new();
    let mut org = Vec::new();
    let mut found = Vec::new();
    let mut other = false;
    for attr in attributes {
        let value = attr.as_str().unwrap_or("<not a string>");
        if attr.attr_type() == &OID_X509_COMMON_NAME {
            cn.push(value);
            found.push(format!("CN={value}"));
        } else if attr.attr_type() == &OID_X509_ORGANIZATION_NAME {
            org.push(value);
            found.push(format!("O={value}"));
        } else {
            other = true;
            found.push(format!("{}={value}", attr.attr_type().to_id_string()));
        }
    }
    let expected_cn = format!("system:node:{node}");
    if other || cn != [expected_cn.as_str()] || org != ["system:nodes"] {
        let found = if found.is_empty() { "empty".to_owned() } else { found.join(", ") };
        return Err(Error::SubjectMismatch { node: node.to_owned(), found });
    }
    Ok(())
}

/// Returns whether the key is RSA; refuses small RSA keys and unparseable keys.
fn check_key(spki: &x509_parser::x509::SubjectPublicKeyInfo<'_>) -> Result<bool> {
    match spki.parsed() {
        Ok(PublicKey::RSA(rsa)) if rsa.key_size() < MIN_RSA_BITS => {
            Err(Error::UnsupportedKey(format!("RSA key of {} bits", rsa.key_size())))
        }
        Ok(PublicKey::RSA(_)) => Ok(true),
        Ok(PublicKey::EC(_)) | Ok(PublicKey::Unknown(_)) => Ok(false),
        Ok(_) => {
            Err(Error::UnsupportedKey(format!("key algorithm {}", spki.algorithm.algorithm.to_id_string())))
        }
        Err(e) => Err(Error::UnsupportedKey(e.to_string())),
    }
}

fn ip_from_bytes(bytes: &[u8]) -> Result<IpAddr> {
    match bytes.len() {
        4 => Ok(IpAddr::from(<[u8; 4]>::try_from(bytes).expect("length checked"))),
        16 => Ok(IpAddr::from(<[u8; 16]>::try_from(bytes).expect("length checked"))),
        n => Err(Error::BadCsr(format!("IP address SAN of {n} bytes"))),
    }
}

fn describe_eku(eku: &x509_parser::extensions::ExtendedKeyUsage<'_>) -> String {
    let flags = [
        (eku.any, "any"),
        (eku.server_auth, "serverAuth"),
        (eku.client_auth, "clientAuth"),
        (eku.code_signing, "codeSigning"),
        (eku.email_protection, "emailProtection"),
        (eku.time_stamping, "timeStamping"),
        (eku.ocsp_signing, "OCSPSigning"),
    ];
    let mut names: Vec<String> = flags.iter().filter(|(on, _)| *on).map(|(_, n)| (*n).to_owned()).collect();
    names.extend(eku.other.iter().map(|oid| oid.to_id_string()));
    if names.is_empty() {
        "no extended key usage".into()
    } else {
        format!("extended key usage {}", names.join(", "))
    }
}

/// Validates a node name as a DNS-1123 subdomain, as Kubernetes does for Node names.
pub fn check_node_name(name: &str) -> Result<()> {
    let bad = |reason| Err(Error::BadNodeName { name: name.to_owned(), reason });
    if name.is_empty() {
        return bad("it is empty");
    }
    if name.len() > 253 {
        return bad("it is longer than 253 characters");
    }
    if !is_dns_name(name) {
        return bad("use lowercase letters, digits, '-' and '.', starting and ending with a letter or digit");
    }
    Ok(())
}

#[cfg(test)]
#[path = "policy_tests.rs"]
mod tests;
