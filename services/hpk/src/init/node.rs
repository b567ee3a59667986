//! Every bubble's node services: once the controller has published the cluster's files, the
//! node's client certificate from the cert-signer (the key made here, never leaving the
//! bubble), then hpk-net-forwarder (with the tunnel socket the launcher bound on the host),
//! hpk-pod-runtime (crun) and hpk-kubelet.

use std::path::Path;
use std::time::Duration;

use super::InitArgs;
use super::controller::wait;
use super::supervisor::{Service, Supervisor};
use crate::addons::{CLUSTER_DNS_IP, CLUSTER_DOMAIN, kube_proxy_args};
use crate::bubble::spec::{NODE_DIR, SHARED_DIR};
use crate::error::{Error, Result};
use crate::pki::{CertFiles, write_kubeconfig};

/// How long a node waits for the controller's files.
const CONTROLLER_BOUND: Duration = Duration::from_secs(180);

/// Starts the node's services.
pub async fn start(args: &InitArgs, sup: &mut Supervisor) -> Result<()> {
    let node_dir = Path::new(NODE_DIR);
    let shared = Path::new(SHARED_DIR);
    let p = |path: &Path| path.display().to_string();
    let kubelet_port = args.port("kubelet")?;
    // The tunnel's sockets: `tunnel`, then the rest of its reuse-port group in order.
    let mut tunnel_fds = vec![super::inherited_fd("tunnel")?.to_string()];
    tunnel_fds.extend(
        (1..).map_while(|i| super::inherited_fd(&format!("tunnel-{i}")).ok()).map(|fd| fd.to_string()),
    );
    let tunnel_fd = tunnel_fds.join(",");

    // The controller's launcher writes `apiserver` last: once it is there, the rest is too.
    let needed = ["apiserver", "cert-signer", "ca.crt", "client-ca.crt"];
    let deadline = tokio::time::Instant::now() + CONTROLLER_BOUND;
    loop {
        let missing: Vec<&str> = needed.iter().copied().filter(|f| !shared.join(f).is_file()).collect();
        if missing.is_empty() {
            break;
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(Error::NotReady {
                what: "the controller's cluster files".into(),
                seconds: CONTROLLER_BOUND.as_secs(),
                detail: format!("still missing in the shared directory: {}", missing.join(", ")),
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let api_url = read(&shared.join("apiserver"))?;
    // The node's token: the launcher's, in the node directory (never in the shared one); good
    // for this node's name only.
    let token = node_dir.join(crate::cluster::NODE_TOKEN_FILE);
    if !token.is_file() {
        return Err(Error::Invalid(format!("the launcher left no node token at {}", token.display())));
    }

    // The node's client identity (system:node:<name>), from the cert-signer's client profile.
    let client = CertFiles { cert: node_dir.join("node-client.crt"), key: node_dir.join("node-client.key") };
    let out = tokio::process::Command::new("/usr/local/bin/hpk-cert-signer")
        .arg("request")
        .arg(format!("--server-file={}", p(&shared.join("cert-signer"))))
        .arg(format!("--ca-cert={}", p(&shared.join("ca.crt"))))
        .arg(format!("--token-file={}", p(&token)))
        .arg(format!("--node-name={}", args.node))
        .arg("--profile=client")
        // A restarted node shows the certificate it has: the token enrols a node only once.
        .arg(format!("--client-cert={}", p(&client.cert)))
        .arg(format!("--client-key={}", p(&client.key)))
        .arg(format!("--cert-out={}", p(&client.cert)))
        .arg(format!("--key-out={}", p(&client.key)))
        .arg(format!("--shared-dir={SHARED_DIR}"))
        .output()
        .await
        .map_err(|e| Error::io("run", "hpk-cert-signer request", e))?;
    if !out.status.success() {
        return Err(Error::Failed {
            what: "the node's client certificate (hpk-cert-signer request)".into(),
            detail: String::from_utf8_lossy(&out.stderr).into(),
        });
    }
    let kubeconfig = node_dir.join("node.kubeconfig");
    write_kubeconfig(
        &kubeconfig,
        &api_url,
        &shared.join("ca.crt"),
        &format!("system:node:{}", args.node),
        &client,
    )?;

    let nf_socket = NF_SOCKET;
    let mut net_forwarder = net_forwarder_args();
    net_forwarder.extend([
        format!("--kubeconfig={}", p(&kubeconfig)),
        format!("--node-name={}", args.node),
        // No key file: the net-forwarder makes its key pair in memory and publishes the public
        // key on the Node, so no tunnel secret is on the shared filesystem.
        format!("--tunnel-fd={tunnel_fd}"),
        format!("--tunnel-advertise={}", args.address),
    ]);
    sup.start(Service::new("hpk-net-forwarder", "/usr/local/bin/hpk-net-forwarder", net_forwarder))?;
    // Not awaited: the net-forwarder serves once the Node has its podCIDR, which needs the
    // kubelet to register it; the kubelet reports the node NotReady until then.

    let cri_socket = CRI_SOCKET;
    sup.start(Service::new(
        "hpk-pod-runtime",
        "/usr/local/bin/hpk-pod-runtime",
        runtime_args(args, nf_socket),
    ))?;
    wait(
        sup,
        "hpk-pod-runtime",
        "hpk-pod-runtime's socket",
        || async move { Ok(Path::new(cri_socket).exists()) },
    )
    .await?;

    let mut kubelet = vec![
        format!("--kubeconfig={}", p(&kubeconfig)),
        format!("--node-name={}", args.node),
        format!("--node-ip={}", args.address),
        // Bound on the bubble's loopback; published on the host by the relay, same port.
        "--address=127.0.0.1".into(),
        format!("--kubelet-port={kubelet_port}"),
        format!("--runtime-socket={cri_socket}"),
        format!("--net-forwarder-socket={nf_socket}"),
        format!("--root-dir={}", p(&node_dir.join("kubelet"))),
        format!("--cert-signer-address-file={}", p(&shared.join("cert-signer"))),
        format!("--cert-signer-ca={}", p(&shared.join("ca.crt"))),
        format!("--node-token-file={}", p(&token)),
        format!("--cert-signer-client-cert={}", p(&client.cert)),
        format!("--cert-signer-client-key={}", p(&client.key)),
        format!("--client-ca-file={}", p(&shared.join("client-ca.crt"))),
        format!("--cluster-dns={CLUSTER_DNS_IP}"),
        format!("--cluster-domain={CLUSTER_DOMAIN}"),
        format!("--cdi-spec-dir={}", crate::bubble::gpus::CDI_DIR),
    ];
    kubelet.extend(host_path_args(args));
    kubelet.extend(args.options.kubelet_args.iter().cloned());
    sup.start(Service::new("hpk-kubelet", "/usr/local/bin/hpk-kubelet", kubelet))?;

    // ClusterIP Services: the node's pods are routed through the bubble, where kube-proxy's
    // rules apply. It syncs once the kubelet has registered the Node, as the node itself
    // (system:nodes may do what system:kube-proxy may: the controller binds the role).
    sup.start(Service::new(
        "kube-proxy",
        "/usr/local/bin/kube-proxy",
        kube_proxy_args(&args.node, args.address, &kubeconfig),
    ))?;

    // hostPort, NodePort and LoadBalancer ports on the host's address (super::ports).
    let launcher = super::inherited_fd(crate::host_ports::FD_NAME).and_then(|fd| {
        let sock = crate::fds::claim_seqpacket(fd)
            .map_err(|e| Error::Invalid(format!("the host-ports socket: {e}")))?;
        crate::host_ports::Client::new(sock)
    })?;
    let client = super::controller::client(&kubeconfig).await?;
    tokio::spawn(super::ports::run(client, args.node.clone(), args.address, launcher));
    Ok(())
}

/// The net-forwarder's socket in every bubble.
pub(super) const NF_SOCKET: &str = "/run/hpk/net-forwarder.sock";

/// The net-forwarder's flags every bubble gives it: serve on its socket, state in the node
/// directory.
pub(super) fn net_forwarder_args() -> Vec<String> {
    vec![
        "serve".into(),
        format!("--socket={NF_SOCKET}"),
        format!("--state-dir={}", Path::new(NODE_DIR).join("net-forwarder").display()),
    ]
}

/// The pod-runtime's CRI socket in every bubble.
pub(super) const CRI_SOCKET: &str = "/run/hpk/cri.sock";
/// The pod-runtime's `--state`, on the bubble's `/run` tmpfs.
pub(super) const RUNTIME_STATE: &str = "/run/hpk/pod-runtime";

/// The pod-runtime's flags every bubble gives it: its socket, state, pause, the
/// net-forwarder's socket and the registries allowed over plain HTTP.
pub(super) fn runtime_args(args: &InitArgs, nf_socket: &str) -> Vec<String> {
    let mut runtime = vec![
        format!("--socket={CRI_SOCKET}"),
        format!("--root={}", Path::new(NODE_DIR).join("runtime").display()),
        // The bubble's /run is a tmpfs of its own: what lasts only as long as the pods'
        // processes (sandboxes, events sockets, crun's state) is kept off the node's disk.
        format!("--state={RUNTIME_STATE}"),
        "--pause-binary=/usr/local/bin/hpk-pause".into(),
        format!("--net-forwarder-socket={nf_socket}"),
        format!("--cdi-spec-dir={}", crate::bubble::gpus::CDI_DIR),
    ];
    runtime.extend(args.options.insecure_registries.iter().map(|r| format!("--insecure-registry={r}")));
    runtime
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .map_err(|e| Error::io("read", path.display(), e))
}

/// The kubelet's hostPath policy: pods may mount the node's local volume directory and what
/// the bubble binds from the host (at its destination), never HPK's own directories, in the
/// bubble or on the host.
fn host_path_args(args: &InitArgs) -> Vec<String> {
    let mut out = vec![format!("--allowed-host-path={}", crate::bubble::spec::LOCAL_VOLUMES_DIR)];
    out.extend(args.options.binds.iter().map(|b| format!("--allowed-host-path={}", b.dest.display())));
    // The kubelet's defaults, given again (the flag replaces them): /hpk holds SHARED_DIR.
    out.extend(["/hpk", NODE_DIR].map(|f| format!("--forbidden-host-path={f}")));
    out.extend(args.hidden_host_paths.iter().map(|h| format!("--hidden-host-path={}", h.display())));
    out
}
