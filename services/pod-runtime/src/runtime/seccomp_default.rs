//! The RuntimeDefault seccomp profile: containerd's default profile, as data.
//!
//! It matches `contrib/seccomp/seccomp_default.go` of containerd at commit 301026e5 (main after
//! v2.4.0-beta.0, August 2026), whose last change to the profile is 0c23e946, "Block AF_ALG in
//! default socket policy" (May 2026). Moby's `profiles/seccomp/default.json` is the same list
//! for Docker; containerd's is the one Kubernetes nodes run, so this follows it where they
//! differ (it has no `io_uring_*`, which moby dropped too in 2023, and it also refuses AF_ALG
//! sockets). To update: compare the tables below with that file, one rule group at a time.
//!
//! In short: everything not listed fails with EPERM; syscalls that need a capability the
//! container holds are allowed with it; without CAP_SYS_ADMIN, `clone` may not create
//! namespaces and `clone3` fails with ENOSYS, so that glibc falls back to `clone`, whose flags
//! the filter can see.

use serde_json::{Value, json};

/// EPERM: what every syscall not allowed returns.
const EPERM: u32 = 1;
/// ENOSYS: what `clone3` returns without CAP_SYS_ADMIN.
const ENOSYS: u32 = 38;
/// `AF_ALG` (the kernel's crypto API), refused in `socket`.
const AF_ALG: u64 = 38;
/// `AF_VSOCK` (sockets to the hypervisor), refused in `socket`.
const AF_VSOCK: u64 = 40;
/// CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET |
/// CLONE_NEWCGROUP: the flags `clone` may not carry without CAP_SYS_ADMIN.
pub(crate) const NAMESPACE_FLAGS: u64 = 0x7E02_0000;
/// The `personality` arguments allowed: PER_LINUX, UNAME26, PER_LINUX32, UNAME26|PER_LINUX32,
/// and 0xffffffff (a query).
const PERSONALITIES: &[u64] = &[0x0, 0x0008, 0x20000, 0x20008, 0xffff_ffff];

