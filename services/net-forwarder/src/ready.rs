//! Whether pod traffic can flow between nodes: the tunnel's device is up, and the kernel has a
//! route into it for every peer's pod CIDR. Checked every [`PERIOD`]; the result is the
//! net-forwarder's gRPC health (NOT_SERVING, with the reason in `Stats.not_ready`), which the
//! pod-runtime reports as CRI `NetworkReady` and the kubelet as the Node's Ready condition.
//! Without a tunnel (one node, or `--pod-cidr` only) there is nothing to check.

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::cidr::PodCidr;
use crate::tunnel::{DEVICE, Tunnel};

/// How often the device and the routes are checked.
pub const PERIOD: Duration = Duration::from_secs(5);

/// `IFF_UP` in a device's `flags`.
const IFF_UP: u32 = 0x1;

/// Keeps `readiness` to what [`check`] finds, until `shutdown`.
pub async fn watch(tunnel: Option<Arc<Tunnel>>, readiness: hpk_rpc::Readiness, shutdown: CancellationToken) {
    let Some(tunnel) = tunnel else { return };
    // A peer is routed into the tunnel's table a moment before its kernel route is made: a
    // problem counts once two checks in a row find it.
    let mut seen_before = false;
    loop {
        let flags = std::fs::read_to_string(format!("/sys/class/net/{DEVICE}/flags")).ok();
        let table = std::fs::read_to_string("/proc/net/route").unwrap_or_default();
        let peers: Vec<(String, PodCidr)> =
            tunnel.routes().into_iter().map(|r| (r.peer.node, r.peer.pod_cidr)).collect();
        match check(flags.as_deref(), &table, &peers) {
            Ok(()) => {
                seen_before = false;
                readiness.set_ready();
            }
            Err(why) if std::mem::replace(&mut seen_before, true) => readiness.set_not_ready(why),
            Err(_) => {}
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(PERIOD) => {}
        }
    }
}

/// `flags`: the device's `/sys/class/net/<dev>/flags` (`None`: no such device); `table`: the
/// text of `/proc/net/route`; `peers`: the node and pod CIDR of each routed peer.
pub fn check(flags: Option<&str>, table: &str, peers: &[(String, PodCidr)]) -> Result<(), String> {
    let Some(flags) = flags else {
        return Err(format!("the tunnel device {DEVICE} is gone"));
    };
    let flags = u32::from_str_radix(flags.trim().trim_start_matches("0x"), 16)
        .map_err(|_| format!("the tunnel device {DEVICE} has unreadable flags {flags:?}"))?;
    if flags & IFF_UP == 0 {
        return Err(format!("the tunnel device {DEVICE} is down"));
    }
    let routes = device_routes(table);
    let missing: Vec<String> = peers
        .iter()
        .filter(|(_, cidr)| !routes.contains(&(cidr.network(), cidr.prefix())))
        .map(|(node, cidr)| format!("{cidr} (node {node})"))
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!("no route into {DEVICE} for {}", missing.join(", ")))
    }
}

