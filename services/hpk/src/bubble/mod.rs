//! The bubble launcher (`hpk bubble`): one rootless bubble on this host.
//!
//! ```text
//!  host (as the user)                                bubble (crun: user+pid+mount+net+ipc+uts ns)
//!  hpk bubble ── binds every published port ─┐       hpk bubble-init (PID 1: reaps, forwards TERM)
//!    (TCP: kubelet [, apiserver, cert-signer];│ fds     └─ hpk bubble-init --supervise
//!     UDP: tunnel) on ADDRESS:0               └─3,4,…──►    relays each TCP port to 127.0.0.1:same port,
//!    crun create --preserve-fds ──────────────────────►    starts and restarts the services in order
//!    slirp4netns --configure (egress only) ──tap0──────►   (controller: etcd, API server, controller-
//!    crun start; waits for SIGTERM or the bubble's end      manager, scheduler, cert-signer; every node:
//!    teardown: crun kill TERM → bounded wait → KILL,        net-forwarder, pod-runtime, kubelet)
//!    crun delete, slirp4netns stopped, files removed
//! ```
//!
//! Every published port is chosen free by the kernel at start and recorded in the cluster's
//! `nodes/<node>.json`, so clusters share a host. The sockets are created here, in the host's
//! network namespace, and inherited by the bubble: nothing relays between namespaces but the
//! bubble's own copy loops, and slirp4netns carries only the bubble's outbound connections.
//!
//! crun and slirp4netns are the image's own ([`crate::hosttools`]); before them, the launcher
//! enters its own user namespace ([`ids`]: one ID or several) and a private mount namespace.

pub mod binds;
pub mod gpus;
pub mod ids;
pub mod publish;
pub mod spec;

use std::net::{Ipv4Addr, SocketAddr, TcpListener, UdpSocket};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::cluster::{self, NodeRecord, Shared};
use crate::error::{Error, Result};
use crate::hosttools::{HostTools, Tool};
use crate::{fds, image, preflight};

/// Where a runtime bubble finds the client CA, in its node directory.
pub const CLIENT_CA: &str = "connector-client-ca.crt";

/// How long the bubble gets to stop its services after SIGTERM before it is killed.
/// With [`SWEEP_BOUND`], it fits in the Slurm step's stop bound (`slurm::STEP_STOP_BOUND`),
/// which fits in the batch script's signal lead (review L8).
pub(crate) const STOP_GRACE: Duration = Duration::from_secs(30);
/// How long the processes left in the bubble's user namespace get to go once its first
/// process has, before they are killed.
pub(crate) const SWEEP_BOUND: Duration = Duration::from_secs(10);

/// A bubble's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The control plane and the cert-signer, and a node.
    Controller,
    /// A node.
    Worker,
    /// A pod-runtime alone, for a kubelet in another cluster (connector mode): CRI, streaming
    /// and `hpk.podruntime.v1.Remote` on one published port with mutual TLS, and the
    /// net-forwarder for pod addresses. No control plane, no kubelet, no tunnel.
    Runtime,
}

impl Role {
    /// `controller` or `worker`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Controller => "controller",
            Self::Worker => "worker",
            Self::Runtime => "runtime",
        }
    }

    /// Whether the role joins the cluster's pod network (the UDP tunnel between bubbles).
    pub fn tunnel(self) -> bool {
        !matches!(self, Self::Runtime)
    }

    /// The TCP ports this role publishes (UDP `tunnel` comes on top).
    pub fn tcp_ports(self) -> &'static [&'static str] {
        match self {
            Self::Controller => &["apiserver", "cert-signer", "kubelet"],
            Self::Worker => &["kubelet"],
            Self::Runtime => &["runtime"],
        }
    }
}

/// `hpk bubble` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct BubbleArgs {
    /// What every node of the cluster is started with.
    #[command(flatten)]
    pub options: NodeOptions,
    /// The cluster's name (its shared directory is ~/.hpk/<cluster>).
    #[arg(long, default_value = cluster::DEFAULT_NAME)]
    pub cluster: String,
    /// The node's name.
    #[arg(long)]
    pub node: String,
    /// Controller (control plane + node), worker, or runtime (a connector's remote side).
    #[arg(long, value_enum)]
    pub role: Role,
    /// Role runtime: the CA whose client certificates the runtime accepts (the connector's
    /// kubelet presents one). Copied into the node's directory.
    #[arg(long, required_if_eq("role", "runtime"))]
    pub client_ca_file: Option<PathBuf>,
    /// The host address published ports are bound on and the node is reached at.
    #[arg(long)]
    pub address: Ipv4Addr,
    /// The hpk-bubble image: an OCI image layout directory or an oci-archive tar.
    #[arg(long, env = "HPK_IMAGE")]
    pub image: PathBuf,
}

