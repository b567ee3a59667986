#!/usr/bin/env bash
# Provisions a compute node of the lab: the controller's munge key and slurm.conf, the lab
# user's home from the controller over NFS, slurmd. Run as root by Vagrant after common.sh, on
# every `vagrant up`; idempotent. Needs the controller provisioned (waits for it, bounded:
# libvirt brings both VMs up at once).
set -euo pipefail

: "${LAB_CONTROLLER:?}" "${LAB_USER:?}"

SHARE=/srv/hpk-lab
WAIT_S=900

# The controller's share, mounted read-only while we copy from it.
fetch_from_controller() {
  local mnt deadline=$((SECONDS + WAIT_S))
  mnt=$(mktemp -d)
  until mount -t nfs -o ro "$LAB_CONTROLLER:$SHARE" "$mnt" 2>/dev/null \
    && [ -s "$mnt/munge.key" ] && [ -s "$mnt/slurm.conf" ]; do
    if mountpoint -q "$mnt"; then umount "$mnt"; fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "the controller's $SHARE (munge key, slurm.conf) was not there within ${WAIT_S}s:" \
        "provision the controller first (vagrant up controller)" >&2
      rmdir "$mnt"
      return 1
    fi
    echo "waiting for $LAB_CONTROLLER:$SHARE"
    sleep 5
  done
  if ! cmp -s "$mnt/munge.key" /etc/munge/munge.key; then
    install -m 0400 -o munge -g munge "$mnt/munge.key" /etc/munge/munge.key
    systemctl restart munge
  fi
  if ! cmp -s "$mnt/slurm.conf" /etc/slurm/slurm.conf; then
    install -m 0644 "$mnt/slurm.conf" /etc/slurm/slurm.conf
    SLURM_RESTART=yes
  fi
  umount "$mnt"
  rmdir "$mnt"
}

# The lab user's home from the controller, as on a cluster: ~/.hpk and ~/hpk-dev are the
# same on both VMs. Only that home is mounted, not all of /home: /home/vagrant holds each VM's
# own login key, and mounting the controller's over it would lock Vagrant out of this VM.
home_mount() {
  local home="/home/$LAB_USER"
  local line="$LAB_CONTROLLER:$home $home nfs defaults,_netdev 0 0"
  install -d -m 0755 "$home"
  if ! grep -qF "$line" /etc/fstab; then
    sed -i "\\#[[:space:]]${home}[[:space:]]#d" /etc/fstab
    echo "$line" >>/etc/fstab
    systemctl daemon-reload
  fi
  mountpoint -q "$home" || mount "$home"
}

# Waits (bounded) until slurmctld lists this node as usable: that proves the munge key and
# slurm.conf agree with the controller's.
node_registered() {
  local state deadline=$((SECONDS + 120))
  while :; do
    state=$(sinfo --noheader --nodes="$(hostname)" --format=%t 2>/dev/null || true)
    case "$state" in idle* | mix* | alloc*) break ;; esac
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "$(hostname) is '${state:-unknown}' in Slurm after 120 s; see /var/log/slurm/slurmd.log" \
        "here and slurmctld.log on the controller" >&2
      return 1
    fi
    sleep 2
  done
  echo "slurm nodes: $(sinfo --noheader --Node --format='%N %t' | paste -sd' ')"
}

SLURM_RESTART=no
fetch_from_controller
home_mount
systemctl enable --now munge
systemctl enable slurmd
if [ "$SLURM_RESTART" = yes ]; then systemctl restart slurmd; else systemctl start slurmd; fi
node_registered
