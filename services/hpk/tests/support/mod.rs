//! A test host (its own network namespace on a private bridge) running `hpk` with its own
//! `HPK_HOME` and `HPK_STATE_DIR`, beside a local registry holding the busybox test images.
//! Every cluster a test starts is taken down when the [`Env`] drops, also on a panic.

#![allow(dead_code, missing_docs)]

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use hpk_integration::netns::{Host, TestNetwork};
use hpk_integration::registry::{Registry, TestImages};

pub mod slurm;

/// The bubble image the tests run (`make images` builds it).
pub fn image() -> Option<PathBuf> {
    hpk_integration::bubble_image()
}

/// Whether the tools the tests use are present (else the test prints why and returns).
pub fn prerequisites() -> Option<PathBuf> {
    if !hpk_integration::tools_present(&[
        "crun",
        "slirp4netns",
        "docker-registry",
        "ip",
        "nsenter",
        "curl",
        "ss",
    ]) {
        return None;
    }
    hpk_integration::skip_unless_available(hpk_integration::clusterdns::coredns_binary())?;
    hpk_integration::skip_unless_available(hpk_integration::clusterdns::metrics_server_binary())?;
    hpk_integration::skip_unless_available(hpk_integration::clusterdns::local_path_provisioner_binary())?;
    image()
}

pub struct Env {
    pub clusters: std::sync::Mutex<Vec<String>>,
    /// CoreDNS, built from the static binary scripts/setup.sh makes, in the registry.
    pub coredns: String,
    /// metrics-server, built from the static binary scripts/setup.sh makes, in the registry.
    pub metrics_server: String,
    /// The local-path provisioner, likewise (its helper pods run `shell`).
    pub local_path: String,
    pub registry: Registry,
    pub shell: String,
    pub httpd: String,
    pub image: PathBuf,
    pub home: tempfile::TempDir,
    /// `$HOME` for `hpk` (bound into every bubble); the test's own when `None`.
    pub user_home: Option<PathBuf>,
    pub state: tempfile::TempDir,
    pub kubectl: PathBuf,
    pub host: Host,
    pub network: TestNetwork,
}

impl Env {
    pub async fn start(image: PathBuf) -> Self {
        // "attacker": another machine on the cluster network, for the attack tests.
        let network = TestNetwork::create(&["host", "attacker"]).expect("test network");
        let host = network.host("host").cloned().expect("host");
        let registry = Registry::start(IpAddr::V4(host.ip), Some(&host.netns)).await.expect("registry");
        let images = TestImages::push(&registry, true).await.expect("test images");
        let (shell, httpd, coredns) = (images.shell, images.httpd, images.coredns.expect("coredns"));
        let metrics_server = images.metrics_server.expect("metrics-server");
        let local_path = images.local_path_provisioner.expect("local-path-provisioner");
        let kubectl = hpk_integration::controlplane::bin_dir().expect("control plane").join("kubectl");
        Self {
            clusters: std::sync::Mutex::new(Vec::new()),
            coredns,
            metrics_server,
            local_path,
            registry,
            shell,
            httpd,
            image,
            home: tempfile::Builder::new().prefix("hpk-home-").tempdir().expect("tempdir"),
            user_home: None,
            state: tempfile::Builder::new().prefix("hpk-state-").tempdir().expect("tempdir"),
            kubectl,
            host,
            network,
        }
    }

    /// `hpk ARGS` on the test host, with this environment's directories and image.
    pub fn hpk(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("nsenter");
        // nsenter, not `ip netns exec`: that one mounts a fresh /sys without the cgroup
        // hierarchy crun binds into the bubble.
        cmd.arg(format!("--net=/run/netns/{}", self.host.netns))
            .arg("--")
            .arg(env!("CARGO_BIN_EXE_hpk"))
            .args(args)
            .env("HPK_HOME", self.home.path())
            .env("HPK_STATE_DIR", self.state.path())
            .env("HPK_IMAGE", &self.image);
        if let Some(home) = &self.user_home {
            cmd.env("HOME", home);
        }
        cmd
    }

