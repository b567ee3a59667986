use super::*;

fn file(json: serde_json::Value) -> AuthFile {
    serde_json::from_value(json).expect("auth file")
}

fn basic(user: &str, password: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
}

#[test]
fn credentials_are_found_however_the_file_spells_the_registry() {
    let f = file(serde_json::json!({"auths": {
        "https://index.docker.io/v1/": {"auth": basic("hub", "pw")},
        "registry.example.org:5000": {"username": "alice", "password": "a:b"},
        "http://10.0.0.7:5000/some/path": {"auth": basic("bob", "with:colon")},
        "tokens.example.org": {"registrytoken": "tok"},
    }}));
    let is_basic =
        |a: RegistryAuth, u: &str, p: &str| matches!(a, RegistryAuth::Basic(x, y) if x == u && y == p);
    assert!(is_basic(auth_for(&f, "index.docker.io").expect("hub"), "hub", "pw"));
    assert!(is_basic(auth_for(&f, "docker.io").expect("hub"), "hub", "pw"));
    assert!(is_basic(auth_for(&f, "registry.example.org:5000").expect("alice"), "alice", "a:b"));
    assert!(is_basic(auth_for(&f, "10.0.0.7:5000").expect("bob"), "bob", "with:colon"));
    assert!(
        matches!(auth_for(&f, "tokens.example.org").expect("token"), RegistryAuth::Bearer(t) if t == "tok")
    );
    assert!(
        matches!(auth_for(&f, "registry.example.org").expect("another port"), RegistryAuth::Anonymous),
        "a host's entry does not serve another port of it"
    );
    assert!(matches!(auth_for(&f, "quay.io").expect("none"), RegistryAuth::Anonymous));
}

#[test]
fn credentials_hpk_cannot_use_are_refused_by_name() {
    let f = file(serde_json::json!({
        "auths": {
            "helped.example.org": {},
            "oauth.example.org": {"identitytoken": "refresh"},
            "broken.example.org": {"auth": "***"},
            "nocolon.example.org": {"auth": base64::engine::general_purpose::STANDARD.encode("justuser")},
        },
        "credsStore": "desktop",
        "credHelpers": {"gcr.example.org": "gcloud"}
    }));
    let err = |r: &str| match auth_for(&f, r) {
        Err(e) => e,
        Ok(_) => panic!("{r}: credentials that cannot be used must be refused"),
    };
    assert!(err("helped.example.org").contains("docker-credential-desktop"));
    assert!(err("gcr.example.org").contains("docker-credential-gcloud"));
    assert!(err("oauth.example.org").contains("identity token"));
    assert!(err("broken.example.org").contains("not base64"));
    assert!(err("nocolon.example.org").contains("user:password"));
}

#[test]
fn loopback_registries_are_told_apart() {
    for r in ["127.0.0.1:5000", "localhost:5000", "localhost", "[::1]:5000", "127.9.9.9"] {
        assert!(is_loopback(r), "{r}");
    }
    for r in ["10.0.0.7:5000", "registry.example.org", "[fd00::1]:443", "localhost.example.org:5000"] {
        assert!(!is_loopback(r), "{r}");
    }
}

/// A layout of one small image for `arch`, as images/build.sh writes one.
fn layout(dir: &Path, arch: Option<&str>, content: &str) {
    std::fs::create_dir_all(dir.join("blobs/sha256")).expect("mkdir");
    std::fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).expect("write");
    let put = |bytes: &[u8]| {
        let digest = sha256(bytes);
        std::fs::write(dir.join("blobs/sha256").join(&digest[7..]), bytes).expect("blob");
        digest
    };
    let layer = content.as_bytes();
    let layer_digest = put(layer);
    let mut config =
        serde_json::json!({"os": "linux", "rootfs": {"type": "layers", "diff_ids": [layer_digest]}});
    if let Some(arch) = arch {
        config["architecture"] = arch.into();
    }
    let config = config.to_string();
    let config_digest = put(config.as_bytes());
    let manifest = serde_json::json!({
        "schemaVersion": 2, "mediaType": OCI_MANIFEST,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": config.len()},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer_digest, "size": layer.len()}]
    })
    .to_string();
    let manifest_digest = put(manifest.as_bytes());
    let index = serde_json::json!({"schemaVersion": 2, "manifests": [
        {"mediaType": OCI_MANIFEST, "digest": manifest_digest, "size": manifest.len()}
    ]});
    std::fs::write(dir.join("index.json"), index.to_string()).expect("index");
}

