//! Which user and group IDs exist in this process's user namespace.
//!
//! A bubble maps either one ID (its user, root inside: `/proc/self/uid_map` reads `0 <uid> 1`)
//! or several (`0 <uid> 1` plus a range from `/etc/subuid` through newuidmap). An ID outside
//! the mapping can neither own a file nor run a process here: chown, setuid and setgid fail
//! with EINVAL. [`IdMap::parse`] is pure; [`IdMappings::read_from`] is the seam that tests
//! point at a directory of their own. The pod-runtime (image ownership, container users) and
//! the kubelet (the pod's events, fsGroup) run in the same bubble and read the same maps.

use std::fmt;
use std::path::{Path, PathBuf};

/// Result of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why the mappings could not be read.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file could not be read.
    #[error("reading {path}")]
    Read {
        /// `…/uid_map` or `…/gid_map`.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a kernel ID map.
    #[error("{path} is not an ID map")]
    Parse {
        /// `…/uid_map` or `…/gid_map`.
        path: PathBuf,
        /// The line at fault.
        #[source]
        source: BadLine,
    },
}

/// A line of an ID map that does not read as `INSIDE OUTSIDE COUNT`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line} {text:?}: {reason}")]
pub struct BadLine {
    /// Its number, from 1.
    pub line: usize,
    /// The line.
    pub text: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

/// `count` IDs from `inside` in this namespace, which are `outside…` in the parent's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdRange {
    /// The first ID here.
    pub inside: u32,
    /// What it is in the parent namespace.
    pub outside: u32,
    /// How many IDs follow, at least 1.
    pub count: u32,
}

impl IdRange {
    fn contains(&self, id: u32) -> bool {
        id >= self.inside && id - self.inside < self.count
    }
}

/// One `uid_map` or `gid_map`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IdMap {
    ranges: Vec<IdRange>,
}

impl IdMap {
    /// Parses the kernel's format: one `INSIDE OUTSIDE COUNT` per line, blank-separated.
    pub fn parse(text: &str) -> Result<Self, BadLine> {
        let mut ranges = Vec::new();
        for (i, raw) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
            let bad = |reason| BadLine { line: i + 1, text: raw.to_owned(), reason };
            let fields: Vec<&str> = raw.split_whitespace().collect();
            let [inside, outside, count] = fields[..] else {
                return Err(bad("three numbers expected"));
            };
            let number = |s: &str| s.parse::<u32>().map_err(|_| bad("not a 32-bit ID"));
            let range = IdRange { inside: number(inside)?, outside: number(outside)?, count: number(count)? };
            if range.count == 0 {
                return Err(bad("a range of no IDs"));
            }
            ranges.push(range);
        }
        Ok(Self { ranges })
    }

    /// A map of the IDs `inside..inside+count`; for tests and callers that know better.
    pub fn of(ranges: &[IdRange]) -> Self {
        Self { ranges: ranges.to_vec() }
    }

    /// Whether `id` exists here.
    pub fn contains(&self, id: u32) -> bool {
        self.ranges.iter().any(|r| r.contains(id))
    }

    /// How many IDs exist here.
    pub fn len(&self) -> u64 {
        self.ranges.iter().map(|r| u64::from(r.count)).sum()
    }

    /// Whether no ID exists here (a namespace whose map was never written).
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// What `id` is in the parent namespace.
    pub fn outside(&self, id: u32) -> Option<u32> {
        self.ranges.iter().find(|r| r.contains(id)).map(|r| r.outside + (id - r.inside))
    }

    /// The ID a process falls back to when its own is not mapped: 0 when it exists, else the
    /// first mapped one.
    pub fn fallback(&self) -> u32 {
        if self.contains(0) { 0 } else { self.ranges.first().map_or(0, |r| r.inside) }
    }
}

impl fmt::Display for IdMap {
    /// `0, 1-65536`: the IDs that exist here.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.ranges.iter().enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            match r.count {
                1 => write!(f, "{sep}{}", r.inside)?,
                n => write!(f, "{sep}{}-{}", r.inside, u64::from(r.inside) + u64::from(n) - 1)?,
            }
        }
        Ok(())
    }
}

/// A namespace's user and group mappings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdMappings {
    /// `uid_map`.
    pub uids: IdMap,
    /// `gid_map`.
    pub gids: IdMap,
}

impl IdMappings {
    /// This process's mappings, from `/proc/self`.
    pub fn read() -> Result<Self> {
        Self::read_from(Path::new("/proc/self"))
    }

    /// The mappings in `dir/uid_map` and `dir/gid_map` (`/proc/<pid>`, or a test's directory).
    pub fn read_from(dir: &Path) -> Result<Self> {
        let one = |name: &str| -> Result<IdMap> {
            let path = dir.join(name);
            let text = std::fs::read_to_string(&path)
                .map_err(|source| Error::Read { path: path.clone(), source })?;
            IdMap::parse(&text).map_err(|source| Error::Parse { path, source })
        };
        Ok(Self { uids: one("uid_map")?, gids: one("gid_map")? })
    }

    /// From the text of both maps (tests, and callers that read them elsewhere).
    pub fn from_text(uid_map: &str, gid_map: &str) -> Result<Self> {
        let parse = |name: &str, text: &str| {
            IdMap::parse(text).map_err(|source| Error::Parse { path: PathBuf::from(name), source })
        };
        Ok(Self { uids: parse("uid_map", uid_map)?, gids: parse("gid_map", gid_map)? })
    }

