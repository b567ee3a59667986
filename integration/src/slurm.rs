//! A real Slurm cluster (Debian's slurm-wlm 22.05 and munge) on this machine: slurmctld and
//! munged on the "login node" (the root namespace, on the test bridge's address), one slurmd per
//! compute node in a test host's network namespace, and an unprivileged user of its own who
//! submits the jobs. All nodes share the filesystem, as an NFS /home would.
//!
//! Pitfalls it handles (measured, see the project's notes on Slurm in namespaces):
//!
//! 1. `ip netns exec` remounts /sys and slurmd then finds no cgroup filesystem: slurmd starts
//!    under `nsenter --net=/run/netns/<ns>`, which switches only the network.
//! 2. slurmctld refuses to run unless its hostname is `SlurmctldHost`: it runs under
//!    `unshare --uts` with hostname `ctl`, and `SlurmctldHost=ctl(<bridge address>)`.
//! 3. Every slurmd would report the machine's hostname: each gets a UTS namespace with its
//!    node's name (`slurmd -N nodeN`), so `hostname` in a job step says where it runs.
//! 4. No systemd starts munge: munged runs as a child of the harness with a key, socket, log and
//!    seed of this cluster (`AuthInfo=socket=`), so clusters do not share credentials.
//! 5. Node names resolve only where /etc/hosts says so: slurmctld and each slurmd see a private
//!    hosts file (`ctl`, `node1`…), bind-mounted in a mount namespace of their own
//!    (`unshare --mount --propagation slave`), which the job steps inherit.
//! 6. `SchedulerParameters=batch_sched_delay=0`, or batch jobs wait up to 3 s to start.
//! 7. The nodes claim `cpus_per_node` CPUs, more than the machine may have: slurmd would
//!    drain them unless `SlurmdParameters=config_overrides`.
//! 8. `proctrack/linuxproc` (no cgroups) loses processes that leave the job's process tree, and
//!    slurmstepd outlives a stopped slurmd: teardown stops whatever still runs in a node's
//!    network namespace or as the cluster's user (and its subordinate UIDs), by PID.
//! 9. Orphans linger as zombies on minimal init systems: a process counts as gone when it is a
//!    zombie ([`crate::process::is_running`]).
//! 10. slurmctld's main scheduler first runs about 3 s after it starts, and no job starts
//!     before that; later cycles follow a submission within a second. `start` returns once
//!     `sdiag` counts a first cycle, so the first job is as quick as the rest.
//!
//! slurmctld listens on every address of the root namespace (Slurm has no setting to bind it to
//! one); its port, and slurmd's, are picked free per cluster, so clusters can run side by side.
//! The user's jobs run programs by absolute path: they must be readable by the user, so not
//! under a 0700 directory such as /root. The user's home is inside the cluster's directory
//! under the system temp dir (0755 down to the home, which is 0700).

mod conf;
mod daemons;
mod job;
mod user;

use std::net::Ipv4Addr;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

pub use job::{JobInfo, NodeAllocation, expand_hostlist, parse_allocation};
pub use user::SlurmUser;

use crate::netns::{TestNetwork, ip, run};
use crate::process::Process;
use crate::{Error, Result};
use daemons::{free_ports, in_own_host, root_command, start_munged, wait_for};

/// The PATH the user's commands and jobs get (sbatch passes the submitter's environment on).
pub const USER_PATH: &str = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin";
const PARTITION: &str = "batch";
const START_TIMEOUT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(50);
const JOB_POLL: Duration = Duration::from_millis(150);
const LOG_TAIL_LINES: usize = 20;

