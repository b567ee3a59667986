//! What the host's cgroups let us enforce. Nothing is delegated to a Slurm job's user in a
//! bubble, and hybrid hosts make crun refuse cgroups entirely, so limits are reported, never
//! pretended.

use std::path::Path;

/// How cgroups are mounted on this host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CgroupMode {
    /// cgroup v1 only.
    V1,
    /// v1 plus a v2 hierarchy at `/sys/fs/cgroup/unified` (crun refuses this unless the v2
    /// hierarchy holds no controller or is hidden).
    Hybrid,
    /// cgroup v2 only.
    V2,
}

impl CgroupMode {
    /// Detects the mode from `/sys/fs/cgroup`.
    pub fn detect() -> Self {
        Self::detect_at(Path::new("/sys/fs/cgroup"))
    }

    fn detect_at(root: &Path) -> Self {
        if root.join("cgroup.controllers").exists() {
            return Self::V2;
        }
        let unified = root.join("unified/cgroup.controllers");
        match std::fs::read_to_string(unified) {
            Ok(controllers) if !controllers.trim().is_empty() => Self::Hybrid,
            _ => Self::V1,
        }
    }
}

/// This process's cgroup v2 directory, when it may create cgroups below it (delegated).
fn delegated_v2_subtree() -> Option<std::path::PathBuf> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = own.lines().find_map(|l| l.strip_prefix("0::"))?;
    let dir = Path::new("/sys/fs/cgroup").join(path.trim_start_matches('/'));
    let writable = rustix::fs::access(&dir, rustix::fs::Access::WRITE_OK).is_ok();
    writable.then_some(dir)
}

/// The resource limits a pod may ask for that this runtime does not enforce on a host with
/// cgroups in `mode`, with why; shown in the CRI `Status` and logged at start.
pub fn limits_not_enforced(mode: CgroupMode) -> Vec<String> {
    let why = match mode {
        CgroupMode::V2 if delegated_v2_subtree().is_some() => {
            "crun runs without a cgroup manager: enforcing limits in the delegated cgroup v2 subtree is not implemented yet"
        }
        CgroupMode::V2 => {
            "crun runs without a cgroup manager: no cgroup v2 subtree is delegated to the runtime"
        }
        CgroupMode::Hybrid => {
            "the host mounts hybrid cgroups (v1 + v2 with controllers), which crun cannot use"
        }
        CgroupMode::V1 => {
            "crun runs without a cgroup manager: cgroup v1 hierarchies are not delegated to the runtime"
        }
    };
    ["cpu", "memory", "pids", "hugepages"]
        .iter()
        .map(|limit| format!("{limit} limits are not enforced: {why}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_hybrid_only_with_a_controller_in_the_v2_hierarchy() {
        let tmp = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(tmp.path().join("unified")).expect("mkdir");
        assert_eq!(CgroupMode::detect_at(tmp.path()), CgroupMode::V1);
        std::fs::write(tmp.path().join("unified/cgroup.controllers"), "").expect("write");
        assert_eq!(CgroupMode::detect_at(tmp.path()), CgroupMode::V1);
        std::fs::write(tmp.path().join("unified/cgroup.controllers"), "hugetlb\n").expect("write");
        assert_eq!(CgroupMode::detect_at(tmp.path()), CgroupMode::Hybrid);
        std::fs::write(tmp.path().join("cgroup.controllers"), "cpu memory\n").expect("write");
        assert_eq!(CgroupMode::detect_at(tmp.path()), CgroupMode::V2);
    }
}
