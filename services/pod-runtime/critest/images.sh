#!/usr/bin/env bash
# Builds stand-ins for every image critest v1.34 pulls and pushes them to a registry speaking
# plain HTTP, under the repository paths critest names (the host part is for the caller to
# route; see run.sh). No Docker: layers are deterministic tars of Debian's busybox-static.
#
#   images.sh HOST:PORT WORKDIR
#
# What critest runs in each image (pkg/validate, pkg/framework of cri-tools v1.34.0):
#   e2e-test-images/busybox:1.29-2     the default image: sh, top, id, ls, ping, netstat,
#                                      hostname, mount, brctl, ipcs, pgrep, ...
#   e2e-test-images/nginx:1.14-2       HTTP 200 on :80; writes /var/run/nginx.pid; a process
#                                      `pidof nginx` finds; PID 1's cmdline has "master process"
#   e2e-test-images/httpd:2.4.39-4     a server on :80 that logs a line naming httpd
#   e2e-test-images/nonewprivs:1.3     entrypoint: a setuid-root program printing its euid
#   k8s-staging-cri-tools/hostnet-nginx-<arch>   the nginx stand-in on :12003
#   k8s-staging-cri-tools/test-image-*           busybox plus one marker file, or a USER
# Not reproducible: test-image-digest@sha256:9700f9… names upstream's exact manifest bytes.
set -euo pipefail

REGISTRY=${1:?usage: images.sh HOST:PORT WORKDIR}
WORK=${2:?usage: images.sh HOST:PORT WORKDIR}
BUSYBOX=/bin/busybox
case $(uname -m) in
  x86_64) ARCH=amd64 ;;
  aarch64) ARCH=arm64 ;;
  *) ARCH=$(uname -m) ;;
esac
ENV_PATH="PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
OCI_MANIFEST=application/vnd.oci.image.manifest.v1+json
OCI_CONFIG=application/vnd.oci.image.config.v1+json
OCI_LAYER=application/vnd.oci.image.layer.v1.tar+gzip

mkdir -p "$WORK/blobs"

sha() { sha256sum "$1" | cut -d' ' -f1; }

# layer NAME: packs $WORK/rootfs/NAME into a deterministic gzip'd tar in blobs/ and prints
# "<blob digest> <diff id> <size>".
layer() {
  local dir="$WORK/rootfs/$1" tar="$WORK/$1.tar" digest
  (cd "$dir" && find . -mindepth 1 -printf '%P\n' | LC_ALL=C sort |
    tar --no-recursion --mtime=@0 --owner=0 --group=0 --numeric-owner --format=gnu -cf "$tar" -T -)
  gzip -n -c "$tar" >"$tar.gz"
  digest=$(sha "$tar.gz")
  mv "$tar.gz" "$WORK/blobs/$digest"
  echo "sha256:$digest sha256:$(sha "$tar") $(stat -c %s "$WORK/blobs/$digest")"
  rm -f "$tar"
}

# json_array WORD...: a JSON array of strings (the words hold no quotes or backslashes).
json_array() {
  local out="" w
  for w in "$@"; do out+="${out:+,}\"$w\""; done
  echo "[$out]"
}

# cmd WORD...: the image config's "Cmd" member.
cmd() { echo "\"Cmd\":$(json_array "$@")"; }

