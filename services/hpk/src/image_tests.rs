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

/// Writes an image layout with `layers`; returns the layer digests.
fn layout(dir: &Path, layers: &[(Vec<u8>, String)]) -> Vec<String> {
    std::fs::create_dir_all(dir.join("blobs/sha256")).expect("mkdir");
    std::fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).expect("write");
    let digests: Vec<String> = layers.iter().map(|(b, _)| put(dir, b)).collect();
    let config = serde_json::json!({
        "architecture": "amd64", "os": "linux",
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
    let index = serde_json::json!({"schemaVersion": 2, "manifests": [
        {"mediaType": MANIFEST, "digest": manifest_digest, "size": manifest.len()}
    ]});
    std::fs::write(dir.join("index.json"), index.to_string()).expect("write index");
    digests
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
    let left: Vec<_> = std::fs::read_dir(&cache).expect("cache").flatten().collect();
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
    assert!(err.contains("0 manifests"), "{err}");
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
