//! A real Slurm cluster in network namespaces: jobs run as its user, one task per node with the
//! node's own hostname and address; oversized jobs are refused; 1-CPU jobs share a node;
//! `deny_tun` affects one node only; and teardown leaves nothing behind, also after a panic.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use hpk_integration::slurm::{SlurmCluster, SlurmOptions};

const JOB_TIMEOUT: Duration = Duration::from_secs(30);
const TOOLS: &[&str] =
    &["munged", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "sinfo", "nsenter", "unshare"];

/// What a running cluster owns, recorded so it can be checked after teardown.
#[derive(Debug)]
struct Traces {
    pids: Vec<(String, u32)>,
    namespaces: Vec<String>,
    bridge: String,
    dir: PathBuf,
    user: String,
    uid: u32,
}

impl Traces {
    fn of(cluster: &SlurmCluster) -> Self {
        Self {
            pids: cluster.pids(),
            namespaces: cluster.nodes().iter().map(|n| n.netns.clone()).collect(),
            bridge: cluster.network().bridge().to_owned(),
            dir: cluster.dir().to_owned(),
            user: cluster.user().name.clone(),
            uid: cluster.user().uid,
        }
    }

    fn assert_gone(&self) {
        for (name, pid) in &self.pids {
            let running = i32::try_from(*pid).is_ok_and(hpk_integration::process::is_running);
            assert!(!running, "{name} (pid {pid}) still running");
        }
        let listed = hpk_integration::netns::ip(&["netns", "list"]).expect("ip netns list");
        for ns in &self.namespaces {
            assert!(!listed.contains(ns.as_str()), "namespace {ns} remains");
        }
        let links = hpk_integration::netns::ip(&["-o", "link", "show"]).expect("ip link show");
        assert!(!links.contains(&format!(": {}:", self.bridge)), "bridge {} remains", self.bridge);
        assert!(!self.dir.exists(), "{} remains", self.dir.display());
        assert!(
            nix::unistd::User::from_name(&self.user).expect("getpwnam").is_none(),
            "user {} remains",
            self.user
        );
        let uid = format!("\t{}\t", self.uid);
        for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
            let status = std::fs::read_to_string(entry.path().join("status")).unwrap_or_default();
            let owned = status.lines().any(|l| l.starts_with("Uid:") && format!("{l}\t").contains(&uid));
            let pid = entry.file_name().to_string_lossy().parse::<i32>().ok();
            if owned && pid.is_some_and(hpk_integration::process::is_running) {
                panic!("process {pid:?} of the cluster's user remains");
            }
        }
    }
}

