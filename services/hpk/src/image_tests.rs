use std::io::Write;

use super::*;

/// A layer: (path, contents or None for a directory) entries, gzip'd.
fn layer(entries: &[(&str, Option<&str>)]) -> (Vec<u8>, String) {
    let mut builder = tar::Builder::new(Vec::new());
    for (path, contents) in entries {
        let mut header = tar::Header::new_gnu();
        match contents {
            Some(text) => {
                header.set_entry_type(tar::EntryType::Regular);
                header.set_size(text.len() as u64);
                header.set_mode(0o644);
                builder.append_data(&mut header, path, text.as_bytes()).expect("append");
            }
            None => {
                header.set_entry_type(tar::EntryType::Directory);
                header.set_size(0);
                header.set_mode(0o755);
                builder.append_data(&mut header, path, std::io::empty()).expect("append");
            }
        }
    }
    let raw = builder.into_inner().expect("tar");
    let diff_id = format!("sha256:{}", hex::encode(Sha256::digest(&raw)));
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&raw).expect("gzip");
    (gz.finish().expect("gzip"), diff_id)
}

fn put(layout: &Path, bytes: &[u8]) -> String {
    let hex = hex::encode(Sha256::digest(bytes));
    std::fs::write(layout.join("blobs/sha256").join(&hex), bytes).expect("write blob");
    format!("sha256:{hex}")
}

/// Writes the blobs of an image of `layers` for linux/`arch` into `dir` (a layout); returns
/// the layer digests and the manifest's descriptor, its platform included.
fn image_for(dir: &Path, layers: &[(Vec<u8>, String)], arch: &str) -> (Vec<String>, serde_json::Value) {
    std::fs::create_dir_all(dir.join("blobs/sha256")).expect("mkdir");
    std::fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).expect("write");
    let digests: Vec<String> = layers.iter().map(|(b, _)| put(dir, b)).collect();
    let config = serde_json::json!({
        "architecture": arch, "os": "linux",
        "rootfs": {"type": "layers", "diff_ids": layers.iter().map(|(_, d)| d.clone()).collect::<Vec<_>>()}
    })
    .to_string();
    let config_digest = put(dir, config.as_bytes());
    let manifest = serde_json::json!({
        "schemaVersion": 2, "mediaType": MANIFEST,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": config.len()},
        "layers": layers.iter().zip(&digests).map(|((b, _), d)| serde_json::json!({
            "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": d, "size": b.len()
        })).collect::<Vec<_>>()
    })
    .to_string();
    let manifest_digest = put(dir, manifest.as_bytes());
    let descriptor = serde_json::json!({
        "mediaType": MANIFEST, "digest": manifest_digest, "size": manifest.len(),
        "platform": {"architecture": arch, "os": "linux"}
    });
    (digests, descriptor)
}

/// Writes an image layout with `layers` (amd64, index.json's entry without a platform, as
/// older builds wrote it); returns the layer digests.
fn layout(dir: &Path, layers: &[(Vec<u8>, String)]) -> Vec<String> {
    let (digests, mut descriptor) = image_for(dir, layers, "amd64");
    descriptor.as_object_mut().expect("object").remove("platform");
    let index = serde_json::json!({"schemaVersion": 2, "manifests": [descriptor]});
    std::fs::write(dir.join("index.json"), index.to_string()).expect("write index");
    digests
}

/// The architecture this test runs on, and another one.
fn here_and_other() -> (String, &'static str) {
    let here = hpk_oci::platform::architecture();
    let other = if here == "arm64" { "amd64" } else { "arm64" };
    (here, other)
}

