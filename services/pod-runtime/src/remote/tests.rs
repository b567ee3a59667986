//! PutFiles and RemovePodFiles over a temporary root: every refusal leaves nothing behind,
//! the first put of a key wins, modes and links are as asked.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use hpk_proto::podruntime::v1::{FileEntry, PutFilesRequest, file_entry};

use super::files::{put, remove_pod};
use super::{Error, MAX_MESSAGE};

const UID: &str = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";

fn file(path: &str, content: &str, mode: u32) -> FileEntry {
    FileEntry { path: path.into(), kind: Some(file_entry::Kind::Content(content.into())), mode }
}

fn link(path: &str, target: &str) -> FileEntry {
    FileEntry { path: path.into(), kind: Some(file_entry::Kind::Symlink(target.into())), mode: 0 }
}

fn dir(path: &str, mode: u32) -> FileEntry {
    FileEntry { path: path.into(), kind: Some(file_entry::Kind::Dir(true)), mode }
}

fn tree(key: &str, entries: Vec<FileEntry>) -> PutFilesRequest {
    PutFilesRequest { pod_uid: UID.into(), key: key.into(), directory: true, entries }
}

fn single(key: &str, content: &str, mode: u32) -> PutFilesRequest {
    PutFilesRequest {
        pod_uid: UID.into(),
        key: key.into(),
        directory: false,
        entries: vec![file("", content, mode)],
    }
}

fn mode_of(path: &Path) -> u32 {
    fs::symlink_metadata(path).unwrap().permissions().mode() & 0o7777
}