/// Runs `test` against a fresh cluster in a thread, then checks that dropping the cluster (at
/// the end or while `test` panics) left nothing behind, and passes `test`'s panic on.
fn with_cluster(opts: SlurmOptions, test: impl FnOnce(&SlurmCluster) + Send + 'static) -> bool {
    if !hpk_integration::tools_present(TOOLS) {
        return false;
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let outcome = std::thread::spawn(move || {
        let started = Instant::now();
        let cluster = SlurmCluster::start(opts).expect("slurm cluster");
        eprintln!("cluster up in {:?}", started.elapsed());
        tx.send(Traces::of(&cluster)).expect("send traces");
        test(&cluster);
        let teardown = Instant::now();
        drop(cluster);
        eprintln!("teardown took {:?}", teardown.elapsed());
    })
    .join();
    // No traces: the cluster did not start, and the panic below says why.
    if let Ok(traces) = rx.recv() {
        traces.assert_gone();
    }
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
    true
}

#[test]
fn a_three_node_job_runs_one_task_per_node_and_a_four_node_job_is_refused() {
    with_cluster(SlurmOptions::default(), |cluster| {
        let script = cluster
            .write_script(
                "hosts.sh",
                "#!/bin/sh\nsrun --ntasks-per-node=1 sh -c 'echo $(hostname) $(ip -4 -o addr show scope global)'\n",
            )
            .expect("script");
        let submitted = Instant::now();
        let id = cluster.sbatch(&["--nodes=3"], &script).expect("sbatch");
        let job =
            cluster.wait_job_state(id, &["COMPLETED", "FAILED", "CANCELLED"], JOB_TIMEOUT).expect("job ends");
        eprintln!("3-node job {id} ended {:?} after submission", submitted.elapsed());
        let output = cluster.job_output(id);
        assert_eq!(job.state, "COMPLETED", "job {job:?}, output:\n{output}\n{}", cluster.logs_tail());
        assert_eq!(job.nodes, ["node1", "node2", "node3"]);
        let seen: BTreeMap<&str, &str> = output
            .lines()
            .filter_map(|line| {
                let host = line.split_whitespace().next()?;
                let addr = line.split_whitespace().skip_while(|w| *w != "inet").nth(1)?;
                Some((host, addr.split('/').next()?))
            })
            .collect();
        let expected: BTreeMap<&str, String> =
            cluster.nodes().iter().map(|n| (n.name.as_str(), n.ip.to_string())).collect();
        assert_eq!(seen.len(), 3, "output:\n{output}");
        for (host, addr) in &seen {
            assert_eq!(expected.get(host).map(String::as_str), Some(*addr), "output:\n{output}");
        }

        let before = cluster.scontrol(&["show", "jobs", "--oneliner"]).expect("scontrol").lines().count();
        let refused = cluster.sbatch(&["--nodes=4"], &script).expect_err("a 4-node job on 3 nodes");
        let message = refused.to_string();
        assert!(message.contains("Node count specification invalid"), "{message}");
        let after = cluster.scontrol(&["show", "jobs", "--oneliner"]).expect("scontrol").lines().count();
        assert_eq!(before, after, "the refused job must not exist");
    });
}

#[test]
fn two_one_cpu_jobs_share_a_node_and_end_cancelled_within_kill_wait() {
    let opts = SlurmOptions { kill_wait_secs: 5, ..SlurmOptions::default() };
    let kill_wait = Duration::from_secs(u64::from(opts.kill_wait_secs));
    with_cluster(opts, move |cluster| {
        let script = cluster.write_script("sleep.sh", "#!/bin/sh\nsleep 30\n").expect("script");
        let ids: Vec<u32> =
            (0..2).map(|_| cluster.sbatch(&["--nodelist=node1"], &script).expect("sbatch")).collect();
        for &id in &ids {
            let job = cluster.wait_job_state(id, &["RUNNING"], JOB_TIMEOUT).expect("running");
            assert_eq!(job.nodes, ["node1"]);
        }
        for &id in &ids {
            assert_eq!(cluster.job(id).expect("job").expect("known").state, "RUNNING", "both at once");
        }
        let cancelled = Instant::now();
        for &id in &ids {
            cluster.scancel(id, &[]).expect("scancel");
        }
        for &id in &ids {
            cluster
                .wait_job_state(id, &["CANCELLED"], kill_wait + Duration::from_secs(5))
                .expect("cancelled");
        }
        eprintln!("both jobs CANCELLED {:?} after scancel", cancelled.elapsed());
    });
}

#[test]
fn deny_tun_makes_the_device_unwritable_on_that_node_only() {
    // Like scripts/setup.sh's setup_dev_net_tun: jobs need the device usable by the user.
    let tun = std::path::Path::new("/dev/net/tun");
    if tun.exists() && std::fs::metadata(tun).expect("stat").permissions().mode() & 0o777 != 0o666 {
        std::fs::set_permissions(tun, std::fs::Permissions::from_mode(0o666))
            .expect("chmod 0666 /dev/net/tun");
    }
    with_cluster(SlurmOptions::default(), |cluster| {
        cluster.deny_tun(1).expect("deny_tun on node2");
        let script = cluster
            .write_script(
                "tun.sh",
                "#!/bin/sh\nsrun --ntasks-per-node=1 sh -c \
                 'if test -w /dev/net/tun; then echo \"$(hostname) writable\"; else echo \"$(hostname) denied\"; fi'\n",
            )
            .expect("script");
        let id = cluster.sbatch(&["--nodes=2", "--nodelist=node1,node2"], &script).expect("sbatch");
        let job =
            cluster.wait_job_state(id, &["COMPLETED", "FAILED", "CANCELLED"], JOB_TIMEOUT).expect("job ends");
        let output = cluster.job_output(id);
        assert_eq!(job.state, "COMPLETED", "output:\n{output}");
        let mut lines: Vec<&str> = output.lines().collect();
        lines.sort_unstable();
        assert_eq!(lines, ["node1 writable", "node2 denied"], "output:\n{output}");
        // Root inside node2 still sees the real device is hidden there, not removed.
        let out = cluster.on_node(1, "stat").args(["-c", "%a %t,%T", "/dev/net/tun"]).output().expect("stat");
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "600 a,c8");
    });
}

#[test]
fn a_panic_with_a_job_running_still_leaves_nothing_behind() {
    if !hpk_integration::tools_present(TOOLS) {
        return;
    }
    let outcome = std::panic::catch_unwind(|| {
        with_cluster(SlurmOptions { nodes: 1, ..SlurmOptions::default() }, |cluster| {
            let script = cluster.write_script("long.sh", "#!/bin/sh\nsrun sleep 300\n").expect("script");
            let id = cluster.sbatch(&[], &script).expect("sbatch");
            cluster.wait_job_state(id, &["RUNNING"], JOB_TIMEOUT).expect("running");
            panic!("the test panics midway, with a job running");
        })
    });
    // with_cluster checked the teardown before passing the panic on.
    let panic = outcome.expect_err("the inner test was meant to panic");
    let message = panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()));
    assert!(message.as_deref().is_some_and(|m| m.contains("panics midway")), "another panic: {message:?}");
}