#[test]
fn a_multi_platform_layout_unpacks_this_machines_image() {
    let (here, other) = here_and_other();
    let dir = tempfile::tempdir().expect("tempdir");
    let image = dir.path().join("image");
    // The other architecture first, so that taking the first entry would be caught.
    let (_, theirs) = image_for(&image, &[layer(&[("arch", Some(other))])], other);
    let (_, ours) = image_for(&image, &[layer(&[("arch", Some(&here))])], &here);
    let index = serde_json::json!({"schemaVersion": 2, "mediaType": INDEX, "manifests": [theirs, ours]});
    std::fs::write(image.join("index.json"), index.to_string()).expect("write index");
    let unpacked = unpack(&image, &dir.path().join("cache")).expect("unpack");
    assert_eq!(std::fs::read_to_string(unpacked.rootfs.join("arch")).expect("arch"), here);
    assert_eq!(unpacked.digest, ours["digest"].as_str().expect("digest"));

    // The same two behind one nested index, as `skopeo copy --all` writes a layout.
    let nested = dir.path().join("nested");
    let (_, theirs) = image_for(&nested, &[layer(&[("arch", Some(other))])], other);
    let (_, ours) = image_for(&nested, &[layer(&[("arch", Some(&here))])], &here);
    let inner =
        serde_json::json!({"schemaVersion": 2, "mediaType": INDEX, "manifests": [theirs, ours]}).to_string();
    let inner_digest = put(&nested, inner.as_bytes());
    let index = serde_json::json!({"schemaVersion": 2, "manifests": [
        {"mediaType": INDEX, "digest": inner_digest, "size": inner.len()}
    ]});
    std::fs::write(nested.join("index.json"), index.to_string()).expect("write index");
    let unpacked = unpack(&nested, &dir.path().join("cache")).expect("unpack nested");
    assert_eq!(std::fs::read_to_string(unpacked.rootfs.join("arch")).expect("arch"), here);
}

#[test]
fn an_image_of_another_architecture_is_refused_by_name() {
    let (here, other) = here_and_other();
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = dir.path().join("cache");
    // Listed with its platform: refused from the index, naming what it has.
    let listed = dir.path().join("listed");
    let (_, theirs) = image_for(&listed, &[layer(&[("f", Some("x"))])], other);
    std::fs::write(listed.join("index.json"), serde_json::json!({"manifests": [theirs]}).to_string())
        .expect("write index");
    let err = unpack(&listed, &cache).expect_err("another architecture").to_string();
    assert!(
        err.contains(&format!("no image for linux/{here}")) && err.contains(&format!("linux/{other}")),
        "{err}"
    );
    assert!(err.contains(&format!("make dist ARCH={here}")), "{err}");
    // Listed without a platform: refused from its config, before any layer is unpacked.
    let bare = dir.path().join("bare");
    let (_, mut theirs) = image_for(&bare, &[layer(&[("f", Some("x"))])], other);
    theirs.as_object_mut().expect("object").remove("platform");
    std::fs::write(bare.join("index.json"), serde_json::json!({"manifests": [theirs]}).to_string())
        .expect("write index");
    let err = unpack(&bare, &cache).expect_err("another architecture").to_string();
    assert!(err.contains(&format!("the image is for linux/{other}; this machine is linux/{here}")), "{err}");
    let left: Vec<_> =
        std::fs::read_dir(&cache).expect("cache").flatten().filter(|e| e.file_name() != ".lock").collect();
    assert!(left.is_empty(), "nothing unpacked: {left:?}");
}

#[test]
fn layers_apply_in_order_with_whiteouts_and_mount_points() {
    let dir = tempfile::tempdir().expect("tempdir");
    let image = dir.path().join("image");
    let lower = layer(&[
        ("etc/", None),
        ("etc/a", Some("lower")),
        ("opt/", None),
        ("opt/old", Some("x")),
        ("gone", Some("y")),
    ]);
    let upper = layer(&[
        ("etc/a", Some("upper")),
        ("opt/.wh..wh..opq", Some("")),
        ("opt/new", Some("n")),
        (".wh.gone", Some("")),
    ]);
    layout(&image, &[lower, upper]);
    let cache = dir.path().join("cache");
    let unpacked = unpack(&image, &cache).expect("unpack");
    let root = &unpacked.rootfs;
    assert_eq!(std::fs::read_to_string(root.join("etc/a")).expect("etc/a"), "upper");
    assert!(!root.join("opt/old").exists(), "the opaque directory hides the lower layer's files");
    assert!(root.join("opt/new").is_file());
    assert!(!root.join("gone").exists(), "the whiteout removes the file");
    for dir in MOUNT_POINTS {
        assert!(root.join(dir).is_dir(), "{dir} is created for the bubble's mounts");
    }
    // A second unpack of the same manifest reuses the first.
    let again = unpack(&image, &cache).expect("unpack again");
    assert_eq!(again.rootfs, unpacked.rootfs);
}

