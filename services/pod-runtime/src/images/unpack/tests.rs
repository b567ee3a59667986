//! Layers built byte by byte (so hostile ones can be built too), unpacked into a real store
//! layout on the test's filesystem.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};

use super::*;
use crate::images::reference::sha256_digest;

enum E<'a> {
    Dir(&'a str, u32),
    File(&'a str, &'a [u8], u32),
    Owned(&'a str, u32, u32),
    Symlink(&'a str, &'a str),
    Link(&'a str, &'a str),
}

/// A tar with the names written verbatim into the headers: `tar::Builder` would refuse `..`.
fn tar_of(entries: &[E<'_>]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for e in entries {
        let mut h = tar::Header::new_gnu();
        let (name, kind, mode, data, link): (&str, _, u32, &[u8], &str) = match e {
            E::Dir(n, m) => (n, tar::EntryType::Directory, *m, b"", ""),
            E::File(n, d, m) => (n, tar::EntryType::Regular, *m, d, ""),
            E::Owned(n, _, _) => (n, tar::EntryType::Regular, 0o640, b"owned", ""),
            E::Symlink(n, t) => (n, tar::EntryType::Symlink, 0o777, b"", t),
            E::Link(n, t) => (n, tar::EntryType::Link, 0o644, b"", t),
        };
        h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
        h.as_old_mut().linkname[..link.len()].copy_from_slice(link.as_bytes());
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_size(data.len() as u64);
        h.set_mtime(1_000_000);
        let (uid, gid) = if let E::Owned(_, u, g) = e { (*u, *g) } else { (0, 0) };
        h.set_uid(u64::from(uid));
        h.set_gid(u64::from(gid));
        h.set_cksum();
        b.append(&h, data).expect("append");
    }
    b.into_inner().expect("finish")
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(data).expect("gzip");
    gz.finish().expect("gzip")
}

struct Fixture {
    _dir: tempfile::TempDir,
    layout: Layout,
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let layout = Layout::create(&dir.path().join("store")).expect("layout");
        Self { _dir: dir, layout }
    }

    /// Unpacks `tar` (gzip'd when asked) with its true diff ID, or `diff_id` if given.
    fn unpack(&self, tar: &[u8], gz: bool, diff_id: Option<&str>) -> (Result<bool>, String) {
        let diff = diff_id.map(str::to_owned).unwrap_or_else(|| sha256_digest(tar));
        let blob = self.layout.root().join("blob");
        fs::write(&blob, if gz { gzip(tar) } else { tar.to_vec() }).expect("blob");
        (unpack(&self.layout, &blob, &diff), diff)
    }

    /// Nothing of a failed unpack is left: no layer directory, nothing in `tmp/`.
    fn assert_nothing_left(&self, diff: &str) {
        assert!(!self.layout.layer(diff).exists(), "half-unpacked layer visible");
        let left: Vec<_> = fs::read_dir(self.layout.tmp()).expect("tmp").collect();
        assert!(left.is_empty(), "left in tmp/: {left:?}");
    }
}

#[test]
fn files_dirs_links_and_modes_survive_gzip_and_plain() {
    let tar = tar_of(&[
        E::Dir("./etc/", 0o755),
        E::File("./etc/passwd", b"root:x:0:0::/:/bin/sh\n", 0o644),
        E::Dir("ro/", 0o555),
        E::File("ro/inner", b"x", 0o400),
        E::File("bin/tool", b"#!/bin/sh\n", 0o4755),
        E::Symlink("bin/sh", "tool"),
        E::Symlink("etc/abs", "/etc/passwd"),
        E::Link("bin/again", "bin/tool"),
    ]);
    for gz in [false, true] {
        let f = Fixture::new();
        let (result, diff) = f.unpack(&tar, gz, None);
        assert!(result.expect("unpacks"), "first unpack does the work");
        let root = f.layout.layer(&diff);
        assert_eq!(fs::read(root.join("etc/passwd")).expect("file"), b"root:x:0:0::/:/bin/sh\n");
        let mode = |p: &str| fs::symlink_metadata(root.join(p)).expect(p).permissions().mode() & 0o7777;
        assert_eq!(mode("ro"), 0o555);
        assert_eq!(mode("ro/inner"), 0o400);
        assert_eq!(mode("bin/tool"), 0o4755, "setuid kept");
        assert_eq!(mode("bin"), 0o755, "implicit parent");
        assert_eq!(mode(""), 0o755, "layer root");
        assert_eq!(fs::read_link(root.join("bin/sh")).expect("link"), Path::new("tool"));
        assert_eq!(fs::read_link(root.join("etc/abs")).expect("link"), Path::new("/etc/passwd"));
        let ino = |p: &str| fs::symlink_metadata(root.join(p)).expect(p).ino();
        assert_eq!(ino("bin/again"), ino("bin/tool"), "hard link");
        assert_eq!(fs::symlink_metadata(root.join("etc/passwd")).expect("meta").mtime(), 1_000_000);
        assert_eq!(fs::symlink_metadata(root.join("ro")).expect("meta").mtime(), 1_000_000);
        assert!(!f.unpack(&tar, gz, None).0.expect("again"), "second unpack is skipped");
        f.assert_nothing_left("sha256:none");
    }
}