/// Every name under `dir`, recursively, relative to it.
fn listing(dir: &Path) -> Vec<String> {
    fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
        for entry in fs::read_dir(dir).unwrap() {
            let entry = entry.unwrap();
            out.push(entry.path().strip_prefix(base).unwrap().display().to_string());
            if entry.file_type().unwrap().is_dir() {
                walk(base, &entry.path(), out);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// Asserts `request` is refused as invalid with a message containing `names`, and that
/// nothing was created under `pod_files`.
fn assert_refused(request: &PutFilesRequest, names: &str) {
    let root = tempfile::tempdir().unwrap();
    let pod_files = root.path().join("pod-files");
    match put(&pod_files, request, MAX_MESSAGE) {
        Err(Error::Invalid(message)) => assert!(message.contains(names), "{message:?} should name {names:?}"),
        other => panic!("{request:?} should be refused, got {other:?}"),
    }
    assert!(!pod_files.exists(), "a refused put created {pod_files:?}");
    let status = tonic::Status::from(put(&pod_files, request, MAX_MESSAGE).unwrap_err());
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
}

#[test]
fn bad_pod_uids_are_refused() {
    let long = "a".repeat(65);
    for uid in ["", "ABCDEF", "a_b", "../x", "a/b", "0f1e 2d", long.as_str()] {
        let request = PutFilesRequest { pod_uid: uid.into(), ..single("etc-hosts", "x", 0) };
        assert_refused(&request, "pod_uid");
    }
    let root = tempfile::tempdir().unwrap();
    assert!(matches!(remove_pod(root.path(), "../.."), Err(Error::Invalid(_))));
}

#[test]
fn bad_keys_are_refused() {
    let long = "k".repeat(256);
    for key in ["", "/etc", "a//b", "a/", "./a", "a/..", "..", "a/./b", "a\0b", long.as_str()] {
        assert_refused(&single(key, "x", 0), "key");
    }
}

#[test]
fn a_single_file_put_has_one_entry_with_an_empty_path_and_content() {
    let mut request = single("etc-hosts", "x", 0);
    request.entries.clear();
    assert_refused(&request, "got 0 entries");
    request.entries = vec![file("", "x", 0), file("", "y", 0)];
    assert_refused(&request, "got 2 entries");
    request.entries = vec![file("hosts", "x", 0)];
    assert_refused(&request, "\"hosts\"");
    request.entries = vec![link("", "x")];
    assert_refused(&request, "a symlink");
    request.entries = vec![dir("", 0)];
    assert_refused(&request, "a directory");
    assert_refused(&single("etc-hosts", "x", 0o10000), "mode 0o10000");
}

#[test]
fn bad_entries_are_refused_by_name() {
    let cases = [
        (vec![file("", "x", 0)], "entry \"\": must not be empty"),
        (vec![file("../x", "x", 0)], "entry \"../x\""),
        (vec![file("/x", "x", 0)], "entry \"/x\": must be relative"),
        (vec![file("a/./b", "x", 0)], "entry \"a/./b\""),
        (vec![file("a//b", "x", 0)], "entry \"a//b\": has an empty component"),
        (vec![file("a/", "x", 0)], "entry \"a/\""),
        (vec![file("a\0", "x", 0)], "NUL"),
        (vec![file(&"n".repeat(256), "x", 0)], "longer than 255"),
        (vec![file("ok", "x", 0), file("ok", "y", 0)], "entry \"ok\": listed more than once"),
        (vec![FileEntry { path: "none".into(), kind: None, mode: 0 }], "entry \"none\": has no content"),
        (vec![file("a", "x", 0), file("a/b", "y", 0)], "entry \"a/b\": its parent \"a\" is not a directory"),
        (vec![link("l", "d"), file("l/b", "y", 0)], "its parent \"l\" is not a directory"),
        (vec![dir("d", 0o17777)], "entry \"d\": mode 0o17777"),
        (vec![file("good", "x", 0), file("bad", "x", 0o20000)], "entry \"bad\""),
    ];
    for (entries, message) in cases {
        assert_refused(&tree("vol", entries), message);
    }
}

#[test]
fn symlinks_must_stay_within_the_root() {
    let cases = [
        (vec![link("l", "/etc/passwd")], "entry \"l\": symlink target \"/etc/passwd\" is absolute"),
        (vec![link("l", "../x")], "\"../x\" leads out of the root"),
        (vec![link("sub/l", "../../x")], "leads out of the root"),
        (vec![link("l", "a/../../x")], "leads out of the root"),
        (vec![link("l", "")], "is empty"),
        // Lexically inside, but `d` is a link to the root: `d/..` is its parent.
        (vec![link("d", "."), link("e", "d/..")], "entry \"e\": symlink target \"d/..\" leads out"),
        (vec![link("sub/up", ".."), link("out", "sub/up/..")], "entry \"out\""),
        (vec![link("a", "b"), link("b", "a")], "too many links"),
    ];
    for (entries, message) in cases {
        assert_refused(&tree("vol", entries), message);
    }
}

#[test]
fn content_beyond_the_bound_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let pod_files = root.path().join("pod-files");
    let request = tree("vol", vec![file("a", "12345", 0), file("b", "678901", 0)]);
    let error = put(&pod_files, &request, 10).unwrap_err();
    assert!(error.to_string().contains("11 bytes, more than the 10"), "{error}");
    assert!(!pod_files.exists());
    assert!(put(&pod_files, &request, 11).is_ok());
}

#[test]
fn a_single_file_with_its_mode() {
    let root = tempfile::tempdir().unwrap();
    let pod_files = root.path().join("pod-files");
    let path = put(&pod_files, &single("etc-hosts", "127.0.0.1 localhost\n", 0), MAX_MESSAGE).unwrap();
    assert_eq!(path, pod_files.join(UID).join("etc-hosts"));
    assert_eq!(fs::read_to_string(&path).unwrap(), "127.0.0.1 localhost\n");
    assert_eq!(mode_of(&path), 0o644, "the default");
    let secret = put(&pod_files, &single("token", "s3cr3t", 0o600), MAX_MESSAGE).unwrap();
    assert_eq!(mode_of(&secret), 0o600);
    let open = put(&pod_files, &single("shared", "", 0o666), MAX_MESSAGE).unwrap();
    assert_eq!(mode_of(&open), 0o666, "not cut by the umask");
    assert_eq!((mode_of(&pod_files), mode_of(&pod_files.join(UID))), (0o700, 0o700));
    assert_eq!(listing(&pod_files.join(UID)), ["etc-hosts", "shared", "token"], "no staging left");
}

#[test]
fn a_directory_tree_put_and_read_back() {
    let root = tempfile::tempdir().unwrap();
    let pod_files = root.path().join("pod-files");
    let version = "..2026_11_30_06_01_25.123456789";
    let request = tree(
        "volumes/kubernetes.io~configmap/config",
        vec![
            link("..data", version),
            link("app.conf", "..data/app.conf"),
            link("nested", "..data/nested"),
            file(&format!("{version}/app.conf"), "port = 80\n", 0),
            file(&format!("{version}/nested/deep/run.sh"), "#!/bin/sh\n", 0o755),
            dir(&format!("{version}/nested"), 0o555),
            dir("empty", 0o700),
        ],
    );
    let path = put(&pod_files, &request, MAX_MESSAGE).unwrap();
    assert_eq!(path, pod_files.join(UID).join("volumes/kubernetes.io~configmap/config"));
    assert_eq!(fs::read_to_string(path.join("app.conf")).unwrap(), "port = 80\n", "through two links");
    assert_eq!(fs::read_to_string(path.join("nested/deep/run.sh")).unwrap(), "#!/bin/sh\n");
    assert_eq!(fs::read_link(path.join("..data")).unwrap(), PathBuf::from(version));
    assert_eq!(mode_of(&path), 0o755, "the root");
    assert_eq!(mode_of(&path.join(version)), 0o755, "an implicit parent");
    assert_eq!(mode_of(&path.join(version).join("nested")), 0o555, "read-only, and still filled");
    assert_eq!(mode_of(&path.join(version).join("nested/deep/run.sh")), 0o755);
    assert_eq!(mode_of(&path.join(version).join("app.conf")), 0o644);
    assert_eq!(mode_of(&path.join("empty")), 0o700);
    assert!(fs::read_dir(path.join("empty")).unwrap().next().is_none());
    assert_eq!(mode_of(&pod_files.join(UID).join("volumes")), 0o700, "the key's own parents");
    let beside: Vec<_> =
        fs::read_dir(path.parent().unwrap()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(beside, ["config"], "no staging left");
    let listed = listing(&path);
    assert_eq!(listed.len(), 9, "{listed:?}");
}

#[test]
fn an_empty_directory_put() {
    let root = tempfile::tempdir().unwrap();
    let path = put(root.path(), &tree("empty-dir", vec![]), MAX_MESSAGE).unwrap();
    assert!(path.is_dir() && fs::read_dir(&path).unwrap().next().is_none());
    assert_eq!(mode_of(&path), 0o755);
}

#[test]
fn the_first_put_of_a_key_wins() {
    let root = tempfile::tempdir().unwrap();
    let pod_files = root.path().join("pod-files");
    let first = put(&pod_files, &single("etc-hosts", "first", 0o600), MAX_MESSAGE).unwrap();
    let second = put(&pod_files, &single("etc-hosts", "second", 0o644), MAX_MESSAGE).unwrap();
    assert_eq!(first, second);
    assert_eq!(fs::read_to_string(&first).unwrap(), "first");
    assert_eq!(mode_of(&first), 0o600);

    let a = put(&pod_files, &tree("empty-dir", vec![file("a", "1", 0)]), MAX_MESSAGE).unwrap();
    let b = put(&pod_files, &tree("empty-dir", vec![file("b", "2", 0)]), MAX_MESSAGE).unwrap();
    assert_eq!(a, b);
    assert_eq!(listing(&a), ["a"]);
    assert_eq!(listing(&pod_files.join(UID)), ["empty-dir", "empty-dir/a", "etc-hosts"], "no staging left");
    // A bad request is refused even for a key already stored.
    assert!(matches!(
        put(&pod_files, &single("etc-hosts", "x", 0o70000), MAX_MESSAGE),
        Err(Error::Invalid(_))
    ));
}

#[test]
fn a_failed_write_leaves_no_staging_copy() {
    let root = tempfile::tempdir().unwrap();
    let pod_files = root.path().join("pod-files");
    put(&pod_files, &single("a", "a file", 0), MAX_MESSAGE).unwrap();
    // `a` is a file, so nothing can be stored below it: an I/O error naming the path.
    let error = put(&pod_files, &single("a/b", "x", 0), MAX_MESSAGE).unwrap_err();
    assert!(matches!(error, Error::Io { .. }), "{error:?}");
    assert!(error.to_string().contains(&pod_files.join(UID).join("a").display().to_string()), "{error}");
    assert_eq!(tonic::Status::from(error).code(), tonic::Code::Internal);
    assert_eq!(listing(&pod_files.join(UID)), ["a"]);
}

#[test]
fn a_link_left_in_a_stored_tree_is_not_followed_by_a_later_key() {
    let root = tempfile::tempdir().unwrap();
    let pod_files = root.path().join("pod-files");
    let outside = root.path().join("outside");
    fs::create_dir(&outside).unwrap();
    fs::write(outside.join("there"), "host file").unwrap();
    let volume = put(&pod_files, &tree("empty-dir", vec![]), MAX_MESSAGE).unwrap();
    // A container wrote this into its emptyDir.
    std::os::unix::fs::symlink(&outside, volume.join("x")).unwrap();
    for key in ["empty-dir/x/evil", "empty-dir/x/there"] {
        let error = put(&pod_files, &single(key, "x", 0), MAX_MESSAGE).unwrap_err();
        assert!(error.to_string().contains("is a file or a link"), "{error}");
    }
    assert_eq!(listing(&outside), ["there"], "nothing written out");
    assert_eq!(fs::read_to_string(outside.join("there")).unwrap(), "host file");
}

#[test]
fn remove_pod_files_removes_everything_and_follows_no_link() {
    let root = tempfile::tempdir().unwrap();
    let pod_files = root.path().join("pod-files");
    let outside = root.path().join("outside");
    fs::create_dir(&outside).unwrap();
    fs::write(outside.join("keep"), "kept").unwrap();
    let request = tree("vol", vec![dir("ro", 0o555), file("ro/f", "x", 0o444), link("l", "ro/f")]);
    let path = put(&pod_files, &request, MAX_MESSAGE).unwrap();
    // What a container might leave in a writable volume: a link out.
    std::os::unix::fs::symlink(&outside, path.join("escape")).unwrap();
    put(&pod_files, &single("etc-hosts", "x", 0), MAX_MESSAGE).unwrap();

    remove_pod(&pod_files, UID).unwrap();
    assert!(!pod_files.join(UID).exists());
    assert!(pod_files.exists(), "other pods' files stay");
    assert_eq!(fs::read_to_string(outside.join("keep")).unwrap(), "kept");
    remove_pod(&pod_files, UID).unwrap();
    remove_pod(&root.path().join("never-created"), UID).unwrap();
}
