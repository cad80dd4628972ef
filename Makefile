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
# edgelinkd is built the same way (target/$(HOST)/release/edgelinkd); it
# resolves names (--status-webhook only) with glibc's built-in files and dns
# sources, which need no shared library at run time.
# `make image`: one image with both binaries (daemonset/Dockerfile), built by
# the first of docker, podman, buildah found unless CONTAINER_BUILDER is set.
VERSION           ?= $(shell sed -n 's/^version = "\(.*\)"$$/\1/p' Cargo.toml | head -n 1)
IMAGE             ?= edgelink:$(VERSION)
CONTAINER_BUILDER ?= $(notdir $(firstword $(foreach b,docker podman buildah,$(shell command -v $(b) 2>/dev/null))))

.PHONY: all build release static static-operator bench-bins bench-node bench-scale soak-bins image-offline lint lint-vagrant test test-unit test-e2e check-crds e2e-kube e2e-vagrant demo bench fuzz soak chaos image install-yaml clean

all: build

build:
	$(CARGO) build --workspace

# edgelink-operator builds in its own profile (static-operator), not with
# the release profile's LTO and single codegen unit, which cost minutes on
# kube-rs for a program off the data path.
release:
	$(CARGO) build --release --workspace --exclude edgelink-operator
	$(MAKE) static static-operator

# The two binaries that ship, linked statically: the plugin runs on the host,
# edgelinkd in an image with no libc (make image-offline).
static:
	RUSTFLAGS="-C target-feature=+crt-static" $(CARGO) build --release -p edgelink -p edgelinkd --target $(HOST)
	@for b in target/$(HOST)/release/edgelink target/$(HOST)/release/edgelinkd; do \
		if readelf -lW $$b | grep -q 'program interpreter'; then echo "$$b is dynamically linked" >&2; exit 1; fi; \
	done

# edgelink-operator, static too, for the same image. Its own profile (no
# LTO, parallel codegen): it is not on the data path, and the release
# profile's single codegen unit costs minutes on kube-rs.
static-operator:
	RUSTFLAGS="-C target-feature=+crt-static" $(CARGO) build --profile operator -p edgelink-operator --target $(HOST)
	@if readelf -lW target/$(HOST)/operator/edgelink-operator | grep -q 'program interpreter'; then \
		echo "edgelink-operator is dynamically linked" >&2; exit 1; fi

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) fmt --manifest-path fuzz/Cargo.toml -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	scripts/check-layout.py
	scripts/gen-install-yaml.sh --check

# Unit tests, kernel tests in namespaces, scenario tests driving the built
# plugin, the manifests against the code (YAML parses, NAD configs pass the
# plugin's validation, the DaemonSet mounts what the binaries use), the
# bench's pass/fail checks (scripts/bench/test_verdict.py), the soak's
# leak checks (scripts/soak/test_common.py), the offline
# image's archive (scripts/image/test_image_offline.py), the
# end-to-end test with podman as the runtime, then shellcheck on every
# script and vagrant validate (scripts/check-vagrant.sh).
test:
	$(DEPS) test
	$(CARGO) build --workspace
	$(CARGO) test --workspace --no-fail-fast
	python3 -m unittest discover -s scripts/bench -p 'test_*.py'
	python3 -m unittest discover -s scripts/soak -p 'test_*.py'
	$(MAKE) static static-operator
	python3 -m unittest discover -s scripts/image -p 'test_*.py'
	tests/e2e/podman.sh target/debug/edgelink
	$(MAKE) check-crds
	@if scripts/kube-lab.sh cached; then $(MAKE) e2e-kube; \
	else echo "make test: e2e-kube skipped: no kube lab cache on this machine (docs/kube-lab.md)"; fi
	scripts/check-vagrant.sh

# The operator's CRDs against real API servers (scripts/check-crds.sh,
# ~15 s each): the current profile's (CEL rules refuse bad objects) and
# the floor's (crds-1.20.yaml), each where its kube lab cache is.
check-crds:
	@for k in 1.36 1.20; do \
	  if KUBE=$$k scripts/kube-lab.sh cached 2>/dev/null; then scripts/check-crds.sh "$$(KUBE=$$k scripts/kube-lab.sh bindir)" || exit 1; \
	  else echo "make check-crds: KUBE=$$k skipped: no kube lab cache on this machine (docs/kube-lab.md)"; fi; \
	done

test-unit:
	$(CARGO) test --workspace --lib --bins

test-e2e:
	$(DEPS) test
	$(CARGO) build -p edgelink -p edgelinkd
	tests/e2e/podman.sh target/debug/edgelink

