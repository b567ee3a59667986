//! The paths of `/proc` and `/sys` a container does not see (masked) or only reads.

/// Paths masked by default, as containerd masks them.
pub const DEFAULT_MASKED: &[&str] = &[
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/sys/firmware",
    "/proc/scsi",
];

/// Paths read-only by default.
pub const DEFAULT_READONLY: &[&str] =
    &["/proc/asound", "/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"];
