//! Which IDs a bubble maps, and the launcher's own user namespace.
//!
//! crun refuses hybrid-cgroup hosts unless the cgroup v2 tree is hidden, which needs a mount
//! namespace, which an unprivileged user can make only inside a user namespace of its own. So
//! an unprivileged launcher first enters a user namespace in which it is root, and runs the
//! image's crun there. What that namespace maps decides what the bubble can map:
//!
//! - **several IDs**: the user as root plus its subordinate range from `/etc/subuid` and
//!   `/etc/subgid`, written by the setuid `newuidmap`/`newgidmap` pair (the one host helper
//!   HPK uses, because only a site can install it setuid). Pods get their real `runAsUser`.
//! - **one ID**: the user alone, as root. Images of any owner still run (their ownership is
//!   recorded, not applied), and a `runAsUser` that cannot be honoured is reported on the pod.
//!
//! A launcher that is root on the host maps root and 65535 IDs from 100000 without any of this.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::spec::{self, IdMap};
use crate::error::{Error, Result};

/// How many subordinate IDs a bubble maps at most (IDs 1–65536 inside).
const MAX_SUBORDINATE: u32 = 65_536;

/// A subordinate range: first ID on the host, how many.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    /// First host ID.
    pub start: u32,
    /// How many.
    pub count: u32,
}

/// What the launcher maps, and so the bubble.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdMode {
    /// Root on the host: root and 65535 IDs from 100000, mapped directly.
    HostRoot,
    /// The user alone; `why` says why no more.
    One {
        /// Why not several.
        why: String,
    },
    /// The user and its subordinate ranges.
    Several {
        /// Subordinate UIDs.
        uids: Range,
        /// Subordinate GIDs.
        gids: Range,
    },
}

impl IdMode {
    /// One line for the launcher's start-up message.
    pub fn describe(&self) -> String {
        match self {
            Self::HostRoot => "several IDs (root on the host: root and 65535 IDs from 100000)".into(),
            Self::One { why } => format!(
                "one mapped ID (you, as root of the bubble): {why}; images of any owner run, a runAsUser other than 0 is reported as not honoured"
            ),
            Self::Several { uids, gids } => format!(
                "several IDs: you as root and {} subordinate UIDs from {} ({} GIDs from {}) through newuidmap; pods get their runAsUser",
                uids.count, uids.start, gids.count, gids.start
            ),
        }
    }

    /// The bubble's UID and GID maps, as crun writes them from the launcher's namespace.
    pub fn bubble_maps(&self) -> (Vec<IdMap>, Vec<IdMap>) {
        match self {
            Self::HostRoot => spec::id_maps(0, 0, Some((100_000, 65_536)), Some((100_000, 65_536))),
            Self::One { .. } => spec::id_maps(0, 0, None, None),
            // Inside the launcher's namespace the subordinate IDs are 1…count.
            Self::Several { uids, gids } => spec::id_maps(0, 0, Some((1, uids.count)), Some((1, gids.count))),
        }
    }
}

/// The setuid helpers, found where distributions install them (never from a directory the
/// user controls: they must be root's, setuid).
fn setuid_helper(name: &str) -> std::result::Result<PathBuf, String> {
    use std::os::unix::fs::MetadataExt;
    let found = ["/usr/bin", "/bin", "/usr/sbin", "/sbin"]
        .iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file());
    let path =
        found.ok_or_else(|| format!("{name} is not installed (the uidmap or shadow-utils package)"))?;
    let meta = std::fs::metadata(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    if meta.uid() != 0 || meta.mode() & 0o4000 == 0 {
        return Err(format!("{} is not setuid root", path.display()));
    }
    Ok(path)
}

/// The subordinate ranges and helpers for several IDs, or why there are none.
fn plan(user: &str, uid: u32) -> std::result::Result<(Range, Range, PathBuf, PathBuf), String> {
    let newuidmap = setuid_helper("newuidmap")?;
    let newgidmap = setuid_helper("newgidmap")?;
    let range = |file: &str| {
        spec::subordinate_range(file, user, uid)
            .map(|(start, count)| Range { start, count: count.min(MAX_SUBORDINATE) })
            .ok_or_else(|| format!("{file} has no range for {user}"))
    };
    Ok((range("/etc/subuid")?, range("/etc/subgid")?, newuidmap, newgidmap))
}

/// Enters the launcher's own user namespace (it must be single-threaded): several IDs where
/// the helpers and ranges exist, else one. Returns what it maps.
pub fn enter() -> Result<IdMode> {
    let (uid, gid) = (nix::unistd::getuid().as_raw(), nix::unistd::getgid().as_raw());
    let user = nix::unistd::User::from_uid(nix::unistd::getuid()).ok().flatten().map(|u| u.name);
    let planned = match &user {
        Some(name) => plan(name, uid),
        None => Err(format!("UID {uid} has no name in the user database")),
    };
    match planned {
        Ok((uids, gids, newuidmap, newgidmap)) => {
            let helpers = MapHelpers::spawn(&newuidmap, &newgidmap, uid, gid, uids, gids)?;
            unshare_user()?;
            match helpers.finish() {
                Ok(()) => Ok(IdMode::Several { uids, gids }),
                // Neither map was written (newuidmap runs first and newgidmap only after it):
                // the namespace still takes the one-ID maps.
                Err(why) if !maps_written() => {
                    write_own_maps(uid, gid)?;
                    Ok(IdMode::One { why })
                }
                Err(why) => Err(Error::Prerequisite {
                    what: format!("mapping the subordinate IDs failed half-way: {why}"),
                    fix: "check this user's ranges in /etc/subuid and /etc/subgid with the administrator"
                        .into(),
                }),
            }
        }
        Err(why) => {
            unshare_user()?;
            write_own_maps(uid, gid)?;
            Ok(IdMode::One { why })
        }
    }
}

