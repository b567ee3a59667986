//! The local OCI registry and the image builder against the real `docker-registry` on loopback.

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::time::Instant;

use hpk_integration::image::{self, Digest};
use hpk_integration::registry::{self, Client, Error, Registry};

const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// Whether the registry and busybox are installed; when they are not, fails under
/// `HPK_REQUIRE_TOOLS=1` and otherwise says why the test is skipped.
fn tools_present() -> bool {
    let mut missing = Vec::new();
    if registry::find_registry().is_none() {
        missing.push("docker-registry (apt-get install docker-registry)");
    }
    if !image::busybox_available() {
        missing.push("/bin/busybox (apt-get install busybox-static)");
    }
    if missing.is_empty() {
        return true;
    }
    let why = format!("missing {}", missing.join(", "));
    hpk_test_support::skip(why);
    false
}

async fn start() -> (Registry, Client) {
    let registry =
        Registry::start(LOOPBACK, None).await.unwrap_or_else(|e| panic!("registry did not start: {e}"));
    let client = Client::new(&registry.url()).expect("client");
    (registry, client)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shell_image_round_trips_by_digest_and_tag() {
    if !tools_present() {
        return;
    }
    let (registry, client) = start().await;
    let image = image::shell_image().expect("build shell image");

    let pushed = client.push("hpk/shell", "v1", &image).await;
    let pushed = pushed.unwrap_or_else(|e| panic!("push: {e}\nlog:\n{}", registry.log_tail()));
    assert_eq!(pushed, image.digest);

    let pulled = client.pull("hpk/shell", pushed.as_str()).await.expect("pull by digest");
    assert_eq!(pulled.digest, image.digest);
    assert_eq!(pulled.manifest_bytes, image.manifest);
    assert_eq!(pulled.config, image.config.data);
    assert_eq!(pulled.layers.len(), image.layers.len());
    for (got, built) in pulled.layers.iter().zip(&image.layers) {
        assert_eq!(Digest::of(got), built.blob.digest);
    }
    let paths = image::layer_paths(&pulled.layers[0]).expect("read layer");
    for want in ["bin/busybox", "bin/sh", "bin/ip", "bin/wget", "tmp/"] {
        assert!(paths.iter().any(|p| p == want), "{want} missing from {paths:?}");
    }

    let by_tag = client.pull("hpk/shell", "v1").await.expect("pull by tag");
    assert_eq!(by_tag.digest, image.digest);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_images_push_and_pull_and_share_the_base_layer() {
    if !tools_present() {
        return;
    }
    let (_registry, client) = start().await;
    let started = Instant::now();
    let shell = image::shell_image().expect("build shell image");
    let httpd = image::httpd_image().expect("build httpd image");
    let built = started.elapsed();
    assert_eq!(httpd.layers[0], shell.layers[0], "httpd builds on the shell image's layer");

    let shell_digest = client.push("hpk/shell", "latest", &shell).await.expect("push shell");
    let httpd_digest = client.push("hpk/httpd", "latest", &httpd).await.expect("push httpd");
    let pushed = started.elapsed();
    client.pull("hpk/shell", shell_digest.as_str()).await.expect("pull shell");
    let pulled = client.pull("hpk/httpd", httpd_digest.as_str()).await.expect("pull httpd");
    let total = started.elapsed();

    let www = image::layer_paths(&pulled.layers[1]).expect("read www layer");
    assert_eq!(www, ["www/", "www/index.html"]);
    let config = String::from_utf8_lossy(&pulled.config);
    assert!(config.contains(r#""Cmd":["/bin/busybox","httpd","-f","-p","8080","-h","/www"]"#), "{config}");
    eprintln!(
        "TIMING: build {:?}, build+push {:?}, build+push+pull {:?} (shell {} bytes, httpd {} bytes)",
        built,
        pushed,
        total,
        shell.blobs().map(|b| b.data.len()).sum::<usize>(),
        httpd.blobs().map(|b| b.data.len()).sum::<usize>(),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_are_reproducible() {
    if !tools_present() {
        return;
    }
    let one = image::shell_image().expect("first build");
    let two = image::shell_image().expect("second build");
    assert_eq!(one.digest, two.digest);
    assert_eq!(one.layers[0].blob.digest, two.layers[0].blob.digest);
    assert_eq!(one.config.digest, two.config.digest);
    assert_ne!(one.digest, image::httpd_image().expect("httpd").digest);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_manifest_and_corrupt_blob_are_clear_errors() {
    if !tools_present() {
        return;
    }
    let (_registry, client) = start().await;

    let absent = Digest::of(b"no such manifest");
    let err = client.pull("hpk/shell", absent.as_str()).await.expect_err("absent digest");
    assert!(matches!(err, Error::NotFound { what: "manifest", .. }), "{err:?}");
    assert!(err.to_string().contains(absent.as_str()), "{err}");

    let err = client.pull("hpk/shell", "no-such-tag").await.expect_err("absent tag");
    assert!(matches!(err, Error::NotFound { .. }), "{err:?}");

    // The bytes do not hash to the digest sent with them: the registry must refuse the upload.
    let claimed = Digest::of(b"what we claim to send");
    let err = client
        .push_blob("hpk/shell", &claimed, b"what we actually send")
        .await
        .expect_err("corrupt blob accepted");
    match &err {
        Error::Refused { status, body, .. } => {
            assert_eq!(*status, 400, "{err}");
            assert!(body.contains("DIGEST_INVALID"), "{err}");
        }
        other => panic!("expected the registry to refuse the blob, got {other:?}"),
    }
    assert!(!client.blob_exists("hpk/shell", &claimed).await.expect("HEAD"));

    // A manifest naming blobs the registry does not have is refused too.
    let image = image::shell_image().expect("build");
    let err = client
        .put_manifest("hpk/shell", "dangling", &image.manifest)
        .await
        .expect_err("manifest with missing blobs accepted");
    assert!(matches!(err, Error::Refused { status: 400, .. }), "{err:?}");

    let err = client.pull("Bad Name", "v1").await.expect_err("bad name");
    assert!(matches!(err, Error::BadName { .. }), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_registry_leaves_no_process_and_no_dir() {
    if !tools_present() {
        return;
    }
    let (registry, _client) = start().await;
    let pid = registry.pid();
    let dir = registry.dir().to_owned();
    let proc_entry = format!("/proc/{pid}");
    assert!(pid > 0 && Path::new(&proc_entry).exists());
    assert!(dir.join("config.yml").is_file());
    let url = format!("{}/v2/", registry.url());

    drop(registry);

    assert!(!Path::new(&proc_entry).exists(), "registry process {pid} is still there");
    assert!(!dir.exists(), "{} is still there", dir.display());
    let http = reqwest::Client::builder().no_proxy().build().expect("client");
    assert!(http.get(&url).send().await.is_err(), "something still answers on {url}");
}

/// The registry as the cluster tests use it: on a test host, reached over the test network.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_on_a_test_host_serves_pushes_and_pulls_by_digest() {
    if !tools_present() {
        return;
    }
    let network = hpk_integration::netns::TestNetwork::create(&["registry"]).expect("test network");
    let host = network.host("registry").expect("host").clone();
    let registry =
        Registry::start(IpAddr::V4(host.ip), Some(&host.netns)).await.expect("registry on the test host");
    assert_eq!(registry.addr().ip(), IpAddr::V4(host.ip));
    let client = Client::new(&registry.url()).expect("client");
    let image = image::httpd_image().expect("httpd image");
    let digest = client.push("hpk/httpd", "v1", &image).await.expect("push");
    let pulled = client.pull("hpk/httpd", digest.as_str()).await.expect("pull by digest");
    assert_eq!(pulled.digest, digest);
    assert_eq!(pulled.digest, image.digest);
    // Nothing of the registry listens in the root namespace: its only socket is on the host.
    let listeners =
        hpk_integration::netns::run(std::process::Command::new("ss").args(["-Hltn"])).expect("ss");
    assert!(!listeners.contains(&format!(":{} ", registry.addr().port())), "{listeners}");
}
