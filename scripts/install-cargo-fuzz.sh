#!/usr/bin/env bash
# Install cargo-fuzz (the `cargo fuzz` subcommand, libFuzzer targets) with
# the stable toolchain, unless `cargo fuzz --version` already works.
# Pinned by --locked to the lock file cargo-fuzz publishes. A debug build
# (--debug): the tool only starts cargo and libFuzzer, and it compiles in
# ~30 s on 2 cores where the optimized build takes ~2.5 min.
set -euo pipefail
CARGO=${CARGO:-cargo}
if $CARGO fuzz --version >/dev/null 2>&1; then
    echo "install-cargo-fuzz: $($CARGO fuzz --version) already installed"
    exit 0
fi
$CARGO install cargo-fuzz --locked --debug
echo "install-cargo-fuzz: $($CARGO fuzz --version) installed"
