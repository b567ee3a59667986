//! Subject alternative names: what a node asks for and what the signer accepts.

use std::fmt;
use std::net::IpAddr;

use crate::{Error, Result};

/// A subject alternative name: an IP address or a plain DNS name, never a wildcard.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum San {
    /// A DNS name, lowercase.
    Dns(String),
    /// An IP address.
    Ip(IpAddr),
}

impl fmt::Display for San {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Dns(name) => write!(f, "DNS:{name}"),
            Self::Ip(ip) => write!(f, "IP:{ip}"),
        }
    }
}

impl San {
    /// The SAN in rcgen's terms, for building a certificate or a CSR.
    pub fn to_rcgen(&self) -> Result<rcgen::SanType> {
        Ok(match self {
            Self::Dns(name) => rcgen::SanType::DnsName(name.as_str().try_into()?),
            Self::Ip(ip) => rcgen::SanType::IpAddress(*ip),
        })
    }
}

impl std::str::FromStr for San {
    type Err = Error;
    /// An IP address literal becomes an IP SAN; anything else must be a DNS name.
    fn from_str(s: &str) -> Result<Self> {
        if let Ok(ip) = s.parse::<IpAddr>() {
            return Ok(Self::Ip(ip));
        }
        let lower = s.to_ascii_lowercase();
        if lower.contains('*') {
            return Err(Error::ForbiddenSan {
                san: format!("DNS:{s}"),
                reason: "wildcards are never issued",
            });
        }
        if !is_dns_name(&lower) {
            return Err(Error::BadDnsName { value: s.to_owned() });
        }
        Ok(Self::Dns(lower))
    }
}

/// A DNS-1123 subdomain: lowercase labels of letters, digits and inner hyphens, 63 characters at
/// most each, 253 in all.
pub fn is_dns_name(name: &str) -> bool {
    name.len() <= 253
        && !name.is_empty()
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_names_and_refusals() {
        assert_eq!("10.0.0.5".parse::<San>().expect("ip"), San::Ip("10.0.0.5".parse().expect("ip")));
        assert_eq!("Node-1.Local".parse::<San>().expect("dns"), San::Dns("node-1.local".into()));
        assert_eq!(San::Dns("n1".into()).to_string(), "DNS:n1");
        assert!(matches!("*.example.com".parse::<San>(), Err(Error::ForbiddenSan { .. })));
        for bad in ["", "-a", "a-", "a..b", "a_b", &"a".repeat(64)] {
            assert!(matches!(bad.parse::<San>(), Err(Error::BadDnsName { .. })), "{bad:?}");
        }
    }
}
