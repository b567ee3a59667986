//! HPK on a real Slurm: a Slurm cluster of test hosts (`hpk_integration::slurm`), a local
//! registry on its login address, and jobs of `slurm/hpk.slurm` submitted as the cluster's
//! unprivileged user. Dropping it cancels the jobs and waits until none of the user's
//! processes remain, before the Slurm cluster itself goes.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use hpk_integration::registry::{Registry, TestImages};
use hpk_integration::slurm::{ONE_ID_HIDDEN, SITE_HIDDEN, SlurmCluster, SlurmOptions};

use super::text;

/// The Slurm tests of one binary run one at a time: each starts clusters of several bubbles
/// on a 2-core machine.
pub static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// What the site gives the user, and so how many IDs each bubble maps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ids {
    /// No subordinate IDs and no newuidmap on the nodes: the user alone.
    One,
    /// `/etc/subuid` and `/etc/subgid` ranges and the setuid newuidmap pair.
    Several,
}

pub struct SlurmEnv {
    pub jobs: std::sync::Mutex<Vec<u32>>,
    pub ids: Ids,
    pub shell: String,
    pub owners: String,
    pub coredns: String,
    pub metrics_server: String,
    pub local_path: String,
    pub registry: Registry,
    pub image: PathBuf,
    /// The unpacked release bundle, in the user's home: jobs are submitted from there.
    pub bundle: PathBuf,
    pub kubectl: PathBuf,
    pub slurm: SlurmCluster,
}

/// The repository's `slurm/hpk.slurm`.
pub fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../slurm/hpk.slurm")
}

impl SlurmEnv {
    /// A site whose nodes map one ID.
    pub async fn start(nodes: usize) -> Self {
        Self::start_site(nodes, Ids::One).await
    }

    /// A Slurm cluster as a site's: the container tools hidden on the compute nodes (and
    /// newuidmap too with [`Ids::One`]), memory and GPUs as consumables, cgroup process
    /// tracking; the release bundle unpacked in the user's home.
    pub async fn start_site(nodes: usize, ids: Ids) -> Self {
        let mut hidden: Vec<String> = SITE_HIDDEN.iter().map(|t| (*t).to_owned()).collect();
        if ids == Ids::One {
            hidden.extend(ONE_ID_HIDDEN.iter().map(|t| (*t).to_owned()));
        }
        let options = SlurmOptions {
            nodes,
            hidden_tools: hidden,
            subordinate_ids: ids == Ids::Several,
            ..SlurmOptions::default()
        };
        let slurm = SlurmCluster::start(options).expect("slurm");
        let registry = Registry::start(IpAddr::V4(slurm.login_address()), None).await.expect("registry");
        let images = TestImages::push(&registry, true).await.expect("test images");
        let kubectl = hpk_integration::controlplane::bin_dir().expect("control plane").join("kubectl");
        let bundle = unpack_bundle(&slurm, &hpk_integration::release_bundle().expect("bundle"));
        Self {
            jobs: std::sync::Mutex::new(Vec::new()),
            ids,
            shell: images.shell,
            owners: images.owners,
            coredns: images.coredns.expect("coredns"),
            metrics_server: images.metrics_server.expect("metrics-server"),
            local_path: images.local_path_provisioner.expect("local-path-provisioner"),
            registry,
            image: super::image().expect("image"),
            bundle,
            kubectl,
            slurm,
        }
    }

    pub fn home(&self) -> PathBuf {
        self.slurm.user().home.clone()
    }

    pub fn uid(&self) -> u32 {
        self.slurm.user().uid
    }

    /// `sbatch SBATCH_ARGS slurm/hpk.slurm` from the unpacked release bundle, as a user does
    /// (no HPK_BIN, HPK_IMAGE or HPK_DEV), with the test's registry and CoreDNS image, as the
    /// user. Err: sbatch's refusal.
    pub fn submit(&self, sbatch_args: &[&str]) -> Result<u32, String> {
        self.submit_with(sbatch_args, &[])
    }

    /// [`Self::submit`] with more flags for `hpk slurm job`.
    pub fn submit_with(&self, sbatch_args: &[&str], hpk_args: &[&str]) -> Result<u32, String> {
        let mut cmd = self.slurm.command_as_user("sbatch");
        // The job's output where the other jobs' goes (sbatch writes it to the submit
        // directory, the bundle, by default).
        let output = format!("--output={}/slurm-%j.out", self.home().display());
        cmd.current_dir(&self.bundle).arg("--parsable").arg(output).args(sbatch_args).arg("slurm/hpk.slurm");
        self.job_flags(&mut cmd, hpk_args);
        self.sbatch(cmd)
    }

    /// The development path, as `make develop` users and the tests before the bundle ran it:
    /// the repository's script with `HPK_BIN` (the glibc debug build) and `HPK_IMAGE`.
    pub fn submit_dev(&self, sbatch_args: &[&str]) -> Result<u32, String> {
        let mut cmd = self.slurm.command_as_user("sbatch");
        cmd.arg("--parsable").args(sbatch_args).arg(script());
        self.job_flags(&mut cmd, &[]);
        cmd.env("HPK_BIN", env!("CARGO_BIN_EXE_hpk")).env("HPK_IMAGE", &self.image);
        self.sbatch(cmd)
    }

