//! The image store against a real `docker-registry` on loopback, with images built by the
//! harness (busybox-static, no Docker): pulls, sharing, whiteouts on a real overlay mount,
//! garbage collection, and bad input that must fail cleanly.

mod support;

use std::collections::BTreeSet;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, TcpListener};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Instant;

use hpk_integration::image::{
    self, Blob, Digest, HTTPD_INDEX, Image, Layer, LayerBuilder, OCI_LAYER_GZIP, OCI_MANIFEST, build_image,
    httpd_image, shell_image,
};
use hpk_integration::registry::{Client, Registry};
use hpk_pod_runtime::images::{Error, ImageStore, OPAQUE_XATTR, StoreOptions};
use support::tools_present;

const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// A registry, a client pushing to it, and an empty store that reaches it over plain HTTP.
struct Env {
    registry: Registry,
    client: Client,
    dir: tempfile::TempDir,
    store: ImageStore,
}

impl Env {
    async fn start() -> Self {
        let registry = Registry::start(LOOPBACK, None).await.unwrap_or_else(|e| panic!("registry: {e}"));
        let client = Client::new(&registry.url()).expect("client");
        let dir = tempfile::tempdir().expect("tempdir");
        let store = open(&dir.path().join("store"), &[registry.host_port()]);
        Self { registry, client, dir, store }
    }

    /// `host:port/repo_tag`.
    fn reference(&self, repo_tag: &str) -> String {
        format!("{}/{repo_tag}", self.registry.host_port())
    }

    async fn push(&self, repo: &str, tag: &str, image: &Image) -> Digest {
        let pushed = self.client.push(repo, tag, image).await;
        pushed.unwrap_or_else(|e| panic!("push {repo}:{tag}: {e}\n{}", self.registry.log_tail()))
    }

    fn root(&self) -> PathBuf {
        self.store.root().to_owned()
    }
}

fn open(root: &Path, insecure: &[String]) -> ImageStore {
    let options = StoreOptions { insecure_registries: insecure.to_vec() };
    ImageStore::open_with(root, options).expect("open store")
}

/// The store's index, blob names and layer names; and it asserts `tmp/` is empty.
fn snapshot(root: &Path) -> (String, BTreeSet<String>, BTreeSet<String>) {
    let names = |dir: PathBuf| -> BTreeSet<String> {
        std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect()
    };
    let tmp = names(root.join("tmp"));
    assert!(tmp.is_empty(), "left in tmp/: {tmp:?}");
    let index = std::fs::read_to_string(root.join("index.json")).unwrap_or_default();
    (index, names(root.join("blobs/sha256")), names(root.join("layers")))
}