/// What every node of a cluster is started with; `hpk up` passes them to each launcher, the
/// launcher to its bubble's supervisor.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct NodeOptions {
    /// One more flag for every kubelet (repeatable), e.g. --kubelet-arg=--disk-pressure-percent=1.
    #[arg(long = "kubelet-arg", allow_hyphen_values = true, num_args = 1)]
    pub kubelet_args: Vec<String>,
    /// A registry the nodes may pull from over plain HTTP (`host:port`; repeatable).
    #[arg(long = "insecure-registry")]
    pub insecure_registries: Vec<String>,
    /// The CoreDNS image the controller deploys for cluster DNS.
    #[arg(long, default_value = crate::addons::DEFAULT_COREDNS_IMAGE)]
    pub coredns_image: String,
    /// The metrics-server image the controller deploys for `kubectl top` and autoscaling.
    #[arg(long, default_value = crate::addons::DEFAULT_METRICS_SERVER_IMAGE)]
    pub metrics_server_image: String,
    /// The local-path provisioner image the controller deploys for PersistentVolumeClaims
    /// (StorageClass local-path, and the shared ones with --shared-volumes).
    #[arg(long, default_value = crate::addons::DEFAULT_LOCAL_PATH_PROVISIONER_IMAGE)]
    pub local_path_provisioner_image: String,
    /// The image of the provisioner's helper pods, which make and remove volume directories
    /// (any with /bin/sh, mkdir and rm).
    #[arg(long, default_value = crate::addons::DEFAULT_LOCAL_PATH_HELPER_IMAGE)]
    pub local_path_helper_image: String,
    /// A directory at the same path on every node (a shared filesystem, e.g. under
    /// /scratch/$USER) for ReadWriteMany volumes: StorageClasses hpk-shared and
    /// hpk-shared-retain. Made (0700) if missing; it must be the user's own. Every bubble binds
    /// it. Or HPK_SHARED_VOLUMES.
    #[arg(long, env = "HPK_SHARED_VOLUMES")]
    pub shared_volumes: Option<PathBuf>,
    /// Role runtime: the pods' address range (a cluster's nodes take theirs from the API).
    #[arg(long, default_value = "10.244.0.0/24")]
    pub pod_cidr: String,
    /// Role runtime: the subject common name the kubelet's client certificate must have,
    /// besides coming from --client-ca-file (repeatable; review M3: that CA may sign for
    /// others) [default: hpk-connector and system:node:hpk-connector].
    #[arg(long = "client-name")]
    pub client_names: Vec<String>,
    /// How long the cluster lives, e.g. 12h or 30d: no certificate HPK makes outlives it by
    /// more than a day. In a Slurm job, the job's time left [default: 30d, or the job's].
    #[arg(long, value_parser = crate::cluster::parse_lifetime)]
    pub lifetime: Option<std::time::Duration>,
    /// A host path every bubble sees, which pods may mount as hostPath: SRC[:DST][:ro]
    /// (repeatable; or HPK_BIND, comma-separated, when no --bind is given). $HOME and a Slurm
    /// job's submit directory are bound too, at their own paths.
    #[arg(long = "bind", env = "HPK_BIND", value_delimiter = ',')]
    pub binds: Vec<binds::Bind>,
}

impl NodeOptions {
    /// These options as command-line flags, to pass on.
    pub fn to_args(&self) -> Vec<String> {
        let mut args: Vec<String> = self.kubelet_args.iter().map(|a| format!("--kubelet-arg={a}")).collect();
        args.extend(self.insecure_registries.iter().map(|r| format!("--insecure-registry={r}")));
        args.push(format!("--coredns-image={}", self.coredns_image));
        args.push(format!("--metrics-server-image={}", self.metrics_server_image));
        args.push(format!("--local-path-provisioner-image={}", self.local_path_provisioner_image));
        args.push(format!("--local-path-helper-image={}", self.local_path_helper_image));
        if let Some(dir) = &self.shared_volumes {
            args.push(format!("--shared-volumes={}", dir.display()));
        }
        args.push(format!("--pod-cidr={}", self.pod_cidr));
        args.extend(self.client_names.iter().map(|n| format!("--client-name={n}")));
        if let Some(lifetime) = self.lifetime {
            args.push(format!("--lifetime={}s", lifetime.as_secs()));
        }
        args.extend(self.binds.iter().map(|b| format!("--bind={b}")));
        args
    }

    /// The binds asked for: --bind, and the --shared-volumes directory at its own path unless
    /// a --bind has it there already (`create`: made if missing, where the cluster starts).
    pub fn explicit_binds(&self, create: bool) -> Result<Vec<binds::Bind>> {
        let mut all = self.binds.clone();
        if let Some(dir) = &self.shared_volumes {
            let bind = binds::shared_volumes(dir, create, &binds::hidden_dirs()?)?;
            if !all.iter().any(|b| b.dest == bind.dest) {
                all.push(bind);
            }
        }
        Ok(all)
    }
}

/// The host side of a bubble, as set up; [`Launched::teardown`] undoes it.
pub struct Launched {
    id: String,
    node_dir: PathBuf,
    crun_root: PathBuf,
    record: PathBuf,
    tools: HostTools,
    /// The image's cache entry, held while the bubble runs from it (never collected then).
    _image: image::cache::Hold,
    pid: nix::unistd::Pid,
    /// The bubble's user namespace (`user:[inode]`): every process of the bubble, pods
    /// included, lives in it.
    user_ns: Option<String>,
    slirp: Option<std::process::Child>,
    /// What [`publish`] needs: the shared directory, the role, the address and the ports.
    shared: Shared,
    role: Role,
    address: Ipv4Addr,
    ports: Vec<(String, u16)>,
    /// The launcher's end of the host-ports pair ([`crate::host_ports`]), while the bubble
    /// may still ask.
    host_ports: Option<OwnedFd>,
}

/// Runs a bubble until SIGTERM/SIGINT or until it ends; returns the exit code.
///
/// Must be called before any thread starts: it enters a user namespace of its own (as an
/// unprivileged user) and a private mount namespace (for crun on hosts with hybrid cgroups).
pub fn run(args: &BubbleArgs) -> Result<i32> {
    // The state directory is named after the host's UID, read before any user namespace.
    cluster::host_uid();
    // Bad input is refused before anything is made.
    client_ca(args)?;
    binds::resolve_here(&args.options.explicit_binds(false)?)?;
    // The node-token key comes from whoever started this launcher, never from the shared
    // directory (review M4); a runtime bubble enrols nothing.
    let token_key = match args.role {
        Role::Controller | Role::Worker => {
            Some(cluster::parse_node_token_key(std::env::var_os(cluster::NODE_TOKEN_KEY_ENV))?)
        }
        Role::Runtime => None,
    };
    preflight::check_all(&cluster::state_base())?;
    let shared = Shared::new(&args.cluster)?;
    cluster::check_label(&args.node, "node name")?;
    let mode = enter_namespaces()?;
    println!("hpk: node {}: {}", args.node, mode.describe());
    let _ = ID_MODE.set(mode);
    let signals = block_signals()?;
    // The bubble's first process is forked by crun, which exits: it is reparented to us, so
    // that we reap it (a zombie still pins the bubble's namespaces) and see it end.
    nix::sys::prctl::set_child_subreaper(true)
        .map_err(|e| Error::io("become", "a child subreaper", e.into()))?;
    let launched = launch(args, &shared, token_key.as_deref())?;
    let outcome = wait(&launched, &signals);
    launched.teardown();
    outcome
}