    fn job_flags(&self, cmd: &mut Command, hpk_args: &[&str]) {
        cmd.arg(format!("--insecure-registry={}", self.registry.host_port()))
            .arg(format!("--coredns-image={}", self.coredns))
            .arg(format!("--metrics-server-image={}", self.metrics_server))
            .arg(format!("--local-path-provisioner-image={}", self.local_path))
            .arg(format!("--local-path-helper-image={}", self.shell))
            .arg("--kubelet-arg=--disk-pressure-percent=1")
            .args(hpk_args)
            .env("RUST_LOG", "info")
            // The harness's GPUs (gres.conf) and fake driver, where a site has /dev and /.
            .env("HPK_NVIDIA_DEV_DIR", self.slurm.gpu_dev_dir())
            .env("HPK_NVIDIA_DRIVER_ROOT", self.slurm.gpu_driver_root());
    }

    fn sbatch(&self, mut cmd: Command) -> Result<u32, String> {
        let out = cmd.output().map_err(|e| format!("sbatch: {e}"))?;
        if !out.status.success() {
            return Err(text(&out));
        }
        // `--parsable` prints `ID` or `ID;CLUSTER`.
        let printed = String::from_utf8_lossy(&out.stdout).into_owned();
        let id: u32 = printed
            .trim()
            .split(';')
            .next()
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("sbatch printed {printed:?}"))?;
        self.jobs.lock().expect("lock").push(id);
        Ok(id)
    }

    /// Waits until the job's output says the cluster is up; returns the time since `since`.
    pub fn wait_up(&self, id: u32, since: Instant) -> Duration {
        let deadline = Instant::now() + Duration::from_secs(300);
        loop {
            let output = self.slurm.job_output(id);
            if output.contains("export KUBECONFIG=") {
                return since.elapsed();
            }
            let state = self.slurm.job(id).ok().flatten().map(|j| j.state).unwrap_or_default();
            assert!(
                state == "RUNNING" || state == "PENDING" || state == "CONFIGURING",
                "job {id} is {state} before the cluster came up:\n{output}\n{}",
                self.slurm.logs_tail()
            );
            assert!(Instant::now() < deadline, "job {id}: cluster not up in 300 s:\n{output}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The job's cluster files.
    pub fn cluster_dir(&self, id: u32) -> PathBuf {
        self.home().join(".hpk").join(id.to_string())
    }

    pub fn kubeconfig(&self, id: u32) -> PathBuf {
        self.cluster_dir(id).join("kubeconfig")
    }

    pub fn kubectl(&self, id: u32, args: &[&str]) -> Output {
        hpk_test_support::output_within(self.kubectl_cmd(id).args(args), super::KUBECTL_BOUND)
    }

    pub fn kubectl_cmd(&self, id: u32) -> Command {
        let mut cmd = Command::new(&self.kubectl);
        cmd.arg(format!("--kubeconfig={}", self.kubeconfig(id).display()));
        cmd
    }

    /// kubectl's stdout; panics with its stderr on failure.
    pub fn kubectl_ok(&self, id: u32, args: &[&str]) -> String {
        let out = self.kubectl(id, args);
        assert!(out.status.success(), "kubectl {args:?}: {}", text(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn apply(&self, id: u32, manifest: &str) {
        super::apply(self.kubectl_cmd(id), manifest);
    }

    /// Pods, events and the job's output, for failure messages.
    pub fn diagnose(&self, id: u32) -> String {
        let mut out = String::new();
        for args in [
            &["get", "pods", "-A", "-o", "wide"][..],
            &["describe", "pods"][..],
            &["get", "events", "-A"][..],
        ] {
            out.push_str(&text(&self.kubectl(id, args)));
        }
        let job = self.slurm.job_output(id);
        let lines: Vec<&str> = job.lines().collect();
        out.push_str(&format!(
            "--- job output (last 40 lines):\n{}\n",
            lines[lines.len().saturating_sub(40)..].join("\n")
        ));
        out
    }

    /// Pods of `selector` once `count` of them run: (name, node, ip).
    pub fn running(
        &self,
        id: u32,
        selector: &str,
        count: usize,
        within: Duration,
    ) -> Vec<(String, String, String)> {
        super::eventually_or(
            &format!("{count} pods {selector} Running"),
            within,
            || {
                let out = self.kubectl(
                    id,
                    &[
                        "get",
                        "pods",
                        "-l",
                        selector,
                        "-o",
                        "jsonpath={range .items[*]}{.metadata.name} {.spec.nodeName} {.status.podIP} {.status.phase} {.metadata.deletionTimestamp}{\"\\n\"}{end}",
                    ],
                );
                let rows: Vec<Vec<String>> = String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .map(|l| l.split_whitespace().map(str::to_owned).collect())
                    .collect();
                let running: Vec<(String, String, String)> = rows
                    .iter()
                    .filter(|r| r.len() == 4 && r[3] == "Running")
                    .map(|r| (r[0].clone(), r[1].clone(), r[2].clone()))
                    .collect();
                (running.len() == count && rows.len() == count).then_some(running)
            },
            || self.diagnose(id),
        )
    }

    /// The user's live processes, those running as its subordinate IDs included: (pid,
    /// command line).
    pub fn processes(&self) -> Vec<(u32, String)> {
        let user = self.slurm.user();
        std::fs::read_dir("/proc")
            .expect("/proc")
            .flatten()
            .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
            .filter_map(|pid| {
                let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
                let real =
                    status.lines().find(|l| l.starts_with("Uid:"))?.split_whitespace().nth(1)?.to_owned();
                let state = status.lines().find(|l| l.starts_with("State:"))?.to_owned();
                if !real.parse().is_ok_and(|r| user.owns(r))
                    || state.contains("zombie")
                    || state.contains("dead")
                {
                    return None;
                }
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                Some((pid, String::from_utf8_lossy(&cmdline).replace('\0', " ")))
            })
            .collect()
    }

    /// What of job `id` is still there: the user's processes (the job's: the user runs nothing
    /// else), sockets of the user on any node, the cluster's files, node directories and
    /// kubeconfig link. The image cache (`/tmp/hpk-<uid>/images`) is a cache, not the job's.
    pub fn leftovers(&self, id: u32) -> Vec<String> {
        let mut left: Vec<String> =
            self.processes().into_iter().map(|(p, c)| format!("process {p}: {c}")).collect();
        for node in self.slurm.nodes() {
            let ss = Command::new("nsenter")
                .arg(format!("--net=/run/netns/{}", node.netns))
                .args(["ss", "-Hanutep"])
                .output()
                .expect("ss");
            for line in String::from_utf8_lossy(&ss.stdout).lines() {
                let uid = line.split("uid:").nth(1).and_then(|r| r.split_whitespace().next());
                if uid.and_then(|u| u.parse().ok()).is_some_and(|u| self.slurm.user().owns(u)) {
                    left.push(format!("socket on {}: {line}", node.name));
                }
            }
        }
        left.extend(self.leftover_files(id));
        left
    }

    /// The files of job `id` still there: its cluster directory, node directories and
    /// kubeconfig link.
    pub fn leftover_files(&self, id: u32) -> Vec<String> {
        let mut left = Vec::new();
        let state = PathBuf::from(format!("/tmp/hpk-{}", self.uid()));
        let kubeconfig = self.home().join(format!(".hpk/{id}.kubeconfig"));
        for path in [self.cluster_dir(id), state.join(id.to_string()), kubeconfig] {
            if path.exists() {
                left.push(format!("{} exists", path.display()));
            }
        }
        let link = self.home().join(".hpk/kubeconfig");
        if std::fs::read_link(&link).is_ok_and(|t| t.starts_with(self.cluster_dir(id))) {
            left.push(format!("{} still points at the job's cluster", link.display()));
        }
        left
    }

    /// Waits (bounded) until nothing of job `id` is left; returns how long it took.
    pub fn wait_clean(&self, id: u32, within: Duration) -> Duration {
        let t0 = Instant::now();
        loop {
            let left = self.leftovers(id);
            if left.is_empty() {
                return t0.elapsed();
            }
            assert!(
                t0.elapsed() < within,
                "job {id}: still there after {within:?}: {left:#?}\n{}",
                self.slurm.job_output(id)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn cancel(&self, id: u32, extra: &[&str]) {
        self.slurm.scancel(id, extra).expect("scancel");
    }
}

/// The bundle unpacked into the user's home, by the user (as a user unpacks a release);
/// returns its directory (`hpk-<version>`).
fn unpack_bundle(slurm: &SlurmCluster, tarball: &Path) -> PathBuf {
    let home = slurm.user().home.clone();
    let out =
        slurm.command_as_user("tar").arg("-xzf").arg(tarball).arg("-C").arg(&home).output().expect("tar");
    assert!(out.status.success(), "unpacking {}: {}", tarball.display(), text(&out));
    let dir = home.join(format!("hpk-{}", env!("CARGO_PKG_VERSION")));
    assert!(
        dir.join("bin/hpk").is_file() && dir.join("slurm/hpk.slurm").is_file(),
        "{} lacks bin/hpk or slurm/",
        dir.display()
    );
    dir
}

impl Drop for SlurmEnv {
    fn drop(&mut self) {
        let jobs = std::mem::take(&mut *self.jobs.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
        for id in jobs {
            let _ = self.slurm.scancel(id, &[]);
        }
        let deadline = Instant::now() + Duration::from_secs(90);
        while !self.processes().is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(200));
        }
        for (pid, cmdline) in self.processes() {
            eprintln!("cleanup: killing {pid} ({cmdline})");
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let _ = std::fs::remove_dir_all(format!("/tmp/hpk-{}", self.uid()));
    }
}