/// The shape of the cluster.
#[derive(Clone, Debug)]
pub struct SlurmOptions {
    /// Compute nodes, named `node1`…`nodeN`.
    pub nodes: usize,
    /// CPUs each node offers (independent of the machine's), so 1-CPU jobs can share a node.
    pub cpus_per_node: u32,
    /// Memory each node offers (`RealMemory`, MB): memory is a consumable, and a job that asks
    /// for none gets `DefMemPerCPU` (2048 MB: a controller bubble's control plane needs about
    /// 1 GB) per CPU. Confined by `task/cgroup` when [`Self::cgroups`].
    pub memory_mb_per_node: u32,
    /// GPUs each node offers as GRES `gpu`: character devices (195, N) the harness makes.
    pub gpus_per_node: u32,
    /// Process tracking and task confinement by cgroup (`proctrack/cgroup`, `task/cgroup`
    /// with memory and devices constrained), each node in a cgroup of its own; else
    /// `proctrack/linuxproc` and `task/none`.
    pub cgroups: bool,
    /// Programs job steps on the compute nodes must not find (an empty, non-executable file is
    /// bound over each in every node's mount namespace), as a site's nodes lack them:
    /// [`SITE_HIDDEN`], [`ONE_ID_HIDDEN`].
    pub hidden_tools: Vec<String>,
    /// Give the user subordinate ID ranges (`/etc/subuid`, `/etc/subgid`), for rootless
    /// containers with several IDs.
    pub subordinate_ids: bool,
    /// Seconds between SIGTERM and SIGKILL when a job is cancelled or times out (`KillWait`).
    pub kill_wait_secs: u32,
}

impl Default for SlurmOptions {
    fn default() -> Self {
        Self {
            nodes: 3,
            cpus_per_node: 4,
            memory_mb_per_node: 8192,
            gpus_per_node: 2,
            cgroups: true,
            hidden_tools: Vec::new(),
            subordinate_ids: false,
            kill_wait_secs: 30,
        }
    }
}

/// What a typical compute node lacks: the rootless container tools (sites have Apptainer).
pub const SITE_HIDDEN: &[&str] = &["crun", "runc", "slirp4netns", "pasta", "nsenter", "unshare"];
/// What a node without subordinate IDs lacks besides.
pub const ONE_ID_HIDDEN: &[&str] = &["newuidmap", "newgidmap"];

/// One compute node.
#[derive(Clone, Debug)]
pub struct SlurmNode {
    /// Its node name and hostname (`node1`…).
    pub name: String,
    /// Its address on the test network.
    pub ip: Ipv4Addr,
    /// Its network namespace (under /run/netns).
    pub netns: String,
    /// Its slurmd's PID; the node's UTS and mount namespaces are that process's.
    pub slurmd_pid: u32,
}

/// A running Slurm cluster. Dropping it stops every daemon and job process, removes the test
/// network, the user and every file, also while a test panics.
pub struct SlurmCluster {
    // Field order is teardown order after `drop` has stopped the daemons.
    slurmds: Vec<Process>,
    slurmctld: Process,
    munged: Process,
    nodes: Vec<SlurmNode>,
    cgroups: Vec<PathBuf>,
    user: SlurmUser,
    network: TestNetwork,
    conf: PathBuf,
    log_dir: PathBuf,
    dir: tempfile::TempDir,
}

/// The names of the users the harness makes start with this.
const USER_PREFIX: &str = "hpke2e";
/// The harness's directories in the temp dir start with this.
const DIR_PREFIX: &str = "hpk-slurm-";