/// The launcher's namespaces (see [`ids`]): a user namespace of its own unless it is root on
/// the host, then a private mount namespace with the hybrid cgroup v2 tree hidden.
fn enter_namespaces() -> Result<ids::IdMode> {
    use hpk_oci::{CgroupMode, enter_private_mount_namespace};
    let mode = if nix::unistd::getuid().is_root() { ids::IdMode::HostRoot } else { ids::enter()? };
    if let Err(e) = enter_private_mount_namespace()
        && CgroupMode::detect() == CgroupMode::Hybrid
    {
        return Err(Error::Prerequisite {
            what: format!("this host mounts hybrid cgroups, which crun refuses, and hiding them failed: {e}"),
            fix: "run on a host with cgroup v2 (unified) or v1 only".into(),
        });
    }
    Ok(mode)
}

/// The PEM certificates of `--client-ca-file`, when given: readable, and certificates.
fn client_ca(args: &BubbleArgs) -> Result<Option<Vec<u8>>> {
    let Some(path) = &args.client_ca_file else { return Ok(None) };
    let pem = hpk_rpc::mtls::read_pem_file("--client-ca-file", path, false).map_err(Error::Invalid)?;
    hpk_rpc::mtls::certificates("--client-ca-file", &pem)
        .map_err(|e| Error::Invalid(format!("{e} ({})", path.display())))?;
    Ok(Some(pem))
}

/// What this launcher's bubble maps (set once, by [`run`]).
static ID_MODE: std::sync::OnceLock<ids::IdMode> = std::sync::OnceLock::new();

/// The signals the launcher waits for, blocked so they queue for `sigtimedwait`.
fn block_signals() -> Result<nix::sys::signal::SigSet> {
    use nix::sys::signal::{SigSet, SigmaskHow, Signal, sigprocmask};
    let mut set = SigSet::empty();
    for s in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP, Signal::SIGCHLD] {
        set.add(s);
    }
    sigprocmask(SigmaskHow::SIG_BLOCK, Some(&set), None)
        .map_err(|e| Error::io("block", "signals", e.into()))?;
    Ok(set)
}

fn launch(args: &BubbleArgs, shared: &Shared, token_key: Option<&str>) -> Result<Launched> {
    let node_dir = cluster::node_dir(&shared.name, &args.node);
    let record_path = shared.node_file(&args.node);
    if let Ok(Ok(existing)) = std::fs::read(&record_path).map(|b| serde_json::from_slice::<NodeRecord>(&b))
        && process_alive(existing.launcher_pid)
        && existing.host == hostname()
    {
        return Err(Error::Invalid(format!(
            "node {} of cluster {} already runs (launcher PID {}); stop it with `hpk down --name {}`",
            args.node, shared.name, existing.launcher_pid, shared.name
        )));
    }
    image::create_private_dir(&shared.dir)?;
    image::create_private_dir(&shared.nodes_dir())?;
    if node_dir.exists() {
        std::fs::remove_dir_all(&node_dir).map_err(|e| Error::io("remove stale", node_dir.display(), e))?;
    }
    // From here on, a failure removes the node directory again: nothing half-made stays.
    prepare_and_start(args, shared, &node_dir, &record_path, token_key).inspect_err(|_| {
        let _ = remove_node_dir(&node_dir);
    })
}

/// Where, in the node directory, the shared directory is bound read-only for the bubble.
const SHARED_VIEW: &str = "shared";

/// Binds the cluster's shared directory read-only at `at`, in the launcher's private mount
/// namespace, with the read-only flag locked (review H5): crun binds it into the bubble from
/// there, and not even a process with every capability of the bubble (a pod that broke out)
/// can remount it writable. What the bubble publishes goes through [`publish`].
///
/// The kernel locks a mount's flags (MNT_LOCK_READONLY) when it copies the mount into a mount
/// namespace of another user namespace, and a bind of a locked mount stays locked. crun clones
/// its bind mounts before it enters the bubble's namespaces, so the lock must already be on the
/// mount it clones: a child process enters a user and mount namespace of its own, clones its
/// (locked) copy of the read-only bind and hands it back, and that clone replaces the bind.
fn bind_shared_read_only(shared: &Path, at: &Path) -> Result<()> {
    use nix::mount::{MntFlags, MsFlags, mount, umount2};
    image::create_private_dir(at)?;
    mount(Some(shared), at, None::<&str>, MsFlags::MS_BIND, None::<&str>)
        .map_err(|e| Error::io("bind", format!("{} on {}", shared.display(), at.display()), e.into()))?;
    let undo = |what: &'static str, e: std::io::Error| {
        let _ = umount2(at, MntFlags::MNT_DETACH);
        Error::io(what, at.display(), e)
    };
    remount_read_only(at).map_err(|e| undo("remount read-only", e))?;
    lock_in_place(at, false, "the read-only view of the shared directory")
}

/// Replaces the mount at `at` by its [`locked_clone`] (with the mounts below it if
/// `recursive`); `what` names it in errors. On failure before the swap, `at` is unmounted.
fn lock_in_place(at: &Path, recursive: bool, what: &str) -> Result<()> {
    use nix::mount::{MntFlags, umount2};
    let locked = locked_clone(at, recursive).map_err(|e| {
        let _ = umount2(at, MntFlags::MNT_DETACH);
        Error::io("lock", what, e)
    })?;
    umount2(at, MntFlags::MNT_DETACH).map_err(|e| Error::io("unmount", at.display(), e.into()))?;
    rustix::mount::move_mount(
        &locked,
        "",
        rustix::fs::CWD,
        at,
        rustix::mount::MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
    )
    .map_err(|e| Error::io("attach the locked view at", at.display(), e.into()))
}