fn args(to: &str, images: Vec<PathBuf>) -> PushArgs {
    // Nothing listens on port 1: a push that got as far as the network would fail there
    // instead, with another message.
    PushArgs { to: to.to_owned(), images, plain_http: true, ca_file: None, authfile: None }
}

#[test]
fn images_are_read_into_one_index_in_the_order_given() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (amd, arm) = (dir.path().join("amd64"), dir.path().join("arm64"));
    layout(&amd, Some("amd64"), "amd");
    layout(&arm, Some("arm64"), "arm");
    let scratch = dir.path().join("scratch");
    let mut images = read_image(&arm, &scratch.join("0")).expect("arm64");
    images.extend(read_image(&amd, &scratch.join("1")).expect("amd64"));
    let index: serde_json::Value =
        serde_json::from_slice(&index_document(&images).expect("index")).expect("json");
    assert_eq!(index["mediaType"], OCI_INDEX);
    let platforms: Vec<&str> = index["manifests"]
        .as_array()
        .expect("list")
        .iter()
        .map(|m| m["platform"]["architecture"].as_str().unwrap())
        .collect();
    assert_eq!(platforms, ["arm64", "amd64"]);
    for (entry, image) in index["manifests"].as_array().expect("list").iter().zip(&images) {
        assert_eq!(entry["digest"], image.manifest_digest.as_str());
        assert_eq!(entry["size"], image.manifest.len());
        assert_eq!(entry["platform"]["os"], "linux");
        assert!(entry["platform"].get("variant").is_none(), "no variant unless the config names one");
    }
    assert_eq!(images[0].blobs.len(), 2, "the config and the one layer");
}

#[tokio::test]
async fn bad_images_are_refused_before_the_registry_is_asked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (a, b, no_arch, corrupt) =
        (dir.path().join("a"), dir.path().join("b"), dir.path().join("no-arch"), dir.path().join("corrupt"));
    layout(&a, Some("amd64"), "one");
    layout(&b, Some("amd64"), "two");
    layout(&no_arch, None, "three");
    layout(&corrupt, Some("arm64"), "four");
    let layer = corrupt.join("blobs/sha256").join(&sha256(b"four")[7..]);
    std::fs::write(&layer, "FOUR").expect("corrupt it");
    let cases: Vec<(PushArgs, &str)> = vec![
        (args("127.0.0.1:1/hpk/x:1", vec![a.clone(), b.clone()]), "both linux/amd64"),
        (args("127.0.0.1:1/hpk/x:1", vec![no_arch.clone()]), "names no architecture"),
        (args("127.0.0.1:1/hpk/x:1", vec![a.clone(), corrupt.clone()]), "corrupt"),
        (args("127.0.0.1:1/hpk/x:1", vec![dir.path().join("missing")]), "No such file"),
        (
            args(
                "127.0.0.1:1/hpk/x@sha256:0000000000000000000000000000000000000000000000000000000000000000",
                vec![a.clone()],
            ),
            "names a digest",
        ),
        (args("127.0.0.1:1/UPPER/x:1", vec![a.clone()]), "not an image reference"),
    ];
    for (args, expected) in cases {
        let err = push(&args).await.expect_err(expected).to_string();
        assert!(err.contains(expected), "{:?}: {err}", args.images);
        assert!(!err.contains("cannot reach"), "refused before any connection: {err}");
    }
}

#[test]
fn credentials_never_go_over_plain_http_to_another_machine() {
    let creds = RegistryAuth::Basic("u".into(), "p".into());
    let file = Path::new("/home/u/.docker/config.json");
    let err = check_clear_text(true, &creds, Some(file), "registry.example.org:5000").expect_err("refused");
    assert!(
        err.to_string().contains("in clear text") && err.to_string().contains(".docker/config.json"),
        "{err}"
    );
    check_clear_text(true, &creds, Some(file), "127.0.0.1:5000").expect("this machine");
    check_clear_text(false, &creds, Some(file), "registry.example.org:5000").expect("TLS");
    check_clear_text(true, &RegistryAuth::Anonymous, None, "registry.example.org:5000")
        .expect("nothing secret");
}