    /// `hpk up --name NAME --nodes N` with the registry allowed; returns its output.
    pub fn up(&self, name: &str, nodes: u16) -> Output {
        self.up_command(name, nodes).output().expect("run hpk up")
    }

    /// [`Env::up`] started with a soft open-files limit of `soft`, as a job step often is.
    pub fn up_with_soft_nofile(&self, name: &str, nodes: u16, soft: u64) -> Output {
        let up = self.up_command(name, nodes);
        let mut cmd = Command::new("prlimit");
        cmd.arg(format!("--nofile={soft}:")).arg(up.get_program()).args(up.get_args());
        for (key, value) in up.get_envs() {
            if let Some(value) = value {
                cmd.env(key, value);
            }
        }
        cmd.output().expect("run hpk up")
    }

    /// The other machine on the network, for attacks.
    pub fn attacker(&self) -> &Host {
        self.network.host("attacker").expect("attacker host")
    }

    /// [`Env::up`] with more flags for `hpk up`.
    pub fn up_with(&self, name: &str, nodes: u16, extra: &[&str]) -> Output {
        let mut cmd = self.up_command(name, nodes);
        cmd.args(extra);
        cmd.output().expect("run hpk up")
    }

    pub fn up_command(&self, name: &str, nodes: u16) -> Command {
        self.clusters.lock().expect("lock").push(name.to_owned());
        let registry = format!("--insecure-registry={}", self.registry.host_port());
        let coredns = format!("--coredns-image={}", self.coredns);
        let metrics_server = format!("--metrics-server-image={}", self.metrics_server);
        let local_path = format!("--local-path-provisioner-image={}", self.local_path);
        let helper = format!("--local-path-helper-image={}", self.shell);
        let n = nodes.to_string();
        self.hpk(&[
            "up",
            "--name",
            name,
            "--nodes",
            &n,
            &registry,
            &coredns,
            &metrics_server,
            &local_path,
            &helper,
            "--kubelet-arg=--disk-pressure-percent=1",
        ])
    }

    pub fn kubeconfig(&self, name: &str) -> PathBuf {
        self.home.path().join(name).join("kubeconfig")
    }

    /// kubectl's output; a call still running after [`KUBECTL_BOUND`] fails the test.
    pub fn kubectl(&self, name: &str, args: &[&str]) -> Output {
        hpk_test_support::output_within(
            Command::new(&self.kubectl)
                .arg(format!("--kubeconfig={}", self.kubeconfig(name).display()))
                .args(args),
            KUBECTL_BOUND,
        )
    }

