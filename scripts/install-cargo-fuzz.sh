#!/usr/bin/env bash
# Install cargo-fuzz (the `cargo fuzz` subcommand, libFuzzer targets) with
# the stable toolchain, unless `cargo fuzz --version` already works.
# Pinned by --locked to the lock file cargo-fuzz publishes; ~2-3 min of
# compiling on 2 cores the first time, nothing afterwards.
set -euo pipefail
CARGO=${CARGO:-cargo}
if $CARGO fuzz --version >/dev/null 2>&1; then
    echo "install-cargo-fuzz: $($CARGO fuzz --version) already installed"
    exit 0
fi
$CARGO install cargo-fuzz --locked
echo "install-cargo-fuzz: $($CARGO fuzz --version) installed"
