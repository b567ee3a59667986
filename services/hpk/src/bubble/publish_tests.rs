use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use super::*;

const CERT: &str = "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIU\n-----END CERTIFICATE-----\n";
const KEY: &str = "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49\n-----END PRIVATE KEY-----\n";

struct Fixture {
    _tmp: tempfile::TempDir,
    node_dir: PathBuf,
    shared: Shared,
}

impl Fixture {
    fn new() -> Self {
        let tmp = tempfile::tempdir().expect("tempdir");
        let node_dir = tmp.path().join("node");
        std::fs::create_dir_all(node_dir.join(PUBLISH_DIR)).expect("mkdir");
        let shared = Shared { name: "c".into(), dir: tmp.path().join("shared") };
        std::fs::create_dir_all(&shared.dir).expect("mkdir");
        Fixture { _tmp: tmp, node_dir, shared }
    }

    fn part(&self, name: &str, text: &str) {
        std::fs::write(self.node_dir.join(PUBLISH_DIR).join(name), text).expect("write");
    }

    fn controller_parts(&self) {
        for name in ["ca.crt", "client-ca.crt", "admin.crt"] {
            self.part(name, CERT);
        }
        self.part("admin.key", KEY);
        self.part(READY, "");
    }

    fn publish(&self, role: Role) -> Result<bool> {
        let ports =
            [("apiserver".to_owned(), 6443), ("cert-signer".to_owned(), 7443), ("runtime".to_owned(), 8443)];
        let target =
            Target { shared: &self.shared, role, address: Ipv4Addr::new(10, 1, 2, 3), ports: &ports };
        try_publish(&self.node_dir, &target)
    }