/// Removes what killed runs left (used by `hpk-testcluster sweep`, after the test namespaces
/// went): processes naming a harness directory (slurmctld, munged), the `hpke2e…` users with
/// their processes, homes and HPK state (`/tmp/hpk-<uid>`), the nodes' cgroups, and the
/// directories. Only while no test or demo runs.
pub fn sweep() -> Result<Vec<String>> {
    let mut removed = Vec::new();
    let tmp = std::env::temp_dir();
    let dirs = tmp.join(DIR_PREFIX).display().to_string();
    for entry in std::fs::read_dir("/proc").map_err(|e| Error::io("list", "/proc", e))?.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|p| p.parse::<i32>().ok()) else { continue };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(&dirs) {
            crate::process::stop_pid(pid);
            removed.push(format!("process {pid}: {cmdline}"));
        }
    }
    for user in SlurmUser::leftovers() {
        removed.push(format!("user {} (uid {}, home {})", user.name, user.uid, user.home.display()));
        let state = tmp.join(format!("hpk-{}", user.uid));
        drop(user);
        if state.exists() {
            std::fs::remove_dir_all(&state).map_err(|e| Error::io("remove", state.display(), e))?;
            removed.push(state.display().to_string());
        }
    }
    // The nodes' cgroups (`hpkt-<id>-<node>` in each controller Slurm used), emptied by now.
    for controller in SLURM_CONTROLLERS {
        let root = Path::new("/sys/fs/cgroup").join(controller);
        for entry in std::fs::read_dir(&root).into_iter().flatten().flatten() {
            if entry.file_name().to_string_lossy().starts_with("hpkt-") {
                remove_cgroup(&entry.path());
                removed.push(entry.path().display().to_string());
            }
        }
    }
    for entry in std::fs::read_dir(&tmp).map_err(|e| Error::io("list", tmp.display(), e))?.flatten() {
        if entry.file_name().to_string_lossy().starts_with(DIR_PREFIX) && entry.path().is_dir() {
            std::fs::remove_dir_all(entry.path())
                .map_err(|e| Error::io("remove", entry.path().display(), e))?;
            removed.push(entry.path().display().to_string());
        }
    }
    Ok(removed)
}

