# Entry points for people who knew the original HPK. CI runs `make ci`'s script directly.
CARGO ?= cargo
BINARIES := hpk-cert-signer hpk-pod-runtime hpk-pause hpk-net-forwarder hpk-kubelet hpk-testcluster

.PHONY: all build binaries test ci bench clean

all: build

build:
	$(CARGO) build --workspace --locked

binaries:
	$(CARGO) build --workspace --release --locked
	mkdir -p bin
	for b in $(BINARIES); do install -m 0755 target/release/$$b bin/; done

test:
	$(CARGO) test --workspace --locked

ci:
	scripts/test.sh

bench:
	$(CARGO) bench -p hpk-cert-signer --bench signing

clean:
	$(CARGO) clean
	rm -rf bin