#[test]
fn a_corrupt_blob_is_refused_and_leaves_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let image = dir.path().join("image");
    let digests = layout(&image, &[layer(&[("file", Some("content"))])]);
    let blob = image.join("blobs/sha256").join(digests[0].trim_start_matches("sha256:"));
    let mut bytes = std::fs::read(&blob).expect("read");
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&blob, bytes).expect("write");
    let cache = dir.path().join("cache");
    let err = unpack(&image, &cache).expect_err("a corrupt layer must be refused").to_string();
    assert!(err.contains("corrupt"), "{err}");
    let left: Vec<_> =
        std::fs::read_dir(&cache).expect("cache").flatten().filter(|e| e.file_name() != ".lock").collect();
    assert!(left.is_empty(), "nothing half-unpacked stays in the cache: {left:?}");
}

#[test]
fn a_layer_whose_content_differs_from_its_diff_id_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let image = dir.path().join("image");
    let (bytes, _) = layer(&[("file", Some("content"))]);
    layout(&image, &[(bytes, format!("sha256:{}", "0".repeat(64)))]);
    let err = unpack(&image, &dir.path().join("cache")).expect_err("refused").to_string();
    assert!(err.contains("uncompressed digest"), "{err}");
}

#[test]
fn missing_or_malformed_images_name_the_problem() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = dir.path().join("cache");
    let err = unpack(&dir.path().join("nope"), &cache).expect_err("missing").to_string();
    assert!(err.contains("make images"), "{err}");
    let garbage = dir.path().join("garbage.tar");
    std::fs::write(&garbage, b"this is not a tar archive at all, just some text").expect("write");
    let err = unpack(&garbage, &cache).expect_err("garbage").to_string();
    assert!(err.contains("image"), "{err}");
    let empty = dir.path().join("empty");
    std::fs::create_dir_all(&empty).expect("mkdir");
    std::fs::write(empty.join("index.json"), "{\"manifests\": []}").expect("write");
    let err = unpack(&empty, &cache).expect_err("empty index").to_string();
    assert!(err.contains("lists no manifests"), "{err}");
}

#[test]
fn entries_leaving_the_root_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let image = dir.path().join("image");
    // tar::Builder refuses ".." paths, so write the name into the header by hand.
    let mut header = tar::Header::new_gnu();
    header.as_gnu_mut().expect("gnu").name[..9].copy_from_slice(b"../escape");
    header.set_entry_type(tar::EntryType::Regular);
    header.set_size(1);
    header.set_mode(0o644);
    header.set_cksum();
    let mut raw = Vec::new();
    raw.extend_from_slice(header.as_bytes());
    let mut data = [0u8; 512];
    data[0] = b'x';
    raw.extend_from_slice(&data);
    raw.extend_from_slice(&[0u8; 1024]);
    let diff_id = format!("sha256:{}", hex::encode(Sha256::digest(&raw)));
    layout(&image, &[(raw, diff_id)]);
    let err = unpack(&image, &dir.path().join("cache")).expect_err("refused").to_string();
    assert!(err.contains("leaves the root"), "{err}");
    assert!(!dir.path().join("escape").exists());
}

/// A layer of symlinks (path, target) and whiteouts (`.wh.` names, empty files), gzip'd.
fn link_layer(links: &[(&str, &str)], files: &[&str]) -> (Vec<u8>, String) {
    let mut builder = tar::Builder::new(Vec::new());
    for (path, target) in links {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Symlink);
        header.set_size(0);
        header.set_mode(0o777);
        builder.append_link(&mut header, path, target).expect("append link");
    }
    for path in files {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Regular);
        header.set_size(0);
        header.set_mode(0o644);
        builder.append_data(&mut header, path, std::io::empty()).expect("append");
    }
    let raw = builder.into_inner().expect("tar");
    let diff_id = format!("sha256:{}", hex::encode(Sha256::digest(&raw)));
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&raw).expect("gzip");
    (gz.finish().expect("gzip"), diff_id)
}

