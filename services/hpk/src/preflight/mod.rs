//! What a bubble needs from the machine, checked before anything is started, each refusal
//! naming its fix: the TUN device, user namespaces (Ubuntu's AppArmor restriction included),
//! and the state filesystem — private, node-local (not a network filesystem), with exec, user
//! extended attributes, free space, and overlayfs with `userxattr` inside a user namespace.
//!
//! Namespaces are tried for real by a probe: `hpk bubble-probe DIR`, a fresh process (a user
//! namespace can only be entered by a single-threaded one) that makes a user and a mount
//! namespace, mounts a tmpfs and an overlay with `userxattr` in DIR, and says how far it got.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::{Error, Result};

mod probe;
pub mod statefs;

pub use probe::run as run_probe;

/// The TUN device slirp4netns and the net-forwarder open (`$HPK_TUN_DEVICE` overrides it, for
/// tests).
pub fn tun_device() -> PathBuf {
    std::env::var_os("HPK_TUN_DEVICE").map_or_else(|| "/dev/net/tun".into(), Into::into)
}

/// Every check, in the order a user would fix them; `state` is the state directory (made
/// private here if it does not exist).
pub fn check_all(state: &Path) -> Result<()> {
    check_tun(&tun_device())?;
    check_user_namespace_sysctls()?;
    statefs::check(state)?;
    check_namespaces(state)
}

/// The TUN device can be opened read-write by this user.
pub fn check_tun(device: &Path) -> Result<()> {
    match std::fs::OpenOptions::new().read(true).write(true).open(device) {
        Ok(_) => Ok(()),
        Err(e) => {
            let mode = std::fs::metadata(device)
                .map(|m| format!("{:o}", std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o7777))
                .unwrap_or_else(|_| "missing".into());
            Err(Error::Prerequisite {
                what: format!(
                    "cannot open {} ({e}; mode {mode}): rootless networking (slirp4netns, the pod network's tunnel) needs it",
                    device.display()
                ),
                fix: format!(
                    "ask the administrator for `chmod 0666 {}` (Debian's and udev's default; the kernel still checks ownership and CAP_NET_ADMIN per namespace), or load the tun module",
                    device.display()
                ),
            })
        }
    }
}

const MAX_USER_NAMESPACES: &str = "/proc/sys/user/max_user_namespaces";
const UNPRIVILEGED_USERNS_CLONE: &str = "/proc/sys/kernel/unprivileged_userns_clone";
const APPARMOR_RESTRICTION: &str = "/proc/sys/kernel/apparmor_restrict_unprivileged_userns";

/// The sysctls that forbid user namespaces outright.
pub fn check_user_namespace_sysctls() -> Result<()> {
    let max = std::fs::read_to_string(MAX_USER_NAMESPACES).unwrap_or_default();
    if max.trim() == "0" {
        return Err(Error::Prerequisite {
            what: format!("user namespaces are disabled ({MAX_USER_NAMESPACES} is 0)"),
            fix: "ask the administrator for `sysctl -w user.max_user_namespaces=15000` (and the same in /etc/sysctl.d)".into(),
        });
    }
    if std::fs::read_to_string(UNPRIVILEGED_USERNS_CLONE).is_ok_and(|v| v.trim() == "0")
        && !nix::unistd::getuid().is_root()
    {
        return Err(Error::Prerequisite {
            what: "unprivileged user namespaces are disabled (kernel.unprivileged_userns_clone = 0)".into(),
            fix: "ask the administrator for `sysctl -w kernel.unprivileged_userns_clone=1`".into(),
        });
    }
    Ok(())
}

/// Runs the probe on `state` and turns its answer into a refusal with its fix.
pub fn check_namespaces(state: &Path) -> Result<()> {
    let dir = statefs::scratch_dir(state)?;
    let exe = std::env::current_exe().map_err(|e| Error::io("find", "this program", e))?;
    let out = Command::new(exe).arg("bubble-probe").arg(dir.path()).output();
    drop(dir);
    let out = out.map_err(|e| Error::io("run", "the namespace probe (hpk bubble-probe)", e))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let answer = stdout.lines().last().unwrap_or_default();
    let apparmor = std::fs::read_to_string(APPARMOR_RESTRICTION).is_ok_and(|v| v.trim() == "1");
    probe::refusal(answer, &String::from_utf8_lossy(&out.stderr), apparmor, state)
}
