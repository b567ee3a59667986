# Entry points for people who knew the original HPK. CI runs `make ci`'s script directly.
CARGO ?= cargo
BINARIES := hpk hpk-cert-signer hpk-pod-runtime hpk-pause hpk-net-forwarder hpk-kubelet hpk-testcluster

HPK_CACHE_DIR ?= $(HOME)/.cache/hpk
CONTROLPLANE ?= $(HPK_CACHE_DIR)/controlplane/bin/hpk-controlplane
IMAGE_BIN_DIR ?= target/debug
IMAGES_DIR ?= target/images

.PHONY: all build binaries images test ci bench clean

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

test:
	$(CARGO) test --workspace --locked

ci:
	scripts/test.sh

bench:
	$(CARGO) bench -p hpk-cert-signer --bench signing

clean:
	$(CARGO) clean
	rm -rf bin