impl SlurmCluster {
    /// Starts munged, slurmctld and one slurmd per node, and waits until every node is idle.
    pub fn start(opts: SlurmOptions) -> Result<Self> {
        let started = Instant::now();
        let slurm = nix::unistd::User::from_name("slurm").ok().flatten().ok_or_else(|| Error::Missing {
            what: "the slurm user".into(),
            hint: "install Debian's slurm-wlm package (scripts/setup.sh)".into(),
        })?;
        let dir = tempfile::Builder::new()
            .prefix(DIR_PREFIX)
            .tempdir()
            .map_err(|e| Error::io("create", "temp dir", e))?;
        let d = dir.path().to_owned();
        // slurmctld (as `slurm`) and the user must reach their files below it.
        set_mode(&d, 0o755)?;
        let names: Vec<String> = (1..=opts.nodes).map(|i| format!("node{i}")).collect();
        let name_refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let network = TestNetwork::create(&name_refs)?;
        let user = SlurmUser::create(
            &format!("{USER_PREFIX}{}", network.id()),
            &d.join("home"),
            opts.subordinate_ids,
        )?;

        let (munge_dir, state_dir, spool_dir, log_dir) =
            (d.join("munge"), d.join("state"), d.join("spool"), d.join("log"));
        for sub in [&munge_dir, &state_dir, &log_dir] {
            std::fs::create_dir(sub).map_err(|e| Error::io("create", sub.display(), e))?;
        }
        for name in &names {
            let node_spool = spool_dir.join(name);
            std::fs::create_dir_all(&node_spool).map_err(|e| Error::io("create", node_spool.display(), e))?;
        }
        for owned_by_slurm in [&state_dir, &log_dir] {
            std::os::unix::fs::chown(owned_by_slurm, Some(slurm.uid.as_raw()), Some(slurm.gid.as_raw()))
                .map_err(|e| Error::io("chown slurm", owned_by_slurm.display(), e))?;
        }
        let munged = start_munged(&munge_dir, &log_dir)?;

        let nodes_ips: Vec<(String, Ipv4Addr)> =
            network.hosts().iter().map(|h| (h.name.clone(), h.ip)).collect();
        let [ctl_port, slurmd_port] = free_ports(network.gateway())?;
        let conf = d.join("slurm.conf");
        let conf_text = conf::slurm_conf(&conf::ConfParams {
            cluster_name: &user.name,
            ctl_ip: network.gateway(),
            ctl_port,
            slurmd_port,
            munge_socket: &munge_dir.join("munge.socket"),
            state_dir: &state_dir,
            spool_dir: &spool_dir,
            log_dir: &log_dir,
            nodes: &nodes_ips,
            cpus_per_node: opts.cpus_per_node,
            memory_mb_per_node: opts.memory_mb_per_node,
            gpus_per_node: opts.gpus_per_node,
            cgroups: opts.cgroups,
            kill_wait_secs: opts.kill_wait_secs,
            partition: PARTITION,
        });
        write_file(&conf, &conf_text)?;
        // Slurm reads gres.conf and cgroup.conf beside slurm.conf.
        write_file(&d.join("gres.conf"), &conf::gres_conf(&make_gpus(&d.join("dev"), opts.gpus_per_node)?))?;
        make_driver(&d.join("driver"))?;
        write_file(&d.join("cgroup.conf"), &conf::cgroup_conf())?;
        let hosts = d.join("hosts");
        write_file(&hosts, &conf::hosts_file(network.gateway(), &nodes_ips))?;
        let etc_hosts = (hosts.clone(), PathBuf::from("/etc/hosts"));
        let hidden = hidden_paths(&opts.hidden_tools);
        let empty = d.join("hidden-tool");
        write_file(&empty, "")?;
        set_mode(&empty, 0o644)?;

        let mut cmd =
            in_own_host(conf::CTL_HOSTNAME, std::slice::from_ref(&etc_hosts), Command::new("unshare"));
        cmd.args(["slurmctld", "-D", "-f"]).arg(&conf);
        let mut slurmctld = Process::spawn("slurmctld", cmd, &log_dir.join("slurmctld.out"))?;
        wait_for("slurmctld", START_TIMEOUT, &mut [&mut slurmctld], || {
            Ok(root_command(&conf, "scontrol").arg("ping").output().is_ok_and(|o| o.status.success()))
        })
        .map_err(|e| with_logs(e, logs_tail(&log_dir, &["slurmctld.log".into(), "munged.log".into()])))?;

        let mut slurmds = Vec::new();
        let mut nodes = Vec::new();
        let mut cgroups = Vec::new();
        for host in network.hosts() {
            let mut binds = vec![etc_hosts.clone()];
            binds.extend(hidden.iter().map(|p| (empty.clone(), p.clone())));
            if opts.cgroups {
                // Each node's cgroups in a tree of its own, seen as the hierarchy's root there:
                // the slurmds of one machine would otherwise share slurm/uid_N/job_M/step_0.
                for (own, root) in node_cgroups(&format!("{}-{}", network.id(), host.name))? {
                    cgroups.push(own.clone());
                    binds.push((own, root));
                }
            }
            let mut nsenter = Command::new("nsenter");
            nsenter.arg(format!("--net=/run/netns/{}", host.netns)).arg("unshare");
            let mut cmd = in_own_host(&host.name, &binds, nsenter);
            cmd.args(["slurmd", "-D", "-f"]).arg(&conf).args(["-N", &host.name]);
            let slurmd = Process::spawn(
                &format!("slurmd {}", host.name),
                cmd,
                &log_dir.join(format!("slurmd-{}.out", host.name)),
            )?;
            nodes.push(SlurmNode {
                name: host.name.clone(),
                ip: host.ip,
                netns: host.netns.clone(),
                slurmd_pid: slurmd.pid(),
            });
            slurmds.push(slurmd);
        }
        let mut cluster =
            Self { slurmds, slurmctld, munged, nodes, cgroups, user, network, conf, log_dir, dir };
        cluster.wait_ready()?;
        tracing::info!(nodes = opts.nodes, elapsed = ?started.elapsed(), "slurm cluster up");
        Ok(cluster)
    }

