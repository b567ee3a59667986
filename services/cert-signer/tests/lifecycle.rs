//! Start-up refusals, graceful shutdown, renewal through the command line, and grpcurl.

mod support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use support::{BIN, Pki, Signer, init_crypto, write_mode};
use x509_parser::prelude::*;

fn serve_once(pki: &Pki) -> std::process::Output {
    Command::new(BIN).args(pki.serve_args()).stdin(Stdio::null()).output().expect("run signer")
}

#[test]
fn refuses_to_start_with_a_group_readable_ca_key() {
    let pki = Pki::new();
    std::fs::set_permissions(&pki.serving_ca_key, std::os::unix::fs::PermissionsExt::from_mode(0o644))
        .expect("chmod");
    let out = serve_once(&pki);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{stderr}");
    assert!(stderr.contains("0644") && stderr.contains("chmod 600"), "the message names the fix: {stderr}");
    assert!(!pki.address_file().exists(), "a refused signer never listens");
}

#[test]
fn refuses_to_start_with_a_ca_key_under_the_shared_directory() {
    let mut pki = Pki::new();
    let shared_key = pki.shared_dir.join("client-ca.key");
    write_mode(&shared_key, &std::fs::read(&pki.client_ca_key).expect("read"), 0o600);
    pki.client_ca_key = shared_key;
    let out = serve_once(&pki);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{stderr}");
    assert!(stderr.contains("shared directory"), "{stderr}");
    assert!(!pki.address_file().exists());
}

#[test]
fn refuses_a_ca_key_that_does_not_match_its_certificate() {
    let mut pki = Pki::new();
    pki.serving_ca_key = pki.client_ca_key.clone();
    let out = serve_once(&pki);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{stderr}");
    assert!(stderr.contains("does not belong"), "{stderr}");
}

#[test]
fn sigterm_stops_gracefully_and_removes_the_address_file() {
    let pki = Pki::new();
    let mut signer = Signer::start(&pki, &[]);
    assert!(pki.address_file().exists());
    let status = signer.stop();
    assert!(status.success(), "exit status {status}: {}", signer.log());
    assert!(!pki.address_file().exists());
    assert!(signer.log().contains("shutting down"), "{}", signer.log());
}

#[test]
fn request_refuses_to_write_the_key_to_the_shared_directory() {
    let pki = Pki::new();
    let signer = Signer::start(&pki, &[]);
    let out = Command::new(BIN)
        .args(["request", "--node-name=n1", "--san=n1"])
        .arg(format!("--server={}", signer.url))
        .arg(format!("--ca-cert={}", pki.serving_ca_cert.display()))
        .arg(format!("--token-file={}", pki.token_file_for("n1").display()))
        .arg(format!("--shared-dir={}", pki.shared_dir.display()))
        .arg(format!("--cert-out={}", pki.shared_dir.join("n1.crt").display()))
        .arg(format!("--key-out={}", pki.shared_dir.join("n1.key").display()))
        .output()
        .expect("run request");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{stderr}");
    assert!(!pki.shared_dir.join("n1.key").exists() && !pki.shared_dir.join("n1.crt").exists());
}

