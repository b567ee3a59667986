//! The CRI security context, resolved: users and groups (by ID or by name from the image's
//! `/etc/passwd` and `/etc/group`), capabilities, privileged mode, masked and read-only paths,
//! `no_new_privs`, seccomp profiles, and the pod's namespace options and sysctls.

use std::collections::BTreeMap;
use std::path::Path;

use k8s_cri::v1 as cri;
use serde_json::{Value, json};

use super::{Error, Result, seccomp_default};
use crate::engine::{ALL_CAPS, DEFAULT_CAPS, Security};

pub(crate) use crate::engine::User;

fn security_context(config: &cri::ContainerConfig) -> Option<&cri::LinuxContainerSecurityContext> {
    config.linux.as_ref().and_then(|l| l.security_context.as_ref())
}

/// Checks of the security context that need nothing but the request.
pub(crate) fn validate(config: &cri::ContainerConfig) -> Result<()> {
    let Some(sc) = security_context(config) else { return Ok(()) };
    if sc.run_as_group.is_some() && sc.run_as_user.is_none() && sc.run_as_username.is_empty() {
        return Err(Error::Invalid("runAsGroup needs runAsUser or runAsUserName".into()));
    }
    if let Some(user) = &sc.run_as_user {
        u32::try_from(user.value)
            .map_err(|_| Error::Invalid(format!("runAsUser {} is out of range", user.value)))?;
    }
    if let Some(group) = &sc.run_as_group {
        u32::try_from(group.value)
            .map_err(|_| Error::Invalid(format!("runAsGroup {} is out of range", group.value)))?;
    }
    for g in &sc.supplemental_groups {
        u32::try_from(*g).map_err(|_| Error::Invalid(format!("supplemental group {g} is out of range")))?;
    }
    Ok(())
}

/// The process's user: the image's `User` (`uid`, `name`, with `:gid`/`:group`), overridden by
/// runAsUser/runAsUserName and runAsGroup; its groups from the image's `/etc/group` plus the
/// supplemental groups. Names are looked up inside `rootfs` only.
pub(crate) fn resolve_user(config: &cri::ContainerConfig, image_user: &str, rootfs: &Path) -> Result<User> {
    let sc = security_context(config);
    let (user_part, group_part) = match image_user.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (image_user, None),
    };
    let mut name = None;
    let (mut uid, mut gid) = (0u32, 0u32);
    let passwd = read_in_root(rootfs, "etc/passwd");
    let group_file = read_in_root(rootfs, "etc/group");
    let lookup_name = |wanted: &str| -> Result<(u32, u32)> {
        passwd_entries(&passwd)
            .find(|(n, _, _)| *n == wanted)
            .map(|(_, u, g)| (u, g))
            .ok_or_else(|| Error::Invalid(format!("user {wanted:?} is not in the image's /etc/passwd")))
    };
    if !user_part.is_empty() {
        match user_part.parse::<u32>() {
            Ok(id) => {
                uid = id;
                gid = passwd_entries(&passwd).find(|(_, u, _)| *u == id).map(|(_, _, g)| g).unwrap_or(0);
            }
            Err(_) => {
                (uid, gid) = lookup_name(user_part)?;
                name = Some(user_part.to_owned());
            }
        }
    }
    if let Some(group) = group_part.filter(|g| !g.is_empty()) {
        gid = match group.parse::<u32>() {
            Ok(id) => id,
            Err(_) => group_entries(&group_file)
                .find(|(n, _, _)| *n == group)
                .map(|(_, g, _)| g)
                .ok_or_else(|| Error::Invalid(format!("group {group:?} is not in the image's /etc/group")))?,
        };
    }
    if let Some(sc) = sc {
        if let Some(user) = &sc.run_as_user {
            uid =
                u32::try_from(user.value).map_err(|_| Error::Invalid("runAsUser is out of range".into()))?;
            gid = passwd_entries(&passwd).find(|(_, u, _)| *u == uid).map(|(_, _, g)| g).unwrap_or(0);
            name = passwd_entries(&passwd).find(|(_, u, _)| *u == uid).map(|(n, _, _)| n.to_owned());
        } else if !sc.run_as_username.is_empty() {
            (uid, gid) = lookup_name(&sc.run_as_username)?;
            name = Some(sc.run_as_username.clone());
        }
        if let Some(group) = &sc.run_as_group {
            gid = u32::try_from(group.value)
                .map_err(|_| Error::Invalid("runAsGroup is out of range".into()))?;
        }
    }
    let mut additional_gids = vec![gid];
    if let Some(name) = &name {
        additional_gids.extend(
            group_entries(&group_file).filter(|(_, _, members)| members.contains(name)).map(|(_, g, _)| g),
        );
    }
    if let Some(sc) = sc {
        additional_gids.extend(sc.supplemental_groups.iter().filter_map(|g| u32::try_from(*g).ok()));
    }
    let mut seen = std::collections::HashSet::new();
    additional_gids.retain(|g| seen.insert(*g));
    Ok(User { uid, gid, additional_gids })
}

