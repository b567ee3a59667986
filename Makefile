# Entry points for people who knew the original HPK. CI runs `make ci`'s script directly.
CARGO ?= cargo
BINARIES := hpk hpk-cert-signer hpk-pod-runtime hpk-pause hpk-net-forwarder hpk-kubelet hpk-testcluster

HPK_CACHE_DIR ?= $(HOME)/.cache/hpk
# The architecture of the images and the bundle: amd64 (this machine's), or arm64, whose
# binaries are all cross-built for aarch64-unknown-linux-musl (.cargo/config.toml) and whose
# images and bundle are named apart: target/images-arm64, target/dist/hpk-<version>-arm64.tar.gz.
ARCH ?= amd64
# `make dist` packs the release build; `make dist PROFILE=debug` the debug build the tests run
# (its image from `make images`), which the Slurm suite submits from.
PROFILE ?= release
PROFILE_DIR := $(if $(filter release,$(PROFILE)),release,debug)
# Our binaries in the bubble image (hpk-testcluster is not), for the arm64 build.
IMAGE_BINARIES := hpk hpk-kubelet hpk-pod-runtime hpk-pause hpk-net-forwarder hpk-cert-signer
ifeq ($(ARCH),amd64)
CONTROLPLANE ?= $(HPK_CACHE_DIR)/controlplane/bin/hpk-controlplane
# scripts/setup.sh builds the amd64 control plane.
CONTROLPLANE_TARGET :=
IMAGE_BIN_DIR ?= target/debug
IMAGES_DIR ?= target/images
# The images of the release binaries, for the lab and the release bundle; kept apart from
# target/images, which the tests run.
RELEASE_IMAGES_DIR ?= target/release/images
# bin/hpk of the bundle: statically linked (musl), so it starts on any Linux (RHEL 8's glibc
# 2.28 and older included).
STATIC_TARGET ?= x86_64-unknown-linux-musl
# The bundle's hpk alone for x86_64-unknown-linux-musl; the images are of the glibc build.
DIST_HPK_TARGET := static-hpk
else ifeq ($(ARCH),arm64)
CONTROLPLANE_BIN_DIR := $(HPK_CACHE_DIR)/controlplane-arm64/bin
CONTROLPLANE ?= $(CONTROLPLANE_BIN_DIR)/hpk-controlplane
CONTROLPLANE_TARGET := controlplane-arm64
STATIC_TARGET ?= aarch64-unknown-linux-musl
IMAGE_BIN_DIR ?= target/$(STATIC_TARGET)/debug
IMAGES_DIR ?= target/images-arm64
RELEASE_IMAGES_DIR ?= target/release/images-arm64
# Every arm64 binary, the bundle's hpk included, comes from one cargo build (cross-binaries).
DIST_HPK_TARGET := cross-binaries
else
$(error ARCH=$(ARCH): amd64 or arm64)
endif
# The images of PROFILE's build, which `make dist` packs: amd64's debug ones are those the tests
# run (from `make images`); arm64's are built by cross-images.
ifeq ($(PROFILE),release)
PROFILE_IMAGES_DIR := $(RELEASE_IMAGES_DIR)
DIST_IMAGE_TARGET := $(if $(filter arm64,$(ARCH)),cross-images,release-images)
CARGO_PROFILE_FLAG := --release
else
PROFILE_IMAGES_DIR := $(IMAGES_DIR)
DIST_IMAGE_TARGET := $(if $(filter arm64,$(ARCH)),cross-images,)
CARGO_PROFILE_FLAG :=
endif
DIST_IMAGE := $(PROFILE_IMAGES_DIR)/hpk-bubble.oci.tar

.PHONY: all build binaries cross-binaries controlplane-arm64 images cross-images release-images static-hpk develop dist push test test-unit ci bench conformance clean

all: build

build:
	$(CARGO) build --workspace --locked

binaries:
	$(CARGO) build --workspace --release --locked
	mkdir -p bin
	for b in $(BINARIES); do install -m 0755 target/release/$$b bin/; done

# The binaries of the arm64 images and bundle, for aarch64-unknown-linux-musl (ARCH=arm64),
# of PROFILE: target/aarch64-unknown-linux-musl/<profile>/.
cross-binaries:
	$(CARGO) build --workspace --locked --target $(STATIC_TARGET) $(CARGO_PROFILE_FLAG) \
	  $(addprefix --bin ,$(IMAGE_BINARIES))

# The arm64 control plane: a no-op when it is up to date (a cold build takes minutes).
controlplane-arm64:
	GOARCH=arm64 integration/controlplane/build.sh $(CONTROLPLANE_BIN_DIR)