/// Remounts the bind mount at `at` read-only, keeping the flags the kernel locked on the
/// launcher's copy of the host's mounts (nosuid, nodev, noexec, the atime mode): a remount
/// without them is refused. (rustix, not libc: musl's statvfs flags lack ST_RELATIME, and nix
/// drops the bits it does not know.)
fn remount_read_only(at: &Path) -> std::io::Result<()> {
    use nix::mount::{MsFlags, mount};
    use rustix::fs::StatVfsMountFlags as St;
    let current = rustix::fs::statvfs(at)?.f_flag;
    let mut flags = MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_RDONLY;
    for (st, ms) in [
        (St::NOSUID, MsFlags::MS_NOSUID),
        (St::NODEV, MsFlags::MS_NODEV),
        (St::NOEXEC, MsFlags::MS_NOEXEC),
        (St::NOATIME, MsFlags::MS_NOATIME),
        (St::NODIRATIME, MsFlags::MS_NODIRATIME),
        (St::RELATIME, MsFlags::MS_RELATIME),
    ] {
        if current.contains(st) {
            flags |= ms;
        }
    }
    if !current.intersects(St::NOATIME | St::RELATIME) {
        flags |= MsFlags::MS_STRICTATIME;
    }
    mount(None::<&str>, at, None::<&str>, flags, None::<&str>)
        .map_err(|e| std::io::Error::other(format!("{e} (flags {current:?})")))
}