# The kube lab (docs/kube-lab.md): a real Kubernetes on this machine, inside
# namespaces of its own. KUBE=1.36 (the default): four nodes, containerd 2,
# Multus thick, CoreDNS; KUBE=1.20 (the floor): one node, Multus thin.
# daemonset/install.yaml and cni-conf/expose-a-device/ applied as
# documented, then edgelink-operator (daemonset/operator/); one PASS/FAIL
# line per check (1-10, X1-X2 on 1.36, O1-O12).
# Needs the profile's cache (/var/tmp/edgelink-kube-1.36 or
# /var/tmp/edgelink-kube: `KUBE=... scripts/kube-lab.sh build`). KEEP=1
# leaves the cluster up. `test` runs the default profile only where its
# cache is. The image is rebuilt first (~30 s when the binaries are up to
# date), so the lab runs the checkout's code.
e2e-kube: image-offline
	KEEP=$(KEEP) KUBE=$(KUBE) MULTUS=$(MULTUS) E2E_ONLY='$(E2E_ONLY)' scripts/kube-lab/e2e.sh

# The Vagrant lab (vagrant/README.md): the reference cluster in VMs, edgelink
# from the local build (make image), and TCP, UDP and HTTP from a pod on
# kworker1 to device01-01 through its Service. Needs vagrant and VirtualBox or
# libvirt. KEEP=1 leaves the cluster up.
e2e-vagrant:
	KEEP=$(KEEP) vagrant/e2e.sh

# What can be checked of the Vagrant lab without a hypervisor (CI): vagrant
# validate --ignore-provider, and shellcheck on every shell script.
lint-vagrant:
	$(DEPS) test
	scripts/check-vagrant.sh

# The main job on the built-in netns lab (forwards to a device, and a
# reverse forward from it to a collector in the cluster). KEEP=1 leaves
# the lab up.
# Builds only what the demo runs (the static plugin and edgelinkd, as
# shipped), once; each phase says what it does and how long it may take.
demo:
	@echo "demo: [1/3] system packages (scripts/install-deps.sh demo)"
	$(DEPS) demo
	@echo "demo: [2/3] building edgelink and edgelinkd (release, static; a first build compiles every dependency: 5-15 min on 2 cores (4 min 56 s measured here beside other work; 12 min reported on a busier machine), seconds afterwards)"
	$(MAKE) static
	@echo "demo: [3/3] the lab (scripts/demo.sh, a few seconds)"
	EDGELINK_BIN=$(PLUGIN) KEEP=$(KEEP) scripts/demo.sh

# Side-by-side figures: the plugin against the reference plugins, the relay
# against socat, HAProxy and nginx, and its reverse forwards (device to
# cluster) against HAProxy.
# QUICK=1 runs one short round (CI).
bench:
	$(DEPS) test bench
	$(MAKE) static bench-bins
	EDGELINK_BIN=$(PLUGIN) EDGELINKD_BIN=target/$(HOST)/release/edgelinkd \
		LOADGEN_BIN=target/$(HOST)/release/elk-loadgen FILL_BIN=target/$(HOST)/release/examples/fill_store \
		QUICK=$(QUICK) scripts/bench.sh

# The control plane and an edge node at the scale of a plant, on the kube
# lab (KUBE=1.36, its cache: scripts/kube-lab.sh build): SCALE_DEVICES
# Devices (1000) applied at once, half on each edge node, 4 ports each; the
# times to Reconciled, Ready and gone, the operator's API requests per
# reconcile and per report, edgelinkd's footprint with 500 attachments, the
# plugin's ADD at 500 against at 1 (scripts/kube-lab/bench-scale.sh,
# docs/benchmarks.md "Plant scale"). KEEP=1 leaves the lab up.
SCALE_DEVICES ?= 1000
bench-scale: image-offline
	KEEP=$(KEEP) KUBE=1.36 SCALE_DEVICES=$(SCALE_DEVICES) scripts/kube-lab/bench-scale.sh

# One edge node with NODE_ATTACHMENTS (500) attachments of 4 forwards and
# a health probe, without Kubernetes (namespaces of its own): edgelinkd's
# RSS, fds, reconcile pass, /status and /metrics, the plugin's ADD at 500
# against at 1 (scripts/bench/node_scale.py, docs/benchmarks.md "One node,
# 500 attachments"). About a minute.
NODE_ATTACHMENTS ?= 500
bench-node: static
	EDGELINK_BIN=$(PLUGIN) EDGELINKD_BIN=target/$(HOST)/release/edgelinkd \
		python3 scripts/bench/node_scale.py --attachments $(NODE_ATTACHMENTS)

