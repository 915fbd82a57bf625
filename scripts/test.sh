#!/usr/bin/env bash
# The whole test suite, from a fresh Debian 12 machine: installs what it needs, builds, runs
# unit and raw-protocol tests, builds the stock llama.cpp tools (cached in ~/.cache), and runs
# the end-to-end equivalence tests against stock llama.cpp.
#   QUICK=1 scripts/test.sh     fewer end-to-end cases
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$SECONDS
step() { printf '\n=== %s [%s, +%d s] ===\n' "$*" "$(date +%T)" $((SECONDS - t0)); }
step "dependencies"
./scripts/deps.sh
step "format (cargo fmt --check)"
cargo fmt --all --check
step "ARCHITECTURE.md names every source file once, and only paths that exist (scripts/file-index.py --check)"
python3 scripts/file-index.py --check
step "build"
cargo build --release --workspace --all-targets
step "lints (cargo clippy --workspace --all-targets -- -D warnings)"
cargo clippy --release --workspace --all-targets -- -D warnings
step "unit and protocol tests"
cargo test --release --workspace
step "script tests: scripts/build-deps.sh under a faked OS (macOS and Linux branches)"
python3 tests/scripts/test_build_deps.py
step "script tests: scripts/service.sh (launchd plist via plistlib, systemd unit via systemd-analyze verify, install/uninstall under a faked OS)"
python3 tests/scripts/test_service.py --bin target/release/rpc-server
step "script tests: the macOS CI workflow (.github/workflows/, GitHub's workflow schema; cannot run here)"
python3 tests/scripts/test_workflow.py
step "stock llama.cpp tools and test model"
STOCK_BIN="$(./scripts/stock-llama.sh)"
MODEL="$(./scripts/test-model.sh)"
echo "stock tools: $STOCK_BIN"; echo "model: $MODEL"
step "end to end against stock llama.cpp"
e2e_args=(--ours target/release/rpc-server --stock-bin "$STOCK_BIN")
[ "${QUICK:-0}" = 1 ] && e2e_args+=(--quick)
python3 tests/e2e/run_e2e.py "${e2e_args[@]}"
step "rpc-shim end to end over TCP (stock TCP-only llama.cpp -> rpc-shim -> rpc-server)"
python3 tests/e2e/shim_e2e.py --shim target/release/rpc-shim --ours target/release/rpc-server --stock-bin "$STOCK_BIN" --quick
step "idle and dead clients: stock llama-server across idle periods (direct, through rpc-shim), a peer that vanishes without a FIN"
python3 tests/e2e/idle_e2e.py --stock-bin "$STOCK_BIN" --ours target/release/rpc-server --shim target/release/rpc-shim
step "metrics: rpc-server --metrics scraped during a stock llama-completion run, against a frame-counting proxy"
python3 tests/e2e/metrics_e2e.py --stock-bin "$STOCK_BIN" --ours target/release/rpc-server
step "RDMA end to end in a soft-RoCE VM (stock llama.cpp RDMA clients, both flavors)"
tests/vm/test-rdma.sh
step "lean RDMA framing in the soft-RoCE VM (per-token SENDs/packets: stock flavors vs rpc-shim lean; fallbacks)"
tests/vm/test-lean.sh
step "hostile inputs: the same suite against the stock server (comparison), churn during real generation"
STOCK_BIN="$STOCK_BIN" HOSTILE_NO_BUILD=1 cargo test --release -p rpc-tests --test hostile -- --ignored --nocapture \
  2>&1 | grep -E "^(test |churn|stock server)|passed|FAILED|panicked"
step "op conformance: llama.cpp test-backend-ops against rpc-server (ops of common architectures)"
SUBSET=1 ./scripts/test-backend-ops.sh
step "fuzzing smoke run (codec, graph, session; ${FUZZ_SECONDS:-15} s each)"
fuzz/smoke.sh
step "all tests passed"