/// A detached clone of the mount at `path` as a child in a user and mount namespace of its own
/// sees it: with its flags locked and, if `recursive`, with the mounts below it, each locked to
/// its parent (none can be unmounted to reveal what it covers). The launcher is single-threaded
/// here, so it may fork.
#[allow(unsafe_code)]
fn locked_clone(path: &Path, recursive: bool) -> std::io::Result<OwnedFd> {
    use rustix::net::{
        AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
        SendAncillaryMessage, SendFlags, SocketFlags, SocketType, recvmsg, sendmsg, socketpair,
    };
    let (ours, theirs) = socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)?;
    // SAFETY: the launcher has started no thread yet (see `run`); the child only makes system
    // calls and exits.
    match unsafe { nix::unistd::fork() }.map_err(std::io::Error::from)? {
        nix::unistd::ForkResult::Child => {
            let sent = (|| -> std::io::Result<()> {
                nix::sched::unshare(
                    nix::sched::CloneFlags::CLONE_NEWUSER | nix::sched::CloneFlags::CLONE_NEWNS,
                )?;
                let mut flags = rustix::mount::OpenTreeFlags::OPEN_TREE_CLONE
                    | rustix::mount::OpenTreeFlags::OPEN_TREE_CLOEXEC;
                if recursive {
                    flags |= rustix::mount::OpenTreeFlags::AT_RECURSIVE;
                }
                let tree = rustix::mount::open_tree(rustix::fs::CWD, path, flags)?;
                let fds = [std::os::fd::AsFd::as_fd(&tree)];
                let mut space = [std::mem::MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
                let mut ancillary = SendAncillaryBuffer::new(&mut space);
                ancillary.push(SendAncillaryMessage::ScmRights(&fds));
                sendmsg(&theirs, &[std::io::IoSlice::new(b"m")], &mut ancillary, SendFlags::empty())?;
                Ok(())
            })();
            // SAFETY: ends the forked child without running the parent's destructors.
            unsafe { nix::libc::_exit(i32::from(sent.is_err())) }
        }
        nix::unistd::ForkResult::Parent { child } => {
            drop(theirs);
            let mut buf = [0u8; 8];
            let mut space = [std::mem::MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
            let mut ancillary = RecvAncillaryBuffer::new(&mut space);
            let received = recvmsg(
                &ours,
                &mut [std::io::IoSliceMut::new(&mut buf)],
                &mut ancillary,
                RecvFlags::CMSG_CLOEXEC,
            );
            let fd = ancillary.drain().find_map(|m| match m {
                RecvAncillaryMessage::ScmRights(mut fds) => fds.next(),
                _ => None,
            });
            let status = nix::sys::wait::waitpid(child, None).map_err(std::io::Error::from)?;
            received?;
            fd.ok_or_else(|| std::io::Error::other(format!("the helper process sent no mount ({status:?})")))
        }
    }
}

/// Where the views of the user's paths are mounted for the bubble of `node_dir`: beside it,
/// not in it, so that no removal of the node directory can reach into the user's files.
fn binds_root(node_dir: &Path) -> PathBuf {
    let mut name = node_dir.file_name().unwrap_or_default().to_os_string();
    name.push(".binds");
    node_dir.with_file_name(name)
}

/// Removes a node directory, the read-only view of the shared directory unmounted first. If
/// that view is still mounted, nothing is removed: the removal would reach into it. The views
/// of the user's paths beside it go too (see [`binds::clear`]).
fn remove_node_dir(node_dir: &Path) -> std::io::Result<()> {
    if let Err(e) = binds::clear(&binds_root(node_dir)) {
        tracing::warn!(dir = %binds_root(node_dir).display(), error = %e, "could not remove the views of bound paths");
    }
    use std::os::unix::fs::MetadataExt;
    let view = node_dir.join(SHARED_VIEW);
    let _ = nix::mount::umount2(&view, nix::mount::MntFlags::MNT_DETACH);
    if let (Ok(dir), Ok(inner)) = (std::fs::metadata(node_dir), std::fs::symlink_metadata(&view))
        && dir.dev() != inner.dev()
    {
        return Err(std::io::Error::other(format!("{} is still mounted", view.display())));
    }
    std::fs::remove_dir_all(node_dir)
}

fn prepare_and_start(
    args: &BubbleArgs,
    shared: &Shared,
    node_dir: &Path,
    record_path: &Path,
    token_key: Option<&str>,
) -> Result<Launched> {
    let node_dir = node_dir.to_owned();
    let record_path = record_path.to_owned();
    for sub in ["", "etc", "logs", "crun", "bundle", "volumes", publish::PUBLISH_DIR] {
        image::create_private_dir(&node_dir.join(sub))?;
    }
    // The node's own token, node-local (0600 in the 0700 node directory), where its requests
    // read it; the key it is made from only on the controller, for the cert-signer (review H3).
    if let Some(key) = token_key {
        let token = cluster::node_token(key, &args.node);
        cluster::write_file(&node_dir.join(cluster::NODE_TOKEN_FILE), token.as_bytes(), 0o600)?;
        if args.role == Role::Controller {
            cluster::write_file(&node_dir.join(cluster::NODE_TOKEN_KEY_FILE), key.as_bytes(), 0o600)?;
        }
    }
    let shared_view = node_dir.join(SHARED_VIEW);
    bind_shared_read_only(&shared.dir, &shared_view)?;
    // The user's paths: $HOME, the job's submit directory, --bind.
    let hidden = binds::hidden_dirs()?;
    let (user_binds, warnings) = binds::resolve_here(&args.options.explicit_binds(false)?)?;
    for warning in &warnings {
        tracing::warn!("{warning}");
    }
    let views = binds::stage(&user_binds, &hidden, &binds_root(&node_dir))?;
    // The allocation's GPUs (runtime bubbles of connector mode give none).
    let gpus = match args.role {
        Role::Runtime => None,
        Role::Controller | Role::Worker => {
            let env = |k: &str| std::env::var(k).ok();
            let ids = gpus::allocated(&env)?;
            let host_dirs: Vec<PathBuf> = hpk_cdi::SPEC_DIRS.iter().map(PathBuf::from).collect();
            gpus::stage(&node_dir, &ids, &gpus::host(&env), &host_dirs)?
        }
    };
    if let Some(staged) = &gpus {
        println!("hpk: node {}: GPUs {:?}, described by {}", args.node, staged.ids, staged.source);
    }
    let unpacked = image::unpack(&args.image, &cluster::image_cache())?;
    tracing::info!(image = %args.image.display(), digest = %unpacked.digest, "image ready");
    // crun and slirp4netns come from the image, never from the host.
    let tools = HostTools::new(&unpacked.rootfs)?;

    // Every published port, bound now in the host's namespace.
    let mut sockets: Vec<(String, OwnedFd, u16)> = Vec::new();
    for name in args.role.tcp_ports() {
        let listener = TcpListener::bind(SocketAddr::from((args.address, 0)))
            .map_err(|e| port_error(name, args.address, e))?;
        let port = listener.local_addr().map_err(|e| Error::io("read", "a listener's port", e))?.port();
        sockets.push(((*name).to_owned(), listener.into(), port));
    }
    if args.role.tunnel() {
        let (group, tunnel_port) = tunnel_sockets(args.address, tunnel_queues())?;
        for (i, udp) in group.into_iter().enumerate() {
            let name = if i == 0 { "tunnel".to_owned() } else { format!("tunnel-{i}") };
            sockets.push((name, udp.into(), tunnel_port));
        }
    }
    // Ports published while the bubble runs (hostPort, NodePort, LoadBalancer): asked for by
    // its supervisor over a socket pair, bound here (crate::host_ports).
    let host_ports = match args.role {
        Role::Controller | Role::Worker => Some(crate::host_ports::pair()?),
        Role::Runtime => None,
    };
    if let Some(pem) = client_ca(args)? {
        cluster::write_file(&node_dir.join(CLIENT_CA), &pem, 0o644)?;
    }

    let write = |rel: &str, text: String| cluster::write_file(&node_dir.join(rel), text.as_bytes(), 0o644);
    // Outbound DNS through slirp4netns' resolver; the node's name is the host's address.
    write("etc/resolv.conf", "nameserver 10.0.2.3\n".into())?;
    write("etc/hosts", format!("127.0.0.1 localhost\n::1 localhost\n{} {}\n", args.address, args.node))?;
    // The node's identity for the kubelet's nodeInfo (systemd's format: 32 hex digits).
    let mut id = [0u8; 16];
    getrandom::fill(&mut id)
        .map_err(|e| Error::io("generate", "a machine ID", std::io::Error::other(e.to_string())))?;
    write("etc/machine-id", format!("{}\n", hex::encode(id)))?;

    // The tunnel's other sockets share its port.
    let ports: Vec<String> = sockets
        .iter()
        .filter(|(n, _, _)| !n.starts_with("tunnel-"))
        .map(|(n, _, p)| format!("{n}={p}"))
        .collect();
    let mut init_args = vec![
        "/usr/local/bin/hpk".to_owned(),
        "bubble-init".into(),
        format!("--cluster={}", shared.name),
        format!("--node={}", args.node),
        format!("--role={}", args.role.as_str()),
        format!("--address={}", args.address),
        format!("--ports={}", ports.join(",")),
    ];
    // The supervisor learns what is bound (the kubelet allows hostPath there, and refuses
    // HPK's own directories).
    let options = NodeOptions { binds: user_binds.clone(), ..args.options.clone() };
    init_args.extend(options.to_args());
    init_args.extend(hidden.iter().map(|h| format!("--hidden-host-path={}", h.display())));
    let (uid_map, gid_map) =
        ID_MODE.get().map(ids::IdMode::bubble_maps).unwrap_or_else(|| spec::id_maps(0, 0, None, None));
    let mut env = vec![
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_owned(),
        format!("HOME={}", spec::NODE_DIR),
        format!("RUST_LOG={}", std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into())),
    ];
    // The job's allocation, which the kubelet advertises as the Node's capacity
    // (hpk-node-resources reads these).
    env.extend(allocation_env(std::env::vars()));
    let mut fd_names: Vec<&str> = sockets.iter().map(|(n, _, _)| n.as_str()).collect();
    if host_ports.is_some() {
        fd_names.push(crate::host_ports::FD_NAME);
    }
    env.push(format!(
        "HPK_FDS={}",
        fd_names.iter().enumerate().map(|(i, n)| format!("{n}={}", 3 + i)).collect::<Vec<_>>().join(",")
    ));
    let tun = preflight::tun_device();
    let config = spec::config(&spec::BubbleSpec {
        rootfs: &unpacked.rootfs,
        hostname: &args.node,
        args: init_args,
        env,
        node_dir: &node_dir,
        shared_dir: &shared_view,
        tun: &tun,
        uid_map,
        gid_map,
        binds: views
            .iter()
            .zip(&user_binds)
            .map(|(view, b)| (view.clone(), b.dest.clone(), b.readonly))
            .collect(),
        gpus: gpus.map(|g| g.binds).unwrap_or_default(),
    });
    let bundle = node_dir.join("bundle");
    cluster::write_file(
        &bundle.join("config.json"),
        serde_json::to_string_pretty(&config).unwrap_or_default().as_bytes(),
        0o600,
    )?;

    let id = format!("hpk-{}-{}", shared.name, args.node);
    let crun_root = node_dir.join("crun");
    let log = node_dir.join("logs/bubble.log");
    let log_file = || {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|e| Error::io("open", log.display(), e))
    };
    let pid_file = node_dir.join("bubble.pid");
    let mut create = crun(&tools, &crun_root);
    create
        .arg("create")
        .arg("--bundle")
        .arg(&bundle)
        .arg("--pid-file")
        .arg(&pid_file)
        .arg(format!("--preserve-fds={}", fd_names.len()))
        .arg(&id)
        .stdin(Stdio::null())
        .stdout(log_file()?)
        .stderr(log_file()?);
    let mut fd_refs: Vec<&OwnedFd> = sockets.iter().map(|(_, fd, _)| fd).collect();
    fd_refs.extend(host_ports.as_ref().map(|(_, theirs)| theirs));
    fds::pass(&mut create, &fd_refs);
    let mut partial = Launched {
        id: id.clone(),
        node_dir: node_dir.clone(),
        crun_root: crun_root.clone(),
        record: record_path.clone(),
        tools: tools.clone(),
        _image: unpacked.hold.clone(),
        pid: nix::unistd::Pid::from_raw(0),
        user_ns: None,
        slirp: None,
        shared: shared.clone(),
        role: args.role,
        address: args.address,
        ports: sockets
            .iter()
            .filter(|(n, _, _)| !n.starts_with("tunnel-"))
            .map(|(n, _, p)| (n.clone(), *p))
            .collect(),
        host_ports: None,
    };
    let status = create.status().map_err(|e| Error::io("run", "crun create", e))?;
    drop(sockets); // the bubble holds them now
    partial.host_ports = host_ports.map(|(ours, _theirs)| ours);
    if !status.success() {
        let tail = tail(&log, 20);
        partial.teardown();
        return Err(Error::Failed {
            what: "crun create (the bubble)".into(),
            detail: format!("{status}\n{tail}"),
        });
    }
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .ok_or_else(|| Error::Failed { what: "crun create".into(), detail: "wrote no PID file".into() })?;
    partial.pid = nix::unistd::Pid::from_raw(pid);
    partial.user_ns =
        std::fs::read_link(format!("/proc/{pid}/ns/user")).ok().map(|l| l.display().to_string());

    match start_slirp(&tools, pid, &node_dir) {
        Ok(child) => partial.slirp = Some(child),
        Err(e) => {
            partial.teardown();
            return Err(e);
        }
    }
    let started = crun(&tools, &crun_root).arg("start").arg(&id).stdin(Stdio::null()).output();
    match started {
        Ok(o) if o.status.success() => {}
        Ok(o) => {
            partial.teardown();
            return Err(Error::Failed {
                what: "crun start".into(),
                detail: String::from_utf8_lossy(&o.stderr).into_owned(),
            });
        }
        Err(e) => {
            partial.teardown();
            return Err(Error::io("run", "crun start", e));
        }
    }
    let record = NodeRecord {
        node: args.node.clone(),
        role: args.role.as_str().into(),
        address: args.address,
        launcher_pid: std::process::id(),
        host: hostname(),
        state_dir: node_dir.clone(),
        rootfs: Some(tools.root().to_owned()),
        ports: ports
            .iter()
            .filter_map(|p| p.split_once('=').and_then(|(n, v)| Some((n.to_owned(), v.parse().ok()?))))
            .collect(),
    };
    cluster::write_file(
        &record_path,
        serde_json::to_string_pretty(&record).unwrap_or_default().as_bytes(),
        0o644,
    )?;
    tracing::info!(node = %args.node, pid, ports = %ports.join(","), "bubble started");
    Ok(partial)
}

