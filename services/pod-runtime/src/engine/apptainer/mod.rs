//! The Apptainer engine: every invocation of `apptainer` (and of `nsenter` around it) the
//! runtime makes, built as a [`Command`] so tests check program, arguments and environment
//! without running anything.
//!
//! - **Images**: `apptainer pull` of `docker://NAME@DIGEST` into `ROOT/images/<sha256>.sif`,
//!   the file named by the SHA-256 of that full reference. The digest is the one the OCI store
//!   just verified (the CRI image service keeps using the store for IDs, sizes and the image
//!   config's entrypoint/cmd/env/user), so the SIF holds exactly that content and a tag that
//!   moves later cannot make a cached SIF lie. Plain HTTP is `--no-https`; credentials go in
//!   `APPTAINER_DOCKER_USERNAME`/`APPTAINER_DOCKER_PASSWORD`, never on the command line.
//! - **Sandbox**: an instance (`instance start --fakeroot --net --network none --pid --ipc
//!   --uts --no-init`) of a directory the runtime writes: the host's `/usr` read-only, and a
//!   startscript that execs the bound-in hpk-pause with the events socket, so hpk-pause is
//!   PID 1 of the instance and reports exits exactly as under crun.
//! - **Container**: `nsenter` into the pause's network, IPC, UTS and PID namespaces runs a
//!   small launcher (`sh`) that backgrounds `apptainer exec` of the image's SIF and exits: the
//!   apptainer process is orphaned to hpk-pause, which reaps it and reports its status (the
//!   container's) on the events socket, and nothing of it is a child of the runtime, so a
//!   runtime restart loses nothing. The launcher holds the process until the runtime writes
//!   to a start FIFO: CRI's create/start split, as crun has it.
//! - **Exec**: `nsenter --target <the container's process>` into its user, mount, PID,
//!   network, IPC and UTS namespaces, with its root, working directory and environment. Not
//!   `apptainer exec instance://…`: the container is not an instance (only the sandbox is),
//!   and an instance's namespaces are the sandbox's, not the container's image.
//!
//! What Apptainer cannot express is refused with a reason ([`Error::Unsupported`]): bind paths
//! holding `,` or `:` (its `--bind` syntax), environment names that are not shell
//! identifiers (its environment goes through a shell), terminals (no console socket).

mod engine;
mod procs;
#[cfg(test)]
mod tests;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use sha2::{Digest as _, Sha256};

use super::error::run;
use super::spec::{EVENTS_DIR, PAUSE_PATH, SandboxSpec};
use super::{ContainerState, Error, Result};
use crate::images::Credentials;

pub use engine::ApptainerEngine;
pub use procs::{ProcessInfo, container_process, find_pause, find_pause_in, host_pid_in, process_tree, scan};

/// The host environment variables an apptainer invocation keeps; everything else, and every
/// inherited `APPTAINERENV_*`, is dropped so nothing of the runtime's environment leaks into
/// a container. Variables starting with `APPTAINER_` (site settings such as the cache or tmp
/// directory) are kept too.
const KEPT_ENV: &[&str] = &["PATH", "HOME", "USER", "LOGNAME", "TMPDIR", "XDG_RUNTIME_DIR", "LANG"];

/// The launcher run by `sh -c` in the sandbox's namespaces. `$1` is the start FIFO, `$2` the
/// PID file, the rest the apptainer command. It opens the FIFO read-write (so it never blocks
/// and the runtime's write always finds a reader), backgrounds a subshell that waits for the
/// start line and then execs apptainer in its place (so the PID written is the container's
/// init for its whole life), and exits, orphaning it to hpk-pause. A background job of a
/// non-interactive shell gets /dev/null as stdin, so the real stdin is passed as fd 3.
pub const LAUNCHER: &str = "exec 3<&0 4<>\"$1\"
{ read -r go <&4 || exit 1; shift 2; exec \"$@\" 4<&-; } <&3 3<&- &
echo $! >\"$2\"
";

/// How an instance is stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// `--signal SIGTERM --timeout N`: apptainer sends SIGKILL after N seconds.
    Term {
        /// Seconds before SIGKILL.
        timeout: u32,
    },
    /// `--force`: SIGKILL at once.
    Kill,
}