    fn shared_files(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&self.shared.dir)
            .expect("read_dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }
}

#[test]
fn the_controller_publishes_kubeconfigs_it_writes_itself() {
    let f = Fixture::new();
    f.controller_parts();
    assert!(f.publish(Role::Controller).expect("publish"));
    assert_eq!(f.shared_files(), ["apiserver", "ca.crt", "cert-signer", "client-ca.crt", "kubeconfig"]);
    let read = |name: &str| std::fs::read_to_string(f.shared.dir.join(name)).expect("read");
    assert_eq!(read("apiserver"), "https://10.1.2.3:6443");
    assert_eq!(read("cert-signer"), "https://10.1.2.3:7443\n");
    assert_eq!(read("ca.crt"), CERT);
    let config = kube::config::Kubeconfig::from_yaml(&read("kubeconfig")).expect("a kubeconfig");
    let cluster = config.clusters[0].cluster.as_ref().expect("cluster");
    assert_eq!(cluster.server.as_deref(), Some("https://10.1.2.3:6443"));
    let user = config.auth_infos[0].auth_info.as_ref().expect("user");
    assert!(user.exec.is_none() && user.auth_provider.is_none() && user.token.is_none());
    assert!(user.client_certificate_data.is_some() && user.client_key_data.is_some());
    let mode = std::fs::metadata(f.shared.kubeconfig()).expect("stat").permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    // In the shared directory (which every bubble sees) only a link; the credential lies
    // beside it, where no bubble looks.
    let link = std::fs::read_link(f.shared.kubeconfig()).expect("the kubeconfig is a link");
    assert_eq!(link, f.shared.dir.with_file_name("shared.kubeconfig"));
    assert!(!link.starts_with(&f.shared.dir));
    for name in f.shared_files() {
        let path = f.shared.dir.join(&name);
        if !std::fs::symlink_metadata(&path).expect("stat").is_symlink() {
            assert!(!std::fs::read_to_string(&path).expect("read").contains("PRIVATE KEY"), "{name}");
        }
    }
    // Removing the cluster's files takes both.
    f.shared.remove().expect("remove");
    assert!(!f.shared.dir.exists() && !link.exists());
}

#[test]
fn nothing_is_published_before_the_bubble_is_ready() {
    let f = Fixture::new();
    f.part("ca.crt", CERT);
    assert!(!f.publish(Role::Controller).expect("publish"));
    std::fs::remove_file(f.node_dir.join(PUBLISH_DIR).join("ca.crt")).expect("rm");
    std::fs::remove_dir(f.node_dir.join(PUBLISH_DIR)).expect("rmdir");
    assert!(!f.publish(Role::Controller).expect("publish"));
    assert!(!f.publish(Role::Worker).expect("a worker publishes nothing"));
    assert!(f.shared_files().is_empty());
}

/// A bubble taken over tries to plant something in the user's kubeconfig, or to have the
/// launcher read a file of the user's: each part is refused, with its name, and nothing at
/// all is published.
#[test]
fn hostile_parts_are_refused_and_nothing_is_published() {
    let cases: &[(&str, &str)] = &[
        ("admin.crt", "apiVersion: v1\nusers:\n- user:\n    exec: {command: /bin/sh}\n"),
        ("admin.key", CERT),
        ("ca.crt", &format!("{CERT}{CERT}")),
        ("ca.crt", "-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n"),
        ("ca.crt", "-----BEGIN CERTIFICATE-----\naGVsbG8=\n-----END CERTIFICATE-----\n"),
        ("admin.crt", &format!("{CERT}\nexec: x\n")),
        ("client-ca.crt", &"A".repeat(70_000)),
    ];
    for (name, text) in cases {
        let f = Fixture::new();
        f.controller_parts();
        f.part(name, text);
        let err = f.publish(Role::Controller).expect_err(&format!("{name} {text:.40}")).to_string();
        assert!(err.contains(name), "{err}");
        assert!(f.shared_files().is_empty(), "{name}: {:?}", f.shared_files());
    }

    // A link to a file of the user's, a FIFO, a directory.
    let f = Fixture::new();
    f.controller_parts();
    let secret = f.shared.dir.parent().expect("parent").join("id_rsa");
    std::fs::write(&secret, KEY).expect("write");
    let admin_key = f.node_dir.join(PUBLISH_DIR).join("admin.key");
    std::fs::remove_file(&admin_key).expect("rm");
    std::os::unix::fs::symlink(&secret, &admin_key).expect("symlink");
    let err = f.publish(Role::Controller).expect_err("a link").to_string();
    assert!(err.contains("admin.key") && err.contains("symbolic link"), "{err}");
    std::fs::remove_file(&admin_key).expect("rm");
    nix::unistd::mkfifo(&admin_key, Mode::from_bits_truncate(0o600)).expect("mkfifo");
    let err = f.publish(Role::Controller).expect_err("a FIFO").to_string();
    assert!(err.contains("not a regular file"), "{err}");
    std::fs::remove_file(&admin_key).expect("rm");
    std::fs::create_dir(&admin_key).expect("mkdir");
    assert!(f.publish(Role::Controller).is_err());
    std::fs::remove_dir(&admin_key).expect("rmdir");
    let err = f.publish(Role::Controller).expect_err("missing").to_string();
    assert!(err.contains("admin.key") && err.contains("missing"), "{err}");
    assert!(f.shared_files().is_empty());

    // The publish directory itself swapped for a link.
    let f = Fixture::new();
    f.controller_parts();
    let elsewhere = f.node_dir.join("elsewhere");
    std::fs::rename(f.node_dir.join(PUBLISH_DIR), &elsewhere).expect("mv");
    std::os::unix::fs::symlink(&elsewhere, f.node_dir.join(PUBLISH_DIR)).expect("symlink");
    assert!(f.publish(Role::Controller).is_err());
    assert!(f.shared_files().is_empty());
}

#[test]
fn the_runtime_publishes_its_ca_and_the_launchers_endpoint() {
    let f = Fixture::new();
    f.part("runtime-ca.crt", CERT);
    f.part(READY, "");
    assert!(f.publish(Role::Runtime).expect("publish"));
    assert_eq!(f.shared_files(), ["runtime-ca.crt", "runtime-endpoint"]);
    assert_eq!(
        std::fs::read_to_string(f.shared.dir.join("runtime-endpoint")).expect("read"),
        "https://10.1.2.3:8443\n"
    );
}
