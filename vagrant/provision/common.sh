#!/usr/bin/env bash
# Provisions what both lab VMs share: packages, name resolution, rootless prerequisites (user
# namespaces, /dev/net/tun, subordinate ids) and the lab user. Run as root by Vagrant on every
# `vagrant up`; idempotent. The Vagrantfile sets the LAB_* variables.
set -euo pipefail

: "${LAB_HOSTS:?}" "${LAB_USER:?}" "${LAB_USER_UID:?}"

# apt_install PKG...: installs the Debian packages that are missing, and only those.
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

packages() {
  # Slurm's compute-node daemon and its commands (sbatch, srun, sinfo), authenticated by munge.
  # The controller adds slurmctld (controller.sh); the node never installs it, so no second
  # controller can start there.
  apt_install slurmd slurm-client munge
  # What HPK's bubbles use on the host: crun runs them, newuidmap/newgidmap (uidmap) map the
  # user's subordinate ids into their user namespace, slirp4netns gives them egress; ip and nft
  # for the pod network and kube-proxy.
  apt_install crun uidmap slirp4netns iproute2 nftables
  # The shared home (nfs-common here; controller.sh adds the server) and `make develop`'s copy.
  apt_install nfs-common rsync
}

# Every VM knows the others by the private network's addresses. Vagrant maps the VM's own
# hostname to 127.0.1.1; Slurm and HPK would then advertise loopback to the other node, so that
# line goes and the private address takes its place.
hosts() {
  local entries entry ip name block="# hpk-lab: begin"
  IFS=, read -ra entries <<<"$LAB_HOSTS"
  for entry in "${entries[@]}"; do
    read -r ip name <<<"$entry"
    sed -i -E "/^127\.[0-9.]+[[:space:]].*\<${name}\>/d" /etc/hosts
    block+=$'\n'"$ip $name"
  done
  block+=$'\n'"# hpk-lab: end"
  sed -i '/^# hpk-lab: begin$/,/^# hpk-lab: end$/d' /etc/hosts
  printf '%s\n' "$block" >>/etc/hosts
}

# Rootless bubbles open /dev/net/tun as the user (slirp4netns, the pod network's TAPs); udev's
# default is 0666, this rule makes sure of it across reboots, chmod for the running system.
tun() {
  modprobe tun
  echo 'KERNEL=="tun", MODE="0666"' >/etc/udev/rules.d/60-hpk-tun.rules
  chmod 0666 /dev/net/tun
}

# Debian's kernel lets unprivileged users make user namespaces by default; say so explicitly
# where the switch exists, in case a site or an older kernel turned it off, and allow some
# where a limit of 0 forbids them.
userns() {
  local conf=/etc/sysctl.d/60-hpk-userns.conf
  : >"$conf"
  if [ -e /proc/sys/kernel/unprivileged_userns_clone ]; then
    echo "kernel.unprivileged_userns_clone = 1" >>"$conf"
  fi
  if [ "$(cat /proc/sys/user/max_user_namespaces)" -eq 0 ]; then
    echo "user.max_user_namespaces = 15000" >>"$conf"
  fi
  sysctl -q -p "$conf"
}

# The lab user, with the same uid on both VMs: Slurm runs a job's steps under the submitter's
# uid, and the NFS home is owned by it. Its home is made by controller.sh (the file server);
# node.sh mounts it.
lab_user() {
  if ! getent group "$LAB_USER" >/dev/null; then
    groupadd --gid "$LAB_USER_UID" "$LAB_USER"
  fi
  if ! getent passwd "$LAB_USER" >/dev/null; then
    useradd --uid "$LAB_USER_UID" --gid "$LAB_USER_UID" --no-create-home \
      --home-dir "/home/$LAB_USER" --shell /bin/bash "$LAB_USER"
  fi
  # 65536 subordinate ids for the bubbles' user namespaces. useradd allots them on Debian;
  # this covers a user made without (the range is above what useradd hands out).
  grep -q "^$LAB_USER:" /etc/subuid || usermod --add-subuids 1000000-1065535 "$LAB_USER"
  grep -q "^$LAB_USER:" /etc/subgid || usermod --add-subgids 1000000-1065535 "$LAB_USER"
  # `make develop` puts the build in ~/hpk-dev: its bin/ comes first on PATH when present.
  cat >/etc/profile.d/hpk-lab.sh <<'EOF'
# hpk-lab: the development build from `make develop`, when there is one.
if [ -d "$HOME/hpk-dev/bin" ]; then PATH="$HOME/hpk-dev/bin:$PATH"; fi
EOF
}

# The directories Debian's slurmd and munge expect, whatever state a reprovision finds.
slurm_dirs() {
  install -d -m 0755 /etc/slurm /var/lib/slurm/slurmd /var/log/slurm
}

packages
hosts
tun
userns
lab_user
slurm_dirs
