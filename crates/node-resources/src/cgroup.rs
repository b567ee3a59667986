//! The memory limit of the cgroup this process runs in: a Slurm job confined by
//! `task/cgroup` (`ConstrainRAMSpace`) has one even when its environment says nothing of
//! memory.
//!
//! The cgroup's directory is found as container runtimes find it: its path in
//! `/proc/self/cgroup` is relative to its hierarchy's root, and `/proc/self/mountinfo` says
//! where (and which part of) that hierarchy is mounted.

use std::path::{Path, PathBuf};

/// Limits at or above this are "no limit" (cgroup v1 writes 2^63 − 4096 rounded to pages).
const UNLIMITED: i64 = 1 << 62;

/// A mounted cgroup hierarchy: the part of it mounted (`root`), where, and whether it is
/// cgroup v2 or which v1 controllers it holds.
struct Mount {
    root: PathBuf,
    point: PathBuf,
    v2: bool,
    controllers: Vec<String>,
}

fn cgroup_mounts(mountinfo: &str) -> Vec<Mount> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let sep = fields.iter().position(|f| *f == "-")?;
            let (fstype, options) = (*fields.get(sep + 1)?, *fields.get(sep + 3)?);
            if fstype != "cgroup" && fstype != "cgroup2" {
                return None;
            }
            Some(Mount {
                root: PathBuf::from(fields.get(3)?),
                point: PathBuf::from(fields.get(4)?),
                v2: fstype == "cgroup2",
                controllers: options.split(',').map(str::to_owned).collect(),
            })
        })
        .collect()
}

/// The smallest memory limit of this process's cgroup and its ancestors (as far as they are
/// mounted), from the texts of `/proc/self/cgroup` and `/proc/self/mountinfo`: cgroup v2's
/// `memory.max` and v1's `memory.limit_in_bytes`. `None` when there is none or it cannot be
/// read.
pub fn memory_limit(proc_self_cgroup: &str, mountinfo: &str) -> Option<i64> {
    let mounts = cgroup_mounts(mountinfo);
    let mut limits = Vec::new();
    for line in proc_self_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let v2 = controllers.is_empty();
        if !v2 && !controllers.split(',').any(|c| c == "memory") {
            continue;
        }
        let file = if v2 { "memory.max" } else { "memory.limit_in_bytes" };
        let mount = mounts.iter().find(|m| {
            m.v2 == v2
                && (v2 || m.controllers.iter().any(|c| c == "memory"))
                && Path::new(path).starts_with(&m.root)
        });
        let Some(mount) = mount else { continue };
        let Ok(below) = Path::new(path).strip_prefix(&mount.root) else { continue };
        // The cgroup itself and every ancestor up to the mounted root.
        let mut dir = mount.point.join(below);
        loop {
            if let Some(limit) = read_limit(&dir.join(file)) {
                limits.push(limit);
            }
            if dir == mount.point || !dir.pop() {
                break;
            }
        }
    }
    limits.into_iter().filter(|l| *l < UNLIMITED).min()
}

fn read_limit(file: &Path) -> Option<i64> {
    let text = std::fs::read_to_string(file).ok()?;
    let text = text.trim();
    if text == "max" {
        return None;
    }
    text.parse::<i64>().ok().filter(|l| *l > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Path, rel: &str, text: &str) {
        let path = root.join(rel);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, text).expect("write");
    }

    fn mountinfo(lines: &[(&str, &Path, &str, &str)]) -> String {
        lines
            .iter()
            .map(|(root, point, fstype, options)| {
                format!(
                    "30 25 0:26 {root} {} rw,nosuid shared:9 - {fstype} {fstype} {options}\n",
                    point.display()
                )
            })
            .collect()
    }

    #[test]
    fn v1_memory_limit_of_the_job_is_found_above_the_step() {
        let dir = tempfile::tempdir().expect("tempdir");
        let memory = dir.path().join("memory");
        write(&memory, "slurm/uid_1000/job_7/memory.limit_in_bytes", "2147483648\n");
        write(&memory, "slurm/uid_1000/job_7/step_0/memory.limit_in_bytes", "9223372036854771712\n");
        write(&memory, "memory.limit_in_bytes", "9223372036854771712\n");
        let info = mountinfo(&[("/", &memory, "cgroup", "rw,memory"), ("/", dir.path(), "tmpfs", "rw")]);
        let cgroup = "12:cpuset:/slurm/uid_1000/job_7/step_0\n4:memory:/slurm/uid_1000/job_7/step_0\n0::/\n";
        assert_eq!(memory_limit(cgroup, &info), Some(2 << 30));
    }

    #[test]
    fn a_hierarchy_mounted_from_a_subdirectory_is_followed() {
        // A node of the test lab: its own part of the hierarchy is mounted as the root.
        let dir = tempfile::tempdir().expect("tempdir");
        let memory = dir.path().join("memory");
        write(&memory, "slurm_node1/uid_1000/job_7/memory.limit_in_bytes", "1073741824\n");
        let info = mountinfo(&[("/hpkt-1-node1", &memory, "cgroup", "rw,memory")]);
        let cgroup = "4:memory:/hpkt-1-node1/slurm_node1/uid_1000/job_7/step_0/task_0\n";
        assert_eq!(memory_limit(cgroup, &info), Some(1 << 30));
        assert_eq!(memory_limit("4:memory:/elsewhere/job\n", &info), None, "not under the mounted root");
    }

    #[test]
    fn v2_memory_max_and_none() {
        let dir = tempfile::tempdir().expect("tempdir");
        let r = dir.path();
        write(r, "system.slice/job/memory.max", "1073741824\n");
        write(r, "system.slice/memory.max", "max\n");
        let info = mountinfo(&[("/", r, "cgroup2", "rw,nsdelegate")]);
        assert_eq!(memory_limit("0::/system.slice/job\n", &info), Some(1 << 30));
        assert_eq!(memory_limit("0::/system.slice\n", &info), None);
        assert_eq!(memory_limit("0::/elsewhere\n", &info), None, "unreadable means none");
        assert_eq!(memory_limit("garbage\n", &info), None);
        assert_eq!(memory_limit("0::/system.slice/job\n", ""), None, "no cgroup mounted");
    }
}