/// Reads `relative` under `root`, resolving symbolic links inside it (an image's
/// `/etc/passwd -> /etc/shadow` must not reach the host's); empty when absent.
fn read_in_root(root: &Path, relative: &str) -> String {
    use rustix::fs::{Mode, OFlags, ResolveFlags, openat2};
    let Ok(dir) = std::fs::File::open(root) else { return String::new() };
    let Ok(fd) =
        openat2(&dir, relative, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty(), ResolveFlags::IN_ROOT)
    else {
        return String::new();
    };
    let mut text = String::new();
    let _ = std::io::Read::read_to_string(&mut std::fs::File::from(fd), &mut text);
    text
}

/// `(name, uid, gid)` of each well-formed `/etc/passwd` line.
fn passwd_entries(text: &str) -> impl Iterator<Item = (&str, u32, u32)> {
    text.lines().filter_map(|line| {
        let f: Vec<&str> = line.split(':').collect();
        Some((*f.first()?, f.get(2)?.parse().ok()?, f.get(3)?.parse().ok()?))
    })
}

/// `(name, gid, members)` of each well-formed `/etc/group` line.
fn group_entries(text: &str) -> impl Iterator<Item = (&str, u32, Vec<String>)> {
    text.lines().filter_map(|line| {
        let f: Vec<&str> = line.split(':').collect();
        let members = f.get(3).map(|m| m.split(',').filter(|s| !s.is_empty()).map(str::to_owned).collect());
        Some((*f.first()?, f.get(2)?.parse().ok()?, members.unwrap_or_default()))
    })
}

/// `NET_ADMIN` or `CAP_NET_ADMIN` → `CAP_NET_ADMIN`; unknown names are refused.
fn cap_name(name: &str) -> Result<String> {
    let upper = name.to_ascii_uppercase();
    let full = if upper.starts_with("CAP_") { upper } else { format!("CAP_{upper}") };
    if ALL_CAPS.contains(&full.as_str()) {
        Ok(full)
    } else {
        Err(Error::Invalid(format!("unknown capability {name:?}")))
    }
}

/// The container's privileges, as containerd computes them from the security context.
pub(crate) fn security(config: &cri::ContainerConfig) -> Result<Security> {
    let mut security = Security::default();
    let Some(sc) = security_context(config) else { return Ok(security) };
    security.no_new_privileges = sc.no_new_privs;
    if sc.privileged {
        security.capabilities = ALL_CAPS.iter().filter(|c| grantable(c)).map(|c| (*c).to_owned()).collect();
        security.masked_paths.clear();
        security.readonly_paths.clear();
        security.privileged = true;
        // Privileged containers run without seccomp, whatever profile is named.
        return Ok(security);
    }
    if let Some(caps) = &sc.capabilities {
        let all = |list: &[String]| list.iter().any(|c| c.eq_ignore_ascii_case("ALL"));
        let mut set: Vec<String> = if all(&caps.add_capabilities) {
            ALL_CAPS.iter().map(|c| (*c).to_owned()).collect()
        } else {
            DEFAULT_CAPS.iter().map(|c| (*c).to_owned()).collect()
        };
        if all(&caps.drop_capabilities) {
            set.clear();
        }
        for add in caps.add_capabilities.iter().filter(|c| !c.eq_ignore_ascii_case("ALL")) {
            let add = cap_name(add)?;
            if !set.contains(&add) {
                set.push(add);
            }
        }
        for drop in caps.drop_capabilities.iter().filter(|c| !c.eq_ignore_ascii_case("ALL")) {
            let drop = cap_name(drop)?;
            set.retain(|c| *c != drop);
        }
        security.capabilities = set;
    }
    if !sc.masked_paths.is_empty() {
        security.masked_paths = sc.masked_paths.clone();
    }
    if !sc.readonly_paths.is_empty() {
        security.readonly_paths = sc.readonly_paths.clone();
    }
    security.capabilities.retain(|c| grantable(c));
    // Against the capabilities the container will hold: some syscalls need them.
    security.seccomp = seccomp(sc, &security.capabilities)?;
    Ok(security)
}

