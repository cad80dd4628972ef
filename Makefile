# Thin wrappers over cargo and scripts/. Every target that needs packages
# installs them itself (scripts/install-deps.sh is quick when they are there).
# Run as root: the tests and the demo create network namespaces.

CARGO ?= cargo
DEPS  := scripts/install-deps.sh
# The plugin that gets installed is linked statically: it runs on the host
# from /opt/cni/bin whatever the host's glibc, and starts ~0.35 ms faster
# (no dynamic loading), which matters for a program run once per ADD.
# A separate --target build keeps proc-macros (host artifacts) dynamic.
HOST   := $(shell rustc -vV | sed -n 's/^host: //p')
PLUGIN := target/$(HOST)/release/edgelink

.PHONY: all build release lint test test-unit test-e2e demo bench clean

all: build

build:
	$(CARGO) build --workspace

release:
	$(CARGO) build --release --workspace
	RUSTFLAGS="-C target-feature=+crt-static" $(CARGO) build --release -p edgelink --target $(HOST)

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

# Unit tests, kernel tests in namespaces, scenario tests driving the built
# plugin, then the end-to-end test with podman as the runtime.
test:
	$(DEPS) test
	$(CARGO) build --workspace
	$(CARGO) test --workspace --no-fail-fast
	tests/e2e/podman.sh target/debug/edgelink

test-unit:
	$(CARGO) test --workspace --lib --bins

test-e2e:
	$(DEPS) test
	$(CARGO) build -p edgelink
	tests/e2e/podman.sh target/debug/edgelink

# The main job on the built-in netns lab. KEEP=1 leaves the lab up.
demo:
	$(DEPS) demo
	$(MAKE) release
	EDGELINK_BIN=$(PLUGIN) KEEP=$(KEEP) scripts/demo.sh

# Side-by-side figures: the plugin against the reference plugins, the relay
# against socat, HAProxy and nginx.
# QUICK=1 runs one short round (CI).
bench:
	$(DEPS) test bench
	$(MAKE) release
	EDGELINK_BIN=$(PLUGIN) QUICK=$(QUICK) scripts/bench.sh

clean:
	$(CARGO) clean