    /// Whether user `uid` exists here.
    pub fn uid_mapped(&self, uid: u32) -> bool {
        self.uids.contains(uid)
    }

    /// Whether group `gid` exists here.
    pub fn gid_mapped(&self, gid: u32) -> bool {
        self.gids.contains(gid)
    }

    /// Whether exactly one user and one group exist here (the bubble's user).
    pub fn is_one_id(&self) -> bool {
        self.uids.len() == 1 && self.gids.len() == 1
    }
}

impl fmt::Display for IdMappings {
    /// `one ID (0 → host uid 1000, gid 1000)`, or `several IDs (65537)`, for `crictl info`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (uids, gids) = (self.uids.len(), self.gids.len());
        if self.is_one_id() {
            let inside = self.uids.fallback();
            let host_uid = self.uids.outside(inside).unwrap_or(inside);
            let host_gid = self.gids.outside(self.gids.fallback()).unwrap_or(inside);
            return write!(f, "one ID ({inside} → host uid {host_uid}, gid {host_gid})");
        }
        match (uids, gids) {
            (0, 0) => write!(f, "no IDs"),
            (u, g) if u == g => write!(f, "several IDs ({u})"),
            (u, g) => write!(f, "several IDs ({u} users, {g} groups)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(uid_map: &str, gid_map: &str) -> IdMappings {
        IdMappings {
            uids: IdMap::parse(uid_map).expect("uid_map"),
            gids: IdMap::parse(gid_map).expect("gid_map"),
        }
    }

    #[test]
    fn kernel_maps_parse_into_ranges() {
        let map = IdMap::parse("         0       1000          1\n         1     100000      65536\n")
            .expect("parses");
        assert_eq!(
            map,
            IdMap::of(&[
                IdRange { inside: 0, outside: 1000, count: 1 },
                IdRange { inside: 1, outside: 100000, count: 65536 },
            ])
        );
        assert_eq!(map.len(), 65537);
        assert_eq!(map.to_string(), "0, 1-65536");
        assert_eq!(map.outside(1000), Some(100999));
        let initial = IdMap::parse("0 0 4294967295\n").expect("the initial namespace");
        assert!(initial.contains(4294967294) && !initial.contains(u32::MAX));
        assert_eq!(IdMap::parse("").expect("empty"), IdMap::default(), "a map never written");
    }

    #[test]
    fn malformed_lines_are_refused_with_their_number() {
        for (text, reason) in [
            ("0 1000\n", "three numbers expected"),
            ("0 1000 1 7\n", "three numbers expected"),
            ("0 -1 1\n", "not a 32-bit ID"),
            ("0 x 1\n", "not a 32-bit ID"),
            ("0 1000 0\n", "a range of no IDs"),
        ] {
            let err = IdMap::parse(&format!("1 100000 65536\n{text}")).expect_err(text);
            assert_eq!((err.line, err.reason), (2, reason), "{text:?}");
        }
    }

    #[test]
    fn one_id_maps_only_the_bubble_user() {
        let one = ids("0 1000 1\n", "0 1000 1\n");
        assert!(one.is_one_id());
        assert!(one.uid_mapped(0) && one.gid_mapped(0));
        for id in [1, 101, 999, 1000, 50000, 65534] {
            assert!(!one.uid_mapped(id) && !one.gid_mapped(id), "{id}");
        }
        assert_eq!(one.to_string(), "one ID (0 → host uid 1000, gid 1000)");
        assert_eq!(ids("0 0 1", "0 0 1").to_string(), "one ID (0 → host uid 0, gid 0)");
    }

    #[test]
    fn several_ids_map_the_subordinate_range() {
        let several = ids("0 1000 1\n1 100000 65536\n", "0 1000 1\n1 100000 65536\n");
        assert!(!several.is_one_id());
        for id in [0, 1, 101, 1000, 50000, 65536] {
            assert!(several.uid_mapped(id) && several.gid_mapped(id), "{id}");
        }
        assert!(!several.uid_mapped(65537) && !several.gid_mapped(100000));
        assert_eq!(several.to_string(), "several IDs (65537)");
        assert_eq!(ids("0 0 65537", "0 0 1000").to_string(), "several IDs (65537 users, 1000 groups)");
    }

    #[test]
    fn fallback_is_root_when_mapped() {
        assert_eq!(IdMap::parse("0 1000 1").expect("map").fallback(), 0);
        assert_eq!(IdMap::parse("1000 1000 1").expect("map").fallback(), 1000, "no root here");
    }

    #[test]
    fn mappings_are_read_from_a_directory() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("uid_map"), "0 1000 1\n").expect("uid_map");
        assert!(matches!(IdMappings::read_from(dir.path()), Err(Error::Read { .. })), "no gid_map");
        std::fs::write(dir.path().join("gid_map"), "0 1000\n").expect("gid_map");
        let err = IdMappings::read_from(dir.path()).expect_err("bad gid_map");
        assert!(matches!(&err, Error::Parse { path, .. } if path.ends_with("gid_map")), "{err}");
        std::fs::write(dir.path().join("gid_map"), "0 1000 1\n").expect("gid_map");
        assert!(IdMappings::read_from(dir.path()).expect("reads").is_one_id());
        IdMappings::read().expect("this process's own mappings");
    }
}