fn unshare_user() -> Result<()> {
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUSER).map_err(|e| Error::Prerequisite {
        what: format!("creating a user namespace failed: {e}"),
        fix: "user namespaces must be allowed for this user (user.max_user_namespaces > 0)".into(),
    })
}

/// Whether this process's UID map has been written (an unwritten one reads empty).
fn maps_written() -> bool {
    std::fs::read_to_string("/proc/self/uid_map").is_ok_and(|m| !m.trim().is_empty())
}

/// This user as root, the only ID.
fn write_own_maps(uid: u32, gid: u32) -> Result<()> {
    let write =
        |file: &str, text: String| std::fs::write(file, text).map_err(|e| Error::io("write", file, e));
    write("/proc/self/setgroups", "deny".into())?;
    write("/proc/self/uid_map", format!("0 {uid} 1"))?;
    write("/proc/self/gid_map", format!("0 {gid} 1"))
}

/// `newuidmap` and `newgidmap` for this process. They must run in the host's user namespace,
/// on a namespace that exists already: so a helper (`hpk bubble-map-ids`, this program) is
/// started before we leave the host's namespace and waits on its stdin until we have.
struct MapHelpers {
    child: std::process::Child,
}

impl MapHelpers {
    fn spawn(
        newuidmap: &Path,
        newgidmap: &Path,
        uid: u32,
        gid: u32,
        uids: Range,
        gids: Range,
    ) -> Result<Self> {
        let exe = std::env::current_exe().map_err(|e| Error::io("find", "this program", e))?;
        let pid = std::process::id().to_string();
        let map = |id: u32, r: Range| format!("0 {id} 1 1 {} {}", r.start, r.count);
        let child = Command::new(exe)
            .arg("bubble-map-ids")
            .arg(&pid)
            .arg(newuidmap)
            .arg(map(uid, uids))
            .arg(newgidmap)
            .arg(map(gid, gids))
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| Error::io("start", "the ID mapping helper", e))?;
        Ok(Self { child })
    }

    /// Lets the helper map us and waits for it; Err: why it failed.
    fn finish(mut self) -> std::result::Result<(), String> {
        if let Some(mut stdin) = self.child.stdin.take() {
            let _ = stdin.write_all(b"\n");
        }
        let out = self.child.wait_with_output().map_err(|e| format!("the ID mapping helper: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
        }
    }
}

/// `hpk bubble-map-ids PID NEWUIDMAP "UIDMAP" NEWGIDMAP "GIDMAP"`: waits for a line on stdin
/// (the launcher has left the host's user namespace), then runs both helpers on PID. Returns
/// the exit code.
pub fn map_ids_helper(args: &[String]) -> i32 {
    let [pid, newuidmap, uid_map, newgidmap, gid_map] = args else {
        eprintln!("usage: hpk bubble-map-ids PID NEWUIDMAP UIDMAP NEWGIDMAP GIDMAP");
        return 2;
    };
    let mut line = String::new();
    if std::io::stdin().read_line(&mut line).unwrap_or(0) == 0 {
        eprintln!("the launcher went away before its user namespace was made");
        return 1;
    }
    for (helper, map) in [(newuidmap, uid_map), (newgidmap, gid_map)] {
        let out = Command::new(helper).arg(pid).args(map.split_whitespace()).output();
        match out {
            Ok(o) if o.status.success() => {}
            Ok(o) => {
                eprintln!("{helper} {pid} {map}: {}", String::from_utf8_lossy(&o.stderr).trim());
                return 1;
            }
            Err(e) => {
                eprintln!("{helper}: {e}");
                return 1;
            }
        }
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_mode_maps_what_its_namespace_has() {
        let several = IdMode::Several {
            uids: Range { start: 100_000, count: 65_536 },
            gids: Range { start: 200_000, count: 10 },
        };
        let (u, g) = several.bubble_maps();
        assert_eq!(
            u,
            vec![IdMap { inside: 0, outside: 0, count: 1 }, IdMap { inside: 1, outside: 1, count: 65_535 }]
        );
        assert_eq!(
            g,
            vec![IdMap { inside: 0, outside: 0, count: 1 }, IdMap { inside: 1, outside: 1, count: 10 }]
        );
        let (u, _) = IdMode::One { why: "x".into() }.bubble_maps();
        assert_eq!(u, vec![IdMap { inside: 0, outside: 0, count: 1 }]);
        assert!(
            IdMode::One { why: "newuidmap is not installed".into() }
                .describe()
                .contains("newuidmap is not installed")
        );
        assert!(several.describe().contains("65536 subordinate UIDs from 100000"));
    }

    #[test]
    fn the_helper_refuses_bad_arguments() {
        assert_eq!(map_ids_helper(&["1".into()]), 2);
    }
}