/// Whether the runtime holds `cap` in its bounding set: what it lacks it cannot hand on (crun's
/// capset would fail), so privileged and ALL mean "all the runtime has", as in containerd.
fn grantable(cap: &str) -> bool {
    static BOUNDING: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let Some(bit) = ALL_CAPS.iter().position(|c| *c == cap) else { return false };
    let bounding = *BOUNDING.get_or_init(|| {
        std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| s.lines().find_map(|l| l.strip_prefix("CapBnd:")).map(|v| v.trim().to_owned()))
            .and_then(|v| u64::from_str_radix(&v, 16).ok())
            .unwrap_or(u64::MAX)
    });
    bounding & (1u64 << bit) != 0
}

/// The seccomp profile: none (Unconfined, or nothing said: the CRI's nil profile, which
/// critest checks is unconfined; the kubelet asks for RuntimeDefault when a pod says nothing),
/// containerd's default for a container holding `capabilities` (RuntimeDefault), or a JSON
/// profile from a file on this host (Localhost).
fn seccomp(sc: &cri::LinuxContainerSecurityContext, capabilities: &[String]) -> Result<Option<Value>> {
    use cri::security_profile::ProfileType;
    let (kind, path) = match &sc.seccomp {
        Some(profile) => match ProfileType::try_from(profile.profile_type) {
            Ok(ProfileType::RuntimeDefault) => ("default", String::new()),
            Ok(ProfileType::Localhost) => ("localhost", profile.localhost_ref.clone()),
            _ => ("unconfined", String::new()),
        },
        #[allow(deprecated)]
        None => match sc.seccomp_profile_path.as_str() {
            "runtime/default" | "docker/default" => ("default", String::new()),
            other => match other.strip_prefix("localhost/") {
                Some(path) => ("localhost", path.to_owned()),
                None => ("unconfined", String::new()),
            },
        },
    };
    match kind {
        "default" => Ok(Some(seccomp_default::profile(capabilities, &seccomp_default::Host::current()))),
        "localhost" => {
            let text = std::fs::read_to_string(&path)
                .map_err(|e| Error::Invalid(format!("seccomp profile {path:?} cannot be read: {e}")))?;
            let profile: Value = serde_json::from_str(&text)
                .map_err(|e| Error::Invalid(format!("seccomp profile {path:?} is not JSON: {e}")))?;
            localhost_seccomp(&profile)
                .map(Some)
                .map_err(|e| Error::Invalid(format!("seccomp profile {path:?}: {e}")))
        }
        _ => Ok(None),
    }
}

/// A Docker/OCI-format profile as an OCI `linux.seccomp` object: the fields crun knows.
fn localhost_seccomp(profile: &Value) -> std::result::Result<Value, String> {
    let default = profile.get("defaultAction").and_then(Value::as_str).ok_or("no defaultAction")?;
    let mut out = json!({"defaultAction": default});
    for key in ["defaultErrnoRet", "architectures", "flags"] {
        if let Some(v) = profile.get(key) {
            out[key] = v.clone();
        }
    }
    let mut syscalls = Vec::new();
    for rule in profile.get("syscalls").and_then(Value::as_array).into_iter().flatten() {
        let mut names: Vec<Value> = rule.get("names").and_then(Value::as_array).cloned().unwrap_or_default();
        if let Some(name) = rule.get("name") {
            names.push(name.clone());
        }
        let action = rule.get("action").and_then(Value::as_str).ok_or("a syscall rule without action")?;
        let mut r = json!({"names": names, "action": action});
        for key in ["errnoRet", "args"] {
            if let Some(v) = rule.get(key) {
                r[key] = v.clone();
            }
        }
        syscalls.push(r);
    }
    out["syscalls"] = Value::Array(syscalls);
    Ok(out)
}

/// What the pod's namespace options and sysctls ask of its sandbox.
pub(crate) struct PodNamespaces {
    pub(crate) host_network: bool,
    pub(crate) host_ipc: bool,
    pub(crate) sysctls: BTreeMap<String, String>,
}

/// Sysctl prefixes that belong to a namespace a pod has of its own.
const NAMESPACED_SYSCTLS: &[&str] = &["kernel.shm", "kernel.msg", "kernel.sem", "fs.mqueue.", "net."];

