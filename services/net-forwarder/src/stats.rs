//! Interface counters, read from `/proc/self/net/dev`.
//!
//! Not `/sys/class/net/*/statistics`: sysfs shows the interfaces of the network namespace of
//! whoever mounted it, and inside the bubble that is the host's, not the bubble's.

use std::collections::HashMap;

use crate::{Error, Result};

/// Counters of one interface as the kernel keeps them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Bytes received.
    pub rx_bytes: u64,
    /// Packets received.
    pub rx_packets: u64,
    /// Receive errors.
    pub rx_errors: u64,
    /// Received packets dropped.
    pub rx_dropped: u64,
    /// Bytes sent.
    pub tx_bytes: u64,
    /// Packets sent.
    pub tx_packets: u64,
    /// Send errors.
    pub tx_errors: u64,
    /// Packets dropped on send.
    pub tx_dropped: u64,
}

/// The counters of every interface in this process's network namespace.
pub fn read() -> Result<HashMap<String, Counters>> {
    let text =
        std::fs::read_to_string("/proc/self/net/dev").map_err(|e| Error::io("read /proc/self/net/dev", e))?;
    Ok(parse(&text))
}

fn parse(text: &str) -> HashMap<String, Counters> {
    text.lines()
        .skip(2)
        .filter_map(|line| {
            let (name, rest) = line.split_once(':')?;
            let f: Vec<u64> = rest.split_whitespace().map(|v| v.parse().unwrap_or(0)).collect();
            if f.len() < 12 {
                return None;
            }
            let c = Counters {
                rx_bytes: f[0],
                rx_packets: f[1],
                rx_errors: f[2],
                rx_dropped: f[3],
                tx_bytes: f[8],
                tx_packets: f[9],
                tx_errors: f[10],
                tx_dropped: f[11],
            };
            Some((name.trim().to_owned(), c))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_net_dev() {
        let text = "Inter-|   Receive                                                |  Transmit\n \
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n    \
 lo:     100       2    0    0    0     0          0         0      100       2    0    0    0     0       0          0\n\
hpkv0123456789a: 5000 40 1 2 0 0 0 0 7000 50 3 4 0 0 0 0\n";
        let stats = parse(text);
        assert_eq!(stats["lo"].rx_bytes, 100);
        let v = stats["hpkv0123456789a"];
        assert_eq!(
            v,
            Counters {
                rx_bytes: 5000,
                rx_packets: 40,
                rx_errors: 1,
                rx_dropped: 2,
                tx_bytes: 7000,
                tx_packets: 50,
                tx_errors: 3,
                tx_dropped: 4
            }
        );
    }

    #[test]
    fn reads_own_namespace() {
        assert!(read().expect("read").contains_key("lo"));
    }
}
