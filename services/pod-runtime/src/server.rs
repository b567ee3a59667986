//! `run`: open the image store, set up the runtime, serve CRI on a UNIX socket until shutdown.

use std::path::{Path, PathBuf};

use k8s_cri::v1::image_service_server::ImageServiceServer;
use k8s_cri::v1::runtime_service_server::RuntimeServiceServer;
use tokio_util::sync::CancellationToken;

use crate::cri::{Images, RuntimeApi};
use crate::engine::{Apptainer, ApptainerEngine, Crun, CrunEngine, Engine, EngineChoice, EngineKind};
use crate::images::{ImageStore, StoreOptions};
use crate::runtime::{self, Runtime};

/// Largest CRI message accepted; the kubelet's largest (CreateContainer with many env vars and
/// mounts) stays far below.
const MAX_MESSAGE: usize = 16 * 1024 * 1024;

/// What `hpk-pod-runtime` needs to run.
#[derive(Clone, Debug, clap::Args)]
pub struct ServeArgs {
    /// The CRI socket (0600, in a 0700 directory).
    #[arg(long, env = "HPK_POD_RUNTIME_SOCKET", default_value = "/run/hpk/pod-runtime.sock")]
    pub socket: PathBuf,
    /// State directory: images, containers (their writable layers).
    #[arg(long, env = "HPK_POD_RUNTIME_ROOT", default_value = "/var/lib/hpk/pod-runtime")]
    pub root: PathBuf,
    /// Where what lasts only as long as the pods' processes goes (sandboxes, events sockets,
    /// crun's state), best a tmpfs of this user's alone: `hpk` gives the bubble's `/run/hpk/pod-runtime`
    /// [default: the root].
    #[arg(long, env = "HPK_POD_RUNTIME_STATE")]
    pub state: Option<PathBuf>,
    /// The hpk-pause binary [default: hpk-pause next to this binary].
    #[arg(long, env = "HPK_PAUSE_BINARY")]
    pub pause_binary: Option<PathBuf>,
    /// Registries spoken to over plain HTTP (host:port), e.g. a local test registry.
    #[arg(long = "insecure-registry", env = "HPK_INSECURE_REGISTRIES", value_delimiter = ',')]
    pub insecure_registries: Vec<String>,
    /// Seconds a sandbox's processes get after SIGTERM before SIGKILL.
    #[arg(long, env = "HPK_POD_GRACE_SECONDS", default_value_t = 10)]
    pub pod_grace_seconds: u32,
    /// Where the streaming server (exec, attach, port-forward) listens; loopback, because its
    /// clients (crictl, the kubelet) run on this host and its URLs carry single-use tokens.
    #[arg(long, env = "HPK_STREAMING_ADDRESS", default_value = "127.0.0.1:0")]
    pub streaming_address: std::net::SocketAddr,
    /// The engine running sandboxes and containers: `crun`, `apptainer` (what HPC sites
    /// have), or `auto` (apptainer when it is on PATH and crun is not, else crun).
    #[arg(long, env = "HPK_POD_RUNTIME_ENGINE", value_enum, default_value_t = EngineChoice::Auto)]
    pub engine: EngineChoice,
    /// Where CDI specs are read from, lowest precedence first (repeatable): a container's CDI
    /// devices (CRI `cdi_devices`, e.g. `nvidia.com/gpu=0`) get what these describe.
    #[arg(long = "cdi-spec-dir", env = "HPK_CDI_SPEC_DIRS", value_delimiter = ',', default_values_t = hpk_cdi::SPEC_DIRS.map(String::from))]
    pub cdi_spec_dirs: Vec<String>,
    /// The net-forwarder's socket: pods get an address from it. Without it, pods have
    /// loopback only.
    #[arg(long, env = "HPK_NET_FORWARDER_SOCKET")]
    pub net_forwarder_socket: Option<PathBuf>,
    /// Also serve CRI, the streaming sessions and `hpk.podruntime.v1.Remote` on this TCP
    /// address with mutual TLS, for a kubelet on another machine (connector mode). Only clients
    /// with a certificate from --client-ca-file get past the handshake.
    #[arg(long, env = "HPK_POD_RUNTIME_LISTEN", requires_all = ["tls_cert_file", "tls_private_key_file", "client_ca_file"])]
    pub listen: Option<std::net::SocketAddr>,
    /// The certificate chain (PEM) of --listen; its SANs must name the address the kubelet dials.
    #[arg(long, env = "HPK_POD_RUNTIME_TLS_CERT_FILE", requires = "listen")]
    pub tls_cert_file: Option<PathBuf>,
    /// The key of --tls-cert-file (PEM, 0600).
    #[arg(long, env = "HPK_POD_RUNTIME_TLS_KEY_FILE", requires = "listen")]
    pub tls_private_key_file: Option<PathBuf>,
    /// The CA whose client certificates --listen accepts: the cluster's client CA (the
    /// cert-signer's client profile) or one the operator runs.
    #[arg(long, env = "HPK_POD_RUNTIME_CLIENT_CA_FILE", requires = "listen")]
    pub client_ca_file: Option<PathBuf>,
    /// With --listen: the subject common name a client certificate must have, besides being
    /// signed by --client-ca-file (repeatable; review M3: the CA may sign for others than the
    /// kubelet this runtime serves). Without it, any certificate of the CA passes.
    #[arg(long = "client-name", requires = "client_ca_file")]
    pub client_names: Vec<String>,
    /// The most pods this node runs, as the Allocation a remote kubelet asks for reports it.
    #[arg(long, env = "HPK_MAX_PODS", default_value_t = 110)]
    pub max_pods: u32,
    /// The host's cgroup mode, detected by `main` before it hid anything.
    #[arg(skip = crate::engine::CgroupMode::V1)]
    pub cgroup_mode: crate::engine::CgroupMode,
}

