//! A layer of files owned by other users, unpacked in a bubble that maps one ID: the test
//! binary runs the test again (as [`child_unpacks`]) inside `unshare --user --map-root-user`,
//! as `nobody` when the test runs as root, so the child is root of a user namespace whose
//! only ID is a plain host user, as in a one-ID bubble. Its store lies on the root disk
//! (`/var/tmp`), which takes user xattrs; tmpfs may not.

use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;

use super::*;
use crate::images::OVERRIDE_XATTR;
use crate::images::reference::sha256_digest;

const BLOB: &str = "HPK_TEST_ONE_ID_BLOB";
const STORE: &str = "HPK_TEST_ONE_ID_STORE";
use crate::one_id::NOBODY;

/// `(path, type, mode, uid, gid, link target)`; devices are 1:3.
type Entry = (&'static str, tar::EntryType, u32, u32, u32, &'static str);

/// An agnhost-, nginx- and postgres-like layer: what most real images hold.
const LAYER: &[Entry] = {
    use tar::EntryType::{Block, Char, Directory, Fifo, Regular, Symlink};
    &[
        ("etc/", Directory, 0o755, 0, 0, ""),
        ("etc/passwd", Regular, 0o644, 0, 0, ""),
        ("home/user-defined-in-image/", Directory, 0o755, 1000, 50000, ""),
        ("home/user-defined-in-image/notes", Regular, 0o640, 1000, 50000, ""),
        ("var/cache/nginx/", Directory, 0o700, 101, 101, ""),
        ("srv/shared/", Directory, 0o2775, 1000, 50000, ""),
        ("srv/tool", Regular, 0o4755, 1000, 50000, ""),
        ("srv/sticky/", Directory, 0o1777, 999, 999, ""),
        ("srv/link", Symlink, 0o777, 101, 101, "tool"),
        ("run/fifo", Fifo, 0o600, 101, 101, ""),
        ("dev/null", Char, 0o666, 0, 0, ""),
        ("dev/sda", Block, 0o660, 0, 6, ""),
    ]
};

fn layer_tar() -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, kind, mode, uid, gid, link) in LAYER {
        let data: &[u8] = if *kind == tar::EntryType::Regular { b"content" } else { b"" };
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(*kind);
        h.set_mode(*mode);
        h.set_uid(u64::from(*uid));
        h.set_gid(u64::from(*gid));
        h.set_size(data.len() as u64);
        h.set_mtime(1_000_000);
        if matches!(kind, tar::EntryType::Char | tar::EntryType::Block) {
            h.set_device_major(1).expect("major");
            h.set_device_minor(3).expect("minor");
        }
        if !link.is_empty() {
            h.set_link_name(link).expect("link");
        }
        h.set_path(name).expect("path");
        h.set_cksum();
        b.append(&h, data).expect("append");
    }
    b.into_inner().expect("finish")
}

/// The child's part (the test itself, run again inside the namespace with [`BLOB`] and
/// [`STORE`] set): unpacks the blob into the store the parent named.
fn child_unpacks(blob: &std::ffi::OsStr, store: &std::ffi::OsStr) {
    let uid_map = fs::read_to_string("/proc/self/uid_map").expect("uid_map");
    let ids = crate::idmap::IdMap::parse(&uid_map).expect("parses");
    assert_eq!(ids.len(), 1, "the child maps one ID: {uid_map}");
    let layout = Layout::create(Path::new(store)).expect("layout");
    let tar = fs::read(blob).expect("blob");
    unpack(&layout, Path::new(blob), &sha256_digest(&tar)).expect("a layer of other users' files unpacks");
}

/// Runs [`child_unpacks`] in a one-ID namespace; `None` when this machine does not let users
/// make user namespaces. Gives the child's host uid.
fn run_child(blob: &Path, store: &Path) -> Option<u32> {
    let (prefix, host_uid) = crate::one_id::prefix(&[]);
    crate::one_id::rerun(
        &prefix,
        module_path!(),
        "unpacks_in_a_one_id_bubble",
        &[(BLOB, blob.as_os_str()), (STORE, store.as_os_str())],
    )?;
    Some(host_uid)
}