    /// Waits until every node is idle and slurmctld's main scheduler has run once: its first
    /// cycle comes about 3 s after slurmctld starts, and no job starts before it, whereas
    /// later cycles follow each submission within a second (`batch_sched_delay=0`).
    fn wait_ready(&mut self) -> Result<()> {
        let conf = self.conf.clone();
        let expected = self.nodes.len();
        let mut daemons: Vec<&mut Process> = self.slurmds.iter_mut().collect();
        daemons.push(&mut self.slurmctld);
        daemons.push(&mut self.munged);
        let nodes_idle = || -> Result<bool> {
            let out = run(root_command(&conf, "sinfo").args(["--noheader", "--Node", "--format=%N %T"]))?;
            Ok(out.lines().filter(|l| l.split_whitespace().nth(1) == Some("idle")).count() == expected)
        };
        let scheduler_ran = || -> Result<bool> {
            // The first "Total cycles" is the main scheduler's, the second the backfill's.
            let out = run(&mut root_command(&conf, "sdiag"))?;
            let cycles = out.lines().find_map(|l| l.trim().strip_prefix("Total cycles:"));
            Ok(cycles.and_then(|c| c.trim().parse::<u64>().ok()).is_some_and(|c| c > 0))
        };
        let result =
            wait_for("all nodes idle and a first scheduling cycle", START_TIMEOUT, &mut daemons, || {
                Ok(nodes_idle()? && scheduler_ran()?)
            });
        result.map_err(|e| with_logs(e, self.logs_tail()))
    }

    /// The cluster's user, who submits the jobs.
    pub fn user(&self) -> &SlurmUser {
        &self.user
    }

    /// The compute nodes, `node1` first.
    pub fn nodes(&self) -> &[SlurmNode] {
        &self.nodes
    }

    /// The login node's address (the bridge's, in the root namespace), where slurmctld listens.
    pub fn login_address(&self) -> Ipv4Addr {
        self.network.gateway()
    }

    /// The default partition, over all nodes.
    pub fn partition(&self) -> &str {
        PARTITION
    }

    /// The cluster's slurm.conf (what `SLURM_CONF` names).
    pub fn conf(&self) -> &Path {
        &self.conf
    }

    /// Where the GPUs of gres.conf are (`nvidiaN`, character devices 195:N): a node's
    /// `HPK_NVIDIA_DEV_DIR`.
    pub fn gpu_dev_dir(&self) -> PathBuf {
        self.conf.parent().unwrap_or(Path::new("/")).join("dev")
    }

    /// A fake NVIDIA driver's root (`libnvidia-ml.so.1`, `nvidia-smi`): a node's
    /// `HPK_NVIDIA_DRIVER_ROOT`.
    pub fn gpu_driver_root(&self) -> PathBuf {
        self.conf.parent().unwrap_or(Path::new("/")).join("driver")
    }

    /// The cluster's directory (config, state, spool, logs, the user's home).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The PIDs of munged, slurmctld and the slurmds, named.
    pub fn pids(&self) -> Vec<(String, u32)> {
        let daemons = [&self.munged, &self.slurmctld].into_iter().chain(&self.slurmds);
        daemons.map(|p| (p.name().to_owned(), p.pid())).collect()
    }

    /// The test network the nodes are on.
    pub fn network(&self) -> &TestNetwork {
        &self.network
    }

    /// A command run as the user on the login node, in its home, with `HOME`, `USER`, `PATH`
    /// ([`USER_PATH`]) and `SLURM_CONF` and nothing else from our environment.
    pub fn command_as_user(&self, program: &str) -> Command {
        let mut cmd = Command::new(program);
        cmd.uid(self.user.uid)
            .gid(self.user.gid)
            .current_dir(&self.user.home)
            .env_clear()
            .env("HOME", &self.user.home)
            .env("USER", &self.user.name)
            .env("LOGNAME", &self.user.name)
            .env("SHELL", "/bin/bash")
            .env("PATH", USER_PATH)
            .env("SLURM_CONF", &self.conf);
        cmd
    }

