#!/usr/bin/env bash
# Builds (first run: installs what building needs, per OS, see scripts/build-deps.sh; ~5 minutes)
# and starts rpc-server. All arguments go to rpc-server, e.g.: scripts/run-server.sh -H 0.0.0.0 -p 50052 -c
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build-deps.sh >&2
cargo build --release -q -p rpc-server >&2
exec ./target/release/rpc-server "$@"
