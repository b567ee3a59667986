//! What a bubble needs from the machine, checked before anything is started, each refusal
//! naming its fix.

use std::path::Path;
use std::process::Command;

use crate::error::{Error, Result};

/// The TUN device slirp4netns and the net-forwarder open (`$HPK_TUN_DEVICE` overrides it, for
/// tests).
pub fn tun_device() -> std::path::PathBuf {
    std::env::var_os("HPK_TUN_DEVICE").map_or_else(|| "/dev/net/tun".into(), Into::into)
}

/// Every check, in the order a user would fix them.
pub fn check_all() -> Result<()> {
    check_tun(&tun_device())?;
    check_user_namespaces()?;
    for (tool, package) in [("crun", "crun"), ("slirp4netns", "slirp4netns")] {
        check_tool(tool, package)?;
    }
    Ok(())
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

/// This user may create a user namespace (what every bubble is).
pub fn check_user_namespaces() -> Result<()> {
    let max = std::fs::read_to_string("/proc/sys/user/max_user_namespaces").unwrap_or_default();
    if max.trim() == "0" {
        return Err(Error::Prerequisite {
            what: "user namespaces are disabled (/proc/sys/user/max_user_namespaces is 0)".into(),
            fix: "ask the administrator for `sysctl -w user.max_user_namespaces=15000`".into(),
        });
    }
    if std::fs::read_to_string("/proc/sys/kernel/unprivileged_userns_clone").is_ok_and(|v| v.trim() == "0")
        && !nix::unistd::getuid().is_root()
    {
        return Err(Error::Prerequisite {
            what: "unprivileged user namespaces are disabled (kernel.unprivileged_userns_clone = 0)".into(),
            fix: "ask the administrator for `sysctl -w kernel.unprivileged_userns_clone=1`".into(),
        });
    }
    let out = Command::new("unshare").args(["--user", "--map-root-user", "true"]).output();
    match out {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(Error::Prerequisite {
            what: format!(
                "creating a user namespace failed: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ),
            fix: "user namespaces must be allowed for this user (user.max_user_namespaces > 0; on some kernels kernel.unprivileged_userns_clone=1, or an AppArmor/SELinux policy allowing them)".into(),
        }),
        Err(e) => Err(Error::Prerequisite {
            what: format!("cannot run unshare to test user namespaces: {e}"),
            fix: "install util-linux".into(),
        }),
    }
}

/// `tool` is on the PATH.
pub fn check_tool(tool: &str, package: &str) -> Result<()> {
    match Command::new(tool).arg("--version").output() {
        Ok(o) if o.status.success() => Ok(()),
        _ => Err(Error::Prerequisite {
            what: format!("{tool} is not installed (or not on PATH)"),
            fix: format!("install the {package} package (Debian: apt install {package})"),
        }),
    }
}