/// Errors of `run`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The runtime could not be set up.
    #[error(transparent)]
    Runtime(#[from] runtime::Error),
    /// The image store could not be opened.
    #[error(transparent)]
    Images(#[from] crate::images::Error),
    /// Serving failed.
    #[error(transparent)]
    Rpc(#[from] hpk_rpc::Error),
    /// The configuration is inconsistent.
    #[error("configuration: {0}")]
    Config(String),
}

/// Serves CRI until `shutdown`. Sandboxes and containers keep running after the runtime exits.
pub async fn run(args: ServeArgs, shutdown: CancellationToken) -> Result<(), Error> {
    // --listen's files first: a bad one refuses the start before anything is made.
    let remote_tls = match args.listen {
        Some(addr) => Some((addr, RemoteTls::read(&args)?)),
        None => None,
    };
    let pause_binary = match args.pause_binary.clone() {
        Some(path) => path,
        None => std::env::current_exe()
            .map_err(|e| Error::Config(format!("locating hpk-pause: {e}")))?
            .with_file_name("hpk-pause"),
    };
    if !pause_binary.is_file() {
        return Err(Error::Config(format!(
            "hpk-pause not found at {}; give --pause-binary",
            pause_binary.display()
        )));
    }
    let images = ImageStore::open_with(
        &args.root.join("images"),
        StoreOptions { insecure_registries: args.insecure_registries.clone() },
    )?;
    let state = args.state.clone().unwrap_or_else(|| args.root.clone());
    if args.state.is_some() {
        private_dir(&state)?;
    }
    let crun = Crun::new(&state.join("crun"));
    let kind = args.engine.resolve(crate::engine::on_path);
    if kind == EngineKind::Apptainer {
        for program in ["apptainer", "nsenter"] {
            if !crate::engine::on_path(program) {
                return Err(Error::Config(format!(
                    "--engine apptainer needs `{program}` on PATH, and it is not there"
                )));
            }
        }
    }
    let engine: std::sync::Arc<dyn Engine> = match kind {
        EngineKind::Crun => std::sync::Arc::new(
            CrunEngine::new(crun.with_read_only_binary(&args.root.join("bin")))
                .with_mount_points(&state.join("mount-points")),
        ),
        EngineKind::Apptainer => std::sync::Arc::new(ApptainerEngine::new(
            Apptainer::new(&args.root.join("apptainer"), args.insecure_registries.clone()).with_programs(
                crate::engine::resolve_program("apptainer"),
                crate::engine::resolve_program("nsenter"),
            ),
            args.pod_grace_seconds,
        )),
    };
    tracing::info!(engine = kind.name(), requested = ?args.engine, "engine");
    let config = runtime::Config {
        root: args.root.clone(),
        state,
        pause_binary,
        pause_grace_seconds: args.pod_grace_seconds,
        cgroup_mode: args.cgroup_mode,
        shim_binary: std::env::current_exe()
            .map_err(|e| Error::Config(format!("locating this binary for the log shims: {e}")))?,
        network: args.net_forwarder_socket.as_deref().map(runtime::PodNetwork::new),
        pod_logs_root: args.listen.is_some().then(|| args.root.join("pod-logs")),
        cdi_spec_dirs: args.cdi_spec_dirs.iter().map(PathBuf::from).collect(),
        on_pod_removed: Some(crate::remote::files::remove_on_pod_removed(args.root.join(runtime::POD_FILES))),
    };
    let runtime = Runtime::new(config, engine, images)?;
    if let Some(ids) = runtime.id_mappings() {
        tracing::info!(mapping = %ids, "user and group IDs of this bubble");
    }
    runtime.recover().await?;
    if !args.streaming_address.ip().is_loopback() {
        return Err(Error::Config(format!(
            "--streaming-address {} is not a loopback address; the streaming server has no authentication of its own beyond its single-use URLs",
            args.streaming_address
        )));
    }
    runtime.start_streaming(args.streaming_address, shutdown.clone()).await?;
    for limit in crate::engine::limits_not_enforced(args.cgroup_mode) {
        tracing::warn!(%limit, "resource limits");
    }
    let cri = |runtime: &std::sync::Arc<Runtime>| {
        hpk_rpc::Services::new()
            .with(
                RuntimeServiceServer::new(RuntimeApi(runtime.clone()))
                    .max_decoding_message_size(MAX_MESSAGE)
                    .max_encoding_message_size(MAX_MESSAGE),
            )
            .with(
                ImageServiceServer::new(Images(runtime.clone()))
                    .max_decoding_message_size(MAX_MESSAGE)
                    .max_encoding_message_size(MAX_MESSAGE),
            )
    };
    // The TCP port first: if it cannot be bound, no socket file is left behind.
    let remote_listener = match remote_tls {
        Some((addr, tls)) => Some(remote_listener(&tls, addr, &runtime).await?),
        None => None,
    };
    let local = hpk_rpc::serve(hpk_rpc::Listener::unix(&args.socket)?, cri(&runtime), shutdown.clone());
    let Some(listener) = remote_listener else {
        local.await?;
        return Ok(());
    };
    let services = cri(&runtime)
        .with(crate::remote::remote_server(runtime.clone(), args.max_pods))
        .describe(hpk_proto::FILE_DESCRIPTOR_SET);
    let remote = hpk_rpc::serve(listener, services, shutdown);
    let (local, remote) = tokio::join!(local, remote);
    local?;
    remote?;
    Ok(())
}

/// The PEM files of `--listen`.
struct RemoteTls {
    cert: Vec<u8>,
    key: Vec<u8>,
    client_ca: Vec<u8>,
    client_names: Vec<String>,
}

impl RemoteTls {
    /// Reads them; the key must be 0600 (or stricter).
    fn read(args: &ServeArgs) -> Result<Self, Error> {
        let read = |flag: &str, path: &Option<PathBuf>, secret: bool| -> Result<Vec<u8>, Error> {
            let path = path.as_ref().ok_or_else(|| Error::Config(format!("--listen needs {flag}")))?;
            hpk_rpc::mtls::read_pem_file(flag, path, secret).map_err(Error::Config)
        };
        let tls = Self {
            cert: read("--tls-cert-file", &args.tls_cert_file, false)?,
            key: read("--tls-private-key-file", &args.tls_private_key_file, true)?,
            client_ca: read("--client-ca-file", &args.client_ca_file, false)?,
            client_names: args.client_names.clone(),
        };
        // Parsed now too, so a file that is no certificate or key is refused before anything
        // is made.
        hpk_rpc::mtls::server_config(&tls.cert, &tls.key, &tls.client_ca, &tls.client_names)
            .map_err(|e| Error::Config(format!("--listen: {e}")))?;
        Ok(tls)
    }
}

/// The mutual-TLS listener of `--listen`, its HTTP/1.1 sessions handed to the streaming server.
async fn remote_listener(
    tls: &RemoteTls,
    addr: std::net::SocketAddr,
    runtime: &std::sync::Arc<Runtime>,
) -> Result<hpk_rpc::Listener, Error> {
    let streaming = runtime.clone();
    let handler: hpk_rpc::mtls::Http1Handler =
        std::sync::Arc::new(move |session| match streaming.streaming() {
            Ok(server) => server.serve_connection(session),
            Err(error) => tracing::warn!(%error, "closing a streaming session"),
        });
    Ok(hpk_rpc::Listener::mutual_tls(addr, &tls.cert, &tls.key, &tls.client_ca, &tls.client_names)
        .await?
        .with_http1(handler))
}

/// Makes `--state` (0700) where it is missing, and refuses one that is a link, not a
/// directory, another user's or open to others: crun's state and the sandboxes' sockets there
/// steer containers, so nobody else may plant or swap them (the bubble's `/run` is its own, but
/// a runtime started by hand may be given a shared `/dev/shm` or `/tmp`). One that others may
/// write is refused, not tightened: what they may have planted in it would stay; one they may
/// only read or search (0755) is made 0700, since the records there hold containers'
/// environments.
fn private_dir(path: &Path) -> Result<(), Error> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    let refuse = |why: String| Error::Config(format!("--state {}: {why}", path.display()));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .map_err(|e| refuse(format!("cannot create it: {e}")))?;
    let meta = std::fs::symlink_metadata(path).map_err(|e| refuse(format!("cannot inspect it: {e}")))?;
    if meta.file_type().is_symlink() {
        return Err(refuse("it is a symbolic link; give the directory itself".into()));
    }
    if !meta.is_dir() {
        return Err(refuse("it is not a directory".into()));
    }
    let uid = nix::unistd::geteuid().as_raw();
    if meta.uid() != uid {
        return Err(refuse(format!("it belongs to UID {}, not to this user (UID {uid})", meta.uid())));
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(refuse(format!("it has mode {mode:04o}: other users may write it; give a 0700 one")));
    }
    if mode & 0o077 != 0 {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| refuse(format!("cannot make it 0700: {e}")))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    #[test]
    fn state_dir_is_made_private_and_a_foreign_open_or_linked_one_refused() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let made = tmp.path().join("a/b");
        private_dir(&made).expect("made");
        assert_eq!(std::fs::metadata(&made).expect("meta").mode() & 0o777, 0o700);

        let loose = tmp.path().join("loose");
        std::fs::create_dir(&loose).expect("mkdir");
        std::fs::set_permissions(&loose, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let err = private_dir(&loose).expect_err("open to others").to_string();
        assert!(err.contains("mode 0777"), "{err}");
        assert_eq!(std::fs::metadata(&loose).expect("meta").mode() & 0o777, 0o777, "left alone");

        let readable = tmp.path().join("readable");
        std::fs::create_dir(&readable).expect("mkdir");
        std::fs::set_permissions(&readable, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        private_dir(&readable).expect("tightened");
        assert_eq!(std::fs::metadata(&readable).expect("meta").mode() & 0o777, 0o700);

        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&made, &link).expect("symlink");
        let err = private_dir(&link).expect_err("a link").to_string();
        assert!(err.contains("symbolic link"), "{err}");

        let file = tmp.path().join("file");
        std::fs::write(&file, "").expect("write");
        let err = private_dir(&file).expect_err("a file").to_string();
        assert!(err.contains("cannot create") || err.contains("not a directory"), "{err}");

        // Another user's directory: only root can make one here.
        if nix::unistd::geteuid().is_root() {
            let theirs = tmp.path().join("theirs");
            std::fs::create_dir(&theirs).expect("mkdir");
            std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).expect("chown");
            let err = private_dir(&theirs).expect_err("another user's").to_string();
            assert!(err.contains("belongs to UID 65534"), "{err}");
            assert_eq!(std::fs::metadata(&theirs).expect("meta").uid(), 65534, "left alone");
        } else {
            eprintln!("not root: the another-user case needs a directory chowned to another UID");
        }
    }
}
