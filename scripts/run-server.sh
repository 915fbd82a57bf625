#!/usr/bin/env bash
# Builds (first run: installs what building needs, per OS, see scripts/build-deps.sh; ~5 minutes)
# and starts rpc-server. All arguments go to rpc-server, e.g.: scripts/run-server.sh -H 0.0.0.0 -p 50052 -c
#
# PORTABLE=1: build a binary for any CPU of this architecture generation (see
# scripts/portable-rustflags.sh; into target/portable) instead of for this machine's CPU, e.g. one
# binary for M1..M4 Macs. Greedy tokens then match a stock llama.cpp built the same way
# (GGML_NATIVE=OFF), not necessarily a natively built one.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build-deps.sh >&2
# Build tools build-deps.sh installed or found off PATH (cmake from a venv or Homebrew).
tools="${RPC_CACHE_DIR:-$HOME/.cache/ggml-rpc-rs}/bin"
if [ -d "$tools" ]; then PATH="$tools:$PATH"; export PATH; fi
target=target
if [ "${PORTABLE:-0}" = 1 ]; then
  RUSTFLAGS="$(./scripts/portable-rustflags.sh)"
  export RUSTFLAGS
  target=target/portable
  export CARGO_TARGET_DIR="$target"
  echo "run-server: portable build (RUSTFLAGS='$RUSTFLAGS') in $target" >&2
fi
cargo build --release -q -p rpc-server >&2
exec "./$target/release/rpc-server" "$@"
