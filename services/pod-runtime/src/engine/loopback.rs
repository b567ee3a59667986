//! Brings up the loopback interface of a sandbox's network namespace from this process: a
//! thread enters the namespace (`setns`) and asks the kernel over rtnetlink to set `lo` up,
//! instead of running `nsenter … ip link set lo up` (two processes per pod start).

use std::fs::File;
use std::io;

use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType};

const RTM_NEWLINK: u16 = 16;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLMSG_ERROR: u16 = 2;
const IFLA_IFNAME: u16 = 3;
const IFF_UP: u32 = 0x1;

/// An RTM_NEWLINK request that sets `IFF_UP` on the interface named `lo` (by name: no index
/// to look up), with an acknowledgement asked for.
fn request(seq: u32) -> Vec<u8> {
    let mut m = Vec::with_capacity(40);
    m.extend_from_slice(&40u32.to_ne_bytes()); // nlmsg_len
    m.extend_from_slice(&RTM_NEWLINK.to_ne_bytes());
    m.extend_from_slice(&(NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes());
    m.extend_from_slice(&seq.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes()); // nlmsg_pid: the kernel fills it in
    // struct ifinfomsg: family AF_UNSPEC, pad, type, index 0 (by name), flags, change.
    m.extend_from_slice(&[0, 0, 0, 0]);
    m.extend_from_slice(&0i32.to_ne_bytes());
    m.extend_from_slice(&IFF_UP.to_ne_bytes());
    m.extend_from_slice(&IFF_UP.to_ne_bytes());
    // IFLA_IFNAME "lo\0", padded to 4 bytes.
    m.extend_from_slice(&7u16.to_ne_bytes());
    m.extend_from_slice(&IFLA_IFNAME.to_ne_bytes());
    m.extend_from_slice(b"lo\0\0");
    m
}

/// The kernel's answer to request `seq`: `Ok` for an acknowledgement, the errno it carries
/// otherwise; anything else is malformed.
fn answer(reply: &[u8], seq: u32) -> io::Result<()> {
    let malformed = || io::Error::other(format!("malformed rtnetlink answer ({} bytes)", reply.len()));
    let field = |at: usize, n: usize| reply.get(at..at + n).ok_or_else(malformed);
    let kind = u16::from_ne_bytes(field(4, 2)?.try_into().map_err(|_| malformed())?);
    let got = u32::from_ne_bytes(field(8, 4)?.try_into().map_err(|_| malformed())?);
    if kind != NLMSG_ERROR || got != seq {
        return Err(malformed());
    }
    match i32::from_ne_bytes(field(16, 4)?.try_into().map_err(|_| malformed())?) {
        0 => Ok(()),
        e => Err(io::Error::from_raw_os_error(-e)),
    }
}

/// Sets `lo` up in the network namespace at `netns` (a `/proc/PID/ns/net`). The calling thread
/// is not moved: a short-lived thread enters the namespace and ends there.
pub fn up(netns: &str) -> io::Result<()> {
    let file = File::open(netns)?;
    std::thread::Builder::new()
        .name("loopback-up".into())
        .spawn(move || {
            nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).map_err(io::Error::from)?;
            let socket = rustix::net::socket_with(
                AddressFamily::NETLINK,
                SocketType::RAW,
                SocketFlags::CLOEXEC,
                None, // NETLINK_ROUTE
            )?;
            // An unconnected netlink socket sends to the kernel.
            rustix::net::send(&socket, &request(1), SendFlags::empty())?;
            let mut reply = [0u8; 512];
            let (n, _) = rustix::net::recv(&socket, &mut reply, RecvFlags::empty())?;
            answer(&reply[..n.min(reply.len())], 1)
        })?
        .join()
        .map_err(|_| io::Error::other("the loopback thread panicked"))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_is_a_well_formed_rtm_newlink() {
        let m = request(7);
        assert_eq!(m.len(), 40);
        assert_eq!(u32::from_ne_bytes(m[0..4].try_into().unwrap()), 40);
        assert_eq!(u16::from_ne_bytes(m[4..6].try_into().unwrap()), RTM_NEWLINK);
        assert_eq!(&m[36..39], b"lo\0");
    }

    #[test]
    fn answers_are_an_acknowledgement_an_errno_or_refused() {
        let ack = |seq: u32, error: i32| {
            let mut a = vec![0u8; 36];
            a[0..4].copy_from_slice(&36u32.to_ne_bytes());
            a[4..6].copy_from_slice(&NLMSG_ERROR.to_ne_bytes());
            a[8..12].copy_from_slice(&seq.to_ne_bytes());
            a[16..20].copy_from_slice(&error.to_ne_bytes());
            a
        };
        assert!(answer(&ack(1, 0), 1).is_ok());
        assert_eq!(answer(&ack(1, -1), 1).unwrap_err().raw_os_error(), Some(1));
        assert!(answer(&ack(2, 0), 1).unwrap_err().to_string().contains("malformed"));
        assert!(answer(&ack(1, 0)[..10], 1).unwrap_err().to_string().contains("malformed"));
        assert!(answer(&[], 1).is_err());
    }

    #[test]
    fn brings_up_lo_in_a_new_network_namespace() {
        // Needs CAP_SYS_ADMIN for a namespace of our own: root, or a user namespace.
        let Ok(child) = std::process::Command::new("unshare").args(["--net", "sleep", "30"]).spawn() else {
            eprintln!("SKIPPED: unshare is not installed");
            return;
        };
        let mut child = child;
        let netns = format!("/proc/{}/ns/net", child.id());
        // Until unshare(2) ran, the path names this process's namespace: wait for a new one.
        let own = std::fs::read_link("/proc/self/ns/net").unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while std::fs::read_link(&netns).ok().is_none_or(|n| n == own) {
            assert!(std::time::Instant::now() < deadline, "unshare --net did not make a namespace");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        // `ip` asks the namespace it runs in (sysfs would show the host's, where /sys was mounted).
        let is_up = || {
            let out = std::process::Command::new("nsenter")
                .arg(format!("--net={netns}"))
                .args(["ip", "-o", "link", "show", "lo"])
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let flags = text.split_once('<').and_then(|(_, r)| r.split_once('>')).map(|(f, _)| f.to_owned());
            flags.unwrap_or_default().split(',').any(|f| f == "UP")
        };
        let result = if nix::unistd::geteuid().is_root() {
            assert!(!is_up(), "lo starts down");
            up(&netns)
        } else {
            Err(io::Error::other("not root"))
        };
        let up_now = is_up();
        let _ = child.kill();
        let _ = child.wait();
        match result {
            Ok(()) => assert!(up_now, "lo is still down"),
            Err(e) => eprintln!("SKIPPED: cannot enter a network namespace here ({e})"),
        }
    }
}
