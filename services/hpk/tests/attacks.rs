//! Attacks from the review (`shared/notes/security-review.md`), each run against a real
//! `hpk up` cluster from another machine on the network, as an unprivileged user. Each shows
//! the attack now fails while the victim's cluster keeps working.

mod support;

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::{Env, eventually, eventually_or, prerequisites, text};

/// The published ports of a cluster: the API server, the cert-signer and each node's kubelet.
fn published_ports(env: &Env, cluster: &str) -> Vec<(String, SocketAddr)> {
    let shared = env.home.path().join(cluster);
    let address = |file: &str| -> SocketAddr {
        let raw = std::fs::read_to_string(shared.join(file)).expect("address file");
        let raw = raw.trim().trim_start_matches("https://").trim_end_matches('/');
        raw.parse().unwrap_or_else(|e| panic!("{file}: {raw:?}: {e}"))
    };
    let mut ports = vec![
        ("apiserver".to_owned(), address("apiserver")),
        ("cert-signer".to_owned(), address("cert-signer")),
    ];
    let kubelets = env.kubectl_ok(cluster, &[
        "get",
        "nodes",
        "-o",
        r#"jsonpath={range .items[*]}{.metadata.name} {.status.addresses[?(@.type=="InternalIP")].address}:{.status.daemonEndpoints.kubeletEndpoint.Port}{"\n"}{end}"#,
    ]);
    for line in kubelets.lines() {
        let (node, addr) = line.split_once(' ').expect("node line");
        ports.push((format!("kubelet of {node}"), addr.parse().expect("kubelet address")));
    }
    ports
}

/// Established connections to `port` on the test host from `peer`, counted on the host.
fn held_from(env: &Env, port: u16, peer: std::net::Ipv4Addr) -> usize {
    let out = Command::new("ip")
        .args(["netns", "exec", &env.host.netns, "ss", "-Htn", "state", "established"])
        .arg(format!("( sport = :{port} and dst {peer} )"))
        .output()
        .expect("ss");
    String::from_utf8_lossy(&out.stdout).lines().filter(|l| !l.trim().is_empty()).count()
}

/// The node's client certificate and key in its node directory.
fn node_client_cert(env: &Env, node: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let out = Command::new("find")
        .arg(env.state.path())
        .args(["-path", &format!("*/{node}/node-client.crt")])
        .output()
        .expect("find");
    let found = String::from_utf8_lossy(&out.stdout);
    let cert = std::path::PathBuf::from(
        found.lines().next().unwrap_or_else(|| panic!("no client certificate of {node}")),
    );
    let key = cert.with_file_name("node-client.key");
    (cert, key)
}

/// The node token the launcher of `node` keeps in its node directory.
fn node_token(env: &Env, node: &str) -> std::path::PathBuf {
    node_client_cert(env, node).0.with_file_name("node-token")
}

/// `hpk-cert-signer request` for `node`'s client certificate, as the node renews it: with the
/// token and its current certificate.
fn signer_signs(env: &Env, cluster: &str, node: &str, out_dir: &Path) -> Result<(), String> {
    let shared = env.home.path().join(cluster);
    let signer = Path::new(env!("CARGO_BIN_EXE_hpk")).with_file_name("hpk-cert-signer");
    let (cert, key) = node_client_cert(env, node);
    let out = Command::new(signer)
        .arg("request")
        .arg(format!("--client-cert={}", cert.display()))
        .arg(format!("--client-key={}", key.display()))
        .arg(format!("--server-file={}", shared.join("cert-signer").display()))
        .arg(format!("--ca-cert={}", shared.join("ca.crt").display()))
        .arg(format!("--token-file={}", node_token(env, node).display()))
        .arg(format!("--node-name={node}"))
        .arg("--profile=client")
        .arg(format!("--cert-out={}", out_dir.join("c.crt").display()))
        .arg(format!("--key-out={}", out_dir.join("c.key").display()))
        .arg(format!("--shared-dir={}", shared.display()))
        .output()
        .map_err(|e| format!("run hpk-cert-signer: {e}"))?;
    if out.status.success() { Ok(()) } else { Err(text(&out)) }
}