/// A pod container as Apptainer runs it.
#[derive(Clone, Debug)]
pub struct ContainerLaunch {
    /// The image's SIF file.
    pub image: PathBuf,
    /// Command and arguments.
    pub args: Vec<String>,
    /// `KEY=value` environment, passed as `APPTAINERENV_KEY`.
    pub env: Vec<String>,
    /// Working directory.
    pub cwd: String,
    /// Run as root of a user namespace (`--fakeroot`); otherwise as the runtime's own user.
    pub fakeroot: bool,
    /// Bind mounts: host path, container path, read-only.
    pub mounts: Vec<(PathBuf, String, bool)>,
    /// No writable layer (`--writable-tmpfs` otherwise).
    pub readonly_rootfs: bool,
    /// The FIFO a line is written to when the container is to start.
    pub start_fifo: PathBuf,
    /// Where the launcher writes the container's PID in the sandbox.
    pub pid_file: PathBuf,
}

/// `apptainer` and `nsenter` with the runtime's settings.
#[derive(Clone, Debug)]
pub struct Apptainer {
    binary: PathBuf,
    nsenter: PathBuf,
    root: PathBuf,
    insecure_registries: Vec<String>,
    inherited_env: Vec<(OsString, OsString)>,
}

impl Apptainer {
    /// Apptainer from PATH, keeping its images, cache and temporary files under `root`,
    /// speaking plain HTTP to `insecure_registries` (`host:port`).
    pub fn new(root: &Path, insecure_registries: Vec<String>) -> Self {
        let inherited_env = std::env::vars_os()
            .filter(|(key, _)| {
                let key = key.to_string_lossy();
                KEPT_ENV.contains(&key.as_ref())
                    || (key.starts_with("APPTAINER_") && !key.starts_with("APPTAINER_DOCKER_"))
            })
            .collect();
        Self {
            binary: PathBuf::from("apptainer"),
            nsenter: PathBuf::from("nsenter"),
            root: root.to_owned(),
            insecure_registries,
            inherited_env,
        }
    }

    /// The same with other programs for `apptainer` and `nsenter` (absolute paths, so that
    /// a container's PATH never decides which program runs).
    pub fn with_programs(mut self, apptainer: impl Into<PathBuf>, nsenter: impl Into<PathBuf>) -> Self {
        self.binary = apptainer.into();
        self.nsenter = nsenter.into();
        self
    }

    /// The same, passing exactly `vars` of the host's environment to every invocation.
    pub fn with_inherited_env(mut self, vars: Vec<(OsString, OsString)>) -> Self {
        self.inherited_env = vars;
        self
    }

    /// The directory holding the pulled SIF files.
    pub fn images_dir(&self) -> PathBuf {
        self.root.join("images")
    }

    /// The SIF file for `reference` (`registry/repository@digest`): named by the SHA-256 of
    /// `docker://` + the reference, so any reference maps to one safe file name.
    pub fn sif_path(&self, reference: &str) -> PathBuf {
        let key = hex::encode(Sha256::digest(format!("docker://{reference}").as_bytes()));
        self.images_dir().join(format!("{key}.sif"))
    }

    /// A command for `program` with the kept host environment and apptainer's own cache and
    /// temporary directories under the runtime's root.
    fn command(&self, program: &Path) -> Command {
        let mut cmd = Command::new(program);
        cmd.env_clear().envs(self.inherited_env.iter().map(|(k, v)| (k, v)));
        cmd.env("APPTAINER_CACHEDIR", self.root.join("cache")).env("APPTAINER_TMPDIR", self.root.join("tmp"));
        cmd
    }

    fn apptainer(&self) -> Command {
        self.command(&self.binary)
    }