/// `node-token` makes the token the signer expects of a node, in a private file off the shared
/// directory; bad input writes nothing.
#[test]
fn node_token_writes_a_nodes_token_privately() {
    use std::os::unix::fs::PermissionsExt;
    let pki = Pki::new();
    let run =
        |args: &[String]| Command::new(BIN).arg("node-token").args(args).output().expect("run node-token");
    let key = format!("--key-file={}", pki.token_key_file.display());
    let shared = format!("--shared-dir={}", pki.shared_dir.display());
    let printed = run(&[key.clone(), "--node-name=n1".into()]);
    assert!(printed.status.success(), "{}", String::from_utf8_lossy(&printed.stderr));
    assert_eq!(String::from_utf8_lossy(&printed.stdout).trim(), pki.token_for("n1"));

    let out = pki.dir.path().join("local/n7.token");
    let written =
        run(&[key.clone(), "--node-name=n7".into(), format!("--out={}", out.display()), shared.clone()]);
    assert!(written.status.success(), "{}", String::from_utf8_lossy(&written.stderr));
    assert_eq!(std::fs::read_to_string(&out).expect("token").trim(), pki.token_for("n7"));
    assert_eq!(std::fs::metadata(&out).expect("meta").permissions().mode() & 0o777, 0o600);

    // Refused, each with a message and nothing written: a token in the shared directory, a
    // name that is not a node's, a key others can read.
    let in_shared = pki.shared_dir.join("n8.token");
    let refused =
        run(&[key.clone(), "--node-name=n8".into(), format!("--out={}", in_shared.display()), shared]);
    assert!(!refused.status.success() && !in_shared.exists(), "{}", String::from_utf8_lossy(&refused.stderr));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("shared"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    let bad_name = run(&[key.clone(), "--node-name=Not_A_Node".into()]);
    assert!(!bad_name.status.success() && bad_name.stdout.is_empty());
    std::fs::set_permissions(&pki.token_key_file, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let open_key = run(&[key, "--node-name=n1".into()]);
    assert!(!open_key.status.success() && open_key.stdout.is_empty());
    assert!(
        String::from_utf8_lossy(&open_key.stderr).contains("0644"),
        "{}",
        String::from_utf8_lossy(&open_key.stderr)
    );
}

/// Serial and expiry of the first certificate in a PEM file.
fn serial_and_expiry(path: &Path) -> Option<(String, i64)> {
    let pem_text = std::fs::read(path).ok()?;
    let (_, pem) = parse_x509_pem(&pem_text).ok()?;
    let (_, cert) = X509Certificate::from_der(&pem.contents).ok()?;
    Some((cert.raw_serial_as_string(), cert.validity().not_after.timestamp()))
}

#[test]
fn renews_a_short_lived_certificate_before_it_expires() {
    let pki = Pki::new();
    let signer = Signer::start(&pki, &["--max-validity=6s"]);
    let node_dir = pki.dir.path().join("node-local");
    std::fs::create_dir(&node_dir).expect("mkdir");
    let (cert, key) = (node_dir.join("kubelet.crt"), node_dir.join("kubelet.key"));
    let renewer = Command::new(BIN)
        // A client certificate: each renewal presents the current one (the token enrols once).
        .args(["request", "--renew", "--node-name=n1", "--profile=client"])
        .arg(format!("--server-file={}", pki.address_file().display()))
        .arg(format!("--ca-cert={}", pki.serving_ca_cert.display()))
        .arg(format!("--token-file={}", pki.token_file_for("n1").display()))
        .arg(format!("--shared-dir={}", pki.shared_dir.display()))
        .arg(format!("--cert-out={}", cert.display()))
        .arg(format!("--key-out={}", key.display()))
        .stderr(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn renewer");
    // Stopped however the test ends: a renewer left behind would hold the test's output open.
    struct Stop(std::process::Child);
    impl Drop for Stop {
        fn drop(&mut self) {
            support::terminate(&mut self.0);
        }
    }
    let _renewer = Stop(renewer);

    let deadline = Instant::now() + Duration::from_secs(10);
    let first = loop {
        if let Some(found) = serial_and_expiry(&cert) {
            break found;
        }
        assert!(Instant::now() < deadline, "no first certificate: {}", signer.log());
        std::thread::sleep(Duration::from_millis(20));
    };
    let first_key = std::fs::read(&key).expect("key");
    let key_mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&key).expect("meta").permissions());
    assert_eq!(key_mode & 0o777, 0o600);

    // The renewal must land before the first certificate expires.
    let renewed = loop {
        match serial_and_expiry(&cert) {
            Some(found) if found.0 != first.0 => break found,
            _ => {}
        }
        let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).expect("clock").as_secs();
        assert!(i64::try_from(now).expect("fits") < first.1, "certificate expired before renewal");
        std::thread::sleep(Duration::from_millis(50));
    };
    let renewed_at = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).expect("clock").as_secs();
    assert!(i64::try_from(renewed_at).expect("fits") <= first.1, "renewed after expiry");
    assert!(renewed.1 > first.1, "the new certificate lives longer");
    assert_ne!(std::fs::read(&key).expect("key"), first_key, "renewal uses a fresh key");
}

/// Finds a tool on PATH. When HPK_REQUIRE_TOOLS=1 (the README's test command sets it) a
/// missing tool fails the test; otherwise the test says why it is skipped.
fn tool(name: &str) -> Option<std::path::PathBuf> {
    let found = std::env::var_os("PATH")
        .and_then(|paths| std::env::split_paths(&paths).map(|p| p.join(name)).find(|p| p.is_file()));
    if found.is_none() {
        hpk_test_support::skip(format!(
            "{name} is not on PATH; run the README's test command, which installs it"
        ));
    }
    found
}

#[test]
fn grpcurl_lists_the_services_and_checks_health() {
    init_crypto();
    let Some(grpcurl) = tool("grpcurl") else { return };
    let pki = Pki::new();
    let signer = Signer::start(&pki, &[]);
    let target = signer.url.trim_start_matches("https://").to_owned();
    let ca = pki.serving_ca_cert.display().to_string();
    let run = |args: &[&str]| {
        let out = Command::new(&grpcurl).args(["-cacert", &ca]).args(args).output().expect("run grpcurl");
        assert!(out.status.success(), "grpcurl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).expect("utf-8")
    };
    let services = run(&[&target, "list"]);
    let names: Vec<&str> = services.lines().collect();
    assert!(names.contains(&"hpk.certsigner.v1.CertSigner"), "{services}");
    assert!(names.contains(&"grpc.health.v1.Health"), "{services}");
    let methods = run(&[&target, "list", "hpk.certsigner.v1.CertSigner"]);
    assert!(methods.contains("SignKubeletServingCertificate"), "{methods}");
    let health =
        run(&["-d", r#"{"service":"hpk.certsigner.v1.CertSigner"}"#, &target, "grpc.health.v1.Health/Check"]);
    assert!(health.contains("\"SERVING\""), "{health}");
}