/// Allowed to every container, on every architecture (names the kernel or libseccomp does not
/// know are skipped by crun).
#[rustfmt::skip]
const ALLOWED: &[&str] = &[
    "accept", "accept4", "access", "adjtimex", "alarm", "bind", "brk", "cachestat", "capget", "capset",
    "chdir", "chmod", "chown", "chown32", "clock_adjtime", "clock_adjtime64", "clock_getres",
    "clock_getres_time64", "clock_gettime", "clock_gettime64", "clock_nanosleep",
    "clock_nanosleep_time64", "close", "close_range", "connect", "copy_file_range", "creat", "dup",
    "dup2", "dup3", "epoll_create", "epoll_create1", "epoll_ctl", "epoll_ctl_old", "epoll_pwait",
    "epoll_pwait2", "epoll_wait", "epoll_wait_old", "eventfd", "eventfd2", "execve", "execveat", "exit",
    "exit_group", "faccessat", "faccessat2", "fadvise64", "fadvise64_64", "fallocate", "fanotify_mark",
    "fchdir", "fchmod", "fchmodat", "fchmodat2", "fchown", "fchown32", "fchownat", "fcntl", "fcntl64",
    "fdatasync", "fgetxattr", "flistxattr", "flock", "fork", "fremovexattr", "fsetxattr", "fstat",
    "fstat64", "fstatat64", "fstatfs", "fstatfs64", "fsync", "ftruncate", "ftruncate64", "futex",
    "futex_requeue", "futex_time64", "futex_wait", "futex_waitv", "futex_wake", "futimesat",
    "get_robust_list", "get_thread_area", "getcpu", "getcwd", "getdents", "getdents64", "getegid",
    "getegid32", "geteuid", "geteuid32", "getgid", "getgid32", "getgroups", "getgroups32", "getitimer",
    "getpeername", "getpgid", "getpgrp", "getpid", "getppid", "getpriority", "getrandom", "getresgid",
    "getresgid32", "getresuid", "getresuid32", "getrlimit", "getrusage", "getsid", "getsockname",
    "getsockopt", "gettid", "gettimeofday", "getuid", "getuid32", "getxattr", "getxattrat",
    "inotify_add_watch", "inotify_init", "inotify_init1", "inotify_rm_watch", "io_cancel", "io_destroy",
    "io_getevents", "io_pgetevents", "io_pgetevents_time64", "io_setup", "io_submit", "ioctl",
    "ioprio_get", "ioprio_set", "ipc", "kill", "landlock_add_rule", "landlock_create_ruleset",
    "landlock_restrict_self", "lchown", "lchown32", "lgetxattr", "link", "linkat", "listen",
    "listmount", "listxattr", "listxattrat", "llistxattr", "_llseek", "lremovexattr", "lseek",
    "lsetxattr", "lsm_get_self_attr", "lsm_list_modules", "lsm_set_self_attr", "lstat", "lstat64",
    "madvise", "map_shadow_stack", "membarrier", "memfd_create", "memfd_secret", "mincore", "mkdir",
    "mkdirat", "mknod", "mknodat", "mlock", "mlock2", "mlockall", "mmap", "mmap2", "mprotect",
    "mq_getsetattr", "mq_notify", "mq_open", "mq_timedreceive", "mq_timedreceive_time64",
    "mq_timedsend", "mq_timedsend_time64", "mq_unlink", "mremap", "mseal", "msgctl", "msgget", "msgrcv",
    "msgsnd", "msync", "munlock", "munlockall", "munmap", "name_to_handle_at", "nanosleep",
    "newfstatat", "_newselect", "open", "openat", "openat2", "pause", "pidfd_open", "pidfd_send_signal",
    "pipe", "pipe2", "pkey_alloc", "pkey_free", "pkey_mprotect", "poll", "ppoll", "ppoll_time64",
    "prctl", "pread64", "preadv", "preadv2", "prlimit64", "process_mrelease", "pselect6",
    "pselect6_time64", "pwrite64", "pwritev", "pwritev2", "read", "readahead", "readlink", "readlinkat",
    "readv", "recv", "recvfrom", "recvmmsg", "recvmmsg_time64", "recvmsg", "remap_file_pages",
    "removexattr", "removexattrat", "rename", "renameat", "renameat2", "restart_syscall", "rmdir",
    "rseq", "rt_sigaction", "rt_sigpending", "rt_sigprocmask", "rt_sigqueueinfo", "rt_sigreturn",
    "rt_sigsuspend", "rt_sigtimedwait", "rt_sigtimedwait_time64", "rt_tgsigqueueinfo",
    "sched_get_priority_max", "sched_get_priority_min", "sched_getaffinity", "sched_getattr",
    "sched_getparam", "sched_getscheduler", "sched_rr_get_interval", "sched_rr_get_interval_time64",
    "sched_setaffinity", "sched_setattr", "sched_setparam", "sched_setscheduler", "sched_yield",
    "seccomp", "select", "semctl", "semget", "semop", "semtimedop", "semtimedop_time64", "send",
    "sendfile", "sendfile64", "sendmmsg", "sendmsg", "sendto", "set_robust_list", "set_thread_area",
    "set_tid_address", "setfsgid", "setfsgid32", "setfsuid", "setfsuid32", "setgid", "setgid32",
    "setgroups", "setgroups32", "setitimer", "setpgid", "setpriority", "setregid", "setregid32",
    "setresgid", "setresgid32", "setresuid", "setresuid32", "setreuid", "setreuid32", "setrlimit",
    "setsid", "setsockopt", "setuid", "setuid32", "setxattr", "setxattrat", "shmat", "shmctl", "shmdt",
    "shmget", "shutdown", "sigaltstack", "signalfd", "signalfd4", "sigprocmask", "sigreturn",
    "socketcall", "socketpair", "splice", "stat", "stat64", "statfs", "statfs64", "statmount", "statx",
    "symlink", "symlinkat", "sync", "sync_file_range", "syncfs", "sysinfo", "tee", "tgkill", "time",
    "timer_create", "timer_delete", "timer_getoverrun", "timer_gettime", "timer_gettime64",
    "timer_settime", "timer_settime64", "timerfd_create", "timerfd_gettime", "timerfd_gettime64",
    "timerfd_settime", "timerfd_settime64", "times", "tkill", "truncate", "truncate64", "ugetrlimit",
    "umask", "uname", "unlink", "unlinkat", "uretprobe", "utime", "utimensat", "utimensat_time64",
    "utimes", "vfork", "vmsplice", "wait4", "waitid", "waitpid", "write", "writev",
];

