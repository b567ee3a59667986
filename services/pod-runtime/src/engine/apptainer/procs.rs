//! Finding Apptainer's processes from the host's `/proc`: the pause inside an instance, a
//! container's process tree, and the process that is in the container's own namespaces.
//!
//! The lookups are pure functions over a snapshot ([`ProcessInfo`]s), so they are tested
//! with made-up trees; [`scan`] takes the snapshot.

use std::collections::VecDeque;
use std::path::PathBuf;

/// One process as the host sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcessInfo {
    /// Its PID on the host.
    pub host_pid: u32,
    /// Its parent's PID on the host.
    pub ppid: u32,
    /// Its PID in its own PID namespace (the last `NSpid` entry).
    pub ns_pid: i32,
    /// Its PID namespace (`/proc/N/ns/pid` link).
    pub pid_ns: PathBuf,
    /// Its mount namespace (`/proc/N/ns/mnt` link).
    pub mnt_ns: PathBuf,
    /// Its first argument.
    pub argv0: String,
}

/// Every process of the host that can be read.
pub fn scan() -> Vec<ProcessInfo> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries.flatten().filter_map(|e| read(e.file_name().to_str()?.parse().ok()?)).collect()
}

fn read(host_pid: u32) -> Option<ProcessInfo> {
    let dir = PathBuf::from(format!("/proc/{host_pid}"));
    let status = std::fs::read_to_string(dir.join("status")).ok()?;
    let field = |name: &str| status.lines().find_map(|l| l.strip_prefix(name)).map(str::trim);
    let ppid = field("PPid:")?.parse().ok()?;
    let ns_pid = field("NSpid:")?.split_whitespace().last()?.parse().ok()?;
    let cmdline = std::fs::read(dir.join("cmdline")).unwrap_or_default();
    let argv0 = cmdline.split(|b| *b == 0).next().map(|a| String::from_utf8_lossy(a).into_owned())?;
    Some(ProcessInfo {
        host_pid,
        ppid,
        ns_pid,
        pid_ns: std::fs::read_link(dir.join("ns/pid")).ok()?,
        mnt_ns: std::fs::read_link(dir.join("ns/mnt")).ok()?,
        argv0,
    })
}

/// `root` and every process below it, parents before children.
pub fn process_tree(all: &[ProcessInfo], root: u32) -> Vec<u32> {
    if !all.iter().any(|p| p.host_pid == root) {
        return Vec::new();
    }
    let mut tree = Vec::new();
    let mut queue = VecDeque::from([root]);
    while let Some(pid) = queue.pop_front() {
        tree.push(pid);
        queue.extend(all.iter().filter(|p| p.ppid == pid && p.host_pid != pid).map(|p| p.host_pid));
    }
    tree
}

/// The hpk-pause of an instance whose listed PID is `instance_pid`: that process when it is
/// hpk-pause (`--no-init` makes the startscript's exec PID 1), else the nearest below it.
pub fn find_pause(instance_pid: u32) -> Option<u32> {
    find_pause_in(&scan(), instance_pid)
}

/// [`find_pause`] over a snapshot.
pub fn find_pause_in(all: &[ProcessInfo], instance_pid: u32) -> Option<u32> {
    process_tree(all, instance_pid)
        .into_iter()
        .find(|pid| all.iter().any(|p| p.host_pid == *pid && p.argv0.ends_with("hpk-pause")))
}

/// The host PID of the process numbered `ns_pid` in the PID namespace of `pause_pid`.
pub fn host_pid_in(all: &[ProcessInfo], pause_pid: u32, ns_pid: i32) -> Option<u32> {
    let ns = &all.iter().find(|p| p.host_pid == pause_pid)?.pid_ns;
    all.iter().find(|p| &p.pid_ns == ns && p.ns_pid == ns_pid).map(|p| p.host_pid)
}

/// The container's own process below its init `init` (apptainer's master, which stays in
/// the host's mount namespace): the first one, breadth first, in another mount namespace —
/// the one whose root is the image.
pub fn container_process(all: &[ProcessInfo], init: u32) -> Option<u32> {
    let mnt = &all.iter().find(|p| p.host_pid == init)?.mnt_ns;
    process_tree(all, init).into_iter().find(|pid| all.iter().any(|p| p.host_pid == *pid && &p.mnt_ns != mnt))
}
