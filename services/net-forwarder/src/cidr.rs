//! The node's pod CIDR and which of its addresses pods may get.

use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;

/// Shortest prefix accepted: a /8 already holds 16 M pods.
const MIN_PREFIX: u8 = 8;
/// Longest prefix accepted: a /30 leaves one address for a pod once the network address, the
/// bubble's own address (the first host) and the broadcast address are reserved.
const MAX_PREFIX: u8 = 30;

/// An IPv4 network such as `10.244.1.0/24`, host bits zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PodCidr {
    network: u32,
    prefix: u8,
}

impl PodCidr {
    /// The network address.
    pub fn network(&self) -> Ipv4Addr {
        Ipv4Addr::from(self.network)
    }

    /// The prefix length.
    pub fn prefix(&self) -> u8 {
        self.prefix
    }

    /// Whether `addr` is in this network.
    pub fn contains(&self, addr: Ipv4Addr) -> bool {
        u32::from(addr) & self.mask() == self.network
    }

    /// Whether the two networks share an address.
    pub fn overlaps(&self, other: &PodCidr) -> bool {
        let mask = self.mask() & other.mask();
        self.network & mask == other.network & mask
    }

    fn mask(&self) -> u32 {
        u32::MAX << (32 - u32::from(self.prefix))
    }

    fn broadcast(&self) -> u32 {
        self.network | (u32::MAX >> self.prefix)
    }

    /// The address reserved for the bubble itself on the pod network: the first host address.
    pub fn bubble_address(&self) -> Ipv4Addr {
        Ipv4Addr::from(self.network + 1)
    }

    /// How many addresses pods may get: all but network, bubble and broadcast.
    pub fn pod_capacity(&self) -> u32 {
        (u32::MAX >> self.prefix) - 2
    }

    /// The `index`-th address pods may get (`index < pod_capacity()`).
    pub fn pod_address(&self, index: u32) -> Option<Ipv4Addr> {
        (index < self.pod_capacity()).then(|| Ipv4Addr::from(self.network + 2 + index))
    }

    /// The index of `addr` among the pod addresses, if it is one.
    pub fn pod_index(&self, addr: Ipv4Addr) -> Option<u32> {
        let a = u32::from(addr);
        (a >= self.network + 2 && a < self.broadcast()).then(|| a - self.network - 2)
    }
}

impl fmt::Display for PodCidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network(), self.prefix)
    }
}

/// Why a pod CIDR was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("pod CIDR {input:?}: {reason}")]
pub struct ParseCidrError {
    input: String,
    reason: String,
}

impl FromStr for PodCidr {
    type Err = ParseCidrError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |reason: String| ParseCidrError { input: s.to_owned(), reason };
        let (addr, prefix) = s.split_once('/').ok_or_else(|| err("expected ADDRESS/PREFIX".into()))?;
        let addr: Ipv4Addr = addr.parse().map_err(|_| err(format!("{addr:?} is not an IPv4 address")))?;
        let prefix: u8 = prefix.parse().map_err(|_| err(format!("{prefix:?} is not a prefix length")))?;
        if !(MIN_PREFIX..=MAX_PREFIX).contains(&prefix) {
            return Err(err(format!("prefix length must be {MIN_PREFIX} to {MAX_PREFIX}")));
        }
        let network = u32::from(addr);
        if network & (u32::MAX >> prefix) != 0 {
            return Err(err("host bits are set (give the network address)".into()));
        }
        Ok(PodCidr { network, prefix })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserves_network_bubble_and_broadcast() {
        let cidr: PodCidr = "10.244.1.0/24".parse().expect("valid");
        assert_eq!(cidr.pod_capacity(), 253);
        assert_eq!(cidr.pod_address(0), Some(Ipv4Addr::new(10, 244, 1, 2)));
        assert_eq!(cidr.pod_address(252), Some(Ipv4Addr::new(10, 244, 1, 254)));
        assert_eq!(cidr.pod_address(253), None);
        assert_eq!(cidr.bubble_address(), Ipv4Addr::new(10, 244, 1, 1));
        for reserved in [[10, 244, 1, 0], [10, 244, 1, 1], [10, 244, 1, 255], [10, 244, 2, 3]] {
            assert_eq!(cidr.pod_index(Ipv4Addr::from(reserved)), None, "{reserved:?}");
        }
        assert_eq!(cidr.pod_index(Ipv4Addr::new(10, 244, 1, 9)), Some(7));
        assert_eq!(cidr.to_string(), "10.244.1.0/24");
    }

    #[test]
    fn smallest_cidr_has_one_pod_address() {
        let cidr: PodCidr = "192.168.7.4/30".parse().expect("valid");
        assert_eq!(cidr.pod_capacity(), 1);
        assert_eq!(cidr.pod_address(0), Some(Ipv4Addr::new(192, 168, 7, 6)));
    }

    #[test]
    fn refuses_malformed_input() {
        for bad in
            ["10.244.1.0", "10.244.1.0/33", "10.244.1.0/31", "10.0.0.0/7", "10.244.1.1/24", "x/24", "::1/64"]
        {
            let e = bad.parse::<PodCidr>().expect_err(bad);
            assert!(e.to_string().contains(bad), "{e}");
        }
    }
}
