//! The cluster's unprivileged user: created with a home of its own, removed with every process
//! it still runs.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tracing::warn;

use crate::netns::run;
use crate::{Error, Result};

/// useradd and userdel lock /etc/passwd and fail, rather than wait, while another holds it.
static PASSWD: Mutex<()> = Mutex::new(());
const PASSWD_RETRY: Duration = Duration::from_secs(10);

/// An unprivileged user made for one cluster. Dropping it stops its processes and removes it,
/// its group and its home.
#[derive(Debug)]
pub struct SlurmUser {
    /// The login name (`hpke2e<id>`).
    pub name: String,
    /// Its UID.
    pub uid: u32,
    /// Its primary group's GID.
    pub gid: u32,
    /// Its home directory: mode 0700, owned by the user.
    pub home: PathBuf,
    /// The UIDs /etc/subuid gives it for rootless containers (useradd adds a range when the
    /// file exists): a container's processes run as those.
    pub subordinate_uids: Option<std::ops::Range<u32>>,
}

impl SlurmUser {
    /// Creates `name` with a bash login shell and the home `home` (whose parent must exist and
    /// be traversable by everyone); with `subordinate`, it gets ranges of subordinate UIDs and
    /// GIDs (`/etc/subuid`, `/etc/subgid`), as a site that offers rootless containers gives.
    pub(super) fn create(name: &str, home: &Path, subordinate: bool) -> Result<Self> {
        let home_arg = home.display().to_string();
        if subordinate {
            // useradd gives new users a range (login.defs' SUB_UID_COUNT) once the files exist.
            for file in ["/etc/subuid", "/etc/subgid"] {
                if !Path::new(file).exists() {
                    std::fs::write(file, "").map_err(|e| Error::io("create", file, e))?;
                }
            }
        }
        passwd_command(&["useradd", "--create-home", "--home-dir", &home_arg, "--shell", "/bin/bash", name])?;
        if subordinate && subordinate_uids(name).is_none() {
            let start = next_free_range();
            let range = format!("{start}-{}", start + SUBORDINATE_COUNT - 1);
            passwd_command(&["usermod", "--add-subuids", &range, "--add-subgids", &range, name])?;
        }
        let user = nix::unistd::User::from_name(name).ok().flatten().ok_or_else(|| Error::NotFound {
            what: format!("user {name}"),
            hint: "useradd made no entry".into(),
        });
        let user = match user {
            Ok(user) => user,
            Err(e) => {
                let _ = passwd_command(&["userdel", "--force", "--remove", name]);
                return Err(e);
            }
        };
        let made = Self {
            name: name.to_owned(),
            uid: user.uid.as_raw(),
            gid: user.gid.as_raw(),
            home: user.dir,
            subordinate_uids: subordinate_uids(name),
        };
        // useradd applies HOME_MODE from login.defs (0755 on Debian): a home is private.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&made.home, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| Error::io("chmod 0700", made.home.display(), e))?;
        Ok(made)
    }

    /// Every user a harness made (`hpke2e…`) that still exists: what killed runs left.
    pub(super) fn leftovers() -> Vec<Self> {
        let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
        passwd
            .lines()
            .filter_map(|line| {
                let fields: Vec<&str> = line.split(':').collect();
                let (name, uid, gid, home) =
                    (fields.first()?, fields.get(2)?, fields.get(3)?, fields.get(5)?);
                name.starts_with(super::USER_PREFIX).then(|| Self {
                    name: (*name).to_owned(),
                    uid: uid.parse().unwrap_or(u32::MAX),
                    gid: gid.parse().unwrap_or(u32::MAX),
                    home: PathBuf::from(home),
                    subordinate_uids: subordinate_uids(name),
                })
            })
            // Never a system account, whatever its name.
            .filter(|u| u.uid >= 1000 && u.uid != u32::MAX)
            .collect()
    }

    /// Whether `uid` is this user's or one of its subordinate UIDs.
    pub fn owns(&self, uid: u32) -> bool {
        uid == self.uid || self.subordinate_uids.as_ref().is_some_and(|r| r.contains(&uid))
    }

    /// The PIDs of every process running as this user or one of its subordinate UIDs, in any
    /// namespace.
    fn processes(&self) -> Vec<i32> {
        let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
        let ours =
            |id: u32| id == self.uid || self.subordinate_uids.as_ref().is_some_and(|r| r.contains(&id));
        entries
            .flatten()
            .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
            .filter(|pid| {
                let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
                // `Uid:` lists real, effective, saved and filesystem UIDs.
                status
                    .lines()
                    .find_map(|l| l.strip_prefix("Uid:"))
                    .is_some_and(|ids| ids.split_whitespace().any(|id| id.parse().is_ok_and(ours)))
            })
            .filter(|&pid| crate::process::is_running(pid))
            .collect()
    }
}

impl Drop for SlurmUser {
    fn drop(&mut self) {
        // Job processes that outlived their slurmstepd, also those in user namespaces of their
        // own (a rootless container's processes still run as this UID here).
        crate::process::stop_pids(&self.processes(), Duration::from_secs(5));
        if let Err(e) = passwd_command(&["userdel", "--force", "--remove", &self.name]) {
            warn!(user = self.name, error = %e, "could not remove the cluster's user");
        }
        if self.home.exists()
            && let Err(e) = std::fs::remove_dir_all(&self.home)
        {
            warn!(home = %self.home.display(), error = %e, "could not remove the user's home");
        }
    }
}

/// Runs useradd/userdel, one at a time in this process, retrying (bounded) while another
/// process holds the passwd lock.
fn passwd_command(args: &[&str]) -> Result<String> {
    let _guard = PASSWD.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let deadline = Instant::now() + PASSWD_RETRY;
    loop {
        match run(Command::new(args[0]).args(&args[1..])) {
            Err(Error::Command { stderr, .. }) if stderr.contains("lock") && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(100));
            }
            other => return other,
        }
    }
}

/// How many subordinate IDs a user gets.
const SUBORDINATE_COUNT: u32 = 65_536;

/// The first ID after every range of /etc/subuid and /etc/subgid (at least 200000).
fn next_free_range() -> u32 {
    let end = |file: &str| {
        std::fs::read_to_string(file)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let mut f = l.split(':').skip(1);
                let start: u32 = f.next()?.parse().ok()?;
                start.checked_add(f.next()?.parse().ok()?)
            })
            .max()
            .unwrap_or(0)
    };
    end("/etc/subuid").max(end("/etc/subgid")).max(200_000)
}

/// The user's range in /etc/subuid (`name:start:count`), if it has one.
fn subordinate_uids(name: &str) -> Option<std::ops::Range<u32>> {
    let text = std::fs::read_to_string("/etc/subuid").ok()?;
    text.lines().find_map(|line| {
        let mut fields = line.split(':');
        if fields.next()? != name {
            return None;
        }
        let start: u32 = fields.next()?.parse().ok()?;
        let count: u32 = fields.next()?.parse().ok()?;
        Some(start..start.checked_add(count)?)
    })
}