# base: busybox with every applet hard-linked in /bin, as in the busybox images (a masked
# /bin/ls must not mask busybox itself), the users and groups of busybox:1.37.0, and small
# scripts for the applets Debian's build lacks (ipcs, pgrep).
build_base() {
  local root="$WORK/rootfs/base" applet
  rm -rf "$root"
  mkdir -p "$root"/{bin,etc,root,home,tmp,dev,proc,sys,usr/bin,usr/sbin,var/run,var/www}
  chmod 1777 "$root/tmp"
  chmod 0700 "$root/root"
  cp "$BUSYBOX" "$root/bin/busybox"
  chmod 0755 "$root/bin/busybox"
  for applet in $("$BUSYBOX" --list); do
    case $applet in busybox | */*) continue ;; esac
    ln "$root/bin/busybox" "$root/bin/$applet"
  done
  cat >"$root/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/bin/sh
daemon:x:1:1:daemon:/usr/sbin:/bin/false
bin:x:2:2:bin:/bin:/bin/false
sys:x:3:3:sys:/dev:/bin/false
sync:x:4:100:sync:/bin:/bin/sync
mail:x:8:8:mail:/var/spool/mail:/bin/false
www-data:x:33:33:www-data:/var/www:/bin/false
operator:x:37:37:Operator:/var:/bin/false
nobody:x:65534:65534:nobody:/home:/bin/false
EOF
  cat >"$root/etc/group" <<'EOF'
root:x:0:
daemon:x:1:
bin:x:2:
sys:x:3:
adm:x:4:
tty:x:5:
disk:x:6:
wheel:x:10:root
mail:x:8:
www-data:x:33:
operator:x:37:
staff:x:50:
users:x:100:
nogroup:x:65534:
EOF
  # ipcs -m: the shared memory segments of this IPC namespace, from /proc.
  [ -e "$root/bin/ipcs" ] || cat >"$root/bin/ipcs" <<'EOF'
#!/bin/sh
echo "------ Shared Memory Segments --------"
echo "key        shmid      owner      perms      bytes      nattch"
tail -n +2 /proc/sysvipc/shm | while read -r key shmid perms size _ _ nattch uid _; do
  printf '%-10s %-10s %-10s %-10s %-10s %-10s\n' "$key" "$shmid" "$uid" "$perms" "$size" "$nattch"
done
EOF
  # pgrep PATTERN: PIDs whose command name contains PATTERN.
  [ -e "$root/bin/pgrep" ] || cat >"$root/bin/pgrep" <<'EOF'
#!/bin/sh
found=1
for d in /proc/[0-9]*; do
  read -r comm <"$d/comm" 2>/dev/null || continue
  case $comm in *"$1"*) echo "${d#/proc/}"; found=0 ;; esac
done
exit $found
EOF
  chmod 0755 "$root/bin/ipcs" "$root/bin/pgrep"
  BASE_LAYER=$(layer base)
}

# nginx_layer NAME PORT: the nginx stand-in. /usr/sbin/nginx is a script, so its process's
# command name is "nginx" (pidof finds it); it re-executes itself once with "master process"
# in its arguments, as nginx retitles its master; it writes its PID where nginx does and
# serves /usr/share/nginx/html with busybox httpd until SIGTERM.
nginx_layer() {
  local root="$WORK/rootfs/$1"
  rm -rf "$root"
  mkdir -p "$root/usr/sbin" "$root/usr/share/nginx/html"
  cat >"$root/usr/sbin/nginx" <<EOF
#!/bin/sh
[ "\$1" = "master process" ] || exec /usr/sbin/nginx "master process" "\$@"
echo \$\$ >/var/run/nginx.pid
httpd -f -p $2 -h /usr/share/nginx/html &
server=\$!
trap 'kill \$server; exit 0' TERM INT QUIT
wait
EOF
  chmod 0755 "$root/usr/sbin/nginx"
  echo "<html><body><h1>Welcome to nginx!</h1></body></html>" >"$root/usr/share/nginx/html/index.html"
  layer "$1"
}

# nnp_layer: /usr/local/bin/nnp, setuid root, printing "Effective uid: <euid>" like
# kubernetes/test/images/nonewprivs; built with Go (no busybox applet keeps a setuid euid).
nnp_layer() {
  local root="$WORK/rootfs/nnp" src="$WORK/nnp-src"
  rm -rf "$root" "$src"
  mkdir -p "$root/usr/local/bin" "$src"
  printf '%s\n' 'package main' 'import ("fmt"; "os")' \
    'func main() { fmt.Printf("Effective uid: %d\n", os.Geteuid()) }' >"$src/main.go"
  (cd "$src" && CGO_ENABLED=0 GOFLAGS=-buildvcs=false go build -trimpath -ldflags=-s -o "$root/usr/local/bin/nnp" main.go)
  chmod 4755 "$root/usr/local/bin/nnp"
  layer nnp
}

# file_layer NAME FILE: one empty marker file at /FILE, as upstream's image-test Dockerfile.
file_layer() {
  local root="$WORK/rootfs/$1"
  rm -rf "$root"
  mkdir -p "$root"
  : >"$root/$2"
  layer "$1"
}

# push_blob REPO DIGEST: uploads blobs/<hex> unless the repository has it.
push_blob() {
  local repo=$1 digest=$2 location
  if curl -fsS -o /dev/null -I "http://$REGISTRY/v2/$repo/blobs/$digest" 2>/dev/null; then
    return 0
  fi
  location=$(curl -fsS -o /dev/null -D - -X POST "http://$REGISTRY/v2/$repo/blobs/uploads/" |
    tr -d '\r' | sed -n 's/^[Ll]ocation: //p')
  case $location in http*) ;; *) location="http://$REGISTRY$location" ;; esac
  case $location in *\?*) location+="&" ;; *) location+="?" ;; esac
  curl -fsS -o /dev/null -X PUT -H "Content-Type: application/octet-stream" \
    --data-binary "@$WORK/blobs/${digest#sha256:}" "${location}digest=$digest"
}

# image REPO TAGS PROCESS USER LAYER...: writes the config and manifest and pushes them under
# each of the comma-separated TAGS. PROCESS is the config's "Cmd" and/or "Entrypoint" members;
# each LAYER is "<digest> <diff id> <size>".
image() {
  local repo=$1 tags=$2 cmd=$3 user=$4 diff_ids="" layers="" l digest diff size cfg cfg_digest manifest tag
  shift 4
  for l in "$@"; do
    read -r digest diff size <<<"$l"
    diff_ids+="${diff_ids:+,}\"$diff\""
    layers+="${layers:+,}{\"mediaType\":\"$OCI_LAYER\",\"digest\":\"$digest\",\"size\":$size}"
    push_blob "$repo" "$digest"
  done
  cfg="$WORK/config.json"
  printf '{"architecture":"%s","os":"linux","config":{"User":"%s","Env":["%s"],%s},"rootfs":{"type":"layers","diff_ids":[%s]}}' \
    "$ARCH" "$user" "$ENV_PATH" "$cmd" "$diff_ids" >"$cfg"
  cfg_digest=$(sha "$cfg")
  mv "$cfg" "$WORK/blobs/$cfg_digest"
  push_blob "$repo" "sha256:$cfg_digest"
  manifest=$(printf '{"schemaVersion":2,"mediaType":"%s","config":{"mediaType":"%s","digest":"sha256:%s","size":%s},"layers":[%s]}' \
    "$OCI_MANIFEST" "$OCI_CONFIG" "$cfg_digest" "$(stat -c %s "$WORK/blobs/$cfg_digest")" "$layers")
  for tag in ${tags//,/ }; do
    curl -fsS -o /dev/null -X PUT -H "Content-Type: $OCI_MANIFEST" --data-binary "$manifest" \
      "http://$REGISTRY/v2/$repo/manifests/$tag"
  done
  echo "pushed $repo:$tags"
}

build_base
E2E=e2e-test-images
CRI=k8s-staging-cri-tools
SH=$(cmd sh)

image "$E2E/busybox" 1.29-2 "$SH" "" "$BASE_LAYER"
image "$E2E/nginx" 1.14-2 "$(cmd nginx -g "daemon off;")" "" "$BASE_LAYER" "$(nginx_layer nginx 80)"
image "$CRI/hostnet-nginx-$ARCH" latest "$(cmd nginx -g "daemon off;")" "" "$BASE_LAYER" "$(nginx_layer hostnet-nginx 12003)"
image "$E2E/nonewprivs" 1.3 '"Entrypoint":["/usr/local/bin/nnp"]' "" "$BASE_LAYER" "$(nnp_layer)"
# Apache's startup warning names httpd on stderr; critest looks for "httpd" in the log.
mkdir -p "$WORK/rootfs/htdocs/usr/local/apache2/htdocs" "$WORK/rootfs/htdocs/usr/local/bin"
echo "<html><body><h1>It works!</h1></body></html>" >"$WORK/rootfs/htdocs/usr/local/apache2/htdocs/index.html"
printf '%s\n' '#!/bin/sh' 'echo "AH00558: httpd: busybox httpd stand-in serving on port 80" >&2' \
  'exec httpd -f -p 80 -h /usr/local/apache2/htdocs' >"$WORK/rootfs/htdocs/usr/local/bin/httpd-foreground"
chmod 0755 "$WORK/rootfs/htdocs/usr/local/bin/httpd-foreground"
image "$E2E/httpd" 2.4.39-4 "$(cmd httpd-foreground)" "" "$BASE_LAYER" "$(layer htdocs)"

# USER images (images/image-user, images/image-predefined-group).
image "$CRI/test-image-user-uid" latest "$SH" 1002 "$BASE_LAYER"
image "$CRI/test-image-user-username" latest "$SH" www-data "$BASE_LAYER"
image "$CRI/test-image-user-uid-group" latest "$SH" 1003:1004 "$BASE_LAYER"
image "$CRI/test-image-user-username-group" latest "$SH" www-data:1004 "$BASE_LAYER"
mkdir -p "$WORK/rootfs/predefined/etc" "$WORK/rootfs/predefined/home/default-user"
cp "$WORK/rootfs/base/etc/passwd" "$WORK/rootfs/base/etc/group" "$WORK/rootfs/predefined/etc/"
echo "default-user:x:1000:1000:Linux User,,,:/home/default-user:/bin/sh" >>"$WORK/rootfs/predefined/etc/passwd"
printf '%s\n' "default-user:x:1000:" "group-defined-in-image:x:50000:default-user" >>"$WORK/rootfs/predefined/etc/group"
image "$CRI/test-image-predefined-group" latest "$SH" 1000 "$BASE_LAYER" "$(layer predefined)"

# Marker-file images (images/image-test): distinct images, and one image under several tags.
for name in test-image-1 test-image-2 test-image-3 test-image-latest test-image-digest; do
  image "$CRI/$name" latest "$SH" "" "$BASE_LAYER" "$(file_layer "$name" "$name")"
done
image "$CRI/test-image-tags" 1,2,3 "$SH" "" "$BASE_LAYER" "$(file_layer same-image same-image)"
image "$CRI/test-image-tag" test "$SH" "" "$BASE_LAYER" "$(file_layer tag-test test)"
image "$CRI/test-image-tag" all "$SH" "" "$BASE_LAYER" "$(file_layer tag-all all)"
