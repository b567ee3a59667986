#!/usr/bin/env bash
# Builds stand-ins for the images the conformance specs of the e2e suite pull, without Docker,
# and pushes them to a registry speaking plain HTTP; writes the KUBE_TEST_REPO_LIST file that
# points the suite at it. Layers are deterministic tars of Debian's busybox-static, bash-static,
# agnhost built from the release's Go modules (build.sh) and imagetools (sh, curl, nc, dig,
# getent, nnp).
#
#   images.sh REGISTRY(host:port) WORKDIR BINDIR PAUSE-OCI-LAYOUT REPO-LIST-OUT ETCD
#
# ETCD: an etcd binary, or one that runs etcd when called by that name (the control plane's
# hpk-controlplane).
#
# Images (v1.35.4 tags; registry.k8s.io/e2e-test-images/… unless noted), what upstream's are
# and what the stand-in keeps of them (see docs/conformance.md):
#   agnhost:2.59, 2.55   Alpine + agnhost: Entrypoint /agnhost, Cmd pause, ports 80 8080 8081
#                        9376 5000, /agnhost-2 link, /uploads, porter's localhost.crt/.key,
#                        user 1000 (home owned 1000:1000) in group 50000
#   busybox:1.37.0-1     Cmd sh (ash, or bash for odd variable names: see build_base)
#   nginx:1.14-4, 1.15-4 Cmd nginx -g "daemon off;", port 80, /usr/share/nginx/html/index.html
#   nonewprivs:1.3       Cmd nnp: a setuid-root program printing its effective UID
#   nonroot:1.4          busybox with User 1234
#   jessie-dnsutils:1.7  Debian with dig: busybox + imagetools here
#   kitten:1.7, nautilus:1.7   agnhost with Cmd test-webserver and upstream's picture, data.json
#   registry.k8s.io/pause:3.10.1   hpk-pause (Entrypoint /usr/local/bin/hpk-pause)
#   sample-apiserver:1.29.2   Entrypoint /sample-apiserver: the release's k8s.io/sample-apiserver
#                        (build.sh), on the busybox base
#   registry.k8s.io/etcd:3.6.6-0   /usr/local/bin/etcd: ETCD (the control plane's etcd, 3.6.5),
#                        on the busybox base
set -euo pipefail

usage="usage: images.sh REGISTRY WORKDIR BINDIR PAUSE-OCI-LAYOUT REPO-LIST-OUT ETCD"
REGISTRY=${1:?$usage}
WORK=${2:?$usage}
BIN=${3:?$usage}
PAUSE_LAYOUT=${4:?$usage}
REPO_LIST=${5:?$usage}
ETCD=${6:?$usage}
BUSYBOX=/bin/busybox
BASH_STATIC=/bin/bash-static
case $(uname -m) in
  x86_64) ARCH=amd64 ;;
  aarch64) ARCH=arm64 ;;
  *) ARCH=$(uname -m) ;;
esac
ENV_PATH="PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
OCI_LAYER=application/vnd.oci.image.layer.v1.tar+gzip
E2E=e2e-test-images
K8S_MOD=$(cd "$(dirname "${BASH_SOURCE[0]}")" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)

for f in "$BUSYBOX" "$BASH_STATIC" "$BIN/agnhost" "$BIN/imagetools" "$BIN/sample-apiserver" \
  "$PAUSE_LAYOUT/index.json" "$ETCD"; do
  [ -e "$f" ] || { echo "images.sh: $f missing (apt busybox-static bash-static, integration/e2e/build.sh, make images)" >&2; exit 2; }
done
[ "$(id -u)" -eq 0 ] || { echo "images.sh: needs root (files owned by the images' users)" >&2; exit 2; }
mkdir -p "$WORK/blobs"

sha() { sha256sum "$1" | cut -d' ' -f1; }

# layer NAME: packs $WORK/rootfs/NAME (owners as they are there) into a deterministic gzip'd
# tar in blobs/ and prints "<blob digest> <diff id> <size>".
layer() {
  local dir="$WORK/rootfs/$1" tar="$WORK/$1.tar" digest
  (cd "$dir" && find . -mindepth 1 -printf '%P\n' | LC_ALL=C sort |
    tar --no-recursion --mtime=@0 --numeric-owner --format=gnu -cf "$tar" -T -)
  gzip -n -c "$tar" >"$tar.gz"
  digest=$(sha "$tar.gz")
  mv "$tar.gz" "$WORK/blobs/$digest"
  echo "sha256:$digest sha256:$(sha "$tar") $(stat -c %s "$WORK/blobs/$digest")"
  rm -f "$tar"
}