    /// kubectl's stdout; panics with stderr on failure.
    pub fn kubectl_ok(&self, name: &str, args: &[&str]) -> String {
        let out = self.kubectl(name, args);
        assert!(out.status.success(), "kubectl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn apply(&self, name: &str, manifest: &str) {
        let mut kubectl = Command::new(&self.kubectl);
        kubectl.arg(format!("--kubeconfig={}", self.kubeconfig(name).display()));
        apply(kubectl, manifest);
    }

    /// `kubectl describe pods` and the events, plus each node's kubelet and runtime log tail,
    /// for failure messages.
    pub fn diagnose(&self, name: &str) -> String {
        let mut out = String::new();
        for args in [&["describe", "pods"][..], &["get", "events", "-A"][..]] {
            out.push_str(&text(&self.kubectl(name, args)));
        }
        for node in std::fs::read_dir(self.state.path().join(name)).into_iter().flatten().flatten() {
            for log in ["hpk-kubelet.log", "hpk-pod-runtime.log", "hpk-net-forwarder.log", "bubble.log"] {
                let path = node.path().join("logs").join(log);
                let body = std::fs::read_to_string(&path).unwrap_or_default();
                let lines: Vec<&str> = body.lines().collect();
                out.push_str(&format!(
                    "--- {}:\n{}\n",
                    path.display(),
                    lines[lines.len().saturating_sub(15)..].join("\n")
                ));
            }
        }
        out
    }

    pub fn down(&self, name: &str) -> Output {
        let out = self.hpk(&["down", "--name", name]).output().expect("run hpk down");
        self.clusters.lock().expect("lock").retain(|c| c != name);
        out
    }

    /// Everything of cluster `name` a clean `down` must remove, as seen now.
    pub fn footprint(&self, name: &str) -> Footprint {
        self.footprint_in(self.state.path(), self.home.path(), name)
    }

    /// [`Self::footprint`] for a cluster with other state and home directories.
    pub fn footprint_in(&self, state_base: &Path, home_base: &Path, name: &str) -> Footprint {
        let state = state_base.join(name);
        let home = home_base.join(name);
        // The launchers and bubble-inits name the cluster; everything in a bubble (services,
        // pods) lives in the bubble's user namespace; slirp4netns names the bubble's PID.
        let needles = [state.display().to_string(), format!("--cluster={name}")];
        let all: Vec<(u32, String, Option<String>)> = std::fs::read_dir("/proc")
            .expect("/proc")
            .flatten()
            .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
            .map(|pid| {
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                let user =
                    std::fs::read_link(format!("/proc/{pid}/ns/user")).ok().map(|l| l.display().to_string());
                (pid, String::from_utf8_lossy(&cmdline).replace('\0', " "), user)
            })
            .collect();
        let own_user = std::fs::read_link("/proc/self/ns/user").ok().map(|l| l.display().to_string());
        let named: Vec<&(u32, String, Option<String>)> =
            all.iter().filter(|(_, c, _)| needles.iter().any(|n| c.contains(n.as_str()))).collect();
        let bubble_users: std::collections::BTreeSet<String> =
            named.iter().filter_map(|(_, _, u)| u.clone()).filter(|u| Some(u) != own_user.as_ref()).collect();
        let bubble_pids: Vec<u32> = named
            .iter()
            .filter(|(_, _, u)| u.as_ref().is_some_and(|u| bubble_users.contains(u)))
            .map(|(p, _, _)| *p)
            .collect();
        let mut pids = Vec::new();
        let mut namespaces = Vec::new();
        for (pid, cmdline, user) in &all {
            let ours = needles.iter().any(|n| cmdline.contains(n.as_str()))
                || user.as_ref().is_some_and(|u| bubble_users.contains(u))
                || bubble_pids.iter().any(|b| cmdline.contains(&format!("/proc/{b}/ns/")));
            if ours {
                pids.push(*pid);
                for ns in ["user", "net", "mnt"] {
                    if let Ok(link) = std::fs::read_link(format!("/proc/{pid}/ns/{ns}")) {
                        namespaces.push(link.display().to_string());
                    }
                }
            }
        }
        // The test's own namespaces are not the cluster's.
        for own in ["user", "net", "mnt"] {
            if let Ok(link) = std::fs::read_link(format!("/proc/self/ns/{own}")) {
                namespaces.retain(|n| *n != link.display().to_string());
            }
        }
        // Nor is the test host's network namespace, where the launchers run.
        if let Ok(host_ns) = std::fs::metadata(format!("/run/netns/{}", self.host.netns)) {
            use std::os::unix::fs::MetadataExt;
            namespaces.retain(|n| *n != format!("net:[{}]", host_ns.ino()));
        }
        namespaces.sort();
        namespaces.dedup();
        let mut ports = Vec::new();
        for record in std::fs::read_dir(home.join("nodes")).into_iter().flatten().flatten() {
            let text = std::fs::read_to_string(record.path()).unwrap_or_default();
            let value: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
            for pair in value["ports"].as_array().into_iter().flatten() {
                if let Some(port) = pair[1].as_u64() {
                    ports.push(port as u16);
                }
            }
        }
        let mounts: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(&state.display().to_string()) || l.contains(&home.display().to_string()))
            .map(str::to_owned)
            .collect();
        Footprint { pids, namespaces, ports, mounts, state, home, taken_at: uptime_ticks() }
    }