    /// `apptainer pull [--no-https] OUTPUT docker://REFERENCE`, credentials in the
    /// environment. `registry` is the reference's `host[:port]`. Apptainer takes a user name
    /// and a password only; a token is refused.
    pub fn pull(
        &self,
        reference: &str,
        registry: &str,
        auth: Option<&Credentials>,
        output: &Path,
    ) -> Result<Command> {
        let mut cmd = self.apptainer();
        cmd.arg("pull");
        if self.insecure_registries.iter().any(|r| r == registry) {
            cmd.arg("--no-https");
        }
        match auth {
            None => {}
            Some(Credentials::Basic { username, password }) => {
                cmd.env("APPTAINER_DOCKER_USERNAME", username).env("APPTAINER_DOCKER_PASSWORD", password);
            }
            Some(Credentials::RegistryToken(_) | Credentials::IdentityToken(_)) => {
                return Err(Error::Unsupported(
                    "the apptainer engine passes registry credentials as a user name and password \
                     only; a registry or identity token cannot be given to `apptainer pull`"
                        .into(),
                ));
            }
        }
        cmd.arg(output).arg(format!("docker://{reference}"));
        cmd.stdin(Stdio::null());
        Ok(cmd)
    }

    /// The instance name of sandbox `id` (Apptainer allows `[a-zA-Z0-9._-]+`).
    pub fn instance_name(id: &str) -> Result<String> {
        super::spec::check_id(id)?;
        Ok(format!("hpk-{}", &id[..id.len().min(32)]))
    }