fn hex(digest: &Digest) -> String {
    digest.as_str().trim_start_matches("sha256:").to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pull_by_tag_and_by_digest_give_the_same_image() {
    if !tools_present(&["docker-registry"]) {
        return;
    }
    let env = Env::start().await;
    let shell = shell_image().expect("shell image");
    let digest = env.push("hpk/shell", "v1", &shell).await;

    let started = Instant::now();
    let by_tag = env.store.pull(&env.reference("hpk/shell:v1"), None).await.expect("pull by tag");
    eprintln!("TIMING: cold pull of the shell image ({} bytes): {:?}", by_tag.size, started.elapsed());
    assert_eq!(by_tag.id, shell.config.digest.as_str());
    assert_eq!(by_tag.manifest_digest, digest.as_str());
    assert_eq!(by_tag.repo_tags, [env.reference("hpk/shell:v1")]);
    assert_eq!(by_tag.config.cmd, ["sh"]);
    assert!(by_tag.config.env.iter().any(|e| e.starts_with("PATH=")), "{:?}", by_tag.config.env);
    assert_eq!((by_tag.config.os.as_str(), by_tag.config.architecture.as_str()), ("linux", "amd64"));

    let layers = env.store.layers(&by_tag);
    assert_eq!(layers, [env.root().join("layers").join(hex(&shell.layers[0].diff_id))]);
    let busybox = std::fs::metadata(layers[0].join("bin/busybox")).expect("bin/busybox");
    assert_eq!(busybox.len(), std::fs::metadata(image::BUSYBOX).expect("host busybox").len());
    assert_eq!(busybox.permissions().mode() & 0o777, 0o755);
    assert_eq!(std::fs::read_link(layers[0].join("bin/sh")).expect("bin/sh"), Path::new("busybox"));
    assert_eq!(std::fs::metadata(layers[0].join("tmp")).expect("tmp").permissions().mode() & 0o7777, 0o1777);

    let by_digest = format!("{}/hpk/shell@{digest}", env.registry.host_port());
    let again = env.store.pull(&by_digest, None).await.expect("pull by digest");
    assert_eq!(again.id, by_tag.id);
    assert_eq!(env.store.stats().blobs_downloaded, 2, "config and layer, once");
    assert_eq!(env.store.list().len(), 1);
    let id_hex = by_tag.id.trim_start_matches("sha256:");
    for name in [env.reference("hpk/shell:v1"), by_digest, by_tag.id.clone(), id_hex.to_owned()] {
        let found = env.store.status(&name).unwrap_or_else(|| panic!("status {name}"));
        assert_eq!(found.id, by_tag.id, "{name}");
        assert_eq!(found.repo_digests, [format!("{}/hpk/shell@{digest}", env.registry.host_port())]);
    }
    assert!(env.store.status(&env.reference("hpk/shell:v2")).is_none());
    let info = env.store.fs_info().await.expect("fs info");
    let entries = image::layer_paths(&shell.layers[0].blob.data).expect("layer paths").len() as u64;
    assert!(info.used_bytes > busybox.len() && info.inodes_used > entries, "{entries} entries, {info:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_layers_are_unpacked_once_and_collected_only_when_unused() {
    if !tools_present(&["docker-registry"]) {
        return;
    }
    let env = Env::start().await;
    let (shell, httpd) = (shell_image().expect("shell"), httpd_image().expect("httpd"));
    env.push("hpk/shell", "latest", &shell).await;
    env.push("hpk/httpd", "latest", &httpd).await;
    let shell_rec = env.store.pull(&env.reference("hpk/shell"), None).await.expect("pull shell");
    let httpd_rec = env.store.pull(&env.reference("hpk/httpd"), None).await.expect("pull httpd");

    let stats = env.store.stats();
    assert_eq!(stats.layers_unpacked, 2, "base once, www once: {stats:?}");
    assert_eq!(stats.blobs_downloaded, 4, "2 configs, base layer once, www layer: {stats:?}");
    let (shell_layers, httpd_layers) = (env.store.layers(&shell_rec), env.store.layers(&httpd_rec));
    assert_eq!(httpd_layers.len(), 2);
    assert_eq!(httpd_layers[1], shell_layers[0], "top-most first; the base is shared");
    let index = std::fs::read_to_string(httpd_layers[0].join("www/index.html")).expect("index.html");
    assert_eq!(index, HTTPD_INDEX);
    assert_eq!(httpd_rec.config.working_dir.as_deref(), Some("/www"));
    let full = env.store.fs_info().await.expect("fs info");

    env.store.remove(&env.reference("hpk/shell:latest")).await.expect("remove shell");
    assert!(env.store.status(&env.reference("hpk/shell")).is_none());
    assert!(
        httpd_layers.iter().all(|l| l.join("bin").exists() || l.join("www").exists()),
        "httpd's layers kept"
    );
    let (_, blobs, layers) = snapshot(&env.root());
    assert_eq!(layers.len(), 2);
    assert!(!blobs.contains(&hex(&shell.config.digest)), "the shell's config is collected");
    assert!(blobs.contains(&hex(&shell.layers[0].blob.digest)), "the shared layer blob is kept");

    env.store.remove(&httpd_rec.id).await.expect("remove httpd by ID");
    let (_, blobs, layers) = snapshot(&env.root());
    assert!(blobs.is_empty() && layers.is_empty(), "left: {blobs:?} {layers:?}");
    assert!(env.store.list().is_empty());
    env.store.remove(&httpd_rec.id).await.expect("removing an absent image is not an error");
    assert!(env.store.fs_info().await.expect("fs info").used_bytes < full.used_bytes / 4);
}

/// Mounts a read-only overlay and unmounts it on drop, also when an assertion fails.
struct Overlay(PathBuf);

impl Overlay {
    fn mount(lower: &[PathBuf], target: &Path) -> nix::Result<Self> {
        let lower: Vec<String> = lower.iter().map(|p| p.display().to_string()).collect();
        let options = format!("lowerdir={},userxattr", lower.join(":"));
        let flags = nix::mount::MsFlags::MS_RDONLY;
        nix::mount::mount(Some("overlay"), target, Some("overlay"), flags, Some(options.as_str()))?;
        Ok(Self(target.to_owned()))
    }
}

impl Drop for Overlay {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whiteouts_and_opaque_dirs_work_on_an_overlay_mount() {
    if !tools_present(&["docker-registry"]) {
        return;
    }
    let env = Env::start().await;
    let mut base = LayerBuilder::new();
    base.file("file", "deleted above", 0o644)
        .expect("file")
        .file("opq/old", "hidden above", 0o644)
        .expect("old");
    base.file("kept", "still here", 0o644).expect("kept");
    let mut top = LayerBuilder::new();
    top.file(".wh.file", "", 0o644).expect("whiteout").file("opq/.wh..wh..opq", "", 0o644).expect("opaque");
    top.file("opq/new", "new", 0o644).expect("new");
    let layers = vec![base.build().expect("base"), top.build().expect("top")];
    let image = build_image(layers, &image::ImageConfig::default()).expect("image");
    env.push("hpk/whiteouts", "v1", &image).await;
    let record = env.store.pull(&env.reference("hpk/whiteouts:v1"), None).await.expect("pull");

    let lower = env.store.layers(&record);
    let whiteout = std::fs::symlink_metadata(lower[0].join("file")).expect("whiteout in the top layer");
    assert!(whiteout.file_type().is_char_device() && whiteout.rdev() == 0, "{whiteout:?}");
    let opaque = xattr::get(lower[0].join("opq"), OPAQUE_XATTR).expect("read xattr");
    assert_eq!(opaque.as_deref(), Some(&b"y"[..]));

    let merged = env.dir.path().join("merged");
    std::fs::create_dir(&merged).expect("mkdir");
    match Overlay::mount(&lower, &merged) {
        Ok(_mounted) => {
            assert!(!merged.join("file").exists(), "the whiteout hides the base layer's file");
            assert_eq!(std::fs::read_to_string(merged.join("kept")).expect("kept"), "still here");
            let opq: Vec<_> = std::fs::read_dir(merged.join("opq"))
                .expect("opq")
                .map(|e| e.expect("e").file_name())
                .collect();
            assert_eq!(opq, ["new"], "the opaque dir hides the base layer's entries");
        }
        Err(e) => hpk_test_support::skipped(&format!(
            "overlay mount check: {e} (needs root and overlayfs with userxattr)"
        )),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_references_missing_images_and_dead_registries_change_nothing() {
    if !tools_present(&["docker-registry"]) {
        return;
    }
    let env = Env::start().await;
    env.push("hpk/shell", "v1", &shell_image().expect("shell")).await;
    let closed = {
        let listener = TcpListener::bind((LOOPBACK, 0)).expect("bind");
        listener.local_addr().expect("addr").to_string()
    };
    let root = env.root();
    drop(env.store);
    let store = open(&root, &[env.registry.host_port(), closed.clone()]);
    let reference = |repo_tag: &str| format!("{}/{repo_tag}", env.registry.host_port());
    store.pull(&reference("hpk/shell:v1"), None).await.expect("a first image");
    let before = snapshot(&root);

    let err = store.pull("Not A/Reference!", None).await.expect_err("malformed");
    assert!(matches!(err, Error::BadReference { .. }), "{err}");
    let err = store.pull(&reference("hpk/absent:v1"), None).await.expect_err("absent repository");
    assert!(matches!(err, Error::NotFound { .. }), "{err}");
    let err = store.pull(&reference("hpk/shell:no-such-tag"), None).await.expect_err("absent tag");
    assert!(matches!(err, Error::NotFound { .. }), "{err}");
    assert!(err.to_string().contains("no-such-tag"), "{err}");
    let err = store.pull(&format!("{closed}/hpk/shell:v1"), None).await.expect_err("closed port");
    assert!(matches!(err, Error::Unreachable { .. }), "{err}");
    assert!(err.to_string().contains(&closed), "{err}");
    assert_eq!(snapshot(&root), before, "a failed pull changed the store");
    assert_eq!(store.list().len(), 1);
}

/// Flips one byte of a blob in the registry's storage: same size, wrong content.
fn corrupt_in_registry(registry: &Registry, digest: &Digest) {
    let hex = hex(digest);
    let path =
        registry.dir().join(format!("storage/docker/registry/v2/blobs/sha256/{}/{hex}/data", &hex[..2]));
    let mut data = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let last = data.len() - 1;
    data[last] ^= 0xff;
    std::fs::write(&path, data).expect("corrupt");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tampered_blobs_and_lying_diff_ids_are_refused() {
    if !tools_present(&["docker-registry"]) {
        return;
    }
    let env = Env::start().await;
    let httpd = httpd_image().expect("httpd");
    env.push("hpk/httpd", "v1", &httpd).await;
    corrupt_in_registry(&env.registry, &httpd.layers[1].blob.digest);
    let before = snapshot(&env.root());
    let err = env.store.pull(&env.reference("hpk/httpd:v1"), None).await.expect_err("tampered layer");
    match &err {
        Error::DigestMismatch { what: "layer", expected, actual } => {
            assert_eq!(expected, httpd.layers[1].blob.digest.as_str());
            assert_ne!(actual, expected);
        }
        other => panic!("expected a digest mismatch, got {other}"),
    }
    // The base layer was unpacked before the www layer failed; no image needs it now.
    assert_eq!(snapshot(&env.root()), before, "a failed pull left content behind");

    let good = LayerBuilder::new().file("a", "a", 0o644).expect("a").build().expect("layer");
    let liar = Layer { diff_id: Digest::of(b"not the tar"), ..good };
    let image = build_image(vec![liar], &image::ImageConfig::default()).expect("image");
    env.push("hpk/liar", "v1", &image).await;
    let err = env.store.pull(&env.reference("hpk/liar:v1"), None).await.expect_err("lying diff ID");
    assert!(matches!(err, Error::DigestMismatch { what: "layer diff ID", .. }), "{err}");
    assert_eq!(snapshot(&env.root()), before);
}

/// A gzip'd layer whose tar has `name` written verbatim (the builders refuse `..`).
fn raw_layer(name: &str) -> Layer {
    let mut header = tar::Header::new_gnu();
    header.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
    header.set_entry_type(tar::EntryType::Regular);
    header.set_mode(0o644);
    header.set_size(4);
    header.set_cksum();
    let mut tar = tar::Builder::new(Vec::new());
    tar.append(&header, &b"evil"[..]).expect("append");
    let tar = tar.into_inner().expect("tar");
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&tar).expect("gzip");
    let data = gz.finish().expect("gzip");
    Layer {
        blob: Blob { media_type: OCI_LAYER_GZIP, digest: Digest::of(&data), data },
        diff_id: Digest::of(&tar),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layer_escaping_its_root_is_refused() {
    if !tools_present(&["docker-registry"]) {
        return;
    }
    let env = Env::start().await;
    let image = build_image(vec![raw_layer("../escape")], &image::ImageConfig::default()).expect("image");
    env.push("hpk/escape", "v1", &image).await;
    let before = snapshot(&env.root());
    let err = env.store.pull(&env.reference("hpk/escape:v1"), None).await.expect_err("escape");
    assert!(matches!(&err, Error::UnsafePath { path, .. } if path == "../escape"), "{err}");
    assert_eq!(snapshot(&env.root()), before);
    for dir in [env.root(), env.root().join("tmp"), env.root().join("layers"), env.dir.path().to_owned()] {
        assert!(!dir.join("escape").exists(), "escape written in {}", dir.display());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reopening_the_store_reloads_the_index() {
    if !tools_present(&["docker-registry"]) {
        return;
    }
    let env = Env::start().await;
    env.push("hpk/shell", "v1", &shell_image().expect("shell")).await;
    let reference = env.reference("hpk/shell:v1");
    let pulled = env.store.pull(&reference, None).await.expect("pull");
    let root = env.root();
    let err = ImageStore::open(&root).expect_err("a second store on one root");
    assert!(matches!(err, Error::Locked { .. }), "{err}");
    drop(env.store);
    std::fs::create_dir(root.join("tmp/layer-crashed")).expect("a crashed pull's leftover");
    let orphan = "0".repeat(64);
    std::fs::create_dir(root.join("layers").join(&orphan)).expect("unpacked, never recorded");
    std::fs::write(root.join("blobs/sha256").join(&orphan), "x").expect("downloaded, never recorded");

    let store = open(&root, &[]);
    assert_eq!(store.status(&reference), Some(pulled.clone()));
    assert_eq!(store.list(), std::slice::from_ref(&pulled));
    assert!(store.layers(&pulled).iter().all(|l| l.join("bin/busybox").is_file()));
    let (_, blobs, layers) = snapshot(&root); // and tmp/ was emptied
    assert!(!blobs.contains(&orphan) && !layers.contains(&orphan), "orphans are collected on open");
    assert_eq!(layers.len(), 1);
    assert_eq!(std::fs::metadata(&root).expect("root").permissions().mode() & 0o777, 0o700);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_pulls_of_one_reference_download_once() {
    if !tools_present(&["docker-registry"]) {
        return;
    }
    let env = Env::start().await;
    env.push("hpk/shell", "v1", &shell_image().expect("shell")).await;
    let reference = env.reference("hpk/shell:v1");
    let pulls: Vec<_> = (0..4)
        .map(|_| {
            let (store, reference) = (env.store.clone(), reference.clone());
            tokio::spawn(async move { store.pull(&reference, None).await })
        })
        .collect();
    let mut ids = BTreeSet::new();
    for pull in pulls {
        ids.insert(pull.await.expect("task").expect("pull").id);
    }
    assert_eq!(ids.len(), 1);
    let stats = env.store.stats();
    assert_eq!(
        (stats.manifests_fetched, stats.blobs_downloaded, stats.layers_unpacked),
        (1, 2, 1),
        "{stats:?}"
    );
    // The registry's own access log agrees: each blob was served once.
    let log = std::fs::read_to_string(env.registry.dir().join("registry.log")).expect("registry log");
    let blob_gets = log.lines().filter(|l| l.contains("\"GET /v2/hpk/shell/blobs/sha256:")).count();
    assert_eq!(blob_gets, 2, "blob GETs in the registry log:\n{log}");
}

/// An OCI image index listing `entries` as (image, os, architecture).
fn index_of(entries: &[(&Image, &str, &str)]) -> Vec<u8> {
    let manifests: Vec<_> = entries
        .iter()
        .map(|(image, os, arch)| {
            serde_json::json!({
                "mediaType": OCI_MANIFEST,
                "digest": image.digest.as_str(),
                "size": image.manifest.len(),
                "platform": { "os": os, "architecture": arch },
            })
        })
        .collect();
    let index = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": manifests,
    });
    serde_json::to_vec(&index).expect("index JSON")
}

/// PUTs an index as `repo:tag`; the harness client only PUTs image manifests.
async fn put_index(registry: &Registry, repo: &str, tag: &str, index: &[u8]) {
    let url = format!("{}/v2/{repo}/manifests/{tag}", registry.url());
    let http = reqwest::Client::builder().no_proxy().build().expect("http client");
    let request = http.put(&url).header("content-type", "application/vnd.oci.image.index.v1+json");
    let response = request.body(index.to_vec()).send().await.expect("PUT index");
    let status = response.status();
    assert_eq!(status, 201, "{}", response.text().await.unwrap_or_default());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_index_resolves_to_its_linux_amd64_image() {
    if !tools_present(&["docker-registry"]) {
        return;
    }
    let env = Env::start().await;
    let (shell, httpd) = (shell_image().expect("shell"), httpd_image().expect("httpd"));
    env.push("hpk/multi", "shell", &shell).await;
    env.push("hpk/multi", "httpd", &httpd).await;
    let index = index_of(&[(&httpd, "linux", "arm64"), (&shell, "linux", "amd64")]);
    put_index(&env.registry, "hpk/multi", "v1", &index).await;

    let record = env.store.pull(&env.reference("hpk/multi:v1"), None).await.expect("pull the index");
    assert_eq!(record.id, shell.config.digest.as_str(), "the amd64 entry, not the first");
    assert_eq!(record.manifest_digest, shell.digest.as_str());
    let by_index = format!("{}/hpk/multi@{}", env.registry.host_port(), Digest::of(&index));
    assert_eq!(record.repo_digests, std::slice::from_ref(&by_index), "the digest the reference resolved to");
    assert_eq!(env.store.status(&by_index).map(|r| r.id), Some(record.id.clone()));
    assert_eq!(env.store.stats().manifests_fetched, 2, "the index, then the amd64 manifest");
    let before = snapshot(&env.root());

    put_index(&env.registry, "hpk/multi", "arm", &index_of(&[(&httpd, "linux", "arm64")])).await;
    let err = env.store.pull(&env.reference("hpk/multi:arm"), None).await.expect_err("no amd64 entry");
    assert!(matches!(err, Error::NoPlatform { .. }), "{err}");
    assert!(err.to_string().contains("linux/arm64"), "{err}");
    assert_eq!(snapshot(&env.root()), before);
}
