//! `hpk bubble-probe DIR`: tries what a bubble does with namespaces, in a fresh
//! single-threaded process, and prints how far it got as its last line: `ok`, or
//! `FAIL <stage> <error>`. DIR is a scratch directory on the state filesystem; the caller
//! removes it.
//!
//! Stages: `userns` (a user and a mount namespace), `maps` (this user as root there),
//! `mount` (a tmpfs: what Ubuntu's AppArmor restriction forbids), `overlay-mount` (an overlay
//! with `userxattr` on DIR, as every container's root filesystem is), `overlay-use` (a file
//! written, a lower file and a lower directory removed through it: whiteouts and opaque
//! markers in user xattrs).

use std::path::Path;

use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sched::{CloneFlags, unshare};

use crate::error::{Error, Result};

/// The probe itself; prints its answer and returns the exit code (0 ok, 1 refused).
pub fn run(dir: &Path) -> i32 {
    match try_all(dir) {
        Ok(()) => {
            println!("ok");
            0
        }
        Err((stage, e)) => {
            println!("FAIL {stage} {e}");
            1
        }
    }
}

type Step = std::result::Result<(), (&'static str, String)>;

fn at<E: std::fmt::Display>(stage: &'static str) -> impl Fn(E) -> (&'static str, String) {
    move |e| (stage, e.to_string())
}

fn try_all(dir: &Path) -> Step {
    let (uid, gid) = (nix::unistd::getuid(), nix::unistd::getgid());
    unshare(CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNS).map_err(at("userns"))?;
    let write = |file: &str, text: String| std::fs::write(file, text).map_err(at("maps"));
    write("/proc/self/setgroups", "deny".into())?;
    write("/proc/self/uid_map", format!("0 {uid} 1"))?;
    write("/proc/self/gid_map", format!("0 {gid} 1"))?;
    mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)
        .map_err(at("mount"))?;
    let sub = |name: &str| {
        let p = dir.join(name);
        std::fs::create_dir(&p).map(|()| p).map_err(at("mount"))
    };
    let scratch = sub("tmpfs")?;
    mount(Some("tmpfs"), &scratch, Some("tmpfs"), MsFlags::empty(), Some("size=64k")).map_err(at("mount"))?;
    let _ = umount2(&scratch, MntFlags::MNT_DETACH);

    let (lower, upper, work, merged) = (sub("lower")?, sub("upper")?, sub("work")?, sub("merged")?);
    let lower_files = || -> std::io::Result<()> {
        std::fs::write(lower.join("gone"), b"lower")?;
        std::fs::create_dir(lower.join("emptied"))
    };
    lower_files().map_err(at("overlay-mount"))?;
    let options = format!(
        "lowerdir={},upperdir={},workdir={},userxattr",
        lower.display(),
        upper.display(),
        work.display()
    );
    mount(Some("overlay"), &merged, Some("overlay"), MsFlags::empty(), Some(options.as_str()))
        .map_err(at("overlay-mount"))?;
    let used = (|| -> std::io::Result<()> {
        std::fs::write(merged.join("new"), b"upper")?;
        std::fs::remove_file(merged.join("gone"))?;
        std::fs::remove_dir(merged.join("emptied"))?;
        if merged.join("gone").exists() {
            return Err(std::io::Error::other("a removed lower file is still visible"));
        }
        Ok(())
    })();
    let _ = umount2(&merged, MntFlags::MNT_DETACH);
    used.map_err(at("overlay-use"))
}

/// The refusal for the probe's answer (`stderr` is shown when it crashed); `apparmor`: the
/// kernel restricts unprivileged user namespaces through AppArmor (Ubuntu 23.10 and newer).
pub fn refusal(answer: &str, stderr: &str, apparmor: bool, state: &Path) -> Result<()> {
    if answer == "ok" {
        return Ok(());
    }
    let Some(rest) = answer.strip_prefix("FAIL ") else {
        return Err(Error::Failed {
            what: "the namespace probe (hpk bubble-probe)".into(),
            detail: format!("it answered {answer:?}: {}", stderr.trim()),
        });
    };
    let (stage, error) = rest.split_once(' ').unwrap_or((rest, ""));
    const APPARMOR_FIX: &str = "ask the administrator for an AppArmor profile that lets HPK use user namespaces (a file in /etc/apparmor.d/ with `profile hpk /path/to/bin/hpk flags=(unconfined) { userns, }`, then `apparmor_parser -r` it), or for `sysctl -w kernel.apparmor_restrict_unprivileged_userns=0`";
    if apparmor && matches!(stage, "userns" | "maps" | "mount") {
        return Err(Error::Prerequisite {
            what: format!(
                "AppArmor restricts unprivileged user namespaces here (kernel.apparmor_restrict_unprivileged_userns = 1): {stage} failed: {error}"
            ),
            fix: APPARMOR_FIX.into(),
        });
    }
    let (what, fix) = match stage {
        "userns" => (
            format!("creating a user namespace failed: {error}"),
            "user namespaces must be allowed for this user: `sysctl user.max_user_namespaces` above 0 (15000 is usual), `kernel.unprivileged_userns_clone=1` where that exists, and no SELinux or AppArmor policy forbidding them".to_owned(),
        ),
        "maps" => (
            format!("mapping this user to root of a user namespace failed: {error}"),
            "a security module forbids it; ask the administrator to allow unprivileged user namespaces".to_owned(),
        ),
        "mount" => (
            format!("mounting inside a user namespace failed: {error}"),
            "a security module (SELinux, AppArmor) forbids mounts in user namespaces; ask the administrator to allow them".to_owned(),
        ),
        "overlay-mount" | "overlay-use" => (
            format!(
                "overlayfs with userxattr does not work in a user namespace on the filesystem of the state directory {} ({stage}: {error})",
                state.display()
            ),
            "it needs Linux 5.11 or newer (RHEL 9, Ubuntu 22.04, Debian 12) and a node-local state directory on a filesystem overlayfs takes as its upper layer (ext4, xfs, btrfs, tmpfs): set HPK_STATE_DIR to one".to_owned(),
        ),
        other => (format!("the namespace probe failed at {other}: {error}"), "see the error".to_owned()),
    };
    Err(Error::Prerequisite { what, fix })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_stage_names_its_fix() {
        let state = Path::new("/tmp/hpk-1000");
        assert!(refusal("ok", "", false, state).is_ok());
        let err = |a: &str, apparmor: bool| refusal(a, "", apparmor, state).expect_err(a).to_string();
        assert!(err("FAIL userns ENOSPC: No space left on device", false).contains("max_user_namespaces"));
        let overlay = err("FAIL overlay-mount EINVAL: Invalid argument", false);
        assert!(overlay.contains("HPK_STATE_DIR") && overlay.contains("/tmp/hpk-1000"), "{overlay}");
        assert!(err("FAIL overlay-use EIO", false).contains("5.11"));
        let apparmor = err("FAIL mount EPERM: Operation not permitted", true);
        assert!(apparmor.contains("apparmor_restrict_unprivileged_userns"), "{apparmor}");
        assert!(apparmor.contains("userns,"), "{apparmor}");
        assert!(err("FAIL mount EPERM", false).contains("security module"));
        let crashed = refusal("", "thread main panicked", false, state).expect_err("crash").to_string();
        assert!(crashed.contains("panicked"), "{crashed}");
    }
}