#[test]
fn whiteouts_never_reach_through_a_link_out_of_the_root() {
    let dir = tempfile::tempdir().expect("tempdir");
    // What a tampered image would delete: the user's files outside the cache.
    let outside = dir.path().join("home");
    std::fs::create_dir_all(outside.join("docs")).expect("mkdir");
    std::fs::write(outside.join("victim"), "mine").expect("write");
    std::fs::write(outside.join("docs/thesis"), "mine").expect("write");
    let absolute = outside.display().to_string();
    let relative = format!("../../../../../../../..{absolute}");
    let links = link_layer(&[("abs", absolute.as_str()), ("rel", relative.as_str())], &[]);
    let whiteouts = link_layer(&[], &["abs/.wh.victim", "rel/.wh.victim", "abs/docs/.wh..wh..opq"]);
    let image = dir.path().join("image");
    layout(&image, &[links, whiteouts]);
    unpack(&image, &dir.path().join("cache")).expect("the links stay inside the root: nothing to remove");
    assert_eq!(std::fs::read_to_string(outside.join("victim")).expect("victim"), "mine");
    assert_eq!(std::fs::read_to_string(outside.join("docs/thesis")).expect("thesis"), "mine");
}

fn image_of(dir: &Path, name: &str, text: &str) -> PathBuf {
    let image = dir.join(name);
    layout(&image, &[layer(&[("file", Some(text))])]);
    image
}

#[test]
fn a_cache_entry_without_this_users_stamp_is_not_trusted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (image, cache) = (image_of(dir.path(), "image", "real"), dir.path().join("cache"));
    let first = unpack(&image, &cache).expect("unpack");
    let entry = first.rootfs.parent().expect("entry").to_owned();
    drop(first);
    // Someone's planted root filesystem, without a stamp, under the entry's name.
    std::fs::remove_file(entry.join("stamp")).expect("remove the stamp");
    std::fs::write(entry.join("rootfs/file"), "planted").expect("plant");
    let again = unpack(&image, &cache).expect("unpack again");
    assert_eq!(std::fs::read_to_string(again.rootfs.join("file")).expect("file"), "real");
    // A stamp naming another image is no stamp either.
    drop(again);
    std::fs::write(entry.join("stamp"), "sha256:0000\n").expect("write");
    std::fs::write(entry.join("rootfs/file"), "planted").expect("plant");
    let third = unpack(&image, &cache).expect("unpack a third time");
    assert_eq!(std::fs::read_to_string(third.rootfs.join("file")).expect("file"), "real");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(entry.join("stamp")).expect("stamp").permissions(),
    );
    assert_eq!(mode & 0o777, 0o600);
}

#[test]
fn images_no_bubble_holds_are_collected_when_another_is_unpacked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = dir.path().join("cache");
    let a = unpack(&image_of(dir.path(), "a", "a"), &cache).expect("a");
    let b = unpack(&image_of(dir.path(), "b", "b"), &cache).expect("b");
    assert!(a.rootfs.is_dir(), "a is held: kept when b was unpacked");
    let a_root = a.rootfs.clone();
    drop(a);
    let c = unpack(&image_of(dir.path(), "c", "c"), &cache).expect("c");
    assert!(!a_root.exists(), "a, held by no one, was collected");
    assert!(b.rootfs.is_dir() && c.rootfs.is_dir(), "b is still held, c is new");
    // Reusing an entry collects nothing: the bubble that reuses it keeps its neighbours.
    let b_again = unpack(&image_of(dir.path(), "b", "b"), &cache).expect("b again");
    assert!(c.rootfs.is_dir() && b_again.rootfs == b.rootfs);
}

