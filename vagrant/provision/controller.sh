#!/usr/bin/env bash
# Provisions the lab's controller: the NFS server for /home and for the files the node takes
# from here (munge key, slurm.conf), slurmctld, and slurmd (the controller is a compute node
# too). Run as root by Vagrant after common.sh, on every `vagrant up`; idempotent.
set -euo pipefail

: "${LAB_CONTROLLER:?}" "${LAB_CONTROLLER_IP:?}" "${LAB_HOSTS:?}" "${LAB_SUBNET:?}"
: "${LAB_USER:?}" "${SLURM_CPUS:?}" "${SLURM_REAL_MEMORY:?}"

# Read by node.sh, which mounts it read-only; nothing else is exported from here.
SHARE=/srv/hpk-lab

apt_install() {
  local missing=() pkg
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "installing: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
}

# The lab user's home on the file server, with vagrant's login key, so that `make develop`
# (vagrant ssh-config) can copy into it as that user.
lab_home() {
  local home="/home/$LAB_USER"
  if [ ! -d "$home" ]; then
    install -d -m 0755 -o "$LAB_USER" -g "$LAB_USER" "$home"
    cp -rT /etc/skel "$home"
    chown -R "$LAB_USER:$LAB_USER" "$home"
  fi
  install -d -m 0700 -o "$LAB_USER" -g "$LAB_USER" "$home/.ssh"
  install -m 0600 -o "$LAB_USER" -g "$LAB_USER" /home/vagrant/.ssh/authorized_keys \
    "$home/.ssh/authorized_keys"
}

# /home for every host on the private network, as a cluster's file server exports it (root
# squashed). The share only for the other VMs, read-only and with root not squashed, so that
# their root can read the 0400 munge key.
nfs_server() {
  local entries entry ip name share_clients=""
  IFS=, read -ra entries <<<"$LAB_HOSTS"
  for entry in "${entries[@]}"; do
    read -r ip name <<<"$entry"
    [ "$name" = "$LAB_CONTROLLER" ] || share_clients+=" $ip(ro,sync,no_subtree_check,no_root_squash)"
  done
  # exportfs reads /etc/exports.d/*.exports; Debian's package does not make the directory.
  install -d -m 0755 "$SHARE" /etc/exports.d
  cat >/etc/exports.d/hpk-lab.exports <<EOF
/home $LAB_SUBNET(rw,sync,no_subtree_check,root_squash)
$SHARE$share_clients
EOF
  systemctl enable --now nfs-server
  exportfs -ra
}

# Debian's munge package makes a key when it is installed; the node takes this one.
munge_key() {
  if [ ! -s /etc/munge/munge.key ]; then
    mungekey --create --keyfile=/etc/munge/munge.key
    chown munge:munge /etc/munge/munge.key
    chmod 0400 /etc/munge/munge.key
    systemctl restart munge
  fi
  install -m 0400 /etc/munge/munge.key "$SHARE/munge.key"
  systemctl enable --now munge
}

# One slurm.conf for both VMs: written here, copied by node.sh. Sets SLURM_RESTART when it
# changed, for the daemons to read it.
SLURM_RESTART=no
slurm_conf() {
  local conf nodes="" entries entry ip name
  IFS=, read -ra entries <<<"$LAB_HOSTS"
  for entry in "${entries[@]}"; do
    read -r ip name <<<"$entry"
    nodes+="NodeName=$name NodeAddr=$ip CPUs=$SLURM_CPUS RealMemory=$SLURM_REAL_MEMORY State=UNKNOWN"$'\n'
  done
  conf=$(mktemp)
  cat >"$conf" <<EOF
# The HPK lab's Slurm cluster, written by vagrant/provision/controller.sh; the same on both VMs.
ClusterName=hpk-lab
SlurmctldHost=$LAB_CONTROLLER($LAB_CONTROLLER_IP)
AuthType=auth/munge
SlurmUser=slurm
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmdSpoolDir=/var/lib/slurm/slurmd
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
# A node that was down comes back by itself when its slurmd registers (e.g. after a reboot).
ReturnToService=2
# proctrack/linuxproc follows a job's processes by their parent ids and needs nothing else.
# proctrack/cgroup, what most sites run, is more thorough (nothing escapes by reparenting) but
# on Debian 12's cgroup v2 it needs cgroup.conf, dbus and systemd delegation to slurmd; the lab
# has never been booted in CI, so it takes the setting with the fewest moving parts. Under
# either, a job's end signals every process Slurm tracks (SIGTERM, then SIGKILL).
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
SchedulerType=sched/backfill
# Start a submitted job at once instead of batching submissions.
SchedulerParameters=batch_sched_delay=0
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# A VM's reported sockets/cores/memory vary with the hypervisor; trust the lines below instead
# of draining a node whose slurmd counts differently.
SlurmdParameters=config_overrides
${nodes}PartitionName=hpk Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
  if ! cmp -s "$conf" /etc/slurm/slurm.conf; then
    install -m 0644 "$conf" /etc/slurm/slurm.conf
    SLURM_RESTART=yes
  fi
  install -m 0644 /etc/slurm/slurm.conf "$SHARE/slurm.conf"
  rm -f "$conf"
}

# The directories are Debian's packages', made again in case a reprovision finds them gone.
slurm_daemons() {
  install -d -m 0755 -o slurm -g slurm /var/lib/slurm/slurmctld
  chown slurm:slurm /var/log/slurm
  systemctl enable slurmctld slurmd
  if [ "$SLURM_RESTART" = yes ]; then
    systemctl restart slurmctld slurmd
  else
    systemctl start slurmctld slurmd
  fi
}

# Waits (bounded) until slurmctld answers, so that a failure shows here, not at sbatch.
slurmctld_ready() {
  local deadline=$((SECONDS + 60))
  until scontrol ping | grep -q "is UP"; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "slurmctld did not answer within 60 s; see /var/log/slurm/slurmctld.log" >&2
      return 1
    fi
    sleep 2
  done
  echo "slurmctld up; nodes: $(sinfo --noheader --Node --format='%N %t' | paste -sd' ')"
}

# The packages only the controller has. slurmctld's unit needs slurm.conf, so installing it
# before the file exists leaves it stopped: its first start sees the final configuration.
apt_install nfs-kernel-server slurmctld
lab_home
nfs_server
munge_key
slurm_conf
slurm_daemons
slurmctld_ready