/// H2: 2,000 idle connections to every published port, held for a minute from another machine
/// by an unprivileged user, and opened again whenever they are closed. The victim's launchers
/// start with a soft limit of 1,024 open files, as a job step often does. Throughout, kubectl
/// answers, both nodes stay Ready, logs stream from the worker's kubelet and the signer signs;
/// the host holds only a bounded share of the flood, and silent connections are closed.
#[tokio::test(flavor = "multi_thread")]
async fn idle_connection_floods_leave_the_cluster_working() {
    let Some(image) = prerequisites() else { return };
    let flood_tool = Path::new(env!("CARGO_BIN_EXE_hpk")).with_file_name("hpk-testcluster");
    assert!(flood_tool.is_file(), "{} is missing: cargo build --workspace --bins", flood_tool.display());
    let env = Env::start(image).await;
    let out = env.up_with_soft_nofile("flood", 2, 1024);
    assert!(out.status.success(), "hpk up: {}", text(&out));
    let nodes = env.kubectl_ok("flood", &["get", "nodes", "-o", "jsonpath={.items[*].metadata.name}"]);
    let nodes: Vec<&str> = nodes.split_whitespace().collect();
    assert_eq!(nodes.len(), 2, "{nodes:?}");
    // `hpk up` names the nodes NAME-1 (the controller) and NAME-2.
    let worker = "flood-2";
    assert!(nodes.contains(&worker), "{nodes:?}");

    // A pod on the worker that prints a line a second: its logs come through that kubelet's port.
    env.apply("flood", &format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: ticker\nspec:\n  nodeName: {worker}\n  containers:\n  - name: c\n    image: {}\n    command: [sh, -c, 'while true; do echo tick; sleep 1; done']\n",
        env.shell
    ));
    eventually("the ticker pod runs", Duration::from_secs(90), || {
        let phase = env.kubectl_ok("flood", &["get", "pod", "ticker", "-o", "jsonpath={.status.phase}"]);
        (phase == "Running").then_some(())
    });

    let ports = published_ports(&env, "flood");
    assert_eq!(ports.len(), 4, "{ports:?}");
    let attacker = env.attacker().clone();
    let mut flood = attacker.command("setpriv");
    flood.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"]).arg(&flood_tool).arg("flood");
    for (_, addr) in &ports {
        flood.arg(format!("--target={addr}"));
    }
    let flood = flood
        .args(["--connections=2000", "--seconds=75"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the flood");
    let pid = flood.id();
    // Kill the flood by its PID if an assertion fails before it ends.
    struct Stop(u32);
    impl Drop for Stop {
        fn drop(&mut self) {
            if let Ok(pid) = i32::try_from(self.0) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }
    let _stop = Stop(pid);
    std::thread::sleep(Duration::from_secs(10));

    let scratch = tempfile::tempdir().expect("tempdir");
    let started = Instant::now();
    let mut rounds = 0;
    let mut most_held = vec![0usize; ports.len()];
    while started.elapsed() < Duration::from_secs(55) {
        rounds += 1;
        let t = Instant::now();
        let listed = env.kubectl("flood", &["get", "nodes", "--no-headers", "--request-timeout=10s"]);
        assert!(
            listed.status.success(),
            "round {rounds}: kubectl get nodes failed under the flood: {}",
            text(&listed)
        );
        let listed = text(&listed);
        let ready = listed.lines().filter(|l| l.split_whitespace().nth(1) == Some("Ready")).count();
        assert_eq!(ready, 2, "round {rounds}: a node is not Ready under the flood:\n{listed}");
        let logs = env.kubectl("flood", &["logs", "ticker", "--tail=1", "--request-timeout=10s"]);
        assert!(
            logs.status.success() && text(&logs).contains("tick"),
            "round {rounds}: logs from the worker's kubelet failed under the flood: {}",
            text(&logs)
        );
        if let Err(e) = signer_signs(&env, "flood", worker, scratch.path()) {
            panic!("round {rounds}: the cert-signer refused a genuine request under the flood: {e}");
        }
        for (i, (_, addr)) in ports.iter().enumerate() {
            most_held[i] = most_held[i].max(held_from(&env, addr.port(), attacker.ip));
        }
        eprintln!(
            "round {rounds}: kubectl, logs and the signer answered in {:.1} s",
            t.elapsed().as_secs_f64()
        );
        std::thread::sleep(Duration::from_secs(3));
    }
    assert!(rounds >= 5, "only {rounds} rounds ran");

    let out = flood.wait_with_output().expect("the flood ends");
    let report = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "the flood failed: {}{}", report, String::from_utf8_lossy(&out.stderr));
    eprintln!("flood:\n{report}");
    for (i, (name, addr)) in ports.iter().enumerate() {
        let line = report
            .lines()
            .find(|l| l.starts_with(&format!("target={addr} ")))
            .unwrap_or_else(|| panic!("no report for {name} ({addr}): {report}"));
        let field = |key: &str| -> u64 {
            line.split_whitespace()
                .find_map(|f| f.strip_prefix(&format!("{key}=")))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{key} in {line}"))
        };
        // The attacker had its 2,000 connections accepted, and the host closed them: at most
        // a bounded share was ever held, and silent ones do not outlive the first-byte timeout.
        assert!(field("opened") >= 2000, "{name}: {line}");
        assert!(field("closed_by_server") >= 2000, "{name}: the host kept the flood's connections: {line}");
        assert!(
            most_held[i] <= 700,
            "{name}: the host held {} of the attacker's connections at once, more than one source may",
            most_held[i]
        );
        eprintln!("{name}: the host held at most {} of the attacker's connections at once", most_held[i]);
    }
}

/// Runs `hpk-cert-signer request` from the attacker's machine as nobody, with a copy of a
/// node's token (and, with `identity`, of that node's client certificate and key); Ok(certificate
/// PEM) or the refusal.
fn leaked_token_request(
    env: &Env,
    loot: &Path,
    identity: bool,
    node: &str,
    profile: &str,
    sans: &[&str],
) -> Result<String, String> {
    let signer = Path::new(env!("CARGO_BIN_EXE_hpk")).with_file_name("hpk-cert-signer");
    let out_dir = loot.join(format!("{node}-{profile}-{identity}-{}", sans.join("_")));
    std::fs::create_dir_all(&out_dir).expect("mkdir");
    nix::unistd::chown(
        &out_dir,
        Some(nix::unistd::Uid::from_raw(65534)),
        Some(nix::unistd::Gid::from_raw(65534)),
    )
    .expect("chown");
    let mut cmd = env.attacker().command("setpriv");
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(signer)
        .arg("request")
        .arg(format!("--server-file={}", loot.join("cert-signer").display()))
        .arg(format!("--ca-cert={}", loot.join("ca.crt").display()))
        .arg(format!("--token-file={}", loot.join("node-token").display()))
        .arg(format!("--node-name={node}"))
        .arg(format!("--profile={profile}"))
        .arg(format!("--cert-out={}", out_dir.join("c.crt").display()))
        .arg(format!("--key-out={}", out_dir.join("c.key").display()))
        .arg("--shared-dir=/nonexistent-shared");
    if identity {
        cmd.arg(format!("--client-cert={}", loot.join("node-client.crt").display()))
            .arg(format!("--client-key={}", loot.join("node-client.key").display()));
    }
    for san in sans {
        cmd.arg(format!("--san={san}"));
    }
    let out = cmd.output().expect("run hpk-cert-signer");
    if out.status.success() {
        Ok(std::fs::read_to_string(out_dir.join("c.crt")).expect("certificate"))
    } else {
        Err(text(&out))
    }
}

/// `openssl verify -purpose sslserver` of `cert` against `ca`: true if it passes.
fn passes_as_server(cert: &Path, ca: &Path, ip: &str) -> bool {
    Command::new("openssl")
        .args(["verify", "-purpose", "sslserver", "-verify_ip", ip, "-CAfile"])
        .arg(ca)
        .arg(cert)
        .output()
        .expect("openssl")
        .status
        .success()
}

/// Whether `cert` is still valid `seconds` from now (`openssl x509 -checkend`).
fn valid_in(cert: &Path, seconds: u64) -> bool {
    Command::new("openssl")
        .args(["x509", "-noout", "-checkend", &seconds.to_string(), "-in"])
        .arg(cert)
        .output()
        .expect("openssl")
        .status
        .success()
}

/// H3 and L1: a node's token leaks (a pod read it, or a backup did). With leak-1's token, from
/// another machine as nobody: no certificate for leak-1, which already joined, in either
/// profile; none for leak-2 or for a name no node has (the token is leak-1's only); no serving
/// certificate naming localhost or a loopback address. Then the whole of leak-1's node directory
/// leaks (its client certificate and key too): that yields leak-1's certificates, still none for
/// leak-2, and a serving certificate with the API server's host address does not pass as the
/// API server, whose CA issues kubelets nothing. Every certificate ends within a day of the
/// cluster's lifetime. M4 first: no token is on the shared filesystem at all (nor any key but
/// the user's own kubeconfig's); the attacker's copy is taken from a node directory.
#[tokio::test(flavor = "multi_thread")]
async fn a_leaked_node_token_mints_no_other_identity() {
    let Some(image) = prerequisites() else { return };
    let env = Env::start(image).await;
    let out = env.up_with("leak", 2, &["--lifetime=2h"]);
    assert!(out.status.success(), "hpk up: {}", text(&out));
    let shared = env.home.path().join("leak");

    // M4: the shared directory holds nothing secret — no node token, no key. The user's
    // kubeconfig is a link there to a file beside it, which no bubble mounts.
    let token = std::fs::read_to_string(node_token(&env, "leak-2")).expect("the node's token");
    assert_eq!(token.len(), 64);
    let mut seen = Vec::new();
    for entry in walk(&shared) {
        let name = entry.strip_prefix(&shared).expect("inside").display().to_string();
        if std::fs::symlink_metadata(&entry).expect("stat").is_symlink() {
            let target = std::fs::read_link(&entry).expect("readlink");
            assert!(
                name == "kubeconfig" && !target.starts_with(&shared) && target.is_absolute(),
                "{name} links to {}",
                target.display()
            );
        } else {
            let bytes = std::fs::read(&entry).unwrap_or_default();
            let text = String::from_utf8_lossy(&bytes);
            assert!(
                !text.contains(token.trim()) && !text.contains("PRIVATE KEY"),
                "a secret in the shared directory: {name}"
            );
        }
        seen.push(name);
    }
    assert!(seen.iter().any(|n| n == "ca.crt") && !seen.iter().any(|n| n.contains("token")), "{seen:?}");
    assert!(seen.iter().any(|n| n == "kubeconfig"), "{seen:?}");

    // What the attacker took (a pod read it, or a backup did), in a directory of its own.
    let loot = tempfile::tempdir().expect("tempdir");
    let (client_cert, client_key) = node_client_cert(&env, "leak-1");
    for (file, from) in [
        ("node-token", node_token(&env, "leak-1")),
        ("ca.crt", shared.join("ca.crt")),
        ("cert-signer", shared.join("cert-signer")),
        ("node-client.crt", client_cert),
        ("node-client.key", client_key),
    ] {
        std::fs::copy(from, loot.path().join(file)).expect("copy");
        nix::unistd::chown(&loot.path().join(file), Some(nix::unistd::Uid::from_raw(65534)), None)
            .expect("chown");
    }
    nix::unistd::chown(
        loot.path(),
        Some(nix::unistd::Uid::from_raw(65534)),
        Some(nix::unistd::Gid::from_raw(65534)),
    )
    .expect("chown");

    // The token alone.
    let token_only = |node: &str, profile: &str, sans: &[&str]| {
        leaked_token_request(&env, loot.path(), false, node, profile, sans)
    };
    for (profile, sans) in [("client", &[][..]), ("serving", &["10.1.2.3"][..])] {
        let refused = token_only("leak-1", profile, sans)
            .expect_err(&format!("leak-1's token got a {profile} certificate for leak-1, which had joined"));
        assert!(refused.contains("already has a"), "leak-1 {profile}: {refused}");
        for node in ["leak-2", "impostor"] {
            let refused = token_only(node, profile, sans)
                .expect_err(&format!("leak-1's token got a {profile} certificate for {node}"));
            assert!(refused.contains("not the token of the node"), "{node} {profile}: {refused}");
        }
    }
    for san in ["localhost", "127.0.0.1", "::1", "0.0.0.0"] {
        let refused = token_only("leak-1", "serving", &[san])
            .expect_err(&format!("the leaked token got a serving certificate for {san}"));
        assert!(refused.contains("loopback"), "{san}: {refused}");
    }
    // The whole node directory: leak-1's certificates, and no other node's.
    let host_ip = env.host.ip.to_string();
    for node in ["leak-2", "impostor"] {
        let refused = leaked_token_request(&env, loot.path(), true, node, "serving", &[&host_ip])
            .expect_err(&format!("leak-1's node directory got a certificate for {node}"));
        assert!(refused.contains("not the token of the node"), "{node}: {refused}");
    }
    let minted = leaked_token_request(&env, loot.path(), true, "leak-1", "serving", &[&host_ip])
        .expect("leak-1's certificate and token get leak-1 a serving certificate with its address");
    let minted_path = loot.path().join("minted.crt");
    std::fs::write(&minted_path, &minted).expect("write");
    // The API server's certificate passes where the minted one does not.
    let apiserver = std::process::Command::new("openssl")
        .args(["s_client", "-connect"])
        .arg(
            std::fs::read_to_string(shared.join("apiserver"))
                .expect("apiserver")
                .trim()
                .trim_start_matches("https://"),
        )
        .arg("-showcerts")
        .stdin(Stdio::null())
        .output()
        .expect("openssl s_client");
    let served = String::from_utf8_lossy(&apiserver.stdout);
    let begin = served.find("-----BEGIN CERTIFICATE-----").expect("the API server's certificate");
    let end = served[begin..].find("-----END CERTIFICATE-----").expect("end") + begin + 25;
    let apiserver_cert = loot.path().join("apiserver.crt");
    std::fs::write(&apiserver_cert, &served[begin..end]).expect("write");
    assert!(
        passes_as_server(&apiserver_cert, &shared.join("ca.crt"), &host_ip),
        "the real API server must pass"
    );
    assert!(
        !passes_as_server(&minted_path, &shared.join("ca.crt"), &host_ip),
        "a node certificate passes as the API server"
    );

    // L1: two hours of cluster, plus at most a day.
    let day = 86_400;
    for (what, cert) in [
        ("the server CA", shared.join("ca.crt")),
        ("the API server", apiserver_cert),
        ("a minted node certificate", minted_path),
    ] {
        assert!(valid_in(&cert, 3600), "{what} ends within the cluster's lifetime");
        assert!(!valid_in(&cert, 2 * 3600 + day + 600), "{what} outlives the cluster by more than a day");
    }

    // And the cluster is none the worse.
    let nodes = env.kubectl_ok("leak", &["get", "nodes", "--no-headers"]);
    assert_eq!(nodes.lines().filter(|l| l.split_whitespace().nth(1) == Some("Ready")).count(), 2, "{nodes}");
}

/// `curl ARGS` in the network namespace of `pid` (a process of the controller bubble).
fn curl_in(pid: u32, args: &[&str]) -> std::process::Output {
    Command::new("nsenter")
        .arg(format!("--net=/proc/{pid}/ns/net"))
        .args(["--", "curl", "-sS", "--max-time", "5"])
        .args(args)
        .output()
        .expect("nsenter curl")
}

/// M1: etcd listens on the controller bubble's loopback, which a hostNetwork pod on the
/// controller node shares. Such a pod reads nothing from it, on the client port nor the peer
/// port; neither does a TLS client without etcd's client certificate. The pod does reach the
/// loopback (etcd's health answers it), and the API server's certificate does read etcd, so
/// the refusals are etcd's.
#[tokio::test(flavor = "multi_thread")]
async fn a_host_network_pod_on_the_controller_cannot_read_etcd() {
    let Some(image) = prerequisites() else { return };
    let env = Env::start(image).await;
    let out = env.up("etcd", 1);
    assert!(out.status.success(), "hpk up: {}", text(&out));
    let request = |path: &str, port: u16| {
        format!("printf 'GET {path} HTTP/1.0\\r\\n\\r\\n' | nc -w 5 127.0.0.1 {port}")
    };
    let script = [
        "echo '== client'".to_owned(),
        request("/version", 2379),
        request("/v2/keys/", 2379),
        "echo '== peer'".to_owned(),
        request("/members", 2380),
        request("/version", 2380),
        "echo '== health'".to_owned(),
        request("/health", 2381),
    ]
    .join("; ");
    // hostNetwork is beyond Pod Security baseline, the default: the namespace asks for it.
    env.kubectl_ok(
        "etcd",
        &["label", "namespace", "default", "pod-security.kubernetes.io/enforce=privileged"],
    );
    env.apply("etcd", &format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: snoop\nspec:\n  nodeName: etcd-1\n  hostNetwork: true\n  restartPolicy: Never\n  containers:\n  - name: c\n    image: {}\n    command: [sh, -c, {:?}]\n",
        env.shell, script
    ));
    eventually("the snooping pod ends", Duration::from_secs(90), || {
        let phase = env.kubectl_ok("etcd", &["get", "pod", "snoop", "-o", "jsonpath={.status.phase}"]);
        (phase == "Succeeded" || phase == "Failed").then_some(())
    });
    let seen = env.kubectl_ok("etcd", &["logs", "snoop"]);
    let health = seen.split("== health").nth(1).unwrap_or_default();
    assert!(
        // Whether etcd calls itself healthy on a loaded machine does not matter here (its
        // range check can time out); that it answers does.
        health.contains("\"health\":"),
        "the pod did not share the controller's loopback:\n{seen}"
    );
    for leak in ["etcdserver", "etcdcluster", "peerURLs", "clientURLs", "\"node\""] {
        assert!(!seen.contains(leak), "a hostNetwork pod read etcd ({leak}):\n{seen}");
    }

    let etcd = support::bubble_processes("etcd", "etcd-1")
        .into_iter()
        .find(|(_, cmdline)| cmdline.starts_with("/usr/local/bin/etcd "))
        .map(|(pid, _)| pid)
        .expect("etcd in the controller bubble");
    for url in ["https://127.0.0.1:2379/version", "https://127.0.0.1:2380/members"] {
        let out = curl_in(etcd, &["-k", url]);
        let answer = text(&out);
        assert!(
            !out.status.success() && !answer.contains("etcdserver") && !answer.contains("peerURLs"),
            "TLS without a client certificate read {url}: {answer}"
        );
    }
    let find = |name: &str| {
        let out = Command::new("find")
            .arg(env.state.path())
            .args(["-path", &format!("*/etcd-1/pki/{name}")])
            .output()
            .expect("find");
        String::from_utf8_lossy(&out.stdout).lines().next().unwrap_or_else(|| panic!("no {name}")).to_owned()
    };
    let (cert, key) = (find("apiserver-etcd-client.crt"), find("apiserver-etcd-client.key"));
    let out = curl_in(etcd, &["-k", "--cert", &cert, "--key", &key, "https://127.0.0.1:2379/version"]);
    assert!(
        text(&out).contains("etcdserver"),
        "the API server's etcd certificate must read etcd: {}",
        text(&out)
    );
    assert_eq!(
        env.kubectl_ok("etcd", &["get", "namespace", "default", "-o", "jsonpath={.metadata.name}"]),
        "default"
    );
}