    /// Submits `script` as the user with `sbatch ARGS`; returns the job ID.
    pub fn sbatch(&self, args: &[&str], script: &Path) -> Result<u32> {
        self.sbatch_env(args, script, &[])
    }

    /// [`Self::sbatch`] with `env` added to the environment the job inherits.
    pub fn sbatch_env(&self, args: &[&str], script: &Path, env: &[(&str, &str)]) -> Result<u32> {
        let mut cmd = self.command_as_user("sbatch");
        cmd.arg("--parsable").args(args).arg(script).envs(env.iter().copied());
        let out = run(&mut cmd)?;
        // `--parsable` prints `ID` or `ID;CLUSTER`.
        let id = out.trim().split(';').next().and_then(|id| id.parse().ok());
        id.ok_or_else(|| Error::Unexpected { command: format!("{cmd:?}"), output: out })
    }

    /// What slurmctld knows of job `id`; `None` once it has forgotten the job (`MinJobAge`,
    /// 300 s after it ended) or never had it.
    pub fn job(&self, id: u32) -> Result<Option<JobInfo>> {
        let mut cmd = root_command(&self.conf, "scontrol");
        cmd.args(["show", "job", "--oneliner", &id.to_string()]);
        match run(&mut cmd) {
            Ok(out) => JobInfo::parse(out.trim())
                .map(Some)
                .ok_or_else(|| Error::Unexpected { command: format!("{cmd:?}"), output: out }),
            Err(Error::Command { stderr, .. }) if stderr.contains("Invalid job id") => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Polls job `id` until its state is one of `states`; fails after `timeout` (or if Slurm
    /// does not know the job) with the last state seen and the daemons' log tails.
    pub fn wait_job_state(&self, id: u32, states: &[&str], timeout: Duration) -> Result<JobInfo> {
        let deadline = Instant::now() + timeout;
        loop {
            let job = self.job(id)?;
            match &job {
                Some(job) if states.contains(&job.state.as_str()) => return Ok(job.clone()),
                Some(_) if Instant::now() < deadline => std::thread::sleep(JOB_POLL),
                _ => {
                    return Err(Error::NotReady {
                        what: format!("job {id} in state {states:?}"),
                        seconds: timeout.as_secs(),
                        detail: format!("last seen: {job:?}\n{}", self.logs_tail()),
                    });
                }
            }
        }
    }

    /// What running job `id` holds on each node (`scontrol show job -d`).
    pub fn allocation(&self, id: u32) -> Result<Vec<NodeAllocation>> {
        let out = run(root_command(&self.conf, "scontrol").args(["show", "job", "-d", &id.to_string()]))?;
        Ok(parse_allocation(&out))
    }

    /// `scancel EXTRA ID` as the user.
    pub fn scancel(&self, id: u32, extra: &[&str]) -> Result<()> {
        run(self.command_as_user("scancel").args(extra).arg(id.to_string())).map(drop)
    }

    /// `scontrol ARGS` as root (e.g. `update JobId=7 TimeLimit=1`); returns its output.
    pub fn scontrol(&self, args: &[&str]) -> Result<String> {
        run(root_command(&self.conf, "scontrol").args(args))
    }

    /// A root command inside node `i`'s network, UTS and mount namespaces (`nodes()[i]`).
    ///
    /// # Panics
    ///
    /// If `i` is not the index of a node.
    pub fn on_node(&self, i: usize, program: &str) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.args(["-t", &self.nodes[i].slurmd_pid.to_string(), "--net", "--uts", "--mount", "--", program]);
        cmd
    }

    /// Makes /dev/net/tun unusable for the user on node `i` only: a root-owned 0600 device
    /// node (10,200) is bind-mounted over it in the node's mount namespace, which job steps
    /// started there from now on see.
    pub fn deny_tun(&self, i: usize) -> Result<()> {
        let node = self.nodes.get(i).ok_or_else(|| Error::NotFound {
            what: format!("node index {i}"),
            hint: format!("the cluster has {} nodes", self.nodes.len()),
        })?;
        let denied = self.dir.path().join("tun-denied");
        if !denied.exists() {
            let mode = nix::sys::stat::Mode::from_bits_truncate(0o600);
            let dev = nix::sys::stat::makedev(10, 200);
            nix::sys::stat::mknod(&denied, nix::sys::stat::SFlag::S_IFCHR, mode, dev)
                .map_err(|e| Error::io("mknod", denied.display(), e.into()))?;
        }
        let mut cmd = Command::new("nsenter");
        cmd.args(["-t", &node.slurmd_pid.to_string(), "--mount", "--", "mount", "--bind"])
            .arg(&denied)
            .arg("/dev/net/tun");
        run(&mut cmd).map(drop)
    }

    /// Writes an executable `name` (mode 0755, owned by the user) into the user's home, for
    /// [`Self::sbatch`]; returns its path.
    pub fn write_script(&self, name: &str, body: &str) -> Result<PathBuf> {
        let path = self.user.home.join(name);
        write_file(&path, body)?;
        std::os::unix::fs::chown(&path, Some(self.user.uid), Some(self.user.gid))
            .map_err(|e| Error::io("chown", path.display(), e))?;
        set_mode(&path, 0o755)?;
        Ok(path)
    }

    /// The job's output file (`slurm-<id>.out` in the user's home, sbatch's default), or "".
    pub fn job_output(&self, id: u32) -> String {
        std::fs::read_to_string(self.user.home.join(format!("slurm-{id}.out"))).unwrap_or_default()
    }

    /// The last lines of slurmctld's, each slurmd's and munged's logs, for error messages.
    pub fn logs_tail(&self) -> String {
        let mut names = vec!["slurmctld.log".to_owned(), "slurmctld.out".to_owned(), "munged.log".to_owned()];
        for node in &self.nodes {
            names.push(format!("slurmd-{}.log", node.name));
            names.push(format!("slurmd-{}.out", node.name));
        }
        logs_tail(&self.log_dir, &names)
    }
}

impl Drop for SlurmCluster {
    fn drop(&mut self) {
        for slurmd in self.slurmds.iter_mut().rev() {
            slurmd.stop();
        }
        // slurmstepd and the job processes it started outlive slurmd (pitfall 8).
        let mut left = Vec::new();
        for node in &self.nodes {
            let pids = ip(&["netns", "pids", &node.netns]).unwrap_or_default();
            left.extend(pids.split_whitespace().filter_map(|p| p.parse::<i32>().ok()));
        }
        crate::process::stop_pids(&left, Duration::from_secs(5));
        self.slurmctld.stop();
        self.munged.stop();
        for cgroup in &self.cgroups {
            remove_cgroup(cgroup);
        }
        // Then the fields: the user (and its remaining processes), the network, the directory.
    }
}

/// Adds the daemons' log tails to a readiness error: a daemon's own output (what
/// `Process::check_alive` shows) says little, its log file says why.
fn with_logs(e: Error, logs: String) -> Error {
    match e {
        Error::NotReady { what, seconds, detail } => {
            Error::NotReady { what, seconds, detail: format!("{detail}\n{logs}") }
        }
        Error::Exited { component, status, log, tail } => {
            Error::Exited { component, status, log, tail: format!("{tail}\n{logs}") }
        }
        other => other,
    }
}

fn logs_tail(dir: &Path, names: &[String]) -> String {
    let mut out = String::new();
    for name in names {
        let text = std::fs::read_to_string(dir.join(name)).unwrap_or_default();
        if text.trim().is_empty() {
            continue;
        }
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n");
        out.push_str(&format!("==> {name} <==\n{tail}\n"));
    }
    out
}

/// A fake NVIDIA driver root for the GPUs of [`make_gpus`]: `libnvidia-ml.so.1` (a link to
/// a versioned file holding `fake NVML`) and an `nvidia-smi` script that prints it.
fn make_driver(root: &Path) -> Result<()> {
    let lib = root.join("usr/lib/x86_64-linux-gnu");
    let bin = root.join("usr/bin");
    for dir in [&lib, &bin] {
        std::fs::create_dir_all(dir).map_err(|e| Error::io("create", dir.display(), e))?;
    }
    write_file(&lib.join("libnvidia-ml.so.550.54.15"), "fake NVML\n")?;
    let link = lib.join("libnvidia-ml.so.1");
    std::os::unix::fs::symlink("libnvidia-ml.so.550.54.15", &link)
        .map_err(|e| Error::io("link", link.display(), e))?;
    let smi = bin.join("nvidia-smi");
    write_file(
        &smi,
        "#!/bin/sh\necho \"fake nvidia-smi: $(cat /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1)\"\n",
    )?;
    std::fs::set_permissions(&smi, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .map_err(|e| Error::io("chmod", smi.display(), e))
}

/// `count` GPU device nodes (character devices 195, N, as NVIDIA's) in `dir`, for gres.conf.
fn make_gpus(dir: &Path, count: u32) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io("create", dir.display(), e))?;
    (0..count)
        .map(|i| {
            let path = dir.join(format!("nvidia{i}"));
            let mode = nix::sys::stat::Mode::from_bits_truncate(0o666);
            nix::sys::stat::mknod(
                &path,
                nix::sys::stat::SFlag::S_IFCHR,
                mode,
                nix::sys::stat::makedev(195, u64::from(i)),
            )
            .map_err(|e| Error::io("mknod", path.display(), e.into()))?;
            Ok(path)
        })
        .collect()
}

/// Every path under [`USER_PATH`]'s directories where one of `tools` is found (resolved, once).
fn hidden_paths(tools: &[String]) -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = USER_PATH
        .split(':')
        .flat_map(|dir| tools.iter().map(move |t| Path::new(dir).join(t)))
        .filter_map(|p| p.canonicalize().ok())
        .collect();
    paths.sort();
    paths.dedup();
    paths
}

