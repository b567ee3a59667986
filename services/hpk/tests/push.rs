//! `hpk image push` against a real registry (Debian's docker-registry): the bubble and pause
//! images of both architectures (`make images`, `make images ARCH=arm64`) pushed as one index
//! each, pulled back with every digest checked; a registry that refuses the credentials and
//! one that cannot be reached give a clear error and are left without anything of the push.

mod support;

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use base64::Engine as _;
use hpk_integration::registry::{Client, Registry};
use support::text;

const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `IMAGE`'s layouts for amd64 and arm64, or None (the skip recorded) when one is not built.
fn layouts(image: &str) -> Option<[PathBuf; 2]> {
    let amd64 = root().join("target/images").join(image);
    let arm64 = root().join("target/images-arm64").join(image);
    for (layout, make) in [(&amd64, "make images"), (&arm64, "make images ARCH=arm64")] {
        if !layout.join("index.json").is_file() {
            hpk_test_support::skip(format!("{} is not built (`{make}`)", layout.display()));
            return None;
        }
    }
    Some([amd64, arm64])
}

/// `hpk image push ARGS…` with a credentials file of its own (none unless `authfile` says),
/// and a TMPDIR of its own that must be empty again when it ends.
fn hpk_push(args: &[&str], authfile: Option<&Path>) -> Output {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hpk"));
    cmd.env("TMPDIR", tmp.path());
    cmd.args(["image", "push"]).args(args);
    // The caller's own credentials never take part.
    cmd.env_remove("REGISTRY_AUTH_FILE").env("DOCKER_CONFIG", "/nonexistent-hpk-test");
    if let Some(file) = authfile {
        cmd.env("REGISTRY_AUTH_FILE", file);
    }
    let out = cmd.output().expect("run hpk image push");
    let left: Vec<_> = std::fs::read_dir(tmp.path()).expect("tmp").flatten().map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "hpk image push left {left:?} in its TMPDIR");
    out
}

async fn registry() -> Option<Registry> {
    if !hpk_integration::tools_present(&["docker-registry"]) {
        return None;
    }
    Some(Registry::start(LOCALHOST, None).await.expect("start the registry"))
}

/// The repositories a registry's storage holds (nothing pushed: none).
fn stored_repositories(registry: &Registry) -> Vec<String> {
    let dir = registry.dir().join("storage/docker/registry/v2/repositories");
    let mut found = Vec::new();
    let mut stack = vec![dir.clone()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.join("_manifests").is_dir()
                || path.join("_layers").is_dir()
                || path.join("_uploads").is_dir()
            {
                found.push(path.strip_prefix(&dir).unwrap_or(&path).display().to_string());
            } else if path.is_dir() {
                stack.push(path);
            }
        }
    }
    found
}

fn stored_blobs(registry: &Registry) -> usize {
    let dir = registry.dir().join("storage/docker/registry/v2/blobs/sha256");
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .flat_map(|d| std::fs::read_dir(d.path()).into_iter().flatten())
        .count()
}

#[tokio::test]
async fn both_architectures_push_as_one_index_and_every_digest_pulls_back() {
    let (Some(bubble), Some(pause)) = (layouts("hpk-bubble"), layouts("hpk-pause")) else { return };
    let Some(registry) = registry().await else { return };
    let client = Client::new(&registry.url()).expect("client");
    for (repo, [amd64, arm64]) in [("hpk/hpk-bubble", &bubble), ("hpk/hpk-pause", &pause)] {
        let to = format!("{}/{repo}:0.1.0", registry.host_port());
        let out = hpk_push(
            &["--plain-http", "--to", &to, &amd64.to_string_lossy(), &arm64.to_string_lossy()],
            None,
        );
        assert!(out.status.success(), "push {repo}: {}", text(&out));
        let said = String::from_utf8_lossy(&out.stdout).into_owned();

        // The tag names an index of exactly the two platforms, each pulling back whole:
        // manifest, config and every layer checked against their digests, sizes and diff_ids.
        let (index_digest, bytes) = client.get_index(repo, "0.1.0").await.expect("the index by its tag");
        assert!(said.contains(index_digest.as_str()), "the push names the index it tagged: {said}");
        let index: serde_json::Value = serde_json::from_slice(&bytes).expect("index JSON");
        assert_eq!(index["mediaType"], "application/vnd.oci.image.index.v1+json");
        let entries = index["manifests"].as_array().expect("manifests");
        let platforms: Vec<String> = entries
            .iter()
            .map(|e| {
                format!(
                    "{}/{}",
                    e["platform"]["os"].as_str().unwrap(),
                    e["platform"]["architecture"].as_str().unwrap()
                )
            })
            .collect();
        assert_eq!(platforms, ["linux/amd64", "linux/arm64"], "{repo}");
        for (entry, layout) in entries.iter().zip([amd64, arm64]) {
            let digest = entry["digest"].as_str().expect("digest");
            let pulled =
                client.pull(repo, digest).await.unwrap_or_else(|e| panic!("pull {repo}@{digest}: {e}"));
            assert_eq!(pulled.manifest_bytes.len() as u64, entry["size"].as_u64().expect("size"));
            let config: serde_json::Value = serde_json::from_slice(&pulled.config).expect("config");
            assert_eq!(config["architecture"], entry["platform"]["architecture"], "{repo}@{digest}");
            // What was pulled is what the layout holds, byte for byte.
            let local: serde_json::Value =
                serde_json::from_slice(&std::fs::read(layout.join("index.json")).expect("index.json"))
                    .expect("json");
            assert_eq!(local["manifests"][0]["digest"].as_str(), Some(digest), "{}", layout.display());
            assert!(!pulled.layers.is_empty());
        }

        // Pushed again: every blob is there already, and the tag names the same index.
        let again = hpk_push(
            &["--plain-http", "--to", &to, &amd64.to_string_lossy(), &arm64.to_string_lossy()],
            None,
        );
        assert!(again.status.success(), "second push: {}", text(&again));
        assert!(String::from_utf8_lossy(&again.stdout).contains("0 blobs sent"), "{}", text(&again));
        assert_eq!(client.get_index(repo, "0.1.0").await.expect("index").0, index_digest);
    }
}