# The bench's own programs, built like the shipped binaries (same target,
# flags and profile: the dependencies they share are built once).
bench-bins:
	RUSTFLAGS="-C target-feature=+crt-static" $(CARGO) build --release -p edgelink-loadgen -p edgelink-ipam --bins --examples --target $(HOST)

# The cargo-fuzz targets (fuzz/README.md): the plugin's config, prevResult,
# CNI_ARGS, the attachment records, the control socket's lines and the
# hand-over frames, each run
# for FUZZ_SECONDS (-max_total_time) from the committed seeds (fuzz/seeds/)
# plus the corpus earlier runs grew (fuzz/corpus/, not committed); one line
# per target (execs, coverage, corpus); fails if a target crashes (the input
# is left in fuzz/artifacts/<target>/). The stable toolchain is enough
# (RUSTC_BOOTSTRAP=1, address sanitizer); cargo-fuzz is installed on first
# use (scripts/install-cargo-fuzz.sh). The figures in docs/reliability.md
# come from `make fuzz FUZZ_SECONDS=1200`.
# FUZZ_DEV=1: unoptimized targets (a ~1.5 min build instead of ~8.5; CI).
# FUZZ_JOBS: targets run at a time.
FUZZ_SECONDS ?= 60
FUZZ_DEV     ?= 0
FUZZ_JOBS    ?= 1
fuzz:
	CARGO="$(CARGO)" FUZZ_SECONDS=$(FUZZ_SECONDS) FUZZ_DEV=$(FUZZ_DEV) FUZZ_JOBS=$(FUZZ_JOBS) scripts/fuzz.sh

# Soak and chaos against the built binaries (docs/reliability.md, "Soak
# and chaos"): scripts/soak/ (1,000 attachments added and deleted for
# 30 min, 10,000 TCP connections held, 50,000 UDP sessions per round) and
# scripts/chaos/ (kill -9 every 10 s for 5 min, the pod netns deleted, the
# state dir full, a torn record, a target that never reads, a SYN flood).
# Each scenario runs in namespaces it makes and removes; results go to
# target/soak/, figures to docs/figures/. Durations: the SOAK_*/CHAOS_*
# variables in each script's docstring; ONLY=name,... picks scenarios;
# QUICK=1 is a smoke run (about a minute each). Not in `make test`: a full
# `make soak` takes about 55 min, `make chaos` about 8.
# Debian's python3: python3-matplotlib comes from the soak group.
SOAK_PY  ?= /usr/bin/python3
# A QUICK run's figures go to target/soak, not over the committed ones.
SOAK_ENV  = EDGELINK_BIN=$(PLUGIN) EDGELINKD_BIN=target/$(HOST)/release/edgelinkd \
	LOADGEN_BIN=target/$(HOST)/release/elk-loadgen QUICK=$(QUICK) ONLY=$(ONLY) \
	SOAK_FIGURES=$(if $(QUICK),$(CURDIR)/target/soak,$(CURDIR)/docs/figures)

soak:
	$(DEPS) soak
	$(MAKE) static soak-bins
	$(SOAK_ENV) $(SOAK_PY) scripts/soak/run.py

chaos:
	$(DEPS) soak
	$(MAKE) static soak-bins
	$(SOAK_ENV) $(SOAK_PY) scripts/chaos/run.py

# The load generator, built like the shipped binaries (shares their
# dependencies' build).
soak-bins:
	RUSTFLAGS="-C target-feature=+crt-static" $(CARGO) build --release -p edgelink-loadgen --target $(HOST)

# The DaemonSet's image. The manifests name edgelink:$(VERSION); push it
# where the nodes pull from (docs/install.md).
image:
	@test -n "$(CONTAINER_BUILDER)" || { echo "make image: no container builder: install docker, podman or buildah, or set CONTAINER_BUILDER" >&2; exit 1; }
	$(CONTAINER_BUILDER) build -f daemonset/Dockerfile -t $(IMAGE) .

# The same image without a registry, a base image or a builder: an OCI
# archive (target/image/edgelink-$(VERSION).oci.tar) of a root filesystem
# with the static binaries, install-cni.sh and busybox-static. On a node:
# ctr -n k8s.io images import target/image/edgelink-$(VERSION).oci.tar
image-offline:
	$(DEPS) test
	$(MAKE) static static-operator
	VERSION=$(VERSION) OPERATOR=target/$(HOST)/operator/edgelink-operator scripts/image-offline.sh

# daemonset/install.yaml from the manifests beside it (`make lint` checks it).
install-yaml:
	scripts/gen-install-yaml.sh

clean:
	$(CARGO) clean
	rm -rf fuzz/target