/// The variables of the launcher's environment that describe the Slurm allocation (its
/// CPUs, memory and GPUs), as `KEY=value` for the bubble.
fn allocation_env(vars: impl Iterator<Item = (String, String)>) -> Vec<String> {
    const GPU_LISTS: [&str; 3] = ["CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "ROCR_VISIBLE_DEVICES"];
    let mut env: Vec<String> = vars
        .filter(|(k, _)| k.starts_with("SLURM_") || GPU_LISTS.contains(&k.as_str()))
        .filter(|(k, v)| !k.contains('=') && !v.contains('\0'))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    env.sort();
    env
}

/// The tunnel's receiving sockets: one per CPU of this step's allocation (the CPUs this process
/// may run on), at most 16, the queues the net-forwarder gives its tunnel by default.
fn tunnel_queues() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).clamp(1, 16)
}

/// `queues` UDP sockets on one port of `address`: with more than one, a reuse-port group, bound
/// in order (the net-forwarder's `--tunnel-fd` takes them in that order and steers each
/// datagram to one of them by the lane its header names). The kernel lets only this user's
/// sockets join the group.
fn tunnel_sockets(address: Ipv4Addr, queues: usize) -> Result<(Vec<UdpSocket>, u16)> {
    use nix::sys::socket::{
        AddressFamily, SockFlag, SockType, SockaddrIn, bind, setsockopt, socket, sockopt,
    };
    use std::os::fd::AsRawFd;
    let failed = |e: nix::errno::Errno| port_error("tunnel", address, e.into());
    let mut group = Vec::with_capacity(queues);
    let mut port = 0;
    for _ in 0..queues {
        let fd =
            socket(AddressFamily::Inet, SockType::Datagram, SockFlag::SOCK_CLOEXEC, None).map_err(failed)?;
        if queues > 1 {
            setsockopt(&fd, sockopt::ReusePort, &true).map_err(failed)?;
        }
        bind(fd.as_raw_fd(), &SockaddrIn::from(std::net::SocketAddrV4::new(address, port)))
            .map_err(failed)?;
        let udp = UdpSocket::from(fd);
        port = udp.local_addr().map_err(|e| Error::io("read", "the tunnel's port", e))?.port();
        group.push(udp);
    }
    Ok((group, port))
}