#[test]
fn a_gone_launchers_staging_is_swept_a_live_ones_is_not() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = dir.path().join("cache");
    std::fs::create_dir_all(cache.join(".unpack-4000000-dead/rootfs/usr")).expect("mkdir");
    // Read-only directories, as an image has: the sweep opens them up to remove them.
    std::fs::set_permissions(
        cache.join(".unpack-4000000-dead/rootfs"),
        std::os::unix::fs::PermissionsExt::from_mode(0o555),
    )
    .expect("chmod");
    let ours = cache.join(format!(".archive-{}-live", std::process::id()));
    std::fs::create_dir_all(&ours).expect("mkdir");
    unpack(&image_of(dir.path(), "image", "x"), &cache).expect("unpack");
    assert!(!cache.join(".unpack-4000000-dead").exists(), "PID 4000000 is gone: swept");
    assert!(ours.exists(), "this process is alive: its staging stays");
}

/// Review C1: a private directory is made below what exists without following a link, and one
/// that is there already is taken only if it is this user's directory (not a link to one).
#[test]
fn private_directories_are_made_and_taken_only_as_this_users_own() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let tmp = tempfile::tempdir().expect("tempdir");
    let mode = |p: &Path| std::fs::symlink_metadata(p).expect("stat").permissions().mode() & 0o7777;

    let deep = tmp.path().join("a/b/c");
    create_private_dir(&deep).expect("make");
    for p in ["a", "a/b", "a/b/c"] {
        assert_eq!(mode(&tmp.path().join(p)), 0o700, "{p}");
    }
    // One of ours, open to others: closed.
    std::fs::set_permissions(&deep, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    create_private_dir(&deep).expect("again");
    assert_eq!(mode(&deep), 0o700);

    // A link where the directory should be, to a directory of ours: refused, and what it
    // points to is left as it was.
    let target = tmp.path().join("elsewhere");
    std::fs::create_dir(&target).expect("mkdir");
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let link = tmp.path().join("a/b/link");
    std::os::unix::fs::symlink(&target, &link).expect("symlink");
    let err = create_private_dir(&link).expect_err("a link").to_string();
    assert!(err.contains("link"), "{err}");
    assert_eq!(mode(&target), 0o755);
    // A file there: refused.
    let file = tmp.path().join("a/file");
    std::fs::write(&file, "x").expect("write");
    assert!(create_private_dir(&file).is_err());
    assert!(create_private_dir(Path::new("/")).is_err() && create_private_dir(&deep.join("..")).is_err());

    // Links in the part that exists are followed (a home under a linked /home).
    let via = tmp.path().join("via");
    std::os::unix::fs::symlink(tmp.path().join("a"), &via).expect("symlink");
    create_private_dir(&via.join("d")).expect("below a link that was there");
    assert!(tmp.path().join("a/d").is_dir());

    // Another user's directory (as root, where the test can make one): refused, untouched.
    if nix::unistd::geteuid().is_root() {
        let theirs = tmp.path().join("theirs");
        std::fs::create_dir(&theirs).expect("mkdir");
        std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        nix::unistd::chown(&theirs, Some(nix::unistd::Uid::from_raw(65534)), None).expect("chown");
        let err = create_private_dir(&theirs).expect_err("another user's").to_string();
        assert!(err.contains("65534"), "{err}");
        assert_eq!((mode(&theirs), std::fs::metadata(&theirs).expect("stat").uid()), (0o755, 65534));
        // A link of theirs on the way, in a directory anyone may write: not followed. The same
        // link in a directory only its owner may write (root's, as `/home` → `/export/home`
        // is): followed.
        let sticky = tmp.path().join("sticky");
        std::fs::create_dir(&sticky).expect("mkdir");
        std::fs::set_permissions(&sticky, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
        let planted = sticky.join("planted");
        std::os::unix::fs::symlink(&target, &planted).expect("symlink");
        nix::unistd::fchownat(
            nix::fcntl::AT_FDCWD,
            &planted,
            Some(nix::unistd::Uid::from_raw(65534)),
            None,
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .expect("lchown");
        let err = create_private_dir(&planted.join("mine")).expect_err("through their link").to_string();
        assert!(err.contains("65534") && err.contains("not followed"), "{err}");
        assert!(!target.join("mine").exists(), "made through their link");
        std::fs::set_permissions(&sticky, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        create_private_dir(&planted.join("mine")).expect("a link only the directory's owner could put there");
        assert!(target.join("mine").is_dir());
    } else {
        eprintln!("not root: the other user's directory is not tried (no UID to give it)");
    }
}
