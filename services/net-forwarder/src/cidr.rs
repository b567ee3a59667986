//! The node's pod CIDR and which of its addresses pods may get; [`CidrIndex`], which network of
//! many holds an address.

use std::collections::HashMap;
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

/// Which of a list of networks holds an address, in one hash lookup per prefix length in use
/// (one, /24, in a cluster) instead of a comparison with every network: the tunnel's sending
/// thread finds each packet's peer with it, so its cost per packet does not grow with the nodes.
#[derive(Debug, Clone, Default)]
pub struct CidrIndex {
    /// Per prefix length, longest first: network address → position in the list.
    by_prefix: Vec<(u8, HashMap<u32, usize>)>,
}

impl CidrIndex {
    /// The index of `networks`, in their order. Of networks that overlap (the peers' are checked
    /// not to), the longest prefix wins, and of equal ones the first.
    pub fn new<'a>(networks: impl IntoIterator<Item = &'a PodCidr>) -> Self {
        let mut by_prefix: Vec<(u8, HashMap<u32, usize>)> = Vec::new();
        for (i, cidr) in networks.into_iter().enumerate() {
            let map = match by_prefix.iter().position(|(p, _)| *p == cidr.prefix) {
                Some(at) => &mut by_prefix[at].1,
                None => {
                    by_prefix.push((cidr.prefix, HashMap::new()));
                    &mut by_prefix.last_mut().expect("just pushed").1
                }
            };
            map.entry(cidr.network).or_insert(i);
        }
        by_prefix.sort_by_key(|(prefix, _)| std::cmp::Reverse(*prefix));
        Self { by_prefix }
    }

    /// The position of the network that holds `addr`, if one does.
    pub fn find(&self, addr: Ipv4Addr) -> Option<usize> {
        let addr = u32::from(addr);
        self.by_prefix
            .iter()
            .find_map(|(prefix, map)| map.get(&(addr & (u32::MAX << (32 - u32::from(*prefix))))).copied())
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
    fn the_index_finds_what_a_scan_finds() {
        // A thousand nodes' /24s, and a /16 and a /28 elsewhere.
        let mut networks: Vec<PodCidr> = (0..1000u32)
            .map(|i| format!("10.{}.{}.0/24", 244 + i / 256, i % 256).parse().expect("valid"))
            .collect();
        networks.push("172.16.0.0/16".parse().expect("valid"));
        networks.push("192.168.9.16/28".parse().expect("valid"));
        let index = CidrIndex::new(&networks);
        let scan = |a: Ipv4Addr| networks.iter().position(|c| c.contains(a));
        let mut probes = vec![
            Ipv4Addr::new(10, 244, 0, 7),
            Ipv4Addr::new(10, 247, 231, 254),
            Ipv4Addr::new(10, 247, 232, 1), // the 1,001st /24: no node has it
            Ipv4Addr::new(172, 16, 200, 3),
            Ipv4Addr::new(192, 168, 9, 17),
            Ipv4Addr::new(192, 168, 9, 32),
            Ipv4Addr::new(8, 8, 8, 8),
        ];
        probes.extend((0..5000u32).map(|i| Ipv4Addr::from(0x0af4_0000 + i * 53)));
        for a in probes {
            assert_eq!(index.find(a), scan(a), "{a}");
        }
        assert_eq!(index.find(Ipv4Addr::new(10, 244, 3, 9)), Some(3));
        assert_eq!(CidrIndex::new(&[]).find(Ipv4Addr::new(10, 244, 0, 1)), None);
        // Overlapping (never so among peers): the longer prefix, then the first.
        let a: PodCidr = "10.0.0.0/8".parse().expect("valid");
        let b: PodCidr = "10.1.0.0/16".parse().expect("valid");
        assert_eq!(CidrIndex::new(&[a, b, b]).find(Ipv4Addr::new(10, 1, 2, 3)), Some(1));
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