fn port_error(name: &str, address: Ipv4Addr, e: std::io::Error) -> Error {
    Error::Prerequisite {
        what: format!("no free port on {address} for the {name}: {e}"),
        fix: "free some ports, or widen the local port range (sysctl net.ipv4.ip_local_port_range), or pick another --address".into(),
    }
}

/// The image's crun with the bubble's state root.
pub fn crun(tools: &HostTools, root: &Path) -> Command {
    let mut cmd = tools.command(Tool::Crun);
    fds::unblock_signals(&mut cmd);
    cmd.arg(format!("--root={}", root.display())).arg("--cgroup-manager=disabled");
    cmd
}

/// slirp4netns on the bubble's network namespace: `tap0`, a default route, DNS at 10.0.2.3;
/// the host's loopback is not reachable from the bubble; sandboxed (its own mount namespace
/// with nothing but what it needs, and seccomp). Waits for its ready signal.
fn start_slirp(tools: &HostTools, pid: i32, node_dir: &Path) -> Result<std::process::Child> {
    let (ready_read, ready_write) =
        nix::unistd::pipe().map_err(|e| Error::io("create", "a pipe", e.into()))?;
    let log = node_dir.join("logs/slirp4netns.log");
    let file = std::fs::File::create(&log).map_err(|e| Error::io("create", log.display(), e))?;
    let err = file.try_clone().map_err(|e| Error::io("dup", log.display(), e))?;
    let mut cmd = tools.command(Tool::Slirp4netns);
    // It parses every packet of the pods' egress (libslirp has a history of CVEs): confined to
    // an empty root and a seccomp filter of its own (review L14).
    cmd.args([
        "--configure",
        "--mtu=65520",
        "--disable-host-loopback",
        "--enable-sandbox",
        "--enable-seccomp",
        "--ready-fd=3",
    ])
    .arg(format!("--userns-path=/proc/{pid}/ns/user"))
    .arg("--netns-type=path")
    .arg(format!("/proc/{pid}/ns/net"))
    .arg("tap0")
    .stdin(Stdio::null())
    .stdout(file)
    .stderr(err);
    fds::pass(&mut cmd, &[&ready_write]);
    let mut child = cmd.spawn().map_err(|e| Error::io("start", "slirp4netns", e))?;
    drop(ready_write);
    // The ready byte, or EOF if slirp4netns died; bounded by polling the pipe.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut reader = std::fs::File::from(ready_read);
    set_nonblocking(&reader);
    loop {
        let mut byte = [0u8; 1];
        match std::io::Read::read(&mut reader, &mut byte) {
            Ok(1) => return Ok(child),
            Ok(_) => break, // EOF: it exited
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => break,
        }
        if Instant::now() >= deadline {
            break;
        }
        let fd = std::os::fd::AsFd::as_fd(&reader);
        let mut poll = [nix::poll::PollFd::new(fd, nix::poll::PollFlags::POLLIN)];
        let _ = nix::poll::poll(&mut poll, nix::poll::PollTimeout::from(100u16));
    }
    let _ = child.kill();
    let _ = child.wait();
    Err(Error::Failed { what: "slirp4netns (the bubble's egress)".into(), detail: tail(&log, 10) })
}

fn set_nonblocking(file: &std::fs::File) {
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    if let Ok(flags) = fcntl(file, FcntlArg::F_GETFL) {
        let _ = fcntl(file, FcntlArg::F_SETFL(OFlag::from_bits_truncate(flags) | OFlag::O_NONBLOCK));
    }
}

/// Waits for a stop signal or the bubble's end.
fn wait(launched: &Launched, signals: &nix::sys::signal::SigSet) -> Result<i32> {
    use nix::sys::signalfd::{SfdFlags, SignalFd};
    let fd = SignalFd::with_flags(signals, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)
        .map_err(|e| Error::io("create", "a signalfd", e.into()))?;
    let target = publish::Target {
        shared: &launched.shared,
        role: launched.role,
        address: launched.address,
        ports: &launched.ports,
    };
    let mut published = launched.role == Role::Worker;
    let mut host_ports = launched.host_ports.as_ref();
    loop {
        if !published {
            published = publish::try_publish(&launched.node_dir, &target)?;
        }
        // The bubble's first process is not our child (crun forked it); check it by PID.
        if !process_alive(launched.pid.as_raw() as u32) {
            return Err(Error::Failed {
                what: "the bubble".into(),
                detail: format!(
                    "it ended by itself; log:\n{}",
                    tail(&launched.node_dir.join("logs/bubble.log"), 30)
                ),
            });
        }
        let mut poll =
            vec![nix::poll::PollFd::new(std::os::fd::AsFd::as_fd(&fd), nix::poll::PollFlags::POLLIN)];
        if let Some(ports) = &host_ports {
            poll.push(nix::poll::PollFd::new(std::os::fd::AsFd::as_fd(ports), nix::poll::PollFlags::POLLIN));
        }
        // Checked more often until the bubble's files are published: the cluster waits on them.
        let tick: u16 = if published { 1000 } else { 200 };
        let _ = nix::poll::poll(&mut poll, nix::poll::PollTimeout::from(tick));
        let asked = poll.get(1).and_then(nix::poll::PollFd::revents).is_some_and(|r| !r.is_empty());
        drop(poll);
        if asked
            && let Some(ports) = &host_ports
            && !crate::host_ports::answer_pending(ports, launched.address)
        {
            host_ports = None;
        }
        while let Ok(Some(info)) = fd.read_signal() {
            let signal = nix::sys::signal::Signal::try_from(info.ssi_signo as i32);
            match signal {
                Ok(nix::sys::signal::Signal::SIGCHLD) => reap_children(),
                Ok(signal) => {
                    tracing::info!(%signal, "stopping the bubble");
                    return Ok(0);
                }
                Err(_) => {}
            }
        }
    }
}