#[test]
fn whiteouts_become_devices_and_opaque_dirs_xattrs() {
    let tar = tar_of(&[
        E::File(".wh.gone", b"", 0o644),
        E::Dir("dir/", 0o755),
        E::File("dir/.wh..wh..opq", b"", 0o644),
        E::File("dir/kept", b"k", 0o644),
        E::File(".wh..wh.plnk", b"", 0o644),
    ]);
    let f = Fixture::new();
    let (result, diff) = f.unpack(&tar, true, None);
    result.expect("unpacks");
    let root = f.layout.layer(&diff);
    let gone = fs::symlink_metadata(root.join("gone")).expect("whiteout");
    assert!(gone.file_type().is_char_device());
    assert_eq!(gone.rdev(), 0, "0/0 device");
    assert!(!root.join(".wh.gone").exists());
    let opaque = xattr::get(root.join("dir"), crate::images::OPAQUE_XATTR).expect("xattr");
    assert_eq!(opaque.as_deref(), Some(&b"y"[..]));
    assert!(root.join("dir/kept").exists());
    assert!(!root.join("dir/.wh..wh..opq").exists());
    assert!(!root.join(".wh..wh.plnk").exists() && !root.join("plnk").exists());
}

#[test]
fn hostile_layers_are_refused_and_leave_nothing() {
    let outside = tempfile::tempdir().expect("outside");
    let out = outside.path().to_str().expect("utf-8 temp path");
    let out_file = format!("{out}/pwned");
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("dot-dot", tar_of(&[E::File("a", b"ok", 0o644), E::File("../escape", b"x", 0o644)])),
        ("inner dot-dot", tar_of(&[E::File("a/../../escape", b"x", 0o644)])),
        ("absolute", tar_of(&[E::File("/etc/evil", b"x", 0o644)])),
        ("symlink climbs out", tar_of(&[E::Symlink("a/link", "../../etc")])),
        ("write through symlink", tar_of(&[E::Symlink("evil", out), E::File("evil/pwned", b"x", 0o644)])),
        ("hard link out", tar_of(&[E::Link("h", "../../etc/passwd")])),
        ("hard link to nothing", tar_of(&[E::Link("h", "missing")])),
        ("whiteout of dot-dot", tar_of(&[E::File("a/.wh...", b"", 0o644)])),
    ];
    for (what, tar) in cases {
        let f = Fixture::new();
        let (result, diff) = f.unpack(&tar, true, None);
        let err = result.expect_err(what);
        assert!(matches!(err, Error::UnsafePath { .. }), "{what}: {err}");
        f.assert_nothing_left(&diff);
        assert!(!Path::new(&out_file).exists(), "{what}: wrote outside the layer");
    }
}

#[test]
fn a_wrong_diff_id_is_refused_and_leaves_nothing() {
    let tar = tar_of(&[E::File("a", b"content", 0o644)]);
    let f = Fixture::new();
    let claimed = sha256_digest(b"something else");
    let (result, diff) = f.unpack(&tar, true, Some(&claimed));
    match result.expect_err("wrong diff ID") {
        Error::DigestMismatch { what, expected, actual } => {
            assert_eq!(what, "layer diff ID");
            assert_eq!(expected, claimed);
            assert_eq!(actual, sha256_digest(&tar));
        }
        other => panic!("expected a digest mismatch, got {other}"),
    }
    f.assert_nothing_left(&diff);
}

#[test]
fn owners_are_kept_when_root() {
    if !nix::unistd::geteuid().is_root() {
        hpk_test_support::skipped("owners are only kept when running as root");
        return;
    }
    let f = Fixture::new();
    let (result, diff) = f.unpack(&tar_of(&[E::Owned("srv/data", 1234, 5678)]), false, None);
    result.expect("unpacks");
    let meta = fs::symlink_metadata(f.layout.layer(&diff).join("srv/data")).expect("meta");
    assert_eq!((meta.uid(), meta.gid()), (1234, 5678));
    assert_eq!(meta.permissions().mode() & 0o7777, 0o640);
}