/// `kubectl apply -f -` of `manifest` in cluster `name`, failing or not.
fn try_apply(env: &Env, name: &str, manifest: &str) -> std::process::Output {
    use std::io::Write;
    let mut child = Command::new(&env.kubectl)
        .arg(format!("--kubeconfig={}", env.kubeconfig(name).display()))
        .args(["apply", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl apply");
    child.stdin.take().expect("stdin").write_all(manifest.as_bytes()).expect("write");
    child.wait_with_output().expect("wait")
}

/// H5: a pod tries to plant a kubeconfig (one with an `exec` plugin would run as the user on
/// the login node at the next kubectl). Pod Security `baseline` refuses a hostPath pod in a
/// namespace that did not ask for more. In a namespace relaxed to `privileged`, the kubelet
/// refuses a hostPath into HPK's directories. And a process with every capability of the
/// bubble, in its mount namespace (a pod that broke out), finds the shared directory
/// read-only and cannot remount it writable; nor can it read the user's kubeconfig (M4): the
/// shared directory holds only a link to it. The user's kubeconfig is unchanged and works.
#[tokio::test(flavor = "multi_thread")]
async fn a_pod_cannot_plant_a_kubeconfig() {
    let Some(image) = prerequisites() else { return };
    let env = Env::start(image).await;
    let out = env.up("plant", 1);
    assert!(out.status.success(), "hpk up: {}", text(&out));
    let before = std::fs::read(env.kubeconfig("plant")).expect("the kubeconfig");
    let host_path_pod = |namespace: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: plant\n  namespace: {namespace}\nspec:\n  restartPolicy: Never\n  containers:\n  - name: c\n    image: {}\n    command: [sh, -c, 'echo planted > /host/kubeconfig']\n    volumeMounts: [{{name: shared, mountPath: /host}}]\n  volumes:\n  - name: shared\n    hostPath: {{path: /hpk/shared}}\n",
            env.shell
        )
    };

    let refused = try_apply(&env, "plant", &host_path_pod("default"));
    let said = text(&refused);
    assert!(
        !refused.status.success() && said.contains("PodSecurity") && said.contains("hostPath"),
        "Pod Security baseline must refuse a hostPath pod: {said}"
    );

    // The README's way to relax a namespace.
    env.kubectl_ok("plant", &["create", "namespace", "wild"]);
    env.kubectl_ok("plant", &["label", "namespace", "wild", "pod-security.kubernetes.io/enforce=privileged"]);
    env.apply("plant", &host_path_pod("wild"));
    eventually("the kubelet refuses the hostPath", Duration::from_secs(90), || {
        let events = env.kubectl_ok(
            "plant",
            &[
                "get",
                "events",
                "-n",
                "wild",
                "--field-selector",
                "reason=FailedMount",
                "-o",
                "jsonpath={.items[*].message}",
            ],
        );
        events.contains("/hpk/shared").then_some(())
    });

    // What a pod that broke out into its bubble could do: every capability of the bubble's
    // user namespace, in the bubble's mount namespace (HPK runs no hostPID pod, so this test
    // enters them from the host). The shared directory is read-only there, and the kernel
    // locked it so.
    let (init, _) = support::bubble_processes("plant", "plant-1")
        .into_iter()
        .find(|(_, cmdline)| cmdline.contains("bubble-init"))
        .expect("the bubble's init");
    // The bubble's image has no mount(8): a static busybox goes into the node directory
    // (the bubble's /var/lib/hpk), as an intruder would bring one.
    let node_dir = std::fs::read_dir(env.state.path().join("plant"))
        .expect("the cluster's state")
        .flatten()
        .map(|e| e.path())
        .find(|p| p.ends_with("plant-1"))
        .expect("the node directory");
    std::fs::copy("/bin/busybox", node_dir.join("busybox")).expect("copy busybox");
    let script = "\
        bb=/var/lib/hpk/busybox; \
        $bb test -s /hpk/shared/apiserver && echo ENTERED; \
        $bb test -L /hpk/shared/kubeconfig && echo LINK; \
        $bb cat /hpk/shared/kubeconfig 2>/dev/null | $bb grep -q client-key-data && echo READ || echo READ-REFUSED; \
        ($bb echo planted > /hpk/shared/kubeconfig) 2>/dev/null && echo WROTE || echo WRITE-REFUSED; \
        for target in /hpk/shared /var/lib/hpk/shared; do \
          for flags in rw rw,nosuid,nodev; do \
            $bb mount -o remount,bind,$flags $target && echo REMOUNTED || echo REMOUNT-REFUSED; \
          done; \
        done; \
        ($bb echo planted > /hpk/shared/kubeconfig) 2>/dev/null && echo WROTE || echo WRITE-REFUSED";
    let out = Command::new("nsenter")
        .arg(format!("--user=/proc/{init}/ns/user"))
        .arg(format!("--mount=/proc/{init}/ns/mnt"))
        // and its PID namespace, so that its /proc (mount(8) reads /proc/mounts) is ours
        .arg(format!("--pid=/proc/{init}/ns/pid"))
        .args(["--", "/var/lib/hpk/busybox", "sh", "-c", script])
        .output()
        .expect("nsenter");
    let seen = text(&out);
    assert!(
        seen.contains("ENTERED") && seen.contains("LINK"),
        "did not reach the bubble's mount namespace:\n{seen}"
    );
    // M4: the user's credential is not in the bubble's view at all.
    assert!(
        seen.contains("READ-REFUSED") && !seen.lines().any(|l| l == "READ"),
        "the bubble read the kubeconfig:\n{seen}"
    );
    assert!(
        !seen.contains("WROTE") && !seen.contains("REMOUNTED"),
        "the bubble wrote the shared directory:\n{seen}"
    );
    assert_eq!(seen.matches("WRITE-REFUSED").count(), 2, "{seen}");
    assert_eq!(seen.matches("REMOUNT-REFUSED").count(), 4, "{seen}");

    assert_eq!(
        std::fs::read(env.kubeconfig("plant")).expect("the kubeconfig"),
        before,
        "the kubeconfig changed"
    );
    assert_eq!(
        env.kubectl_ok("plant", &["get", "namespace", "wild", "-o", "jsonpath={.metadata.name}"]),
        "wild"
    );
}