    /// What of `before` is still there: live processes, namespaces still held by any process,
    /// listening sockets on the recorded ports, mounts, files.
    pub fn leftovers(&self, before: &Footprint) -> Vec<String> {
        let mut left = Vec::new();
        for pid in &before.pids {
            // A process started after the footprint only took a freed PID: the tests beside
            // this one start processes all the time, and PIDs wrap.
            if start_ticks(&pid.to_string()).is_none_or(|t| t > before.taken_at) {
                continue;
            }
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let state =
                stat.rsplit_once(')').and_then(|(_, r)| r.split_whitespace().next().map(str::to_owned));
            if state.as_deref().is_some_and(|s| s != "Z" && s != "X") {
                left.push(format!("process {pid} alive: {stat}"));
            }
        }
        let mut held: std::collections::BTreeMap<String, Vec<String>> = std::collections::BTreeMap::new();
        for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
            if entry.file_name().to_string_lossy().parse::<u32>().is_err() {
                continue;
            }
            // A process started after the footprint holds a namespace made since: the kernel
            // reuses namespace inode numbers, so only older processes can be left-overs.
            if start_ticks(&entry.file_name().to_string_lossy()).is_none_or(|t| t > before.taken_at) {
                continue;
            }
            for ns in ["user", "net", "mnt"] {
                if let Ok(link) = std::fs::read_link(entry.path().join("ns").join(ns)) {
                    let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
                    let status = std::fs::read_to_string(entry.path().join("status")).unwrap_or_default();
                    let state = status.lines().find(|l| l.starts_with("State:")).unwrap_or("").to_owned();
                    held.entry(link.display().to_string()).or_default().push(format!(
                        "{} {} ({state})",
                        entry.file_name().to_string_lossy(),
                        String::from_utf8_lossy(&cmdline).replace('\0', " ")
                    ));
                }
            }
        }
        for ns in &before.namespaces {
            if let Some(holders) = held.get(ns) {
                left.push(format!("namespace {ns} still held by {holders:?}"));
            }
        }
        let ss = Command::new("ip")
            .args(["netns", "exec", &self.host.netns, "ss", "-Hlntu"])
            .output()
            .expect("ss");
        let listening = String::from_utf8_lossy(&ss.stdout).into_owned();
        for port in &before.ports {
            if listening
                .lines()
                .any(|l| l.split_whitespace().nth(4).is_some_and(|a| a.ends_with(&format!(":{port}"))))
            {
                left.push(format!("port {port} still bound"));
            }
        }
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        for path in [&before.state, &before.home] {
            if mountinfo.contains(&path.display().to_string()) {
                left.push(format!("mounts under {}", path.display()));
            }
            if path.exists() {
                left.push(format!("{} exists", path.display()));
            }
        }
        // The admin kubeconfig beside the cluster's directory.
        let mut kubeconfig = before.home.clone().into_os_string();
        kubeconfig.push(".kubeconfig");
        if Path::new(&kubeconfig).exists() {
            left.push(format!("{} exists", Path::new(&kubeconfig).display()));
        }
        left
    }
}

#[derive(Debug)]
pub struct Footprint {
    pub pids: Vec<u32>,
    pub namespaces: Vec<String>,
    pub ports: Vec<u16>,
    pub mounts: Vec<String>,
    pub state: PathBuf,
    pub home: PathBuf,
    /// When it was taken, in clock ticks since boot (as `/proc/PID/stat` counts start times).
    pub taken_at: u64,
}

/// Clock ticks since boot (USER_HZ = 100 on Linux).
fn uptime_ticks() -> u64 {
    let text = std::fs::read_to_string("/proc/uptime").unwrap_or_default();
    let seconds: f64 = text.split_whitespace().next().and_then(|v| v.parse().ok()).unwrap_or(0.0);
    (seconds * 100.0) as u64
}

/// A process's start time in clock ticks since boot.
fn start_ticks(pid: &str) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.split_whitespace().nth(19)?.parse().ok()
}

