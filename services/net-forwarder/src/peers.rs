//! The other nodes of the cluster, as the tunnel sees them: a pod CIDR, the UDP endpoint their
//! traffic goes to and comes from, and the public key of their tunnel identity. Where the list comes from (the Kubernetes API, or `--peer` flags) is
//! not this module's business; it only says what a valid peer is.

use std::fmt;
use std::net::{Ipv4Addr, SocketAddrV4};

use crate::cidr::PodCidr;
use crate::tunnel::identity::PublicKey;
use crate::{Error, Result};

/// The Node annotation in which each net-forwarder publishes its tunnel endpoint
/// (`<host IPv4>:<UDP port>`).
pub const ENDPOINT_ANNOTATION: &str = "net.hpk.io/tunnel-endpoint";
/// The Node annotation in which each net-forwarder publishes its run's X25519 public key (64
/// lowercase hexadecimal digits), with the endpoint, in one patch.
pub const PUBLIC_KEY_ANNOTATION: &str = "net.hpk.io/tunnel-public-key";

/// Another node: its pod CIDR is routed into the tunnel towards `endpoint`, and what comes from
/// `endpoint` sealed by `public_key`'s owner, from that CIDR, is its.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    /// The Node's name (or the `--peer` flag's label).
    pub node: String,
    /// The Node's `spec.podCIDR`.
    pub pod_cidr: PodCidr,
    /// The host address and UDP port of its tunnel endpoint.
    pub endpoint: SocketAddrV4,
    /// The public key of its tunnel identity.
    pub public_key: PublicKey,
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let key = self.public_key.to_string();
        write!(f, "{} ({} via {}, key {}…)", self.node, self.pod_cidr, self.endpoint, &key[..8])
    }
}

/// Parses an endpoint as published in [`ENDPOINT_ANNOTATION`]: an IPv4 unicast address and a
/// non-zero port.
pub fn parse_endpoint(text: &str) -> Result<SocketAddrV4> {
    let bad = |why: &str| Error::InvalidArgument(format!("tunnel endpoint {text:?}: {why}"));
    let addr: SocketAddrV4 = text.trim().parse().map_err(|_| bad("expected <IPv4 address>:<port>"))?;
    let ip = *addr.ip();
    if addr.port() == 0 {
        return Err(bad("port 0"));
    }
    if ip.is_unspecified() || ip.is_multicast() || ip.is_broadcast() {
        return Err(bad("not a unicast address"));
    }
    Ok(addr)
}

/// A `--peer` flag: `NAME=CIDR@ADDRESS:PORT/PUBLIC-KEY`.
pub fn parse_flag(text: &str) -> Result<Peer> {
    let bad =
        || Error::InvalidArgument(format!("--peer {text:?}: expected NAME=CIDR@ADDRESS:PORT/PUBLIC-KEY"));
    let (node, rest) = text.split_once('=').ok_or_else(bad)?;
    let (cidr, rest) = rest.split_once('@').ok_or_else(bad)?;
    let (endpoint, key) = rest.split_once('/').ok_or_else(bad)?;
    if node.is_empty() {
        return Err(bad());
    }
    let flag = |e: &dyn fmt::Display| Error::InvalidArgument(format!("--peer {text:?}: {e}"));
    let pod_cidr = cidr.parse::<PodCidr>().map_err(|e| flag(&e))?;
    let endpoint = parse_endpoint(endpoint).map_err(|e| flag(&e))?;
    let public_key = PublicKey::parse(key).map_err(|e| flag(&e))?;
    Ok(Peer { node: node.to_owned(), pod_cidr, endpoint, public_key })
}

/// Checks a set of peers against the node's own pod CIDR: no overlaps, one entry per node, per
/// endpoint and per public key (the receiver tells senders apart by both).
/// Returns the peers that can be routed and, for each one refused, why.
pub fn validate(own: PodCidr, peers: Vec<Peer>) -> (Vec<Peer>, Vec<(Peer, String)>) {
    let mut good: Vec<Peer> = Vec::new();
    let mut refused = Vec::new();
    for peer in peers {
        if peer.pod_cidr.overlaps(&own) {
            let why = format!("its pod CIDR {} overlaps this node's {own}", peer.pod_cidr);
            refused.push((peer, why));
        } else if let Some(other) = good.iter().find(|g| {
            g.pod_cidr.overlaps(&peer.pod_cidr)
                || g.node == peer.node
                || g.endpoint == peer.endpoint
                || g.public_key.key_id() == peer.public_key.key_id()
        }) {
            let why = format!("it collides with {other}");
            refused.push((peer, why));
        } else {
            good.push(peer);
        }
    }
    good.sort_by(|a, b| a.node.cmp(&b.node));
    (good, refused)
}

