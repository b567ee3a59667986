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
    pub kill_wait_secs: u32,
    pub partition: &'a str,
}

/// The hostname slurmctld runs under (its UTS namespace), as `SlurmctldHost` names it.
pub(super) const CTL_HOSTNAME: &str = "ctl";

/// Renders slurm.conf: no cgroups, no accounting, every path inside the cluster's directory.
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
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
MailProg=/bin/true
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
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
    );
    let cpus = p.cpus_per_node;
    for (name, ip) in p.nodes {
        let _ = writeln!(
            conf,
            "NodeName={name} NodeAddr={ip} NodeHostname={name} CPUs={cpus} Sockets=1 \
             CoresPerSocket={cpus} ThreadsPerCore=1 State=UNKNOWN"
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
            kill_wait_secs: 7,
            partition: "batch",
        });
        assert!(conf.contains("SlurmctldHost=ctl(10.250.7.1)\n"));
        assert!(conf.contains("AuthInfo=socket=/t/munge/socket\n"));
        assert!(conf.contains("KillWait=7\n"));
        assert!(conf.contains("NodeName=node2 NodeAddr=10.250.7.11 NodeHostname=node2 CPUs=4 "));
        assert!(conf.contains("PartitionName=batch Nodes=node1,node2 Default=YES MaxTime=UNLIMITED"));
    }

    #[test]
    fn hosts_file_lists_ctl_and_the_nodes() {
        let hosts = hosts_file(Ipv4Addr::new(10, 250, 7, 1), &nodes());
        assert_eq!(hosts, "127.0.0.1 localhost\n10.250.7.1 ctl\n10.250.7.10 node1\n10.250.7.11 node2\n");
    }
}