# hpk-bubble and hpk-pause as OCI layouts (and oci-archives for apptainer) from the debug
# binaries, without Docker: run `cargo build --workspace --bins` first (ARCH=arm64: `make
# cross-binaries ARCH=arm64 PROFILE=debug`). The bubble's Debian base is built once, as root,
# and cached; see images/README.md.
images: $(CONTROLPLANE_TARGET)
	images/build.sh bubble --arch $(ARCH) --bin-dir $(IMAGE_BIN_DIR) --controlplane $(CONTROLPLANE) \
	  --out $(IMAGES_DIR)/hpk-bubble --archive $(IMAGES_DIR)/hpk-bubble.oci.tar
	images/build.sh pause --arch $(ARCH) --bin-dir $(IMAGE_BIN_DIR) \
	  --out $(IMAGES_DIR)/hpk-pause --archive $(IMAGES_DIR)/hpk-pause.oci.tar

# ARCH=arm64: the images of PROFILE's binaries, cross-built first, into target/images-arm64
# (debug) or target/release/images-arm64 (release).
cross-images: cross-binaries
	$(MAKE) images ARCH=$(ARCH) IMAGE_BIN_DIR=target/$(STATIC_TARGET)/$(PROFILE_DIR) \
	  IMAGES_DIR=$(PROFILE_IMAGES_DIR)

ifeq ($(ARCH),amd64)
release-images: binaries
	$(MAKE) images IMAGE_BIN_DIR=target/release IMAGES_DIR=$(RELEASE_IMAGES_DIR)
else
release-images:
	$(MAKE) cross-images ARCH=$(ARCH) PROFILE=release
endif

# The development loop with the Vagrant lab (vagrant/README.md): build, then copy bin/hpk, the
# bubble and slurm/hpk.slurm into ~/hpk-dev of the lab's user. The lab must be up.
develop: release-images
	vagrant/develop.sh --bin-dir bin --image $(RELEASE_IMAGES_DIR)/hpk-bubble.oci.tar

# The launcher as one static binary: target/$(STATIC_TARGET)/<profile>/hpk (ARCH=arm64: use
# cross-binaries, whose build of it the bundle takes).
static-hpk:
	$(CARGO) build -p hpk --locked --target $(STATIC_TARGET) $(CARGO_PROFILE_FLAG)

# What a user copies to a cluster: target/dist/hpk-<version>.tar.gz (scripts/dist.sh): the
# static bin/hpk, the bubble image (which carries crun and slirp4netns for the host side too),
# slurm/hpk.slurm and a README. ARCH=arm64: hpk-<version>-arm64.tar.gz, everything cross-built.
dist: $(DIST_HPK_TARGET) $(DIST_IMAGE_TARGET)
	scripts/dist.sh --arch $(ARCH) --hpk target/$(STATIC_TARGET)/$(PROFILE_DIR)/hpk \
	  --image $(DIST_IMAGE) --out target/dist

# `make images push REGISTRY=host[:port]/path [TAG=…] [PLAIN_HTTP=1]`: hpk-bubble and hpk-pause
# pushed as REGISTRY/hpk-bubble:TAG and REGISTRY/hpk-pause:TAG, each one OCI image index of
# the amd64 images (target/images, from `make images`) and the arm64 ones (target/images-arm64,
# built here with `make cross-images ARCH=arm64 PROFILE=debug`), by `hpk image push`, without
# Docker. Credentials: REGISTRY_AUTH_FILE or ~/.docker/config.json. Plain HTTP only with
# PLAIN_HTTP=1 (and credentials over it only to this machine).
REGISTRY ?=
TAG ?= $(shell sed -n '/^\[workspace\.package\]/,/^\[/s/^version = "\(.*\)"$$/\1/p' Cargo.toml)
push:
	@test -n "$(REGISTRY)" || { echo "make push: say where, e.g. REGISTRY=registry.example.org/hpk" >&2; exit 2; }
	@test -f target/images/hpk-bubble/index.json || { echo "make push: no amd64 images: run make images push" >&2; exit 2; }
	$(MAKE) cross-images ARCH=arm64 PROFILE=debug
	$(CARGO) build -p hpk --locked
	for image in hpk-bubble hpk-pause; do \
	  target/debug/hpk image push $(if $(PLAIN_HTTP),--plain-http) --to $(REGISTRY)/$$image:$(TAG) \
	    target/images/$$image target/images-arm64/$$image || exit 1; \
	done

test:
	$(CARGO) test --workspace --locked

# Every unit test and doc test, no cluster (CI's first test stage): scripts/test-unit.sh.
test-unit:
	scripts/test-unit.sh

ci:
	scripts/test.sh

bench:
	$(CARGO) bench -p hpk-cert-signer --bench signing

# Upstream's e2e conformance suite against `hpk up --nodes 2`, or with --cluster slurm against
# `sbatch --nodes=3 slurm/hpk.slurm` on a real Slurm (docs/conformance.md); as root.
# CONFORMANCE_ARGS, e.g. --focus '\[sig-node\].*\[Conformance\]' --known-failures FILE.
conformance:
	scripts/conformance.sh $(CONFORMANCE_ARGS)

clean:
	$(CARGO) clean
	rm -rf bin