/// Allowed from Linux 4.8 on, where seccomp runs after a tracer has changed a syscall, so
/// tracing can no longer get around the filter.
const ALLOWED_SINCE_4_8: &[&str] = &["process_vm_readv", "process_vm_writev", "ptrace"];

/// Allowed only to a container that holds the capability.
#[rustfmt::skip]
const BY_CAPABILITY: &[(&str, &[&str])] = &[
    ("CAP_DAC_READ_SEARCH", &["open_by_handle_at"]),
    ("CAP_SYS_ADMIN", &[
        "bpf", "clone", "clone3", "fanotify_init", "fsconfig", "fsmount", "fsopen", "fspick",
        "lookup_dcookie", "mount", "mount_setattr", "move_mount", "open_tree", "perf_event_open",
        "quotactl", "quotactl_fd", "setdomainname", "sethostname", "setns", "syslog", "umount",
        "umount2", "unshare",
    ]),
    ("CAP_SYS_BOOT", &["reboot"]),
    ("CAP_SYS_CHROOT", &["chroot"]),
    ("CAP_SYS_MODULE", &["delete_module", "init_module", "finit_module"]),
    ("CAP_SYS_PACCT", &["acct"]),
    ("CAP_SYS_PTRACE", &[
        "kcmp", "pidfd_getfd", "process_madvise", "process_vm_readv", "process_vm_writev", "ptrace",
    ]),
    ("CAP_SYS_RAWIO", &["iopl", "ioperm"]),
    ("CAP_SYS_TIME", &["settimeofday", "stime", "clock_settime", "clock_settime64"]),
    ("CAP_SYS_TTY_CONFIG", &["vhangup"]),
    ("CAP_SYS_NICE", &["get_mempolicy", "mbind", "set_mempolicy", "set_mempolicy_home_node"]),
    ("CAP_SYSLOG", &["syslog"]),
    ("CAP_BPF", &["bpf"]),
    ("CAP_PERFMON", &["perf_event_open"]),
];

/// The machine's architecture, as far as the profile cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Arch {
    /// x86_64, filtering its 32-bit (x86) and x32 ABIs too.
    X86_64,
    /// aarch64, filtering 32-bit arm too.
    Aarch64,
    /// Anything else: no architecture list and no architecture's own syscalls, as containerd.
    Other,
}

impl Arch {
    fn of(name: &str) -> Self {
        match name {
            "x86_64" => Self::X86_64,
            "aarch64" => Self::Aarch64,
            _ => Self::Other,
        }
    }

    /// libseccomp's names of the ABIs a container may use here.
    fn abis(self) -> &'static [&'static str] {
        match self {
            Self::X86_64 => &["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
            Self::Aarch64 => &["SCMP_ARCH_ARM", "SCMP_ARCH_AARCH64"],
            Self::Other => &[],
        }
    }

    /// Syscalls only this architecture has, allowed to every container.
    fn syscalls(self) -> &'static [&'static str] {
        match self {
            Self::X86_64 => &["arch_prctl", "modify_ldt"],
            Self::Aarch64 => &[
                "arm_fadvise64_64",
                "arm_sync_file_range",
                "sync_file_range2",
                "breakpoint",
                "cacheflush",
                "set_tls",
            ],
            Self::Other => &[],
        }
    }
}

/// What the profile depends on besides the container: the architecture and the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Host {
    pub(crate) arch: Arch,
    /// (major, minor); `None` when unknown, which counts as older than any version.
    pub(crate) kernel: Option<(u32, u32)>,
}

impl Host {
    /// This machine, read once.
    pub(crate) fn current() -> Self {
        static HOST: std::sync::OnceLock<Host> = std::sync::OnceLock::new();
        *HOST.get_or_init(|| Host {
            arch: Arch::of(std::env::consts::ARCH),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .ok()
                .as_deref()
                .and_then(kernel_version),
        })
    }
}

