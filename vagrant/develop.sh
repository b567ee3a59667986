#!/usr/bin/env bash
# Copies a build of HPK into the Vagrant lab, into the lab user's ~/hpk-dev on the controller
# (its home is the node's too, over NFS), for `HPK_DEV=1 sbatch --nodes=2 ~/hpk-dev/slurm/hpk.slurm`.
# `make develop` builds and then runs this.
#
#   vagrant/develop.sh [--bin-dir DIR] [--image FILE] [--kubectl FILE]
#
#   --bin-dir DIR    where `hpk` is (default: bin, from `make binaries`)
#   --image FILE     the bubble as an oci-archive (default: target/release/images/hpk-bubble.oci.tar)
#   --kubectl FILE   installed as ~/hpk-dev/bin/kubectl when it exists (default: the control
#                    plane's multi-call binary, which is kubectl when called by that name)
#
# Layout in the lab, replaced whole on every run:
#   ~/hpk-dev/bin/hpk  ~/hpk-dev/bin/kubectl  ~/hpk-dev/images/hpk-bubble.oci.tar
#   ~/hpk-dev/slurm/hpk.slurm
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
# The lab user of the Vagrantfile (LAB_USER there).
LAB_USER=${HPK_LAB_USER:-researcher}
VM=controller

BIN_DIR=$ROOT/bin
IMAGE=$ROOT/target/release/images/hpk-bubble.oci.tar
KUBECTL=${HPK_CACHE_DIR:-$HOME/.cache/hpk}/controlplane/bin/hpk-controlplane

die() { printf 'develop.sh: %s\n' "$*" >&2; exit 1; }
usage() { sed -n '6,11s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" >&2; exit 2; }

while [ $# -gt 0 ]; do
  case "$1" in
    --bin-dir) BIN_DIR=${2:?}; shift 2 ;;
    --image) IMAGE=${2:?}; shift 2 ;;
    --kubectl) KUBECTL=${2:?}; shift 2 ;;
    -h | --help) usage ;;
    *) echo "develop.sh: unknown argument: $1" >&2; usage ;;
  esac
done

command -v vagrant >/dev/null || die "vagrant is not installed (Debian: apt-get install vagrant)"
command -v rsync >/dev/null || die "rsync is not installed (Debian: apt-get install rsync)"
[ -x "$BIN_DIR/hpk" ] || die "$BIN_DIR/hpk is missing: run make binaries"
[ -f "$IMAGE" ] || die "$IMAGE is missing: run make develop (it builds the image from the release binaries)"

# Every vagrant command below reads the lab's Vagrantfile, wherever this was started from.
export VAGRANT_CWD=$HERE

# `vagrant status` says "running" for a VM that is up, whichever the provider; it fails
# outright where no provider is usable.
if ! status=$(vagrant status "$VM" --machine-readable 2>&1); then
  reason=$(printf '%s\n' "$status" | awk -F, '$3 == "error-exit" { print $5; exit }' | sed 's/\\n.*//')
  die "vagrant status $VM failed: ${reason:-no reason given}"
fi
state=$(printf '%s\n' "$status" | awk -F, -v vm="$VM" '$2 == vm && $3 == "state" { print $4; exit }')
if [ "$state" != running ]; then
  die "the lab's $VM VM is not running (vagrant status: ${state:-unknown}); start the lab with: cd $HERE && vagrant up"
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The layout as links to what was built; rsync copies what they point to, and only what changed.
stage=$work/hpk-dev
mkdir -p "$stage/bin" "$stage/images" "$stage/slurm"
ln -s "$(realpath "$BIN_DIR/hpk")" "$stage/bin/hpk"
ln -s "$(realpath "$IMAGE")" "$stage/images/hpk-bubble.oci.tar"
if [ -x "$KUBECTL" ]; then
  ln -s "$(realpath "$KUBECTL")" "$stage/bin/kubectl"
else
  echo "develop.sh: no $KUBECTL (scripts/setup.sh builds it); the lab gets no kubectl" >&2
fi
if [ -f "$ROOT/slurm/hpk.slurm" ]; then
  ln -s "$ROOT/slurm/hpk.slurm" "$stage/slurm/hpk.slurm"
else
  echo "develop.sh: no slurm/hpk.slurm in this checkout; the lab gets none" >&2
fi

# Vagrant's ssh settings for the VM (address, port, key), as the lab user: the controller's
# provisioning gave that user the same login key as vagrant's.
vagrant ssh-config "$VM" >"$work/ssh_config" || die "vagrant ssh-config $VM failed"
rsync --archive --copy-links --delete --human-readable --info=stats1,progress2 \
  -e "ssh -F $work/ssh_config -l $LAB_USER" "$stage/" "$VM:hpk-dev/"

echo "copied to $LAB_USER@$VM:~/hpk-dev: $(cd "$stage" && find . -mindepth 2 | sed 's|^\./||' | sort | paste -sd' ')"
echo "next: cd $HERE && vagrant ssh $VM, then:"
echo "  sudo -iu $LAB_USER"
echo "  HPK_DEV=1 sbatch --nodes=2 ~/hpk-dev/slurm/hpk.slurm"
echo "  export KUBECONFIG=~/.hpk/kubeconfig; kubectl get nodes"
