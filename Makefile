# Thin wrappers over cargo and scripts/. Every target that needs packages
# installs them itself (scripts/install-deps.sh is quick when they are there).
# Run as root: the tests and the demo create network namespaces.

CARGO ?= cargo
DEPS  := scripts/install-deps.sh

.PHONY: all build release lint test test-unit test-e2e demo bench clean

all: build

build:
	$(CARGO) build --workspace

release:
	$(CARGO) build --release --workspace

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
	$(CARGO) build --release --workspace
	KEEP=$(KEEP) scripts/demo.sh

# Side-by-side figures against the reference plugins (and, later, relays).
# QUICK=1 runs one short round (CI).
bench:
	$(DEPS) test bench
	$(CARGO) build --release --workspace
	QUICK=$(QUICK) scripts/bench.sh

clean:
	$(CARGO) clean