pub(crate) fn pod_namespaces(config: &cri::PodSandboxConfig) -> Result<PodNamespaces> {
    use cri::NamespaceMode;
    let linux = config.linux.as_ref();
    let options = linux.and_then(|l| l.security_context.as_ref()).and_then(|s| s.namespace_options.as_ref());
    let mode = |m: i32| NamespaceMode::try_from(m).unwrap_or(NamespaceMode::Pod);
    let host_network = options.is_some_and(|o| mode(o.network) == NamespaceMode::Node);
    let host_ipc = options.is_some_and(|o| mode(o.ipc) == NamespaceMode::Node);
    if options.is_some_and(|o| mode(o.pid) == NamespaceMode::Node) {
        return Err(Error::Invalid(
            "hostPID is not supported: a sandbox's hpk-pause must be PID 1 of its own namespace to collect exits".into(),
        ));
    }
    let sysctls: BTreeMap<String, String> =
        linux.map(|l| l.sysctls.iter().map(|(k, v)| (k.clone(), v.clone())).collect()).unwrap_or_default();
    for name in sysctls.keys() {
        if !NAMESPACED_SYSCTLS.iter().any(|p| name.starts_with(p)) {
            return Err(Error::Invalid(format!("sysctl {name:?} is not namespaced; a pod cannot set it")));
        }
        if name.starts_with("net.") && host_network {
            return Err(Error::Invalid(format!(
                "sysctl {name:?} would change the host's network; refused with hostNetwork"
            )));
        }
        if (name.starts_with("kernel.") || name.starts_with("fs.mqueue.")) && host_ipc {
            return Err(Error::Invalid(format!(
                "sysctl {name:?} would change the host's IPC namespace; refused with hostIPC"
            )));
        }
    }
    Ok(PodNamespaces { host_network, host_ipc, sysctls })
}