/// Review C1, after the fact: the state directory is gone (a reboot, a `/tmp` clean-up) and
/// another user made one at the same path, with an "image" in it whose loader is their
/// program. `hpk down`, which deletes the bubbles a killed launcher left with the crun of the
/// image its record names, runs nothing from it, removes nothing of it and says why. The same
/// layout made by the user is used (the control: the planted loader does run), so the test
/// can fail.
#[test]
fn down_runs_nothing_from_a_state_directory_another_user_made() {
    use std::os::unix::fs::PermissionsExt;
    if !nix::unistd::getuid().is_root() {
        hpk_test_support::skip("another user's directory needs root to make");
        return;
    }
    const ATTACKER: u32 = 61_002;
    for theirs in [true, false] {
        let base = tempfile::tempdir().expect("tempdir");
        let (home, state) = (base.path().join("home"), base.path().join("state"));
        let marker = base.path().join("ran");
        let rootfs = state.join("images/sha256-planted/rootfs");
        let loader = rootfs.join("usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2");
        for dir in
            [loader.parent().expect("dir").to_owned(), rootfs.join("usr/bin"), state.join("c1/node1/crun")]
        {
            std::fs::create_dir_all(&dir).expect("mkdir");
        }
        std::fs::write(&loader, format!("#!/bin/sh\ntouch {}\n", marker.display())).expect("loader");
        std::fs::set_permissions(&loader, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        for tool in ["crun", "slirp4netns"] {
            std::fs::write(rootfs.join("usr/bin").join(tool), "").expect("tool");
        }
        std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        if theirs {
            let out =
                Command::new("chown").args(["-R", &format!("{ATTACKER}:{ATTACKER}")]).arg(&state).output();
            assert!(out.expect("chown").status.success());
        }
        let nodes = home.join("c1/nodes");
        std::fs::create_dir_all(&nodes).expect("mkdir");
        let record = serde_json::json!({
            "node": "node1", "role": "controller", "address": "10.250.0.1", "launcher_pid": 999_999_999u32,
            "host": "here", "state_dir": state.join("c1/node1"), "rootfs": rootfs, "ports": [],
        });
        std::fs::write(nodes.join("node1.json"), record.to_string()).expect("record");
        let out = Command::new(env!("CARGO_BIN_EXE_hpk"))
            .args(["down", "--name", "c1"])
            .env("HPK_HOME", &home)
            .env("HPK_STATE_DIR", &state)
            .output()
            .expect("hpk down");
        let stderr = text(&out);
        if theirs {
            assert!(!marker.exists(), "hpk down ran the other user's program");
            assert!(!out.status.success(), "hpk down must say what it left: {stderr}");
            assert!(
                stderr.contains("left alone") && stderr.contains(&format!("belongs to UID {ATTACKER}")),
                "{stderr}"
            );
            assert!(state.join("c1/node1/crun").is_dir(), "the other user's files are not removed");
            assert!(!home.join("c1").exists(), "the user's own cluster files are removed: {stderr}");
        } else {
            assert!(marker.exists(), "control: the image's loader runs for the user's own state: {stderr}");
            assert!(!state.join("c1").exists(), "the user's own state is removed: {stderr}");
        }
    }
}

/// Every file under `dir`, links not followed.
fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).expect("read_dir").flatten() {
        let path = entry.path();
        match entry.file_type() {
            Ok(t) if t.is_dir() => files.extend(walk(&path)),
            _ => files.push(path),
        }
    }
    files
}