    /// Writes the sandbox's root directory: mount points, an empty `/hpk-pause` to bind the
    /// binary over, and `/.singularity.d/startscript`, which execs it (a shell script, so its
    /// `argv[0]` is `/hpk-pause`, by which the runtime recognises the pause).
    pub fn write_sandbox_root(&self, root: &Path) -> Result<()> {
        for dir in ["proc", "dev", "sys", "tmp", "etc", "root", "run/hpk", "usr", ".singularity.d/env"] {
            mkdir(&root.join(dir))?;
        }
        for (link, target) in [("bin", "usr/bin"), ("sbin", "usr/sbin")] {
            symlink(target, &root.join(link))?;
        }
        for link in host_lib_links() {
            symlink(&format!("usr/{link}"), &root.join(link))?;
        }
        for dir in host_lib_dirs() {
            mkdir(&root.join(dir))?;
        }
        for file in ["etc/passwd", "etc/group", "etc/hosts", "etc/resolv.conf", "hpk-pause"] {
            let path = root.join(file);
            std::fs::write(&path, b"").map_err(|e| Error::io("create", path, e))?;
        }
        let script = root.join(".singularity.d/startscript");
        std::fs::write(&script, format!("#!/bin/sh\nexec {PAUSE_PATH} \"$@\"\n"))
            .map_err(|e| Error::io("write", &script, e))?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| Error::io("make executable", script, e))
    }

    /// `apptainer instance start …` of the sandbox root written by
    /// [`Self::write_sandbox_root`], hpk-pause's arguments after the instance name.
    pub fn instance_start(&self, spec: &SandboxSpec, root: &Path) -> Result<Command> {
        if spec.host_network || spec.host_ipc || !spec.sysctls.is_empty() {
            return Err(Error::Unsupported(
                "hostNetwork, hostIPC and sysctls are not supported by the apptainer engine".into(),
            ));
        }
        let name = Self::instance_name(&spec.id)?;
        let mut cmd = self.apptainer();
        cmd.args(["instance", "start", "--fakeroot", "--contain", "--net", "--network", "none"])
            .args(["--pid", "--ipc", "--uts", "--hostname", &spec.hostname, "--no-init"])
            .arg("--bind")
            .arg(bind_spec(&spec.pause_binary, PAUSE_PATH, true)?)
            .arg("--bind")
            .arg(bind_spec(&spec.events_dir, EVENTS_DIR, false)?)
            .arg("--bind")
            .arg(bind_spec(Path::new("/usr"), "/usr", true)?);
        for dir in host_lib_dirs() {
            cmd.arg("--bind").arg(bind_spec(&Path::new("/").join(dir), &format!("/{dir}"), true)?);
        }
        cmd.arg(root).arg(name).args([
            "--events",
            &format!("{EVENTS_DIR}/events.sock"),
            "--grace",
            &spec.grace_seconds.to_string(),
        ]);
        Ok(cmd)
    }

    /// `apptainer instance stop` of sandbox `id`.
    pub fn instance_stop(&self, id: &str, how: Stop) -> Result<Command> {
        let mut cmd = self.apptainer();
        cmd.args(["instance", "stop"]);
        match how {
            Stop::Term { timeout } => {
                cmd.args(["--signal", "SIGTERM", "--timeout", &timeout.to_string()]);
            }
            Stop::Kill => {
                cmd.arg("--force");
            }
        }
        cmd.arg(Self::instance_name(id)?);
        Ok(cmd)
    }

    /// `apptainer --version`: Apptainer runs (the runtime's readiness check).
    pub fn version(&self) -> Command {
        let mut cmd = self.apptainer();
        cmd.arg("--version");
        cmd
    }

    /// `apptainer instance list --json NAME`.
    pub fn instance_list(&self, id: &str) -> Result<Command> {
        let mut cmd = self.apptainer();
        cmd.args(["instance", "list", "--json"]).arg(Self::instance_name(id)?);
        Ok(cmd)
    }

    /// The sandbox's state: `None` without an instance; `running` with the pause's host PID
    /// while hpk-pause lives in it; `stopped` otherwise.
    pub fn sandbox_state(&self, id: &str) -> Result<Option<ContainerState>> {
        let out = run(&mut self.instance_list(id)?)?;
        let Some(pid) = parse_instance_pid(&out, &Self::instance_name(id)?)? else { return Ok(None) };
        Ok(Some(match find_pause(pid) {
            Some(pause) => ContainerState { status: "running".into(), pid: pause },
            None => ContainerState { status: "stopped".into(), pid: 0 },
        }))
    }

    /// The launcher of a container (see [`LAUNCHER`]): `nsenter` into the namespaces of the
    /// sandbox whose pause has host PID `pause_pid`, then `sh` backgrounding `apptainer exec`.
    /// Its standard streams are the container's; it exits once the container waits for
    /// start, having written its PID in the sandbox to [`ContainerLaunch::pid_file`].
    pub fn launch(&self, pause_pid: u32, c: &ContainerLaunch) -> Result<Command> {
        let mut cmd = self.command(&self.nsenter);
        cmd.arg("--target")
            .arg(pause_pid.to_string())
            .args(["--net", "--ipc", "--uts", "--pid", "--", "/bin/sh", "-c", LAUNCHER, "hpk-launch"])
            .arg(&c.start_fifo)
            .arg(&c.pid_file)
            .arg(&self.binary)
            .arg("exec");
        if c.fakeroot {
            cmd.arg("--fakeroot");
        }
        cmd.args(["--contain", "--cleanenv"]);
        if !c.readonly_rootfs {
            cmd.arg("--writable-tmpfs");
        }
        cmd.arg("--pwd").arg(&c.cwd);
        for (host, dest, readonly) in &c.mounts {
            cmd.arg("--bind").arg(bind_spec(host, dest, *readonly)?);
        }
        cmd.arg(&c.image).args(&c.args);
        for entry in &c.env {
            let (name, value) = entry.split_once('=').unwrap_or((entry.as_str(), ""));
            check_env_name(name)?;
            cmd.env(format!("APPTAINERENV_{name}"), value);
        }
        Ok(cmd)
    }

    /// A command run in a running container: `nsenter` into the user, mount, PID, network,
    /// IPC and UTS namespaces of its process `host_pid`, in its root and working directory,
    /// with `env` (its environment) and nothing of the runtime's. As root of the container's
    /// user namespace when it runs with `--fakeroot`, else as the runtime's user, as the
    /// container does. Not started; stdin null, stdout and stderr piped; it leads a new
    /// process group (a timeout kills nsenter and the command together) and is killed if
    /// dropped.
    pub fn exec(
        &self,
        host_pid: u32,
        fakeroot: bool,
        env: &[(OsString, OsString)],
        args: &[String],
    ) -> tokio::process::Command {
        let mut cmd = Command::new(&self.nsenter);
        cmd.env_clear().envs(env.iter().map(|(k, v)| (k, v)));
        cmd.arg("--target").arg(host_pid.to_string());
        cmd.args(["--user", "--mount", "--pid", "--net", "--ipc", "--uts", "--root", "--wd"]);
        if fakeroot {
            cmd.args(["-S", "0", "-G", "0"]);
        } else {
            cmd.arg("--preserve-credentials");
        }
        cmd.arg("--").args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut cmd = tokio::process::Command::from(cmd);
        cmd.process_group(0).kill_on_drop(true);
        cmd
    }

    /// Brings up the loopback interface of the sandbox whose pause is `pause_pid`: `nsenter`
    /// into its user namespace (whose owner the runtime is, so it may) and network namespace.
    pub fn loopback_up(&self, pause_pid: u32) -> Command {
        let mut cmd = self.command(&self.nsenter);
        cmd.arg("--target")
            .arg(pause_pid.to_string())
            .args(["--user", "--net", "--", "ip", "link", "set", "lo", "up"]);
        cmd
    }
}