/// The peer whose pod CIDR holds `addr`.
pub fn route(peers: &[Peer], addr: Ipv4Addr) -> Option<&Peer> {
    peers.iter().find(|p| p.pod_cidr.contains(addr))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A valid public key, different for every `seed`.
    pub(crate) fn key(seed: u8) -> PublicKey {
        crate::tunnel::identity::Identity::from_secret([seed; 32]).public()
    }

    fn peer(node: &str, cidr: &str, ep: &str) -> Peer {
        let seed = node.bytes().fold(ep.len() as u8, |a, b| a.wrapping_mul(31).wrapping_add(b));
        Peer {
            node: node.into(),
            pod_cidr: cidr.parse().unwrap(),
            endpoint: ep.parse().unwrap(),
            public_key: key(seed),
        }
    }

    #[test]
    fn endpoints() {
        assert_eq!(parse_endpoint("10.250.0.2:40000").unwrap(), "10.250.0.2:40000".parse().unwrap());
        for bad in [
            "",
            "10.250.0.2",
            "10.250.0.2:0",
            "0.0.0.0:5",
            "224.0.0.1:5",
            "[::1]:5",
            "host:5",
            "1.2.3.4:70000",
        ] {
            let e = parse_endpoint(bad).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument(_)), "{bad:?}: {e}");
        }
    }

    #[test]
    fn flags() {
        let k = key(9);
        let mut want = peer("b", "10.244.2.0/24", "10.250.0.3:4000");
        want.public_key = k;
        assert_eq!(parse_flag(&format!("b=10.244.2.0/24@10.250.0.3:4000/{k}")).unwrap(), want);
        for bad in [
            "b".to_owned(),
            "b=10.244.2.0/24".to_owned(),
            "b=10.244.2.0/24@10.250.0.3:4000".to_owned(),
            format!("=10.244.2.0/24@1.2.3.4:5/{k}"),
            format!("b=10.244.2.1/24@1.2.3.4:5/{k}"),
            format!("b=10.244.2.0/24@x/{k}"),
            "b=10.244.2.0/24@1.2.3.4:5/".to_owned(),
            format!("b=10.244.2.0/24@1.2.3.4:5/{}", k.to_string().to_uppercase()),
            format!("b=10.244.2.0/24@1.2.3.4:5/{k}00"),
            format!("b=10.244.2.0/24@1.2.3.4:5/{}", "00".repeat(32)),
        ] {
            let e = parse_flag(&bad).expect_err(&bad).to_string();
            assert!(e.starts_with(&format!("--peer {bad:?}")), "{e}");
        }
        let e = parse_flag("b=10.244.2.0/24@10.250.0.3:4000").unwrap_err().to_string();
        assert!(e.contains("NAME=CIDR@ADDRESS:PORT/PUBLIC-KEY"), "{e}");
        let e =
            parse_flag(&format!("b=10.244.2.0/24@1.2.3.4:5/{}", "00".repeat(32))).unwrap_err().to_string();
        assert!(e.contains("low-order"), "{e}");
    }

    #[test]
    fn validation_refuses_shared_endpoints_and_keys() {
        let own: PodCidr = "10.244.1.0/24".parse().unwrap();
        let b = peer("b", "10.244.2.0/24", "1.1.1.2:1");
        let same_endpoint = peer("c", "10.244.3.0/24", "1.1.1.2:1");
        let same_key = Peer { public_key: b.public_key, ..peer("d", "10.244.4.0/24", "1.1.1.4:1") };
        let (good, refused) = validate(own, vec![b, same_endpoint, same_key]);
        assert_eq!(good.iter().map(|p| p.node.as_str()).collect::<Vec<_>>(), ["b"]);
        assert_eq!(refused.iter().map(|(p, _)| p.node.as_str()).collect::<Vec<_>>(), ["c", "d"]);
    }

    #[test]
    fn validation_refuses_overlaps_and_duplicates() {
        let own: PodCidr = "10.244.1.0/24".parse().unwrap();
        let (good, refused) = validate(
            own,
            vec![
                peer("c", "10.244.3.0/24", "1.1.1.3:1"),
                peer("self", "10.244.0.0/16", "1.1.1.9:1"),
                peer("b", "10.244.2.0/24", "1.1.1.2:1"),
                peer("b2", "10.244.2.0/25", "1.1.1.4:1"),
                peer("c", "10.244.4.0/24", "1.1.1.5:1"),
            ],
        );
        assert_eq!(good.iter().map(|p| p.node.as_str()).collect::<Vec<_>>(), ["b", "c"]);
        let names: Vec<&str> = refused.iter().map(|(p, _)| p.node.as_str()).collect();
        assert_eq!(names, ["self", "b2", "c"]);
        assert_eq!(route(&good, "10.244.3.77".parse().unwrap()).unwrap().node, "c");
        assert!(route(&good, "10.244.1.5".parse().unwrap()).is_none());
    }
}
