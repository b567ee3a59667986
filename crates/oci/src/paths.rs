//! The paths of `/proc` and `/sys` a container does not see (masked) or only reads: the
//! runtime's defaults (containerd's lists) and what the kubelet asks for over CRI (the
//! upstream kubelet's lists), side by side.

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

/// Paths read-only by default (containerd's list).
pub const DEFAULT_READONLY: &[&str] =
    &["/proc/asound", "/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"];

/// Paths the kubelet asks the runtime to mask in a container with the default procMount (the
/// upstream kubelet's list; `Unmasked` asks for none).
pub const KUBELET_MASKED: &[&str] = &[
    "/proc/asound",
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];

/// Paths the kubelet asks the runtime to make read-only with the default procMount (the
/// upstream kubelet's list).
pub const KUBELET_READONLY: &[&str] =
    &["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"];