/// Whether the container asks for a PID namespace of its own.
pub(crate) fn own_pid_namespace(config: &cri::ContainerConfig) -> Result<bool> {
    use cri::NamespaceMode;
    let mode = security_context(config)
        .and_then(|s| s.namespace_options.as_ref())
        .map(|o| NamespaceMode::try_from(o.pid).unwrap_or(NamespaceMode::Pod));
    match mode {
        Some(NamespaceMode::Container) => Ok(true),
        Some(NamespaceMode::Node) => Err(Error::Invalid("hostPID is not supported".into())),
        _ => Ok(false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_sc(sc: cri::LinuxContainerSecurityContext) -> cri::ContainerConfig {
        cri::ContainerConfig {
            linux: Some(cri::LinuxContainerConfig { security_context: Some(sc), ..Default::default() }),
            ..Default::default()
        }
    }

    #[test]
    fn users_and_groups_resolve_by_name_inside_the_image() {
        let root = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(root.path().join("etc")).expect("etc");
        std::fs::write(
            root.path().join("etc/passwd"),
            "root:x:0:0::/root:/bin/sh\nwww-data:x:33:33::/:/bin/sh\nnobody:x:65534:65534::/:/bin/false\n",
        )
        .expect("passwd");
        std::fs::write(
            root.path().join("etc/group"),
            "root:x:0:\nwww-data:x:33:\nweb:x:1004:www-data,other\n",
        )
        .expect("group");
        let plain = cri::ContainerConfig::default();
        assert_eq!(
            resolve_user(&plain, "www-data", root.path()).expect("user"),
            User { uid: 33, gid: 33, additional_gids: vec![33, 1004] }
        );
        assert_eq!(resolve_user(&plain, "33:web", root.path()).expect("user").gid, 1004);
        let by_name = with_sc(cri::LinuxContainerSecurityContext {
            run_as_username: "nobody".into(),
            supplemental_groups: vec![1234],
            ..Default::default()
        });
        assert_eq!(
            resolve_user(&by_name, "", root.path()).expect("user"),
            User { uid: 65534, gid: 65534, additional_gids: vec![65534, 1234] }
        );
        assert!(resolve_user(&plain, "ghost", root.path()).is_err());
    }

    #[test]
    fn names_do_not_follow_links_out_of_the_image() {
        let root = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(root.path().join("etc")).expect("etc");
        let outside = tempfile::NamedTempFile::new().expect("file");
        std::fs::write(outside.path(), "secret:x:7:7::/:/bin/sh\n").expect("write");
        std::os::unix::fs::symlink(outside.path(), root.path().join("etc/passwd")).expect("link");
        assert!(resolve_user(&cri::ContainerConfig::default(), "secret", root.path()).is_err());
    }

    #[test]
    fn run_as_group_needs_a_user() {
        let bad = with_sc(cri::LinuxContainerSecurityContext {
            run_as_group: Some(cri::Int64Value { value: 5 }),
            ..Default::default()
        });
        assert!(validate(&bad).is_err());
    }

    #[test]
    fn capabilities_follow_add_and_drop() {
        let config = with_sc(cri::LinuxContainerSecurityContext {
            capabilities: Some(cri::Capability {
                add_capabilities: vec!["NET_ADMIN".into()],
                drop_capabilities: vec!["net_raw".into()],
                ..Default::default()
            }),
            ..Default::default()
        });
        let caps = security(&config).expect("security").capabilities;
        assert!(caps.contains(&"CAP_NET_ADMIN".to_owned()));
        assert!(!caps.contains(&"CAP_NET_RAW".to_owned()));
        let none = with_sc(cri::LinuxContainerSecurityContext {
            capabilities: Some(cri::Capability {
                drop_capabilities: vec!["ALL".into()],
                ..Default::default()
            }),
            ..Default::default()
        });
        assert!(security(&none).expect("security").capabilities.is_empty());
        let privileged =
            with_sc(cri::LinuxContainerSecurityContext { privileged: true, ..Default::default() });
        let s = security(&privileged).expect("security");
        assert_eq!(s.capabilities.len(), ALL_CAPS.iter().filter(|c| grantable(c)).count());
        assert!(s.capabilities.contains(&"CAP_SYS_ADMIN".to_owned()));
        assert!(s.masked_paths.is_empty() && s.seccomp.is_none());
        let masked = with_sc(cri::LinuxContainerSecurityContext {
            masked_paths: vec!["/bin/ls".into()],
            readonly_paths: vec!["/tmp".into()],
            ..Default::default()
        });
        let s = security(&masked).expect("security");
        assert_eq!((s.masked_paths, s.readonly_paths), (vec!["/bin/ls".to_owned()], vec!["/tmp".to_owned()]));
        let unknown = with_sc(cri::LinuxContainerSecurityContext {
            capabilities: Some(cri::Capability {
                add_capabilities: vec!["FLY".into()],
                ..Default::default()
            }),
            ..Default::default()
        });
        assert!(security(&unknown).is_err());
    }

    #[test]
    fn seccomp_profiles() {
        let default = with_sc(cri::LinuxContainerSecurityContext {
            seccomp: Some(cri::SecurityProfile {
                profile_type: cri::security_profile::ProfileType::RuntimeDefault as i32,
                ..Default::default()
            }),
            ..Default::default()
        });
        let profile = security(&default).expect("security").seccomp.expect("a profile");
        assert_eq!(profile["defaultAction"], "SCMP_ACT_ERRNO");
        let file = tempfile::NamedTempFile::new().expect("file");
        std::fs::write(file.path(), r#"{"defaultAction":"SCMP_ACT_ALLOW","archMap":[],"syscalls":[{"names":["chmod"],"action":"SCMP_ACT_ERRNO"}]}"#).expect("write");
        let local = with_sc(cri::LinuxContainerSecurityContext {
            seccomp: Some(cri::SecurityProfile {
                profile_type: cri::security_profile::ProfileType::Localhost as i32,
                localhost_ref: file.path().display().to_string(),
            }),
            ..Default::default()
        });
        let profile = security(&local).expect("security").seccomp.expect("a profile");
        assert_eq!(profile["syscalls"][0]["names"], json!(["chmod"]));
        assert!(profile.get("archMap").is_none());
        std::fs::write(file.path(), "not json").expect("write");
        assert!(security(&local).is_err(), "a broken profile is refused");
    }

    /// The names a profile allows whatever the arguments.
    fn allowed_outright(profile: &Value) -> Vec<String> {
        let rules = profile["syscalls"].as_array().expect("syscalls");
        rules
            .iter()
            .filter(|r| r["action"] == "SCMP_ACT_ALLOW" && r.get("args").is_none())
            .flat_map(|r| r["names"].as_array().expect("names").iter())
            .map(|n| n.as_str().expect("name").to_owned())
            .collect()
    }

    fn profiled(
        profile_type: cri::security_profile::ProfileType,
        caps: Option<cri::Capability>,
    ) -> cri::ContainerConfig {
        with_sc(cri::LinuxContainerSecurityContext {
            seccomp: Some(cri::SecurityProfile { profile_type: profile_type as i32, ..Default::default() }),
            capabilities: caps,
            ..Default::default()
        })
    }

    #[test]
    fn runtime_default_is_containerds_profile_for_the_containers_capabilities() {
        use cri::security_profile::ProfileType;
        let plain = security(&profiled(ProfileType::RuntimeDefault, None)).expect("security");
        let profile = plain.seccomp.expect("a profile");
        let allowed = allowed_outright(&profile);
        assert!(allowed.iter().any(|n| n == "read") && allowed.iter().any(|n| n == "chroot"));
        for denied in
            ["unshare", "mount", "bpf", "perf_event_open", "keyctl", "io_uring_setup", "kcmp", "clone3"]
        {
            assert!(!allowed.iter().any(|n| n == denied), "{denied} is allowed");
        }
        let clone3 =
            profile["syscalls"].as_array().expect("rules").iter().find(|r| r["names"] == json!(["clone3"]));
        assert_eq!(
            clone3.map(|r| (r["action"].clone(), r["errnoRet"].clone())),
            Some((json!("SCMP_ACT_ERRNO"), json!(38)))
        );

        let admin =
            Some(cri::Capability { add_capabilities: vec!["SYS_ADMIN".into()], ..Default::default() });
        let profile = security(&profiled(ProfileType::RuntimeDefault, admin))
            .expect("security")
            .seccomp
            .expect("a profile");
        let allowed = allowed_outright(&profile);
        assert!(
            ["unshare", "mount", "clone", "clone3", "bpf"].iter().all(|n| allowed.iter().any(|a| a == n))
        );

        // Dropping CAP_SYS_CHROOT takes chroot out of the filter as well.
        let none = Some(cri::Capability { drop_capabilities: vec!["ALL".into()], ..Default::default() });
        let profile = security(&profiled(ProfileType::RuntimeDefault, none))
            .expect("security")
            .seccomp
            .expect("a profile");
        assert!(!allowed_outright(&profile).iter().any(|n| n == "chroot"));
    }

    #[test]
    fn unconfined_only_when_asked_for_or_privileged() {
        use cri::security_profile::ProfileType;
        // An empty SecurityProfile is RuntimeDefault (the enum's zero), as critest expects.
        let empty = with_sc(cri::LinuxContainerSecurityContext {
            seccomp: Some(cri::SecurityProfile::default()),
            ..Default::default()
        });
        assert!(security(&empty).expect("security").seccomp.is_some());
        #[allow(deprecated)]
        let by_path = with_sc(cri::LinuxContainerSecurityContext {
            seccomp_profile_path: "runtime/default".into(),
            ..Default::default()
        });
        assert!(security(&by_path).expect("security").seccomp.is_some());

        assert!(security(&profiled(ProfileType::Unconfined, None)).expect("security").seccomp.is_none());
        // A nil profile is unconfined in the CRI (critest "nil profile, which is unconfined");
        // the kubelet sends RuntimeDefault for pods that name none.
        assert!(security(&with_sc(Default::default())).expect("security").seccomp.is_none());
        assert!(security(&cri::ContainerConfig::default()).expect("security").seccomp.is_none());
        let privileged = with_sc(cri::LinuxContainerSecurityContext {
            privileged: true,
            seccomp: Some(cri::SecurityProfile::default()),
            ..Default::default()
        });
        assert!(security(&privileged).expect("security").seccomp.is_none(), "privileged runs unconfined");
    }

    #[test]
    fn sysctls_must_be_namespaced() {
        let pod = |sysctls: &[(&str, &str)], host_network: bool| cri::PodSandboxConfig {
            linux: Some(cri::LinuxPodSandboxConfig {
                sysctls: sysctls.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
                security_context: Some(cri::LinuxSandboxSecurityContext {
                    namespace_options: Some(cri::NamespaceOption {
                        network: if host_network { cri::NamespaceMode::Node as i32 } else { 0 },
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(pod_namespaces(&pod(&[("kernel.shm_rmid_forced", "1")], false)).is_ok());
        assert!(pod_namespaces(&pod(&[("vm.swappiness", "1")], false)).is_err());
        assert!(pod_namespaces(&pod(&[("net.ipv4.ip_forward", "1")], true)).is_err());
        assert!(pod_namespaces(&pod(&[], true)).expect("ok").host_network);
    }
}