# fresh NAME: an empty root for layer NAME, printed.
fresh() {
  rm -rf "$WORK/rootfs/$1"
  mkdir -p "$WORK/rootfs/$1"
  echo "$WORK/rootfs/$1"
}

# without_nc_applet BUSYBOX: renames the nc applet to nb in place. Debian builds busybox with
# FEATURE_SH_STANDALONE: its sh runs an applet of a command's name before searching PATH, so
# `sh -c 'nc -v -t ...'` would reach busybox's nc, which lacks the flags the specs pass, never
# imagetools' nc. The applet names are one sorted NUL-separated list (binary-searched):
# "nb" keeps "nameif" < "nb" < "netstat".
without_nc_applet() {
  local bb=$1 offset
  offset=$(LC_ALL=C grep -obUaP '\x00nameif\x00nc\x00netstat\x00' "$bb" | cut -d: -f1)
  [[ $offset =~ ^[0-9]+$ ]] || { echo "images.sh: $bb: no unique nc applet name to rename" >&2; exit 2; }
  printf 'b' | dd of="$bb" bs=1 seek=$((offset + 9)) conv=notrunc status=none
  if "$bb" --list | grep -qx nc; then echo "images.sh: $bb still has an nc applet" >&2; exit 2; fi
}

# base: busybox (without its nc applet) with every applet hard-linked in /bin, bash-static, the
# users and groups of the busybox image, and imagetools as /bin/sh and curl, nc, dig, getent.
build_base() {
  local root applet t
  root=$(fresh base)
  mkdir -p "$root"/{bin,etc,root,home,tmp,dev,proc,sys,usr/bin,usr/local/bin,var/run}
  chmod 1777 "$root/tmp"
  chmod 0700 "$root/root"
  install -m 0755 "$BUSYBOX" "$root/bin/busybox"
  without_nc_applet "$root/bin/busybox"
  for applet in $("$root/bin/busybox" --list); do
    case $applet in busybox | */*) continue ;; esac
    ln "$root/bin/busybox" "$root/bin/$applet"
  done
  # bash is bash-static; sh is imagetools' sh, which runs bash when the environment holds a
  # name that is not a shell identifier and busybox ash otherwise (imagetools/sh.go): ash
  # drops such variables (a ConfigMap key `data-1`) before it runs a command, in Debian's 1.35
  # and 1.37 alike, and the ConfigMap and Secret env specs look for them in `sh -c env`;
  # other specs expect ash's own error messages.
  rm -f "$root/bin/sh" "$root/bin/bash"
  install -m 0755 "$BASH_STATIC" "$root/bin/bash"
  install -m 0755 "$BIN/imagetools" "$root/usr/bin/imagetools"
  ln "$root/usr/bin/imagetools" "$root/bin/sh"
  for t in curl nc dig getent; do ln "$root/usr/bin/imagetools" "$root/usr/bin/$t"; done
  cat >"$root/etc/passwd" <<'PASSWD'
root:x:0:0:root:/root:/bin/sh
daemon:x:1:1:daemon:/usr/sbin:/bin/false
bin:x:2:2:bin:/bin:/bin/false
sys:x:3:3:sys:/dev:/bin/false
sync:x:4:100:sync:/bin:/bin/sync
mail:x:8:8:mail:/var/spool/mail:/bin/false
www-data:x:33:33:www-data:/var/www:/bin/false
operator:x:37:37:Operator:/var:/bin/false
nobody:x:65534:65534:nobody:/home:/bin/false
PASSWD
  cat >"$root/etc/group" <<'GROUP'
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
GROUP
  printf 'hosts: files dns\n' >"$root/etc/nsswitch.conf"
  BASE_LAYER=$(layer base)
}

# agnhost layer: the binary, its extras, and the user and group the SupplementalGroups specs
# expect from the image (uid 1000 in gid 50000; in the base's files, so the layer rewrites
# /etc/passwd and /etc/group whole).
build_agnhost() {
  local root
  root=$(fresh agnhost)
  mkdir -p "$root/etc" "$root/uploads" "$root/home/user-defined-in-image"
  install -m 0755 "$BIN/agnhost" "$root/agnhost"
  ln -s agnhost "$root/agnhost-2"
  install -m 0644 "$K8S_MOD/test/images/agnhost/porter/localhost.crt" "$root/localhost.crt"
  install -m 0600 "$K8S_MOD/test/images/agnhost/porter/localhost.key" "$root/localhost.key"
  cp "$WORK/rootfs/base/etc/passwd" "$WORK/rootfs/base/etc/group" "$root/etc/"
  echo 'user-defined-in-image:x:1000:1000:Linux User,,,:/home/user-defined-in-image:/bin/sh' >>"$root/etc/passwd"
  printf '%s\n' 'user-defined-in-image:x:1000:' 'group-defined-in-image:x:50000:user-defined-in-image' >>"$root/etc/group"
  chmod 0644 "$root/etc/passwd" "$root/etc/group"
  chown 1000:1000 "$root/home/user-defined-in-image"
  chmod 2755 "$root/home/user-defined-in-image"
  AGNHOST_LAYER=$(layer agnhost)
}

# web NAME: the files test-webserver serves in kitten or nautilus, upstream's own (the release's
# module holds them: test/images/NAME/html).
build_web() {
  local root
  root=$(fresh "$1")
  install -m 0644 "$K8S_MOD/test/images/$1/html/$1.jpg" "$K8S_MOD/test/images/$1/html/data.json" "$root/"
  layer "$1"
}

# nginx: /usr/sbin/nginx a script serving /usr/share/nginx/html on :80 with busybox httpd;
# its process keeps the name nginx and writes /var/run/nginx.pid.
build_nginx() {
  local root
  root=$(fresh nginx)
  mkdir -p "$root/usr/sbin" "$root/usr/share/nginx/html" "$root/var/run" "$root/etc/nginx"
  cat >"$root/usr/sbin/nginx" <<'NGINX'
#!/bin/sh
# e2e stand-in of nginx: ignores its arguments (-g "daemon off;"), serves the html root.
echo $$ >/var/run/nginx.pid
httpd -f -p 80 -h /usr/share/nginx/html &
server=$!
trap 'kill $server; exit 0' TERM INT QUIT
wait
NGINX
  chmod 0755 "$root/usr/sbin/nginx"
  echo "<html><body><h1>Welcome to nginx!</h1></body></html>" >"$root/usr/share/nginx/html/index.html"
  NGINX_LAYER=$(layer nginx)
}

build_nnp() {
  local root
  root=$(fresh nnp)
  mkdir -p "$root/usr/local/bin"
  install -m 4755 "$BIN/imagetools" "$root/usr/local/bin/nnp"
  NNP_LAYER=$(layer nnp)
}

# one_binary NAME SOURCE PATH: a layer of SOURCE alone, at PATH in the image.
one_binary() {
  local root
  root=$(fresh "$1")
  mkdir -p "$root/$(dirname "$3")"
  install -m 0755 "$2" "$root/$3"
  layer "$1"
}

# push_blob REPO FILE DIGEST: uploads FILE unless the repository has DIGEST.
push_blob() {
  local repo=$1 file=$2 digest=$3 location
  if curl -fsS -o /dev/null -I "http://$REGISTRY/v2/$repo/blobs/$digest" 2>/dev/null; then
    return 0
  fi
  location=$(curl -fsS -o /dev/null -D - -X POST "http://$REGISTRY/v2/$repo/blobs/uploads/" |
    tr -d '\r' | sed -n 's/^[Ll]ocation: //p')
  case $location in http*) ;; *) location="http://$REGISTRY$location" ;; esac
  case $location in *\?*) location+="&" ;; *) location+="?" ;; esac
  curl -fsS -o /dev/null -X PUT -H "Content-Type: application/octet-stream" \
    --data-binary "@$file" "${location}digest=$digest"
}

# push_manifest REPO TAG FILE MEDIATYPE
push_manifest() {
  curl -fsS -o /dev/null -X PUT -H "Content-Type: $4" --data-binary "@$3" \
    "http://$REGISTRY/v2/$1/manifests/$2"
}

# image REPO TAGS CONFIG-JSON LAYER...: CONFIG-JSON is the image config's "config" object;
# pushes config and manifest under each of the comma-separated TAGS.
image() {
  local repo=$1 tags=$2 config=$3 diff_ids="" layers="" l digest diff size cfg cfg_digest manifest tag
  shift 3
  for l in "$@"; do
    read -r digest diff size <<<"$l"
    diff_ids+="${diff_ids:+,}\"$diff\""
    layers+="${layers:+,}{\"mediaType\":\"$OCI_LAYER\",\"digest\":\"$digest\",\"size\":$size}"
    push_blob "$repo" "$WORK/blobs/${digest#sha256:}" "$digest"
  done
  cfg="$WORK/config.json"
  jq -c --arg arch "$ARCH" --argjson diffs "[$diff_ids]" --arg path "$ENV_PATH" \
    '{architecture: $arch, os: "linux", config: ({Env: [$path]} + .), rootfs: {type: "layers", diff_ids: $diffs}}' \
    <<<"$config" >"$cfg"
  cfg_digest=sha256:$(sha "$cfg")
  push_blob "$repo" "$cfg" "$cfg_digest"
  manifest="$WORK/manifest.json"
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"%s","size":%s},"layers":[%s]}' \
    "$cfg_digest" "$(stat -c %s "$cfg")" "$layers" >"$manifest"
  for tag in ${tags//,/ }; do
    push_manifest "$repo" "$tag" "$manifest" application/vnd.oci.image.manifest.v1+json
  done
  echo "  $REGISTRY/$repo:{$tags}"
}

# push_layout LAYOUT REPO TAG: an OCI layout's first manifest, as it is.
push_layout() {
  local layout=$1 repo=$2 tag=$3 manifest blob
  manifest=$(jq -r '.manifests[0].digest' "$layout/index.json")
  for blob in $(jq -r '.config.digest, .layers[].digest' "$layout/blobs/sha256/${manifest#sha256:}"); do
    push_blob "$repo" "$layout/blobs/sha256/${blob#sha256:}" "$blob"
  done
  push_manifest "$repo" "$tag" "$layout/blobs/sha256/${manifest#sha256:}" \
    "$(jq -r '.manifests[0].mediaType' "$layout/index.json")"
  echo "  $REGISTRY/$repo:$tag (from $layout)"
}

curl -fsS -o /dev/null "http://$REGISTRY/v2/" || { echo "images.sh: no registry at http://$REGISTRY" >&2; exit 2; }
echo "images.sh: building and pushing the e2e stand-in images to $REGISTRY"
build_base
build_agnhost
build_nginx
build_nnp
agnhost_config='{"Entrypoint":["/agnhost"],"Cmd":["pause"],"WorkingDir":"/","ExposedPorts":{"80/tcp":{},"8080/tcp":{},"8081/tcp":{},"9376/tcp":{},"5000/tcp":{}}}'
image "$E2E/agnhost" 2.59,2.55 "$agnhost_config" "$BASE_LAYER" "$AGNHOST_LAYER"
image "$E2E/busybox" 1.37.0-1 '{"Cmd":["sh"]}' "$BASE_LAYER"
image "$E2E/jessie-dnsutils" 1.7 '{"Cmd":["sh"]}' "$BASE_LAYER"
image "$E2E/nonroot" 1.4 '{"Cmd":["sh"],"User":"1234"}' "$BASE_LAYER"
image "$E2E/nonewprivs" 1.3 '{"Cmd":["nnp"]}' "$BASE_LAYER" "$NNP_LAYER"
image "$E2E/nginx" 1.14-4,1.15-4 \
  '{"Cmd":["nginx","-g","daemon off;"],"ExposedPorts":{"80/tcp":{}},"StopSignal":"SIGTERM"}' \
  "$BASE_LAYER" "$NGINX_LAYER"
for web in kitten nautilus; do
  image "$E2E/$web" 1.7 "$(jq -c '.Cmd = ["test-webserver"]' <<<"$agnhost_config")" \
    "$BASE_LAYER" "$AGNHOST_LAYER" "$(build_web $web)"
done
push_layout "$PAUSE_LAYOUT" pause 3.10.1
# The Aggregator spec's deployment: the sample API server (its secure port, 443, is its default)
# beside etcd, which the spec starts as /usr/local/bin/etcd.
image "$E2E/sample-apiserver" 1.29.2 '{"Entrypoint":["/sample-apiserver"]}' \
  "$BASE_LAYER" "$(one_binary sample-apiserver "$BIN/sample-apiserver" sample-apiserver)"
image etcd 3.6.6-0 '{"Cmd":["/usr/local/bin/etcd"]}' \
  "$BASE_LAYER" "$(one_binary etcd "$(readlink -f "$ETCD")" usr/local/bin/etcd)"

# The registry keys of test/utils/image/manifest.go. Those left out keep upstream's value:
# invalidRegistry must stay unreachable, privateRegistry needs credentials we cannot have.
cat >"$REPO_LIST" <<LIST
promoterE2eRegistry: $REGISTRY/$E2E
buildImageRegistry: $REGISTRY/build-image
gcEtcdRegistry: $REGISTRY
gcRegistry: $REGISTRY
sigStorageRegistry: $REGISTRY/sig-storage
dockerLibraryRegistry: $REGISTRY/library
cloudProviderGcpRegistry: $REGISTRY/cloud-provider-gcp
LIST
echo "images.sh: KUBE_TEST_REPO_LIST=$REPO_LIST"
