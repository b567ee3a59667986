//! The cluster's slurm.conf and the hosts file every node sees as /etc/hosts.

use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::path::Path;

/// Everything slurm.conf depends on.
pub(super) struct ConfParams<'a> {
    pub cluster_name: &'a str,
    pub ctl_ip: Ipv4Addr,
    pub ctl_port: u16,
    pub slurmd_port: u16,
    pub munge_socket: &'a Path,
    pub state_dir: &'a Path,
    pub spool_dir: &'a Path,
    pub log_dir: &'a Path,
    pub nodes: &'a [(String, Ipv4Addr)],
    pub cpus_per_node: u32,
    pub memory_mb_per_node: u32,
    pub gpus_per_node: u32,
    pub cgroups: bool,
    pub kill_wait_secs: u32,
    pub partition: &'a str,
}

/// Memory a job gets per CPU when it does not ask (`--mem`, `--mem-per-cpu`), in MB.
pub(super) const DEF_MEM_PER_CPU_MB: u32 = 2048;

/// The hostname slurmctld runs under (its UTS namespace), as `SlurmctldHost` names it.
pub(super) const CTL_HOSTNAME: &str = "ctl";

/// Renders slurm.conf: memory and GPUs as consumables, cgroup process tracking where asked,
/// no accounting, every path inside the cluster's directory.
pub(super) fn slurm_conf(p: &ConfParams) -> String {
    let d = |path: &Path| path.display().to_string();
    let mut conf = format!(
        "\
ClusterName={cluster}
SlurmctldHost={CTL_HOSTNAME}({ctl_ip})
SlurmctldPort={ctl_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={socket}
SlurmUser=slurm
SlurmdUser=root
StateSaveLocation={state}
SlurmctldPidFile={state}/slurmctld.pid
SlurmctldLogFile={log}/slurmctld.log
SlurmdSpoolDir={spool}/%n
SlurmdPidFile={spool}/slurmd-%n.pid
SlurmdLogFile={log}/slurmd-%n.log
ProctrackType={proctrack}
TaskPlugin={task}
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
MailProg=/bin/true
SelectType=select/cons_tres
# Memory is a consumable, as at most sites: --mem, --mem-per-cpu, or DefMemPerCPU.
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU={def_mem}
GresTypes=gpu
# Batch jobs start at once instead of up to 3 s later.
SchedulerParameters=batch_sched_delay=0
# The nodes claim more CPUs than the machine has, so that several 1-CPU jobs share one.
SlurmdParameters=config_overrides
# A job asking for more than the partition has is refused at submission, not left pending.
EnforcePartLimits=ALL
ReturnToService=2
MinJobAge=300
KillWait={kill_wait}
",
        cluster = p.cluster_name,
        ctl_ip = p.ctl_ip,
        ctl_port = p.ctl_port,
        slurmd_port = p.slurmd_port,
        socket = d(p.munge_socket),
        state = d(p.state_dir),
        log = d(p.log_dir),
        spool = d(p.spool_dir),
        kill_wait = p.kill_wait_secs,
        def_mem = DEF_MEM_PER_CPU_MB,
        proctrack = if p.cgroups { "proctrack/cgroup" } else { "proctrack/linuxproc" },
        task = if p.cgroups { "task/cgroup" } else { "task/none" },
    );
    let (cpus, memory) = (p.cpus_per_node, p.memory_mb_per_node);
    let gres = if p.gpus_per_node > 0 { format!(" Gres=gpu:{}", p.gpus_per_node) } else { String::new() };
    for (name, ip) in p.nodes {
        let _ = writeln!(
            conf,
            "NodeName={name} NodeAddr={ip} NodeHostname={name} CPUs={cpus} Sockets=1 \
             CoresPerSocket={cpus} ThreadsPerCore=1 RealMemory={memory}{gres} State=UNKNOWN"
        );
    }
    let names: Vec<&str> = p.nodes.iter().map(|(name, _)| name.as_str()).collect();
    let _ = writeln!(
        conf,
        "PartitionName={} Nodes={} Default=YES MaxTime=UNLIMITED State=UP",
        p.partition,
        names.join(",")
    );
    conf
}

/// gres.conf: each node's GPUs are the character devices `devices` (`…/nvidia0`, …), which the
/// harness makes; nothing is autodetected.
pub(super) fn gres_conf(devices: &[std::path::PathBuf]) -> String {
    let mut gres = String::from("AutoDetect=off\n");
    for device in devices {
        let _ = writeln!(gres, "Name=gpu File={}", device.display());
    }
    gres
}

/// cgroup.conf: cgroup v1 (this machine's hierarchy), tasks confined to their memory and
/// devices. Cores are not confined: the nodes claim more CPUs than the machine has.
pub(super) fn cgroup_conf() -> String {
    "CgroupPlugin=cgroup/v1\nCgroupAutomount=no\nConstrainCores=no\nConstrainRAMSpace=yes\n\
     ConstrainSwapSpace=no\nConstrainDevices=yes\n"
        .to_owned()
}

/// The hosts file bind-mounted over /etc/hosts for slurmctld and every slurmd.
pub(super) fn hosts_file(ctl_ip: Ipv4Addr, nodes: &[(String, Ipv4Addr)]) -> String {
    let mut hosts = format!("127.0.0.1 localhost\n{ctl_ip} {CTL_HOSTNAME}\n");
    for (name, ip) in nodes {
        let _ = writeln!(hosts, "{ip} {name}");
    }
    hosts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes() -> Vec<(String, Ipv4Addr)> {
        vec![("node1".into(), Ipv4Addr::new(10, 250, 7, 10)), ("node2".into(), Ipv4Addr::new(10, 250, 7, 11))]
    }

    #[test]
    fn conf_names_every_node_and_one_default_partition_over_them() {
        let nodes = nodes();
        let conf = slurm_conf(&ConfParams {
            cluster_name: "hpke2e1",
            ctl_ip: Ipv4Addr::new(10, 250, 7, 1),
            ctl_port: 40001,
            slurmd_port: 40002,
            munge_socket: Path::new("/t/munge/socket"),
            state_dir: Path::new("/t/state"),
            spool_dir: Path::new("/t/spool"),
            log_dir: Path::new("/t/log"),
            nodes: &nodes,
            cpus_per_node: 4,
            memory_mb_per_node: 4096,
            gpus_per_node: 2,
            cgroups: true,
            kill_wait_secs: 7,
            partition: "batch",
        });
        assert!(conf.contains("SlurmctldHost=ctl(10.250.7.1)\n"));
        assert!(conf.contains("AuthInfo=socket=/t/munge/socket\n"));
        assert!(conf.contains("KillWait=7\n"));
        assert!(conf.contains("NodeName=node2 NodeAddr=10.250.7.11 NodeHostname=node2 CPUs=4 "));
        assert!(conf.contains(" RealMemory=4096 Gres=gpu:2 State=UNKNOWN\n"), "{conf}");
        assert!(conf.contains("SelectTypeParameters=CR_Core_Memory\n"));
        assert!(conf.contains("ProctrackType=proctrack/cgroup\n"));
        assert!(conf.contains("PartitionName=batch Nodes=node1,node2 Default=YES MaxTime=UNLIMITED"));
    }

    #[test]
    fn hosts_file_lists_ctl_and_the_nodes() {
        let hosts = hosts_file(Ipv4Addr::new(10, 250, 7, 1), &nodes());
        assert_eq!(hosts, "127.0.0.1 localhost\n10.250.7.1 ctl\n10.250.7.10 node1\n10.250.7.11 node2\n");
    }
}
