use std::collections::HashSet;
use std::fs::File;

use super::*;

fn cidr(s: &str) -> PodCidr {
    s.parse().expect("valid CIDR")
}

/// A namespace identity that is alive: the test's own network namespace.
fn live_netns() -> (PathBuf, NetnsId) {
    let path = PathBuf::from("/proc/self/ns/net");
    let id = NetnsId::of(&File::open(&path).expect("open own netns")).expect("stat");
    (path, id)
}

fn alloc(ipam: &mut Ipam, id: &str) -> Result<Allocation> {
    let (path, ns) = live_netns();
    ipam.allocate(id, &path, ns)
}

#[test]
fn never_hands_out_an_address_twice() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut ipam = Ipam::open(dir.path(), cidr("10.1.0.0/28")).expect("open");
    let mut seen = HashSet::new();
    for i in 0..13 {
        let a = alloc(&mut ipam, &format!("s{i}")).expect("allocate");
        assert!(seen.insert(a.address), "{} handed out twice", a.address);
        assert!(ipam.cidr().pod_index(a.address).is_some(), "{} is reserved", a.address);
    }
    assert_eq!(ipam.free(), 0);
    let reserved: HashSet<Ipv4Addr> =
        ["10.1.0.0", "10.1.0.1", "10.1.0.15"].map(|a| a.parse().expect("ip")).into();
    assert!(seen.is_disjoint(&reserved));
}

#[test]
fn exhaustion_is_a_clear_error_and_a_release_makes_room() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut ipam = Ipam::open(dir.path(), cidr("10.1.0.0/30")).expect("open");
    let first = alloc(&mut ipam, "a").expect("the one address");
    let e = alloc(&mut ipam, "b").expect_err("exhausted");
    assert!(matches!(e, Error::Exhausted { .. }));
    assert!(e.to_string().contains("10.1.0.0/30 is exhausted"), "{e}");
    assert_eq!(tonic::Status::from(e).code(), tonic::Code::ResourceExhausted);
    ipam.release("a").expect("release");
    assert_eq!(alloc(&mut ipam, "b").expect("freed address").address, first.address);
}

#[test]
fn allocating_twice_for_one_sandbox_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut ipam = Ipam::open(dir.path(), cidr("10.1.0.0/24")).expect("open");
    alloc(&mut ipam, "a").expect("first");
    let e = alloc(&mut ipam, "a").expect_err("second");
    assert_eq!(tonic::Status::from(e).code(), tonic::Code::AlreadyExists);
    assert_eq!(ipam.list().count(), 1);
}

#[test]
fn releasing_an_unknown_sandbox_is_not_found() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut ipam = Ipam::open(dir.path(), cidr("10.1.0.0/24")).expect("open");
    let e = ipam.release("nope").expect_err("unknown");
    assert_eq!(tonic::Status::from(e).code(), tonic::Code::NotFound);
}

#[test]
fn freed_addresses_are_reused_last() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut ipam = Ipam::open(dir.path(), cidr("10.1.0.0/24")).expect("open");
    let a = alloc(&mut ipam, "a").expect("a");
    ipam.release("a").expect("release");
    let b = alloc(&mut ipam, "b").expect("b");
    assert_ne!(a.address, b.address, "a just-freed address was handed out again at once");
}

#[test]
fn survives_a_restart_without_reallocating() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (a, b) = {
        let mut ipam = Ipam::open(dir.path(), cidr("10.1.0.0/24")).expect("open");
        (alloc(&mut ipam, "a").expect("a"), alloc(&mut ipam, "b").expect("b"))
    };
    let mut ipam = Ipam::open(dir.path(), cidr("10.1.0.0/24")).expect("reopen");
    assert_eq!(ipam.get("a"), Some(&a));
    assert_eq!(ipam.get("b"), Some(&b));
    assert!(ipam.reclaim_vanished().expect("reclaim").is_empty(), "live namespaces were reclaimed");
    let c = alloc(&mut ipam, "c").expect("c");
    assert!(c.address != a.address && c.address != b.address);
    assert!(!dir.path().join("allocations.json.tmp").exists(), "temporary file left behind");
}

#[test]
fn reclaims_addresses_of_vanished_or_replaced_namespaces() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (path, live) = live_netns();
    {
        let mut ipam = Ipam::open(dir.path(), cidr("10.1.0.0/24")).expect("open");
        ipam.allocate("alive", &path, live).expect("alive");
        ipam.allocate("gone", &dir.path().join("no-such-netns"), live).expect("gone");
        ipam.allocate("replaced", &path, NetnsId { ino: live.ino + 1, ..live }).expect("replaced");
    }
    let mut ipam = Ipam::open(dir.path(), cidr("10.1.0.0/24")).expect("reopen");
    let mut freed: Vec<String> =
        ipam.reclaim_vanished().expect("reclaim").into_iter().map(|a| a.sandbox_id).collect();
    freed.sort();
    assert_eq!(freed, ["gone", "replaced"]);
    let ids: Vec<&str> = ipam.list().map(|a| a.sandbox_id.as_str()).collect();
    assert_eq!(ids, ["alive"]);
    drop(ipam);
    let ipam = Ipam::open(dir.path(), cidr("10.1.0.0/24")).expect("reopen again");
    assert_eq!(ipam.list().count(), 1, "the reclaim was not persisted");
}

#[test]
fn refuses_state_of_another_cidr_or_corrupt_state() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let mut ipam = Ipam::open(dir.path(), cidr("10.1.0.0/24")).expect("open");
        alloc(&mut ipam, "a").expect("a");
    }
    let e = Ipam::open(dir.path(), cidr("10.2.0.0/24")).err().expect("other CIDR");
    assert!(e.to_string().contains("from pod CIDR 10.1.0.0/24, not 10.2.0.0/24"), "{e}");
    std::fs::write(dir.path().join("allocations.json"), b"{not json").expect("write");
    let e = Ipam::open(dir.path(), cidr("10.1.0.0/24")).err().expect("corrupt");
    assert!(matches!(e, Error::CorruptState { .. }), "{e}");
}

#[test]
fn an_empty_state_may_change_cidr() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let mut ipam = Ipam::open(dir.path(), cidr("10.1.0.0/24")).expect("open");
        alloc(&mut ipam, "a").expect("a");
        ipam.release("a").expect("release");
    }
    let mut ipam = Ipam::open(dir.path(), cidr("10.2.0.0/24")).expect("new CIDR");
    assert!(alloc(&mut ipam, "b").expect("b").address.to_string().starts_with("10.2.0."));
}

#[test]
fn a_failed_write_changes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut ipam = Ipam::open(dir.path(), cidr("10.1.0.0/24")).expect("open");
    // A directory where the temporary file goes makes the write fail.
    std::fs::create_dir(dir.path().join("allocations.json.tmp")).expect("mkdir");
    let e = alloc(&mut ipam, "a").expect_err("write fails");
    assert!(matches!(e, Error::State { .. }), "{e}");
    assert!(ipam.get("a").is_none());
    assert_eq!(ipam.free(), ipam.cidr().pod_capacity());
}
