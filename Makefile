# Entry points for people who knew the original HPK. CI runs `make ci`'s script directly.
CARGO ?= cargo
BINARIES := hpk hpk-cert-signer hpk-pod-runtime hpk-pause hpk-net-forwarder hpk-kubelet hpk-testcluster

HPK_CACHE_DIR ?= $(HOME)/.cache/hpk
CONTROLPLANE ?= $(HPK_CACHE_DIR)/controlplane/bin/hpk-controlplane
IMAGE_BIN_DIR ?= target/debug
IMAGES_DIR ?= target/images
# The images of the release binaries, for the lab and the release bundle; kept apart from
# target/images, which the tests run.
RELEASE_IMAGES_DIR ?= target/release/images
# `make dist` packs the release build; `make dist PROFILE=debug` the debug build the tests run
# (its image from `make images`), which the Slurm suite submits from.
PROFILE ?= release
# bin/hpk of the bundle: statically linked (musl), so it starts on any Linux (RHEL 8's glibc
# 2.28 and older included).
STATIC_TARGET ?= x86_64-unknown-linux-musl
ifeq ($(PROFILE),release)
DIST_IMAGE := $(RELEASE_IMAGES_DIR)/hpk-bubble.oci.tar
DIST_IMAGE_TARGET := release-images
CARGO_PROFILE_FLAG := --release
else
DIST_IMAGE := $(IMAGES_DIR)/hpk-bubble.oci.tar
DIST_IMAGE_TARGET :=
CARGO_PROFILE_FLAG :=
endif

.PHONY: all build binaries images release-images static-hpk develop dist test test-unit ci bench conformance clean

all: build

build:
	$(CARGO) build --workspace --locked

binaries:
	$(CARGO) build --workspace --release --locked
	mkdir -p bin
	for b in $(BINARIES); do install -m 0755 target/release/$$b bin/; done

# hpk-bubble and hpk-pause as OCI layouts (and oci-archives for apptainer) from the debug
# binaries, without Docker: run `cargo build --workspace --bins` first. The bubble's Debian base
# is built once, as root, and cached; see images/README.md.
images:
	images/build.sh bubble --bin-dir $(IMAGE_BIN_DIR) --controlplane $(CONTROLPLANE) \
	  --out $(IMAGES_DIR)/hpk-bubble --archive $(IMAGES_DIR)/hpk-bubble.oci.tar
	images/build.sh pause --bin-dir $(IMAGE_BIN_DIR) \
	  --out $(IMAGES_DIR)/hpk-pause --archive $(IMAGES_DIR)/hpk-pause.oci.tar

release-images: binaries
	$(MAKE) images IMAGE_BIN_DIR=target/release IMAGES_DIR=$(RELEASE_IMAGES_DIR)

# The development loop with the Vagrant lab (vagrant/README.md): build, then copy bin/hpk, the
# bubble and slurm/hpk.slurm into ~/hpk-dev of the lab's user. The lab must be up.
develop: release-images
	vagrant/develop.sh --bin-dir bin --image $(RELEASE_IMAGES_DIR)/hpk-bubble.oci.tar

# The launcher as one static binary: target/$(STATIC_TARGET)/<profile>/hpk.
static-hpk:
	$(CARGO) build -p hpk --locked --target $(STATIC_TARGET) $(CARGO_PROFILE_FLAG)

# What a user copies to a cluster: target/dist/hpk-<version>.tar.gz (scripts/dist.sh): the
# static bin/hpk, the bubble image (which carries crun and slirp4netns for the host side too),
# slurm/hpk.slurm and a README.
dist: static-hpk $(DIST_IMAGE_TARGET)
	scripts/dist.sh --hpk target/$(STATIC_TARGET)/$(if $(filter release,$(PROFILE)),release,debug)/hpk \
	  --image $(DIST_IMAGE) --out target/dist

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