/// The (destination, prefix length) of each route through [`DEVICE`] in `/proc/net/route`,
/// where each address is its bytes in memory order read as one hexadecimal number.
fn device_routes(table: &str) -> Vec<(Ipv4Addr, u8)> {
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.first() != Some(&DEVICE) || fields.len() < 8 {
                return None;
            }
            // The kernel prints each address's four bytes, in memory order, as one number.
            let word = |f: &str| u32::from_str_radix(f, 16).ok();
            let destination = Ipv4Addr::from(word(fields[1])?.to_ne_bytes());
            Some((destination, word(fields[7])?.count_ones() as u8))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str =
        "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n";

    fn peers() -> Vec<(String, PodCidr)> {
        vec![
            ("b".into(), "10.244.2.0/24".parse().expect("cidr")),
            ("c".into(), "10.244.3.0/24".parse().expect("cidr")),
        ]
    }

    /// A `/proc/net/route` line for `cidr` through `dev`, as the kernel writes it on this host.
    fn line(dev: &str, cidr: &str) -> String {
        let cidr: PodCidr = cidr.parse().expect("cidr");
        let dest = u32::from_ne_bytes(cidr.network().octets());
        let mask = u32::MAX.checked_shl(32 - u32::from(cidr.prefix())).unwrap_or(0);
        let mask = u32::from_ne_bytes(mask.to_be_bytes());
        format!("{dev}\t{dest:08X}\t00000000\t0001\t0\t0\t0\t{mask:08X}\t0\t0\t0\n")
    }

    #[test]
    fn ready_with_the_device_up_and_a_route_per_peer() {
        let default = "eth0\t00000000\t0202000A\t0003\t0\t0\t0\t00000000\t0\t0\t0\n";
        let table =
            format!("{HEADER}{default}{}{}", line(DEVICE, "10.244.2.0/24"), line(DEVICE, "10.244.3.0/24"));
        assert_eq!(check(Some("0x1003\n"), &table, &peers()), Ok(()));
        assert_eq!(check(Some("0x1003"), HEADER, &[]), Ok(()), "no peers, nothing to route");
    }

    #[test]
    fn each_broken_part_is_named() {
        let table = format!("{HEADER}{}{}", line(DEVICE, "10.244.2.0/24"), line("eth0", "10.244.3.0/24"));
        let why = check(Some("0x1003"), &table, &peers()).expect_err("a route missing");
        assert_eq!(why, format!("no route into {DEVICE} for 10.244.3.0/24 (node c)"));
        let why = check(Some("0x1002"), &table, &peers()).expect_err("down");
        assert!(why.ends_with("is down"), "{why}");
        let why = check(None, &table, &peers()).expect_err("gone");
        assert!(why.ends_with("is gone"), "{why}");
        assert!(check(Some("zz"), &table, &peers()).is_err());
        // A route of another length to the same network is not the peer's.
        let table = format!("{HEADER}{}{}", line(DEVICE, "10.244.2.0/25"), line(DEVICE, "10.244.3.0/24"));
        assert!(check(Some("0x1003"), &table, &peers()).is_err());
    }

    /// A network namespace of the test's own, deleted on drop (a failing assertion too).
    struct Netns(String);

    impl Drop for Netns {
        fn drop(&mut self) {
            let _ = std::process::Command::new("ip").args(["netns", "delete", &self.0]).output();
        }
    }

    /// The kernel's own table: a route made in a network namespace of the test's own reads
    /// back as made.
    #[test]
    fn reads_the_kernels_own_table() {
        let ip = |args: &[&str]| {
            std::process::Command::new("ip").args(args).output().is_ok_and(|o| o.status.success())
        };
        let name = format!("hpkt-ready-{}", std::process::id());
        if !ip(&["netns", "add", &name]) {
            hpk_test_support::skip("cannot create a network namespace (not root?)");
            return;
        }
        let ns = Netns(name);
        let run = |args: &[&str]| {
            let mut all = vec!["netns", "exec", ns.0.as_str(), "ip"];
            all.extend_from_slice(args);
            assert!(ip(&all), "ip {args:?}");
        };
        run(&["tuntap", "add", "dev", DEVICE, "mode", "tun"]);
        run(&["link", "set", DEVICE, "up"]);
        run(&["route", "add", "10.244.3.0/24", "dev", DEVICE]);
        run(&["route", "add", "172.16.0.0/12", "dev", DEVICE]);
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", &ns.0, "cat", "/proc/net/route"])
            .output()
            .expect("cat");
        let mut routes = device_routes(&String::from_utf8_lossy(&out.stdout));
        routes.sort();
        assert_eq!(routes, [(Ipv4Addr::new(10, 244, 3, 0), 24), (Ipv4Addr::new(172, 16, 0, 0), 12)]);
    }
}