/// `6.18.44-fc` → (6, 18).
fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.trim().split(['.', '-']);
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

fn allow(names: &[&str]) -> Value {
    json!({"names": names, "action": "SCMP_ACT_ALLOW"})
}

fn allow_if(name: &str, index: u32, op: &str, value: u64) -> Value {
    json!({"names": [name], "action": "SCMP_ACT_ALLOW", "args": [{"index": index, "value": value, "op": op}]})
}

/// The OCI `linux.seccomp` object for a container holding `capabilities` (its bounding set,
/// `CAP_` names) on `host`.
pub(crate) fn profile(capabilities: &[String], host: &Host) -> Value {
    let holds = |cap: &str| capabilities.iter().any(|c| c == cap);
    let mut rules = vec![allow(ALLOWED)];
    // Every family but AF_ALG and AF_VSOCK, as three single-condition rules: conditions on
    // the same argument in one rule would be ORed by crun as by runc. (On x86's 32-bit ABI,
    // socket() goes through socketcall, allowed above, as in containerd.)
    rules.push(allow_if("socket", 0, "SCMP_CMP_LT", AF_ALG));
    rules.push(allow_if("socket", 0, "SCMP_CMP_EQ", AF_ALG + 1));
    rules.push(allow_if("socket", 0, "SCMP_CMP_GT", AF_VSOCK));
    rules.extend(PERSONALITIES.iter().map(|p| allow_if("personality", 0, "SCMP_CMP_EQ", *p)));
    if host.kernel.is_some_and(|k| k >= (4, 8)) {
        rules.push(allow(ALLOWED_SINCE_4_8));
    }
    if !host.arch.syscalls().is_empty() {
        rules.push(allow(host.arch.syscalls()));
    }
    rules.extend(BY_CAPABILITY.iter().filter(|(cap, _)| holds(cap)).map(|(_, names)| allow(names)));
    if !holds("CAP_SYS_ADMIN") {
        rules.push(json!({
            "names": ["clone"],
            "action": "SCMP_ACT_ALLOW",
            "args": [{"index": 0, "value": NAMESPACE_FLAGS, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}],
        }));
        rules.push(json!({"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": ENOSYS}));
    }
    let mut profile = json!({"defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": EPERM, "syscalls": rules});
    if !host.arch.abis().is_empty() {
        profile["architectures"] = json!(host.arch.abis());
    }
    profile
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::DEFAULT_CAPS;

    const CLONE_NEWUSER: u64 = 0x1000_0000;
    const CLONE_NEWNET: u64 = 0x4000_0000;
    const SIGCHLD: u64 = 17;
    const CLONE_THREAD_FLAGS: u64 = 0x003d_0f00; // what glibc's pthread_create passes

    const X86: Host = Host { arch: Arch::X86_64, kernel: Some((6, 18)) };

    /// What the filter does with one call, evaluated as libseccomp would: the action of the
    /// rule naming the syscall whose conditions all hold, else the default action.
    #[derive(Debug, PartialEq, Eq)]
    enum Verdict {
        Allow,
        Errno(u64),
    }

    fn verdict(profile: &Value, name: &str, args: &[u64]) -> Verdict {
        let holds = |cond: &Value| {
            let arg = args.get(cond["index"].as_u64().expect("index") as usize).copied().unwrap_or(0);
            let value = cond["value"].as_u64().expect("value");
            match cond["op"].as_str().expect("op") {
                "SCMP_CMP_EQ" => arg == value,
                "SCMP_CMP_NE" => arg != value,
                "SCMP_CMP_LT" => arg < value,
                "SCMP_CMP_GT" => arg > value,
                "SCMP_CMP_MASKED_EQ" => arg & value == cond["valueTwo"].as_u64().expect("valueTwo"),
                op => panic!("op {op} not evaluated here"),
            }
        };
        let matching: Vec<Verdict> = profile["syscalls"]
            .as_array()
            .expect("syscalls")
            .iter()
            .filter(|r| r["names"].as_array().expect("names").iter().any(|n| n == name))
            .filter(|r| r.get("args").and_then(Value::as_array).into_iter().flatten().all(holds))
            .map(|r| match r["action"].as_str().expect("action") {
                "SCMP_ACT_ALLOW" => Verdict::Allow,
                "SCMP_ACT_ERRNO" => Verdict::Errno(r["errnoRet"].as_u64().expect("errnoRet")),
                other => panic!("action {other} not expected in the default profile"),
            })
            .collect();
        assert!(
            matching.windows(2).all(|w| w[0] == w[1]),
            "{name}{args:?}: rules with different actions match: {matching:?}"
        );
        match matching.into_iter().next() {
            Some(v) => v,
            None => Verdict::Errno(profile["defaultErrnoRet"].as_u64().expect("defaultErrnoRet")),
        }
    }

    fn caps(list: &[&str]) -> Vec<String> {
        list.iter().map(|c| (*c).to_owned()).collect()
    }

    const DENIED: Verdict = Verdict::Errno(1);

    #[test]
    fn a_default_container_is_denied_what_needs_privilege_and_allowed_the_rest() {
        let p = profile(&caps(DEFAULT_CAPS), &X86);
        assert_eq!(
            (p["defaultAction"].as_str(), p["defaultErrnoRet"].as_u64()),
            (Some("SCMP_ACT_ERRNO"), Some(1))
        );
        for allowed in ["read", "write", "openat", "execve", "futex", "epoll_wait", "chroot", "arch_prctl"] {
            assert_eq!(verdict(&p, allowed, &[]), Verdict::Allow, "{allowed}");
        }
        for denied in [
            "bpf",
            "perf_event_open",
            "mount",
            "umount2",
            "setns",
            "keyctl",
            "add_key",
            "request_key",
            "io_uring_setup",
            "io_uring_enter",
            "userfaultfd",
            "kexec_load",
            "init_module",
            "open_by_handle_at",
            "kcmp",
            "pidfd_getfd",
            "reboot",
            "settimeofday",
            "clock_settime",
            "acct",
            "iopl",
            "syslog",
            "vhangup",
            "mbind",
            "no_such_syscall",
        ] {
            assert_eq!(verdict(&p, denied, &[]), DENIED, "{denied}");
        }
        assert_eq!(verdict(&p, "unshare", &[CLONE_NEWUSER]), DENIED);
        assert_eq!(verdict(&p, "unshare", &[0]), DENIED, "unshare needs CAP_SYS_ADMIN, whatever the flags");
    }

    #[test]
    fn clone_may_not_make_namespaces_and_clone3_says_enosys_without_sys_admin() {
        let p = profile(&caps(DEFAULT_CAPS), &X86);
        assert_eq!(verdict(&p, "clone", &[SIGCHLD]), Verdict::Allow, "fork");
        assert_eq!(verdict(&p, "clone", &[CLONE_THREAD_FLAGS]), Verdict::Allow, "a thread");
        assert_eq!(verdict(&p, "clone", &[CLONE_NEWUSER | SIGCHLD]), DENIED);
        assert_eq!(verdict(&p, "clone", &[CLONE_NEWNET]), DENIED);
        for flag in
            [0x0002_0000, 0x0400_0000, 0x0800_0000, 0x1000_0000, 0x2000_0000, 0x4000_0000, 0x0200_0000]
        {
            assert_eq!(verdict(&p, "clone", &[flag]), DENIED, "clone flag {flag:#x}");
        }
        assert_eq!(verdict(&p, "clone3", &[]), Verdict::Errno(38), "ENOSYS, so glibc falls back to clone");

        let admin = profile(&caps(&["CAP_SYS_ADMIN"]), &X86);
        assert_eq!(verdict(&admin, "clone", &[CLONE_NEWUSER | SIGCHLD]), Verdict::Allow);
        assert_eq!(verdict(&admin, "clone3", &[]), Verdict::Allow);
        assert_eq!(verdict(&admin, "unshare", &[CLONE_NEWUSER]), Verdict::Allow);
        assert_eq!(verdict(&admin, "mount", &[]), Verdict::Allow);
    }

    #[test]
    fn sockets_of_every_family_but_af_alg_and_af_vsock() {
        let p = profile(&[], &X86);
        for family in [1, 2, 10, 16, 17, 37, 39, 41, 44, 45] {
            assert_eq!(verdict(&p, "socket", &[family]), Verdict::Allow, "family {family}");
        }
        assert_eq!(verdict(&p, "socket", &[AF_ALG]), DENIED);
        assert_eq!(verdict(&p, "socket", &[AF_VSOCK]), DENIED);
    }

    #[test]
    fn personality_only_with_the_harmless_arguments() {
        let p = profile(&[], &X86);
        for allowed in [0, 8, 0x20000, 0x20008, 0xffff_ffff] {
            assert_eq!(verdict(&p, "personality", &[allowed]), Verdict::Allow, "{allowed:#x}");
        }
        assert_eq!(verdict(&p, "personality", &[0x0040000]), DENIED, "ADDR_NO_RANDOMIZE");
        assert_eq!(verdict(&p, "personality", &[0x0400000]), DENIED, "READ_IMPLIES_EXEC");
    }

    #[test]
    fn each_capability_syscall_is_allowed_only_with_its_capability() {
        // An unknown kernel: ptrace and process_vm_* then need CAP_SYS_PTRACE too.
        let host = Host { arch: Arch::X86_64, kernel: None };
        let none = profile(&[], &host);
        for (cap, names) in BY_CAPABILITY {
            let with = profile(&caps(&[cap]), &host);
            for name in *names {
                let args: &[u64] = if *name == "clone" { &[CLONE_NEWUSER] } else { &[] };
                assert_ne!(verdict(&none, name, args), Verdict::Allow, "{name} without {cap}");
                assert_eq!(verdict(&with, name, args), Verdict::Allow, "{name} with {cap}");
            }
        }
    }

    #[test]
    fn ptrace_from_linux_4_8_on() {
        let new = profile(&[], &X86);
        let old = profile(&[], &Host { kernel: Some((4, 4)), ..X86 });
        for name in ALLOWED_SINCE_4_8 {
            assert_eq!(verdict(&new, name, &[]), Verdict::Allow, "{name} on 6.18");
            assert_eq!(verdict(&old, name, &[]), DENIED, "{name} on 4.4");
        }
        assert_eq!(kernel_version("6.18.44-fc-v857\n"), Some((6, 18)));
        assert_eq!(kernel_version("4.8-rc1"), Some((4, 8)));
        assert_eq!(kernel_version("garbage"), None);
    }

    #[test]
    fn architectures_and_their_own_syscalls() {
        let x86 = profile(&[], &X86);
        assert_eq!(x86["architectures"], json!(["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"]));
        assert_eq!(verdict(&x86, "modify_ldt", &[]), Verdict::Allow);
        assert_eq!(verdict(&x86, "set_tls", &[]), DENIED);
        let arm = profile(&[], &Host { arch: Arch::Aarch64, ..X86 });
        assert_eq!(arm["architectures"], json!(["SCMP_ARCH_ARM", "SCMP_ARCH_AARCH64"]));
        assert_eq!(verdict(&arm, "set_tls", &[]), Verdict::Allow);
        assert_eq!(verdict(&arm, "arch_prctl", &[]), DENIED);
        let other = profile(&[], &Host { arch: Arch::Other, ..X86 });
        assert!(other.get("architectures").is_none());
        assert_eq!(Arch::of("x86_64"), Arch::X86_64);
        assert_eq!(Arch::of("riscv64"), Arch::Other);
    }

    #[test]
    fn the_table_is_containerds() {
        // A change to the list is a deliberate update to a newer containerd (module docs).
        assert_eq!(ALLOWED.len(), 363, "containerd 301026e5 allows 363 syscalls to every container");
        let mut seen = std::collections::HashSet::new();
        assert!(ALLOWED.iter().all(|n| seen.insert(n)), "a name listed twice");
        for (cap, names) in BY_CAPABILITY {
            for name in *names {
                assert!(!ALLOWED.contains(name), "{name} needs {cap} and is allowed to all");
            }
        }
    }
}