/// The PID of instance `name` in `apptainer instance list --json` output; `None` when it is
/// not listed.
pub fn parse_instance_pid(json: &[u8], name: &str) -> Result<Option<u32>> {
    #[derive(serde::Deserialize)]
    struct Listing {
        #[serde(default)]
        instances: Vec<Instance>,
    }
    #[derive(serde::Deserialize)]
    struct Instance {
        instance: String,
        pid: u32,
    }
    let listing: Listing = serde_json::from_slice(json)
        .map_err(|e| Error::Parse(format!("apptainer instance list --json: {e}")))?;
    Ok(listing.instances.into_iter().find(|i| i.instance == name).map(|i| i.pid))
}

/// `SRC:DST[:ro]` for `--bind`, refusing what that syntax cannot carry: `,` separates binds
/// and `:` separates fields, with no escape for either.
pub fn bind_spec(host: &Path, dest: &str, readonly: bool) -> Result<String> {
    let host_text = host.to_str().ok_or_else(|| {
        Error::Unsupported(format!(
            "bind source {} is not UTF-8; apptainer --bind cannot name it",
            host.display()
        ))
    })?;
    for (what, path) in [("source", host_text), ("destination", dest)] {
        if path.contains([',', ':']) {
            return Err(Error::Unsupported(format!(
                "bind {what} {path:?} contains ',' or ':', which apptainer's --bind syntax cannot express"
            )));
        }
        if path.is_empty() {
            return Err(Error::Unsupported(format!("bind {what} is empty")));
        }
    }
    Ok(if readonly { format!("{host_text}:{dest}:ro") } else { format!("{host_text}:{dest}") })
}

/// Refuses environment names Apptainer cannot pass: it sets `APPTAINERENV_` variables in the
/// container through a shell, which takes identifiers only (`[A-Za-z_][A-Za-z0-9_]*`).
pub fn check_env_name(name: &str) -> Result<()> {
    let mut bytes = name.bytes();
    let ok = bytes.next().is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(Error::Unsupported(format!(
            "environment variable name {name:?}: the apptainer engine passes only shell identifiers \
             (letters, digits and '_', not starting with a digit)"
        )))
    }
}

/// `lib`, `lib64` where the host has them as symlinks into `/usr` (merged /usr): the sandbox
/// root gets the same links.
fn host_lib_links() -> Vec<&'static str> {
    ["lib", "lib64"].into_iter().filter(|l| Path::new("/").join(l).is_symlink()).collect()
}

/// `lib`, `lib64` where the host has them as real directories: bound read-only.
fn host_lib_dirs() -> Vec<&'static str> {
    ["lib", "lib64"]
        .into_iter()
        .filter(|l| {
            let p = Path::new("/").join(l);
            p.is_dir() && !p.is_symlink()
        })
        .collect()
}

fn mkdir(path: &Path) -> Result<()> {
    std::fs::create_dir_all(path).map_err(|e| Error::io("create", path, e))
}

fn symlink(target: &str, link: &Path) -> Result<()> {
    if link.is_symlink() {
        return Ok(());
    }
    std::os::unix::fs::symlink(target, link).map_err(|e| Error::io("link", link, e))
}