impl Launched {
    /// Stops the bubble (SIGTERM, then SIGKILL after [`STOP_GRACE`]), deletes it, stops
    /// slirp4netns and removes the node's files and record.
    pub fn teardown(mut self) {
        if self.pid.as_raw() > 0 && process_alive(self.pid.as_raw() as u32) {
            let _ = crun(&self.tools, &self.crun_root).args(["kill", &self.id, "TERM"]).output();
            let deadline = Instant::now() + STOP_GRACE;
            while process_alive(self.pid.as_raw() as u32) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(100));
            }
            if process_alive(self.pid.as_raw() as u32) {
                tracing::warn!(bubble = %self.id, "still running after {} s: killing it", STOP_GRACE.as_secs());
                let _ = crun(&self.tools, &self.crun_root).args(["kill", "--all", &self.id, "KILL"]).output();
            }
        }
        // The bubble's first process is gone, so the kernel is killing the rest of its PID
        // namespace; wait until no process of the bubble remains (bounded), killing stragglers.
        if let Some(ns) = &self.user_ns {
            let deadline = Instant::now() + SWEEP_BOUND;
            // slirp4netns joined the bubble's user namespace to reach its network: ours to stop
            // after this wait, not a process of the bubble.
            let slirp = self.slirp.as_ref().map(std::process::Child::id);
            loop {
                let mut left = processes_in_user_ns(ns);
                left.retain(|pid| Some(*pid) != slirp);
                if left.is_empty() {
                    break;
                }
                if Instant::now() >= deadline {
                    tracing::warn!(bubble = %self.id, pids = ?left, "processes of the bubble still there: killing them");
                    for pid in left {
                        let _ = nix::sys::signal::kill(
                            nix::unistd::Pid::from_raw(pid as i32),
                            nix::sys::signal::Signal::SIGKILL,
                        );
                    }
                    std::thread::sleep(Duration::from_millis(200));
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        reap_children();
        let _ = crun(&self.tools, &self.crun_root).args(["delete", "--force", &self.id]).output();
        if let Some(mut slirp) = self.slirp.take() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(slirp.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let _ = slirp.wait();
        }
        let _ = std::fs::remove_file(&self.record);
        if let Err(e) = remove_node_dir(&self.node_dir) {
            tracing::warn!(dir = %self.node_dir.display(), error = %e, "could not remove the node directory");
        }
        // The cluster's directory on this host, once its last node is gone.
        if let Some(cluster_dir) = self.node_dir.parent() {
            let _ = std::fs::remove_dir(cluster_dir);
        }
        tracing::info!(bubble = %self.id, "bubble removed");
    }
}

/// Reaps every child that has exited (the bubble's first process among them).
fn reap_children() {
    use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
    while let Ok(status) = waitpid(None, Some(WaitPidFlag::WNOHANG)) {
        if status == WaitStatus::StillAlive {
            break;
        }
    }
}

/// The live processes whose user namespace is `ns` (`user:[inode]`).
fn processes_in_user_ns(ns: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/ns/user")).is_ok_and(|l| l.display().to_string() == ns)
                && process_alive(*pid)
        })
        .collect()
}

/// Whether `pid` is a live process (zombies count as gone).
pub fn process_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|s| s != "Z" && s != "X"),
        Err(_) => false,
    }
}

/// This host's name.
pub fn hostname() -> String {
    nix::unistd::gethostname().ok().and_then(|h| h.into_string().ok()).unwrap_or_default()
}

/// The last `lines` lines of a log file.
pub fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_tunnel_sockets_share_one_port() {
        let (group, port) = super::tunnel_sockets(std::net::Ipv4Addr::LOCALHOST, 3).expect("bind");
        assert_eq!(group.len(), 3);
        assert!(port != 0 && group.iter().all(|s| s.local_addr().expect("addr").port() == port));
        // A lone socket is no group: its port is its own.
        let (lone, port) = super::tunnel_sockets(std::net::Ipv4Addr::LOCALHOST, 1).expect("bind");
        assert_eq!(lone.len(), 1);
        assert!(std::net::UdpSocket::bind((std::net::Ipv4Addr::LOCALHOST, port)).is_err());
    }

    #[test]
    fn the_allocation_reaches_the_bubble_and_nothing_else() {
        let vars = [
            ("SLURM_CPUS_ON_NODE", "4"),
            ("SLURM_MEM_PER_NODE", "2048"),
            ("SLURM_STEP_GPUS", "0,1"),
            ("CUDA_VISIBLE_DEVICES", "0,1"),
            ("HOME", "/home/u"),
            ("SSH_AUTH_SOCK", "/tmp/agent"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()));
        assert_eq!(
            super::allocation_env(vars.into_iter()),
            [
                "CUDA_VISIBLE_DEVICES=0,1",
                "SLURM_CPUS_ON_NODE=4",
                "SLURM_MEM_PER_NODE=2048",
                "SLURM_STEP_GPUS=0,1"
            ]
        );
    }
}