#[test]
fn unpacks_in_a_one_id_bubble() {
    if let (Some(blob), Some(store)) = (std::env::var_os(BLOB), std::env::var_os(STORE)) {
        return child_unpacks(&blob, &store);
    }
    let dir = tempfile::tempdir_in("/var/tmp").expect("tempdir on the root disk");
    let tar = layer_tar();
    let blob = dir.path().join("blob");
    fs::write(&blob, &tar).expect("blob");
    let work = dir.path().join("child");
    fs::create_dir(&work).expect("child's dir");
    if nix::unistd::geteuid().is_root() {
        std::os::unix::fs::chown(&work, Some(NOBODY), Some(NOBODY)).expect("chown to nobody");
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    let store = work.join("store");
    let Some(host_uid) = run_child(&blob, &store) else {
        hpk_test_support::skip("this machine does not let a user make a user namespace (unshare --user)");
        return;
    };
    let root = Layout::create(&store).expect("layout").layer(&sha256_digest(&tar));
    check_kept_and_recorded(&root, host_uid);
}

/// What the one-ID child left: every entry but the devices, modes as asked, owned by the
/// child's host user, intended owners in the xattr of files and directories.
fn check_kept_and_recorded(root: &Path, host_uid: u32) {
    for (name, kind, mode, uid, gid, _) in LAYER {
        let path = root.join(name);
        let meta = fs::symlink_metadata(&path);
        if matches!(kind, tar::EntryType::Char | tar::EntryType::Block) {
            assert!(meta.is_err(), "{name}: a device node cannot be made in a user namespace");
            continue;
        }
        let meta = meta.unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(meta.uid(), host_uid, "{name} is the bubble user's");
        let recorded = xattr::get(&path, OVERRIDE_XATTR).expect("xattr");
        match kind {
            tar::EntryType::Symlink => {
                assert!(meta.file_type().is_symlink(), "{name}");
                assert_eq!(fs::read_link(&path).expect("link"), Path::new("tool"));
                assert_eq!(recorded, None, "{name}: symlinks take no user xattrs");
            }
            tar::EntryType::Fifo => {
                assert!(meta.file_type().is_fifo(), "{name}");
                assert_eq!(meta.permissions().mode() & 0o7777, *mode, "{name}");
                assert_eq!(recorded, None, "{name}: FIFOs take no user xattrs");
            }
            _ => {
                assert_eq!(meta.permissions().mode() & 0o7777, *mode, "{name}: mode kept");
                let wanted = (*uid != 0 || *gid != 0).then(|| format!("{uid}:{gid}:0{mode:o}").into_bytes());
                assert_eq!(recorded, wanted, "{name}: the intended owner is recorded (only where not kept)");
            }
        }
    }
    assert_eq!(fs::read(root.join("srv/tool")).expect("file"), b"content");
}

#[test]
fn real_root_still_chowns_for_real() {
    if !nix::unistd::geteuid().is_root()
        || !crate::idmap::IdMappings::read().is_ok_and(|ids| ids.uid_mapped(50000))
    {
        hpk_test_support::skipped("only real root (with IDs 0-50000 mapped) gives files other owners");
        return;
    }
    let dir = tempfile::tempdir_in("/var/tmp").expect("tempdir on the root disk");
    let layout = Layout::create(&dir.path().join("store")).expect("layout");
    let tar = layer_tar();
    let blob = dir.path().join("blob");
    fs::write(&blob, &tar).expect("blob");
    unpack(&layout, &blob, &sha256_digest(&tar)).expect("unpacks");
    let root = layout.layer(&sha256_digest(&tar));
    for (name, kind, mode, uid, gid, _) in LAYER {
        let path = root.join(name);
        let meta = fs::symlink_metadata(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!((meta.uid(), meta.gid()), (*uid, *gid), "{name}: owned as the layer says");
        assert_eq!(xattr::get(&path, OVERRIDE_XATTR).expect("xattr"), None, "{name}: nothing to record");
        if *kind != tar::EntryType::Symlink {
            assert_eq!(meta.permissions().mode() & 0o7777, *mode, "{name}: mode kept");
        }
        if *kind == tar::EntryType::Char {
            assert!(meta.file_type().is_char_device() && meta.rdev() == nix::sys::stat::makedev(1, 3));
        }
    }
}
