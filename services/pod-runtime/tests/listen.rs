//! `--listen` (a kubelet on another machine, with mutual TLS): its files are checked before
//! the runtime makes anything.

use std::os::unix::fs::PermissionsExt;

const RUNTIME: &str = env!("CARGO_BIN_EXE_hpk-pod-runtime");

#[test]
fn listen_refuses_missing_flags_an_open_key_and_junk_before_making_anything() {
    let dir = tempfile::tempdir().expect("tmp");
    let root = dir.path().join("root");
    let key = rcgen::KeyPair::generate().expect("key");
    let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .expect("params")
        .self_signed(&key)
        .expect("cert");
    let write = |name: &str, text: &str, mode: u32| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).expect("write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
        path.display().to_string()
    };
    let crt = write("tls.crt", &cert.pem(), 0o644);
    let open_key = write("open.key", &key.serialize_pem(), 0o644);
    let private_key = write("tls.key", &key.serialize_pem(), 0o600);
    let junk = write("junk.crt", "not a certificate\n", 0o644);
    let cases: [(Vec<String>, i32, &str); 3] = [
        (vec!["--listen=127.0.0.1:0".into()], 2, "--tls-cert-file"),
        (
            vec![
                "--listen=127.0.0.1:0".into(),
                format!("--tls-cert-file={crt}"),
                format!("--tls-private-key-file={open_key}"),
                format!("--client-ca-file={crt}"),
            ],
            78,
            "chmod 0600",
        ),
        (
            vec![
                "--listen=127.0.0.1:0".into(),
                format!("--tls-cert-file={crt}"),
                format!("--tls-private-key-file={private_key}"),
                format!("--client-ca-file={junk}"),
            ],
            78,
            "client CA",
        ),
    ];
    for (args, code, says) in cases {
        let out = std::process::Command::new(RUNTIME)
            .arg(format!("--socket={}", dir.path().join("run/cri.sock").display()))
            .arg(format!("--root={}", root.display()))
            .args(&args)
            .output()
            .expect("run hpk-pod-runtime");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: expected {says:?} in {stderr}");
        assert!(!root.exists() && !dir.path().join("run").exists(), "{args:?} made state");
    }
}