impl Drop for Env {
    fn drop(&mut self) {
        let clusters =
            std::mem::take(&mut *self.clusters.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
        for name in clusters {
            let out = self.hpk(&["down", "--name", &name]).output();
            if let Ok(out) = out
                && !out.status.success()
            {
                eprintln!("cleanup: hpk down --name {name}: {}", String::from_utf8_lossy(&out.stderr));
            }
        }
    }
}

/// Polls `check` every 100 ms until it returns Some, panicking after `within`.
pub fn eventually<T>(what: &str, within: Duration, check: impl FnMut() -> Option<T>) -> T {
    eventually_or(what, within, check, String::new)
}

/// [`eventually`], with `diagnose()` in the panic message.
pub fn eventually_or<T>(
    what: &str,
    within: Duration,
    mut check: impl FnMut() -> Option<T>,
    diagnose: impl Fn() -> String,
) -> T {
    hpk_test_support::eventually_blocking(what, within, &mut check, diagnose)
}

/// `KUBECTL apply -f -` with `manifest` on its stdin; panics with kubectl's output on failure.
pub fn apply(mut kubectl: Command, manifest: &str) {
    use std::io::Write;
    let mut child = kubectl
        .args(["apply", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl apply");
    child.stdin.take().expect("stdin").write_all(manifest.as_bytes()).expect("write");
    let out = child.wait_with_output().expect("wait");
    assert!(out.status.success(), "apply: {}", text(&out));
}

/// The longest a test's kubectl call may take (a `delete --wait` of a pod with its grace period
/// included): one that hangs fails its test with what it printed, never holds the lane.
pub const KUBECTL_BOUND: std::time::Duration = std::time::Duration::from_secs(180);

pub fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// (pid, cmdline) of every live process in the bubble of `node` (its user namespace).
pub fn bubble_processes(cluster: &str, node: &str) -> Vec<(u32, String)> {
    let procs: Vec<(u32, String, String)> = std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
        .filter_map(|pid| {
            let cmdline = String::from_utf8_lossy(&std::fs::read(format!("/proc/{pid}/cmdline")).ok()?)
                .replace('\0', " ");
            let user = std::fs::read_link(format!("/proc/{pid}/ns/user")).ok()?.display().to_string();
            Some((pid, cmdline, user))
        })
        .collect();
    let Some((_, _, ns)) = procs.iter().find(|(_, c, _)| {
        c.contains("bubble-init")
            && c.contains(&format!("--cluster={cluster} "))
            && c.contains(&format!("--node={node} "))
    }) else {
        return Vec::new();
    };
    procs.iter().filter(|(_, _, u)| u == ns).map(|(p, c, _)| (*p, c.clone())).collect()
}

/// A HorizontalPodAutoscaler on CPU, fed by the metrics-server the cluster deployed (`apply`
/// and `kubectl` reach it): a Deployment
/// whose pods keep a little CPU busy (each far above its 10m request) until a set time goes
/// from 1 to 3 replicas, then, once its pods are idle, back to 1 (no stabilization window, so
/// the test need not wait upstream's 5 minutes). The same pods go idle, as in a service whose
/// load ends.
pub fn an_hpa_scales_up_under_load_and_back_down(
    apply: &dyn Fn(&str),
    kubectl: &dyn Fn(&[&str]) -> String,
    shell: &str,
    busy: Duration,
) {
    let busy_until = (std::time::SystemTime::now() + busy)
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs();
    apply(&format!(
        "apiVersion: apps/v1
kind: Deployment
metadata: {{name: load}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: load}}}}
  template:
    metadata: {{labels: {{app: load}}}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: load
        image: {shell}
        env: [{{name: BUSY_UNTIL, value: \"{until}\"}}]
        command: [sh, -c, 'while [ $(date +%s) -lt $BUSY_UNTIL ]; do sleep 0.01; done; exec sleep 3600']
        resources: {{requests: {{cpu: 10m}}}}
---
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {{name: load}}
spec:
  scaleTargetRef: {{apiVersion: apps/v1, kind: Deployment, name: load}}
  minReplicas: 1
  maxReplicas: 3
  metrics:
  - type: Resource
    resource: {{name: cpu, target: {{type: Utilization, averageUtilization: 50}}}}
  behavior:
    scaleDown:
      stabilizationWindowSeconds: 0
      policies: [{{type: Percent, value: 100, periodSeconds: 15}}]
",
        until = busy_until,
    ));
    let replicas = || kubectl(&["get", "deployment", "load", "-o", "jsonpath={.spec.replicas}"]);
    let hpa = || kubectl(&["describe", "hpa", "load"]);
    let started = std::time::Instant::now();
    eventually_or(
        "the HPA scales load to 3 while it is busy",
        busy,
        || (replicas() == "3").then_some(()),
        hpa,
    );
    eprintln!(
        "HPA: 1 → 3 replicas {:.1} s after the Deployment was applied",
        started.elapsed().as_secs_f64()
    );
    eventually_or(
        "the HPA scales load back to 1 once it is idle",
        busy.saturating_sub(started.elapsed()) + Duration::from_secs(150),
        || (replicas() == "1").then_some(()),
        hpa,
    );
    eprintln!(
        "HPA: 3 → 1 replica {:.1} s after the load stopped",
        started.elapsed().saturating_sub(busy).as_secs_f64()
    );
    kubectl(&["delete", "hpa,deployment", "load"]);
}

/// What every pod of a one-per-node Deployment reached: for each client pod's node, the node
/// whose pod answered each other pod's IP (`None` where the request failed), and the node
/// that answered the Service (by its DNS name, through kube-proxy and CoreDNS).
pub struct Reachability {
    /// The nodes, in the order of the rows and columns.
    pub nodes: Vec<String>,
    /// `cells[i][j]`: the node that answered node i's request to node j's pod.
    pub cells: Vec<Vec<Option<String>>>,
    /// `service[i]`: the node that answered node i's request to the Service.
    pub service: Vec<Option<String>>,
    /// What each client pod's `kubectl exec` printed, for failure messages.
    pub outputs: Vec<String>,
}

impl Reachability {
    /// Requests that failed or reached the wrong pod, as "FROM → TO" lines.
    pub fn failures(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (i, row) in self.cells.iter().enumerate() {
            let before = out.len();
            for (j, cell) in row.iter().enumerate() {
                if cell.as_deref() != Some(self.nodes[j].as_str()) {
                    out.push(format!("{} → pod on {}: {cell:?}", self.nodes[i], self.nodes[j]));
                }
            }
            if self.service[i].is_none() {
                out.push(format!("{} → Service: no answer", self.nodes[i]));
            }
            if out.len() > before {
                out.push(format!("{} printed: {}", self.nodes[i], self.outputs[i].trim()));
            }
        }
        out
    }

    /// The matrix as a Markdown table (✓ for the right pod, ✗ otherwise).
    pub fn table(&self) -> String {
        let mut out = String::from("| from \\ to |");
        for node in &self.nodes {
            out.push_str(&format!(" {} |", node.rsplit('-').next().unwrap_or(node)));
        }
        out.push_str(" Service |\n|---|");
        out.push_str(&"---|".repeat(self.nodes.len() + 1));
        out.push('\n');
        for (i, row) in self.cells.iter().enumerate() {
            out.push_str(&format!("| {} |", self.nodes[i]));
            for (j, cell) in row.iter().enumerate() {
                out.push_str(if cell.as_deref() == Some(self.nodes[j].as_str()) {
                    " ✓ |"
                } else {
                    " ✗ |"
                });
            }
            out.push_str(if self.service[i].is_some() { " ✓ |\n" } else { " ✗ |\n" });
        }
        out
    }
}

/// Deploys `who`, one busybox httpd per node of cluster `cluster` (`nodes` of them) that
/// answers with its node's name, and a Service in front; once all are Ready, each pod fetches
/// every pod's page by IP (node → node through the tunnel, and to itself) and the Service's
/// by name. Each pod's requests run in one `kubectl exec`, the pods' in parallel.
pub fn reachability_matrix(env: &Env, cluster: &str, nodes: usize) -> Reachability {
    use hpk_test_support::manifest::{httpd_who_answers, service, spread_deployment};
    let deployment =
        spread_deployment("who", nodes as u32, "DoNotSchedule", Some(1), &httpd_who_answers(&env.httpd));
    env.apply(cluster, &format!("{deployment}---\n{}", service("who", "who", 8080)));
    let mut pods = eventually_or(
        &format!("{nodes} Ready pods of `who`, one per node"),
        Duration::from_secs(300),
        || {
            let out = env.kubectl(cluster, &[
                "get", "pods", "-l", "app=who", "-o",
                "jsonpath={range .items[*]}{.metadata.name} {.spec.nodeName} {.status.podIP} {.status.conditions[?(@.type==\"Ready\")].status}{\"\\n\"}{end}",
            ]);
            // A failed read (the API server busy) is one more round, not a failure.
            let pods: Vec<(String, String, String)> = String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter_map(|l| {
                    let w: Vec<&str> = l.split_whitespace().collect();
                    (w.len() == 4 && w[3] == "True")
                        .then(|| (w[0].to_owned(), w[1].to_owned(), w[2].to_owned()))
                })
                .collect();
            (pods.len() == nodes).then_some(pods)
        },
        || env.diagnose(cluster),
    );
    pods.sort_by_key(|p| node_order(&p.1));
    let ips: Vec<&str> = pods.iter().map(|p| p.2.as_str()).collect();
    // One line per target: "IP pod=… node=…" or "IP FAIL"; then "service pod=… node=…". HTTP
    // by busybox nc, and the Service's name by busybox nslookup (the static busybox's wget
    // crashes in the C library's resolver).
    let get = |host: &str| format!("printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 5 {host} | tail -n 1");
    let script = format!(
        "for ip in {}; do r=$({}) && [ -n \"$r\" ] && echo \"$ip $r\" || echo \"$ip FAIL\"; done; \
         svc=$(nslookup who.default.svc.cluster.local | awk '/^Address/ {{a=$NF}} END {{print a}}'); \
         r=$({}) && [ -n \"$r\" ] && echo \"service $r\" || echo \"service FAIL $svc\"",
        ips.join(" "),
        get("$ip 8080"),
        get("$svc 80"),
    );
    let answers: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = pods
            .iter()
            .map(|(pod, _, _)| {
                let script = &script;
                s.spawn(move || text(&env.kubectl(cluster, &["exec", pod, "--", "sh", "-c", script])))
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("exec thread")).collect()
    });
    let node_of = |line: &str| line.split("node=").nth(1).map(|n| n.trim().to_owned());
    let cells = answers
        .iter()
        .map(|out| {
            ips.iter()
                .map(|ip| out.lines().find(|l| l.starts_with(&format!("{ip} "))).and_then(node_of))
                .collect()
        })
        .collect();
    let service =
        answers.iter().map(|out| out.lines().find(|l| l.starts_with("service ")).and_then(node_of)).collect();
    Reachability { nodes: pods.iter().map(|p| p.1.clone()).collect(), cells, service, outputs: answers }
}

/// Sorts `NAME-2` before `NAME-10`.
fn node_order(node: &str) -> (usize, String) {
    let (prefix, n) = node.rsplit_once('-').unwrap_or((node, ""));
    (n.parse().unwrap_or(usize::MAX), prefix.to_owned())
}

/// Resident, proportional, private and anonymous memory in KiB of a process, from
/// `smaps_rollup`. Anonymous memory is what the process cannot give back under pressure; the
/// rest of its resident memory is its files' pages (program text, shared between the bubbles
/// of one machine that run the same image).
pub fn memory_kib(pid: u32) -> Option<[u64; 4]> {
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    let field = |name: &str| -> u64 {
        rollup
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
            .unwrap_or(0)
    };
    Some([
        field("Rss:"),
        field("Pss:"),
        field("Private_Clean:") + field("Private_Dirty:"),
        field("Anonymous:"),
    ])
}

/// `MemAvailable` of the machine, in KiB.
pub fn mem_available_kib() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("MemAvailable:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

/// The seconds `up` printed after `label` ("node(s) Ready in", "cluster DNS in").
pub fn reported(output: &str, label: &str) -> f64 {
    output
        .split(label)
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|v| v.trim_end_matches(',').parse().ok())
        .unwrap_or(f64::NAN)
}