#[tokio::test]
async fn a_registry_that_refuses_the_credentials_gets_nothing() {
    let Some([amd64, arm64]) = layouts("hpk-pause") else { return };
    if !hpk_integration::tools_present(&["docker-registry", "htpasswd"]) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let htpasswd = dir.path().join("htpasswd");
    let out = Command::new("htpasswd")
        .args(["-Bbc"])
        .arg(&htpasswd)
        .args(["alice", "right"])
        .output()
        .expect("htpasswd");
    assert!(out.status.success(), "htpasswd: {}", text(&out));
    let registry = Registry::start_with_htpasswd(LOCALHOST, &htpasswd).await.expect("start the registry");
    let host = registry.host_port();
    let to = format!("{host}/hpk/hpk-pause:0.1.0");
    // The oci-archives beside the layouts (what the release bundle carries), this time.
    let archive = |layout: &Path| layout.with_extension("oci.tar").to_string_lossy().into_owned();
    let images = [archive(&amd64), archive(&arm64)];
    let authfile = |user: &str, password: &str| {
        let file = dir.path().join(format!("auth-{user}-{password}.json"));
        let auth = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        std::fs::write(&file, serde_json::json!({"auths": {host.clone(): {"auth": auth}}}).to_string())
            .expect("write");
        file
    };
    let args = ["--plain-http", "--to", &to, &images[0], &images[1]];

    for (what, file) in [("a wrong password", Some(authfile("alice", "wrong"))), ("no credentials", None)] {
        let out = hpk_push(&args, file.as_deref());
        assert!(!out.status.success(), "{what}: the push must fail: {}", text(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(&format!("registry {host}")) && err.contains("refused"), "{what}: {err}");
        match &file {
            Some(f) => {
                assert!(err.contains(&f.display().to_string()), "{what}: names the credentials file: {err}")
            }
            None => assert!(err.contains("no credentials"), "{what}: {err}"),
        }
        assert_eq!(out.status.code(), Some(69), "{what}: {err}");
        assert!(
            stored_repositories(&registry).is_empty(),
            "{what}: nothing half-pushed: {:?}",
            stored_repositories(&registry)
        );
        assert_eq!(stored_blobs(&registry), 0, "{what}: no blob was sent");
    }

    let out = hpk_push(&args, Some(&authfile("alice", "right")));
    assert!(out.status.success(), "the right password: {}", text(&out));
    assert_eq!(stored_repositories(&registry), ["hpk/hpk-pause"]);
}

#[test]
fn an_unreachable_registry_is_named_and_nothing_is_left() {
    let Some([amd64, _]) = layouts("hpk-pause") else { return };
    // A port nothing listens on: taken, then let go.
    let port = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let to = format!("127.0.0.1:{port}/hpk/hpk-pause:0.1.0");
    let started = std::time::Instant::now();
    let out = hpk_push(&["--plain-http", "--to", &to, &amd64.to_string_lossy()], None);
    assert!(!out.status.success(), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("registry 127.0.0.1:{port}")) && err.contains("cannot reach"), "{err}");
    assert!(started.elapsed() < std::time::Duration::from_secs(20), "refused connections fail fast");
    // Without --plain-http, the message says it may be needed.
    let out = hpk_push(&["--to", &to, &amd64.to_string_lossy()], None);
    assert!(String::from_utf8_lossy(&out.stderr).contains("--plain-http"), "{}", text(&out));
}
