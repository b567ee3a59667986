//! The `/proc` files HPK reads for usage figures, parsed once: a process's `stat`, the
//! machine's `/proc/stat`, and the clock-tick and page sizes their counters are in.

/// Clock ticks per second of `/proc`'s time counters (100 when `sysconf` does not say).
pub fn ticks_per_second() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .and_then(|t| u64::try_from(t).ok())
        .filter(|t| *t > 0)
        .unwrap_or(100)
}

/// The size of a memory page, in bytes (4096 when `sysconf` does not say).
pub fn page_size() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .and_then(|t| u64::try_from(t).ok())
        .filter(|t| *t > 0)
        .unwrap_or(4096)
}

/// The fields of `/proc/<pid>/stat` that HPK uses (proc(5) numbers them from 1).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PidStat {
    /// Minor page faults (field 10).
    pub minor_faults: u64,
    /// Major page faults (field 12).
    pub major_faults: u64,
    /// User time, in clock ticks (field 14).
    pub utime: u64,
    /// System time, in clock ticks (field 15).
    pub stime: u64,
    /// User time of reaped children, in clock ticks (field 16).
    pub cutime: u64,
    /// System time of reaped children, in clock ticks (field 17).
    pub cstime: u64,
    /// Start, in clock ticks after boot (field 22).
    pub start_ticks: u64,
    /// Resident set, in pages (field 24).
    pub rss_pages: u64,
}

impl PidStat {
    /// Parses `/proc/<pid>/stat`; the command name (field 2) may hold spaces and parentheses,
    /// so fields are counted from its last `)`. `None` if a field is missing or not a number.
    pub fn parse(text: &str) -> Option<Self> {
        let fields: Vec<&str> = text.rsplit_once(')')?.1.split_whitespace().collect();
        // Field 3 (`state`) is the first after the name; negative counters read as 0.
        let field = |n: usize| -> Option<u64> {
            fields.get(n - 3)?.parse::<i64>().ok().map(|v| v.max(0).unsigned_abs())
        };
        Some(Self {
            minor_faults: field(10)?,
            major_faults: field(12)?,
            utime: field(14)?,
            stime: field(15)?,
            cutime: field(16)?,
            cstime: field(17)?,
            start_ticks: field(22)?,
            rss_pages: field(24)?,
        })
    }

    /// Reads and parses `/proc/<pid>/stat` (`/proc/self/stat` for `None`).
    pub fn read(pid: Option<i32>) -> Option<Self> {
        let path = match pid {
            Some(pid) => format!("/proc/{pid}/stat"),
            None => "/proc/self/stat".to_owned(),
        };
        Self::parse(&std::fs::read_to_string(path).ok()?)
    }
}

/// What `/proc/stat` says of the machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MachineStat {
    /// Busy time of all CPUs (user, nice, system, irq, softirq, steal), in clock ticks.
    pub busy_ticks: Option<u64>,
    /// Boot time, in seconds since the epoch (`btime`).
    pub boot_time: Option<u64>,
}

impl MachineStat {
    /// Parses `/proc/stat`.
    pub fn parse(text: &str) -> Self {
        let mut stat = Self { busy_ticks: None, boot_time: None };
        for line in text.lines() {
            let mut fields = line.split_whitespace();
            match fields.next() {
                Some("cpu") => stat.busy_ticks = busy_ticks(fields),
                Some("btime") => stat.boot_time = fields.next().and_then(|v| v.parse().ok()),
                _ => {}
            }
        }
        stat
    }

    /// Reads and parses `/proc/stat`.
    pub fn read() -> Option<Self> {
        Some(Self::parse(&std::fs::read_to_string("/proc/stat").ok()?))
    }
}

/// The busy ticks of a `cpu` line's counters: user nice system idle iowait irq softirq steal ….
fn busy_ticks<'a>(fields: impl Iterator<Item = &'a str>) -> Option<u64> {
    let values: Vec<u64> = fields.map(str::parse).collect::<Result<_, _>>().ok()?;
    if values.len() < 4 {
        return None;
    }
    let at = |i: usize| values.get(i).copied().unwrap_or(0);
    Some([0, 1, 2, 5, 6, 7].into_iter().map(at).fold(0, u64::saturating_add))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pid_stat_is_read_after_a_name_with_spaces_and_parentheses() {
        let text = "42 (we (ird) name) S 1 42 42 0 -1 4194560 7 0 3 0 11 5 2 1 20 0 1 0 900 10000000 25 \
                    18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0";
        let stat = PidStat::parse(text).expect("parses");
        assert_eq!(
            stat,
            PidStat {
                minor_faults: 7,
                major_faults: 3,
                utime: 11,
                stime: 5,
                cutime: 2,
                cstime: 1,
                start_ticks: 900,
                rss_pages: 25,
            }
        );
        assert_eq!(PidStat::parse("42 (short) S 1 2"), None, "too few fields");
    }

    #[test]
    fn the_machine_stat_sums_busy_time_and_reads_the_boot_time() {
        let stat = MachineStat::parse("cpu  10 1 5 1000 7 2 3 4 0 0\ncpu0 1 1 1 1\nbtime 1700000000\n");
        assert_eq!(stat.busy_ticks, Some(10 + 1 + 5 + 2 + 3 + 4));
        assert_eq!(stat.boot_time, Some(1_700_000_000));
        assert_eq!(MachineStat::parse("cpu 1 2\n").busy_ticks, None, "a short cpu line");
    }

    #[test]
    fn this_process_reads_its_own_stat() {
        let own = PidStat::read(None).expect("/proc/self/stat");
        assert!(own.rss_pages > 0);
        assert!(ticks_per_second() > 0 && page_size() >= 4096);
    }
}