/// L5: a privileged hostNetwork pod waits for the kubelet's port and takes it the moment the
/// kubelet dies (binding it explicitly, which the reserved ports cannot prevent). A client from
/// another machine then connects to the node's published kubelet port: the relay sees that a
/// process outside the bubble's services listens there and closes the connection, and the pod
/// receives nothing. Once the pod lets go, the kubelet is back and the node Ready.
#[tokio::test(flavor = "multi_thread")]
async fn a_pod_that_takes_a_relayed_port_is_not_exposed() {
    let Some(image) = prerequisites() else { return };
    let env = Env::start(image).await;
    let out = env.up("squat", 1);
    assert!(out.status.success(), "hpk up: {}", text(&out));
    let (_, kubelet) = published_ports(&env, "squat")
        .into_iter()
        .find(|(name, _)| name == "kubelet of squat-1")
        .expect("the kubelet's published port");
    let port = kubelet.port();
    // hostNetwork is beyond Pod Security baseline, the default: the namespace asks for it.
    env.kubectl_ok(
        "squat",
        &["label", "namespace", "default", "pod-security.kubernetes.io/enforce=privileged"],
    );
    // Tries to bind the port every 50 ms; once it has, serves one connection, prints what it
    // received (between markers), and ends, giving the port back.
    let script = format!(
        "until nc -l -p {port} > /tmp/got 2>/dev/null; do sleep 0.05; done; echo '== got'; cat /tmp/got; echo '== end'"
    );
    env.apply("squat", &format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: squatter\nspec:\n  nodeName: squat-1\n  hostNetwork: true\n  restartPolicy: Never\n  containers:\n  - name: c\n    image: {}\n    command: [sh, -c, {:?}]\n",
        env.shell, script
    ));
    eventually("the squatting pod runs", Duration::from_secs(90), || {
        let phase = env.kubectl_ok("squat", &["get", "pod", "squatter", "-o", "jsonpath={.status.phase}"]);
        (phase == "Running").then_some(())
    });

    let kubelet_pid = || {
        support::bubble_processes("squat", "squat-1")
            .into_iter()
            .find(|(_, cmdline)| cmdline.starts_with("/usr/local/bin/hpk-kubelet "))
            .map(|(pid, _)| pid)
    };
    let bubble_log = {
        let out = Command::new("find")
            .arg(env.state.path())
            .args(["-path", "*/squat-1/logs/bubble.log"])
            .output()
            .expect("find");
        std::path::PathBuf::from(
            String::from_utf8_lossy(&out.stdout).lines().next().expect("bubble.log").to_owned(),
        )
    };
    // Who listens on the port, in the bubble's network namespace.
    let holder = || {
        let bubble = support::bubble_processes("squat", "squat-1").first().map_or(0, |p| p.0);
        let out = Command::new("nsenter")
            .arg(format!("--net=/proc/{bubble}/ns/net"))
            .args(["ss", "-Hltnp", &format!("sport = :{port}")])
            .output()
            .expect("ss");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let diagnose = || {
        let text = std::fs::read_to_string(&bubble_log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        format!(
            "bubble.log:\n{}\nport {port}: {}",
            lines[lines.len().saturating_sub(15)..].join("\n"),
            holder()
        )
    };
    // The kubelet is killed until the pod holds its port: the supervisor restarts it within
    // seconds, and it cannot bind while the pod does.
    eventually_or(
        "the pod holds the kubelet's port",
        Duration::from_secs(90),
        || {
            let now = holder();
            if now.contains("\"nc\"") {
                return Some(());
            }
            if let Some(pid) = kubelet_pid() {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            None
        },
        diagnose,
    );
    // A connection from the attacker's machine (a TLS client hello is the first byte the relay
    // waits for): the relay closes it and logs whose port it is.
    let _ = env
        .attacker()
        .command("curl")
        .args(["-sSk", "--max-time", "5", &format!("https://{kubelet}/pods")])
        .output()
        .expect("curl");
    eventually_or(
        "the relay refuses the squatted port",
        Duration::from_secs(10),
        || std::fs::read_to_string(&bubble_log).ok()?.contains("outside the bubble's services").then_some(()),
        diagnose,
    );
    assert!(holder().contains("\"nc\""), "the pod was handed a connection: {}", diagnose());
    // The pod lets go of the port once it has had a connection: one straight to it, inside the
    // bubble, as a service would be reached.
    let bubble = support::bubble_processes("squat", "squat-1").first().map_or(0, |p| p.0);
    let _ = Command::new("nsenter")
        .arg(format!("--net=/proc/{bubble}/ns/net"))
        .args(["--", "curl", "-sS", "--max-time", "5", &format!("http://127.0.0.1:{port}/direct")])
        .output()
        .expect("curl");
    // The kubelet took its port back, and the node is Ready again.
    eventually("the node is Ready again", Duration::from_secs(120), || {
        let ready = env.kubectl(
            "squat",
            &["get", "node", "squat-1", "-o", r#"jsonpath={.status.conditions[?(@.type=="Ready")].status}"#],
        );
        (String::from_utf8_lossy(&ready.stdout) == "True" && holder().contains("hpk-kubelet")).then_some(())
    });
    eventually("the squatting pod ends", Duration::from_secs(60), || {
        let phase = env.kubectl("squat", &["get", "pod", "squatter", "-o", "jsonpath={.status.phase}"]);
        (String::from_utf8_lossy(&phase.stdout) == "Succeeded").then_some(())
    });
    // It received the one request made inside the bubble, and no byte from outside.
    let said = env.kubectl_ok("squat", &["logs", "squatter"]);
    let got = said.split("== got").nth(1).and_then(|s| s.split("== end").next()).expect("the pod's report");
    assert!(
        got.starts_with("\nGET /direct HTTP/1.1") && !got.contains("/pods"),
        "the squatting pod received: {got:?}"
    );
}