/// The cgroup v1 controllers Slurm's cgroup plugins use here: the freezer (process tracking),
/// memory and devices (task confinement).
const SLURM_CONTROLLERS: [&str; 3] = ["freezer", "memory", "devices"];

/// A cgroup of its own in each controller for node `name` (`hpkt-<name>`), with the root each
/// is bound over in the node's mount namespace.
fn node_cgroups(name: &str) -> Result<Vec<(PathBuf, PathBuf)>> {
    let mut made = Vec::new();
    for controller in SLURM_CONTROLLERS {
        let root = Path::new("/sys/fs/cgroup").join(controller);
        if !root.join("tasks").exists() {
            return Err(Error::Missing {
                what: format!("the cgroup v1 {controller} controller at {}", root.display()),
                hint: "run on a host with cgroup v1 controllers, or set SlurmOptions::cgroups to false"
                    .into(),
            });
        }
        let own = root.join(format!("hpkt-{name}"));
        if !own.exists() {
            std::fs::create_dir(&own).map_err(|e| Error::io("create", own.display(), e))?;
        }
        made.push((own, root));
    }
    Ok(made)
}

/// Removes a cgroup and the ones Slurm made below it, deepest first (their processes are gone).
fn remove_cgroup(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup(&entry.path());
            }
        }
    }
    if let Err(e) = std::fs::remove_dir(dir) {
        tracing::warn!(cgroup = %dir.display(), error = %e, "could not remove a node's cgroup");
    }
}

fn write_file(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(|e| Error::io("write", path.display(), e))
}

fn set_mode(path: &Path, mode: u32) -> Result<()> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| Error::io("chmod", path.display(), e))
}
